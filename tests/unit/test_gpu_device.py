"""GPU devices without a GPU (issue 14): what can be checked here. The agent's reading of
nvidia-smi (the line format of the H200 the GPU scripts ran on), devices ls's GPU column, the GPU
candidates a device whose onnxruntime has the CUDA and TensorRT providers gets (their own grid, not
the CPU's), fp16 under an accuracy budget (a converted model that onnxruntime runs within fp16's
error), and the agent's device-resident io binding, driven here through onnxruntime's own OrtValues
in CPU memory (the same calls the CUDA path makes, with "cuda" as the memory kind)."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from edgetune.agent.bundle import python_agent
from edgetune.agent.host import AgentInfo
from edgetune.cli.devices import gpu_text
from edgetune.space import APPROXIMATE_SPACES, load_space, space_of, with_approximate
from edgetune.space.ort_gpu import GPU_PROVIDERS
from edgetune.modelfile import load_model
from edgetune.workload import build_workload, compute_reference
from tests.fixtures.tiny import build_tiny

AGENT = python_agent()  # the one file a device runs, bundled from device_agents/python/edgetune_agent/


@pytest.fixture(scope="module")
def agent():
    spec = importlib.util.spec_from_file_location("edgetune_agent_gpu_test", AGENT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _info(providers):
    return AgentInfo("python", "2.4.0", "x86_64", "3.11", {"onnxruntime": "1.20.1", "onnxruntime_providers": providers},
                     {"cores": 16, "gpus": [{"name": "NVIDIA H200", "sm": "sm_90"}]})


def _fake_nvidia_smi(tmp_path: Path) -> Path:
    """A directory holding an nvidia-smi that reports one H200 (this machine posing as a GPU device)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 'NVIDIA H200, 9.0, 580.159.04, 143771, 1980, 3201, 00000000:19:00.0'\n")
    smi.chmod(0o755)
    return bin_dir


def test_nvidia_smi_reading_and_the_gpu_column(agent):
    text = "NVIDIA H200, 9.0, 580.159.04, 143771, 1980, 3201, 00000000:19:00.0\n" \
           "NVIDIA A100-SXM4-80GB, 8.0, 580.159.04, [N/A], [N/A], 1593, 00000000:1A:00.0\n\nbroken line\n"
    g = agent.parse_nvidia_smi(text, "13.0")
    assert g[0] == {"name": "NVIDIA H200", "sm": "sm_90", "driver": "580.159.04", "memory_mib": 143771,
                    "max_sm_clock_mhz": 1980, "max_mem_clock_mhz": 3201, "pci_bus": "00000000:19:00.0",
                    "cuda_driver": "13.0"}
    assert g[1]["sm"] == "sm_80" and g[1]["memory_mib"] is None and len(g) == 2
    assert gpu_text({**g[0], "cuda_runtime": "12.8"}) == \
        "NVIDIA H200 sm_90, 140.4 GiB, 1980 MHz, driver 580.159.04, CUDA 13.0 (runtime 12.8)"
    assert gpu_text(g[1]) == "NVIDIA A100-SXM4-80GB sm_80, memory ?, clock ?, driver 580.159.04, CUDA 13.0"
    if shutil.which("nvidia-smi") is None:  # this machine: no GPU, no key, the CPU fingerprint as it was
        assert agent.gpus() == [] and "gpus" not in agent.fingerprint()


def test_the_native_agent_reports_the_gpus_as_the_python_agent_does(agent, tmp_path, monkeypatch):
    """Both agents read nvidia-smi the same way (the judge and tune-kernels read the native agent's
    fingerprint for the SM to build for): same list, same fields, for a fake nvidia-smi on PATH."""
    import subprocess

    from edgetune.build import native

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text("#!/bin/sh\nprintf '%s\\n' 'NVIDIA H200, 9.0, 580.159.04, 143771, 1980, 3201, 00000000:19:00.0' "
                   "'NVIDIA A100-SXM4-80GB, 8.0, 580.159.04, [N/A], [N/A], 1593.5, 00000000:1A:00.0' 'broken line'\n")
    smi.chmod(0o755)
    exe = native.build_agent(None, static=False, out_dir=tmp_path / "agent")
    path = f"{bin_dir}:{__import__('os').environ['PATH']}"
    monkeypatch.setenv("PATH", path)
    info = json.loads(subprocess.run([str(exe), "info"], capture_output=True, text=True, check=True).stdout)
    got = info["fingerprint"]["gpus"]
    assert got == agent.gpus() and len(got) == 2, got
    assert got[0]["sm"] == "sm_90" and got[0]["memory_mib"] == 143771 and got[1]["max_mem_clock_mhz"] == 1593.5
    monkeypatch.setenv("PATH", "/nonexistent")  # no nvidia-smi: no key at all
    info = json.loads(subprocess.run([str(exe), "info"], capture_output=True, text=True, check=True).stdout)
    assert "gpus" not in info["fingerprint"]


