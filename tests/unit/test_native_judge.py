"""The native agent's ``judge`` backend (device_agents/PROTOCOL.md "The judge backend"): untrusted C
kernels run in a sandboxed kernel child, timed by the worker through a shared-memory handshake.

Real parts only: the agent built by edgetune.build.native, kernels compiled here with gcc, every job
run through ``run-stdio`` (the supervisor bounds even a hostile kernel), natively (seccomp) and, where
the cross tools exist, under qemu-aarch64 (no guest seccomp: the sandbox detects from /proc).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import uuid
from pathlib import Path

import numpy as np
import pytest

from edgetune.build import native
from tests.conftest import require

AARCH64 = "aarch64-linux-gnu"
QEMU = shutil.which("qemu-aarch64")
MAGIC = b"EDGETUNE-BUNDLE 1\n"
M, N, K = 37, 29, 19

PRELUDE = r"""
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <signal.h>
#include <pthread.h>
#include <time.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/ptrace.h>
typedef struct { int32_t device_type, device_id; } DLDevice;
typedef struct { uint8_t code, bits; uint16_t lanes; } DLDataType;
typedef struct { void* data; DLDevice device; int32_t ndim; DLDataType dtype; int64_t* shape; int64_t* strides;
                 uint64_t byte_offset; } DLTensor;
