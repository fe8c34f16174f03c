"""U-Net (Ronneberger et al. 2015) with padded ("same") 3x3 convolutions.

full:  input ``input`` float32 [batch, 3, 256, 256] NCHW -> ``logits`` [batch, 2, 256, 256].
       The original widths 64-128-256-512-1024: each level two Conv 3x3 (+ folded BN) + ReLU;
       MaxPool 2x2 between encoder levels; decoder ConvTranspose 2x2 stride 2 (halving the
       channels), Concat with the encoder skip, two Conv 3x3 + ReLU; final Conv 1x1 -> 2 classes.
       The paper's valid (unpadded) convs on 572x572 need a crop on every skip; padded convs at
       256x256 keep the skip shapes equal (the common modern variant) with the same parameters.
       ~31.0 M parameters.
small: 3 levels (16-32-64), input 64x64.
"""

from __future__ import annotations

import math

import onnx

from models.zoo._vision import TFLITE_REASON, VisionNet

TITLE = "U-Net (64..1024, padded convs, ConvTranspose up, skip Concat)"
FAMILY = "segmentation"
DIMS = {"small": {"batch": 1}, "full": {"batch": 1}}
TFLITE = TFLITE_REASON
SEED = 5_2015

CONFIG = {
    "full": {"image": 256, "widths": (64, 128, 256, 512, 1024), "classes": 2},
    "small": {"image": 64, "widths": (16, 32, 64), "classes": 2},
}


def _double(n: VisionNet, x: str, cin: int, cout: int) -> str:
    x = n.conv(x, cin, cout, 3, act="relu")
    return n.conv(x, cout, cout, 3, act="relu")


def _up(n: VisionNet, x: str, cin: int, cout: int) -> str:
    w = n.rng.standard_normal((cin, cout, 2, 2)) * (1.0 / math.sqrt(cin))
    b = 0.02 * n.rng.standard_normal(cout)
    name = n._name("up")
    return n.op("ConvTranspose", [x, n.const(f"{name}.weight", w), n.const(f"{name}.bias", b)],
                kernel_shape=[2, 2], strides=[2, 2])


def model(size: str = "full") -> onnx.ModelProto:
    cfg = CONFIG[size]
    widths = cfg["widths"]
    n = VisionNet(f"unet_{size}", SEED)
    x, ch, skips = "input", 3, []
    for i, w in enumerate(widths):
        if i:
            x = n.op("MaxPool", [x], kernel_shape=[2, 2], strides=[2, 2])
        x = _double(n, x, ch, w)
        ch = w
        skips.append(x)
    for skip, w in zip(reversed(skips[:-1]), reversed(widths[:-1])):
        x = n.op("Concat", [skip, _up(n, x, ch, w)], axis=1)
        x = _double(n, x, 2 * w, w)
        ch = w
    x = n.conv(x, ch, cfg["classes"], 1, bn=False, pad=0, prefix="out")
    n.rename_output(x, "logits")
    s = cfg["image"]
    return n.model(["batch", 3, s, s], [("logits", ["batch", cfg["classes"], s, s])],
                   doc=f"edgetune zoo U-Net ({size}), seeded random weights, NCHW input")
