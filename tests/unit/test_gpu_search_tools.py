"""The host halves of the CUDA schedule search (tools/gpu): sampling and sketch verification."""

from __future__ import annotations

import numpy as np

from edgetune.kernels.workloads import parse_workload
from tests.conftest import load_tool, require_module


def test_sketches_pass_a_right_gemm_and_catch_wrong_ones():
    vs = load_tool("gpu", "verify_search")
    wl = parse_workload("gemm:M=96,N=160,K=128")
    a, b = wl.random_inputs(seed=3)
    ref = wl.reference([a, b])[0]
    scale = float(np.max(np.abs(ref)))
    rng = np.random.default_rng(0)
    rcol, rrow = rng.choice([-1.0, 1.0], size=wl.N), rng.choice([-1.0, 1.0], size=wl.M)

    def verdict(out):
        f = out.astype(np.float64)
        return (vs.sketch_ok((f @ rcol).tolist(), ref @ rcol, scale)[0]
                and vs.sketch_ok((rrow @ f).tolist(), rrow @ ref, scale)[0])

    assert verdict((a @ b).astype(np.float32))  # fp32 rounding is within tolerance
    assert not verdict((a[:, :-1] @ b[:-1, :]).astype(np.float32))  # the wrong-on-purpose kernel
    one = (a @ b).astype(np.float32)
    one[5, 7] += np.float32(1e-3 * scale)  # a single element 0.1% of scale off
    assert not verdict(one)
    nan = (a @ b).astype(np.float32)
    nan[0, 0] = np.nan
    assert not verdict(nan)


def test_sampled_cuda_schedules_are_distinct_and_valid(tmp_path):
    require_module("tvm")
    import tvm_ffi

    from edgetune.build.tvm_kernel import as_tvm_target
    from edgetune.kernels.targets import load_target

    sc = load_tool("gpu", "search_cuda_kernels")
    wl = parse_workload("gemm:M=128,N=128,K=128")
    tgt = as_tvm_target(load_target("cuda-sm90").tvm_target)
    schedules = sc.sample_schedules(wl.ir_module(), tgt, 6, seed=0)
    assert len(schedules) == 6
    assert len({tvm_ffi.structural_hash(s.mod) for s in schedules}) == 6
    for s in schedules:  # MetaSchedule's postprocessors bound every loop to GPU threads
        text = s.mod.script()
        assert "threadIdx.x" in text and "blockIdx" in text


def test_verify_results_checks_returned_gpu_outputs_and_reports_every_baseline(tmp_path, capsys):
    """The host half after a GPU run (tools/gpu/verify_results.py), on results as the GPU machine
    writes them: outputs checked against float64 references computed here, cuBLAS, torch.matmul
    and torch.compile reported side by side with intervals; a wrong output fails the check."""
    import json

    vr = load_tool("gpu", "verify_results")
    src, out = tmp_path / "src", tmp_path / "out"
    (src / "kernels").mkdir(parents=True)
    out.mkdir()
    wl = parse_workload("gemm:M=64,N=48,K=32")
    a, b = wl.random_inputs(seed=2)
    np.save(src / "kernels" / "k0_in0.npy", a)
    np.save(src / "kernels" / "k0_in1.npy", b)
    (src / "manifest.json").write_text(json.dumps([{"spec": "gemm:M=64,N=48,K=32", "so": "k0.so", "flops": wl.flops(),
                                                    "inputs": ["k0_in0.npy", "k0_in1.npy"], "outputs": []}]))
    rng = np.random.default_rng(0)
    samples = lambda ms: (rng.normal(ms, ms / 50, 40) * 1e6).tolist()  # noqa: E731
    res = {"gpu": "NVIDIA H200, 580.159.04, 1980 MHz", "tvm": "0.27.0.post1", "cupy": "14.2.0", "results": [
        {"spec": "gemm:M=64,N=48,K=32", "repeat_equal": True, "inputs_unchanged": True, "output": "k0_out.npy",
         "tvm_samples_ns": samples(0.010), "cublas_samples_ns": samples(0.005), "timing": "CUDA events per launch",
         "torch": "2.9.0", "torch_matmul_samples_ns": samples(0.006), "torch_compile_samples_ns": samples(0.008),
         "torch_matmul_vs_tvm_max_rel_diff": 1e-7, "torch_compile_vs_tvm_max_rel_diff": 2e-7}]}
    (out / "results.json").write_text(json.dumps(res))
    np.save(out / "k0_out.npy", (a @ b).astype(np.float32))
    assert vr.main(src, out) == 0
    text = capsys.readouterr().out
    assert "timing: CUDA events per launch" in text and "| gemm:M=64,N=48,K=32 | yes |" in text
    import re

    ratios = [float(x) for x in re.findall(r"\| ([0-9.]+)× \[", text)]  # TVM vs cuBLAS, torch.matmul, torch.compile
    assert "torch_matmul" in text and "torch_compile" in text and len(ratios) == 3
    assert 0.45 < ratios[0] < 0.55 and 0.55 < ratios[1] < 0.65 and 0.75 < ratios[2] < 0.85
    wrong = (a @ b).astype(np.float32)
    wrong[3, 4] += 1.0
    np.save(out / "k0_out.npy", wrong)
    assert vr.main(src, out) == 1
    assert "| gemm:M=64,N=48,K=32 | NO |" in capsys.readouterr().out


def test_the_search_tool_samples_tensor_core_schedules_for_a_float16_gemm(tmp_path):
    """The prepared GPU search for a float16 GEMM (float16 operands, float32 accumulation): its
    candidates come from tune-kernels' tensor-core space, every one lowers, the kernel that is wrong
    on purpose accumulates in float32 like the rest, and the manifest says the output is float32."""
    require_module("tvm")
    import json
    import shutil
    import subprocess
    import sys

    from tests.conftest import _TOOLS, require

    require(shutil.which("nvcc") is not None, "nvcc (make setup installs NVIDIA's nvcc wheels)")
    spec = "gemm:M=128,N=128,K=64,dtype=float16"
    p = subprocess.run([sys.executable, str(_TOOLS / "gpu" / "search_cuda_kernels.py"), str(tmp_path),
                        "--candidates", "3", "--specs", spec], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "did not build" not in p.stdout, p.stdout
    (wk,) = json.loads((tmp_path / "search" / "manifest.json").read_text())
    assert wk["spec"] == spec and wk["output"] == {"shape": [128, 128], "dtype": "float32"}
    ids = [c["id"] for c in wk["candidates"]]
    assert ids == ["dlight-default", "wrong-on-purpose", "ms0", "ms1", "ms2"], ids
    traces = json.loads((tmp_path / "search-traces.json").read_text())
    assert len(traces) == 3 and all("wmma" in t for t in traces.values())
    assert all((tmp_path / "search" / c["so"]).stat().st_size > 0 for c in wk["candidates"])
    assert len(list((tmp_path / "search").glob("*.fatbin"))) >= 4  # nvcc'd here for sm_90
    a, b = (np.load(tmp_path / "search" / n) for n in wk["inputs"])
    assert a.dtype == b.dtype == np.float16
