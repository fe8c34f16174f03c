"""gemm: C[M,N] = A[M,K] @ B[K,N]; B is the weight. float32, or float16 operands accumulated in
float32 (the mixed-precision form tensor cores compute)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from edgetune.ops.base import FormView, Op, OpWorkload, TensorSpec


@dataclass(frozen=True)
class Gemm(OpWorkload):
    """C[M,N] = A[M,K] @ B[K,N]."""

    op: ClassVar[str] = "gemm"
    dtypes: ClassVar[tuple[str, ...]] = ("float32", "float16")
    M: int
    N: int
    K: int

    @property
    def inputs(self) -> tuple[TensorSpec, ...]:
        return (TensorSpec("A", (self.M, self.K), self.dtype), TensorSpec("B", (self.K, self.N), self.dtype))

    @property
    def outputs(self) -> tuple[TensorSpec, ...]:
        return (TensorSpec("C", (self.M, self.N), self.acc_dtype),)

    def flops(self) -> int:
        return 2 * self.M * self.N * self.K

    def prim_func(self):
        from tvm import te

        a = te.placeholder((self.M, self.K), self.dtype, name="A")
        b = te.placeholder((self.K, self.N), self.dtype, name="B")
        k = te.reduce_axis((0, self.K), name="k")
        c = te.compute((self.M, self.N), lambda i, j: te.sum(self._mac(a[i, k], b[k, j]), axis=k), name="C")
        return te.create_prim_func([a, b, c])

    def reference(self, inputs):
        a, b = (np.asarray(x, np.float64) for x in inputs)
        return [a @ b]


def onnx_nodes(w, a, b, y):
    from onnx import helper

    return [helper.make_node("MatMul", [a, b], [y])], []


def tflite_model(w, constants, t, S):
    """FULLY_CONNECTED with the constant weight (XNNPACK's GEMM)."""
    view = FormView(w, constants, tag="tflite")
    a = t.activation(w.inputs[0].name, (w.M, w.K))
    wt = t.const("W", np.ascontiguousarray(constants[1].T))  # FULLY_CONNECTED wants [out, in]
    bias = t.const("bias", np.zeros(w.N, np.float32))
    y = t.activation(w.outputs[0].name, (w.M, w.N))
    o = S.FullyConnectedOptionsT()
    o.fusedActivationFunction = S.ActivationFunctionType.NONE
    t.op(S.BuiltinOperator.FULLY_CONNECTED, [a, wt, bias], [y], S.BuiltinOptions.FullyConnectedOptions, o)
    return t.serialize([a], [y], f"edgetune baseline {w.spec()}"), view


# (float16 operands: widened, float32 loop, as the op accumulates)
NUMPY = '''\
def run(inputs):
    np.matmul(inputs[0], inputs[1], out=y, dtype=np.float32)
    return [y]
'''

OP = Op(Gemm, weights=lambda w: (1,), onnx=onnx_nodes, tflite=tflite_model, numpy=NUMPY, torch=True, half=True)
