"""Compile and export single TVM kernels (one PrimFunc) for a device target.

The exported artifact is a shared library with entry ``__tvm_ffi_main`` taking DLTensor*
arguments (inputs, then outputs). It loads with ``tvm.runtime.load_module`` on a host with the
TVM runtime, and with the native agent (libc only) on phones and boards.

* x86-64 host: the system C compiler (TVM's default ``cc``).
* aarch64 Linux: ``aarch64-linux-gnu-gcc`` (``cross_cc`` in targets/linux-aarch64.toml).
* Android: the NDK's ``aarch64-linux-android<api>-clang`` (``cross_cc`` in android-arm64.toml).
* CUDA: the host side is compiled for the host; the device code is compiled by TVM through
  nvcc (no GPU needed to build) and embedded in the .so.

The functions here are also MetaSchedule's ``f_build``/``f_export`` in builder worker processes,
so they are module-level and picklable.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import os
import platform
import shutil
import tempfile
from pathlib import Path
from typing import Any, Callable, Mapping

from edgetune.errors import MissingExtra, ToolchainError, UserInputError

HOST_ARCH = {"x86_64": "x86_64", "amd64": "x86_64", "aarch64": "aarch64", "arm64": "aarch64"}.get(
    platform.machine().lower(), platform.machine().lower()
)


def _tvm():
    try:
        import tvm
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise MissingExtra("TVM kernel builds", "tvm") from exc
    return tvm


def as_tvm_target(target: Any):
    """A tvm.target.Target from a JSON-able dict (targets/*.toml ``tvm_target``) or a Target."""
    tvm = _tvm()
    if isinstance(target, tvm.target.Target):
        return target
    if isinstance(target, Mapping):
        try:
            return tvm.target.Target(dict(target))
        except Exception as exc:  # noqa: BLE001 - TVM raises its own error types
            raise UserInputError(f"TVM rejects target {dict(target)}: {exc}") from exc
    raise UserInputError(f"target must be a dict (tvm_target table) or tvm.target.Target, got {target!r}")


def target_kind(target: Any) -> str:
    return str(as_tvm_target(target).kind.name)


def is_gpu(target: Any) -> bool:
    return target_kind(target) in ("cuda", "rocm", "vulkan", "opencl", "metal")


def target_arch(target: Any) -> str:
    """Architecture the compiled host code runs on: from the llvm mtriple, else the host's."""
    tgt = as_tvm_target(target)
    host = tgt.host if tgt.host is not None else tgt
    triple = str(host.attrs.get("mtriple", "")) if host.kind.name == "llvm" else ""
    if not triple:
        return HOST_ARCH
    arch = triple.split("-")[0]
    return {"arm64": "aarch64", "amd64": "x86_64"}.get(arch, arch)


def resolve_cross_cc(target: Any, cross_cc: str | None = None) -> str | None:
    """The C compiler that links the artifact; None means the host's default compiler.

    An explicit ``cross_cc`` wins; a foreign mtriple without one picks ``<arch>-linux-gnu-gcc``.
    Raises ToolchainError when the compiler is not on PATH.
    """
    arch = target_arch(target)
    if cross_cc is None and arch != HOST_ARCH:
        cross_cc = f"{arch}-linux-gnu-gcc"
    if cross_cc is None:
        return None
    if shutil.which(cross_cc) is None:
        raise ToolchainError(
            f"cross compiler {cross_cc!r} for {arch} not found on PATH "
            "(Debian: apt-get install gcc-aarch64-linux-gnu; Android: the NDK's toolchains/llvm/prebuilt/*/bin)"
        )
    return cross_cc


def default_schedule(mod, target):
    """Unscheduled TIR runs on CPUs as is; GPUs need thread bindings: DLight's default rules."""
    tvm = _tvm()
    tgt = as_tvm_target(target)
    if not is_gpu(tgt):
        return mod
    from tvm.s_tir import dlight as dl

    with tgt:
        return dl.ApplyDefaultSchedule(
            dl.gpu.Matmul(), dl.gpu.GEMV(), dl.gpu.Reduction(), dl.gpu.GeneralReduction(), dl.gpu.Fallback()
        )(mod)


@contextlib.contextmanager
def _memoized_getmodule():
    """Make ``inspect.getmodule`` cache by file name while TVMScript parses many functions.

    The TVMScript decorators call ``inspect.stack()``, whose ``getmodule`` scans all of
    ``sys.modules`` for every frame in a file it cannot map (importlib's frozen frames): importing
    ``tvm.s_tir.tensor_intrin`` (~250 intrinsics) takes 20-60 s that way and ~3 s with the cache.
    """
    original = inspect.getmodule
    cache: dict[str, Any] = {}

    def getmodule(obj, _filename=None):
        fname = _filename
        if fname is None:
            code = getattr(obj, "f_code", None) or getattr(obj, "__code__", None)
            if code is None and inspect.iscode(obj):
                code = obj
            fname = getattr(code, "co_filename", None)
        if fname is None:
            return original(obj, _filename)
        if fname not in cache:
            cache[fname] = original(obj, _filename)
        return cache[fname]

    inspect.getmodule = getmodule
    try:
        yield
    finally:
        inspect.getmodule = original


