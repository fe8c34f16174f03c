"""YOLOv8n-style detector (Ultralytics v8 layout, depth 0.33 / width 0.25, 80 classes).

full:  input ``input`` float32 [batch, 3, 640, 640] NCHW -> ``detections`` [batch, 84, 8400]
       (rows 0-3: box centre x, y, width, height in input pixels; rows 4-83: class
       probabilities; one column per anchor point of the three scales, strides 8 / 16 / 32).
       Backbone: Conv 3x3/2 (conv + folded BN + SiLU) and C2f blocks (Split, Bottlenecks with
       shortcut, Concat, 1x1), SPPF (three chained MaxPool 5x5). Neck: Resize (nearest, x2) +
       Concat top-down, Conv/2 + Concat bottom-up, C2f without shortcut. Head: per scale a box
       branch (2 x Conv 3x3, 1x1 -> 4 x 16 DFL bins) and a class branch (2 x Conv 3x3, 1x1 -> 80);
       DFL = Softmax over the bins, expectation; boxes decoded against the anchor grid.
       SiLU is spelled ``x * Sigmoid(x)``. ~3.15 M parameters.
small: width 0.125, one Bottleneck per C2f, input 128x128 -> [batch, 84, 336].
"""

from __future__ import annotations

import numpy as np
import onnx

from models.zoo._vision import TFLITE_REASON, VisionNet

TITLE = "YOLOv8n-style detector (C2f, SPPF, FPN/PAN neck, DFL head)"
FAMILY = "detection"
DIMS = {"small": {"batch": 1}, "full": {"batch": 1}}
TFLITE = TFLITE_REASON
SEED = 8_2023

NUM_CLASSES = 80
REG_MAX = 16
STRIDES = (8, 16, 32)
CONFIG = {
    "full": {"image": 640, "width": 0.25, "depth": 0.33},
    "small": {"image": 128, "width": 0.125, "depth": 0.0},
}


def _ch(c: int, width: float) -> int:
    # ultralytics make_divisible(min(c, max_channels) * width, 8)
    return int(np.ceil(min(c, 1024) * width / 8) * 8)


def _n(n: int, depth: float) -> int:
    return max(round(n * depth), 1) if n > 1 else n


def _conv(n: VisionNet, x: str, cin: int, cout: int, k: int = 1, s: int = 1, gain: float = 0.97) -> str:
    return n.conv(x, cin, cout, k, stride=s, act="silu", gain=gain)


def _c2f(n: VisionNet, x: str, cin: int, cout: int, reps: int, shortcut: bool) -> str:
    c = cout // 2
    y = _conv(n, x, cin, 2 * c, 1)
    split = n.const(n._name("split"), np.array([c, c], np.int64), count=False)
    parts = n.ops("Split", [y, split], 2, axis=1)
    last = parts[1]
    for _ in range(reps):
        b = _conv(n, last, c, c, 3)
        b = _conv(n, b, c, c, 3, gain=0.5 if shortcut else 1.0)
        last = n.op("Add", [last, b]) if shortcut else b
        parts.append(last)
    cat = n.op("Concat", parts, axis=1)
    return _conv(n, cat, (2 + reps) * c, cout, 1)


def _sppf(n: VisionNet, x: str, cin: int, cout: int) -> str:
    c = cin // 2
    y = [_conv(n, x, cin, c, 1)]
    for _ in range(3):
        y.append(n.op("MaxPool", [y[-1]], kernel_shape=[5, 5], strides=[1, 1], pads=[2, 2, 2, 2]))
    return _conv(n, n.op("Concat", y, axis=1), 4 * c, cout, 1)


def _upsample(n: VisionNet, x: str) -> str:
    scales = n.const(n._name("resize_scales"), np.array([1.0, 1.0, 2.0, 2.0], np.float32), count=False)
    return n.op("Resize", [x, "", scales], mode="nearest", coordinate_transformation_mode="asymmetric",
                nearest_mode="floor")


def _anchors(image: int) -> tuple[np.ndarray, np.ndarray]:
    pts, strides = [], []
    for s in STRIDES:
        g = image // s
        sy, sx = np.meshgrid(np.arange(g) + 0.5, np.arange(g) + 0.5, indexing="ij")
        pts.append(np.stack([sx.ravel(), sy.ravel()]))
        strides.append(np.full(g * g, float(s)))
    return (np.concatenate(pts, 1)[None].astype(np.float32),
            np.concatenate(strides)[None, None].astype(np.float32))


