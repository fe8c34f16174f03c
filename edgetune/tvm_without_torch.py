"""``import tvm`` without importing PyTorch, in edgetune's own processes.

tvm-ffi (TVM's FFI layer) and tvm.relax import torch at their own import where torch is
installed (a workaround for a symbol clash on Windows, and torch tensors in their converters), both
inside ``import tvm``. edgetune's host never hands TVM a torch tensor, and that import is about 2.7
of the 4.3 CPU seconds an ``import tvm`` costs on the reference host, paid by every edgetune
command that builds, tunes or judges with TVM.

``install()`` (called by the CLI's ``main``) adds an import hook that runs the import of the
``tvm`` package, and everything it imports, with torch hidden (``sys.modules["torch"] = None``:
``import torch`` raises ImportError, which TVM takes as "not installed"), then unhides it: a later
``import torch`` in the same process works as usual. A process that has imported torch before TVM
keeps TVM's torch support; so does a program that uses edgetune as a library without calling
``install()``. The Python agent does the same for its TVM jobs
(device_agents/python/edgetune_agent/backends/tvm.py; the agent is a file of its own on the
device, so it keeps its own copy).
"""

from __future__ import annotations

import importlib.abc
import sys

_HIDDEN = "tvm"


class _Loader(importlib.abc.Loader):
    def __init__(self, inner):
        self.inner = inner

    def __getattr__(self, name):  # resource readers, get_code, is_package: the real loader's
        return getattr(self.inner, name)

    def create_module(self, spec):
        return self.inner.create_module(spec)

    def exec_module(self, module):
        hide = "torch" not in sys.modules
        if hide:
            sys.modules["torch"] = None
        try:
            self.inner.exec_module(module)
        finally:
            if hide and "torch" in sys.modules and sys.modules["torch"] is None:
                del sys.modules["torch"]


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name != _HIDDEN or "torch" in sys.modules:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _Loader(spec.loader)
                return spec
        return None


def install() -> None:
    """Hide torch from this process's ``import tvm`` (once; a no-op when tvm is already loaded)."""
    if _HIDDEN in sys.modules or any(isinstance(f, _Finder) for f in sys.meta_path):
        return
    sys.meta_path.insert(0, _Finder())


# ---- TVM's popen workers (MetaSchedule's LocalBuilder) -------------------------------------------
#
# LocalBuilder starts a fresh pool of ``python -m tvm.exec.popen_worker`` processes for every batch
# of trials; each imports tvm, and with it torch: about 2 of its 3.4 CPU seconds here. A builder
# worker compiles TIR and exports a shared object, never touching torch. A pool whose initializer
# is ``builder_worker_init`` (edgetune's builders pass it) starts its workers with the hook above
# installed first; every other pool (a library user's own) starts them as TVM does.

_BOOT = (
    "import sys\n"
    "sys.path.append({root!r})\n"
    "try:\n"
    "    import edgetune.tvm_without_torch as _h\n"
    "    _h.install()\n"
    "except ImportError:\n"
    "    pass\n"
    "import runpy\n"
    "runpy.run_module('tvm.exec.popen_worker', run_name='__main__', alter_sys=True)\n"
)


def builder_worker_init() -> None:
    """The initializer edgetune's builders give their TVM popen pools (a no-op in the worker; its
    presence starts the worker without torch)."""


def patch_popen_workers() -> bool:
    """Start the workers of pools initialized with ``builder_worker_init`` through ``_BOOT`` (once).
    False, changing nothing, where TVM's PopenWorker is not the one this was written against."""
    import os
    import subprocess
    from pathlib import Path

    from tvm.support import popen_pool

    worker = popen_pool.PopenWorker
    if getattr(worker, "_edgetune_patched", False):
        return True
    stock = getattr(worker, "_start", None)
    if stock is None or sys.platform == "win32":
        return False
    boot = _BOOT.format(root=str(Path(__file__).resolve().parents[1]))

    def _start(self):
        if getattr(self, "_initializer", None) is not builder_worker_init or self._proc is not None:
            return stock(self)
        main_read, worker_write = os.pipe()
        worker_read, main_write = os.pipe()
        cmd = [sys.executable, "-c", boot, str(worker_read), str(worker_write)]
        try:
            self._proc = subprocess.Popen(cmd, pass_fds=(worker_read, worker_write), stdout=self._stdout,
                                          stderr=self._stderr)
        finally:
            os.close(worker_read)
            os.close(worker_write)
        self._reader = os.fdopen(main_read, "rb")
        self._writer = os.fdopen(main_write, "wb")

    worker._start = _start
    worker._edgetune_patched = True
    return True