def test_a_gpu_device_gets_its_own_grid_and_fp16_only_under_a_budget(tmp_path):
    model = load_model(build_tiny(tmp_path / "tiny.onnx"))
    info = _info(["TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"])
    cands = load_space("ort").candidates(model, info)
    gpu = [c for c in cands if c.param_dict.get("execution_provider") in GPU_PROVIDERS]
    cpu = [c for c in cands if c.param_dict.get("execution_provider") == "CPUExecutionProvider"]
    assert cands[0].baseline and cpu and len(gpu) == 2 + 12 + 2
    # each GPU provider at its defaults is a baseline: GPU speedups are against the GPU, not only the CPU
    assert sorted(c.param_dict["execution_provider"] for c in gpu if c.baseline) == sorted(GPU_PROVIDERS)
    gpu = [c for c in gpu if not c.baseline]
    for c in gpu:  # no CPU dimensions on a GPU provider; CUDA graphs only with device-resident buffers
        p = c.param_dict
        assert not {"intra_op_num_threads", "execution_mode", "session.intra_op.allow_spinning"} & set(p)
        assert p["io_binding"] in ("host", "device") and not c.approximate
        if p["provider_options"].get("enable_cuda_graph") == "1":
            assert p["io_binding"] == "device"
    assert len({c.key() for c in gpu}) == len(gpu)
    # fp16 is approximate: its space joins only when the user sets an accuracy budget
    assert "ort-gpu-fp16" in APPROXIMATE_SPACES and "ort-gpu-fp16" not in with_approximate(("ort",), False)
    fp16 = load_space("ort-gpu-fp16").candidates(model, info)
    assert fp16 and all(c.approximate for c in fp16)
    assert {space_of(c).name for c in fp16} == {"ort-gpu-fp16"}
    # a device without GPU providers: the CPU grid as before, nothing from the GPU spaces
    cpu_only = _info(["CPUExecutionProvider"])
    assert not load_space("ort-gpu-fp16").candidates(model, cpu_only)
    assert all(c.param_dict.get("execution_provider", "CPUExecutionProvider") == "CPUExecutionProvider"
               for c in load_space("ort").candidates(model, cpu_only))


def test_fp16_model_runs_within_fp16_error(tmp_path):
    import onnxruntime as ort

    model = load_model(build_tiny(tmp_path / "tiny.onnx"))
    wl = build_workload(model, {"batch": 4})
    cand = next(c for c in load_space("ort-gpu-fp16").candidates(
        model, _info(["CUDAExecutionProvider", "CPUExecutionProvider"])))
    prep = space_of(cand).prepare(cand, wl, None, tmp_path / "cache")
    assert prep.model is None and prep.artifact != model.path and "precision" not in prep.params
    sess = ort.InferenceSession(str(prep.artifact), providers=["CPUExecutionProvider"])
    assert [i.type for i in sess.get_inputs()] == ["tensor(float)"]  # float32 at the edges (keep_io_types)
    x = wl.input_sets[0]
    got = sess.run(None, {model.inputs[0].name: x[0]})[0]
    want = compute_reference(model, x)[0]
    err = np.abs(got - want).max() / np.abs(want).max()
    assert 0 < err < 2e-3  # fp16's error: not bit-equal (it did compute in fp16), within its precision


def test_device_resident_binding_uploads_each_input_and_poisons_the_outputs(agent, tmp_path, monkeypatch):
    model = load_model(build_tiny(tmp_path / "tiny.onnx"))
    wl = build_workload(model, {"batch": 3})
    outs = [{"name": o.name, "dtype": "float32", "shape": [3, 8]} for o in model.outputs]
    with pytest.raises(ValueError, match="needs a CUDA or TensorRT execution provider"):
        agent.OrtBackend(str(model.path), {"io_binding": "device"}, wl.input_names, outs)
    # the CUDA path's calls, on memory onnxruntime allocates for the CPU provider
    monkeypatch.setitem(agent.DEVICE_MEMORY, "CPUExecutionProvider", "cpu")
    b = agent.OrtBackend(str(model.path), {"io_binding": "device"}, wl.input_names, outs)
    assert b.input_check.startswith("agent copy")
    work = [np.empty_like(a) for a in wl.input_sets[0]]
    for k, inputs in enumerate(wl.input_sets[:3]):
        for w, a in zip(work, inputs):
            w[...] = a  # the agent rewrites its buffers in place ...
        b.stage(work)  # ... and uploads them before the timed run
        b.poison()
        assert np.isnan(b.results()[0]).all()  # the device's output buffer holds NaN until a run writes it
        b.run(work)
        assert np.array_equal(b.results()[0], compute_reference(model, inputs)[0]), k
    # an input rewritten but not uploaded is not what the device computes on: the stage step is what counts
    work[0][...] = wl.input_sets[0][0]
    b.poison()
    b.run(work)
    assert not np.array_equal(b.results()[0], compute_reference(model, wl.input_sets[0])[0])


