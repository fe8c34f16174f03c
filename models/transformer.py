"""One pre-LayerNorm transformer encoder block.

    h   = x + Wo . MHA(LN1(x))            4 heads of 32, softmax(q k^T / sqrt(32)) v
    out = h + W2 . GELU(W1 . LN2(h))      128 -> 512 -> 128, exact (erf) GELU

ONNX (opset 17): input "tokens_embed" float32 [batch, seq, 128] with dim_params "batch" and
"seq"; output "hidden" float32 [batch, seq, 128]. Built from ops that onnxruntime's CPU provider
and TVM Relax's ONNX importer both handle: LayerNormalization, MatMul, Add, Mul, Reshape,
Transpose, Softmax, Erf. The head split/merge reshapes use ``0`` ("copy this dim") for batch
and seq so the same graph works for any batch/seq.

TFLite: same tensors and layout with static shapes [batch, seq, 128]. LayerNorm is decomposed
(MEAN/SUB/MUL/ADD/RSQRT), projections are FULLY_CONNECTED (keep_num_dims), attention is
RESHAPE/TRANSPOSE/BATCH_MATMUL/SOFTMAX and the activation is the builtin GELU (exact).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import onnx

from models._onnx import OnnxGraph, float_input

SEED = 20240612
D_MODEL = 128
HEADS = 4
HEAD_DIM = D_MODEL // HEADS
D_FF = 512
EPS = 1e-5

INPUT_NAME = "tokens_embed"
OUTPUT_NAME = "hidden"


@dataclass(frozen=True)
class Params:
    ln1_g: np.ndarray
    ln1_b: np.ndarray
    wq: np.ndarray  # [in, out] (MatMul layout)
    bq: np.ndarray
    wk: np.ndarray
    bk: np.ndarray
    wv: np.ndarray
    bv: np.ndarray
    wo: np.ndarray
    bo: np.ndarray
    ln2_g: np.ndarray
    ln2_b: np.ndarray
    w1: np.ndarray
    b1: np.ndarray
    w2: np.ndarray
    b2: np.ndarray


def params() -> Params:
    """The seeded weights; identical on every call and platform (numpy PCG64)."""
    rng = np.random.default_rng(SEED)

    def w(n_in: int, n_out: int, gain: float = 1.0) -> np.ndarray:
        return (rng.standard_normal((n_in, n_out)) * (gain / math.sqrt(n_in))).astype(np.float32)

    def b(n: int, scale: float = 0.02) -> np.ndarray:
        return (rng.standard_normal(n) * scale).astype(np.float32)

    def gamma(n: int) -> np.ndarray:
        return (1.0 + rng.standard_normal(n) * 0.1).astype(np.float32)

    return Params(
        ln1_g=gamma(D_MODEL), ln1_b=b(D_MODEL),
        wq=w(D_MODEL, D_MODEL), bq=b(D_MODEL),
        wk=w(D_MODEL, D_MODEL), bk=b(D_MODEL),
        wv=w(D_MODEL, D_MODEL), bv=b(D_MODEL),
        wo=w(D_MODEL, D_MODEL, 0.5), bo=b(D_MODEL),
        ln2_g=gamma(D_MODEL), ln2_b=b(D_MODEL),
        w1=w(D_MODEL, D_FF, math.sqrt(2.0)), b1=b(D_FF),
        w2=w(D_FF, D_MODEL, 0.5), b2=b(D_MODEL),
    )


# ---------------------------------------------------------------------------------------------
# ONNX
# ---------------------------------------------------------------------------------------------


def onnx_model() -> onnx.ModelProto:
    p = params()
    g = OnnxGraph("edgetune_transformer")
    split_shape = g.const("attn.split_shape", np.array([0, 0, HEADS, HEAD_DIM], np.int64))
    merge_shape = g.const("attn.merge_shape", np.array([0, 0, D_MODEL], np.int64))
    scale = g.const("attn.scale", np.array(1.0 / math.sqrt(HEAD_DIM), np.float32))

    def linear(x: str, name: str, wt: np.ndarray, bias: np.ndarray) -> str:
        y = g.op("MatMul", [x, g.const(f"{name}.weight", wt)])
        return g.op("Add", [y, g.const(f"{name}.bias", bias)])

    def layernorm(x: str, name: str, gamma: np.ndarray, beta: np.ndarray) -> str:
        return g.op("LayerNormalization",
                    [x, g.const(f"{name}.weight", gamma), g.const(f"{name}.bias", beta)],
                    axis=-1, epsilon=EPS)

    def heads(x: str, perm: list[int]) -> str:
        return g.op("Transpose", [g.op("Reshape", [x, split_shape])], perm=perm)

    x = INPUT_NAME
    h = layernorm(x, "ln1", p.ln1_g, p.ln1_b)
    q = heads(linear(h, "attn.q", p.wq, p.bq), [0, 2, 1, 3])  # [B, H, S, Dh]
    k = heads(linear(h, "attn.k", p.wk, p.bk), [0, 2, 3, 1])  # [B, H, Dh, S]
    v = heads(linear(h, "attn.v", p.wv, p.bv), [0, 2, 1, 3])  # [B, H, S, Dh]
    s = g.op("Mul", [g.op("MatMul", [q, k]), scale])  # [B, H, S, S]
    a = g.op("Softmax", [s], axis=-1)
    o = g.op("Transpose", [g.op("MatMul", [a, v])], perm=[0, 2, 1, 3])  # [B, S, H, Dh]
    o = g.op("Reshape", [o, merge_shape])
    x1 = g.op("Add", [x, linear(o, "attn.out", p.wo, p.bo)])

    h2 = layernorm(x1, "ln2", p.ln2_g, p.ln2_b)
    m = linear(h2, "mlp.fc1", p.w1, p.b1)
    # exact GELU: 0.5 * m * (1 + erf(m / sqrt(2)))
    inv_sqrt2 = g.const("gelu.inv_sqrt2", np.array(1 / math.sqrt(2), np.float32))
    e = g.op("Erf", [g.op("Mul", [m, inv_sqrt2])])
    e = g.op("Add", [e, g.const("gelu.one", np.array(1.0, np.float32))])
    m = g.op("Mul", [g.op("Mul", [m, e]), g.const("gelu.half", np.array(0.5, np.float32))])
    m = linear(m, "mlp.fc2", p.w2, p.b2)
    g.op("Add", [x1, m], out=OUTPUT_NAME)
    return g.model(
        [float_input(INPUT_NAME, ["batch", "seq", D_MODEL])],
        [float_input(OUTPUT_NAME, ["batch", "seq", D_MODEL])],
        doc="edgetune bundled transformer encoder block (seeded random weights)",
    )


# ---------------------------------------------------------------------------------------------
# TFLite
# ---------------------------------------------------------------------------------------------


def tflite_bytes(batch: int = 1, seq: int = 128) -> bytes:
    from models._tflite import S, TFLiteGraph

    p = params()
    t = TFLiteGraph()
    op, opts = S.BuiltinOperator, S.BuiltinOptions
    NONE = S.ActivationFunctionType.NONE
    B, L, D = batch, seq, D_MODEL

    def act(name: str, shape: tuple[int, ...]) -> int:
        return t.activation(name, shape)

    def binary(code: int, name: str, a: int, b: int, shape: tuple[int, ...]) -> int:
        y = act(name, shape)
        if code == op.ADD:
            o, ot = S.AddOptionsT(), opts.AddOptions
        elif code == op.SUB:
            o, ot = S.SubOptionsT(), opts.SubOptions
        else:
            o, ot = S.MulOptionsT(), opts.MulOptions
        o.fusedActivationFunction = NONE
        t.op(code, [a, b], [y], ot, o)
        return y

    def scalar(name: str, v: float) -> int:
        return t.const(name, np.array([v], np.float32))

    def mean_last(name: str, x: int, shape: tuple[int, ...]) -> int:
        y = act(name, shape[:-1] + (1,))
        axes = t.const(f"{name}.axes", np.array([len(shape) - 1], np.int32))
        o = S.ReducerOptionsT()
        o.keepDims = True
        t.op(op.MEAN, [x, axes], [y], opts.ReducerOptions, o)
        return y

    def layernorm(name: str, x: int, gamma: np.ndarray, beta: np.ndarray) -> int:
        shp = (B, L, D)
        mu = mean_last(f"{name}.mean", x, shp)
        d = binary(op.SUB, f"{name}.centered", x, mu, shp)
        var = mean_last(f"{name}.var", binary(op.MUL, f"{name}.sq", d, d, shp), shp)
        ve = binary(op.ADD, f"{name}.var_eps", var, scalar(f"{name}.eps", EPS), (B, L, 1))
        r = act(f"{name}.rstd", (B, L, 1))
        t.op(op.RSQRT, [ve], [r])
        y = binary(op.MUL, f"{name}.norm", d, r, shp)
        y = binary(op.MUL, f"{name}.scaled", y, t.const(f"{name}.weight", gamma), shp)
        return binary(op.ADD, f"{name}.out", y, t.const(f"{name}.bias", beta), shp)

    def linear(name: str, x: int, wt: np.ndarray, bias: np.ndarray) -> int:
        y = act(f"{name}.out", (B, L, wt.shape[1]))
        w = t.const(f"{name}.weight", np.ascontiguousarray(wt.T))  # FC wants [out, in]
        b = t.const(f"{name}.bias", bias)
        o = S.FullyConnectedOptionsT()
        o.fusedActivationFunction = NONE
        o.keepNumDims = True
        # keep_num_dims needs FULLY_CONNECTED version 5 (what the TF converter records)
        t.op(op.FULLY_CONNECTED, [x, w, b], [y], opts.FullyConnectedOptions, o, version=5)
        return y

    def reshape(name: str, x: int, shape: tuple[int, ...]) -> int:
        y = act(name, shape)
        s = t.const(f"{name}.shape", np.array(shape, np.int32))
        o = S.ReshapeOptionsT()
        o.newShape = list(shape)
        t.op(op.RESHAPE, [x, s], [y], opts.ReshapeOptions, o)
        return y

    def transpose(name: str, x: int, perm: tuple[int, ...]) -> int:
        src = t.tensors[x].shape
        y = act(name, tuple(src[i] for i in perm))
        pt = t.const(f"{name}.perm", np.array(perm, np.int32))
        t.op(op.TRANSPOSE, [x, pt], [y], opts.TransposeOptions, S.TransposeOptionsT())
        return y

    def bmm(name: str, a: int, b: int, shape: tuple[int, ...], adj_y: bool) -> int:
        y = act(name, shape)
        o = S.BatchMatMulOptionsT()
        o.adjX, o.adjY = False, adj_y
        t.op(op.BATCH_MATMUL, [a, b], [y], opts.BatchMatMulOptions, o)
        return y

    def heads(name: str, x: int) -> int:  # [B, L, D] -> [B, H, L, Dh]
        r = reshape(f"{name}.split", x, (B, L, HEADS, HEAD_DIM))
        return transpose(f"{name}.heads", r, (0, 2, 1, 3))

    x = act(INPUT_NAME, (B, L, D))
    h = layernorm("ln1", x, p.ln1_g, p.ln1_b)
    q = heads("attn.q", linear("attn.q", h, p.wq, p.bq))
    k = heads("attn.k", linear("attn.k", h, p.wk, p.bk))
    v = heads("attn.v", linear("attn.v", h, p.wv, p.bv))
    s = bmm("attn.scores", q, k, (B, HEADS, L, L), adj_y=True)
    s = binary(op.MUL, "attn.scaled", s, scalar("attn.scale", 1.0 / math.sqrt(HEAD_DIM)),
               (B, HEADS, L, L))
    a = act("attn.probs", (B, HEADS, L, L))
    so = S.SoftmaxOptionsT()
    so.beta = 1.0
    t.op(op.SOFTMAX, [s], [a], opts.SoftmaxOptions, so)
    o = bmm("attn.context", a, v, (B, HEADS, L, HEAD_DIM), adj_y=False)
    o = transpose("attn.merge_t", o, (0, 2, 1, 3))
    o = reshape("attn.merge", o, (B, L, D))
    x1 = binary(op.ADD, "attn.residual", x, linear("attn.out", o, p.wo, p.bo), (B, L, D))

    h2 = layernorm("ln2", x1, p.ln2_g, p.ln2_b)
    m = linear("mlp.fc1", h2, p.w1, p.b1)
    gm = act("mlp.gelu", (B, L, D_FF))
    go = S.GeluOptionsT()
    go.approximate = False
    t.op(op.GELU, [m], [gm], opts.GeluOptions, go)
    m = linear("mlp.fc2", gm, p.w2, p.b2)
    out = binary(op.ADD, OUTPUT_NAME, x1, m, (B, L, D))
    return t.serialize([x], [out], "edgetune-models transformer block (static shapes)")
