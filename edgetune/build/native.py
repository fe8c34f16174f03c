"""Build the native device agent (``device_agents/native``, C11, libc only) for a target.

``build_agent(triple, static)`` compiles ``edgetune-agent`` with the right compiler:

* ``None`` / the host triple: the host C compiler (``$CC`` or ``cc``),
* ``aarch64-linux-gnu`` (any ``<arch>-linux-gnu``): ``<triple>-gcc``,
* ``aarch64-linux-android[<api>]``: the NDK's ``aarch64-linux-android<api>-clang`` from
  ``$ANDROID_NDK_HOME`` (or ``$ANDROID_NDK_ROOT``).

Builds are cached under ``out_dir`` by everything that changes the binary: the sources, the
compiler's identity (``--version``), the flags and any linked kernels (docs/design.md §7).

A static agent cannot ``dlopen`` a kernel .so (bionic has no static dlopen; glibc's needs the
exact glibc at run time), so ``build_agent(..., kernels=[obj, ...])`` links kernel *object files*
(``export_kernel_object``) into the agent. The host then names the object file as the request's
artifact: the agent checks its sha256 as usual and calls the linked copy whose sha256 matches.
"""

from __future__ import annotations

import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from edgetune.hashing import sha256_file  # noqa: F401  (re-exported)
from edgetune.errors import ToolchainError
from edgetune.shipped import agents_dir, cache_root

AGENT_SRC = agents_dir() / "native"
SOURCES = ("agent.c", "job.c", "job_run.c", "supervisor.c", "supervisor_procs.c", "supervisor_cgroup.c",
           "supervisor_bundle.c", "fingerprint.c", "json.c", "npy.c", "sha256.c", "tvm_backend.c", "ort_backend.c",
           "judge_backend.c", "judge_seccomp.c", "judge_elf.c", "judge_buffers.c", "judge_child.c", "judge_faults.c",
           "judge_cuda.c", "judge_guard.c")
HEADERS = ("agent_internal.h", "supervisor.h", "judge_internal.h", "backend.h", "fingerprint.h", "json.h",
           "judge_cuda.h", "linked.h", "ort_abi.h", "sha256.h", "tensor.h", "tvm_abi.h")
EMPTY_TABLE = "kernels_none.c"
AGENT_NAME = "edgetune-agent"
DEFAULT_ENTRY = "__tvm_ffi_main"
DEFAULT_ANDROID_API = 24
# The function-pointer slots an exported kernel may define; see tvm_backend.c.
KERNEL_SLOTS = (
    "__TVMBackendParallelLaunch",
    "__TVMBackendParallelBarrier",
    "__TVMBackendAllocWorkspace",
    "__TVMBackendFreeWorkspace",
    "__TVMFFIErrorSetRaisedFromCStr",
    "__TVMFFIHandleInitOnce",
    "__TVMFFIFunctionCall",
    "__TVMFFIEnvModLookupFromImports",
)
CFLAGS = ("-O2", "-std=c11", "-D_GNU_SOURCE", "-Wall", "-Wextra", "-Wno-format-truncation",
          "-fno-strict-aliasing", "-pthread")

HOST_ARCH = {"amd64": "x86_64", "arm64": "aarch64"}.get(platform.machine().lower(), platform.machine().lower())


@dataclass(frozen=True)
class Toolchain:
    """How to compile for one target triple."""

    triple: str
    cc: str  # absolute path
    objcopy: str | None  # for renaming entries of several linked kernels
    android: bool


def default_cache_dir() -> Path:
    return cache_root() / "native-agent"


def _which(name: str) -> str | None:
    if os.sep in name:
        return name if os.access(name, os.X_OK) else None
    return shutil.which(name)


def _is_host(triple: str | None) -> bool:
    return triple is None or triple.split("-")[0] == HOST_ARCH and "android" not in triple


def toolchain(target_triple: str | None = None, cc: str | None = None) -> Toolchain:
    """Find the compiler for ``target_triple``; ToolchainError (one line) when it is missing."""
    android = bool(target_triple and "android" in target_triple)
    if cc is None:
        if android:
            cc = _ndk_clang(target_triple)
        elif _is_host(target_triple):
            cc = os.environ.get("CC") or "cc"
        else:
            cc = f"{target_triple}-gcc"
    path = _which(cc)
    if path is None:
        if android:
            hint = "check ANDROID_NDK_HOME and the API level in the triple"
        elif _is_host(target_triple):
            hint = "install a C compiler (Debian: apt install gcc)"
        else:
            hint = f"install a cross compiler (Debian: apt install gcc-{target_triple})"
        raise ToolchainError(f"C compiler for the native agent ({target_triple or 'host'}) not found: {cc}; {hint}")
    triple = target_triple or _dumpmachine(path)
    return Toolchain(triple=triple, cc=path, objcopy=_objcopy_for(path, triple, android), android=android)


