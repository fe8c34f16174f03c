"""batch_matmul: C[b,M,N] = A[b,M,K] @ B[b,K,N]; with TB=1, B is [b,N,K] (attention's Q @ K^T).
Both operands are activations (no weight). float32, or float16 operands accumulated in float32."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from edgetune.errors import UserInputError
from edgetune.ops.base import FormView, Op, OpWorkload, TensorSpec


@dataclass(frozen=True)
class BatchMatmul(OpWorkload):
    """C[b,M,N] = A[b,M,K] @ B[b,K,N]; with TB=1, B is [b,N,K] (attention's Q @ K^T)."""

    op: ClassVar[str] = "batch_matmul"
    dtypes: ClassVar[tuple[str, ...]] = ("float32", "float16")
    B: int
    M: int
    N: int
    K: int
    TB: int = 0

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.TB not in (0, 1):
            raise UserInputError(f"batch_matmul: TB must be 0 or 1, got {self.TB!r}")

    @property
    def inputs(self):
        bshape = (self.B, self.N, self.K) if self.TB else (self.B, self.K, self.N)
        return (TensorSpec("A", (self.B, self.M, self.K), self.dtype), TensorSpec("B", bshape, self.dtype))

    @property
    def outputs(self):
        return (TensorSpec("C", (self.B, self.M, self.N), self.acc_dtype),)

    def flops(self) -> int:
        return 2 * self.B * self.M * self.N * self.K

    def prim_func(self):
        from tvm import te

        a = te.placeholder(self.inputs[0].shape, self.dtype, name="A")
        b = te.placeholder(self.inputs[1].shape, self.dtype, name="B")
        k = te.reduce_axis((0, self.K), name="k")
        if self.TB:
            body = lambda n, i, j: te.sum(self._mac(a[n, i, k], b[n, j, k]), axis=k)  # noqa: E731
        else:
            body = lambda n, i, j: te.sum(self._mac(a[n, i, k], b[n, k, j]), axis=k)  # noqa: E731
        c = te.compute((self.B, self.M, self.N), body, name="C")
        return te.create_prim_func([a, b, c])

    def reference(self, inputs):
        a, b = (np.asarray(x, np.float64) for x in inputs)
        if self.TB:
            b = np.transpose(b, (0, 2, 1))
        return [np.matmul(a, b)]


def onnx_nodes(w, a, b, y):
    from onnx import helper

    nodes = []
    if w.TB:
        nodes.append(helper.make_node("Transpose", [b], [b + "_t"], perm=[0, 2, 1]))
        b = b + "_t"
    nodes.append(helper.make_node("MatMul", [a, b], [y]))
    return nodes, []


def tflite_model(w, constants, t, S):
    view = FormView(w, {}, tag="tflite")
    a = t.activation(w.inputs[0].name, w.inputs[0].shape)
    b = t.activation(w.inputs[1].name, w.inputs[1].shape)
    y = t.activation(w.outputs[0].name, w.outputs[0].shape)
    o = S.BatchMatMulOptionsT()
    o.adjX, o.adjY = False, bool(w.TB)
    t.op(S.BuiltinOperator.BATCH_MATMUL, [a, b], [y], S.BuiltinOptions.BatchMatMulOptions, o)
    return t.serialize([a, b], [y], f"edgetune baseline {w.spec()}"), view


NUMPY = '''\
def run(inputs):
    b = inputs[1].transpose(0, 2, 1) if P["TB"] else inputs[1]
    np.matmul(inputs[0], b, out=y, dtype=np.float32)
    return [y]
'''

OP = Op(BatchMatmul, onnx=onnx_nodes, tflite=tflite_model, numpy=NUMPY, torch=True, half=True)
