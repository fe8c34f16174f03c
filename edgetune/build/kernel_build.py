"""Build (or accept prebuilt) third-party kernels for ``edgetune judge``.

A judged kernel exports the DLPack ABI of ``edgetune/include/edgetune_kernel.h``::

    int edgetune_kernel(const DLTensor *inputs, int32_t num_inputs, DLTensor *outputs, int32_t num_outputs);

or is a TVM-exported module (``__tvm_ffi_main``, what ``edgetune tune-kernels`` produces).

* ``classify(path)``: "c", "c++", "cuda" (by suffix) or "shared-object" (by the ELF magic).
* ``elf_info(path)``: a small bounds-checked ELF reader (pure Python, ELF32/ELF64 little-endian):
  machine, kind, and the defined/undefined dynamic symbols. A corrupt or hostile file is a
  ``UserInputError``, never another exception or a huge allocation.
* ``abi_of(info)`` and ``interposed(info)``: which entry point, and which libc/TVM-hook symbols
  the kernel defines (the host-side early refusal; the device agent re-checks in its process).
* ``build_kernel(source, arch, out_dir)``: compile C/C++ (host gcc, ``<triple>-gcc``/``-g++``,
  or the NDK's clang) or CUDA (nvcc) into a shared object, cached by content in ``out_dir``.
* ``prepare_prebuilt(path, arch)``: check a prebuilt .so (machine, ABI) and record its sha256.

Compile errors are the user's: ``KernelBuildError`` (a ``UserInputError``) whose one line names
the file and the compiler's first error; the full compiler output is in ``.details``.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import struct
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Sequence

from edgetune.build import native
from edgetune.errors import ToolchainError, UserInputError
from edgetune.hashing import sha256_file

INCLUDE_DIR = Path(__file__).resolve().parents[1] / "include"
ENTRY_EDGETUNE = "edgetune_kernel"
ENTRY_TVM = "__tvm_ffi_main"
SO_NAME = "kernel.so"
BUILD_RECORD = "BUILD.json"
BUILD_TIMEOUT_S = 600

SOURCE_KINDS = {".c": "c", ".cc": "c++", ".cpp": "c++", ".cxx": "c++", ".c++": "c++", ".cu": "cuda"}

# Symbols whose definition in a kernel would replace (interpose) what the agent's process relies
# on: the clock it times with, the allocator and copies it verifies with, process/file/network
# calls the sandbox polices, and the TVM backend hooks the agent supplies itself.
INTERPOSABLE = frozenset({
    # time
    "clock_gettime", "clock_getres", "clock", "time", "gettimeofday", "times", "nanosleep",
    "clock_nanosleep", "usleep", "sleep", "getrusage", "timespec_get", "__clock_gettime",
    "__vdso_clock_gettime", "__kernel_clock_gettime",
    # memory
    "memcpy", "memmove", "memset", "memcmp", "bcmp", "bzero", "explicit_bzero", "__memcpy_chk",
    "__memmove_chk", "__memset_chk", "strlen", "strcmp", "strncmp", "strcpy", "strncpy",
    "malloc", "calloc", "realloc", "reallocarray", "free", "posix_memalign", "aligned_alloc",
    "memalign", "valloc", "pvalloc", "malloc_usable_size", "mmap", "mmap64", "munmap", "mremap",
    "mprotect", "madvise", "brk", "sbrk", "mlock", "munlock",
    "_Znwm", "_Znam", "_ZdlPv", "_ZdaPv", "_ZdlPvm", "_ZdaPvm",  # operator new/delete
    # threads, loader
    "pthread_create", "pthread_join", "pthread_detach", "pthread_exit", "pthread_kill",
    "pthread_once", "pthread_mutex_lock", "pthread_mutex_unlock", "pthread_cond_wait",
    "pthread_cond_signal", "pthread_cond_broadcast", "pthread_barrier_wait",
    "dlopen", "dlsym", "dlvsym", "dlclose", "dlerror", "dladdr", "dl_iterate_phdr",
    "__libc_start_main", "__cxa_atexit", "__cxa_finalize", "atexit", "__tls_get_addr",
    # files, processes, network
    "open", "open64", "openat", "openat64", "creat", "fopen", "fopen64", "fdopen", "freopen",
    "read", "pread", "pread64", "readv", "write", "pwrite", "pwrite64", "writev", "close",
    "fwrite", "fread", "fflush", "fclose", "printf", "fprintf", "puts", "perror",
    "ioctl", "fcntl", "dup", "dup2", "dup3", "pipe", "pipe2", "unlink", "rename", "truncate",
    "ftruncate", "stat", "fstat", "lstat", "access",
    "fork", "vfork", "clone", "clone3", "execve", "execv", "execvp", "execvpe", "execl",
    "execlp", "execle", "fexecve", "posix_spawn", "posix_spawnp", "system", "popen", "pclose",
    "wait", "waitpid", "waitid", "kill", "tgkill", "tkill", "ptrace", "prctl", "seccomp",
    "setrlimit", "getrlimit", "prlimit", "prlimit64",
    "socket", "socketpair", "connect", "bind", "listen", "accept", "accept4", "send", "sendto",
    "sendmsg", "recv", "recvfrom", "recvmsg", "getaddrinfo",
    "syscall", "sched_yield", "sched_setaffinity", "sched_getaffinity", "sysconf",
    "exit", "_exit", "_Exit", "quick_exit", "abort", "__stack_chk_fail", "__assert_fail",
    "signal", "sigaction", "sigprocmask", "pthread_sigmask", "raise", "alarm", "setitimer",
    "getpid", "getppid", "gettid", "getenv", "setenv", "putenv", "errno", "__errno_location",
    "rand", "srand", "rand_r", "random", "srandom", "drand48", "getrandom", "arc4random",
    "longjmp", "setjmp", "_setjmp", "siglongjmp",
    # TVM backend hooks (the agent supplies these; a kernel defining them takes over the agent)
    "TVMBackendAllocWorkspace", "TVMBackendFreeWorkspace", "TVMBackendParallelLaunch",
    "TVMBackendParallelBarrier", "TVMBackendGetFuncFromEnv", "TVMBackendRegisterSystemLibSymbol",
    "TVMFFIErrorSetRaisedFromCStr", "TVMFFIErrorSetRaised", "TVMFFIFunctionCall",
    "TVMFFIEnvModLookupFromImports", "TVMFFIHandleInitOnce", "TVMFFIObjectDecRef",
    "TVMFFIObjectIncRef", "TVMFFIEnvGetStream", "TVMFFIEnvSetStream",
})

_ARCH_ALIASES = {"amd64": "x86_64", "x64": "x86_64", "x86-64": "x86_64", "arm64": "aarch64",
                 "armv8": "aarch64", "arm64-v8a": "aarch64"}
_ELF_MACHINES = {3: "x86", 8: "mips", 20: "ppc", 21: "ppc64", 40: "arm", 62: "x86_64",
                 183: "aarch64", 243: "riscv", 258: "loongarch"}
_ELF_KINDS = {1: "relocatable", 2: "executable", 3: "shared-object", 4: "core"}
_SHT_DYNSYM = 11
_MAX_SECTIONS = 4096
_MAX_SYMBOLS = 1 << 20
_MAX_STRTAB = 64 << 20


class KernelBuildError(UserInputError):
    """A kernel source the compiler refused; ``str()`` is one line, ``details`` the compiler's output."""

    def __init__(self, message: str, details: str = ""):
        super().__init__(message)
        self.details = details


