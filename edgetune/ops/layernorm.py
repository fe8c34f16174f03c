"""layernorm: Y[M,N] = (X - mean) / sqrt(var + 1e-5) * gamma[N] + beta[N] over the last axis
(ONNX LayerNormalization); gamma and beta are the weights. No TFLite form."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from edgetune.ops.base import Op, OpWorkload, TensorSpec

LAYERNORM_EPS = 1e-5  # as ONNX LayerNormalization's default


@dataclass(frozen=True)
class LayerNorm(OpWorkload):
    """Y[M,N] = (X - mean) / sqrt(var + 1e-5) * gamma[N] + beta[N] over the last axis, with the
    population variance (ONNX LayerNormalization, axis=-1). gamma and beta are weight operands.

    flops 7·M·N: per element one addition to the mean's sum, one subtraction, one square and one
    addition to the variance's sum, one multiplication by 1/sqrt(var + eps), one by gamma, one
    addition of beta (the per-row divisions and square roots are not counted)."""

    op: ClassVar[str] = "layernorm"
    M: int
    N: int

    @property
    def inputs(self):
        return (TensorSpec("X", (self.M, self.N), self.dtype), TensorSpec("gamma", (self.N,), self.dtype),
                TensorSpec("beta", (self.N,), self.dtype))

    @property
    def outputs(self):
        return (TensorSpec("Y", (self.M, self.N), self.dtype),)

    def flops(self) -> int:
        return 7 * self.M * self.N

    def prim_func(self):
        from tvm import te

        m, n = self.M, self.N
        x = te.placeholder((m, n), self.dtype, name="X")
        gamma = te.placeholder((n,), self.dtype, name="gamma")
        beta = te.placeholder((n,), self.dtype, name="beta")
        j = te.reduce_axis((0, n), name="j")
        s = te.compute((m,), lambda i: te.sum(x[i, j], axis=j), name="row_sum")
        mean = te.compute((m,), lambda i: s[i] / te.const(float(n), self.dtype), name="mean")
        j2 = te.reduce_axis((0, n), name="j2")
        sq = te.compute((m,), lambda i: te.sum((x[i, j2] - mean[i]) * (x[i, j2] - mean[i]), axis=j2),
                        name="row_sqsum")
        rstd = te.compute((m,), lambda i: te.rsqrt(sq[i] / te.const(float(n), self.dtype)
                                                   + te.const(LAYERNORM_EPS, self.dtype)), name="rstd")
        y = te.compute((m, n), lambda i, k: (x[i, k] - mean[i]) * rstd[i] * gamma[k] + beta[k], name="Y")
        return te.create_prim_func([x, gamma, beta, y])

    def reference(self, inputs):
        x, gamma, beta = (np.asarray(v, np.float64) for v in inputs)
        mean = x.mean(axis=-1, keepdims=True)
        var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
        return [(x - mean) / np.sqrt(var + LAYERNORM_EPS) * gamma + beta]


def onnx_nodes(w, a, b, y):
    from onnx import helper

    return [helper.make_node("LayerNormalization", [s.name for s in w.inputs], [y], axis=-1,
                             epsilon=LAYERNORM_EPS)], []


NUMPY = '''\
rows = out_shape[0]
mean = np.empty((rows, 1), np.float32)
var = np.empty((rows, 1), np.float32)
sq = np.empty(out_shape, np.float32)

def run(inputs):
    x, gamma, beta = inputs
    np.mean(x, axis=1, keepdims=True, out=mean)
    np.subtract(x, mean, out=y)
    np.multiply(y, y, out=sq)
    np.mean(sq, axis=1, keepdims=True, out=var)  # population variance
    np.add(var, np.float32(P["eps"]), out=var)
    np.sqrt(var, out=var)
    np.divide(y, var, out=y)
    np.multiply(y, gamma, out=y)
    np.add(y, beta, out=y)
    return [y]
'''

OP = Op(LayerNorm, weights=lambda w: (1, 2), onnx=onnx_nodes, numpy=NUMPY, torch=True,
        form_params={"eps": LAYERNORM_EPS}, inductor_cpu=True)
