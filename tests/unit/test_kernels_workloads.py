"""Operator workloads: spec parsing, stable keys, float64 references, default builds vs reference."""

from __future__ import annotations

import numpy as np
import pytest

from tests.conftest import require_module

from edgetune.errors import UserInputError
from edgetune.kernels.workloads import parse_workload
from edgetune.ops.base import random_inputs
from edgetune.ops.conv2d_nchw import Conv2dNCHW
from edgetune.ops.gemm import Gemm

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
        ("gemm:M=1,N=2,K=3,dtype=bfloat16", ["bfloat16", "no bfloat16 tensor-core intrinsics"]),
        ("gemm:M=1,N=2", ["K", "missing"]),
        ("rmsnorm:N=3", ["'rmsnorm'", "unknown"]),
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
    from edgetune.build.tvm_kernel import HOST_ARCH, build_kernel, elf_machine

    w = parse_workload(spec)
    path = build_kernel(w, {"kind": "llvm", "num-cores": 1}, tmp_path / "k.so")
    assert elf_machine(path) == HOST_ARCH
    lib = tvm.runtime.load_module(str(path))
    inputs = w.random_inputs(0)
    outs = [tvm.runtime.tensor(np.full(s.shape, np.nan, s.dtype)) for s in w.outputs]
    lib["main"](*[tvm.runtime.tensor(x) for x in inputs], *outs)
    ref = w.reference(inputs)[0]
    got = outs[0].numpy()
    assert got.shape == ref.shape
    assert np.abs(got - ref).max() <= 1e-5 * np.abs(ref).max()


def test_random_inputs_of_int_specs():
    from edgetune.ops.base import TensorSpec

    (x,) = random_inputs([TensorSpec("i", (100,), "int32")], 0)
    assert x.dtype == np.int32 and (x < 0).any()


# ---------------------------------------------------------------------------------------------
# Transformer operators: softmax, layernorm, attention
# ---------------------------------------------------------------------------------------------

TRANSFORMER = [
    "softmax:M=37,N=101",
    "layernorm:M=33,N=77",
    "attention:B=1,H=2,S=17,D=16,L=23,causal=1",
    "attention:B=2,H=1,S=5,D=8,L=5,causal=0",
    "attention:B=1,H=2,S=6,D=8,L=6,causal=1",
]


def test_transformer_ops_parse_round_trip():
    from edgetune.ops.attention import Attention
    from edgetune.ops.layernorm import LayerNorm
    from edgetune.ops.softmax import Softmax

    sm = parse_workload("softmax:M=4,N=10")
    assert sm == Softmax(M=4, N=10) and sm.key() == "softmax:M=4,N=10,dtype=float32"
    assert [s.name for s in sm.inputs] == ["X"] and [s.name for s in sm.outputs] == ["Y"]
    ln = parse_workload("layernorm:M=3,N=8")
    assert ln == LayerNorm(M=3, N=8)
    assert [(s.name, s.shape) for s in ln.inputs] == [("X", (3, 8)), ("gamma", (8,)), ("beta", (8,))]
    a = parse_workload("attention:B=1,H=2,S=3,D=4")
    assert a.L == 3 and a.causal == 0  # L defaults to S, stored resolved
    assert a == parse_workload("attention:B=1,H=2,S=3,D=4,L=0") == parse_workload("attention:B=1,H=2,S=3,D=4,L=3")
    assert a.spec() == "attention:B=1,H=2,S=3,D=4,L=3,causal=0"
    assert [(s.name, s.shape) for s in a.inputs] == [("Q", (1, 2, 3, 4)), ("K", (1, 2, 3, 4)), ("V", (1, 2, 3, 4))]
    assert [(s.name, s.shape) for s in a.outputs] == [("O", (1, 2, 3, 4))]
    c = Attention(B=1, H=2, S=3, D=4, L=7, causal=1)
    assert c.inputs[1].shape == (1, 2, 7, 4) and c.outputs[0].shape == (1, 2, 3, 4)
    for spec in TRANSFORMER + ["attention:B=1,H=1,S=4,D=2"]:
        w = parse_workload(spec)
        assert parse_workload(w.spec()) == w and parse_workload(w.spec()).key() == w.key()
    assert len({parse_workload(s).key() for s in TRANSFORMER}) == len(TRANSFORMER)