def _ndk_clang(triple: str) -> str:
    ndk = os.environ.get("ANDROID_NDK_HOME") or os.environ.get("ANDROID_NDK_ROOT")
    if not ndk:
        raise ToolchainError(f"building the native agent for {triple} needs ANDROID_NDK_HOME (an Android NDK)")
    arch, _, rest = triple.partition("-linux-android")
    api = rest or str(DEFAULT_ANDROID_API)
    host_tag = f"{platform.system().lower()}-x86_64"
    return str(Path(ndk) / "toolchains" / "llvm" / "prebuilt" / host_tag / "bin" / f"{arch}-linux-android{api}-clang")


def _objcopy_for(cc: str, triple: str, android: bool) -> str | None:
    if android:
        cand = Path(cc).parent / "llvm-objcopy"
        return str(cand) if cand.exists() else None
    for name in (f"{triple}-objcopy", "objcopy" if _is_host(triple) else "", "llvm-objcopy"):
        if name and (p := shutil.which(name)):
            return p
    return None


def _dumpmachine(cc: str) -> str:
    try:
        out = subprocess.run([cc, "-dumpmachine"], capture_output=True, text=True, timeout=60, check=True)
    except (OSError, subprocess.SubprocessError) as exc:
        raise ToolchainError(f"C compiler {cc} does not run: {exc}") from exc
    return out.stdout.strip()


def _compiler_identity(cc: str) -> str:
    try:
        out = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as exc:
        raise ToolchainError(f"C compiler {cc} does not run: {exc}") from exc
    return out.stdout + out.stderr


def source_hash() -> str:
    h = hashlib.sha256()
    for name in (*SOURCES, *HEADERS, EMPTY_TABLE, "VERSION"):
        h.update(name.encode() + b"\0" + (AGENT_SRC / name).read_bytes() + b"\0")
    return h.hexdigest()


def agent_version() -> str:
    return f"{(AGENT_SRC / 'VERSION').read_text().strip()}+src.{source_hash()[:12]}"


@dataclass(frozen=True)
class LinkedKernel:
    """A kernel object file to link into a (static) agent, and the entry symbol it defines."""

    path: Path
    entry: str = DEFAULT_ENTRY


def build_agent(
    target_triple: str | None = None,
    static: bool = False,
    out_dir: str | os.PathLike | None = None,
    *,
    kernels: Sequence[str | os.PathLike | LinkedKernel] = (),
    cc: str | None = None,
) -> Path:
    """Compile ``edgetune-agent`` for ``target_triple`` (None: this host); return its path.

    ``static`` links libc statically (phones: no dependency on the device's libc). ``kernels``
    are TVM kernel object files (``export_kernel_object``) linked into the binary, for agents that
    cannot dlopen. Cached in ``out_dir`` (default: ``default_cache_dir()``).
    """
    tc = toolchain(target_triple, cc)
    linked = [k if isinstance(k, LinkedKernel) else LinkedKernel(Path(k)) for k in kernels]
    for k in linked:
        if not Path(k.path).is_file():
            raise ToolchainError(f"kernel object {k.path} does not exist")
    if len(linked) > 1 and tc.objcopy is None:
        raise ToolchainError(f"linking several kernels needs objcopy for {tc.triple}; none found")
    kernel_shas = [sha256_file(k.path) for k in linked]
    flags = _flags(tc, static)
    key = hashlib.sha256("\n".join([
        source_hash(), tc.triple, tc.cc, _compiler_identity(tc.cc), " ".join(flags),
        *(f"{s}:{k.entry}" for s, k in zip(kernel_shas, linked)),
    ]).encode()).hexdigest()[:20]
    out_root = Path(out_dir) if out_dir is not None else default_cache_dir()
    final_dir = out_root / f"{tc.triple}{'-static' if static else ''}-{key}"
    binary = final_dir / AGENT_NAME
    if binary.is_file():
        return binary

    out_root.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=".build-", dir=out_root))
    try:
        extra: list[str] = []
        table = str(AGENT_SRC / EMPTY_TABLE)
        if linked:
            table, extra = _link_table(tc, linked, kernel_shas, work)
        cmd = [tc.cc, *CFLAGS, f"-DET_AGENT_VERSION=\"{agent_version()}\"", *(["-DET_STATIC=1"] if static else []),
               *(str(AGENT_SRC / s) for s in SOURCES), table, *extra,
               "-o", str(work / AGENT_NAME), *flags]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        if proc.returncode != 0:
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-8:]
            raise ToolchainError(f"building the native agent with {tc.cc} failed: " + " | ".join(tail))
        (work / "BUILD").write_text(" ".join(cmd) + "\n")
        try:
            work.rename(final_dir)
        except OSError:  # a concurrent build won the race; theirs is identical
            if not binary.is_file():
                raise
        return binary
    finally:
        if work.exists():
            shutil.rmtree(work, ignore_errors=True)


