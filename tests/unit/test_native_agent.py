"""The native agent (device_agents/native): built here, driven through PROTOCOL.md job dirs.

Real parts only: the C compiler builds the agent, TVM compiles and exports the kernels, the
agent runs them natively, under qemu-aarch64 (cross-compiled agent and kernels) and as a static
binary with the kernels linked in; onnxruntime's own libonnxruntime.so runs the ONNX models.
Numbers are checked against numpy in float64 on the host, as the verifier does (docs/design.md §5).
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import re
import shutil
import struct
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from edgetune.build import native
from edgetune.errors import ToolchainError
from tests.conftest import require

HOST_ARCH = platform.machine()
AARCH64_TRIPLE = "aarch64-linux-gnu"
AARCH64_SYSROOT = Path("/usr/aarch64-linux-gnu")
QEMU = shutil.which("qemu-aarch64")

M, N, K = 64, 48, 32


# ---------------------------------------------------------------- fixtures


def _have_tvm() -> bool:
    try:
        import tvm  # noqa: F401
    except ImportError:
        return False
    return True


def _need_cross() -> None:
    require(shutil.which(f"{AARCH64_TRIPLE}-gcc") is not None, f"{AARCH64_TRIPLE}-gcc not installed")
    require((AARCH64_SYSROOT / "lib" / "ld-linux-aarch64.so.1").exists(), "libc6-dev-arm64-cross not installed")
    require(QEMU is not None, "qemu-aarch64 (qemu-user) not installed")


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("agent-cache")


@pytest.fixture(scope="module")
def agent(cache) -> Path:
    require(shutil.which(os.environ.get("CC") or "cc") is not None, "no host C compiler")
    return native.build_agent(None, static=False, out_dir=cache)


@pytest.fixture(scope="module")
def kernels(tmp_path_factory) -> dict[str, dict[str, Path]]:
    """TVM kernels, each exported for the host (.so, .o) and, when the cross compiler exists, aarch64."""
    require(_have_tvm(), "TVM (the 'tvm' extra) not installed")
    import tvm
    from tvm import te
    from tvm.script import tirx as T

    out = tmp_path_factory.mktemp("kernels")
    A = te.placeholder((M, K), name="A")
    B = te.placeholder((K, N), name="B")
    k = te.reduce_axis((0, K), name="k")
    C = te.compute((M, N), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), name="C")
    matmul = te.create_prim_func([A, B, C])

    # two stages, both outer loops parallel: the 12 KiB intermediate C comes from
    # TVMBackendAllocWorkspace and both loops go through TVMBackendParallelLaunch
    D = te.compute((M, N), lambda i, j: C[i, j] * 2.0 + 1.0, name="D")
    sch = tvm.s_tir.Schedule(te.create_prim_func([A, B, D]))
    for name in ("C", "D"):
        sch.parallel(sch.get_loops(sch.get_sblock(name))[0])
    parallel = sch.mod["main"]

    @T.prim_func(s_tir=True)
    def masked(X: T.Buffer((8, 4), "float32"), Y: T.Buffer((8, 4), "float32")):
        # writes row i only where X[i, 0] > 0: an output the agent must have poisoned
        for i, j in T.grid(8, 4):
            with T.sblock("Y"):
                vi, vj = T.axis.remap("SS", [i, j])
                if X[vi, 0] > T.float32(0):
                    Y[vi, vj] = X[vi, vj] * T.float32(2)

    funcs = {"matmul": matmul, "parallel": parallel, "masked": masked}
    targets = {HOST_ARCH: "llvm"}
    if shutil.which(f"{AARCH64_TRIPLE}-gcc"):
        targets["aarch64"] = tvm.target.Target({"kind": "llvm", "mtriple": AARCH64_TRIPLE, "mattr": ["+neon"]})
    built: dict[str, dict[str, Path]] = {}
    for name, func in funcs.items():
        for arch, target in targets.items():
            lib = tvm.compile(tvm.IRModule({"main": func}), target=target)
            so = native.export_kernel_library(lib, out / f"{name}-{arch}.so",
                                              None if arch == HOST_ARCH else AARCH64_TRIPLE)
            obj = native.export_kernel_object(lib, out / f"{name}-{arch}.o")
            built.setdefault(name, {})[arch] = so
            built[name][f"{arch}.o"] = obj
    return built


# ---------------------------------------------------------------- helpers


def _inputs(seed: int, *shapes, dtype="float32") -> list[np.ndarray]:
    """Seeded inputs with negatives and large values, not zeros or ones (docs/design.md §5)."""
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal(s) * rng.choice([1.0, 30.0], size=s)).astype(dtype) for s in shapes]


def make_job(root: Path, name: str, backend: str, artifact: Path, input_sets, outputs, *,
             params=None, input_names=None, sha=None, budget_ms=20.0, warmup_ms=5.0,
             min_iters=3, max_iters=200) -> Path:
    """Lay out W/artifacts, W/inputs, W/jobs/<name> as on a device; paths relative to the job dir."""
    art_sha = hashlib.sha256(artifact.read_bytes()).hexdigest()
    art_dir = root / "artifacts"
    art_dir.mkdir(parents=True, exist_ok=True)
    pushed = art_dir / f"{art_sha}{artifact.suffix}"
    shutil.copyfile(artifact, pushed)
    in_dir = root / "inputs" / name
    in_dir.mkdir(parents=True, exist_ok=True)
    sets = []
    for i, arrays in enumerate(input_sets):
        paths = []
        for kk, a in enumerate(arrays):
            np.save(in_dir / f"in_{i}_{kk}.npy", a)
            paths.append(f"../../inputs/{name}/in_{i}_{kk}.npy")
        sets.append(paths)
    job = root / "jobs" / name
    job.mkdir(parents=True, exist_ok=True)
    request = {
        "protocol": 3, "backend": backend,
        "artifact": f"../../artifacts/{pushed.name}",
        "artifact_sha256": sha or art_sha,
        "params": params or {},
        "input_names": input_names or [f"x{kk}" for kk in range(len(input_sets[0]))],
        "inputs": sets,
        "outputs": outputs,
        "warmup_ms": warmup_ms, "budget_ms": budget_ms,
        "min_iters": min_iters, "max_iters": max_iters, "fresh_seed": 4242, "check_iters": 3, "check_fastest": 1,
        "probe_pairs": 4,
    }
    (job / "request.json").write_text(json.dumps(request))
    return job


def run_agent(agent: Path, job: Path, prefix=(), env=None, timeout=300) -> dict:
    proc = subprocess.run([*prefix, str(agent), "run", str(job)], capture_output=True, text=True,
                          timeout=timeout, env=env)
    assert proc.returncode == 0, proc.stderr
    assert not (job / "result.json.tmp").exists()
    return json.loads((job / "result.json").read_text())


def qemu_prefix() -> list[str]:
    return [QEMU, "-L", str(AARCH64_SYSROOT)]


def rel_err(got: np.ndarray, ref: np.ndarray) -> float:
    return float(np.max(np.abs(got.astype(np.float64) - ref)) / max(np.max(np.abs(ref)), 1e-30))


def check_ok(res: dict, n_sets: int, n_out: int) -> None:
    assert res["status"] == "ok", res["reason"]
    assert res["agent"] == "native" and res["protocol"] == 3 and res["clock"] == "CLOCK_MONOTONIC"
    assert res["outputs"] == [[f"out_{i}_{k}.npy" for k in range(n_out)] for i in range(n_sets)]
    assert res["repeat_outputs"] == [f"rep_{k}.npy" for k in range(n_out)]
    assert res["warmup_iters"] >= 1
    assert res["load_ms"] > 0
    assert all(isinstance(s, int) and s > 0 for s in res["samples_ns"])
    sets = [res["input_sha256_before"][i * len(res["input_sha256_after_sets"][0]):][:len(res["input_sha256_after_sets"][0])]
            for i in range(n_sets)]
    assert res["input_sha256_after_sets"] == sets  # the work buffers hold exactly what each set was
    checks = res["timed_checks"]
    assert 1 <= len(checks) <= 4 and len({c["iter"] for c in checks}) == len(checks)
    first = res["first_timed_iter"]
    assert all(first <= c["iter"] < first + len(res["samples_ns"]) for c in checks)
    assert len(res["probe"]["repeat_ns"]) == len(res["probe"]["distinct_ns"]) <= 4  # as many as fit the budget


def sha_arrays(input_sets) -> list[str]:
    return [hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest() for s in input_sets for a in s]


def elf_is_static(path: Path) -> bool:
    """No PT_INTERP program header: the kernel runs it without a dynamic loader."""
    data = path.read_bytes()
    assert data[:4] == b"\x7fELF" and data[4] == 2  # ELF64
    phoff, = struct.unpack_from("<Q", data, 0x20)
    phentsize, phnum = struct.unpack_from("<HH", data, 0x36)
    return all(struct.unpack_from("<I", data, phoff + i * phentsize)[0] != 3 for i in range(phnum))


def matmul_ref(a, b):
    return a.astype(np.float64) @ b.astype(np.float64)


# ---------------------------------------------------------------- build, info, ABI


def test_abi_header_matches_tvm_headers(tmp_path):
    """tvm_abi.h reproduces the layout of TVM's own structs and hook signatures."""
    require(_have_tvm(), "TVM (the 'tvm' extra) not installed")
    cc = shutil.which("cc")
    require(cc is not None, "no host C compiler")
    import tvm
    import tvm_ffi

    tvm_inc = Path(tvm.__file__).parent / "include"
    ffi_inc = Path(tvm_ffi.__file__).parent / "include"
    assert (ffi_inc / "tvm" / "ffi" / "c_api.h").exists() and (tvm_inc / "tvm" / "runtime" / "c_backend_api.h").exists()
    outs = []
    for real in (False, True):
        exe = tmp_path / f"abi{int(real)}"
        flags = ["-DET_REAL_HEADERS", f"-I{ffi_inc}", f"-I{tvm_inc}"] if real else [f"-I{native.AGENT_SRC}"]
        subprocess.run([cc, "-std=c11", "-Wall", "-Werror", *flags, str(native.AGENT_SRC / "abi_check.c"),
                        "-o", str(exe), "-Wl,--unresolved-symbols=ignore-all"], check=True)
        outs.append(subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout)
    assert "DLTensor.byte_offset" in outs[0]
    assert outs[0] == outs[1]