@pytest.mark.parametrize(
    "spec, words",
    [
        ("softmax:M=3", ["N", "missing"]),
        ("softmax:M=-3,N=4", ["M=-3", ">= 1"]),
        ("layernorm:M=3,N=0", ["N=0"]),
        ("layernorm:M=3,N=4,eps=1", ["'eps'", "unknown"]),
        ("attention:B=1,H=2,S=3", ["D", "missing"]),
        ("attention:B=1,H=2,S=3,D=4,L=-1", ["L=-1"]),
        ("attention:B=1,H=2,S=3,D=4,causal=2", ["causal must be 0 or 1", "2"]),
        ("attention:B=1,H=2,S=3,D=4,causal=-1", ["causal must be 0 or 1"]),
        ("attention:B=1,H=2,S=5,D=4,L=3,causal=1", ["L >= S"]),
        ("attention:B=1,H=2,S=3,D=x", ["'D'", "integer"]),
    ],
)
def test_transformer_op_bad_specs(spec, words):
    with pytest.raises(UserInputError) as err:
        parse_workload(spec)
    for word in words:
        assert word in str(err.value)


def _softmax32_loops(x):
    """Row by row in float32 through the log-sum-exp form (a different formula from the reference's)."""
    x = np.asarray(x, np.float32)
    y = np.empty_like(x)
    for i in range(x.shape[0]):
        m = x[i].max()
        lse = m + np.log(np.sum(np.exp(x[i] - m)))
        y[i] = np.exp(x[i] - lse)
    return y


def _layernorm32(x, g, b):
    x = np.asarray(x, np.float32)
    mean = np.float32(x.sum(axis=1, keepdims=True) / np.float32(x.shape[1]))
    var = np.mean(np.square(x - mean), axis=1, keepdims=True, dtype=np.float32)
    return ((x - mean) / np.sqrt(var + np.float32(1e-5)) * g + b).astype(np.float32)


def _attention32_loops(w, q, k, v):
    """Per (batch, head, query) in float32, the mask built from the decoder convention directly."""
    o = np.empty(w.outputs[0].shape, np.float32)
    for b in range(w.B):
        for h in range(w.H):
            for i in range(w.S):
                keys = range(w.L) if not w.causal else range(i + (w.L - w.S) + 1)
                s = np.array([np.dot(q[b, h, i], k[b, h, j]) for j in keys], np.float32) / np.float32(np.sqrt(w.D))
                p = np.exp(s - s.max())
                p /= p.sum()
                o[b, h, i] = p @ v[b, h, list(keys)]
    return o


def _float32_form(w, xs):
    if w.op == "softmax":
        return [_softmax32_loops(xs[0])]
    if w.op == "layernorm":
        return [_layernorm32(*xs)]
    return [_attention32_loops(w, *xs)]


@pytest.mark.parametrize("spec", TRANSFORMER)
def test_transformer_references_agree_with_float32_formulas(spec):
    w = parse_workload(spec)
    for seed in range(3):
        xs = w.random_inputs(seed)
        ref = w.reference(xs)
        assert len(ref) == 1 and ref[0].shape == w.outputs[0].shape and ref[0].dtype == np.float64
        assert np.isfinite(ref[0]).all()
        got = _float32_form(w, xs)[0]
        assert np.abs(got - ref[0]).max() <= 1e-5 * max(1.0, np.abs(ref[0]).max()), spec
    if w.op == "softmax":
        np.testing.assert_allclose(ref[0].sum(axis=1), 1.0, rtol=1e-12)


def test_transformer_references_stay_finite_on_huge_inputs():
    sm = parse_workload("softmax:M=2,N=5")
    x = np.array([[1e4, -1e4, 3e4, 0, 1], [-3e38, -3e38, -3e38, -3e38, -3e38]], np.float32)
    y = sm.reference([x])[0]
    assert np.isfinite(y).all() and y[0, 2] == 1.0 and np.allclose(y[1], 0.2)
    a = parse_workload("attention:B=1,H=1,S=3,D=2,L=4,causal=1")
    q, k, v = (x * 1e3 for x in a.random_inputs(1))
    o = a.reference([q, k, v])[0]
    assert np.isfinite(o).all()


def test_attention_causal_mask_convention():
    """causal=1: query i sees keys j <= i + (L - S): the last query sees every key, the first L - S + 1."""
    a = parse_workload("attention:B=1,H=1,S=3,D=2,L=5,causal=1")
    assert a.mask().tolist() == [[False, False, False, True, True], [False, False, False, False, True],
                                 [False] * 5]
    q, k, v = a.random_inputs(0)
    v2 = v.copy()
    v2[0, 0, 4] += 100.0  # a key only the last query sees
    o1, o2 = a.reference([q, k, v])[0], a.reference([q, k, v2])[0]
    assert np.array_equal(o1[0, 0, :2], o2[0, 0, :2]) and not np.allclose(o1[0, 0, 2], o2[0, 0, 2])