def _flags(tc: Toolchain, static: bool) -> list[str]:
    libs = ["-ldl", "-lm"] if tc.android else ["-ldl", "-lpthread", "-lm"]
    return (["-static"] if static else ["-rdynamic"]) + libs


def _link_table(tc: Toolchain, kernels: list[LinkedKernel], shas: list[str], work: Path) -> tuple[str, list[str]]:
    """Copy (and, for several kernels, rename the entries of) the objects; generate the table."""
    objs: list[str] = []
    symbols: list[str] = []
    for i, (k, sha) in enumerate(zip(kernels, shas)):
        obj = work / f"kernel{i}.o"
        shutil.copyfile(k.path, obj)
        sym = k.entry
        if len(kernels) > 1:
            sym = f"edgetune_linked_kernel_{i}"
            proc = subprocess.run([tc.objcopy, f"--redefine-sym={k.entry}={sym}", str(obj)],
                                  capture_output=True, text=True, timeout=120)
            if proc.returncode != 0:
                raise ToolchainError(f"objcopy failed on {k.path}: {proc.stderr.strip()}")
        objs.append(str(obj))
        symbols.append(sym)
    lines = ['#include <stddef.h>', '#include "linked.h"', ""]
    lines += [f"extern int {s}(void*, const TVMFFIAny*, int32_t, TVMFFIAny*);" for s in symbols]
    lines += [f"extern void* {s} __attribute__((weak));" for s in KERNEL_SLOTS]
    lines += ["", "const et_linked_kernel et_linked_kernels[] = {"]
    lines += [f'  {{"{sha}", "{k.entry}", {s}}},' for sha, k, s in zip(shas, kernels, symbols)]
    lines += ["};", f"const int et_num_linked_kernels = {len(kernels)};", "",
              "const et_linked_slot et_linked_slots[] = {"]
    lines += [f'  {{"{s}", &{s}}},' for s in KERNEL_SLOTS]
    lines += ["};", f"const int et_num_linked_slots = {len(KERNEL_SLOTS)};", ""]
    table = work / "linked_kernels.c"
    table.write_text("\n".join(lines))
    return str(table), [f"-I{AGENT_SRC}", *objs]


def export_kernel_object(rt_mod: Any, path: str | os.PathLike) -> Path:
    """Write the host code of a compiled TVM kernel (``tvm.compile(...)`` result) as an object file.

    The object is what ``build_agent(..., kernels=[...])`` links; its target (``mtriple``) must be
    the agent's. Its sha256 is what the host puts in the request as ``artifact_sha256``.
    """
    mod = getattr(rt_mod, "mod", rt_mod)  # tvm.runtime.Executable wraps the runtime Module
    path = Path(path)
    mod.write_to_file(str(path))
    if not path.is_file() or path.stat().st_size == 0:
        raise ToolchainError(f"TVM wrote no object file to {path}")
    return path


def export_kernel_library(rt_mod: Any, path: str | os.PathLike, target_triple: str | None = None,
                          cc: str | None = None) -> Path:
    """Export a compiled TVM kernel as a shared library for the dynamic agent (cross-linked if needed)."""
    path = Path(path)
    if _is_host(target_triple) and cc is None:
        rt_mod.export_library(str(path))
    else:
        from tvm.support import cc as tvm_cc  # lazy: TVM is an optional extra

        tc = toolchain(target_triple, cc)
        rt_mod.export_library(str(path), fcompile=tvm_cc.cross_compiler(tc.cc))
    return path


ORTOP_SOURCE = "ortop.c"
ORTOP_HEADERS = ("ort_abi.h", "tensor.h", "tvm_abi.h")
ORTOP_PREFIX = "libedgetune-ortop-"


