"""The judge's kernel builder (edgetune/build/kernel_build.py) and our kernel suite (tests/judge_kernels).

Real compilers, no mocks: every kernel of the suite is built for this host (and for aarch64 with
the cross compiler); the honest ones are loaded in this process through ctypes with a Python-side
DLTensor and checked against numpy in float64 on odd sizes, which proves both the suite and the
ABI header. Of the dishonest ones, only those that stay inside their own buffers run here (never
the ones that exec, kill, leak threads or write out of bounds): they must do their one bad thing.
Bad inputs (missing, text named .so, corrupt ELF, wrong machine, compile errors) are one-line
UserInputErrors, never tracebacks.
"""

from __future__ import annotations

import ctypes
import os
import platform
import random
import re
import shutil
import struct
import subprocess
from pathlib import Path

import numpy as np
import pytest

from edgetune.agent.validate import FAULT_CODES
from edgetune.build import kernel_build as kb
from edgetune.errors import ToolchainError, UserInputError
from edgetune.hashing import sha256_file
from tests.conftest import require

SUITE = Path(__file__).resolve().parents[1] / "judge_kernels"
KERNELS = sorted(p for p in SUITE.iterdir() if p.suffix in (".c", ".cpp"))
HONEST = ("gemm_naive.c", "gemm_blocked.c", "gemm_blocked.cpp", "softmax_naive.c", "layernorm_naive.c",
          "attention_naive.c", "attention_causal_naive.c")
CODES = {"correct", "wrong-output", "imprecise", "non-deterministic", "input-mutated", "out-of-bounds-access",
         "out-of-bounds-write", "stale-output", "wrong-when-timed", "insensitive", "caching", "late-write",
         "non-finite", "interposed-symbol", "crashed", "hung", "out-of-memory", "forbidden-exec",
         "forbidden-process", "forbidden-network", "forbidden-file", "forbidden-syscall"} | set(FAULT_CODES)
HEADER = re.compile(r"^/\* edgetune-judge: op=(?P<op>[a-z_]+:[A-Za-z]+=\d+(?:,[A-Za-z]+=\d+)*) "
                    r"expect=(?P<expect>[a-z-]+(?:\|[a-z-]+)*) -- (?P<desc>[^\n]+?) \*/$")
AARCH64 = "aarch64-linux-gnu"
HOST = kb.normalize_arch(platform.machine())


def _need_cross() -> None:
    require(shutil.which(f"{AARCH64}-gcc") is not None, f"{AARCH64}-gcc not installed")


