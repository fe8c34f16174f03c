"""What the convolutions share: the NCHW/NHWC shape fields, the float64 reference's windows, and
their ONNX attributes and one-op TFLite form (conv2d_nchw, conv2d_nhwc, depthwise_conv2d_nchw)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from edgetune.ops.base import OpWorkload, conv_out


def pad_nchw(x: np.ndarray, pad: int) -> np.ndarray:
    return np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad))) if pad else x


def windows_nchw(x: np.ndarray, r: int, s: int, stride: int) -> np.ndarray:
    """[N, C, P, Q, R, S] view of the sliding windows (float64 reference only)."""
    from numpy.lib.stride_tricks import sliding_window_view

    win = sliding_window_view(x, (r, s), axis=(2, 3))
    return win[:, :, ::stride, ::stride]


class SquareConvOut:
    """Output height P and width Q of a square-stride, symmetric-pad convolution (fields H, W, R,
    S, stride, pad): the NCHW and NHWC convolutions' and the depthwise one's."""

    @property
    def P(self) -> int:
        return conv_out(self.H, self.R, self.stride, self.pad)

    @property
    def Q(self) -> int:
        return conv_out(self.W, self.S, self.stride, self.pad)


@dataclass(frozen=True)
class Conv2dBase(SquareConvOut, OpWorkload):
    """Shape fields, output size and flops shared by the NCHW and NHWC convolutions."""

    N: int
    C: int
    H: int
    W: int
    K: int
    R: int
    S: int
    stride: int = 1
    pad: int = 0

    def flops(self) -> int:
        return 2 * self.N * self.K * self.P * self.Q * self.C * self.R * self.S

    def te_operands(self, pad_before: tuple[int, ...]):
        """The TE form's placeholders X and Wt, X zero-padded by ``pad_before`` (and as much after)
        where the convolution pads, and the reduce axes c, r, s; the layout writes the compute."""
        from tvm import te, topi

        x = te.placeholder(self.inputs[0].shape, self.dtype, name="X")
        w = te.placeholder(self.inputs[1].shape, self.dtype, name="Wt")
        xp = topi.nn.pad(x, pad_before, name="Xpad") if self.pad else x
        axes = (te.reduce_axis((0, self.C), name="c"), te.reduce_axis((0, self.R), name="r"),
                te.reduce_axis((0, self.S), name="s"))
        return x, w, xp, axes


def onnx_conv_attrs(w) -> dict:
    """ONNX Conv's attributes of a square-stride, symmetric-pad convolution."""
    return dict(strides=[w.stride, w.stride], pads=[w.pad] * 4, kernel_shape=[w.R, w.S])


NHWC = (0, 2, 3, 1)  # NCHW array -> NHWC


def tflite_padding(S, size: int, k: int, stride: int, pad: int, out: int):
    """TFLite padding equal to a symmetric zero pad: VALID (pad 0), SAME when it pads exactly the
    same, else None (an explicit PAD op then VALID)."""
    if pad == 0:
        return S.Padding.VALID
    same_out = -(-size // stride)
    total = max((same_out - 1) * stride + k - size, 0)
    if same_out == out and total // 2 == pad:
        return S.Padding.SAME
    return None


def tflite_conv(w, t, S, view, filt: np.ndarray, cin: int, cout: int, depthwise: bool):
    """The one-op .tflite of a convolution (NHWC activations, the constant filter ``filt`` in
    TFLite's layout, zero bias), a symmetric pad as TFLite's padding or an explicit PAD op."""
    act = S.ActivationFunctionType.NONE
    x = t.activation(w.inputs[0].name, (w.N, w.H, w.W, cin))
    graph_in = x
    ph = tflite_padding(S, w.H, w.R, w.stride, w.pad, w.P)
    pw = tflite_padding(S, w.W, w.S, w.stride, w.pad, w.Q)
    padding = ph if ph is not None and ph == pw else None
    if padding is None:  # explicit symmetric zero pad, then VALID
        p = w.pad
        xp = t.activation("X_padded", (w.N, w.H + 2 * p, w.W + 2 * p, cin))
        pads = t.const("paddings", np.array([[0, 0], [p, p], [p, p], [0, 0]], np.int32))
        t.op(S.BuiltinOperator.PAD, [x, pads], [xp], S.BuiltinOptions.PadOptions, S.PadOptionsT())
        x, padding = xp, S.Padding.VALID
    f = t.const("W", np.ascontiguousarray(filt, np.float32))
    bias = t.const("bias", np.zeros(cout, np.float32))
    y = t.activation(w.outputs[0].name, (w.N, w.P, w.Q, cout))
    if depthwise:
        o = S.DepthwiseConv2DOptionsT()
        o.depthMultiplier = 1
        code, otype = S.BuiltinOperator.DEPTHWISE_CONV_2D, S.BuiltinOptions.DepthwiseConv2DOptions
    else:
        o = S.Conv2DOptionsT()
        code, otype = S.BuiltinOperator.CONV_2D, S.BuiltinOptions.Conv2DOptions
    o.padding = padding
    o.strideH = o.strideW = w.stride
    o.dilationHFactor = o.dilationWFactor = 1
    o.fusedActivationFunction = act
    t.op(code, [x, f, bias], [y], otype, o)
    return t.serialize([graph_in], [y], f"edgetune baseline {w.spec()}"), view