def test_transformer_flops():
    assert parse_workload("softmax:M=3,N=7").flops() == 5 * 21
    assert parse_workload("layernorm:M=3,N=7").flops() == 7 * 21
    # 4·B·H·S·L·D (the two matmuls) + 6·B·H·S·L (scale and softmax)
    assert parse_workload("attention:B=2,H=3,S=5,D=8,L=7").flops() == 4 * 2 * 3 * 5 * 7 * 8 + 6 * 2 * 3 * 5 * 7
    # causal: only the visible (query, key) pairs: S·(L-S) + S·(S+1)/2 per head
    causal = parse_workload("attention:B=1,H=1,S=4,D=8,L=6,causal=1")
    assert causal.visible_pairs() == int((~causal.mask()).sum()) == 4 * 2 + 10
    assert causal.flops() == 18 * (4 * 8 + 6)


def _verify(w, xs, outs):
    from edgetune.kernels.measurement import verify_run
    from edgetune.kernels.search import KernelRun

    run = KernelRun("ok", samples_ns=[1000] * 5, outputs=[np.asarray(o, np.float32) for o in outs],
                    repeat_outputs=[np.asarray(o, np.float32).copy() for o in outs])
    return verify_run(run, w, xs, w.reference(xs))


@pytest.mark.parametrize("spec", TRANSFORMER[:3])
def test_verifier_passes_float32_and_rejects_float16(spec):
    """An honest float32 implementation passes the real verifier on odd sizes with the seeded
    inputs (negatives, 100x outliers); the same computation rounded through float16 does not."""
    w = parse_workload(spec)
    for seed in range(3):
        xs = w.random_inputs(seed)
        honest = _float32_form(w, xs)
        v = _verify(w, xs, honest)
        assert v.ok, (spec, seed, v.reason)
        half = _float32_form(w, [x.astype(np.float16).astype(np.float32) for x in xs])
        half = [o.astype(np.float16).astype(np.float32) for o in half]
        v = _verify(w, xs, half)
        assert not v.ok and v.code in ("imprecise", "wrong-output"), (spec, seed, v.code, v.reason)


TRANSFORMER_TINY = ["softmax:M=5,N=9", "layernorm:M=4,N=11", "attention:B=1,H=2,S=3,D=4,L=5,causal=1",
                    "attention:B=2,H=1,S=4,D=3"]


@pytest.mark.parametrize("spec", TRANSFORMER_TINY)
def test_transformer_unscheduled_build_matches_reference(spec, tmp_path):
    """The TE PrimFunc builds with TVM (default schedule, as MetaSchedule starts from) and computes the op."""
    from edgetune.build.tvm_kernel import build_kernel

    w = parse_workload(spec)
    lib = tvm.runtime.load_module(str(build_kernel(w, {"kind": "llvm", "num-cores": 1}, tmp_path / "k.so")))
    for seed in range(2):
        inputs = w.random_inputs(seed)
        outs = [tvm.runtime.tensor(np.full(s.shape, np.nan, s.dtype)) for s in w.outputs]
        lib["main"](*[tvm.runtime.tensor(x) for x in inputs], *outs)
        ref = w.reference(inputs)[0]
        got = outs[0].numpy()
        assert got.shape == ref.shape
        assert np.abs(got - ref).max() <= 1e-5 * max(1.0, np.abs(ref).max()), spec


def test_attention_metaschedule_tuning_gives_a_verified_kernel(tmp_path):
    """A short MetaSchedule search over the fused attention PrimFunc runs to the end (its block
    structure once made a schedule rule abort the search) and selects a kernel that verifies on
    fresh inputs."""
    from edgetune.kernels.search import LocalMeasure, tune_workload, verify_run

    w = parse_workload("attention:B=1,H=2,S=4,D=8,L=6,causal=1")
    with LocalMeasure(num_threads=2, warmup_ms=2, budget_ms=5, timeout_s=60) as m:
        out = tune_workload(w, {"kind": "llvm", "num-cores": 2}, 4, m, tmp_path / "db", fingerprint="test")
        assert out.verified and out.trials_measured >= 1, out.reason
        x = w.random_inputs(42)
        assert verify_run(m(str(out.artifact_path), x, list(w.outputs)), w, x, w.reference(x)).ok
