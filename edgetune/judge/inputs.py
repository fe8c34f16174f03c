"""What a judgement takes in: the kernel files (``collect_kernels``), the odd-sized variant of
the op its correctness is checked at (``odd_variant``), the op's attribute macros for a source
kernel (``op_macros``) and the imports that refuse a kernel where the device cannot filter
system calls (``forbidden_imports``)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from edgetune.build.kernel_build import classify
from edgetune.errors import UserInputError
from edgetune.kernels.workloads import parse_workload

SOURCE_SUFFIXES = {".c": "c", ".cc": "c++", ".cpp": "c++", ".cxx": "c++", ".cu": "cuda"}
# parameters an odd-size check keeps (strides, pads, filter sizes, flags): per op, since a
# convolution's S is its filter width and attention's S its sequence length
_KEEP = {"conv2d_nchw": {"R", "S", "stride", "pad"}, "conv2d_nhwc": {"R", "S", "stride", "pad"},
         "depthwise_conv2d_nchw": {"R", "S", "stride", "pad"}, "batch_matmul": {"TB"}, "attention": {"causal"}}

# Where the device cannot install the seccomp filter (qemu-user refuses guest filters: the test
# farm's emulated board), the agent only DETECTS forbidden acts after a call (new processes, open
# sockets, files open for writing) and cannot see one that was undone in time. There, a kernel
# that imports a function of those families is refused before it runs.
FORBIDDEN_IMPORTS: dict[str, frozenset[str]] = {
    "forbidden-exec": frozenset({"execve", "execv", "execvp", "execvpe", "execl", "execlp", "execle", "fexecve",
                                 "execveat", "system", "popen", "posix_spawn", "posix_spawnp", "dlopen", "dlsym",
                                 "dlmopen", "dlvsym"}),
    "forbidden-process": frozenset({"fork", "vfork", "clone", "clone3", "daemon", "_Fork"}),
    "forbidden-network": frozenset({"socket", "socketpair", "connect", "bind", "listen", "accept", "accept4",
                                    "getaddrinfo", "gethostbyname", "sendto", "sendmsg", "recvfrom", "recvmsg"}),
    # (not open/openat: reading is allowed, and a static C++ runtime imports open)
    "forbidden-file": frozenset({"creat", "creat64", "fopen", "fopen64",
                                 "freopen", "freopen64", "mkdir", "mkdirat", "unlink", "unlinkat", "remove",
                                 "rename", "renameat", "renameat2", "link", "linkat", "symlink", "symlinkat",
                                 "truncate", "truncate64", "chmod", "fchmodat", "chown", "lchown", "fchownat",
                                 "mknod", "mknodat", "mkfifo", "tmpfile", "mkstemp", "mkostemp"}),
    "forbidden-syscall": frozenset({"syscall", "kill", "tgkill", "tkill", "ptrace", "process_vm_readv",
                                    "process_vm_writev", "pidfd_open", "pidfd_send_signal", "killpg", "sigqueue",
                                    "prctl", "mount", "umount", "umount2", "unshare", "setns", "chroot",
                                    "personality", "io_uring_setup", "io_uring_enter", "perf_event_open"}),
}


def forbidden_imports(undefined) -> tuple[str, list[str]] | None:
    """(code, the imported names) of the first family a kernel imports from, or None."""
    for code, names in FORBIDDEN_IMPORTS.items():
        hit = sorted(names & set(undefined))
        if hit:
            return code, hit
    return None


@dataclass(frozen=True)
class KernelFile:
    name: str  # unique display name (the file name; a clash gets its parent directory)
    path: Path
    kind: str  # c | c++ | cuda | shared-object
    sha256: str  # of the file as given


def collect_kernels(paths: Sequence[str]) -> list[KernelFile]:
    """Every kernel named: files as given, directories by their kernel files (sorted); one clear
    UserInputError for a path that is missing, unreadable or not a kernel."""
    if not paths:
        raise UserInputError("give one or more KERNEL files or directories to judge")
    found: list[tuple[Path, str]] = []
    for raw in paths:
        p = Path(raw).expanduser()
        if p.is_dir():
            inside = []
            for q in sorted(p.iterdir()):
                if not q.is_file():
                    continue
                if q.suffix.lower() not in SOURCE_SUFFIXES and q.suffix.lower() != ".so":
                    continue
                inside.append((q, classify(q)))
            if not inside:
                raise UserInputError(f"{p}: no kernels in this directory (.c, .cc, .cpp, .cu, .so)")
            found.extend(inside)
        else:
            if not p.exists():
                raise UserInputError(f"{p}: no such kernel file")
            found.append((p, classify(p)))
    seen: set[Path] = set()
    out: list[KernelFile] = []
    names: set[str] = set()
    for p, kind in found:
        rp = p.resolve()
        if rp in seen:
            continue
        seen.add(rp)
        name = p.name if p.name not in names else f"{p.parent.name}/{p.name}"
        i = 2
        while name in names:
            name, i = f"{p.name}#{i}", i + 1
        names.add(name)
        try:
            sha = hashlib.sha256(p.read_bytes()).hexdigest()
        except OSError as exc:
            raise UserInputError(f"{p}: cannot read it ({exc.strerror or exc})") from None
        out.append(KernelFile(name, p, kind, sha))
    return out


def odd_variant(w):
    """The op with every even dimension made odd (minus one), or None when it has none: the shape
    of the correctness check that catches kernels right only on friendly sizes."""
    params = w.params()
    keep = _KEEP.get(w.op, set())
    changed = {k: (v - 1 if (k not in keep and isinstance(v, int) and v > 1 and v % 2 == 0) else v)
               for k, v in params.items()}
    if changed == params:
        return None
    spec = f"{w.op}:" + ",".join(f"{k}={v}" for k, v in changed.items())
    try:
        return parse_workload(spec)
    except UserInputError:
        return None  # an op whose constraints the variant breaks: checked at the spec only


def op_macros(w) -> list[str]:
    """``-D`` flags for a source kernel: the op's attributes that are not tensor shapes (a causal
    mask, strides, pads, filter sizes, a transposed operand), e.g. ``-DEDGETUNE_ATTENTION_CAUSAL=1``:
    the ABI passes shapes, not attributes. The same in the odd-size check and the rounds."""
    keep = _KEEP.get(w.op, set())
    return [f"-DEDGETUNE_{w.op.upper()}_{k.upper()}={v}" for k, v in w.params().items() if k in keep]