# TVM's tensor-intrinsic modules by target kind; the package's own __init__ imports them all, and
# cuda.py alone takes 3.4 s of the 5 s the whole import takes here (TVMScript parsing)
_INTRIN_MODULES = {"llvm": ("x86", "arm_cpu", "riscv_cpu"), "cuda": ("cuda",), "rocm": ("rocm",)}
_ALL_INTRIN_MODULES = ("cuda", "x86", "arm_cpu", "rocm", "hexagon", "riscv_cpu")


def import_tensor_intrinsics(target: Any = None) -> None:
    """Import (register) TVM's tensor intrinsics, fast: the modules of ``target``'s kind (all of them
    without a target). MetaSchedule's TuneContext and builder ``import tvm.s_tir.tensor_intrin``
    on first use; the package is registered here first, so that import is a no-op and a CPU search
    does not pay for parsing the CUDA intrinsics (and a later CUDA search still gets them)."""
    import importlib
    import importlib.util
    import sys
    import types

    kind = target_kind(target) if target is not None else None
    wanted = _INTRIN_MODULES.get(kind, _ALL_INTRIN_MODULES)
    pkg_name = "tvm.s_tir.tensor_intrin"
    if pkg_name not in sys.modules:
        importlib.import_module("tvm.s_tir")  # the parent package, imported as usual

        spec = importlib.util.find_spec(pkg_name)
        pkg = types.ModuleType(pkg_name, "Intrinsics for tensorization (registered by edgetune, per target kind)")
        pkg.__spec__, pkg.__path__, pkg.__package__ = spec, list(spec.submodule_search_locations), pkg_name
        pkg.__file__ = spec.origin
        sys.modules[pkg_name] = pkg
        sys.modules["tvm.s_tir"].tensor_intrin = pkg
    missing = [m for m in wanted if f"{pkg_name}.{m}" not in sys.modules]
    if missing:
        with _memoized_getmodule():
            for m in missing:
                setattr(sys.modules[pkg_name], m, importlib.import_module(f"{pkg_name}.{m}"))


def compile_module(mod, target):
    """IRModule of PrimFuncs -> runtime module: MetaSchedule's default build, minus its slow
    tensor-intrinsic import on CPU targets (scheduled TIR no longer names the intrinsics)."""
    tvm = _tvm()
    from tvm.s_tir.transform import RemoveWeightLayoutRewriteBlock

    tgt = as_tvm_target(target)
    if tgt.kind.name != "llvm":
        import_tensor_intrinsics(tgt)
    mod = RemoveWeightLayoutRewriteBlock(skip_tensor_rewrite=True)(mod)
    return tvm.compile(mod, target=tgt)


def ms_build(mod, target, _params=None):
    """MetaSchedule f_build (runs in builder worker processes)."""
    return compile_module(mod, target)


def export_module(rt_mod, path: str | os.PathLike, cross_cc: str | None = None) -> Path:
    """Write ``rt_mod`` as a shared library at ``path`` (linked with ``cross_cc`` if given)."""
    from tvm.support import cc

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if cross_cc:
        rt_mod.export_library(str(path), fcompile=cc.cross_compiler(cross_cc))
    else:
        rt_mod.export_library(str(path))
    return path


def _export_to_tempdir(rt_mod, cross_cc: str | None = None) -> str:
    """MetaSchedule f_export: a fresh temp dir per candidate (RemoveBuildArtifact deletes it)."""
    path = Path(tempfile.mkdtemp(prefix="edgetune-ms-")) / "kernel.so"
    return str(export_module(rt_mod, path, cross_cc))


def ms_export_function(cross_cc: str | None) -> Callable:
    return functools.partial(_export_to_tempdir, cross_cc=cross_cc)


def build_kernel(
    workload,
    target: Any,
    out_path: str | os.PathLike,
    *,
    cross_cc: str | None = None,
    database=None,
) -> Path:
    """Build ``workload`` for ``target`` and export it to ``out_path``.

    With a MetaSchedule ``database`` holding a valid record for the workload, its best schedule
    is used; otherwise the default schedule (plain loops on CPU, DLight on GPU).
    """
    tgt = as_tvm_target(target)
    mod = workload.ir_module()
    if database is not None:
        sch = database.query_schedule(mod, tgt, workload_name="main")
        if sch is not None:
            mod = sch.mod
        else:
            mod = default_schedule(mod, tgt)
    else:
        mod = default_schedule(mod, tgt)
    cc_name = resolve_cross_cc(tgt, cross_cc)
    try:
        rt_mod = compile_module(mod, tgt)
    except Exception as exc:  # noqa: BLE001 - any TVM compile failure stops this build
        raise ToolchainError(f"TVM failed to compile {workload.key()} for {tgt.kind.name}: {exc}") from exc
    return export_module(rt_mod, out_path, cc_name)


def elf_machine(path: str | os.PathLike) -> str:
    """The ELF e_machine of a built artifact: 'x86_64', 'aarch64', ... (for checks and manifests)."""
    data = Path(path).read_bytes()[:20]
    if data[:4] != b"\x7fELF":
        return "not-elf"
    little = data[5] == 1
    machine = int.from_bytes(data[18:20], "little" if little else "big")
    return {62: "x86_64", 183: "aarch64", 40: "arm", 243: "riscv", 3: "i386"}.get(machine, f"e_machine={machine}")
