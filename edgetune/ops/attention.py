"""attention: O[B,H,S,D] = softmax(Q · Kᵀ / sqrt(D) + mask) · V, optionally causal; Q, K and V
are activations (no weight). No TFLite form."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from edgetune.errors import UserInputError
from edgetune.ops.base import Op, OpWorkload, TensorSpec
from edgetune.ops.softmax import softmax64


@dataclass(frozen=True)
class Attention(OpWorkload):
    """O[B,H,S,D] = softmax(Q[B,H,S,D] · K[B,H,L,D]ᵀ / sqrt(D) + mask) · V[B,H,L,D].

    ``L`` (the key/value length) defaults to S (``L=0`` in a spec means "same as S"; the value is
    stored resolved, so the spec round-trips). ``causal=1`` masks key j > i + (L - S): query i sees
    the L - S past keys and itself (the decoder convention); it needs L >= S (else a query row
    would see no key).

    flops: 4·D per visible (query, key) pair (Q·Kᵀ and P·V, 2 each) plus 6 per visible pair for
    the scaling and the softmax (Softmax's 5 + the 1/sqrt(D) multiplication) — 4·B·H·S·L·D +
    6·B·H·S·L without a mask. With causal=1 only the visible pairs count (S·(L-S) + S·(S+1)/2 per
    head, the FlashAttention convention): a kernel that skips the masked blocks does not exceed
    the roofline on paper."""

    op: ClassVar[str] = "attention"
    zero_ok: ClassVar[frozenset[str]] = frozenset({"L", "causal"})
    B: int
    H: int
    S: int
    D: int
    L: int = 0
    causal: int = 0

    def __post_init__(self) -> None:
        if isinstance(self.L, int) and not isinstance(self.L, bool) and self.L == 0:
            object.__setattr__(self, "L", self.S)  # canonical: "same as S" is stored as S
        if isinstance(self.causal, int) and not isinstance(self.causal, bool) and self.causal not in (0, 1):
            raise UserInputError(f"attention: causal must be 0 or 1, got {self.causal!r}")
        super().__post_init__()
        if self.causal and self.L < self.S:
            raise UserInputError(f"attention: causal=1 needs L >= S (query i sees keys j <= i + L - S), "
                                 f"got S={self.S}, L={self.L}")

    @property
    def inputs(self):
        return (TensorSpec("Q", (self.B, self.H, self.S, self.D), self.dtype),
                TensorSpec("K", (self.B, self.H, self.L, self.D), self.dtype),
                TensorSpec("V", (self.B, self.H, self.L, self.D), self.dtype))

    @property
    def outputs(self):
        return (TensorSpec("O", (self.B, self.H, self.S, self.D), self.dtype),)

    def visible_pairs(self) -> int:
        """(query, key) pairs per head the mask leaves visible."""
        if not self.causal:
            return self.S * self.L
        return self.S * (self.L - self.S) + self.S * (self.S + 1) // 2

    def mask(self) -> np.ndarray | None:
        """[S, L] bool, True where the key is masked (None without causal)."""
        if not self.causal:
            return None
        i = np.arange(self.S)[:, None]
        j = np.arange(self.L)[None, :]
        return j > i + (self.L - self.S)

    def flops(self) -> int:
        return self.B * self.H * self.visible_pairs() * (4 * self.D + 6)

    def prim_func(self):
        import math

        from tvm import te

        bb, hh, ss, ll, dd = self.B, self.H, self.S, self.L, self.D
        dt = self.dtype
        q = te.placeholder((bb, hh, ss, dd), dt, name="Q")
        k = te.placeholder((bb, hh, ll, dd), dt, name="K")
        v = te.placeholder((bb, hh, ll, dd), dt, name="V")
        scale = te.const(1.0 / math.sqrt(dd), dt)
        d = te.reduce_axis((0, dd), name="d")
        # raw Q·Kᵀ; the 1/sqrt(D) scale (> 0) is applied inside exp: exp(scale·(s - max s))
        sc = te.compute((bb, hh, ss, ll), lambda b, h, i, j: te.sum(q[b, h, i, d] * k[b, h, j, d], axis=d),
                        name="scores")
        past = ll - ss

        def masked(i, j):
            return j > i + past

        j1 = te.reduce_axis((0, ll), name="j1")
        j2 = te.reduce_axis((0, ll), name="j2")
        if self.causal:
            low, zero = te.min_value(dt), te.const(0.0, dt)
            mx = te.compute((bb, hh, ss), lambda b, h, i: te.max(
                te.if_then_else(masked(i, j1), low, sc[b, h, i, j1]), axis=j1), name="row_max")

            def ex(b, h, i, j):
                return te.if_then_else(masked(i, j), zero, te.exp((sc[b, h, i, j] - mx[b, h, i]) * scale))
        else:
            mx = te.compute((bb, hh, ss), lambda b, h, i: te.max(sc[b, h, i, j1], axis=j1), name="row_max")

            def ex(b, h, i, j):
                return te.exp((sc[b, h, i, j] - mx[b, h, i]) * scale)
        # exp is evaluated in the row sum and again in the probabilities (no separate exp tensor):
        # with P an elementwise block MetaSchedule inlines it into P·V and then places the row sum
        # inside P·V's reduction loops, where TVM 0.27 decomposes its init outside them (wrong
        # sums); a block holding exp is never inlined on CPU, so P stays a block of its own.
        sm = te.compute((bb, hh, ss), lambda b, h, i: te.sum(ex(b, h, i, j2), axis=j2), name="row_sum")
        p = te.compute((bb, hh, ss, ll), lambda b, h, i, j: ex(b, h, i, j) / sm[b, h, i], name="probs")
        # O is the last reduction with no epilogue: normalising after P·V gives O's block two
        # producers, which MetaSchedule's tiling cannot place (a ScheduleError aborts the search)
        j3 = te.reduce_axis((0, ll), name="j3")
        o = te.compute((bb, hh, ss, dd), lambda b, h, i, c: te.sum(p[b, h, i, j3] * v[b, h, j3, c], axis=j3),
                       name="O")
        return te.create_prim_func([q, k, v, o])

    def reference(self, inputs):
        q, k, v = (np.asarray(x, np.float64) for x in inputs)
        s = np.matmul(q, np.swapaxes(k, -1, -2)) / np.sqrt(self.D)
        return [np.matmul(softmax64(s, self.mask()), v)]


def onnx_nodes(w, a, b, y):
    """The graph an exported model has: MatMul(Q, Transpose(K)) · 1/sqrt(D) [+ causal mask] →
    Softmax → MatMul(V), its scale and mask initializers of the graph."""
    from onnx import helper, numpy_helper

    nodes, extra = [], []
    q, k, v = (s.name for s in w.inputs)
    extra.append(numpy_helper.from_array(np.array(1.0 / np.sqrt(w.D), np.float32), "scale"))
    nodes.append(helper.make_node("Transpose", [k], ["K_t"], perm=[0, 1, 3, 2]))
    nodes.append(helper.make_node("MatMul", [q, "K_t"], ["qk"]))
    nodes.append(helper.make_node("Mul", ["qk", "scale"], ["scores"]))
    scores = "scores"
    if w.causal:  # -inf where key j > i + (L - S): exp gives exactly 0 there
        mask = np.where(w.mask(), np.float32(-np.inf), np.float32(0.0)).astype(np.float32)
        extra.append(numpy_helper.from_array(mask, "causal_mask"))
        nodes.append(helper.make_node("Add", ["scores", "causal_mask"], ["scores_masked"]))
        scores = "scores_masked"
    nodes.append(helper.make_node("Softmax", [scores], ["probs"], axis=-1))
    nodes.append(helper.make_node("MatMul", ["probs", v], [y]))
    return nodes, extra


NUMPY = '''\
b_, h_, s_, d_, l_ = (P[k] for k in ("B", "H", "S", "D", "L"))
scores = np.empty((b_, h_, s_, l_), np.float32)
mx = np.empty((b_, h_, s_, 1), np.float32)
sm = np.empty((b_, h_, s_, 1), np.float32)
scale = np.float32(1.0 / np.sqrt(d_))
masked = np.arange(l_)[None, :] > np.arange(s_)[:, None] + (l_ - s_) if P["causal"] else None

def run(inputs):
    q, k, v = inputs
    np.matmul(q, k.transpose(0, 1, 3, 2), out=scores)
    np.multiply(scores, scale, out=scores)
    if masked is not None:
        np.copyto(scores, np.float32(-np.inf), where=masked)
    np.max(scores, axis=-1, keepdims=True, out=mx)
    np.subtract(scores, mx, out=scores)
    np.exp(scores, out=scores)
    np.sum(scores, axis=-1, keepdims=True, out=sm)
    np.matmul(scores, v, out=y)
    np.divide(y, sm, out=y)  # normalise the S x D output, not the S x L probabilities
    return [y]
'''

OP = Op(Attention, onnx=onnx_nodes, numpy=NUMPY, torch=True, inductor_cpu=True)
