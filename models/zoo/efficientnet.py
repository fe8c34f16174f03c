"""EfficientNet-B0 (Tan & Le 2019, torchvision layout).

full:  input ``input`` float32 [batch, 3, 224, 224] NCHW -> ``logits`` [batch, 1000].
       stem 3x3/2 32 SiLU; 16 MBConv blocks in 7 stages (1x1 expand x6, depthwise kxk as
       ``Conv group=C``, squeeze-excite with SiLU / Sigmoid gate on in_ch/4 channels, 1x1
       linear projection, residual when shapes match); 1x1 conv 320 -> 1280 SiLU; global average
       pool; FC 1280 -> 1000. SiLU is spelled ``x * Sigmoid(x)`` (no Swish op in opset 17).
       BatchNorm folded. ~5.29 M parameters.
small: 7 MBConv blocks (every kind: expand 1 and 6, 3x3 and 5x5, stride 1 and 2, residual),
       narrow, input 64x64.
"""

from __future__ import annotations

import onnx

from models.zoo._vision import TFLITE_REASON, VisionNet

TITLE = "EfficientNet-B0 (MBConv + squeeze-excite, SiLU)"
FAMILY = "vision"
DIMS = {"small": {"batch": 1}, "full": {"batch": 1}}
TFLITE = TFLITE_REASON
SEED = 2019_05_28

# expand ratio, kernel, stride, in channels, out channels, layers
_FULL_STAGES = (
    (1, 3, 1, 32, 16, 1),
    (6, 3, 2, 16, 24, 2),
    (6, 5, 2, 24, 40, 2),
    (6, 3, 2, 40, 80, 3),
    (6, 5, 1, 80, 112, 3),
    (6, 5, 2, 112, 192, 4),
    (6, 3, 1, 192, 320, 1),
)
_SMALL_STAGES = (
    (1, 3, 1, 16, 8, 1),
    (6, 3, 2, 8, 16, 2),
    (6, 5, 2, 16, 24, 1),
    (6, 3, 2, 24, 32, 2),
    (6, 5, 1, 32, 48, 1),
)
CONFIG = {
    "full": {"image": 224, "stem": 32, "stages": _FULL_STAGES, "head": 1280, "classes": 1000},
    "small": {"image": 64, "stem": 16, "stages": _SMALL_STAGES, "head": 128, "classes": 1000},
}


def _mbconv(n: VisionNet, x: str, cin: int, cout: int, expand: int, k: int, stride: int) -> str:
    residual = stride == 1 and cin == cout
    hid = cin * expand
    y = x
    if expand != 1:
        y = n.conv(y, cin, hid, 1, act="silu", prefix="expand")
    y = n.conv(y, hid, hid, k, stride=stride, groups=hid, act="silu", prefix="dw")
    sq = max(1, cin // 4)
    s = n.op("GlobalAveragePool", [y])
    s = n.conv(s, hid, sq, 1, act="silu", bn=False, prefix="se_fc1")
    s = n.conv(s, sq, hid, 1, act=None, gain=0.5, bn=False, prefix="se_fc2")
    y = n.op("Mul", [y, n.act(s, "sigmoid")])
    # the gate is ~0.5: gain 1.7 (measured) restores the scale; residual branches are damped
    y = n.conv(y, hid, cout, 1, act=None, gain=1.7 * (0.5 if residual else 1.0), prefix="project")
    return n.op("Add", [x, y]) if residual else y


def model(size: str = "full") -> onnx.ModelProto:
    cfg = CONFIG[size]
    n = VisionNet(f"efficientnet_b0_{size}", SEED)
    x = n.conv("input", 3, cfg["stem"], 3, stride=2, act="silu", prefix="stem")
    ch = cfg["stem"]
    for expand, k, stride, cin, cout, layers in cfg["stages"]:
        assert cin == ch
        for i in range(layers):
            x = _mbconv(n, x, ch, cout, expand, k, stride if i == 0 else 1)
            ch = cout
    x = n.conv(x, ch, cfg["head"], 1, act="silu", prefix="head")
    x = n.pool_flatten(x)
    x = n.linear(x, cfg["head"], cfg["classes"])
    n.rename_output(x, "logits")
    s = cfg["image"]
    return n.model(["batch", 3, s, s], [("logits", ["batch", cfg["classes"]])],
                   doc=f"edgetune zoo EfficientNet-B0 ({size}), seeded random weights, NCHW input")
