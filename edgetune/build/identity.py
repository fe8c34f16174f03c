"""The build identity: everything besides the model, shapes and target that changes what a TVM build
produces or how a tuned kernel performs. Every TVM cache (MetaSchedule tuning databases,
tvm-relax / tvm-tuned artifacts) is keyed by it, so a change of any part is a cache miss:

* ``edgetune``: edgetune's version (its pipelines, passes and verification rules),
* ``tvm``: the TVM version that compiled the kernels and proposed the schedules,
* ``compiler``: the C compiler that links the artifact (absolute path and the first line of
  its ``--version``); for the host, the one TVM's own linker helper would pick,
* ``threads``: how many threads the kernels were tuned / built to run with.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from typing import Any

import edgetune

IDENTITY_VERSION = 1  # bump when the identity's own layout changes


def edgetune_version() -> str:
    return edgetune.__version__  # read at call time (tests patch it)


def tvm_version() -> str:
    try:
        import tvm
    except ImportError:
        return "none"
    return str(getattr(tvm, "__version__", "unknown"))


def host_linker() -> str | None:
    """The compiler TVM links host artifacts with when none is given (``$CXX``/``$CC`` or the first
    of g++, gcc, clang++, clang, c++, cc on PATH)."""
    try:
        from tvm.support import cc
    except ImportError:
        return os.environ.get("CXX") or os.environ.get("CC") or shutil.which("g++") or shutil.which("cc")
    return cc.get_cc()


def compiler_identity(cc: str | None) -> dict[str, str]:
    """``{"path", "version"}`` of compiler ``cc`` (a name on PATH or a path; None: the host linker).

    Asked every time (a ``--version`` takes milliseconds), so a compiler upgraded in place is seen."""
    name = cc if cc is not None else host_linker()
    if not name:
        return {"path": "none", "version": "none"}
    found = shutil.which(name)
    if not found:
        return {"path": name, "version": "not found"}
    path = os.path.realpath(found)
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as exc:
        return {"path": path, "version": f"does not run: {type(exc).__name__}"}
    lines = [l.strip() for l in (out.stdout or out.stderr).splitlines() if l.strip()]
    return {"path": path, "version": lines[0] if lines else f"no --version output (exit {out.returncode})"}


def build_identity(cross_cc: str | None, threads: int | None) -> dict[str, Any]:
    """The identity of a build or tuning run for compiler ``cross_cc`` (None: the host linker) and
    ``threads`` kernel threads."""
    return {
        "identity": IDENTITY_VERSION,
        "edgetune": edgetune_version(),
        "tvm": tvm_version(),
        "compiler": compiler_identity(cross_cc),
        "threads": int(threads) if threads else None,
    }


def identity_key(identity: dict[str, Any]) -> str:
    """A short, readable directory name for ``identity``: ``tvm<version>-<threads>t-<hash>``."""
    digest = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:12]
    tvm = "".join(ch if ch.isalnum() or ch in "._" else "_" for ch in str(identity.get("tvm")))
    return f"tvm{tvm}-{identity.get('threads') or 'auto'}t-{digest}"
