"""conv2d_nhwc: Y[N,P,Q,K] = conv(X[N,H,W,C], Wt[R,S,C,K]) (HWIO filter, as TFLite-style graphs
have), square stride, zero padding; Wt is the weight."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from edgetune.ops.base import FormView, Op, TensorSpec
from edgetune.ops.conv import Conv2dBase, onnx_conv_attrs, pad_nchw, tflite_conv, windows_nchw


@dataclass(frozen=True)
class Conv2dNHWC(Conv2dBase):
    """Y[N,P,Q,K] = conv(X[N,H,W,C], W[R,S,C,K]) (HWIO filter, as TFLite-style graphs have)."""

    op: ClassVar[str] = "conv2d_nhwc"

    @property
    def inputs(self):
        return (
            TensorSpec("X", (self.N, self.H, self.W, self.C), self.dtype),
            TensorSpec("Wt", (self.R, self.S, self.C, self.K), self.dtype),
        )

    @property
    def outputs(self):
        return (TensorSpec("Y", (self.N, self.P, self.Q, self.K), self.dtype),)

    def prim_func(self):
        from tvm import te

        x, w, xp, (c, r, s) = self.te_operands((0, self.pad, self.pad, 0))
        st = self.stride
        y = te.compute(
            self.outputs[0].shape,
            lambda n, p, q, k: te.sum(xp[n, p * st + r, q * st + s, c] * w[r, s, c, k], axis=[r, s, c]),
            name="Y",
        )
        return te.create_prim_func([x, w, y])

    def reference(self, inputs):
        x, w = (np.asarray(v, np.float64) for v in inputs)
        xn = pad_nchw(np.transpose(x, (0, 3, 1, 2)), self.pad)
        win = windows_nchw(xn, self.R, self.S, self.stride)
        return [np.einsum("ncpqrs,rsck->npqk", win, w, optimize=True)]


def onnx_nodes(w, a, b, y):
    """ONNX Conv is NCHW: the transposes a converted NHWC model carries."""
    from onnx import helper

    return [helper.make_node("Transpose", [a], [a + "_nchw"], perm=[0, 3, 1, 2]),
            helper.make_node("Transpose", [b], [b + "_oihw"], perm=[3, 2, 0, 1]),
            helper.make_node("Conv", [a + "_nchw", b + "_oihw"], [y + "_nchw"], **onnx_conv_attrs(w)),
            helper.make_node("Transpose", [y + "_nchw"], [y], perm=[0, 2, 3, 1])], []


def tflite_model(w, constants, t, S):
    """CONV_2D in the operator's own NHWC layout, OHWI filter."""
    view = FormView(w, constants, tag="tflite")
    filt = np.asarray(constants[1], np.float32).transpose(3, 0, 1, 2)  # HWIO -> OHWI
    return tflite_conv(w, t, S, view, filt, w.C, w.K, depthwise=False)


NUMPY = '''\
n, c, h, w_, kk, r, s, st, pad = (P[k] for k in ("N", "C", "H", "W", "K", "R", "S", "stride", "pad"))
pq = out_shape[1] * out_shape[2]
if r == s == 1 and st == 1 and pad == 0:
    def run(inputs):
        x, wt = inputs
        np.matmul(x.reshape(n * h * w_, c), wt.reshape(c, kk), out=y.reshape(n * pq, kk))
        return [y]
else:
    xp = np.zeros((n, h + 2 * pad, w_ + 2 * pad, c), np.float32)

    def run(inputs):
        x, wt = inputs
        xp[:, pad:pad + h, pad:pad + w_, :] = x
        win = sliding_window_view(xp, (r, s), axis=(1, 2))[:, ::st, ::st]  # N P Q C R S
        cols = win.transpose(0, 1, 2, 4, 5, 3).reshape(n * pq, r * s * c)
        np.matmul(cols, wt.reshape(r * s * c, kk), out=y.reshape(n * pq, kk))
        return [y]
'''

OP = Op(Conv2dNHWC, weights=lambda w: (1,), onnx=onnx_nodes, tflite=tflite_model, numpy=NUMPY, torch=True)