static void gemm(const DLTensor* in, DLTensor* out) {
  const float* a = (const float*)in[0].data; const float* b = (const float*)in[1].data; float* c = (float*)out[0].data;
  int64_t m = in[0].shape[0], k = in[0].shape[1], n = in[1].shape[1];
  for (int64_t i = 0; i < m; i++)
    for (int64_t j = 0; j < n; j++) {
      float s = 0;
      for (int64_t p = 0; p < k; p++) s += a[i * k + p] * b[p * n + j];
      c[i * n + j] = s;
    }
}
"""


def kernel(body: str, extra: str = "") -> str:
    return PRELUDE + extra + ("\nint edgetune_kernel(const DLTensor* in, int32_t nin, DLTensor* out, int32_t nout) {\n"
                              "  (void)nin; (void)nout;\n" + body + "\n}\n")


HONEST = kernel("gemm(in, out); return 0;")
KERNELS = {
    "honest": HONEST,
    "exec": kernel('char* argv[] = {"/bin/sh", "-c", "true", NULL}; execve("/bin/sh", argv, NULL);'
                   " gemm(in, out); return 0;"),
    "system": kernel('if (system("true") < 0) return 3; gemm(in, out); return 0;'),
    "socket": kernel("static int fd = -1; if (fd < 0) { fd = socket(AF_INET, SOCK_STREAM, 0);"
                     " struct sockaddr_in sa = {0}; sa.sin_family = AF_INET; sa.sin_port = htons(9);"
                     " sa.sin_addr.s_addr = htonl(0x7f000001); connect(fd, (struct sockaddr*)&sa, sizeof sa); }"
                     " gemm(in, out); return 0;"),
    "file": kernel('FILE* f = fopen(JUDGE_PATH, "w"); if (f) { fputs("x", f); fclose(f); } gemm(in, out); return 0;'),
    "kill": kernel("kill(getppid(), SIGKILL); gemm(in, out); return 0;"),
    "ptrace": kernel("ptrace(PTRACE_ATTACH, getppid(), 0, 0); gemm(in, out); return 0;"),
    "mutate": kernel("gemm(in, out); ((float*)in[0].data)[3] = 1.0f; return 0;"),
    "oob_read": kernel("gemm(in, out); const float* a = (const float*)in[1].data; volatile float s = 0;"
                       " for (long i = 0; i < 29 * 19 + 2048; i++) s += a[i]; return s == 12345.0f;"),
    "oob_write": kernel("gemm(in, out); ((float*)out[0].data)[37 * 29] = 1.0f; return 0;"),
    "interpose": kernel("gemm(in, out); return 0;",
                        "int clock_gettime(clockid_t c, struct timespec* t) { (void)c; t->tv_sec = 0;"
                        " t->tv_nsec = 0; return 0; }\n"),
    "mprotect": kernel("gemm(in, out); uintptr_t pg = (uintptr_t)in[0].data & ~(uintptr_t)4095;"
                       " mprotect((void*)pg, 4096, PROT_READ | PROT_WRITE); ((float*)in[0].data)[0] = 1.0f; return 0;",
                       "#include <sys/mman.h>\n"),
    "noentry": PRELUDE + "int not_the_entry(void) { return 0; }\n",
    "null": kernel("gemm(in, out); *(volatile int*)0 = 1; return 0;"),
    "error": kernel("gemm(in, out); return 7;"),
    "spin": kernel("for (;;) { __asm__ __volatile__(\"\" ::: \"memory\"); } return 0;"),
    "hog": kernel("for (;;) { char* p = malloc(16 << 20); if (!p) return 1; memset(p, 1, 16 << 20); }"),
    "late": kernel("gemm(in, out); static int started; static pthread_t th;"
                   " if (!started) { started = 1; pthread_create(&th, NULL, writer, out[0].data); }"
                   " return 0;",
                   "static void* writer(void* p) { volatile float* c = (volatile float*)p; float v = 0;"
                   " for (;;) { c[0] = c[0] + 0.0f; if (v > 1e30f) v = 0; v += 1; c[0] = v;"
                   " struct timespec ts = {0, 1000000}; nanosleep(&ts, NULL); } return NULL; }\n"),
}


# ---------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("judge")


def _compile(cc: str, name: str, out: Path, defines=()) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    src = out / f"{name}.c"
    src.write_text(KERNELS[name])
    so = out / f"{name}.so"
    subprocess.run([cc, "-O2", "-shared", "-fPIC", "-pthread", *defines, str(src), "-o", str(so)], check=True,
                   capture_output=True)
    return so


@pytest.fixture(scope="module")
def host(work):
    require(shutil.which(os.environ.get("CC") or "cc") is not None, "no host C compiler")
    agent = native.build_agent(None, static=False, out_dir=work / "agent")
    return [str(agent)], shutil.which("gcc") or "cc"


@pytest.fixture(scope="module")
def qemu(work):
    require(shutil.which(f"{AARCH64}-gcc") is not None, f"{AARCH64}-gcc not installed")
    require(Path(f"/usr/{AARCH64}/lib/ld-linux-aarch64.so.1").exists(), "libc6-dev-arm64-cross not installed")
    require(QEMU is not None, "qemu-aarch64 (qemu-user) not installed")
    agent = native.build_agent(AARCH64, static=False, out_dir=work / "agent")
    return [QEMU, "-L", f"/usr/{AARCH64}", str(agent)], f"{AARCH64}-gcc"


def _sets(seed=5):
    rng = np.random.default_rng(seed)
    return [[(rng.standard_normal((M, K)) * 3).astype(np.float32), rng.standard_normal((K, N)).astype(np.float32)]
            for _ in range(2)]


def parse_bundle(out: bytes) -> dict[str, bytes]:
    assert out.startswith(MAGIC), out[:300]
    pos, files = len(MAGIC), {}
    while True:
        nl = out.index(b"\n", pos)
        line = out[pos:nl].decode()
        if line == "END":
            return files
        name, size = line.rsplit(" ", 1)
        files[name] = out[nl + 1:nl + 1 + int(size)]
        pos = nl + 1 + int(size)


def judge(argv, so: Path, work: Path, *, limits=None, params=None, budget_ms=10.0, timeout=60):
    """One job through run-stdio: (result.json, bundle files, the input sets)."""
    sets = _sets()
    ind = work / "inputs" / uuid.uuid4().hex[:8]
    ind.mkdir(parents=True)
    rows = []
    for i, s in enumerate(sets):
        row = []
        for k, a in enumerate(s):
            np.save(ind / f"in_{i}_{k}.npy", a)
            row.append(str(ind / f"in_{i}_{k}.npy"))
        rows.append(row)
    req = {"protocol": 3, "backend": "judge", "artifact": str(so),
           "artifact_sha256": hashlib.sha256(so.read_bytes()).hexdigest(), "params": params or {"abi": "edgetune"},
           "input_names": ["A", "B"], "inputs": rows,
           "outputs": [{"name": "C", "dtype": "float32", "shape": [M, N]}],
           "warmup_ms": 2.0, "budget_ms": budget_ms, "min_iters": 5, "max_iters": 400, "fresh_seed": 11,
           "check_iters": 3, "check_fastest": 1, "probe_pairs": 4,
           "limits": {"timeout_s": 20, "memory_mb": 512, "max_procs": 32, **(limits or {})}}
    jobdir = work / "jobs" / uuid.uuid4().hex[:12]
    jobdir.parent.mkdir(exist_ok=True)
    proc = subprocess.run([*argv, "run-stdio", str(jobdir)], input=json.dumps(req).encode(), capture_output=True,
                          timeout=timeout)
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")[-2000:]
    files = parse_bundle(proc.stdout)
    return json.loads(files["result.json"]), files, sets


def load_npy(data: bytes) -> np.ndarray:
    import io
    return np.load(io.BytesIO(data))


def assert_fault(res: dict, code: str, *words: str) -> None:
    assert res["status"] == "error", res
    assert res["fault"]["code"] == code, (res["reason"], res.get("fault"))
    assert res["reason"].startswith(code + ": "), res["reason"]
    for w in words:
        assert w in res["fault"]["detail"], res["fault"]


# ---------------------------------------------------------------- x86-64 (seccomp)


def test_honest_gemm(host, work):
    argv, cc = host
    res, files, sets = judge(argv, _compile(cc, "honest", work / "k"), work)
    assert res["status"] == "ok", res["reason"]
    assert res["fault"] is None
    info = res["backend_info"]
    assert info["sandbox"] == "seccomp" and info["handshake_ns"] > 0 and info["inputs_sealed"] is True, info
    for i, s in enumerate(sets):
        got = load_npy(files[f"out_{i}_0.npy"])
        np.testing.assert_allclose(got, s[0] @ s[1], rtol=1e-4, atol=1e-4)
    assert len(res["samples_ns"]) >= 5 and res["late_change"] is None
    info_out = json.loads(subprocess.run([*argv, "info"], capture_output=True, text=True, check=True).stdout)
    assert info_out["runtimes"]["judge"] == "1" and info_out["runtimes"]["judge-sandbox"] == "seccomp"


@pytest.mark.parametrize("name,code,word", [
    ("exec", "forbidden-exec", "execve"),
    ("system", "forbidden-process", "clone"),
    ("socket", "forbidden-network", "socket"),
    ("kill", "forbidden-syscall", "kill"),
    ("ptrace", "forbidden-syscall", "ptrace"),
    ("mutate", "input-mutated", "input 0"),
    ("mprotect", "input-mutated", "input 0"),
    ("noentry", "bad-artifact", "edgetune_kernel"),
    ("oob_read", "out-of-bounds-access", "past the end of input 1"),
    ("interpose", "interposed-symbol", "clock_gettime"),
    ("null", "crashed", "SIGSEGV"),
    ("error", "kernel-error", "returned 7"),
])
def test_fault_codes(host, work, name, code, word):
    argv, cc = host
    res, _, _ = judge(argv, _compile(cc, name, work / "k"), work)
    assert_fault(res, code, word)
    assert "limit" not in res and "signal" not in res  # the worker survived and wrote the result


def test_wrong_architecture(host, work):
    argv, _ = host
    cross = f"{AARCH64}-gcc" if not os.uname().machine.startswith("aarch64") else "x86_64-linux-gnu-gcc"
    require(shutil.which(cross) is not None, f"{cross} not installed")
    res, _, _ = judge(argv, _compile(cross, "honest", work / "k-other"), work)
    assert_fault(res, "wrong-architecture", "e_machine")


def test_file_write_is_refused_and_nothing_written(host, work):
    argv, cc = host
    target = work / "written-by-kernel.txt"
    res, _, _ = judge(argv, _compile(cc, "file", work / "k", [f'-DJUDGE_PATH="{target}"']), work)
    assert_fault(res, "forbidden-file", "open")
    assert not target.exists()


def test_out_of_bounds_write_is_the_guard_zone_failure(host, work):
    argv, cc = host
    res, _, _ = judge(argv, _compile(cc, "oob_write", work / "k"), work)
    assert res["status"] == "error" and "out-of-bounds write past the end of output 0" in res["guard_violation"], res
    assert res["fault"] is None


def test_memory_hog_is_the_memory_limit(host, work):
    argv, cc = host
    res, _, _ = judge(argv, _compile(cc, "hog", work / "k"), work, limits={"memory_mb": 256})
    assert res["status"] == "error" and res.get("limit") == "memory", res


def test_kernel_that_never_returns_is_hung_and_dies_with_the_job(host, work):
    argv, cc = host
    so = _compile(cc, "spin", work / "k")
    res, _, _ = judge(argv, so, work, limits={"timeout_s": 1.5})
    assert res["status"] == "error" and res.get("limit") == "time", res
    holders = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if str(so) in Path(f"/proc/{pid}/maps").read_text():
                holders.append(pid)
        except OSError:
            continue
    assert not holders, f"processes still running the kernel: {holders}"


def test_thread_writing_after_return_is_a_late_change(host, work):
    argv, cc = host
    res, _, _ = judge(argv, _compile(cc, "late", work / "k"), work)
    assert res["late_change"] is not None and res["late_change"]["outputs"] == [0], res


# ---------------------------------------------------------------- aarch64 under qemu (detect)


def test_qemu_honest_gemm(qemu, work):
    argv, cc = qemu
    res, files, sets = judge(argv, _compile(cc, "honest", work / "k-a64"), work)
    assert res["status"] == "ok", res["reason"]
    assert res["backend_info"]["sandbox"].startswith("detect"), res["backend_info"]
    assert res["backend_info"]["handshake_ns"] > 0
    np.testing.assert_allclose(load_npy(files["out_0_0.npy"]), sets[0][0] @ sets[0][1], rtol=1e-4, atol=1e-4)
    info = json.loads(subprocess.run([*argv, "info"], capture_output=True, text=True, check=True).stdout)
    assert info["runtimes"]["judge"] == "1" and info["runtimes"]["judge-sandbox"] == "detect"


@pytest.mark.parametrize("name,code", [("system", "forbidden-process"), ("socket", "forbidden-network"),
                                       ("exec", "forbidden-exec"), ("file", "forbidden-file"),
                                       ("kill", "forbidden-syscall")])
def test_qemu_detects(qemu, work, name, code):
    """No seccomp under qemu-user: the agent's libc guards (and /proc between runs) name the kernel."""
    argv, cc = qemu
    target = work / f"written-under-qemu-{name}.txt"
    res, _, _ = judge(argv, _compile(cc, name, work / "k-a64", [f'-DJUDGE_PATH="{target}"']), work)
    assert_fault(res, code, "detected")
    assert not target.exists()


