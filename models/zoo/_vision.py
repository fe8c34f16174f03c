"""Shared builder for the zoo's convolutional models (ResNet, MobileNetV3, EfficientNet, YOLO, U-Net).

A thin layer over :class:`models._onnx.OnnxGraph` (``onnx.helper``): every weight is drawn from
one ``numpy.random.default_rng(seed)`` in graph order, so a build is byte-for-byte reproducible.

BatchNorm is folded: each conv draws its weight (He / fan-in scaled by the gain of the activation
that follows, so activations stay O(1) through the depth), then BatchNorm parameters with sane
running statistics (gamma ~ 1, beta ~ 0, mean ~ 0, var ~ 1), and folds them into the conv's weight
and bias — the graph holds plain ``Conv`` nodes with a bias, as an exported/optimised model does.
"""

from __future__ import annotations

import math

import numpy as np
import onnx

from models._onnx import OnnxGraph, float_input
from models.zoo._nn import NO_TFLITE as TFLITE_REASON  # noqa: F401 - one wording for the whole zoo

# 1 / sqrt(E[act(x)^2]) for x ~ N(0, 1): the weight gain that keeps the second moment at 1
GAIN = {
    None: 1.0,
    "relu": math.sqrt(2.0),
    "relu6": math.sqrt(2.0),
    "silu": 1.55,
    "hswish": 1.5,
}
BN_EPS = 1e-5


class VisionNet:
    """Collects nodes/initializers and counts parameters (folded: conv weight + bias)."""

    def __init__(self, name: str, seed: int) -> None:
        self.g = OnnxGraph(name)
        self.rng = np.random.default_rng(seed)
        self.params = 0
        self._n: dict[str, int] = {}

    def _name(self, prefix: str) -> str:
        n = self._n.get(prefix, 0)
        self._n[prefix] = n + 1
        return f"{prefix}{n}"

    def const(self, name: str, value: np.ndarray, count: bool = True) -> str:
        arr = np.ascontiguousarray(np.asarray(value, dtype=np.float32) if np.asarray(value).dtype.kind == "f"
                                   else np.asarray(value))
        if count:
            self.params += int(arr.size)
        return self.g.const(name, arr)

    def op(self, op_type: str, inputs: list[str], **attrs) -> str:
        return self.g.op(op_type, inputs, **attrs)

    def ops(self, op_type: str, inputs: list[str], n_out: int, **attrs) -> list[str]:
        """A node with several outputs (Split)."""
        from onnx import helper

        name = self.g._fresh(op_type)
        outs = [f"{name}_out{i}" for i in range(n_out)]
        self.g.nodes.append(helper.make_node(op_type, inputs, outs, name=name, **attrs))
        return outs

    # -- layers -----------------------------------------------------------------------------

    def act(self, x: str, act: str | None) -> str:
        if act is None:
            return x
        if act == "relu":
            return self.op("Relu", [x])
        if act == "relu6":
            lo = self.const(self._name("relu6_lo"), np.array(0.0, np.float32), count=False)
            hi = self.const(self._name("relu6_hi"), np.array(6.0, np.float32), count=False)
            return self.op("Clip", [x, lo, hi])
        if act == "silu":
            return self.op("Mul", [x, self.op("Sigmoid", [x])])
        if act == "hswish":
            return self.op("HardSwish", [x])
        if act == "sigmoid":
            return self.op("Sigmoid", [x])
        if act == "hsigmoid":  # torch's hardsigmoid: relu6(x + 3) / 6
            return self.op("HardSigmoid", [x], alpha=1.0 / 6.0, beta=0.5)
        raise ValueError(act)

    def conv(self, x: str, cin: int, cout: int, k: int, stride: int = 1, groups: int = 1,
             act: str | None = None, gain: float = 1.0, bn: bool = True, pad: int | None = None,
             prefix: str = "conv") -> str:
        """Conv (+ folded BatchNorm) + activation; symmetric padding k//2 unless ``pad``."""
        rng = self.rng
        fan_in = (cin // groups) * k * k
        std = gain * GAIN[act] / math.sqrt(fan_in)
        w = rng.standard_normal((cout, cin // groups, k, k)) * std
        if bn:
            gamma = 1.0 + 0.1 * rng.standard_normal(cout)
            beta = 0.05 * rng.standard_normal(cout)
            mean = 0.05 * rng.standard_normal(cout)
            var = rng.uniform(0.8, 1.25, cout)
            s = gamma / np.sqrt(var + BN_EPS)
            # BN applied to a conv output whose own scale is ~1: normalise by ~1 and keep the scale
            w = w * s[:, None, None, None]
            b = beta - mean * s
        else:
            b = 0.02 * rng.standard_normal(cout)
        name = self._name(prefix)
        wn = self.const(f"{name}.weight", w)
        bn_ = self.const(f"{name}.bias", b)
        p = k // 2 if pad is None else pad
        y = self.op("Conv", [x, wn, bn_], kernel_shape=[k, k], strides=[stride, stride],
                    pads=[p, p, p, p], group=groups, dilations=[1, 1])
        return self.act(y, act)

    def linear(self, x: str, fin: int, fout: int, act: str | None = None, gain: float = 1.0,
               prefix: str = "fc") -> str:
        w = self.rng.standard_normal((fout, fin)) * (gain * GAIN[act] / math.sqrt(fin))
        b = 0.02 * self.rng.standard_normal(fout)
        name = self._name(prefix)
        y = self.op("Gemm", [x, self.const(f"{name}.weight", w), self.const(f"{name}.bias", b)], transB=1)
        return self.act(y, act)

    def pool_flatten(self, x: str) -> str:
        return self.op("Flatten", [self.op("GlobalAveragePool", [x])], axis=1)

    def model(self, in_shape: list, outputs: list[tuple[str, list]], doc: str,
              input_name: str = "input") -> onnx.ModelProto:
        return self.g.model([float_input(input_name, in_shape)],
                            [float_input(n, s) for n, s in outputs], doc=doc)

    def rename_output(self, x: str, name: str) -> str:
        """Make the last node producing ``x`` write ``name`` instead."""
        for node in reversed(self.g.nodes):
            for i, o in enumerate(node.output):
                if o == x:
                    node.output[i] = name
                    return name
        raise KeyError(x)
