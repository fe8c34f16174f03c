"""ResNet-50 (He et al. 2015, torchvision layout: stride on the 3x3 conv, "v1.5").

full:  input ``input`` float32 [batch, 3, 224, 224] NCHW -> ``logits`` [batch, 1000].
       stem 7x7/2 64 + maxpool 3x3/2; bottleneck stages 3-4-6-3 (widths 64/128/256/512, x4
       expansion), projection shortcut (1x1) on each stage's first block; global average pool;
       FC 2048 -> 1000. BatchNorm folded into the convs (conv + bias). ~25.5 M parameters.
small: the same structure with 1 block per stage and widths / 8, input 64x64.

Seeded random weights; the last conv of each residual branch gets a small gain (like a
zero-initialised last BN gamma, damped) so the residual stream grows slowly through depth.
"""

from __future__ import annotations

import onnx

from models.zoo._vision import TFLITE_REASON, VisionNet

TITLE = "ResNet-50 (bottleneck 3-4-6-3, BN folded)"
FAMILY = "vision"
DIMS = {"small": {"batch": 1}, "full": {"batch": 1}}
TFLITE = TFLITE_REASON
SEED = 50_2015

CONFIG = {
    "full": {"image": 224, "blocks": (3, 4, 6, 3), "width": 64, "classes": 1000},
    "small": {"image": 64, "blocks": (1, 1, 1, 1), "width": 8, "classes": 1000},
}
RESIDUAL_GAIN = 0.3


def _bottleneck(n: VisionNet, x: str, cin: int, width: int, stride: int) -> tuple[str, int]:
    cout = width * 4
    y = n.conv(x, cin, width, 1, act="relu")
    y = n.conv(y, width, width, 3, stride=stride, act="relu")
    y = n.conv(y, width, cout, 1, act=None, gain=RESIDUAL_GAIN)
    if stride != 1 or cin != cout:
        x = n.conv(x, cin, cout, 1, stride=stride, act=None, prefix="downsample")
    return n.op("Relu", [n.op("Add", [x, y])]), cout


def model(size: str = "full") -> onnx.ModelProto:
    cfg = CONFIG[size]
    n = VisionNet(f"resnet50_{size}", SEED)
    w0 = cfg["width"]
    x = n.conv("input", 3, w0, 7, stride=2, act="relu", prefix="stem")
    x = n.op("MaxPool", [x], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    ch = w0
    for stage, nblocks in enumerate(cfg["blocks"]):
        width = w0 * (2 ** stage)
        for b in range(nblocks):
            x, ch = _bottleneck(n, x, ch, width, 2 if (b == 0 and stage > 0) else 1)
    x = n.pool_flatten(x)
    x = n.linear(x, ch, cfg["classes"])
    n.rename_output(x, "logits")
    s = cfg["image"]
    return n.model(["batch", 3, s, s], [("logits", ["batch", cfg["classes"]])],
                   doc=f"edgetune zoo ResNet-50 ({size}), seeded random weights, NCHW input")