# ---------------------------------------------------------------- abi tvm


def test_tvm_abi_parallel_kernel(host, work):
    """A TVM-exported two-stage parallel gemm (workspace + TVMBackendParallelLaunch) runs in the child
    on the agent's thread pool."""
    argv, _ = host
    try:
        import tvm
        from tvm import te
    except ImportError:
        require(False, "TVM (the 'tvm' extra) not installed")
    A = te.placeholder((M, K), name="A")
    B = te.placeholder((K, N), name="B")
    k = te.reduce_axis((0, K), name="k")
    C = te.compute((M, N), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), name="C")
    D = te.compute((M, N), lambda i, j: C[i, j] * 2.0 + 1.0, name="D")
    sch = tvm.s_tir.Schedule(te.create_prim_func([A, B, D]))
    for name in ("C", "D"):
        sch.parallel(sch.get_loops(sch.get_sblock(name))[0])
    lib = tvm.compile(tvm.IRModule({"main": sch.mod["main"]}), target="llvm")
    so = native.export_kernel_library(lib, work / "tvm-parallel.so", None)
    res, files, sets = judge(argv, so, work, params={"abi": "tvm", "num_threads": 2})
    assert res["status"] == "ok", res["reason"]
    assert res["backend_info"]["abi"] == "tvm" and res["backend_info"]["threads"] == 2
    for i, s in enumerate(sets):
        np.testing.assert_allclose(load_npy(files[f"out_{i}_0.npy"]), s[0] @ s[1] * 2 + 1, rtol=1e-4, atol=1e-3)