POOL_TEST_SOURCES = ("pool_test.c", "tvm_backend.c", "json.c", "kernels_none.c")


def _build_pool_test(cc: str, out: Path, static: bool = False) -> Path:
    src = [str(native.AGENT_SRC / f) for f in POOL_TEST_SOURCES]
    subprocess.run([cc, *native.CFLAGS, *src, "-o", str(out), *(["-static"] if static else []), "-ldl", "-lpthread"],
                   check=True, capture_output=True)
    return out


@pytest.mark.parametrize("threads", [1, 2, 3, 8])
def test_thread_pool_barrier_and_workspace(tmp_path, threads):
    """pool_test.c drives TVMBackendParallelLaunch/Barrier/AllocWorkspace directly: lockstep rounds
    through the barrier, short and nested launches, a failing task. More threads than cores too."""
    cc = shutil.which(os.environ.get("CC") or "cc")
    require(cc is not None, "no host C compiler")
    exe = _build_pool_test(cc, tmp_path / "pool_test")
    # The limit is only there to catch a deadlock, so it comes from this binary on this machine as it
    # is: one launch (plus the fixed checks, at least two launches' work) is timed, and the full run
    # may take ten times its share of that. Spinning barrier threads oversubscribed on a loaded
    # 2-core machine are slow but honest; a fixed limit failed them.
    start = time.monotonic()
    calib = subprocess.run([str(exe), str(threads), "1"], capture_output=True, text=True, timeout=300)
    one = time.monotonic() - start
    assert calib.returncode == 0 and calib.stdout.strip() == f"OK {threads} threads", calib.stdout
    # oversubscribed (more threads than cores), every barrier crossing waits for the scheduler to
    # run each spinning thread: fewer launches there (still 2,400 crossings of all threads)
    launches = 20 if threads <= (os.cpu_count() or 1) else 6
    limit = max(60.0, 10 * one * (launches + 2) / 2)
    proc = subprocess.run([str(exe), str(threads), str(launches)], capture_output=True, text=True, timeout=limit)
    assert proc.returncode == 0 and proc.stdout.strip() == f"OK {threads} threads", proc.stdout