@dataclass(frozen=True)
class ElfInfo:
    machine: str  # "x86_64", "aarch64", ... or "elf-machine-<n>"
    kind: str  # "shared-object", "executable", "relocatable", "core", ...
    defined: frozenset[str]  # defined global/weak dynamic symbols
    undefined: frozenset[str]  # undefined dynamic symbols (what the loader must resolve)


@dataclass(frozen=True)
class BuiltKernel:
    path: Path  # the shared object
    sha256: str  # of the shared object (what the device agent checks)
    source_sha256: str  # of the source, or of the .so itself for a prebuilt one
    kind: str  # "c", "c++", "cuda", "shared-object"
    abi: str  # "edgetune" or "tvm"
    arch: str  # the device's machine: "x86_64", "aarch64", ...
    command: tuple[str, ...] | None  # argv exactly as run (cwd: the build dir); None when prebuilt
    compiler: str | None  # "<path>: <first line of --version>"
    flags: tuple[str, ...]  # the flags of the command (ours, then the user's)
    interposed: tuple[str, ...]  # defined symbols that interpose libc/the agent (see INTERPOSABLE)


def normalize_arch(arch: str) -> str:
    a = arch.strip().lower()
    return _ARCH_ALIASES.get(a, a)


# ---------------------------------------------------------------- classification and ELF