def test_a_provider_that_cannot_load_fails_the_candidate_with_the_loaders_reason(agent, tmp_path, monkeypatch,
                                                                                   capsys):
    """onnxruntime runs a session on the CPU without a word when the provider asked for cannot load
    (onnxruntime-gpu without CUDA 13's libraries): timed, that would be the CPU under CUDA's name, and
    it won once (ep=Tensorrt, all nodes on the CPU, selected). The agent refuses such a session and
    says what the dynamic loader says of the provider's library."""
    import subprocess
    import types

    model = load_model(build_tiny(tmp_path / "tiny.onnx"))
    wl = build_workload(model, {"batch": 3})
    outs = [{"name": o.name, "dtype": "float32", "shape": [3, 8]} for o in model.outputs]
    # this machine's onnxruntime has no CUDA provider at all
    with pytest.raises(RuntimeError, match=r"CUDAExecutionProvider did not load in this onnxruntime .*"
                                           r"this build has no CUDAExecutionProvider; it has .*CPUExecutionProvider"):
        agent.OrtBackend(str(model.path), {"execution_provider": "CUDAExecutionProvider"}, wl.input_names, outs)
    # onnxruntime-gpu's layout: capi/libonnxruntime_providers_cuda.so needing a CUDA library that is
    # not there (a real shared object, linked against a stand-in library removed afterwards)
    cc = shutil.which("gcc") or pytest.fail("gcc (make setup installs it)")
    ort = tmp_path / "fake_ort"
    (ort / "capi").mkdir(parents=True)
    (ort / "__init__.py").write_text("")
    stub, c = tmp_path / "libcublasLt.so.13", tmp_path / "p.c"
    c.write_text("int edgetune_probe(void) { return 1; }\n")
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(stub), "-Wl,-soname,libcublasLt.so.13", str(c)], check=True)
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(ort / "capi" / "libonnxruntime_providers_cuda.so"), str(c),
                    "-Wl,--no-as-needed", str(stub)], check=True)
    stub.unlink()
    fake = types.SimpleNamespace(__file__=str(ort / "__init__.py"),
                                 get_available_providers=lambda: ["TensorrtExecutionProvider", "CUDAExecutionProvider",
                                                                          "CPUExecutionProvider"])
    why = agent.provider_load_error(fake, "CUDAExecutionProvider")
    assert why.startswith("libcublasLt.so.13: cannot open shared object file"), why
    assert agent.provider_load_error(fake, "TensorrtExecutionProvider") == \
        "libonnxruntime_providers_tensorrt.so is not installed"
    # NVIDIA's wheels (onnxruntime-gpu[cuda,cudnn]) are found only once preloaded, as onnxruntime's
    # instructions have a program do: once per process, and what it prints stays off the protocol's stdout
    calls = []
    monkeypatch.setattr(agent, "_PRELOADED", [])
    noisy = types.SimpleNamespace(preload_dlls=lambda: (calls.append(1), print("Failed to load libcublasLt.so.13")))
    agent.preload_provider_libraries(noisy)
    agent.preload_provider_libraries(noisy)
    assert calls == [1] and capsys.readouterr().out == ""
    # a provider the build has and whose session stands is used as asked: the CPU's
    b = agent.OrtBackend(str(model.path), {"execution_provider": "CPUExecutionProvider"}, wl.input_names, outs)
    assert b.sess.get_providers() == ["CPUExecutionProvider"]


def test_cuda_kernels_are_built_for_the_devices_sm(tmp_path):
    """nvcc builds a CUDA kernel for the SM the device's fingerprint names (sm_80, sm_90): the
    shared object's embedded GPU binaries are for that SM and no other."""
    from edgetune.build import kernel_build as kb
    from edgetune.errors import UserInputError
    from tests.conftest import require

    require(shutil.which("nvcc") is not None, "nvcc (make setup installs NVIDIA's nvcc wheels)")
    cu = tmp_path / "k.cu"
    cu.write_text('#include <edgetune_kernel.h>\n__global__ void twice(float *x) { x[threadIdx.x] *= 2; }\n'
                  'EDGETUNE_KERNEL int edgetune_kernel(const DLTensor *i, int32_t ni, DLTensor *o, int32_t no) '
                  '{ return 0; }\n')
    built = {sm: kb.build_kernel(cu, "x86_64", tmp_path / "out", cuda_arch=sm) for sm in ("sm_80", "sm_90")}
    assert kb.cuda_sms(built["sm_80"].path) == [80] and kb.cuda_sms(built["sm_90"].path) == [90]
    assert built["sm_80"].path != built["sm_90"].path  # one cache entry per SM
    assert "-arch=sm_90" in built["sm_90"].command
    with pytest.raises(UserInputError, match="not a GPU architecture"):
        kb.build_kernel(cu, "x86_64", tmp_path / "out", cuda_arch="sm_90; rm -rf /")


def test_judge_builds_a_cuda_kernel_for_the_gpu_it_judges_on(tmp_path):
    """judge: a CUDA source is built for the SM of the device's GPU; a device without one names the
    kernel not applicable instead of building it."""
    from edgetune.build import kernel_build as kb
    from edgetune.hashing import sha256_file
    from edgetune.judge import JudgeConfig, Judged, KernelFile
    from edgetune.judge.run import _build_for
    from tests.conftest import require

    require(shutil.which("nvcc") is not None, "nvcc (make setup installs NVIDIA's nvcc wheels)")
    cu = tmp_path / "k.cu"
    cu.write_text('#include <edgetune_kernel.h>\n__global__ void twice(float *x) { x[threadIdx.x] *= 2; }\n'
                  'EDGETUNE_KERNEL int edgetune_kernel(const DLTensor *i, int32_t ni, DLTensor *o, int32_t no) '
                  '{ return 0; }\n')
    k = KernelFile("k.cu", cu, "cuda", sha256_file(cu))
    cfg = JudgeConfig(build_dir=str(tmp_path / "b"))
    # (a CUDA kernel links the CUDA runtime, which imports dlopen: judged only under the seccomp sandbox)
    gpu = AgentInfo("python", "2.4.0", "x86_64", "3.11", {"judge-sandbox": "seccomp"},
                    {"gpus": [{"name": "NVIDIA A100", "sm": "sm_80"}]})
    res = Judged("k.cu", str(cu), "cuda", k.sha256, "gpu-box")
    b = _build_for(k, gpu, cfg, res)
    assert b is not None and kb.cuda_sms(b.path) == [80] and res.failure is None
    cpu = AgentInfo("python", "2.4.0", "x86_64", "3.11", {}, {"cores": 2})
    res = Judged("k.cu", str(cu), "cuda", k.sha256, "cpu-box")
    assert _build_for(k, cpu, cfg, res) is None and res.failure == "not-applicable"