@pytest.fixture(scope="module")
def out(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("kernels")


@pytest.fixture(scope="module")
def built(out) -> dict[str, kb.BuiltKernel]:
    return {p.name: kb.build_kernel(p, HOST, out) for p in KERNELS}


def _header(path: Path) -> re.Match:
    first = path.read_text().splitlines()[0]
    m = HEADER.match(first)
    assert m, f"{path.name}: bad first line {first!r}"
    return m


# ---------------------------------------------------------------- DLTensor through ctypes


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


def _tensors(arrays: list[np.ndarray]):
    arr = (DLTensor * max(1, len(arrays)))()
    keep = []
    for t, a in zip(arr, arrays):
        assert a.dtype == np.float32 and a.flags.c_contiguous
        shape = (ctypes.c_int64 * a.ndim)(*a.shape)
        keep.append(shape)
        t.data = a.ctypes.data
        t.device = DLDevice(1, 0)  # kDLCPU
        t.ndim = a.ndim
        t.dtype = DLDataType(2, 32, 1)  # kDLFloat, 32 bits
        t.shape = shape
        t.strides = None
        t.byte_offset = 0
    return arr, keep


class Kernel:
    def __init__(self, so: Path):
        self.lib = ctypes.CDLL(str(so))
        self.fn = self.lib.edgetune_kernel
        self.fn.restype = ctypes.c_int
        self.fn.argtypes = [ctypes.c_void_p, ctypes.c_int32, ctypes.c_void_p, ctypes.c_int32]

    def __call__(self, inputs: list[np.ndarray], out_shapes: list[tuple[int, ...]], fill=np.nan) -> list[np.ndarray]:
        outs = [np.full(s, fill, np.float32) for s in out_shapes]
        ins, k1 = _tensors(inputs)
        os_, k2 = _tensors(outs)
        rc = self.fn(ctypes.addressof(ins), len(inputs), ctypes.addressof(os_), len(outs))
        assert rc == 0
        return outs


def _rand(rng, *shape, scale=3.0) -> np.ndarray:
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def _close(got: np.ndarray, ref: np.ndarray, rtol=1e-4) -> None:
    np.testing.assert_allclose(got, ref, rtol=rtol, atol=rtol * float(np.abs(ref).max() or 1.0))


def _gemm_case(rng, m, n, k):
    a, b = _rand(rng, m, k), _rand(rng, k, n)
    return [a, b], a.astype(np.float64) @ b.astype(np.float64)


def _attention_ref(q, k, v, causal):
    q, k, v = (x.astype(np.float64) for x in (q, k, v))
    s_len, l_len, d = q.shape[2], k.shape[2], q.shape[3]
    s = q @ np.swapaxes(k, -1, -2) / np.sqrt(d)
    if causal:
        i = np.arange(s_len)[:, None]
        j = np.arange(l_len)[None, :]
        s = np.where(j > i + (l_len - s_len), -np.inf, s)
    s = s - s.max(axis=-1, keepdims=True)
    p = np.exp(s)
    return (p / p.sum(axis=-1, keepdims=True)) @ v


# ---------------------------------------------------------------- the suite


def test_every_kernel_has_a_parseable_header():
    assert len(KERNELS) >= 25
    for p in KERNELS:
        m = _header(p)
        codes = m["expect"].split("|")
        assert set(codes) <= CODES, (p.name, codes)
        assert ("correct" in codes) == (p.name in HONEST or p.name == "gemm_memo.c"), p.name


@pytest.mark.parametrize("name", [p.name for p in KERNELS])
def test_builds_for_this_host(built, name):
    b = built[name]
    assert b.abi == "edgetune" and b.arch == HOST
    assert b.kind == ("c++" if name.endswith(".cpp") else "c")
    assert b.path.is_file() and b.sha256 == sha256_file(b.path)
    assert b.source_sha256 == sha256_file(SUITE / name)
    assert b.command[0] == b.compiler.split(":")[0] and str(SUITE / name) in b.command
    assert b.command[-3:] == ("-o", kb.SO_NAME, "-lm") and b.flags == b.command[1:-4] + ("-lm",)
    assert list(b.interposed) == (["clock_gettime"] if name == "gemm_clock.c" else []), b.interposed
    info = kb.elf_info(b.path)
    assert info.kind == "shared-object" and "edgetune_kernel" in info.defined


def test_build_is_cached_and_content_addressed(built, out, tmp_path):
    first = built["gemm_naive.c"]
    again = kb.build_kernel(SUITE / "gemm_naive.c", HOST, out)
    assert again == first
    copy = tmp_path / "gemm_naive.c"
    copy.write_text((SUITE / "gemm_naive.c").read_text() + "\n/* changed */\n")
    other = kb.build_kernel(copy, HOST, out)
    assert other.path != first.path and other.source_sha256 != first.source_sha256
    flagged = kb.build_kernel(copy, HOST, out, cflags=["-O1"])
    assert flagged.path != other.path and flagged.flags[-2:] == ("-O1", "-lm")


def test_cxx_kernel_links_its_runtime_statically_and_exports_only_the_entry(built):
    info = kb.elf_info(built["gemm_blocked.cpp"].path)
    assert not any(n.startswith("_Z") for n in info.defined), sorted(info.defined)
    assert not any("libstdc++" in u for u in info.undefined)


def test_builds_for_aarch64(tmp_path):
    _need_cross()
    for p in KERNELS:
        if p.suffix == ".cpp" and shutil.which(f"{AARCH64}-g++") is None:
            with pytest.raises(ToolchainError) as exc:
                kb.build_kernel(p, "aarch64", tmp_path)
            assert "\n" not in str(exc.value) and f"{AARCH64}-g++" in str(exc.value)
            continue
        b = kb.build_kernel(p, "aarch64", tmp_path)
        assert b.arch == "aarch64" and kb.elf_info(b.path).machine == "aarch64" and b.abi == "edgetune"
        assert b.command[0].endswith(f"{AARCH64}-gcc" if p.suffix == ".c" else f"{AARCH64}-g++")
        assert list(b.interposed) == (["clock_gettime"] if p.name == "gemm_clock.c" else [])
    pre = kb.prepare_prebuilt(b.path, "arm64")
    assert pre.arch == "aarch64" and pre.command is None


# ---------------------------------------------------------------- honest kernels, run here


@pytest.mark.parametrize("name", ["gemm_naive.c", "gemm_blocked.c", "gemm_blocked.cpp"])
@pytest.mark.parametrize("mnk", [(97, 130, 75), (37, 29, 19), (1, 1, 1), (5, 3, 0), (70, 530, 300)])
def test_honest_gemm(built, name, mnk):
    rng = np.random.default_rng(mnk)
    inputs, ref = _gemm_case(rng, *mnk)
    (c,) = Kernel(built[name].path)(inputs, [ref.shape])
    _close(c, ref)


def test_honest_softmax_and_layernorm(built):
    rng = np.random.default_rng(1)
    for m, n in ((37, 101), (3, 1), (64, 257)):
        x = _rand(rng, m, n, scale=8.0)
        (y,) = Kernel(built["softmax_naive.c"].path)([x], [(m, n)])
        e = np.exp(x.astype(np.float64) - x.max(axis=1, keepdims=True))
        _close(y, e / e.sum(axis=1, keepdims=True))
        gamma, beta = _rand(rng, n), _rand(rng, n)
        (y,) = Kernel(built["layernorm_naive.c"].path)([x, gamma, beta], [(m, n)])
        xd = x.astype(np.float64)
        ref = (xd - xd.mean(1, keepdims=True)) / np.sqrt(xd.var(1, keepdims=True) + 1e-5) * gamma + beta
        _close(y, ref)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("bhsdl", [(2, 3, 17, 24, 29), (1, 2, 16, 8, 16), (1, 1, 5, 7, 1 + 5)])
def test_honest_attention(built, causal, bhsdl):
    b, h, s, d, l_len = bhsdl
    rng = np.random.default_rng(s * l_len)
    q, k, v = _rand(rng, b, h, s, d, scale=1.5), _rand(rng, b, h, l_len, d, scale=1.5), _rand(rng, b, h, l_len, d)
    name = "attention_causal_naive.c" if causal else "attention_naive.c"
    (o,) = Kernel(built[name].path)([q, k, v], [(b, h, s, d)])
    _close(o, _attention_ref(q, k, v, causal))


# ---------------------------------------------------------------- dishonest kernels that are safe here


def test_dishonest_kernels_do_their_one_bad_thing(built):
    rng = np.random.default_rng(7)
    inputs, ref = _gemm_case(rng, 97, 130, 75)
    shape = [ref.shape]

    def err(c):
        return float(np.abs(c - ref).max() / np.abs(ref).max())

    assert err(Kernel(built["gemm_wrong.c"].path)(inputs, shape)[0]) > 1e-2
    odd = Kernel(built["gemm_odd_sizes.c"].path)
    assert np.isnan(odd(inputs, shape)[0]).any()
    eights, ref8 = _gemm_case(rng, 64, 40, 24)
    _close(odd(eights, [ref8.shape])[0], ref8)
    assert 1e-4 < err(Kernel(built["gemm_fp16.c"].path)(inputs, shape)[0]) < 5e-2
    nd = Kernel(built["gemm_nondeterministic.c"].path)
    c1, c2 = nd(inputs, shape)[0], nd(inputs, shape)[0]
    assert not np.array_equal(c1, c2) and err(c1) < 1e-3

    stale = Kernel(built["gemm_stale.c"].path)
    for _ in range(3):
        _close(stale(inputs, shape)[0], ref)
    fresh, fresh_ref = _gemm_case(rng, 97, 130, 75)
    assert np.array_equal(stale(fresh, shape)[0], stale(inputs, shape)[0])  # the 3rd call's output, replayed

    memo = Kernel(built["gemm_memo.c"].path)
    _close(memo(inputs, shape)[0], ref)
    _close(memo(fresh, shape)[0], fresh_ref)
    assert np.array_equal(memo(fresh, shape, fill=0.0)[0], memo(fresh, shape)[0])

    skip = Kernel(built["gemm_skip_work.c"].path)
    for _ in range(10):
        _close(skip(inputs, shape)[0], ref)
    late = skip(inputs, shape)[0]
    assert np.isnan(late[1::4]).all() and not np.isnan(late[::4]).any()

    a = inputs[0].copy()
    _close(Kernel(built["gemm_mutate_input.c"].path)([a, inputs[1]], shape)[0], ref)
    assert not np.array_equal(a, inputs[0])

    _close(Kernel(built["gemm_clock.c"].path)(inputs, shape)[0], ref)  # honest maths; RTLD_LOCAL: no interposition


# ---------------------------------------------------------------- classify, ELF, ABI


def test_classify(built, tmp_path):
    for suffix, kind in ((".c", "c"), (".cc", "c++"), (".cpp", "c++"), (".cxx", "c++"), (".cu", "cuda")):
        (tmp_path / f"k{suffix}").write_text("int x;\n")
        assert kb.classify(tmp_path / f"k{suffix}") == kind
    renamed = tmp_path / "kernel.bin"
    renamed.write_bytes(built["gemm_naive.c"].path.read_bytes())
    assert kb.classify(renamed) == "shared-object"
    fake = tmp_path / "fake.so"
    fake.write_text("this is not an ELF file\n")
    dangling = tmp_path / "dangling.so"
    dangling.symlink_to(tmp_path / "nowhere")
    for bad, words in ((tmp_path / "missing.c", "does not exist"), (fake, "not a kernel"), (tmp_path, "not a file"),
                       (dangling, "does not exist")):
        with pytest.raises(UserInputError) as exc:
            kb.classify(bad)
        assert words in str(exc.value) and "\n" not in str(exc.value)
    if os.geteuid() != 0:
        unreadable = tmp_path / "secret.c"
        unreadable.write_text("int x;\n")
        unreadable.chmod(0)
        with pytest.raises(UserInputError, match="cannot be read"):
            kb.classify(unreadable)


def _cc(src: Path) -> Path:
    so = src.with_suffix(".so")
    subprocess.run(["cc", "-shared", "-fPIC", str(src), "-o", str(so)], check=True)
    return so


def test_abi_and_interposed(tmp_path):
    tvm = _cc(_write(tmp_path / "tvm.c", "int __tvm_ffi_main(void *a, void *b, int c, void *d) { return 0; }\n"
                                         "void *__TVMBackendAllocWorkspace;\n"))
    info = kb.elf_info(tvm)
    assert kb.abi_of(info) == "tvm" and kb.interposed(info) == []
    neither = _cc(_write(tmp_path / "neither.c", "int kernel(void) { return 0; }\n"))
    with pytest.raises(UserInputError, match="exports neither edgetune_kernel nor __tvm_ffi_main"):
        kb.abi_of(kb.elf_info(neither))
    with pytest.raises(UserInputError, match="exports neither"):
        kb.prepare_prebuilt(neither, HOST)
    hooks = _cc(_write(tmp_path / "hooks.c", "#include <stddef.h>\n"
                                           "void *memcpy(void *d, const void *s, size_t n) { return d; }\n"
                                           "int TVMBackendParallelLaunch(void *f, void *c, int n) { return 0; }\n"
                                           "int edgetune_kernel(void) { return 0; }\n"
                                           "static int gettimeofday_helper(void) { return 0; }\n"
                                           "int use(void) { return gettimeofday_helper(); }\n"))
    info = kb.elf_info(hooks)
    assert kb.abi_of(info) == "edgetune"
    assert kb.interposed(info) == ["TVMBackendParallelLaunch", "memcpy"]


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_prebuilt(built, tmp_path):
    so = tmp_path / "k.so"
    so.write_bytes(built["gemm_clock.c"].path.read_bytes())
    pre = kb.prepare_prebuilt(so, {"x86_64": "amd64", "aarch64": "arm64"}.get(HOST, HOST))  # aliases accepted
    assert (pre.kind, pre.abi, pre.arch, pre.command, pre.compiler) == ("shared-object", "edgetune", HOST, None, None)
    assert pre.sha256 == built["gemm_clock.c"].sha256 and pre.interposed == ("clock_gettime",)
    assert kb.build_kernel(so, HOST, tmp_path / "out") == pre
    with pytest.raises(UserInputError, match="source, not a prebuilt"):
        kb.prepare_prebuilt(SUITE / "gemm_naive.c", HOST)


def test_wrong_machine_is_one_line(built, tmp_path):
    other = {"x86_64": (183, "aarch64")}.get(HOST, (62, "x86_64"))
    data = bytearray(built["gemm_naive.c"].path.read_bytes())
    struct.pack_into("<H", data, 18, other[0])  # e_machine
    so = _write_bytes(tmp_path / "other.so", bytes(data))
    with pytest.raises(UserInputError) as exc:
        kb.prepare_prebuilt(so, HOST)
    assert str(exc.value) == f"kernel {so} is built for {other[1]}; the device is {HOST}"


def _write_bytes(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def test_wrong_arch_prebuilt_is_one_line(tmp_path):
    _need_cross()
    if HOST == "aarch64":
        pytest.skip("this host is aarch64: test_wrong_machine_is_one_line covers it")
    b = kb.build_kernel(SUITE / "gemm_naive.c", "aarch64", tmp_path)
    with pytest.raises(UserInputError) as exc:
        kb.prepare_prebuilt(b.path, "x86_64")
    msg = str(exc.value)
    assert "\n" not in msg and "built for aarch64" in msg and "x86_64" in msg


def test_compile_error_is_one_line_naming_file_and_message(tmp_path):
    bad = _write(tmp_path / "broken.c", '#include <edgetune_kernel.h>\n'
                 'EDGETUNE_KERNEL int edgetune_kernel(const DLTensor *i, int32_t ni, DLTensor *o, int32_t no) {\n'
                 '  return nope;\n}\n')
    with pytest.raises(kb.KernelBuildError) as exc:
        kb.build_kernel(bad, HOST, tmp_path / "out")
    msg = str(exc.value)
    assert "\n" not in msg and "broken.c" in msg and "nope" in msg and "error" in msg
    assert "nope" in exc.value.details
    assert isinstance(exc.value, UserInputError)
    undefined = _write(tmp_path / "undef.c", "int missing_fn(void);\nint edgetune_kernel(void) { return missing_fn(); }\n")
    with pytest.raises(kb.KernelBuildError) as exc:
        kb.build_kernel(undefined, HOST, tmp_path / "out")
    assert "missing_fn" in str(exc.value) and "\n" not in str(exc.value)  # --no-undefined: refused on the host
    assert not any(p.name.startswith(".build-") for p in (tmp_path / "out").iterdir())


def test_cuda(tmp_path, monkeypatch):
    cu = _write(tmp_path / "k.cu", '#include <edgetune_kernel.h>\n__global__ void noop() {}\n'
                                   'EDGETUNE_KERNEL int edgetune_kernel(const DLTensor *i, int32_t ni, DLTensor *o, '
                                   'int32_t no) { return 0; }\n')
    monkeypatch.setenv("NVCC", str(tmp_path / "no-nvcc"))
    with pytest.raises(ToolchainError) as exc:
        kb.build_kernel(cu, HOST, tmp_path / "out")
    assert str(exc.value) == "nvcc not found: CUDA kernels need the CUDA toolkit and a GPU device"
    monkeypatch.delenv("NVCC")
    require(shutil.which("nvcc") is not None, "nvcc (make setup installs NVIDIA's nvcc wheels)")
    b = kb.build_kernel(cu, HOST, tmp_path / "out")
    assert b.kind == "cuda" and b.abi == "edgetune" and b.command[1:6] == ("-O3", "-shared", "-Xcompiler", "-fPIC",
                                                                           f"-I{kb.INCLUDE_DIR}")


def test_missing_toolchains_are_one_line(tmp_path, monkeypatch):
    monkeypatch.delenv("ANDROID_NDK_HOME", raising=False)
    monkeypatch.delenv("ANDROID_NDK_ROOT", raising=False)
    with pytest.raises(ToolchainError, match="ANDROID_NDK_HOME") as exc:
        kb.build_kernel(SUITE / "gemm_naive.c", "aarch64", tmp_path, triple="aarch64-linux-android24")
    assert "\n" not in str(exc.value)
    with pytest.raises(UserInputError, match="not for a x86_64 device"):
        kb.build_kernel(SUITE / "gemm_naive.c", "x86_64", tmp_path, triple="aarch64-linux-gnu")
    with pytest.raises(ToolchainError, match="sparc64-linux-gnu-gcc") as exc:
        kb.build_kernel(SUITE / "gemm_naive.c", "sparc64", tmp_path)
    assert "\n" not in str(exc.value)


# ---------------------------------------------------------------- corrupt ELF fuzz


def test_corrupt_elf_is_a_user_error_never_a_crash(built, tmp_path):
    good = built["gemm_naive.c"].path.read_bytes()
    rng = random.Random(1234)
    cases = int(os.environ.get("EDGETUNE_FUZZ_CASES", "400"))
    # where the parser looks: ELF header, section headers, .dynsym/.dynstr
    e_shoff = struct.unpack_from("<Q", good, 0x28)[0]
    hot = [(0, 64), (e_shoff, len(good))]
    path = tmp_path / "fuzz.so"
    outcomes = {"ok": 0, "error": 0}
    for i in range(cases):
        data = bytearray(good)
        mode = i % 4
        if mode == 0:
            data = data[: rng.randrange(0, len(good))]
        else:
            lo, hi = hot[rng.randrange(2)] if mode != 3 else (0, len(good))
            for _ in range(rng.randint(1, 8)):
                pos = rng.randrange(lo, hi)
                data[pos] = rng.choice((0, 0xFF, 0x7F, 0x80, rng.randrange(256)))
        path.write_bytes(bytes(data))
        try:
            info = kb.elf_info(path)
        except UserInputError as exc:
            assert "\n" not in str(exc)
            outcomes["error"] += 1
        else:
            assert isinstance(info, kb.ElfInfo) and isinstance(info.defined, frozenset)
            outcomes["ok"] += 1
        try:
            kb.classify(path)
        except UserInputError:
            pass
    assert outcomes["error"] > cases // 10 and outcomes["ok"] > 0, outcomes


def test_hostile_elf_headers_allocate_nothing_large(built, tmp_path):
    good = bytearray(built["gemm_naive.c"].path.read_bytes())
    path = tmp_path / "h.so"
    cases = {
        "shnum": lambda d: struct.pack_into("<H", d, 0x3C, 0xFFFF),
        "shoff": lambda d: struct.pack_into("<Q", d, 0x28, 2**63),
        "shentsize": lambda d: struct.pack_into("<H", d, 0x3A, 1),
        "bigendian": lambda d: d.__setitem__(5, 2),
        "class": lambda d: d.__setitem__(4, 9),
    }
    for name, patch in cases.items():
        d = bytearray(good)
        patch(d)
        path.write_bytes(bytes(d))
        with pytest.raises(UserInputError):
            kb.elf_info(path)
    # a .dynsym claiming 2**60 bytes
    e_shoff, = struct.unpack_from("<Q", good, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", good, 0x3A)
    for i in range(shnum):
        off = e_shoff + i * shentsize
        if struct.unpack_from("<I", good, off + 4)[0] == 11:
            d = bytearray(good)
            struct.pack_into("<Q", d, off + 0x20, 2**60)
            path.write_bytes(bytes(d))
            with pytest.raises(UserInputError, match="dynamic symbols|outside"):
                kb.elf_info(path)
            break
    else:
        pytest.fail("no .dynsym found")


# ---------------------------------------------------------------- honest kernels cross-built, run under qemu

DRIVER_C = r"""
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <edgetune_kernel.h>

/* driver KERNEL.so OUT_FILE OUT_SHAPE [IN_FILE IN_SHAPE]...: raw float32 files, shapes "d0,d1,..." */
typedef int (*kernel_fn)(const DLTensor *, int32_t, DLTensor *, int32_t);
static int64_t shapes[9][8];

static size_t setup(DLTensor *t, int64_t *shape, const char *s) {
  char *end;
  size_t numel = 1;
  t->ndim = 0;
  while (*s) {
    numel *= (size_t)(shape[t->ndim++] = strtoll(s, &end, 10));
    s = *end == ',' ? end + 1 : end;
  }
  t->shape = shape;
  t->strides = NULL;
  t->byte_offset = 0;
  t->device.device_type = kDLCPU;
  t->device.device_id = 0;
  t->dtype.code = kDLFloat;
  t->dtype.bits = 32;
  t->dtype.lanes = 1;
  t->data = calloc(numel ? numel : 1, sizeof(float));
  return numel;
}

int main(int argc, char **argv) {
  DLTensor in[8], out[1];
  int nin = (argc - 4) / 2;
  void *lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (!lib) { fprintf(stderr, "%s\n", dlerror()); return 2; }
  kernel_fn fn = (kernel_fn)dlsym(lib, "edgetune_kernel");
  size_t n_out = setup(&out[0], shapes[8], argv[3]);
  for (int i = 0; i < nin; i++) {
    size_t n = setup(&in[i], shapes[i], argv[5 + 2 * i]);
    FILE *f = fopen(argv[4 + 2 * i], "rb");
    if (!f || fread(in[i].data, sizeof(float), n, f) != n) return 3;
    fclose(f);
  }
  int rc = fn(in, nin, out, 1);
  FILE *f = fopen(argv[2], "wb");
  if (!f || fwrite(out[0].data, sizeof(float), n_out, f) != n_out) return 4;
  fclose(f);
  return rc;
}
"""


@pytest.fixture(scope="module")
def aarch64_driver(tmp_path_factory):
    _need_cross()
    require(shutil.which("qemu-aarch64") is not None, "qemu-aarch64 (qemu-user) not installed")
    require(Path(f"/usr/{AARCH64}/lib/ld-linux-aarch64.so.1").exists(), "libc6-dev-arm64-cross not installed")
    d = tmp_path_factory.mktemp("aarch64")
    src = _write(d / "driver.c", DRIVER_C)
    subprocess.run([f"{AARCH64}-gcc", "-O1", f"-I{kb.INCLUDE_DIR}", str(src), "-o", str(d / "driver"), "-ldl"],
                   check=True, capture_output=True)
    return d / "driver"


def _run_aarch64(driver: Path, so: Path, inputs: list[np.ndarray], out_shape, tmp: Path) -> np.ndarray:
    argv = ["qemu-aarch64", "-L", f"/usr/{AARCH64}", str(driver), str(so), str(tmp / "out.bin"),
            ",".join(map(str, out_shape))]
    for i, a in enumerate(inputs):
        a.tofile(tmp / f"in{i}.bin")
        argv += [str(tmp / f"in{i}.bin"), ",".join(map(str, a.shape))]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return np.fromfile(tmp / "out.bin", np.float32).reshape(out_shape)


def test_honest_kernels_cross_built_for_aarch64_are_correct(aarch64_driver, tmp_path):
    rng = np.random.default_rng(11)
    build = {n: kb.build_kernel(SUITE / n, "aarch64", tmp_path / "out").path
             for n in ("gemm_naive.c", "gemm_blocked.c", "softmax_naive.c", "layernorm_naive.c",
                       "attention_causal_naive.c", "gemm_wrong.c")}
    for name in ("gemm_naive.c", "gemm_blocked.c"):
        for mnk in ((97, 130, 75), (37, 29, 19)):
            inputs, ref = _gemm_case(rng, *mnk)
            _close(_run_aarch64(aarch64_driver, build[name], inputs, ref.shape, tmp_path), ref)
    wrong = _run_aarch64(aarch64_driver, build["gemm_wrong.c"], inputs, ref.shape, tmp_path)
    assert np.abs(wrong - ref).max() > 1e-2 * np.abs(ref).max()  # the driver really checks
    inputs, ref = _gemm_case(rng, 70, 530, 300)
    _close(_run_aarch64(aarch64_driver, build["gemm_blocked.c"], inputs, ref.shape, tmp_path), ref)
    x = _rand(rng, 37, 101, scale=8.0)
    e = np.exp(x.astype(np.float64) - x.max(axis=1, keepdims=True))
    _close(_run_aarch64(aarch64_driver, build["softmax_naive.c"], [x], x.shape, tmp_path), e / e.sum(1, keepdims=True))
    gamma, beta = _rand(rng, 101), _rand(rng, 101)
    xd = x.astype(np.float64)
    ref = (xd - xd.mean(1, keepdims=True)) / np.sqrt(xd.var(1, keepdims=True) + 1e-5) * gamma + beta
    _close(_run_aarch64(aarch64_driver, build["layernorm_naive.c"], [x, gamma, beta], x.shape, tmp_path), ref)
    q, k, v = _rand(rng, 2, 3, 17, 24, scale=1.5), _rand(rng, 2, 3, 29, 24, scale=1.5), _rand(rng, 2, 3, 29, 24)
    _close(_run_aarch64(aarch64_driver, build["attention_causal_naive.c"], [q, k, v], q.shape, tmp_path),
           _attention_ref(q, k, v, True))
