"""The judge backend's CUDA mode (``params.device: "cuda"``) on a machine without a GPU: the native
agent's whole CUDA path (the kernel child opening the GPU through the driver API before its sandbox,
a guarded device copy of every buffer, PRE / RUN / POST round trips per run, the sample timed in the
agent, the named failures) against a stand-in driver in host memory
(tests/fixtures/cuda_standin/libcuda_standin.c, which says what it is and is not).

What this cannot show: anything about a real GPU (its faults, its speed, nvcc-built kernels). Those
run through the same path on a GPU device (tools/gpu/issue14_on_device.sh).
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
from tests.unit.test_native_judge import M, N, PRELUDE, _sets, assert_fault, load_npy, parse_bundle

STANDIN = Path(__file__).resolve().parents[1] / "fixtures" / "cuda_standin" / "libcuda_standin.c"


def cuda_kernel(body: str, extra: str = "") -> str:
    """A kernel of the CUDA ABI: its tensors must be kDLCUDA (2) on device 0 (here host memory)."""
    return PRELUDE + extra + (
        "\nint edgetune_kernel(const DLTensor* in, int32_t nin, DLTensor* out, int32_t nout) {\n"
        "  if (in[0].device.device_type != 2 || in[1].device.device_type != 2 || out[0].device.device_type != 2)"
        " return 9;\n  (void)nin; (void)nout;\n" + body + "\n}\n")


KERNELS = {
    "honest": cuda_kernel("gemm(in, out); return 0;"),
    "sleepy": cuda_kernel("gemm(in, out); struct timespec ts = {0, 2000000}; nanosleep(&ts, NULL); return 0;"),
    # right for the agent's untimed calls (2 input sets, the repeat), then never again: every warm-up
    # and timed call returns without writing (a count of calls, not of time: no race with the clock)
    "stale": cuda_kernel("static int calls; if (calls++ < 3) gemm(in, out); return 0;"),
    "oob_write": cuda_kernel(f"gemm(in, out); ((float*)out[0].data)[{M * N} + 5] = 1.0f; return 0;"),
    "mutate": cuda_kernel("gemm(in, out); ((float*)in[0].data)[3] = 1.0f; return 0;"),
    "illegal": cuda_kernel("gemm(in, out); static int calls; if (++calls == 3) { uint32_t bad = 0x0BADADD5u;"
                           " memcpy(out[0].data, &bad, 4); } return 0;"),
    "exec": cuda_kernel('char* argv[] = {"/bin/sh", "-c", "true", NULL}; execve("/bin/sh", argv, NULL);'
                        " gemm(in, out); return 0;"),
    "cpu_abi": PRELUDE + "int edgetune_kernel(const DLTensor* in, int32_t nin, DLTensor* out, int32_t nout) {"
                         " (void)nin; (void)nout; gemm(in, out); return 0; }\n",
}


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    require(shutil.which(os.environ.get("CC") or "cc") is not None, "no host C compiler")
    work = tmp_path_factory.mktemp("judge-cuda")
    agent = native.build_agent(None, static=False, out_dir=work / "agent")
    driver = work / "libcuda_standin.so"
    subprocess.run([shutil.which("gcc") or "cc", "-O2", "-shared", "-fPIC", "-pthread", str(STANDIN), "-o",
                    str(driver)], check=True, capture_output=True)
    return work, agent, driver


def _compile(work: Path, name: str) -> Path:
    src = work / "k" / f"{name}.c"
    src.parent.mkdir(exist_ok=True)
    src.write_text(KERNELS[name])
    so = src.with_suffix(".so")
    subprocess.run([shutil.which("gcc") or "cc", "-O2", "-shared", "-fPIC", "-pthread", str(src), "-o", str(so)],
                   check=True, capture_output=True)
    return so


def run(env, name: str, *, params=None, extra_env=None, budget_ms=10.0):
    work, agent, driver = env
    so = _compile(work, name)
    sets = _sets()
    ind = work / "inputs" / uuid.uuid4().hex[:8]
    ind.mkdir(parents=True)
    rows = []
    for i, s in enumerate(sets):
        rows.append([])
        for k, a in enumerate(s):
            np.save(ind / f"in_{i}_{k}.npy", a)
            rows[-1].append(str(ind / f"in_{i}_{k}.npy"))
    req = {"protocol": 3, "backend": "judge", "artifact": str(so),
           "artifact_sha256": hashlib.sha256(so.read_bytes()).hexdigest(),
           "params": {"abi": "edgetune", "device": "cuda", "cuda_driver": str(driver), **(params or {})},
           "input_names": ["A", "B"], "inputs": rows, "outputs": [{"name": "C", "dtype": "float32", "shape": [M, N]}],
           "warmup_ms": 2.0, "budget_ms": budget_ms, "min_iters": 5, "max_iters": 400, "fresh_seed": 11,
           "check_iters": 3, "check_fastest": 1, "probe_pairs": 4,
           "limits": {"timeout_s": 30, "memory_mb": 512, "max_procs": 32}}
    jobdir = work / "jobs" / uuid.uuid4().hex[:12]
    jobdir.parent.mkdir(exist_ok=True)
    proc = subprocess.run([str(agent), "run-stdio", str(jobdir)], input=json.dumps(req).encode(), capture_output=True,
                          timeout=120, env={**os.environ, **(extra_env or {})})
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")[-2000:]
    files = parse_bundle(proc.stdout)
    return json.loads(files["result.json"]), files, sets


def test_honest_kernel_gets_device_tensors_and_correct_outputs(env):
    res, files, sets = run(env, "honest")
    assert res["status"] == "ok", res["reason"]
    info = res["backend_info"]
    assert info["device"] == "cuda" and info["sandbox"] == "seccomp", info
    assert info["timing"] == "host: call + cuCtxSynchronize" and info["cuda_event_mean_ns"] > 0, info
    for i, s in enumerate(sets):  # the outputs came back from "device" memory into the agent's buffers
        np.testing.assert_allclose(load_npy(files[f"out_{i}_0.npy"]), s[0] @ s[1], rtol=1e-4, atol=1e-4)
    assert len(res["samples_ns"]) >= 5 and res["fault"] is None


def test_cpu_mode_kernel_sees_cpu_tensors(env):
    """The same ABI without params.device: kDLCPU tensors (a CUDA-ABI kernel refuses them)."""
    res, _, _ = run(env, "honest", params={"device": "cpu"})
    assert_fault(res, "kernel-error", "returned 9")


def test_samples_are_the_call_alone(env):
    """The untimed steps around a call (upload, poison, the L2 overwrite: made 40 ms slow in the stand-in)
    are not in the samples; the kernel's 2 ms sleep is."""
    res, _, _ = run(env, "sleepy", extra_env={"STANDIN_FLUSH_SLEEP_MS": "40"}, budget_ms=30)
    assert res["status"] == "ok", res["reason"]
    med = float(np.median(res["samples_ns"]))
    assert 2e6 <= med < 40e6, med


