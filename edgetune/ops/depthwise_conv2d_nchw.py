"""depthwise_conv2d_nchw: Y[N,C,P,Q] = depthwise conv(X[N,C,H,W], Wt[C,1,R,S]) (channel multiplier
1), square stride, zero padding; Wt is the weight. Its TE form and float64 reference are
dwconv2d_fused's too."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from edgetune.ops.base import FormView, Op, OpWorkload, TensorSpec
from edgetune.ops.conv import NHWC, SquareConvOut, onnx_conv_attrs, tflite_conv


@dataclass(frozen=True)
class DepthwiseShapes(OpWorkload):
    """The fields N, C, H, W, R, S, X[N,C,H,W] and Wt[C,1,R,S] to Y[N,C,P,Q], and the flops: what
    depthwise_conv2d_nchw and dwconv2d_fused share (each has its own stride, pad, P and Q)."""

    N: int
    C: int
    H: int
    W: int
    R: int
    S: int

    @property
    def inputs(self):
        return (
            TensorSpec("X", (self.N, self.C, self.H, self.W), self.dtype),
            TensorSpec("Wt", (self.C, 1, self.R, self.S), self.dtype),
        )

    @property
    def outputs(self):
        return (TensorSpec("Y", (self.N, self.C, self.P, self.Q), self.dtype),)

    def flops(self) -> int:
        return 2 * self.N * self.C * self.P * self.Q * self.R * self.S


@dataclass(frozen=True)
class DepthwiseConv2dNCHW(DepthwiseShapes, SquareConvOut):
    """Y[N,C,P,Q] = depthwise conv(X[N,C,H,W], W[C,1,R,S]) (channel multiplier 1)."""

    op: ClassVar[str] = "depthwise_conv2d_nchw"
    stride: int = 1
    pad: int = 0

    def prim_func(self):
        from tvm import te

        x = te.placeholder(self.inputs[0].shape, self.dtype, name="X")
        w = te.placeholder(self.inputs[1].shape, self.dtype, name="Wt")
        y = depthwise_te(x, w, (self.pad,) * 4, (self.stride, self.stride), self.outputs[0].shape, "Y")
        return te.create_prim_func([x, w, y])

    def reference(self, inputs):
        x, w = (np.asarray(v, np.float64) for v in inputs)
        return [depthwise64(x, w, (self.pad,) * 4, (self.stride, self.stride), self.outputs[0].shape)]


def depthwise_te(x, w, pads, strides, out_shape, name):
    """TE depthwise conv of X[N,C,H,W] by W[C,1,R,S]; pads (top, left, bottom, right)."""
    from tvm import te, topi

    pt, pl, pb, pr = pads
    if any(pads):
        xp = topi.nn.pad(x, (0, 0, pt, pl), (0, 0, pb, pr), name="Xpad")
    else:
        xp = x
    r = te.reduce_axis((0, int(w.shape[2])), name="r")
    s = te.reduce_axis((0, int(w.shape[3])), name="s")
    sh, sw = strides
    return te.compute(out_shape, lambda n, c, p, q: te.sum(xp[n, c, p * sh + r, q * sw + s] * w[c, 0, r, s],
                                                           axis=[r, s]), name=name)


def depthwise64(x: np.ndarray, w: np.ndarray, pads, strides, out_shape) -> np.ndarray:
    """The float64 reference of depthwise_te (numpy windows, independent of TVM)."""
    from numpy.lib.stride_tricks import sliding_window_view

    pt, pl, pb, pr = pads
    xp = np.pad(x, ((0, 0), (0, 0), (pt, pb), (pl, pr)))
    win = sliding_window_view(xp, w.shape[2:], axis=(2, 3))[:, :, ::strides[0], ::strides[1]]
    return np.einsum("ncpqrs,crs->ncpq", win[:, :, :out_shape[2], :out_shape[3]], w[:, 0], optimize=True)


def onnx_nodes(w, a, b, y):
    from onnx import helper

    return [helper.make_node("Conv", [a, b], [y], **onnx_conv_attrs(w), group=w.C)], []


def tflite_model(w, constants, t, S):
    """DEPTHWISE_CONV_2D on NHWC activations (transposed on the host), [1,R,S,C] filter."""
    view = FormView(w, constants, in_perm={0: NHWC}, out_perm={0: NHWC}, tag="tflite")
    filt = np.asarray(constants[1], np.float32)[:, 0].transpose(1, 2, 0)[None]  # [C,1,R,S] -> [1,R,S,C]
    return tflite_conv(w, t, S, view, filt, w.C, w.C, depthwise=True)


NUMPY = '''\
n, c, h, w_, r, s, st, pad = (P[k] for k in ("N", "C", "H", "W", "R", "S", "stride", "pad"))
pq = out_shape[2:]
xp = np.zeros((n, c, h + 2 * pad, w_ + 2 * pad), np.float32)
tmp = np.empty(out_shape, np.float32)

def run(inputs):
    x, wt = inputs
    xp[:, :, pad:pad + h, pad:pad + w_] = x
    first = True
    for i in range(r):
        for j in range(s):
            tap = xp[:, :, i:i + st * (pq[0] - 1) + 1:st, j:j + st * (pq[1] - 1) + 1:st]
            k = wt[:, 0, i, j].reshape(1, c, 1, 1)
            if first:
                np.multiply(tap, k, out=y)
                first = False
            else:
                np.multiply(tap, k, out=tmp)
                np.add(y, tmp, out=y)
    return [y]
'''

OP = Op(DepthwiseConv2dNCHW, weights=lambda w: (1,), onnx=onnx_nodes, tflite=tflite_model, numpy=NUMPY, torch=True)
