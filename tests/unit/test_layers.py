"""The package's import structure, read from the source (nothing is imported): layers point one
way, so no two modules import each other at import time, and no module takes another's private
names (a name with a leading underscore is its own module's business)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PKG = ROOT / "edgetune"


def _module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


MODULES = {_module_name(p): p for p in PKG.rglob("*.py")}


def _top_level_imports(tree: ast.Module):
    """The import statements that run when the module is imported: its body's, and those in a
    top-level try (an optional dependency); not ``if TYPE_CHECKING:`` blocks, not functions'."""
    for node in tree.body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif isinstance(node, ast.Try):
            for sub in node.body + [s for h in node.handlers for s in h.body] + node.orelse:
                if isinstance(sub, (ast.Import, ast.ImportFrom)):
                    yield sub


def _targets(node: ast.Import | ast.ImportFrom) -> list[str]:
    """The edgetune modules an import statement loads (a package's submodules named in a from-import too)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names if a.name in MODULES]
    mod = node.module or ""
    if not mod.startswith("edgetune") or node.level:
        return []
    out = [mod] if mod in MODULES else []
    out += [f"{mod}.{a.name}" for a in node.names if f"{mod}.{a.name}" in MODULES]
    return out


def _graph() -> dict[str, set[str]]:
    g: dict[str, set[str]] = {m: set() for m in MODULES}
    for m, p in MODULES.items():
        for node in _top_level_imports(ast.parse(p.read_text(), str(p))):
            g[m].update(t for t in _targets(node) if t != m)
    return g


def _cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in g[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(g):
        if v not in index:
            visit(v)
    return out


def test_the_graph_reader_sees_a_cycle_and_real_edges():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    g = _graph()
    assert "edgetune.workload" in g["edgetune.tune"]  # a real edge: the reader is not blind
    assert "edgetune.db" in g["edgetune.api"]


def test_no_two_modules_import_each_other_at_import_time():
    assert _cycles(_graph()) == []


def test_no_module_imports_another_modules_private_names():
    found = []
    for base in (PKG, ROOT / "tools"):
        for p in base.rglob("*.py"):
            for n in ast.walk(ast.parse(p.read_text(), str(p))):
                if isinstance(n, ast.ImportFrom) and (n.module or "").startswith("edgetune") and not n.level:
                    bad = [a.name for a in n.names if a.name.startswith("_") and not a.name.startswith("__")]
                    if bad:
                        found.append(f"{p.relative_to(ROOT)}:{n.lineno}: from {n.module} import {', '.join(bad)}")
    assert found == []
