"""Operator workloads: spec parsing, stable keys, float64 references, default builds vs reference."""

from __future__ import annotations

import numpy as np
import pytest

from tests.conftest import require_module

from edgetune.errors import UserInputError
from edgetune.kernels.workloads import (
    Conv2dNCHW,
    Gemm,
    parse_workload,
    random_inputs,
)

tvm = require_module("tvm")

TINY = [
    "gemm:M=7,N=12,K=5",
    "batch_matmul:B=2,M=4,N=6,K=5",
    "batch_matmul:B=2,M=4,N=6,K=5,TB=1",
    "conv2d_nchw:N=1,C=3,H=7,W=6,K=4,R=3,S=3,stride=2,pad=1",
    "conv2d_nhwc:N=2,C=3,H=6,W=7,K=4,R=3,S=3,stride=1,pad=1",
    "depthwise_conv2d_nchw:N=1,C=3,H=7,W=7,R=3,S=3,stride=2,pad=1",
    "conv2d_nchw:N=1,C=8,H=5,W=5,K=6,R=1,S=1",
]


def test_parse_round_trip_and_stable_key():
    w = parse_workload("gemm:M=197,N=3072,K=768")
    assert w == Gemm(M=197, N=3072, K=768)
    assert w.key() == "gemm:M=197,N=3072,K=768,dtype=float32"
    assert parse_workload(w.spec()) == w
    c = parse_workload("conv2d:N=1,C=3,H=8,W=8,K=4,R=3,S=3,pad=1")  # alias, default stride
    assert isinstance(c, Conv2dNCHW) and c.stride == 1 and c.P == 8
    assert c.key() == "conv2d_nchw:N=1,C=3,H=8,W=8,K=4,R=3,S=3,stride=1,pad=1,dtype=float32"
    assert len({parse_workload(s).key() for s in TINY}) == len(TINY)


@pytest.mark.parametrize(
    "spec, words",
    [
        ("gemm:M=1,N=2,K=3,Q=4", ["'Q'", "gemm"]),
        ("gemm:M=1,N=2", ["K", "missing"]),
        ("softmax:N=3", ["'softmax'", "unknown"]),
        ("gemm:M=one,N=2,K=3", ["'M'", "integer"]),
        ("gemm:M=0,N=2,K=3", ["M=0"]),
        ("gemm M=1", ["expected OP:KEY=VALUE"]),
        ("conv2d_nchw:N=1,C=1,H=2,W=2,K=1,R=3,S=3", ["empty"]),
        ("batch_matmul:B=1,M=1,N=1,K=1,TB=2", ["TB"]),
    ],
)
def test_parse_errors_name_the_problem(spec, words):
    with pytest.raises(UserInputError) as err:
        parse_workload(spec)
    for word in words:
        assert word in str(err.value)


def test_random_inputs_have_negatives_and_large_values():
    w = parse_workload("gemm:M=64,N=64,K=64")
    a, b = w.random_inputs(0)
    assert a.dtype == np.float32 and (a < 0).any() and np.abs(a).max() > 10
    again = w.random_inputs(0)
    assert np.array_equal(a, again[0])
    assert not np.array_equal(a, w.random_inputs(1)[0])


def _naive_conv_nchw(x, w, stride, pad):
    n, c, h, wd = x.shape
    k, _, r, s = w.shape
    xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    p, q = (h + 2 * pad - r) // stride + 1, (wd + 2 * pad - s) // stride + 1
    y = np.zeros((n, k, p, q))
    for i in range(p):
        for j in range(q):
            patch = xp[:, :, i * stride:i * stride + r, j * stride:j * stride + s]
            y[:, :, i, j] = np.einsum("ncrs,kcrs->nk", patch, w)
    return y


def test_references_agree_with_independent_formulas():
    conv = parse_workload("conv2d_nchw:N=2,C=3,H=7,W=6,K=4,R=3,S=2,stride=2,pad=1")
    x, w = conv.random_inputs(3)
    x64, w64 = x.astype(np.float64), w.astype(np.float64)
    np.testing.assert_allclose(conv.reference([x, w])[0], _naive_conv_nchw(x64, w64, 2, 1), rtol=1e-12, atol=1e-9)
    nhwc = parse_workload("conv2d_nhwc:N=2,C=3,H=7,W=6,K=4,R=3,S=2,stride=2,pad=1")
    xh = np.transpose(x, (0, 2, 3, 1)).copy()
    wh = np.transpose(w, (2, 3, 1, 0)).copy()  # KCRS -> RSCK
    y = nhwc.reference([xh, wh])[0]
    np.testing.assert_allclose(np.transpose(y, (0, 3, 1, 2)), _naive_conv_nchw(x64, w64, 2, 1), rtol=1e-12, atol=1e-9)
    dw = parse_workload("depthwise_conv2d_nchw:N=1,C=3,H=6,W=6,R=3,S=3,stride=1,pad=1")
    xd, wd = dw.random_inputs(4)
    want = np.concatenate(
        [_naive_conv_nchw(xd[:, c:c + 1].astype(np.float64), wd[c:c + 1].astype(np.float64), 1, 1) for c in range(3)], axis=1
    )
    np.testing.assert_allclose(dw.reference([xd, wd])[0], want, rtol=1e-12, atol=1e-9)
    bmm = parse_workload("batch_matmul:B=2,M=3,N=4,K=5,TB=1")
    a, b = bmm.random_inputs(5)
    np.testing.assert_allclose(bmm.reference([a, b])[0], np.stack([a[i].astype(float) @ b[i].astype(float).T for i in range(2)]))


def test_flops():
    assert parse_workload("gemm:M=2,N=3,K=4").flops() == 48
    assert parse_workload("conv2d_nchw:N=1,C=3,H=8,W=8,K=4,R=3,S=3,pad=1").flops() == 2 * 4 * 64 * 27
    assert parse_workload("depthwise_conv2d_nchw:N=1,C=3,H=8,W=8,R=3,S=3,pad=1").flops() == 2 * 3 * 64 * 9


@pytest.mark.parametrize("spec", TINY)
def test_default_build_matches_float64_reference(spec, tmp_path):
    from edgetune.build.tvm_kernel import _HOST_ARCH, build_kernel, elf_machine

    w = parse_workload(spec)
    path = build_kernel(w, {"kind": "llvm", "num-cores": 1}, tmp_path / "k.so")
    assert elf_machine(path) == _HOST_ARCH
    lib = tvm.runtime.load_module(str(path))
    inputs = w.random_inputs(0)
    outs = [tvm.runtime.tensor(np.full(s.shape, np.nan, s.dtype)) for s in w.outputs]
    lib["main"](*[tvm.runtime.tensor(x) for x in inputs], *outs)
    ref = w.reference(inputs)[0]
    got = outs[0].numpy()
    assert got.shape == ref.shape
    assert np.abs(got - ref).max() <= 1e-5 * np.abs(ref).max()


def test_random_inputs_of_int_specs():
    from edgetune.kernels.workloads import TensorSpec

    (x,) = random_inputs([TensorSpec("i", (100,), "int32")], 0)
    assert x.dtype == np.int32 and (x < 0).any()
