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