def classify(path: str | os.PathLike) -> str:
    """"c", "c++", "cuda" (by suffix) or "shared-object" (ELF magic); else UserInputError."""
    p = Path(path)
    if not p.exists():
        raise UserInputError(f"kernel {p} does not exist")
    if not p.is_file():
        raise UserInputError(f"kernel {p} is not a file")
    try:
        with open(p, "rb") as f:
            magic = f.read(4)
    except OSError as exc:
        raise UserInputError(f"kernel {p} cannot be read: {exc.strerror or exc}") from None
    if magic == b"\x7fELF":
        info = elf_info(p)
        if info.kind != "shared-object":
            raise UserInputError(f"kernel {p} is an ELF {info.kind}, not a shared object")
        return "shared-object"
    kind = SOURCE_KINDS.get(p.suffix.lower())
    if kind is None:
        raise UserInputError(
            f"kernel {p} is not a kernel: expected a .c, .cc/.cpp/.cxx, .cu source or an ELF shared object")
    return kind


class _Reader:
    """Bounds-checked reads from an open file of known size."""

    def __init__(self, f: BinaryIO, size: int, name: str):
        self.f, self.size, self.name = f, size, name

    def bad(self, why: str) -> UserInputError:
        return UserInputError(f"kernel {self.name} is not a valid ELF file: {why}")

    def read(self, offset: int, length: int, what: str) -> bytes:
        if offset < 0 or length < 0 or offset + length > self.size:
            raise self.bad(f"{what} lies outside the file")
        self.f.seek(offset)
        data = self.f.read(length)
        if len(data) != length:
            raise self.bad(f"{what} is truncated")
        return data


def elf_info(path: str | os.PathLike) -> ElfInfo:
    """Machine, kind and dynamic symbols of an ELF file; UserInputError for anything malformed."""
    p = Path(path)
    try:
        size = p.stat().st_size
        f = open(p, "rb")
    except OSError as exc:
        raise UserInputError(f"kernel {p} cannot be read: {exc.strerror or exc}") from None
    with f:
        try:
            return _parse_elf(_Reader(f, size, str(p)))
        except OSError as exc:
            raise UserInputError(f"kernel {p} cannot be read: {exc.strerror or exc}") from None