def model(size: str = "full") -> onnx.ModelProto:
    cfg = CONFIG[size]
    w, d = cfg["width"], cfg["depth"]
    n = VisionNet(f"yolov8n_{size}", SEED)
    c = {k: _ch(k, w) for k in (64, 128, 256, 512, 1024)}
    # backbone
    x = _conv(n, "input", 3, c[64], 3, 2)
    x = _conv(n, x, c[64], c[128], 3, 2)
    x = _c2f(n, x, c[128], c[128], _n(3, d), True)
    x = _conv(n, x, c[128], c[256], 3, 2)
    p3 = _c2f(n, x, c[256], c[256], _n(6, d), True)
    x = _conv(n, p3, c[256], c[512], 3, 2)
    p4 = _c2f(n, x, c[512], c[512], _n(6, d), True)
    x = _conv(n, p4, c[512], c[1024], 3, 2)
    x = _c2f(n, x, c[1024], c[1024], _n(3, d), True)
    p5 = _sppf(n, x, c[1024], c[1024])
    # neck: top-down
    x = n.op("Concat", [_upsample(n, p5), p4], axis=1)
    h4 = _c2f(n, x, c[1024] + c[512], c[512], _n(3, d), False)
    x = n.op("Concat", [_upsample(n, h4), p3], axis=1)
    o3 = _c2f(n, x, c[512] + c[256], c[256], _n(3, d), False)
    # neck: bottom-up
    x = n.op("Concat", [_conv(n, o3, c[256], c[256], 3, 2), h4], axis=1)
    o4 = _c2f(n, x, c[256] + c[512], c[512], _n(3, d), False)
    x = n.op("Concat", [_conv(n, o4, c[512], c[512], 3, 2), p5], axis=1)
    o5 = _c2f(n, x, c[512] + c[1024], c[1024], _n(3, d), False)
    # head
    chs = (c[256], c[512], c[1024])
    c2 = max(16, chs[0] // 4, REG_MAX * 4)
    c3 = max(chs[0], min(NUM_CLASSES, 100))
    no = NUM_CLASSES + 4 * REG_MAX
    flat_shape = n.const("head_flat_shape", np.array([0, no, -1], np.int64), count=False)
    flat = []
    for feat, ch in zip((o3, o4, o5), chs):
        box = _conv(n, _conv(n, feat, ch, c2, 3), c2, c2, 3)
        box = n.conv(box, c2, 4 * REG_MAX, 1, bn=False, prefix="box_pred")
        cls = _conv(n, _conv(n, feat, ch, c3, 3), c3, c3, 3)
        cls = n.conv(cls, c3, NUM_CLASSES, 1, bn=False, prefix="cls_pred")
        flat.append(n.op("Reshape", [n.op("Concat", [box, cls], axis=1), flat_shape]))
    y = n.op("Concat", flat, axis=2)  # [b, 144, A]
    sizes = n.const("head_split", np.array([4 * REG_MAX, NUM_CLASSES], np.int64), count=False)
    box, cls = n.ops("Split", [y, sizes], 2, axis=1)
    # DFL: softmax over 16 bins per side, expectation of the bin index
    bins_shape = n.const("dfl_shape", np.array([0, 4, REG_MAX, -1], np.int64), count=False)
    prob = n.op("Softmax", [n.op("Reshape", [box, bins_shape])], axis=2)
    proj = n.const("dfl_proj", np.arange(REG_MAX, dtype=np.float32).reshape(1, 1, REG_MAX, 1), count=False)
    axis2 = n.const("dfl_axis", np.array([2], np.int64), count=False)
    dist = n.op("ReduceSum", [n.op("Mul", [prob, proj]), axis2], keepdims=0)  # [b, 4, A]
    half = n.const("ltrb_split", np.array([2, 2], np.int64), count=False)
    lt, rb = n.ops("Split", [dist, half], 2, axis=1)
    anchors, strides = _anchors(cfg["image"])
    anc = n.const("anchor_points", anchors, count=False)
    std = n.const("anchor_strides", strides, count=False)
    halfc = n.const("half", np.array(0.5, np.float32), count=False)
    centre = n.op("Add", [anc, n.op("Mul", [n.op("Sub", [rb, lt]), halfc])])
    wh = n.op("Add", [lt, rb])
    dbox = n.op("Mul", [n.op("Concat", [centre, wh], axis=1), std])
    n.g.op("Concat", [dbox, n.op("Sigmoid", [cls])], out="detections", axis=1)
    s = cfg["image"]
    return n.model(["batch", 3, s, s], [("detections", ["batch", 4 + NUM_CLASSES, anchors.shape[2]])],
                   doc=f"edgetune zoo YOLOv8n-style detector ({size}), seeded random weights, NCHW input")