def test_thread_pool_under_qemu_aarch64(tmp_path):
    _need_cross()
    exe = _build_pool_test(f"{AARCH64_TRIPLE}-gcc", tmp_path / "pool_test", static=True)
    proc = subprocess.run([QEMU, str(exe), "4"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip() == "OK 4 threads", proc.stdout


def test_build_is_cached_and_versioned(agent, cache):
    again = native.build_agent(None, static=False, out_dir=cache)
    assert again == agent
    out = subprocess.run([str(agent), "version"], capture_output=True, text=True, check=True).stdout.strip()
    assert out == native.agent_version()


def test_missing_compiler_is_one_clear_error(tmp_path):
    with pytest.raises(ToolchainError) as err:
        native.build_agent("riscv64-linux-gnu", cc="no-such-compiler-edgetune", out_dir=tmp_path)
    msg = str(err.value)
    assert "no-such-compiler-edgetune" in msg and "\n" not in msg


def test_info(agent):
    proc = subprocess.run([str(agent), "info"], capture_output=True, text=True, check=True,
                          env={k: v for k, v in os.environ.items() if k != "EDGETUNE_ORT_LIB"})
    info = json.loads(proc.stdout)
    assert info["protocol"] == 3 and info["agent"] == "native" and info["python"] is None
    assert info["agent_version"] == native.agent_version()
    assert info["arch"] == HOST_ARCH
    assert info["runtimes"]["tvm-kernel"] == "1"
    fp = info["fingerprint"]
    assert set(fp) >= {"cpu_model", "soc", "cores", "max_freq_khz", "kernel", "os", "governor"}
    assert fp["cores"] == os.cpu_count()
    assert fp["kernel"] == platform.release()
    assert isinstance(fp["cpu_model"], str) and fp["cpu_model"]
    assert isinstance(fp["max_freq_khz"], list) and all(isinstance(f, int) for f in fp["max_freq_khz"])
    if Path("/etc/os-release").exists():
        pretty = [ln.split("=", 1)[1].strip().strip('"') for ln in Path("/etc/os-release").read_text().splitlines()
                  if ln.startswith("PRETTY_NAME=")]
        assert fp["os"] == pretty[0]


# ---------------------------------------------------------------- tvm-kernel


def test_tvm_matmul(agent, kernels, tmp_path):
    sets = [_inputs(1, (M, K), (K, N)), _inputs(2, (M, K), (K, N))]
    job = make_job(tmp_path, "mm", "tvm-kernel", kernels["matmul"][HOST_ARCH], sets,
                   [{"name": "C", "dtype": "float32", "shape": [M, N]}],
                   min_iters=5, max_iters=50)
    res = run_agent(agent, job)
    check_ok(res, 2, 1)
    assert 5 <= len(res["samples_ns"]) <= 50
    assert res["input_sha256_before"] == sha_arrays(sets)
    for i, (a, b) in enumerate(sets):
        out = np.load(job / f"out_{i}_0.npy")
        assert out.dtype == np.float32 and out.shape == (M, N)
        assert rel_err(out, matmul_ref(a, b)) < 1e-4
    rep = np.load(job / "rep_0.npy")
    assert np.array_equal(rep, np.load(job / "out_0_0.npy"))  # set 0 ran twice (since protocol 2), same result
    assert not np.array_equal(np.load(job / "out_1_0.npy"), rep)  # a different input gives a different output
    assert res["runtime_versions"] == {"tvm-kernel": "1"} and res["backend_info"]["linked"] is False


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_tvm_parallel_kernel_uses_the_agents_thread_pool(agent, kernels, tmp_path, threads):
    so = kernels["parallel"][HOST_ARCH]
    blob = so.read_bytes()
    # the kernel really depends on the hooks under test
    assert b"__TVMBackendParallelLaunch" in blob and b"__TVMBackendAllocWorkspace" in blob
    sets = [_inputs(3, (M, K), (K, N))]
    job = make_job(tmp_path, "par", "tvm-kernel", so, sets,
                   [{"name": "D", "dtype": "float32", "shape": [M, N]}], params={"num_threads": threads})
    res = run_agent(agent, job)
    check_ok(res, 1, 1)
    assert res["backend_info"]["threads"] == threads
    out = np.load(job / "out_0_0.npy")
    assert rel_err(out, matmul_ref(*sets[0]) * 2 + 1) < 1e-4


def test_tvm_num_threads_from_environment(agent, kernels, tmp_path):
    sets = [_inputs(4, (M, K), (K, N))]
    job = make_job(tmp_path, "env", "tvm-kernel", kernels["parallel"][HOST_ARCH], sets,
                   [{"name": "D", "dtype": "float32", "shape": [M, N]}])
    res = run_agent(agent, job, env={**os.environ, "TVM_NUM_THREADS": "2"})
    check_ok(res, 1, 1)
    assert res["backend_info"]["threads"] == 2


def test_outputs_are_poisoned_before_every_run(agent, kernels, tmp_path):
    """Set 0 writes every row; set 1 skips rows with X[i,0] <= 0, which must come back NaN, not
    the values the previous run left in the buffer."""
    x0 = np.abs(_inputs(5, (8, 4))[0]) + 0.5
    x1 = x0.copy()
    skipped = [1, 4, 6]
    x1[skipped, 0] *= -1
    job = make_job(tmp_path, "poison", "tvm-kernel", kernels["masked"][HOST_ARCH], [[x0], [x1]],
                   [{"name": "Y", "dtype": "float32", "shape": [8, 4]}])
    res = run_agent(agent, job)
    check_ok(res, 2, 1)
    out0 = np.load(job / "out_0_0.npy")
    assert np.array_equal(out0, x0 * 2)
    out = np.load(job / "out_1_0.npy")
    assert np.isnan(out[skipped]).all()
    kept = [i for i in range(8) if i not in skipped]
    assert np.array_equal(out[kept], x1[kept] * 2)
    assert np.array_equal(np.load(job / "rep_0.npy"), out0)  # poisoned again: set 0 rewrites every row


def test_artifact_sha256_mismatch_is_refused(agent, kernels, tmp_path):
    sets = [_inputs(6, (M, K), (K, N))]
    job = make_job(tmp_path, "badsha", "tvm-kernel", kernels["matmul"][HOST_ARCH], sets,
                   [{"name": "C", "dtype": "float32", "shape": [M, N]}], sha="0" * 64)
    res = run_agent(agent, job)
    assert res["status"] == "error" and res["reason"] == "artifact sha256 mismatch"
    assert res["samples_ns"] == [] and res["outputs"] == [] and res["input_sha256_before"] == []
    assert not list(job.glob("out_*.npy"))


def test_kernel_error_is_reported_and_input_hashes_match_hashlib(agent, kernels, tmp_path):
    """Inputs the kernel does not take: it raises through TVMFFIErrorSetRaisedFromCStrParts and the
    agent reports it cleanly. The input hashes (sizes around SHA-256's 64-byte block and padding
    boundaries) still come back and must equal hashlib's."""
    sizes = [0, 1, 55, 56, 57, 63, 64, 65, 119, 120, 1000, 4099]
    rng = np.random.default_rng(7)
    sets = [[rng.integers(0, 256, size=n, dtype=np.uint8) for n in sizes] for _ in range(2)]
    job = make_job(tmp_path, "kerr", "tvm-kernel", kernels["matmul"][HOST_ARCH], sets,
                   [{"name": "C", "dtype": "float32", "shape": [M, N]}])
    res = run_agent(agent, job)
    assert res["status"] == "error"
    assert res["reason"].startswith("run failed: input set 0: ")
    assert "Expected 3 arguments" in res["reason"], res["reason"]  # the kernel's own error, passed on
    assert res["input_sha256_before"] == sha_arrays(sets)


@pytest.mark.parametrize("case", ["backend", "json", "count", "entry"])
def test_bad_requests_fail_cleanly(agent, kernels, tmp_path, case):
    sets = [_inputs(8, (M, K), (K, N))]
    job = make_job(tmp_path, case, "tvm-kernel", kernels["matmul"][HOST_ARCH], sets,
                   [{"name": "C", "dtype": "float32", "shape": [M, N]}])
    req = json.loads((job / "request.json").read_text())
    if case == "backend":
        req["backend"] = "tflite"
        (job / "request.json").write_text(json.dumps(req))
    elif case == "json":
        (job / "request.json").write_text(json.dumps(req)[:-5])
    elif case == "count":
        req["input_names"] = ["only-one"]
        (job / "request.json").write_text(json.dumps(req))
    else:
        req["params"] = {"entry": "__tvm_ffi_nope"}
        (job / "request.json").write_text(json.dumps(req))
    res = run_agent(agent, job)
    assert res["status"] == "error" and res["reason"]
    expected = {"backend": "not supported", "json": "bad request.json", "count": "input_names",
                "entry": "__tvm_ffi_nope"}[case]
    assert expected in res["reason"]


def test_missing_job_dir_exits_nonzero(agent, tmp_path):
    proc = subprocess.run([str(agent), "run", str(tmp_path / "nope")], capture_output=True, text=True)
    assert proc.returncode == 2 and "does not exist" in proc.stderr


# ---------------------------------------------------------------- static agent, linked kernels


def test_static_agent_with_linked_kernel(cache, kernels, tmp_path):
    obj = kernels["parallel"][f"{HOST_ARCH}.o"]
    agent = native.build_agent(None, static=True, out_dir=cache, kernels=[obj])
    assert elf_is_static(agent)
    sets = [_inputs(9, (M, K), (K, N))]
    job = make_job(tmp_path, "static", "tvm-kernel", obj, sets,
                   [{"name": "D", "dtype": "float32", "shape": [M, N]}], params={"num_threads": 2})
    res = run_agent(agent, job)
    check_ok(res, 1, 1)
    assert res["backend_info"]["linked"] is True
    assert rel_err(np.load(job / "out_0_0.npy"), matmul_ref(*sets[0]) * 2 + 1) < 1e-4


def test_static_agent_refuses_a_kernel_it_does_not_link(cache, kernels, tmp_path):
    agent = native.build_agent(None, static=True, out_dir=cache, kernels=[kernels["parallel"][f"{HOST_ARCH}.o"]])
    job = make_job(tmp_path, "unlinked", "tvm-kernel", kernels["matmul"][HOST_ARCH], [_inputs(19, (M, K), (K, N))],
                   [{"name": "C", "dtype": "float32", "shape": [M, N]}])
    res = run_agent(agent, job)
    assert res["status"] == "error" and res["reason"].startswith("load failed")
    assert "linked" in res["reason"]


# ---------------------------------------------------------------- aarch64 under qemu


def test_qemu_aarch64_dynamic_agent_and_kernel(cache, kernels, tmp_path):
    _need_cross()
    agent = native.build_agent(AARCH64_TRIPLE, static=False, out_dir=cache)
    info = json.loads(subprocess.run([*qemu_prefix(), str(agent), "info"], capture_output=True, text=True,
                                     check=True, timeout=120).stdout)
    assert info["arch"] == "aarch64"
    sets = [_inputs(10, (M, K), (K, N))]
    job = make_job(tmp_path, "qemu", "tvm-kernel", kernels["parallel"]["aarch64"], sets,
                   [{"name": "D", "dtype": "float32", "shape": [M, N]}], params={"num_threads": 2},
                   budget_ms=5.0, warmup_ms=1.0, min_iters=2)
    res = run_agent(agent, job, prefix=qemu_prefix())
    check_ok(res, 1, 1)
    assert rel_err(np.load(job / "out_0_0.npy"), matmul_ref(*sets[0]) * 2 + 1) < 1e-4


def test_qemu_aarch64_static_agent_with_two_linked_kernels(cache, kernels, tmp_path):
    """Two kernels linked into one static aarch64 agent (entries renamed with objcopy); each request
    picks its kernel by the artifact's sha256. Runs under qemu with no sysroot: nothing to load."""
    _need_cross()
    objs = [kernels["matmul"]["aarch64.o"], kernels["parallel"]["aarch64.o"]]
    agent = native.build_agent(AARCH64_TRIPLE, static=True, out_dir=cache, kernels=objs)
    assert elf_is_static(agent)
    sets = [_inputs(11, (M, K), (K, N))]
    ref = matmul_ref(*sets[0])
    for name, obj, expect in (("lk0", objs[0], ref), ("lk1", objs[1], ref * 2 + 1)):
        job = make_job(tmp_path, name, "tvm-kernel", obj, sets,
                       [{"name": "out", "dtype": "float32", "shape": [M, N]}], params={"num_threads": 2},
                       budget_ms=5.0, warmup_ms=1.0, min_iters=2)
        res = run_agent(agent, job, prefix=[QEMU])
        check_ok(res, 1, 1)
        assert res["backend_info"]["linked"] is True
        assert rel_err(np.load(job / "out_0_0.npy"), expect) < 1e-4


# ---------------------------------------------------------------- ort


@pytest.fixture(scope="module")
def ort_lib() -> Path:
    try:
        import onnxruntime
    except ImportError:
        require(False, "onnxruntime not installed")
    capi = Path(onnxruntime.__file__).parent / "capi"
    libs = sorted(capi.glob("libonnxruntime.so*"))
    require(bool(libs), f"no libonnxruntime.so in {capi}")
    return libs[0]


def _onnx_model(path: Path, build) -> Path:
    import onnx

    model = build(onnx.helper, onnx.TensorProto)
    onnx.checker.check_model(model)
    path.write_bytes(model.SerializeToString())
    return path


def _mlp(helper, tp):
    rng = np.random.default_rng(12)
    w = rng.standard_normal((K, N)).astype(np.float32)
    b = rng.standard_normal(N).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Add", ["h", "b"], ["z"]),
             helper.make_node("Relu", ["z"], ["y"]), helper.make_node("Mul", ["x", "x"], ["sq"])]
    graph = helper.make_graph(
        nodes, "mlp",
        [helper.make_tensor_value_info("x", tp.FLOAT, [M, K])],
        [helper.make_tensor_value_info("y", tp.FLOAT, [M, N]), helper.make_tensor_value_info("sq", tp.FLOAT, [M, K])],
        [helper.make_tensor("w", tp.FLOAT, [K, N], w.ravel()), helper.make_tensor("b", tp.FLOAT, [N], b.ravel())])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


MLP_OUT = [{"name": "y", "dtype": "float32", "shape": [M, N]}, {"name": "sq", "dtype": "float32", "shape": [M, K]}]


def test_info_reports_onnxruntime_version(agent, ort_lib):
    import onnxruntime

    proc = subprocess.run([str(agent), "info"], capture_output=True, text=True, check=True,
                          env={**os.environ, "EDGETUNE_ORT_LIB": str(ort_lib)})
    assert json.loads(proc.stdout)["runtimes"]["onnxruntime"] == onnxruntime.__version__


@pytest.mark.parametrize("params", [
    {"intra_op_num_threads": 1, "graph_optimization_level": 99, "execution_mode": "sequential"},
    {"intra_op_num_threads": 2, "inter_op_num_threads": 2, "graph_optimization_level": 0,
     "execution_mode": "parallel"},
])
def test_ort_model(agent, ort_lib, tmp_path, params):
    import onnxruntime

    model = _onnx_model(tmp_path / "mlp.onnx", _mlp)
    sets = [_inputs(13, (M, K)), _inputs(14, (M, K))]
    job = make_job(tmp_path, "ort", "ort", model, sets, MLP_OUT,
                   params={**params, "ort_lib": str(ort_lib)}, input_names=["x"])
    res = run_agent(agent, job)
    check_ok(res, 2, 2)
    assert res["runtime_versions"]["onnxruntime"] == onnxruntime.__version__
    helper_model = __import__("onnx").load(str(model))
    w = __import__("onnx").numpy_helper.to_array(helper_model.graph.initializer[0]).astype(np.float64)
    b = __import__("onnx").numpy_helper.to_array(helper_model.graph.initializer[1]).astype(np.float64)
    for i, (x,) in enumerate(sets):
        y = np.load(job / f"out_{i}_0.npy")
        sq = np.load(job / f"out_{i}_1.npy")
        assert rel_err(y, np.maximum(x.astype(np.float64) @ w + b, 0)) < 1e-4
        assert rel_err(sq, x.astype(np.float64) ** 2) < 1e-6
    assert np.array_equal(np.load(job / "rep_0.npy"), np.load(job / "out_0_0.npy"))


def test_ort_session_options_reach_onnxruntime(agent, ort_lib, tmp_path):
    """Each option lands in the right OrtApi slot: onnxruntime's own verbose log of the session
    options (TraceSessionOptions) shows the values the request asked for."""
    model = _onnx_model(tmp_path / "mlp.onnx", _mlp)
    params = {"ort_lib": str(ort_lib), "intra_op_num_threads": 3, "inter_op_num_threads": 2,
              "execution_mode": "parallel", "graph_optimization_level": 1, "log_severity_level": 0}
    job = make_job(tmp_path, "ortlog", "ort", model, [_inputs(21, (M, K))], MLP_OUT, params=params,
                   input_names=["x"], budget_ms=1.0, warmup_ms=0.0, min_iters=1, max_iters=2)
    proc = subprocess.run([str(agent), "run", str(job)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0
    check_ok(json.loads((job / "result.json").read_text()), 1, 2)
    line = next((ln for ln in proc.stderr.splitlines() if "Session Options" in ln), None)
    assert line is not None, proc.stderr[-2000:]
    assert "execution_mode:1 " in line and "graph_optimization_level:1 " in line
    assert "session_log_severity_level:0 " in line
    intra, inter = re.findall(r"thread_pool_size: (-?\d+)", line)[:2]
    assert (intra, inter) == ("3", "2")


def test_ort_library_from_environment(agent, ort_lib, tmp_path):
    model = _onnx_model(tmp_path / "mlp.onnx", _mlp)
    job = make_job(tmp_path, "ortenv", "ort", model, [_inputs(15, (M, K))], MLP_OUT, input_names=["x"])
    res = run_agent(agent, job, env={**os.environ, "EDGETUNE_ORT_LIB": str(ort_lib)})
    check_ok(res, 1, 2)


def test_ort_library_next_to_the_agent(agent, ort_lib, tmp_path):
    """W/agent/ holds the agent and the device's libonnxruntime.so: found with no parameter."""
    import onnxruntime

    home = tmp_path / "agent"
    home.mkdir()
    shutil.copy2(agent, home / "edgetune-agent")
    (home / ort_lib.name).symlink_to(ort_lib)
    env = {k: v for k, v in os.environ.items() if k != "EDGETUNE_ORT_LIB"}
    info = json.loads(subprocess.run([str(home / "edgetune-agent"), "info"], capture_output=True, text=True,
                                     check=True, env=env).stdout)
    assert info["runtimes"]["onnxruntime"] == onnxruntime.__version__
    model = _onnx_model(tmp_path / "mlp.onnx", _mlp)
    job = make_job(tmp_path, "ortnext", "ort", model, [_inputs(20, (M, K))], MLP_OUT, input_names=["x"])
    check_ok(run_agent(home / "edgetune-agent", job, env=env), 1, 2)


def test_ort_all_dtypes_round_trip(agent, ort_lib, tmp_path):
    """Identity over every protocol dtype: the agent's .npy reader and writer are exact."""
    dtypes = ["float32", "float64", "float16", "int8", "uint8", "int32", "int64", "bool"]
    onnx_types = {"float32": 1, "uint8": 2, "int8": 3, "int32": 6, "int64": 7, "bool": 9, "float16": 10,
                  "float64": 11}
    shapes = [(3, 5), (7,), (2, 3, 4), (1,), (5, 1), (), (4, 4), (9,)]

    def build(helper, tp):
        nodes = [helper.make_node("Identity", [f"i{k}"], [f"o{k}"]) for k in range(len(dtypes))]
        ins = [helper.make_tensor_value_info(f"i{k}", onnx_types[d], list(s)) for k, (d, s) in enumerate(zip(dtypes, shapes))]
        outs = [helper.make_tensor_value_info(f"o{k}", onnx_types[d], list(s)) for k, (d, s) in enumerate(zip(dtypes, shapes))]
        return helper.make_model(helper.make_graph(nodes, "id", ins, outs), opset_imports=[helper.make_opsetid("", 17)],
                                 ir_version=8)

    rng = np.random.default_rng(16)
    arrays = []
    for d, s in zip(dtypes, shapes):
        if d == "bool":
            arrays.append(rng.integers(0, 2, size=s).astype(bool))
        elif d.startswith("float"):
            arrays.append((rng.standard_normal(s) * 100).astype(d))
        else:
            info = np.iinfo(d)
            arrays.append(rng.integers(info.min, info.max, size=s, dtype=d, endpoint=True))
    model = _onnx_model(tmp_path / "id.onnx", build)
    job = make_job(tmp_path, "dtypes", "ort", model, [arrays],
                   [{"name": f"o{k}", "dtype": d, "shape": list(s)} for k, (d, s) in enumerate(zip(dtypes, shapes))],
                   params={"ort_lib": str(ort_lib)}, input_names=[f"i{k}" for k in range(len(dtypes))])
    res = run_agent(agent, job)
    check_ok(res, 1, len(dtypes))
    for k, a in enumerate(arrays):
        path = job / f"out_0_{k}.npy"
        with open(path, "rb") as f:
            assert np.lib.format.read_magic(f) == (1, 0)
        got = np.load(path)
        assert got.dtype == a.dtype and got.shape == a.shape and np.array_equal(got, a)


def test_ort_output_shape_mismatch_is_an_error(agent, ort_lib, tmp_path):
    model = _onnx_model(tmp_path / "mlp.onnx", _mlp)
    bad = [{"name": "y", "dtype": "float32", "shape": [M, N + 1]}]
    job = make_job(tmp_path, "ortbad", "ort", model, [_inputs(17, (M, K))], bad,
                   params={"ort_lib": str(ort_lib)}, input_names=["x"])
    res = run_agent(agent, job)
    assert res["status"] == "error" and res["reason"].startswith("run failed")


def test_ort_bad_option_is_an_error(agent, ort_lib, tmp_path):
    model = _onnx_model(tmp_path / "mlp.onnx", _mlp)
    job = make_job(tmp_path, "ortopt", "ort", model, [_inputs(18, (M, K))], MLP_OUT,
                   params={"ort_lib": str(ort_lib), "graph_optimization_level": 3}, input_names=["x"])
    res = run_agent(agent, job)
    assert res["status"] == "error" and "graph_optimization_level" in res["reason"]


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q"]))


# ---------------------------------------------------------------- ort + TVM kernels (hybrid)


def _hybrid_job(tmp_path: Path, triple: str | None, ort_path: Path) -> tuple[Path, list, np.ndarray]:
    """The depthwise fixture with its depthwise convs spliced as TVM kernels compiled for
    ``triple`` (None: this host), laid out as on a device: the model and its companion files (the
    custom-op library, the kernels) side by side in the artifacts dir."""
    import onnxruntime as ort
    import tvm

    from edgetune.space.ort_tvm import depthwise_sites, splice
    from tests.fixtures.depthwise import build_depthwise

    model = build_depthwise(tmp_path / "dw.onnx")
    shape = (1, 8, 10, 10)
    sites = depthwise_sites(model, {"x": shape})
    art = tmp_path / "hybrid"
    art.mkdir()
    lib = native.build_ortop(triple, tmp_path / "ortop")
    shutil.copyfile(lib, art / lib.name)
    target = ({"kind": "llvm", "mtriple": AARCH64_TRIPLE, "mattr": ["+neon"], "num-cores": 2} if triple
              else {"kind": "llvm", "num-cores": 2})
    files = {}
    for i, s in enumerate(sites):
        if s.workload.key() not in files:
            built = tvm.compile(s.workload.prim_func(), target=tvm.target.Target(target))
            native.export_kernel_library(built, art / f"k-{i}.so", triple)
            files[s.workload.key()] = f"k-{i}.so"
    splice(model, sites, files, lib.name, art / "model.onnx")
    sets = [_inputs(31, shape), _inputs(32, shape)]
    job = make_job(tmp_path, "hybrid", "ort", art / "model.onnx", sets,
                   [{"name": "y", "dtype": "float32", "shape": [1, 16, 1, 1]}],
                   params={"ort_lib": str(ort_path), "custom_ops_library": lib.name, "intra_op_num_threads": 2},
                   input_names=["x"])
    for f in art.iterdir():  # the host pushes the companions next to the model
        if f.name != "model.onnx":
            shutil.copyfile(f, tmp_path / "artifacts" / f.name)
    sess = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    refs = [sess.run(None, {"x": s[0]})[0] for s in sets]
    return job, sets, np.stack(refs)


def test_ort_runs_a_hybrid_model_with_its_custom_op_library(agent, ort_lib, tmp_path):
    job, sets, refs = _hybrid_job(tmp_path, None, ort_lib)
    res = run_agent(agent, job)
    check_ok(res, 2, 1)
    for i in range(len(sets)):
        assert rel_err(np.load(job / f"out_{i}_0.npy"), refs[i].astype(np.float64)) < 1e-5


def test_ort_refuses_a_custom_op_library_outside_the_model_dir(agent, ort_lib, tmp_path):
    job, _, _ = _hybrid_job(tmp_path, None, ort_lib)
    req = json.loads((job / "request.json").read_text())
    req["params"]["custom_ops_library"] = "../evil.so"
    (job / "request.json").write_text(json.dumps(req))
    res = run_agent(agent, job)
    assert res["status"] != "ok" and "file name next to the model" in res["reason"]


def test_qemu_aarch64_hybrid_model_cross_built(cache, tmp_path):
    """The custom-op library and the kernels cross-built for aarch64, run by the aarch64 native agent
    with the aarch64 libonnxruntime under qemu: no TVM runtime anywhere on the 'device'."""
    _need_cross()
    ort_a64 = Path(sys.prefix) / "share" / "edgetune" / "ort-aarch64-1.20.1" / "libonnxruntime.so"
    require(ort_a64.is_file(), f"{ort_a64} missing (make setup downloads it)")
    agent = native.build_agent(AARCH64_TRIPLE, static=False, out_dir=cache)
    job, sets, refs = _hybrid_job(tmp_path, AARCH64_TRIPLE, ort_a64)
    res = run_agent(agent, job, prefix=qemu_prefix(), timeout=600)
    check_ok(res, 2, 1)
    for i in range(len(sets)):
        assert rel_err(np.load(job / f"out_{i}_0.npy"), refs[i].astype(np.float64)) < 1e-5
