"""The Python agent as a device receives it: one file, bundled from the agent's modules.

The agent's source is a package of modules by responsibility, device_agents/python/edgetune_agent/
(its ``__init__.py`` lists them). A device gets one self-contained file, ``edgetune_agent.py``: the
host pushes one file and checks its sha256 before every job, the agent's zygote vouches for the
sha256 of its own file, and the device's plain Python runs it (``python -S``) with nothing to
install. ``python_agent()`` is that file, and the only way the host (and every test and tool) gets
it.

How: concatenation. The modules in ORDER (each imports only from modules before it), each with its
imports of its siblings (``from .common import a, b``, at its top level) commented out: in one file
those names are already defined above. Concatenation rather than an embedded module loader
because the bundle stays plain Python: a reader can follow it, a traceback or faulthandler's dump
names its real lines, a test can load it as one module and patch any name in it, and ``__file__``
is the one file everywhere (the zygote hashes it, the backends find the work dir from it). The
price is one namespace for all modules, so the bundler refuses whatever would make the one file
mean something other than the modules: a module not in ORDER (or missing), a top-level name
defined in two modules, an import of a sibling from a later module, of a name it does not define,
or anywhere but at a module's top level, ``from __future__``, ``global`` of a name the module does
not define, ``__name__`` outside the last module, ``__file__`` outside common.py.

Same sources, same bytes: the header names the modules and their sha256, nothing else (no time, no
path). The file is written into a cache directory named by its own sha256, through a temporary
file and ``os.replace`` (concurrent builders write the same bytes; a reader never sees half a file),
and a cached file is compared with the bundle before it is used (one that changed is rewritten).
"""

from __future__ import annotations

import ast
import hashlib
import sys
import threading
from pathlib import Path

from edgetune.private import write_atomic_file
from edgetune.shipped import agents_dir, cache_root

PACKAGE = "edgetune_agent"  # the package directory of the agent's modules, under device_agents/python/
BUNDLE_NAME = "edgetune_agent.py"  # the file a device runs (W/agent/edgetune_agent.py)
# the modules, in the order the bundle has them: every module after those it imports from
ORDER = (
    "__init__.py",
    "common.py",
    "backends/adapter.py",
    "backends/openvino.py",
    "backends/ort.py",
    "backends/tflite.py",
    "backends/torch.py",
    "backends/tvm.py",
    "backends/__init__.py",
    "info.py",
    "fresh.py",
    "job.py",
    "cgroups.py",
    "supervisor.py",
    "run_stdio.py",
    "zygote.py",
    "session.py",
    "gpucheck.py",
    "main.py",
)
_RULE = 100  # width of the banner line before each module


class BundleError(Exception):
    """The agent's modules cannot be bundled into one file that means what they say."""


def agent_package() -> Path:
    """The agent's modules as this edgetune ships them (a checkout's, or the wheel's copy)."""
    return agents_dir() / "python" / PACKAGE


def _package_of(rel: str) -> list[str]:
    parts = rel[:-3].split("/")
    return parts[:-1]  # "backends/ort.py" and "backends/__init__.py" are both in package "backends"


def _target(rel: str, node: ast.ImportFrom, present: set[str]) -> str:
    """The module (a name in ORDER) a relative import names."""
    package = _package_of(rel)
    if node.level - 1 > len(package):
        raise BundleError(f"{rel}:{node.lineno}: a relative import above the agent's package")
    base = package[:len(package) - (node.level - 1)]
    parts = base + (node.module.split(".") if node.module else [])
    for cand in ("/".join(parts) + ".py", "/".join(parts + ["__init__.py"])):
        if cand in present:
            return cand
    raise BundleError(f"{rel}:{node.lineno}: imports {'.' * node.level}{node.module or ''}, not a module of the agent")


def _module_scope(body: list[ast.stmt]):
    """The nodes of a module's own scope: its statements and what they contain, but not the bodies
    of functions, classes, lambdas and comprehensions (their names are not the module's)."""
    todo = list(body)
    while todo:
        node = todo.pop()
        yield node
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            todo += node.decorator_list  # (their names are bound in the module; what is inside is not)
            continue
        if isinstance(node, (ast.Lambda, ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)):
            continue
        todo += ast.iter_child_nodes(node)


