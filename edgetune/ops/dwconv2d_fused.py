"""dwconv2d_fused: an ONNX depthwise Conv node as it stands in a model, with the bias and the
activation that follow it fused (the hybrid onnxruntime + TVM candidates' kernels,
edgetune/space/ort_tvm.py). Its baseline is the same nodes in onnxruntime; no numpy, PyTorch or
TFLite form."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from edgetune.errors import UserInputError
from edgetune.ops.base import Op, TensorSpec
from edgetune.ops.depthwise_conv2d_nchw import DepthwiseShapes, depthwise64, depthwise_te


# Activations a fused depthwise kernel can apply (ONNX semantics); the int is the spec's ``act``.
DW_ACTIVATIONS = {0: "none", 1: "relu", 2: "relu6", 3: "hardswish"}


def _activation64(y: np.ndarray, act: int) -> np.ndarray:
    if act == 1:
        return np.maximum(y, 0.0)
    if act == 2:
        return np.clip(y, 0.0, 6.0)
    if act == 3:  # ONNX HardSwish: x * max(0, min(1, x / 6 + 0.5))
        return y * np.clip(y / 6.0 + 0.5, 0.0, 1.0)
    return y


@dataclass(frozen=True)
class DepthwiseConvFused(DepthwiseShapes):
    """An ONNX depthwise Conv node as it stands in a model, with what follows it fused:
    Y = act(depthwise conv(X[N,C,H,W], Wt[C,1,R,S]) + B[C]), strides SH/SW, pads PT/PL/PB/PR
    (ONNX's begin/end pads, which may differ: TF-style SAME), ``bias`` 0/1 (B is an input only
    with 1), ``act`` 0 none, 1 Relu, 2 Clip(0, 6), 3 HardSwish. The hybrid onnxruntime + TVM
    candidates splice such kernels into the onnxruntime graph (edgetune/space/ort_tvm.py)."""

    op: ClassVar[str] = "dwconv2d_fused"
    zero_ok: ClassVar[frozenset[str]] = frozenset({"PT", "PL", "PB", "PR", "bias", "act"})
    SH: int = 1
    SW: int = 1
    PT: int = 0
    PL: int = 0
    PB: int = 0
    PR: int = 0
    bias: int = 1
    act: int = 0

    def __post_init__(self) -> None:
        if self.bias not in (0, 1):
            raise UserInputError(f"{self.op}: bias must be 0 or 1, got {self.bias!r}")
        if self.act not in DW_ACTIVATIONS:
            raise UserInputError(f"{self.op}: act must be one of {DW_ACTIVATIONS} (as the int), got {self.act!r}")
        super().__post_init__()

    @property
    def P(self) -> int:
        return (self.H + self.PT + self.PB - self.R) // self.SH + 1

    @property
    def Q(self) -> int:
        return (self.W + self.PL + self.PR - self.S) // self.SW + 1

    @property
    def inputs(self):
        return super().inputs + ((TensorSpec("B", (self.C,), self.dtype),) if self.bias else ())

    def prim_func(self):
        from tvm import te, tirx

        x = te.placeholder(self.inputs[0].shape, self.dtype, name="X")
        w = te.placeholder(self.inputs[1].shape, self.dtype, name="Wt")
        args = [x, w]
        conv = depthwise_te(x, w, (self.PT, self.PL, self.PB, self.PR), (self.SH, self.SW), self.outputs[0].shape,
                             "conv")
        b = None
        if self.bias:
            b = te.placeholder((self.C,), self.dtype, name="B")
            args.append(b)
        zero, six = tirx.const(0.0, self.dtype), tirx.const(6.0, self.dtype)

        def epilogue(n, c, p, q):
            v = conv[n, c, p, q] + b[c] if b is not None else conv[n, c, p, q]
            if self.act == 1:
                return te.max(v, zero)
            if self.act == 2:
                return te.min(te.max(v, zero), six)
            if self.act == 3:
                gate = te.min(te.max(v * tirx.const(1.0 / 6.0, self.dtype) + tirx.const(0.5, self.dtype), zero),
                              tirx.const(1.0, self.dtype))
                return v * gate
            return v

        y = te.compute(self.outputs[0].shape, epilogue, name="Y") if (self.bias or self.act) else conv
        return te.create_prim_func([*args, y])

    def reference(self, inputs):
        x, w = (np.asarray(v, np.float64) for v in inputs[:2])
        y = depthwise64(x, w, (self.PT, self.PL, self.PB, self.PR), (self.SH, self.SW), self.outputs[0].shape)
        if self.bias:
            y = y + np.asarray(inputs[2], np.float64)[None, :, None, None]
        return [_activation64(y, self.act)]


def onnx_nodes(w, a, b, y):
    """The nodes as they stand in the model: Conv(+bias) then the activation."""
    from onnx import helper, numpy_helper

    nodes, extra = [], []
    conv_out = y if not w.act else y + "_conv"
    nodes.append(helper.make_node("Conv", [s.name for s in w.inputs], [conv_out], group=w.C,
                                  kernel_shape=[w.R, w.S], strides=[w.SH, w.SW],
                                  pads=[w.PT, w.PL, w.PB, w.PR]))
    if w.act == 1:
        nodes.append(helper.make_node("Relu", [conv_out], [y]))
    elif w.act == 2:
        extra.append(numpy_helper.from_array(np.array(0.0, np.float32), "clip_lo"))
        extra.append(numpy_helper.from_array(np.array(6.0, np.float32), "clip_hi"))
        nodes.append(helper.make_node("Clip", [conv_out, "clip_lo", "clip_hi"], [y]))
    elif w.act == 3:
        nodes.append(helper.make_node("HardSwish", [conv_out], [y]))
    return nodes, extra


# a model's depthwise Conv: its weights and bias are initializers
OP = Op(DepthwiseConvFused, weights=lambda w: (1, 2) if w.bias else (1,), onnx=onnx_nodes)