def test_judge_on_a_gpu_device_sends_cuda_kernels_to_the_agent_s_cuda_mode(tmp_path, monkeypatch):
    """The judge end to end on this machine posing as a GPU device (a fake nvidia-smi says sm_90):
    the native agent's fingerprint names the SM, the CUDA kernel is built with nvcc for sm_90, its jobs
    ask the agent's CUDA mode, and there the GPU cannot be opened (no driver here): the kernel is
    not-applicable, the device's failure and not the kernel's, while a C kernel beside it is judged
    as usual. (The agent's CUDA mode itself: tests/unit/test_native_judge_cuda.py.)"""
    import os

    from edgetune import api
    from edgetune.build import kernel_build as kb
    from tests.conftest import require

    require(shutil.which("nvcc") is not None, "nvcc (make setup installs NVIDIA's nvcc wheels)")
    bin_dir = _fake_nvidia_smi(tmp_path)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("EDGETUNE_HOME", str(tmp_path / "home"))
    kernels = Path(__file__).resolve().parents[1]
    doc = api.judge("gemm:M=16,N=12,K=8", [str(kernels / "judge_kernels_cuda" / "gemm_tiled.cu"),
                                           str(kernels / "judge_kernels" / "gemm_naive.c")],
                    rounds=2, budget_ms=5.0, db=str(tmp_path / "j.db"), baseline=False)
    res = {r["kernel"]: r for r in doc["results"]}
    cu, c = res["gemm_tiled.cu"], res["gemm_naive.c"]
    assert cu["failure"] == "not-applicable" and "the device's GPU could not be opened" in cu["errors"][0], cu
    assert "-arch=sm_90" in cu["build"]["command"] and kb.cuda_sms(cu["build"]["binary"]) == [90]
    assert c["correct"], c["errors"]
    (dev,) = doc["devices"]
    assert dev["gpu"]["sm"] == "sm_90" and dev["gpu"]["peak_gflops"] > 100_000, dev["gpu"]
    assert dev["fingerprint"]["gpus"][0]["name"] == "NVIDIA H200"


def test_the_kernel_worker_times_on_the_device_clock_with_caches_flushed(tmp_path):
    """The CUDA kernel worker (tune-kernels' measurer on a local GPU) times each run with TVM's
    device timer (CUDA events on a GPU) into preallocated outputs, flushing the caches first; run
    here on the CPU device, whose timer the same code uses. A GPU measurer flushes 256 MiB (more
    than any L2) unless told otherwise."""
    from tests.conftest import require_module

    require_module("tvm")
    from edgetune.build.tvm_kernel import as_tvm_target, compile_module, default_schedule, export_module
    from dataclasses import replace

    from edgetune.kernels.measurement import CudaLocalMeasure, verify_run
    from edgetune.kernels.targets import host_target
    from edgetune.kernels.workloads import parse_workload

    wl = parse_workload("gemm:M=32,N=32,K=32")
    tgt = as_tvm_target(host_target().tvm_target)
    so = export_module(compile_module(default_schedule(wl.ir_module(), tgt), tgt), tmp_path / "gemm.so")
    inputs = wl.random_inputs(seed=5)
    with CudaLocalMeasure(device="cuda") as gpu:
        assert gpu.cache_flush_bytes == 256 << 20
    with CudaLocalMeasure(device="cpu", cache_flush_bytes=4 << 20, budget_ms=20.0, min_iters=5) as m:
        run = m(str(so), inputs, wl.outputs)
    assert run.status == "ok", run.reason
    assert len(run.samples_ns) >= 5 and all(s > 0 for s in run.samples_ns)
    np.testing.assert_allclose(run.outputs[0], wl.reference(inputs)[0], rtol=1e-4, atol=1e-4)
    # after timing, two new input sets went through the timed buffers; the host verifies them all
    assert len(run.post_checks) == 2
    for x, outs in run.post_checks:
        assert not np.array_equal(x[0], inputs[0])
        np.testing.assert_allclose(outs[0], wl.reference(x)[0], rtol=1e-4, atol=1e-4)
    assert verify_run(run, wl, inputs, wl.reference(inputs)).ok
    # a kernel that stops computing once timed: its post-timing outputs are the first set's, caught
    stale = replace(run, post_checks=[(x, list(run.outputs)) for x, _ in run.post_checks])
    v = verify_run(stale, wl, inputs, wl.reference(inputs))
    assert not v.ok and v.code == "insensitive", v.reason