def _defined(body: list[ast.stmt]) -> set[str]:
    """Names a module binds in its scope by anything but an import."""
    out = set()
    for node in _module_scope(body):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            out.add(node.id)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            out.add(node.name)
    return out


def _imported(body: list[ast.stmt]) -> list[tuple[str, str]]:
    """(name, the import that binds it) of each name a module's absolute imports bind in its scope."""
    out = []
    for node in _module_scope(body):
        if isinstance(node, ast.Import):
            for a in node.names:
                out.append((a.asname, f"import {a.name} as {a.asname}") if a.asname
                           else (a.name.split(".")[0], f"import {a.name.split('.')[0]}"))
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            out += [(a.asname or a.name, f"from {node.module} import {a.name}") for a in node.names]
    return out


def _check_module(rel: str, tree: ast.Module, earlier: set[str], names: dict[str, set[str]], defined: set[str],
                  last: bool) -> list[tuple[int, int]]:
    """Check one module; return the line ranges (1-based, inclusive) of its imports of siblings.
    ``names``: every module's top-level names (defined or imported from a sibling)."""
    strip: list[tuple[int, int]] = []
    top = {id(s) for s in tree.body}
    spans = [(s.lineno, s.end_lineno or s.lineno) for s in tree.body]
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "__future__":
            raise BundleError(f"{rel}:{node.lineno}: from __future__ must open a file; the bundle has one opening")
        if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] == PACKAGE \
                or isinstance(node, ast.Import) and any(a.name.split(".")[0] == PACKAGE for a in node.names):
            raise BundleError(f"{rel}:{node.lineno}: import the agent's modules relatively (from .x import y)")
        if isinstance(node, ast.ImportFrom) and node.level > 0:
            if id(node) not in top:
                raise BundleError(f"{rel}:{node.lineno}: a module of the agent imported inside a block; "
                                  f"only a top-level import can be left out of the bundle")
            target = _target(rel, node, set(names))
            if target not in earlier:
                raise BundleError(f"{rel}:{node.lineno}: imports from {target}, which comes after it in ORDER")
            for a in node.names:
                if a.name == "*" or a.asname not in (None, a.name):
                    raise BundleError(f"{rel}:{node.lineno}: import names from the agent's modules as they "
                                      f"are (no *, no 'as'): the bundle has one namespace")
                if a.name not in names[target]:
                    raise BundleError(f"{rel}:{node.lineno}: {target} has no {a.name}")
            first, end = node.lineno, node.end_lineno or node.lineno
            if node.col_offset != 0 or any(a <= end and b >= first and (a, b) != (first, end) for a, b in spans):
                raise BundleError(f"{rel}:{first}: an import of the agent's modules shares its lines")
            strip.append((first, end))
        if isinstance(node, ast.Global):
            for name in node.names:
                if name not in defined:
                    raise BundleError(f"{rel}:{node.lineno}: global {name}: not a name this module defines")
        if isinstance(node, ast.Name) and node.id == "__name__" and not last:
            raise BundleError(f"{rel}:{node.lineno}: __name__ is the bundle's, not this module's; "
                              f"only the last module ({ORDER[-1]}) may test it")
        if isinstance(node, ast.Name) and node.id == "__file__" and rel != "common.py":
            raise BundleError(f"{rel}:{node.lineno}: __file__ is the bundle's, not this module's; "
                              f"common.py's _agent_file() and work_dir() say what it means")
    return strip


def _sources(package: Path) -> dict[str, bytes]:
    found = {p.relative_to(package).as_posix() for p in package.rglob("*.py") if "__pycache__" not in p.parts}
    if found != set(ORDER):
        extra, missing = sorted(found - set(ORDER)), sorted(set(ORDER) - found)
        raise BundleError(f"{package}: the modules are not those of ORDER (edgetune/agent/bundle.py): "
                          f"not in ORDER {extra}, missing {missing}")
    return {rel: (package / rel).read_bytes() for rel in ORDER}