def test_outputs_are_poisoned_on_the_device_before_each_call(env):
    """A kernel that stops computing leaves nothing of an earlier call behind: its timed outputs are
    the poison (NaN), which the host's verification rejects."""
    res, files, _ = run(env, "stale")
    assert res["status"] == "ok", res["reason"]  # the agent reports; the host verifies
    timed = [load_npy(v) for k, v in files.items() if k.startswith("tim_")]
    assert timed and all(np.isnan(t).all() for t in timed)


@pytest.mark.parametrize("name,code,word", [
    ("oob_write", "out-of-bounds-write", "past the end of output 0 (its guard zone in GPU memory)"),
    ("mutate", "input-mutated", "input 0 in GPU memory"),
    ("illegal", "out-of-bounds-access", "CUDA_ERROR_ILLEGAL_ADDRESS"),
    ("exec", "forbidden-exec", "execve"),
])
def test_named_failures(env, name, code, word):
    res, _, _ = run(env, name)
    assert_fault(res, code, word)


def test_no_gpu_is_the_device_s_error_not_the_kernel_s(env):
    res, _, _ = run(env, "honest", extra_env={"STANDIN_NO_DEVICE": "1"})
    assert res["status"] == "error" and res["fault"] is None, res
    assert "cuda-unavailable" in res["reason"] and "CUDA_ERROR_NO_DEVICE" in res["reason"], res["reason"]
    res, _, _ = run(env, "honest", params={"cuda_driver": "/nonexistent/libcuda.so.1"})
    assert res["status"] == "error" and res["fault"] is None and "no CUDA driver" in res["reason"], res["reason"]


def test_bad_device_parameter(env):
    res, _, _ = run(env, "honest", params={"device": "tpu"})
    assert res["status"] == "error" and 'params.device must be "cpu" or "cuda"' in res["reason"], res