def test_the_offline_gpu_replay_runs_every_gpu_candidate_through_the_agent_and_verifies_here(tmp_path):
    """tools/gpu/ort_gpu_replay.py, all three steps on this GPU-less machine: the GPU candidates are
    staged as the agent's requests, run by the agent as the GPU machine would run them, and their
    answers validated and verified here. Without onnxruntime-gpu every GPU candidate fails to load
    and says why: onnxruntime would have run a host-bound CUDA one on the CPU without a word, and
    its figure would have passed for the GPU's."""
    import subprocess
    import sys

    from tests.conftest import load_tool

    replay = load_tool("gpu", "ort_gpu_replay")
    model = build_tiny(tmp_path / "tiny.onnx")
    src, out = tmp_path / "carry", tmp_path / "out"
    assert replay.main(["prepare", str(src), "--model", str(model), "--batch", "2", "--rounds", "1",
                        "--budget-ms", "20"]) == 0
    plan = json.loads((src / "plan.json").read_text())
    assert len(plan["jobs"]) == 1 + 2 + 12 + 2
    for req in (src / "device" / "requests").iterdir():  # nothing in a request names this machine's paths
        assert str(src) not in req.read_text()
    # the device half as the GPU machine runs it: the carried directory only, no edgetune import
    p = subprocess.run([sys.executable, str(Path(replay.__file__)), "run", str(src), str(out)],
                       capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    md = tmp_path / "r.md"
    assert replay.main(["verify", str(src), str(out), "--markdown", str(md)]) == 0
    rows = {ln.split(" | ")[0].lstrip("| "): ln for ln in md.read_text().splitlines() if ln.startswith("| ort")}
    assert "| yes |" in rows["ort default"]
    gpu = [v for k, v in rows.items() if "ep=CUDA" in k or "ep=Tensorrt" in k]
    assert len(gpu) == 2 + 12 + 2 and all("| NO |" in v and "load failed" in v for v in gpu)
    host = [v for k, v in rows.items() if "ep=CUDA" in k and "io_binding=host" in k]
    assert host and all("CUDAExecutionProvider did not load in this onnxruntime" in v
                        and "this build has no CUDAExecutionProvider" in v for v in host)


def test_the_offline_judge_replay_stages_the_judges_plan_and_reads_it_back(tmp_path):
    """tools/gpu/judge_replay.py, all three steps on this GPU-less machine: the CUDA kernels built for
    sm_90, the judge's plan (odd-size checks, a sanitizer job per kernel and tool, rounds in the
    rotating order with the GPU baseline forms: onnxruntime's CUDA provider, eager and compiled
    PyTorch on CUDA) staged as requests with relative paths, run by the agents as the GPU machine
    would (the native agent's CUDA mode, the Python agent's CUDA provider and torch backend),
    and read back through validation, the verifier and final_rounds. Here the GPU cannot be opened:
    every kernel is out with the driver's error, no baseline has a figure, and the script exits 1."""
    import subprocess
    import sys

    from tests.conftest import load_tool, require

    require(shutil.which("nvcc") is not None, "nvcc (make setup installs NVIDIA's nvcc wheels)")
    replay = load_tool("gpu", "judge_replay")
    src, out = tmp_path / "carry", tmp_path / "out"
    assert replay.main(["prepare", str(src), "--op", "gemm:M=32,N=24,K=16", "--rounds", "2", "--budget-ms", "5"]) == 0
    plan = json.loads((src / "plan.json").read_text())
    kernels = ["gemm_oob.cu", "gemm_stale.cu", "gemm_tiled.cu"]
    assert [p["who"] for p in plan["jobs"] if p["stage"] == "check"] == kernels
    assert [(p["who"], p["tool"]) for p in plan["jobs"] if p["stage"] == "sanitize"] == \
        [(k, t) for k in kernels for t in ("memcheck", "racecheck")]
    rounds = [[p["who"] for p in plan["jobs"] if p.get("round") == r] for r in (1, 2)]
    assert rounds[0] == [*kernels, "ort-cuda-constant", "ort-cuda-runtime", "torch-cuda", "torch-cuda-compile"]
    assert rounds[1] == rounds[0][1:] + rounds[0][:1]
    torch_reqs = [json.loads(r.read_text()) for r in (src / "device" / "requests").iterdir() if '"torch"' in r.read_text()]
    assert sorted({r["params"]["compile"] for r in torch_reqs}) == ["", "max-autotune-no-cudagraphs"]
    assert {r["params"]["device"] for r in torch_reqs} == {"cuda"}
    for req in (src / "device" / "requests").iterdir():
        text = req.read_text()
        assert str(src) not in text
        if '"judge"' in text:
            assert json.loads(text)["params"]["device"] == "cuda"
    p = subprocess.run([sys.executable, str(Path(replay.__file__)), "run", str(src), str(out)],
                       capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    md = tmp_path / "r.md"
    assert replay.main(["verify", str(src), str(out), "--markdown", str(md)]) == 1
    rows = [ln for ln in md.read_text().splitlines() if ln.startswith("| gemm_")]
    assert len(rows) == 3 and all("| NO |" in r and "cuda-unavailable" in r for r in rows), rows


@pytest.mark.parametrize("sm", ["sm_80", "sm_90"])
def test_float16_gemm_on_a_gpu_is_searched_in_the_tensor_core_space(sm):
    """tune-kernels' design space for a float16 GEMM (float32 accumulation and output) on sm_80/sm_90
    is MetaSchedule's tensor-core space: the schedules it samples use wmma fragments, every one of
    them lowers (with TVM's own rule set, 32 of 40 failed: see kernels.search._tensorcore_rules),
    and they compile with nvcc for that SM (what a GPU would time). A float32 GEMM keeps the
    ordinary CUDA space."""
    import subprocess

    import tvm
    import tvm_ffi
    from tvm.s_tir import meta_schedule as ms

    from edgetune.build.tvm_kernel import as_tvm_target, compile_module, import_tensor_intrinsics
    from edgetune.kernels.search import design_space
    from edgetune.kernels.targets import load_target
    from edgetune.kernels.workloads import parse_workload
    from tests.conftest import require

    require(shutil.which("nvcc") is not None, "nvcc (make setup installs NVIDIA's nvcc wheels)")
    import_tensor_intrinsics()
    tgt = as_tvm_target(load_target("cuda-" + sm.replace("_", "")).tvm_target)
    w = parse_workload("gemm:M=256,N=256,K=256,dtype=float16")
    assert [s.dtype for s in w.inputs] == ["float16", "float16"] and w.outputs[0].dtype == "float32"
    assert design_space(tgt, parse_workload("gemm:M=256,N=256,K=256")) == "post-order-apply"
    space = design_space(tgt, w)
    ctx = ms.TuneContext(mod=w.ir_module(), target=tgt, space_generator=space,
                         search_strategy=ms.search_strategy.ReplayTrace(), task_name="main", rand_state=1,
                         num_threads=2)
    strategy = ctx.search_strategy
    strategy.pre_tuning(24, 12, ctx.space_generator.generate_design_space(w.ir_module()), None, None)
    seen, built, failed = set(), [], []
    while len(seen) < 8:
        cands = strategy.generate_measure_candidates()
        if not cands:
            break
        for c in cands:
            if tvm_ffi.structural_hash(c.sch.mod) in seen or len(seen) >= 8:
                continue
            seen.add(tvm_ffi.structural_hash(c.sch.mod))
            assert "wmma" in str(c.sch.mod)
            try:
                built.append(compile_module(c.sch.mod, tgt).mod.imports[0].inspect_source())
            except tvm.error.InternalError as exc:
                failed.append(str(exc).strip().splitlines()[-1][:200])
        strategy.notify_runner_results([], [ms.runner.RunnerResult([1.0], None) for _ in cands])
    strategy.post_tuning()
    assert len(seen) == 8 and not failed, failed
    src = built[-1]
    assert "wmma::mma_sync" in src and "wmma::fragment" in src
    cu = Path(f"/tmp/edgetune-tc-{sm}-{os.getpid()}.cu")
    cu.write_text(src)
    try:
        sass = subprocess.run(["nvcc", "-cubin", f"-arch={sm}", "-o", str(cu.with_suffix(".cubin")), str(cu)],
                              capture_output=True, text=True, timeout=300)
        assert sass.returncode == 0, sass.stderr[-2000:]
        assert cu.with_suffix(".cubin").stat().st_size > 0
    finally:
        cu.unlink(missing_ok=True)
        cu.with_suffix(".cubin").unlink(missing_ok=True)


def test_kernels_on_the_python_agents_tvm_runtime_follow_the_whole_protocol(tmp_path):
    """tune-kernels --gpu runs TVM kernels on the device's Python agent through the device's TVM
    runtime (PythonTvmMeasure, the agent's tvm-kernel backend), since the native agent cannot run
    TVM CUDA modules. Shown here on the CPU (device "cpu": the same backend, the same protocol): a
    MetaSchedule search whose every trial is verified, timed runs' outputs included; a kernel that
    leaves out one product fails; a device whose TVM lacks CUDA is one line."""
    import tvm
    from tvm import te

    from edgetune.build.tvm_kernel import compile_module, export_module
    from edgetune.devices.inventory import DeviceSpec
    from edgetune.errors import UserInputError
    from edgetune.kernels.device_measure import PythonTvmMeasure
    from edgetune.kernels.measurement import verify_run
    from edgetune.kernels.search import tune_workload
    from edgetune.kernels.targets import host_target
    from edgetune.kernels.workloads import parse_workload

    spec = DeviceSpec("local", "local", {"workdir": str(tmp_path / "dev")})
    w = parse_workload("gemm:M=24,N=16,K=20")
    with PythonTvmMeasure(spec, "cpu", budget_ms=5.0, timeout_s=60.0) as m:
        assert m.check()  # this machine's TVM reaches its CPU
        out = tune_workload(w, host_target().tvm_target, 4, m, tmp_path / "db")
        assert out.verified and out.trials_measured == 4 and all(r.status == "ok" for r in out.records), out.reason
        assert m.client.provision().agent == "python"

        # a kernel whose reduction leaves out the last k, exported as tune-kernels exports kernels
        a = te.placeholder((24, 20), "float32", name="A")
        b = te.placeholder((20, 16), "float32", name="B")
        k = te.reduce_axis((0, 19), name="k")
        c = te.compute((24, 16), lambda i, j: te.sum(a[i, k] * b[k, j], axis=k), name="C")
        wrong = export_module(compile_module(tvm.IRModule({"main": te.create_prim_func([a, b, c])}),
                                             host_target().tvm_target), tmp_path / "wrong.so")
        xs = w.random_inputs(3)
        run = m(str(wrong), xs, list(w.outputs))
        assert run.status == "ok" and not verify_run(run, w, xs, w.reference(xs)).ok
        assert run.job.input_check.startswith("agent copy (uploaded to the cpu")
    # the agent opens the GPU as its backends do, and the line says what stopped it (here: no driver)
    with pytest.raises(UserInputError, match=r"cannot run cuda kernels: RuntimeError: .*its CUDA runtime did "
                                             r"not load \((libcuda\.so\.1|libcudart\.so\.13): cannot open"):
        with PythonTvmMeasure(spec, "cuda") as m:
            m.check()


def test_a_gpu_device_gets_a_tvm_cuda_build_of_the_model(tmp_path, agent):
    """edgetune tune on a GPU device whose Python has TVM: besides the CPU builds, one tvm-relax
    candidate is the model built here for the GPU's SM (TVM's default GPU schedules: the library
    carries the CUDA source, which the device's TVM compiles when it loads it), run with device
    "cuda"; tvm-tuned stays on the CPU. On a device whose TVM has no CUDA, the agent's VM backend
    refuses the job in one line (this machine)."""
    from edgetune.space.tvm_relax import SPACE, TUNED

    model = load_model(build_tiny(tmp_path / "tiny.onnx"))
    info = AgentInfo("python", "2.4.0", "x86_64", "3.11", {"tvm": "0.27.0", "onnxruntime": "1.20.1"},
                     {"cores": 4, "gpus": [{"name": "NVIDIA H200", "sm": "sm_90"}]})
    cands = SPACE.candidates(model, info)
    gpu = [c for c in cands if c.param_dict.get("device") == "cuda"]
    assert len(gpu) == 1 and len(cands) > 1
    assert not [c for c in TUNED.candidates(model, info, trials=8) if c.param_dict.get("device")]
    no_gpu = AgentInfo("python", "2.4.0", "x86_64", "3.11", {"tvm": "0.27.0"}, {"cores": 4})
    assert not [c for c in SPACE.candidates(model, no_gpu) if c.param_dict.get("device")]
    wl = build_workload(model, {"batch": 4})
    prep = SPACE.prepare(gpu[0], wl, info, tmp_path / "cache")
    assert prep.backend == "tvm-relax" and prep.params == {"device": "cuda"}
    assert b"__global__" in prep.artifact.read_bytes()  # CUDA kernels inside
    cpu = SPACE.prepare(next(c for c in cands if not c.param_dict.get("device")), wl, info, tmp_path / "cache")
    assert cpu.artifact != prep.artifact and b"__global__" not in cpu.artifact.read_bytes()
    outs = [{"name": "y", "dtype": "float32", "shape": [4, 8]}]
    # TVM's CUDA runtime is loaded by hand (`import tvm` skips it without a word when a library is
    # missing) and the loader's reason is the job's: here the driver, libcuda.so.1, or the CUDA runtime
    with pytest.raises(RuntimeError, match=r"no cuda device: its CUDA runtime did not load "
                                           r"\((libcuda\.so\.1|libcudart\.so\.13): cannot open shared object file"):
        agent.TvmRelaxBackend(str(prep.artifact), {"device": "cuda"}, ["x"], outs)


def test_cuda_libraries_are_found_where_nvidias_wheels_put_them(agent, tmp_path, monkeypatch):
    """onnxruntime-gpu[cuda,cudnn], PyTorch and cuda-bindings bring CUDA as NVIDIA's wheels, under
    site-packages/nvidia, off the loader's path: TVM's CUDA runtime needs libcudart.so.13 from there
    (CUDA 13's wheels: nvidia/cu13/lib; CUDA 12's: nvidia/<part>/lib)."""
    import types

    site = tmp_path / "site-packages"
    for part in ("cu13", "cuda_runtime"):
        (site / "nvidia" / part / "lib").mkdir(parents=True)
    (site / "nvidia" / "cu13" / "lib" / "libcudart.so.13").write_bytes(b"")
    monkeypatch.setattr(agent.sys, "path", [str(tmp_path / "elsewhere"), str(site)])
    assert agent._nvidia_wheel_libs("libcudart.so.13") == [str(site / "nvidia" / "cu13" / "lib" / "libcudart.so.13")]
    assert agent._nvidia_wheel_libs("libcudart.so.12") == []
    # a TVM without its CUDA runtime library says so
    fake_tvm = types.SimpleNamespace(__file__=str(tmp_path / "tvm" / "__init__.py"))
    assert agent._tvm_cuda_runtime(fake_tvm) == "this TVM has no CUDA runtime (libtvm_runtime_cuda.so is not installed)"


def test_a_gpu_candidates_roofline_is_its_gpus_tensor_core_peak():
    """GPU candidates are not held to the CPU's roofline (they would all look impossible) but to
    the stated dense tensor-core peak of the SM the device reports: the fastest any precision its
    kernels pick can go. An SM no target states has no roofline, rather than a wrong one."""
    from edgetune.kernels.targets import gpu_peak_gflops

    assert gpu_peak_gflops("sm_90") == 989_400.0 and gpu_peak_gflops("sm_80") == 312_000.0
    assert gpu_peak_gflops("sm_75") is None and gpu_peak_gflops(None) is None


INTRINSICS_PER_TARGET = r"""
import sys
from tvm.s_tir import TensorIntrin
from edgetune.build.tvm_kernel import import_tensor_intrinsics
import_tensor_intrinsics({"kind": "llvm"})
loaded = sorted(m.rsplit(".", 1)[1] for m in sys.modules if m.startswith("tvm.s_tir.tensor_intrin."))
print("cpu", ",".join(loaded))
import tvm.s_tir.tensor_intrin  # what MetaSchedule does on first use: a no-op now
print("cuda-loaded", "tvm.s_tir.tensor_intrin.cuda" in sys.modules)
import_tensor_intrinsics({"kind": "cuda", "arch": "sm_80"})
from tvm.s_tir.tensor_intrin.cuda import WMMA_SYNC_16x16x16_f16f16f32_INTRIN as W
print("wmma", TensorIntrin.get(W) is not None)
"""


def test_tensor_intrinsics_are_registered_per_target_kind():
    """A CPU search registers the CPU intrinsics only (parsing the CUDA ones took 3.4 s of every
    tune-kernels start); a CUDA search later in the same process still gets the tensor-core ones."""
    import subprocess
    import sys

    p = subprocess.run([sys.executable, "-c", INTRINSICS_PER_TARGET], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    lines = dict(line.split(" ", 1) for line in p.stdout.splitlines())
    assert {"x86", "arm_cpu"} <= set(lines["cpu"].split(",")) and "cuda" not in lines["cpu"]
    assert lines["cuda-loaded"] == "False" and lines["wmma"] == "True"


def test_devices_check_tries_every_gpu_path_and_says_what_stops_each(tmp_path):
    """`edgetune devices check` on a GPU device (this machine posing as an H200: a fake nvidia-smi)
    has its Python agent try each GPU path for real and says what stops it: here onnxruntime has no
    GPU provider, PyTorch is a CPU build, TVM's CUDA runtime finds no driver; nvcc is here. A device
    without a GPU gets no such table. The device's answer is data: a garbled one is said so."""
    import os
    import subprocess
    import sys
    import types

    from edgetune.cli.devices import gpu_features
    from tests.conftest import require

    require(shutil.which("nvcc") is not None, "nvcc (make setup installs NVIDIA's nvcc wheels)")
    bin_dir = _fake_nvidia_smi(tmp_path)
    home = tmp_path / "home"
    env = {**os.environ, "EDGETUNE_HOME": str(home), "COLUMNS": "200"}

    def edgetune(*args, path=None):
        return subprocess.run([sys.executable, "-m", "edgetune.cli.main", *args], capture_output=True, text=True,
                              timeout=600, env={**env, "PATH": path or env["PATH"]}, cwd=str(tmp_path))

    assert edgetune("devices", "add", "gpu", "local").returncode == 0
    p = edgetune("devices", "check", "gpu", "--format", "json", path=f"{bin_dir}:{env['PATH']}")
    assert p.returncode == 0, p.stderr
    (row,) = json.loads(p.stdout)
    feats = {f["feature"]: f for f in row["gpu_features"]}
    assert list(feats) == ["onnxruntime CUDA", "onnxruntime TensorRT", "PyTorch CUDA", "TVM CUDA",
                           "compute-sanitizer", "nvcc (this host)"]
    assert not feats["onnxruntime CUDA"]["ok"] and "has no CUDAExecutionProvider" in feats["onnxruntime CUDA"]["detail"]
    assert not feats["PyTorch CUDA"]["ok"] and "is a CPU build" in feats["PyTorch CUDA"]["detail"]
    assert not feats["TVM CUDA"]["ok"] and ("libcuda.so.1" in feats["TVM CUDA"]["detail"]
                                           or "libcudart.so.13" in feats["TVM CUDA"]["detail"])
    assert feats["nvcc (this host)"]["ok"] and "cuda_13" in feats["nvcc (this host)"]["detail"]
    p = edgetune("devices", "check", "gpu", path=f"{bin_dir}:{env['PATH']}")
    assert p.returncode == 0 and "GPU paths on gpu" in p.stdout and "is a CPU build" in p.stdout
    p = edgetune("devices", "check", "gpu", "--format", "json")  # no nvidia-smi: no GPU, no table
    assert p.returncode == 0 and "gpu_features" not in json.loads(p.stdout)[0]
    # a device that answers garbage (or a forged row) gets one line saying so, never a crash
    for answer in (b"not json\n", b'{"features": "everything works"}\n', b'{"features": [1, 2]}\n'):
        ran = types.SimpleNamespace(ok=True, returncode=0, stdout=answer, text=lambda a=answer: a.decode())
        client = types.SimpleNamespace(agent_command=lambda *a, **k: ran)
        got = gpu_features(client, types.SimpleNamespace(agent="python"))
        assert got[0]["feature"] == "gpu-check" and not got[0]["ok"] and "could not be read" in got[0]["detail"]
    got = gpu_features(None, types.SimpleNamespace(agent="native"))
    assert got[0]["feature"] == "Python agent" and not got[0]["ok"]


def test_a_tvm_job_imports_tvm_without_pytorch():
    """The agent's TVM backends import TVM without the PyTorch tvm-ffi would import where it is
    installed (seconds of every TVM job); the runtime still works and torch stays importable."""
    import subprocess
    import sys

    from tests.conftest import require_module

    require_module("tvm")  # fails in CI when missing, never skips there
    agent_root = Path(__file__).resolve().parents[2] / "device_agents" / "python"
    code = ("import sys\nfrom edgetune_agent.backends.tvm import import_tvm\ntvm = import_tvm()\n"
            "import numpy as np\n"
            "x = tvm.runtime.tensor(np.ones(3, 'float32')) if hasattr(tvm.runtime, 'tensor') else None\n"
            "print('torch' in sys.modules, tvm.runtime.device('cpu', 0).exist)\n"
            "import importlib.util\nprint(importlib.util.find_spec('torch') is not None)\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                       env={**os.environ, "PYTHONPATH": str(agent_root)})
    assert p.returncode == 0, p.stderr
    first, second = p.stdout.split("\n")[:2]
    assert first == "False True", p.stdout
    assert second == str(importlib.util.find_spec("torch") is not None), p.stdout