def _parse_elf(r: _Reader) -> ElfInfo:
    ident = r.read(0, 16, "ELF header")
    if ident[:4] != b"\x7fELF":
        raise r.bad("no ELF magic")
    elf_class, data = ident[4], ident[5]
    if data != 1:
        raise r.bad("not little-endian" if data == 2 else f"unknown data encoding {data}")
    if elf_class == 2:
        hdr_fmt, sh_fmt, sym_fmt = "<HHIQQQIHHHHHH", "<IIQQQQIIQQ", "<IBBHQQ"
    elif elf_class == 1:
        hdr_fmt, sh_fmt, sym_fmt = "<HHIIIIIHHHHHH", "<IIIIIIIIII", "<IIIBBH"
    else:
        raise r.bad(f"unknown ELF class {elf_class}")
    hdr = struct.unpack(hdr_fmt, r.read(16, struct.calcsize(hdr_fmt), "ELF header"))
    e_type, e_machine = hdr[0], hdr[1]
    e_shoff, e_shentsize, e_shnum = hdr[5], hdr[10], hdr[11]
    machine = _ELF_MACHINES.get(e_machine, f"elf-machine-{e_machine}")
    kind = _ELF_KINDS.get(e_type, f"elf-type-{e_type}")
    sh_size = struct.calcsize(sh_fmt)
    if e_shoff == 0 or e_shnum == 0:
        if kind == "shared-object":
            raise r.bad("no section headers (a stripped-of-sections shared object cannot be checked)")
        return ElfInfo(machine, kind, frozenset(), frozenset())
    if e_shentsize < sh_size:
        raise r.bad(f"section header size {e_shentsize} is too small")
    if e_shnum > _MAX_SECTIONS:
        raise r.bad(f"{e_shnum} sections")
    table = r.read(e_shoff, e_shnum * e_shentsize, "section header table")
    sections = [struct.unpack_from(sh_fmt, table, i * e_shentsize) for i in range(e_shnum)]
    # (type, offset, size, link, entsize): same positions in ELF32 and ELF64 section headers
    secs = [(s[1], s[4], s[5], s[6], s[9]) for s in sections]
    defined: set[str] = set()
    undefined: set[str] = set()
    dynsyms = [s for s in secs if s[0] == _SHT_DYNSYM]
    if not dynsyms and kind == "shared-object":
        raise r.bad("no dynamic symbol table")
    sym_size = struct.calcsize(sym_fmt)
    for _type, off, size, link, entsize in dynsyms[:1]:
        if entsize < sym_size:
            raise r.bad(f"dynamic symbol size {entsize} is too small")
        count = size // entsize
        if count > _MAX_SYMBOLS:
            raise r.bad(f"{count} dynamic symbols")
        if not 0 <= link < len(secs):
            raise r.bad("dynamic symbol table links to no string table")
        _st, str_off, str_size, _l, _e = secs[link]
        if str_size > _MAX_STRTAB:
            raise r.bad(f"dynamic string table of {str_size} bytes")
        strtab = r.read(str_off, str_size, "dynamic string table")
        symtab = r.read(off, count * entsize, "dynamic symbol table")
        for i in range(1, count):  # entry 0 is the null symbol
            fields_ = struct.unpack_from(sym_fmt, symtab, i * entsize)
            if elf_class == 2:
                st_name, st_info, st_other, st_shndx = fields_[0], fields_[1], fields_[2], fields_[3]
            else:
                st_name, st_info, st_other, st_shndx = fields_[0], fields_[3], fields_[4], fields_[5]
            if st_name == 0:
                continue
            if st_name >= len(strtab):
                raise r.bad("symbol name outside the string table")
            end = strtab.find(b"\0", st_name)
            if end < 0:
                raise r.bad("unterminated symbol name")
            name = strtab[st_name:end].decode("utf-8", "replace")
            bind, visibility = st_info >> 4, st_other & 3
            if st_shndx == 0:
                undefined.add(name)
            elif bind in (1, 2, 10) and visibility in (0, 3):  # GLOBAL/WEAK/GNU_UNIQUE, DEFAULT/PROTECTED
                defined.add(name)
    return ElfInfo(machine, kind, frozenset(defined), frozenset(undefined))


def abi_of(info: ElfInfo) -> str:
    """"edgetune" (exports edgetune_kernel) or "tvm" (exports __tvm_ffi_main); else UserInputError."""
    if ENTRY_EDGETUNE in info.defined:
        return "edgetune"
    if ENTRY_TVM in info.defined:
        return "tvm"
    raise UserInputError(f"the kernel exports neither {ENTRY_EDGETUNE} nor {ENTRY_TVM}")


def interposed(info: ElfInfo) -> list[str]:
    """The defined symbols that would interpose libc/libm/libpthread/libdl/ld.so or the agent's TVM hooks."""
    return sorted(info.defined & INTERPOSABLE)


# ---------------------------------------------------------------- building


def _target(arch: str, triple: str | None) -> tuple[str, str | None]:
    """(normalized arch, triple for native.toolchain: None = this host)."""
    arch = normalize_arch(arch)
    if triple is not None:
        t_arch = normalize_arch(triple.split("-")[0])
        if t_arch != arch:
            raise UserInputError(f"target triple {triple} is not for a {arch} device")
        return arch, (None if native._is_host(triple) else triple)
    if arch == native.HOST_ARCH:
        return arch, None
    return arch, f"{arch}-linux-gnu"