def build_ortop(target_triple: str | None = None, out_dir: str | os.PathLike | None = None, *,
                cc: str | None = None) -> Path:
    """Compile the onnxruntime custom-op library that runs TVM-exported kernels in an onnxruntime
    graph (``device_agents/native/ortop.c``) for ``target_triple``; return its path.

    The file is named by the digest of its own bytes (``libedgetune-ortop-<sha16>.so``), so a
    rewritten model names exactly the library it was verified with. Cached like the agent.
    """
    tc = toolchain(target_triple, cc)
    flags = ["-shared", "-fPIC", "-fvisibility=hidden", "-ldl", *([] if tc.android else ["-lpthread"])]
    h = hashlib.sha256()
    for name in (ORTOP_SOURCE, *ORTOP_HEADERS):
        h.update(name.encode() + b"\0" + (AGENT_SRC / name).read_bytes() + b"\0")
    key = hashlib.sha256("\n".join([h.hexdigest(), tc.triple, tc.cc, _compiler_identity(tc.cc),
                                    " ".join(flags)]).encode()).hexdigest()[:20]
    out_root = Path(out_dir) if out_dir is not None else default_cache_dir()
    final_dir = out_root / f"ortop-{tc.triple}-{key}"
    if final_dir.is_dir():
        found = sorted(final_dir.glob(f"{ORTOP_PREFIX}*.so"))
        if found:
            return found[0]
    out_root.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=".build-ortop-", dir=out_root))
    try:
        tmp = work / "lib.so"
        cmd = [tc.cc, *CFLAGS, str(AGENT_SRC / ORTOP_SOURCE), "-o", str(tmp), *flags]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        if proc.returncode != 0:
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-8:]
            raise ToolchainError(f"building the onnxruntime custom-op library with {tc.cc} failed: " + " | ".join(tail))
        lib = work / f"{ORTOP_PREFIX}{sha256_file(tmp)[:16]}.so"
        tmp.rename(lib)
        (work / "BUILD").write_text(" ".join(cmd) + "\n")
        try:
            work.rename(final_dir)
        except OSError:  # a concurrent build won the race; theirs is identical
            pass
        return next(iter(sorted(final_dir.glob(f"{ORTOP_PREFIX}*.so"))))
    finally:
        if work.exists():
            shutil.rmtree(work, ignore_errors=True)


LOADER_LIB = "libedgetune_loader.so"
LOADER_CHECK = "edgetune-check"
LOADER_SOURCES = ("edgetune_loader.c", "loader_config.c", "loader_ort.c", "loader_check.c", "fingerprint.c", "json.c",
                  "npy.c", "sha256.c")
LOADER_HEADERS = ("edgetune_loader.h", "loader_internal.h", "fingerprint.h", "json.h", "ort_abi.h", "sha256.h", "tensor.h")
CHECK_SOURCES = ("edgetune_check.c", "json.c")


@dataclass(frozen=True)
class LoaderBuild:
    """The app loader for one ABI: the library apps link, and the check program ``export check`` runs."""

    triple: str
    library: Path
    check: Path


def build_loader(target_triple: str | None = None, out_dir: str | os.PathLike | None = None, *,
                 cc: str | None = None) -> LoaderBuild:
    """Compile the app loader library (``device_agents/native/edgetune_loader.c``, libc + dlopen)
    and ``edgetune-check`` for ``target_triple``. Cached like the agent, by sources, compiler and flags."""
    tc = toolchain(target_triple, cc)
    libs = ["-ldl", "-lm"] if tc.android else ["-ldl", "-lpthread", "-lm"]
    lib_flags = ["-shared", "-fPIC", "-fvisibility=hidden", *libs]
    h = hashlib.sha256()
    for name in (*LOADER_SOURCES, *LOADER_HEADERS, *CHECK_SOURCES):
        h.update(name.encode() + b"\0" + (AGENT_SRC / name).read_bytes() + b"\0")
    key = hashlib.sha256("\n".join([h.hexdigest(), tc.triple, tc.cc, _compiler_identity(tc.cc),
                                    " ".join(lib_flags)]).encode()).hexdigest()[:20]
    out_root = Path(out_dir) if out_dir is not None else default_cache_dir()
    final_dir = out_root / f"loader-{tc.triple}-{key}"
    built = LoaderBuild(tc.triple, final_dir / LOADER_LIB, final_dir / LOADER_CHECK)
    if built.library.is_file() and built.check.is_file():
        return built
    out_root.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=".build-loader-", dir=out_root))
    try:
        cmds = [[tc.cc, *CFLAGS, *(str(AGENT_SRC / s) for s in LOADER_SOURCES), "-o", str(work / LOADER_LIB), *lib_flags],
                [tc.cc, *CFLAGS, *(str(AGENT_SRC / s) for s in CHECK_SOURCES), "-o", str(work / LOADER_CHECK), *libs]]
        for cmd in cmds:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
            if proc.returncode != 0:
                tail = (proc.stderr or proc.stdout).strip().splitlines()[-8:]
                raise ToolchainError(f"building the app loader with {tc.cc} failed: " + " | ".join(tail))
        (work / "BUILD").write_text("\n".join(" ".join(c) for c in cmds) + "\n")
        try:
            work.rename(final_dir)
        except OSError:  # a concurrent build won the race; theirs is identical
            if not built.library.is_file():
                raise
        return built
    finally:
        if work.exists():
            shutil.rmtree(work, ignore_errors=True)
