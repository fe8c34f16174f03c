"""conv2d_nchw: Y[N,K,P,Q] = conv(X[N,C,H,W], Wt[K,C,R,S]), square stride, zero padding; Wt is the weight."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from edgetune.ops.base import FormView, Op, TensorSpec
from edgetune.ops.conv import NHWC, Conv2dBase, onnx_conv_attrs, pad_nchw, tflite_conv, windows_nchw


@dataclass(frozen=True)
class Conv2dNCHW(Conv2dBase):
    """Y[N,K,P,Q] = conv(X[N,C,H,W], W[K,C,R,S]) with square stride and zero padding."""

    op: ClassVar[str] = "conv2d_nchw"

    @property
    def inputs(self):
        return (
            TensorSpec("X", (self.N, self.C, self.H, self.W), self.dtype),
            TensorSpec("Wt", (self.K, self.C, self.R, self.S), self.dtype),
        )

    @property
    def outputs(self):
        return (TensorSpec("Y", (self.N, self.K, self.P, self.Q), self.dtype),)

    def prim_func(self):
        from tvm import te

        x, w, xp, (c, r, s) = self.te_operands((0, 0, self.pad, self.pad))
        st = self.stride
        y = te.compute(
            self.outputs[0].shape,
            lambda n, k, p, q: te.sum(xp[n, c, p * st + r, q * st + s] * w[k, c, r, s], axis=[c, r, s]),
            name="Y",
        )
        return te.create_prim_func([x, w, y])

    def reference(self, inputs):
        x, w = (np.asarray(v, np.float64) for v in inputs)
        win = windows_nchw(pad_nchw(x, self.pad), self.R, self.S, self.stride)
        return [np.einsum("ncpqrs,kcrs->nkpq", win, w, optimize=True)]


def onnx_nodes(w, a, b, y):
    from onnx import helper

    return [helper.make_node("Conv", [a, b], [y], **onnx_conv_attrs(w))], []


def tflite_model(w, constants, t, S):
    """CONV_2D on NHWC activations (transposed on the host, outside the timed region), OHWI filter."""
    view = FormView(w, constants, in_perm={0: NHWC}, out_perm={0: NHWC}, tag="tflite")
    filt = np.asarray(constants[1], np.float32).transpose(0, 2, 3, 1)  # OIHW -> OHWI
    return tflite_conv(w, t, S, view, filt, w.C, w.K, depthwise=False)


NUMPY = '''\
n, c, h, w_, kk, r, s, st, pad = (P[k] for k in ("N", "C", "H", "W", "K", "R", "S", "stride", "pad"))
pq = out_shape[2] * out_shape[3]
if r == s == 1 and st == 1 and pad == 0:
    def run(inputs):
        x, wt = inputs
        np.matmul(wt.reshape(kk, c), x.reshape(n, c, h * w_), out=y.reshape(n, kk, pq))
        return [y]
else:
    xp = np.zeros((n, c, h + 2 * pad, w_ + 2 * pad), np.float32)

    def run(inputs):
        x, wt = inputs
        xp[:, :, pad:pad + h, pad:pad + w_] = x
        win = sliding_window_view(xp, (r, s), axis=(2, 3))[:, :, ::st, ::st]  # N C P Q R S
        w2 = wt.reshape(kk, c * r * s)
        for b in range(n):
            cols = win[b].transpose(0, 3, 4, 1, 2).reshape(c * r * s, pq)  # im2col
            np.matmul(w2, cols, out=y[b].reshape(kk, pq))
        return [y]
'''

OP = Op(Conv2dNCHW, weights=lambda w: (1,), onnx=onnx_nodes, tflite=tflite_model, numpy=NUMPY, torch=True)
