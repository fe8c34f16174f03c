"""softmax: Y[M,N] = softmax(X[M,N]) over the last axis (row-major float32, no weight)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from edgetune.ops.base import FormView, Op, OpWorkload, TensorSpec


def softmax64(x: np.ndarray, mask: np.ndarray | None = None) -> np.ndarray:
    """Numerically stable float64 softmax over the last axis (masked entries are exactly 0)."""
    if mask is not None:
        x = np.where(mask, -np.inf, x)
    m = np.max(x, axis=-1, keepdims=True)
    e = np.exp(x - m)
    return e / np.sum(e, axis=-1, keepdims=True)


@dataclass(frozen=True)
class Softmax(OpWorkload):
    """Y[M,N] = softmax(X[M,N]) over the last axis.

    flops 5·M·N: per element one max comparison, one subtraction, one exp (counted as 1), one
    addition to the row sum and one division."""

    op: ClassVar[str] = "softmax"
    M: int
    N: int

    @property
    def inputs(self):
        return (TensorSpec("X", (self.M, self.N), self.dtype),)

    @property
    def outputs(self):
        return (TensorSpec("Y", (self.M, self.N), self.dtype),)

    def flops(self) -> int:
        return 5 * self.M * self.N

    def prim_func(self):
        from tvm import te

        m, n = self.M, self.N
        x = te.placeholder((m, n), self.dtype, name="X")
        j = te.reduce_axis((0, n), name="j")
        mx = te.compute((m,), lambda i: te.max(x[i, j], axis=j), name="row_max")
        e = te.compute((m, n), lambda i, k: te.exp(x[i, k] - mx[i]), name="exp")
        j2 = te.reduce_axis((0, n), name="j2")
        sm = te.compute((m,), lambda i: te.sum(e[i, j2], axis=j2), name="row_sum")
        y = te.compute((m, n), lambda i, k: e[i, k] / sm[i], name="Y")
        return te.create_prim_func([x, y])

    def reference(self, inputs):
        (x,) = (np.asarray(v, np.float64) for v in inputs)
        return [softmax64(x)]


def onnx_nodes(w, a, b, y):
    from onnx import helper

    return [helper.make_node("Softmax", [a], [y], axis=-1)], []


def tflite_model(w, constants, t, S):
    """SOFTMAX over the last axis (beta 1)."""
    view = FormView(w, {}, tag="tflite")
    x = t.activation(w.inputs[0].name, w.inputs[0].shape)
    y = t.activation(w.outputs[0].name, w.outputs[0].shape)
    o = S.SoftmaxOptionsT()
    o.beta = 1.0
    t.op(S.BuiltinOperator.SOFTMAX, [x], [y], S.BuiltinOptions.SoftmaxOptions, o)
    return t.serialize([x], [y], f"edgetune baseline {w.spec()}"), view


NUMPY = '''\
rows = out_shape[0]
mx = np.empty((rows, 1), np.float32)
sm = np.empty((rows, 1), np.float32)

def run(inputs):
    x = inputs[0]
    np.max(x, axis=1, keepdims=True, out=mx)
    np.subtract(x, mx, out=y)
    np.exp(y, out=y)
    np.sum(y, axis=1, keepdims=True, out=sm)
    np.divide(y, sm, out=y)
    return [y]
'''

OP = Op(Softmax, onnx=onnx_nodes, tflite=tflite_model, numpy=NUMPY, torch=True, inductor_cpu=True)
