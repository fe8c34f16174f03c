"""A small MobileNetV2-style image classifier.

Layout (input 96x96, 1000 classes, ~0.35 M parameters)::

    stem     conv 3x3 s2, 3->16, ReLU6                         48x48
    block 1  expand 16->64, dw 3x3 s2, project ->24            24x24
    block 2  expand 24->96, dw 3x3 s1, project ->24, +residual 24x24
    block 3  expand 24->96, dw 3x3 s2, project ->32            12x12
    block 4  expand 32->128, dw 3x3 s1, project ->32, +residual 12x12
    block 5  expand 32->128, dw 3x3 s2, project ->64            6x6
    block 6  expand 64->256, dw 3x3 s1, project ->64, +residual  6x6
    head     conv 1x1 64->256, ReLU6; global average pool; Gemm 256->1000

No batch normalisation (it would be folded into the convolutions anyway); weights are seeded
He-normal so activations keep a sensible scale through the network.

Padding follows TensorFlow "SAME" (for stride 2 on even sizes: 0 before, 1 after). The ONNX model
spells this as explicit asymmetric ``pads`` so both files compute exactly the same function.

ONNX:   input "input"  float32 [batch, 3, 96, 96] (NCHW, "batch" is a dim_param)
        output "logits" float32 [batch, 1000]
TFLite: input "input"  float32 [N, 96, 96, 3]    (NHWC, static N)
        output "logits" float32 [N, 1000]
        i.e. feed ``x_nchw.transpose(0, 2, 3, 1)`` to the TFLite model.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import onnx

from models._onnx import OnnxGraph, float_input

SEED = 20240611
IMAGE = 96
IN_CH = 3
STEM_CH = 16
HEAD_CH = 256
NUM_CLASSES = 1000
# (expansion factor, output channels, stride) per inverted-residual block
BLOCKS: tuple[tuple[int, int, int], ...] = (
    (4, 24, 2),
    (4, 24, 1),
    (4, 32, 2),
    (4, 32, 1),
    (4, 64, 2),
    (4, 64, 1),
)

INPUT_NAME = "input"
OUTPUT_NAME = "logits"


@dataclass(frozen=True)
class Conv:
    """One convolution: weight in ONNX layout [out, in/groups, kh, kw], bias [out]."""

    name: str
    w: np.ndarray
    b: np.ndarray
    stride: int
    groups: int
    relu6: bool
    in_size: int  # spatial input size (square), needed for SAME padding

    @property
    def k(self) -> int:
        return int(self.w.shape[2])

    @property
    def out_size(self) -> int:
        return -(-self.in_size // self.stride)

    def same_pads(self) -> tuple[int, int]:
        """TensorFlow SAME padding (before, after) along one spatial axis."""
        total = max((self.out_size - 1) * self.stride + self.k - self.in_size, 0)
        return total // 2, total - total // 2


@dataclass(frozen=True)
class Params:
    stem: Conv
    blocks: tuple[tuple[Conv, Conv, Conv, bool], ...]  # expand, depthwise, project, residual
    head: Conv
    fc_w: np.ndarray  # [classes, features]
    fc_b: np.ndarray


def _he(rng: np.random.Generator, shape: tuple[int, ...], fan_in: int, gain: float) -> np.ndarray:
    return (rng.standard_normal(shape) * (gain / math.sqrt(fan_in))).astype(np.float32)


def _bias(rng: np.random.Generator, n: int) -> np.ndarray:
    return (rng.standard_normal(n) * 0.02).astype(np.float32)


def params() -> Params:
    """The seeded weights; identical on every call and platform (numpy PCG64)."""
    rng = np.random.default_rng(SEED)
    relu_gain = math.sqrt(2.0)  # He for layers followed by ReLU6
    lin_gain = 1.0  # linear bottleneck (project) and classifier

    size = IMAGE
    stem = Conv("stem", _he(rng, (STEM_CH, IN_CH, 3, 3), IN_CH * 9, relu_gain),
                _bias(rng, STEM_CH), 2, 1, True, size)
    size = stem.out_size
    ch = STEM_CH
    blocks = []
    for i, (t, out, stride) in enumerate(BLOCKS):
        hid = ch * t
        exp = Conv(f"b{i}_expand", _he(rng, (hid, ch, 1, 1), ch, relu_gain),
                   _bias(rng, hid), 1, 1, True, size)
        dw = Conv(f"b{i}_dw", _he(rng, (hid, 1, 3, 3), 9, relu_gain),
                  _bias(rng, hid), stride, hid, True, size)
        size = dw.out_size
        # residual branches are scaled down so the sum does not grow block after block
        residual = stride == 1 and ch == out
        proj_gain = lin_gain * (0.5 if residual else 1.0)
        proj = Conv(f"b{i}_project", _he(rng, (out, hid, 1, 1), hid, proj_gain),
                    _bias(rng, out), 1, 1, False, size)
        blocks.append((exp, dw, proj, residual))
        ch = out
    head = Conv("head", _he(rng, (HEAD_CH, ch, 1, 1), ch, relu_gain),
                _bias(rng, HEAD_CH), 1, 1, True, size)
    fc_w = _he(rng, (NUM_CLASSES, HEAD_CH), HEAD_CH, lin_gain)
    fc_b = _bias(rng, NUM_CLASSES)
    return Params(stem, tuple(blocks), head, fc_w, fc_b)


def _convs(p: Params) -> list[Conv]:
    out = [p.stem]
    for exp, dw, proj, _ in p.blocks:
        out += [exp, dw, proj]
    return out + [p.head]


# ---------------------------------------------------------------------------------------------
# ONNX
# ---------------------------------------------------------------------------------------------


def onnx_model() -> onnx.ModelProto:
    p = params()
    g = OnnxGraph("edgetune_mobilenet")
    lo = g.const("relu6_min", np.array(0.0, np.float32))
    hi = g.const("relu6_max", np.array(6.0, np.float32))

    def conv(x: str, c: Conv) -> str:
        w = g.const(f"{c.name}.weight", c.w)
        b = g.const(f"{c.name}.bias", c.b)
        before, after = c.same_pads()
        y = g.op("Conv", [x, w, b], kernel_shape=[c.k, c.k], strides=[c.stride, c.stride],
                 pads=[before, before, after, after], group=c.groups, dilations=[1, 1])
        return g.op("Clip", [y, lo, hi]) if c.relu6 else y

    x = conv(INPUT_NAME, p.stem)
    for exp, dw, proj, residual in p.blocks:
        y = conv(conv(conv(x, exp), dw), proj)
        x = g.op("Add", [x, y]) if residual else y
    x = conv(x, p.head)
    x = g.op("GlobalAveragePool", [x])
    x = g.op("Flatten", [x], axis=1)
    fw = g.const("classifier.weight", p.fc_w)
    fb = g.const("classifier.bias", p.fc_b)
    g.op("Gemm", [x, fw, fb], out=OUTPUT_NAME, transB=1)
    return g.model(
        [float_input(INPUT_NAME, ["batch", IN_CH, IMAGE, IMAGE])],
        [float_input(OUTPUT_NAME, ["batch", NUM_CLASSES])],
        doc="edgetune bundled MobileNetV2-style classifier (seeded random weights), NCHW input",
    )


# ---------------------------------------------------------------------------------------------
# TFLite
# ---------------------------------------------------------------------------------------------


def tflite_bytes(batch: int = 1) -> bytes:
    from models._tflite import S, TFLiteGraph

    p = params()
    t = TFLiteGraph()
    x_shape = (batch, IMAGE, IMAGE, IN_CH)
    x = t.activation(INPUT_NAME, x_shape)
    graph_in = x
    act = S.ActivationFunctionType

    def conv(x: int, c: Conv) -> int:
        out_shape = (batch, c.out_size, c.out_size, c.w.shape[0])
        y = t.activation(f"{c.name}.out", out_shape)
        b = t.const(f"{c.name}.bias", c.b)
        if c.groups == 1:
            w = t.const(f"{c.name}.weight", c.w.transpose(0, 2, 3, 1))  # OIHW -> OHWI
            opt = S.Conv2DOptionsT()
            code, opt_type = S.BuiltinOperator.CONV_2D, S.BuiltinOptions.Conv2DOptions
        else:
            assert c.groups == c.w.shape[0] and c.w.shape[1] == 1
            w = t.const(f"{c.name}.weight", c.w.transpose(1, 2, 3, 0))  # [C,1,H,W] -> [1,H,W,C]
            opt = S.DepthwiseConv2DOptionsT()
            opt.depthMultiplier = 1
            code, opt_type = (S.BuiltinOperator.DEPTHWISE_CONV_2D,
                              S.BuiltinOptions.DepthwiseConv2DOptions)
        opt.padding = S.Padding.SAME
        opt.strideH = opt.strideW = c.stride
        opt.dilationHFactor = opt.dilationWFactor = 1
        opt.fusedActivationFunction = act.RELU6 if c.relu6 else act.NONE
        t.op(code, [x, w, b], [y], opt_type, opt)
        return y

    x = conv(x, p.stem)
    for i, (exp, dw, proj, residual) in enumerate(p.blocks):
        y = conv(conv(conv(x, exp), dw), proj)
        if residual:
            s = t.activation(f"b{i}_add.out", t.tensors[y].shape)
            opt = S.AddOptionsT()
            opt.fusedActivationFunction = act.NONE
            t.op(S.BuiltinOperator.ADD, [x, y], [s], S.BuiltinOptions.AddOptions, opt)
            y = s
        x = y
    x = conv(x, p.head)

    pooled = t.activation("pool.out", (batch, HEAD_CH))
    axes = t.const("pool.axes", np.array([1, 2], np.int32))
    ropt = S.ReducerOptionsT()
    ropt.keepDims = False
    t.op(S.BuiltinOperator.MEAN, [x, axes], [pooled], S.BuiltinOptions.ReducerOptions, ropt)

    logits = t.activation(OUTPUT_NAME, (batch, NUM_CLASSES))
    fw = t.const("classifier.weight", p.fc_w)  # FULLY_CONNECTED wants [out, in], like Gemm transB
    fb = t.const("classifier.bias", p.fc_b)
    fopt = S.FullyConnectedOptionsT()
    fopt.fusedActivationFunction = act.NONE
    t.op(S.BuiltinOperator.FULLY_CONNECTED, [pooled, fw, fb], [logits],
         S.BuiltinOptions.FullyConnectedOptions, fopt)
    return t.serialize([graph_in], [logits], "edgetune-models mobilenet (NHWC input)")