def _compiler_for(kind: str, triple: str | None) -> str:
    """The absolute path of the compiler for a C or C++ source."""
    tc = native.toolchain(triple)  # ToolchainError (one line) when the C compiler is missing
    if kind == "c":
        return tc.cc
    if tc.android:
        cxx = tc.cc + "++"  # <arch>-linux-android<api>-clang -> ...-clang++
    elif triple is None:
        cxx = os.environ.get("CXX") or "c++"
    else:
        cxx = f"{triple}-g++"
    path = native._which(cxx)
    if path is None:
        hint = "check ANDROID_NDK_HOME" if tc.android else (
            "install a C++ compiler (Debian: apt install g++)" if triple is None
            else f"install a cross C++ compiler (Debian: apt install g++-{triple})")
        raise ToolchainError(f"C++ compiler for kernels ({triple or 'host'}) not found: {cxx}; {hint}")
    return path


def _version_line(compiler: str) -> str:
    try:
        out = subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as exc:
        raise ToolchainError(f"compiler {compiler} does not run: {exc}") from None
    lines = (out.stdout or out.stderr).strip().splitlines()
    return f"{compiler}: {lines[0] if lines else '?'}"


def _flags(kind: str) -> tuple[list[str], list[str]]:
    """(flags before the source, libraries after it: with --as-needed a library must follow its user)."""
    inc = f"-I{INCLUDE_DIR}"
    if kind == "cuda":
        return ["-O3", "-shared", "-Xcompiler", "-fPIC", inc], []
    std = ["-std=c11"] if kind == "c" else ["-std=c++17", "-static-libstdc++", "-static-libgcc"]
    # --no-undefined: a kernel calling a function nobody defines fails here, not on the device;
    # --exclude-libs: what static libraries (libstdc++) bring along is not exported (nor interposes).
    return ["-O3", "-fPIC", "-shared", *std, inc, "-pthread", "-Wl,--no-undefined",
            "-Wl,--exclude-libs,ALL"], ["-lm"]


_ERROR_LINE = re.compile(r"\b(?:fatal )?error\b:|undefined reference|undefined symbol")


def _first_errors(output: str, limit: int = 2) -> str:
    """The compiler's first error lines, joined into one line."""
    lines = [ln.strip() for ln in output.splitlines() if ln.strip()]
    errs = [ln for ln in lines if _ERROR_LINE.search(ln) and not ln.startswith(("collect2", "clang: error: linker"))]
    errs = errs or [ln for ln in lines if _ERROR_LINE.search(ln)] or lines
    return " | ".join(errs[:limit]) if errs else "no output"


_SM_RE = re.compile(r"^sm_[0-9]{2,3}[a-z]?$")


def cuda_sms(path: str | os.PathLike) -> list[int]:
    """The SM versions of the GPU binaries (cubins: ELF, machine EM_CUDA) embedded in a shared
    object's fat binary, e.g. [90] for one built with -arch=sm_90: what the GPU runs without a JIT."""
    data = Path(path).read_bytes()
    out, i = [], 64
    while True:
        i = data.find(b"\x7fELF", i)
        if i < 0 or i + 52 > len(data):
            break
        if data[i + 4] == 2 and struct.unpack_from("<H", data, i + 18)[0] == 190:  # 64-bit, EM_CUDA
            sm = (struct.unpack_from("<I", data, i + 48)[0] >> 8) & 0xFF
            if sm and sm not in out:
                out.append(sm)
        i += 4
    return sorted(out)


