"""MobileNetV3-Large (Howard et al. 2019, torchvision layout).

full:  input ``input`` float32 [batch, 3, 224, 224] NCHW -> ``logits`` [batch, 1000].
       stem 3x3/2 16 HardSwish; 15 inverted-residual blocks (1x1 expand, depthwise kxk as
       ``Conv group=C``, optional squeeze-excite with ReLU / HardSigmoid gate, 1x1 linear
       projection, residual when shapes match) with ReLU or HardSwish; 1x1 conv 160 -> 960
       HardSwish; global average pool; FC 960 -> 1280 HardSwish; FC 1280 -> 1000.
       BatchNorm folded. ~5.48 M parameters.
small: 6 blocks of the same kinds (SE and plain, ReLU and HardSwish, 3x3 and 5x5), narrow,
       input 64x64.

Seeded random weights; the projection after a squeeze-excite gate (~0.5) gets gain 2 and
residual branches gain 0.5, so activations stay O(1) through the depth.
"""

from __future__ import annotations

import onnx

from models.zoo._vision import TFLITE_REASON, VisionNet

TITLE = "MobileNetV3-Large (inverted residuals, depthwise, squeeze-excite, HardSwish)"
FAMILY = "vision"
DIMS = {"small": {"batch": 1}, "full": {"batch": 1}}
TFLITE = TFLITE_REASON
SEED = 3_2019

# kernel, expanded channels, out channels, squeeze-excite, activation, stride
_FULL_BLOCKS = (
    (3, 16, 16, False, "relu", 1),
    (3, 64, 24, False, "relu", 2),
    (3, 72, 24, False, "relu", 1),
    (5, 72, 40, True, "relu", 2),
    (5, 120, 40, True, "relu", 1),
    (5, 120, 40, True, "relu", 1),
    (3, 240, 80, False, "hswish", 2),
    (3, 200, 80, False, "hswish", 1),
    (3, 184, 80, False, "hswish", 1),
    (3, 184, 80, False, "hswish", 1),
    (3, 480, 112, True, "hswish", 1),
    (3, 672, 112, True, "hswish", 1),
    (5, 672, 160, True, "hswish", 2),
    (5, 960, 160, True, "hswish", 1),
    (5, 960, 160, True, "hswish", 1),
)
_SMALL_BLOCKS = (
    (3, 16, 16, False, "relu", 1),
    (3, 48, 24, False, "relu", 2),
    (5, 72, 24, True, "relu", 1),
    (5, 72, 40, True, "hswish", 2),
    (3, 120, 40, True, "hswish", 1),
    (5, 160, 48, True, "hswish", 2),
)
CONFIG = {
    "full": {"image": 224, "stem": 16, "blocks": _FULL_BLOCKS, "last": 960, "hidden": 1280, "classes": 1000},
    "small": {"image": 64, "stem": 16, "blocks": _SMALL_BLOCKS, "last": 192, "hidden": 256, "classes": 1000},
}


def make_divisible(v: float, divisor: int = 8) -> int:
    new = max(divisor, int(v + divisor / 2) // divisor * divisor)
    if new < 0.9 * v:
        new += divisor
    return new


def _squeeze_excite(n: VisionNet, x: str, ch: int) -> str:
    sq = make_divisible(ch / 4)
    s = n.op("GlobalAveragePool", [x])
    s = n.conv(s, ch, sq, 1, act="relu", bn=False, prefix="se_fc1")
    s = n.conv(s, sq, ch, 1, act=None, gain=0.5, bn=False, prefix="se_fc2")
    return n.op("Mul", [x, n.act(s, "hsigmoid")])


def _block(n: VisionNet, x: str, cin: int, k: int, exp: int, cout: int, se: bool, act: str,
           stride: int) -> str:
    residual = stride == 1 and cin == cout
    y = x
    if exp != cin:
        y = n.conv(y, cin, exp, 1, act=act, prefix="expand")
    y = n.conv(y, exp, exp, k, stride=stride, groups=exp, act=act, prefix="dw")
    if se:
        y = _squeeze_excite(n, y, exp)
    gain = (2.0 if se else 1.0) * (0.5 if residual else 1.0)
    y = n.conv(y, exp, cout, 1, act=None, gain=gain, prefix="project")
    return n.op("Add", [x, y]) if residual else y


def model(size: str = "full") -> onnx.ModelProto:
    cfg = CONFIG[size]
    n = VisionNet(f"mobilenetv3_large_{size}", SEED)
    x = n.conv("input", 3, cfg["stem"], 3, stride=2, act="hswish", prefix="stem")
    ch = cfg["stem"]
    for k, exp, cout, se, act, stride in cfg["blocks"]:
        x = _block(n, x, ch, k, exp, cout, se, act, stride)
        ch = cout
    x = n.conv(x, ch, cfg["last"], 1, act="hswish", prefix="last")
    x = n.pool_flatten(x)
    x = n.linear(x, cfg["last"], cfg["hidden"], act="hswish")
    x = n.linear(x, cfg["hidden"], cfg["classes"])
    n.rename_output(x, "logits")
    s = cfg["image"]
    return n.model(["batch", 3, s, s], [("logits", ["batch", cfg["classes"]])],
                   doc=f"edgetune zoo MobileNetV3-Large ({size}), seeded random weights, NCHW input")