def bundle(package: Path | None = None) -> bytes:
    """The one-file agent made from the modules under ``package`` (default: ``agent_package()``);
    BundleError when they cannot be bundled faithfully."""
    src = _sources(package or agent_package())
    key = hashlib.sha256(b"".join(rel.encode() + b"\0" + raw + b"\0" for rel, raw in src.items())).hexdigest()
    with _BUILDING:  # one parse at a time: devices provision in threads (and 3.11's ast is not thread-safe)
        if key not in _BUILT:  # (parsing and checking take ~0.1 s; every job's provisioning asks)
            _BUILT[key] = _bundle(src)
        return _BUILT[key]


_BUILT: dict[str, bytes] = {}  # sha256 of the sources -> their bundle
_BUILDING = threading.Lock()


def _bundle(src: dict[str, bytes]) -> bytes:
    trees, texts = {}, {}
    for rel, raw in src.items():
        try:
            texts[rel] = raw.decode("utf-8")
            trees[rel] = ast.parse(texts[rel], filename=rel)
        except (UnicodeDecodeError, SyntaxError) as exc:
            raise BundleError(f"{rel}: {exc}") from None
    defined = {rel: _defined(t.body) for rel, t in trees.items()}
    names = {rel: defined[rel] | {a.name for n in t.body if isinstance(n, ast.ImportFrom) and n.level > 0
                                  for a in n.names} for rel, t in trees.items()}
    owner: dict[str, str] = {}
    for rel in ORDER:
        for name in sorted(defined[rel]):
            if name in owner:
                raise BundleError(f"{rel}: defines {name}, as {owner[name]} does: the bundle has one namespace")
            owner[name] = rel
    binds: dict[str, tuple[str, str]] = {}
    for rel in ORDER:
        for name, what in sorted(_imported(trees[rel].body)):
            if name in owner:
                raise BundleError(f"{rel}: '{what}' binds {name}, which {owner[name]} defines")
            if binds.setdefault(name, (what, rel))[0] != what:
                raise BundleError(f"{rel}: '{what}' binds {name}, bound by '{binds[name][0]}' in {binds[name][1]}")

    out = ["#!/usr/bin/env python3",
           f"# {BUNDLE_NAME}: GENERATED by edgetune/agent/bundle.py for the host to push; do not edit it, edit the",
           f"# modules it is made from, device_agents/python/{PACKAGE}/, concatenated in this order (their",
           "# imports of each other commented out: in this one file those names are defined above):"]
    out += [f"#   {rel:<22} sha256 {hashlib.sha256(src[rel]).hexdigest()}" for rel in ORDER]
    for i, rel in enumerate(ORDER):
        lines = texts[rel].split("\n")
        if lines and lines[-1] == "":
            lines.pop()
        for first, end in _check_module(rel, trees[rel], set(ORDER[:i]), names, defined[rel], i == len(ORDER) - 1):
            for n in range(first - 1, end):
                lines[n] = "# " + lines[n]
        banner = f"# {'-' * 8} {PACKAGE}/{rel} "
        out += ([] if i == 0 else ["", ""]) + [banner.ljust(_RULE, "-")] + lines
    text = "\n".join(out) + "\n"
    try:
        compile(text, BUNDLE_NAME, "exec", dont_inherit=True)
    except SyntaxError as exc:  # cannot happen with the checks above; a bundler bug if it does
        raise BundleError(f"the bundle does not compile: {exc}") from None
    return text.encode("utf-8")


def python_agent(package: Path | None = None, cache_dir: Path | None = None) -> Path:
    """The Python agent's one file, bundled from ``package`` (default: the agent this edgetune ships),
    in ``cache_dir`` (default: ``cache_root()/python-agent``) under a directory named by its sha256."""
    data = bundle(package)
    digest = hashlib.sha256(data).hexdigest()
    where = (cache_dir if cache_dir is not None else cache_root() / "python-agent") / digest[:32]
    path = where / BUNDLE_NAME
    try:
        if path.read_bytes() == data:
            return path
    except OSError:
        pass
    where.mkdir(parents=True, exist_ok=True)
    # the mode a source file has (a transport that keeps modes keeps this one)
    return write_atomic_file(path, data, 0o644)


if __name__ == "__main__":  # scripts that run the agent from a checkout: python -m edgetune.agent.bundle
    sys.stdout.write(f"{python_agent()}\n")