def build_kernel(source: str | os.PathLike, arch: str, out_dir: str | os.PathLike, *,
                 triple: str | None = None, cflags: Sequence[str] = (), cuda_arch: str | None = None) -> BuiltKernel:
    """Compile a C/C++/CUDA kernel into a shared object for ``arch``, cached by content in ``out_dir``.
    ``cuda_arch``: the device GPU's SM (e.g. "sm_90", from its fingerprint): CUDA is compiled to
    that SM's binary (and its PTX), not to nvcc's default.

    A prebuilt shared object is passed to ``prepare_prebuilt``. Compile errors raise
    ``KernelBuildError`` (one line naming the file and the compiler's first error).
    """
    source = Path(source)
    kind = classify(source)
    if kind == "shared-object":
        return prepare_prebuilt(source, arch)
    arch, tc_triple = _target(arch, triple)
    if kind == "cuda":
        if arch != native.HOST_ARCH:
            raise ToolchainError(f"CUDA kernels are built on a {arch} host only (this host is {native.HOST_ARCH})")
        compiler = native._which(os.environ.get("NVCC") or "nvcc")
        if compiler is None:
            raise ToolchainError("nvcc not found: CUDA kernels need the CUDA toolkit and a GPU device")
        if cuda_arch is not None:
            if not _SM_RE.match(cuda_arch):
                raise UserInputError(f"not a GPU architecture: {cuda_arch!r} (e.g. sm_90)")
            cflags = [f"-arch={cuda_arch}", *cflags]
    else:
        compiler = _compiler_for(kind, tc_triple)
    before, libs = _flags(kind)
    flags = [*before, *cflags, *libs]
    identity = _version_line(compiler)
    src = source.resolve()
    source_sha = sha256_file(src)
    lang = ["-x", "cu"] if kind == "cuda" else []
    # The command is the same wherever it runs: output relative to the build dir (its cwd).
    command = [compiler, *before, *cflags, *lang, str(src), "-o", SO_NAME, *libs]
    headers = hashlib.sha256()
    for h in sorted(INCLUDE_DIR.rglob("*.h")):
        headers.update(h.relative_to(INCLUDE_DIR).as_posix().encode() + b"\0" + h.read_bytes())
    key = hashlib.sha256("\n".join([
        source_sha, identity, tc_triple or native.HOST_ARCH, json.dumps(command), headers.hexdigest(),
    ]).encode()).hexdigest()[:24]
    out_root = Path(out_dir)
    final_dir = out_root / f"{source.stem}-{arch}-{key}"
    so = final_dir / SO_NAME
    if not (so.is_file() and (final_dir / BUILD_RECORD).is_file()):
        out_root.mkdir(parents=True, exist_ok=True)
        work = Path(tempfile.mkdtemp(prefix=".build-", dir=out_root))
        try:
            try:
                proc = subprocess.run(command, cwd=work, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                raise KernelBuildError(f"{source}: the compiler ran over {BUILD_TIMEOUT_S} s") from None
            except OSError as exc:
                raise ToolchainError(f"compiler {compiler} does not run: {exc}") from None
            if proc.returncode != 0 or not (work / SO_NAME).is_file():
                output = (proc.stderr or "") + (proc.stdout or "")
                raise KernelBuildError(
                    f"{source}: compile failed ({Path(compiler).name}): {_first_errors(output)}", output)
            (work / BUILD_RECORD).write_text(json.dumps({"command": command, "compiler": identity,
                                                         "source": str(src), "source_sha256": source_sha}))
            try:
                work.rename(final_dir)
            except OSError:  # a concurrent build won the race; theirs is identical
                if not so.is_file():
                    raise
        finally:
            if work.exists():
                shutil.rmtree(work, ignore_errors=True)
    info = elf_info(so)
    if info.machine != arch:
        raise ToolchainError(f"{compiler} built a {info.machine} object for a {arch} device")
    return BuiltKernel(path=so, sha256=sha256_file(so), source_sha256=source_sha, kind=kind,
                       abi=abi_of(info), arch=arch, command=tuple(command), compiler=identity,
                       flags=tuple(flags), interposed=tuple(interposed(info)))


def prepare_prebuilt(path: str | os.PathLike, arch: str) -> BuiltKernel:
    """Check a prebuilt shared object for a device of ``arch``; UserInputError (one line) if it cannot run there."""
    p = Path(path)
    kind = classify(p)
    if kind != "shared-object":
        raise UserInputError(f"kernel {p} is a {kind} source, not a prebuilt shared object")
    arch = normalize_arch(arch)
    info = elf_info(p)
    if info.machine != arch:
        raise UserInputError(f"kernel {p} is built for {info.machine}; the device is {arch}")
    sha = sha256_file(p)
    return BuiltKernel(path=p.resolve(), sha256=sha, source_sha256=sha, kind=kind, abi=abi_of(info), arch=arch,
                       command=None, compiler=None, flags=(), interposed=tuple(interposed(info)))
