"""ViT-B/16 (Dosovitskiy et al. 2020) image classifier with seeded random weights.

Patch embedding Conv PxP stride P -> [B, N, d], class token prepended, learned position
embeddings, pre-LN encoder blocks (LayerNormalization, MHA, exact-GELU MLP), final LayerNorm,
linear head on the class token. Input ``pixel_values`` float32 [batch, 3, R, R]; output
``logits`` [batch, 1000].

full: 224x224, 16x16 patches (196 + 1 tokens), 12 blocks, d=768, 12 heads of 64, MLP 3072
(~86.6M parameters). small: 32x32, 8x8 patches (16 + 1 tokens), 2 blocks, d=64, 4 heads, MLP 256.
"""

from __future__ import annotations

import math

import onnx
from onnx import TensorProto

from models.zoo._nn import NO_TFLITE, Net, tensor

TITLE = "ViT-B/16"
FAMILY = "vision"
TFLITE = NO_TFLITE
SEED = 16_224
DIMS = {"small": {"batch": 1}, "full": {"batch": 1}}

CONFIGS = {
    "small": dict(res=32, patch=8, layers=2, d=64, heads=4, d_ff=256, classes=1000),
    "full": dict(res=224, patch=16, layers=12, d=768, heads=12, d_ff=3072, classes=1000),
}


def model(size: str) -> onnx.ModelProto:
    cfg = CONFIGS[size]
    res, p, d, heads = cfg["res"], cfg["patch"], cfg["d"], cfg["heads"]
    n_tok = (res // p) ** 2 + 1
    g = Net(f"vit_b16_{size}", SEED)

    w = g.const("patch.weight", g.normal((d, 3, p, p), 1.0 / math.sqrt(3 * p * p)))
    b = g.const("patch.bias", g.normal((d,), 0.02))
    x = g.op("Conv", ["pixel_values", w, b], kernel_shape=[p, p], strides=[p, p])
    x = g.op("Transpose", [g.op("Reshape", [x, g.c64([0, d, -1])])], perm=[0, 2, 1])  # [B, N, d]
    cls = g.const("cls_token", g.normal((1, 1, d), 0.02))
    bshape = g.op("Concat", [g.op("Shape", ["pixel_values"], start=0, end=1), g.c64([1, 1])], axis=0)
    x = g.op("Concat", [g.op("Expand", [cls, bshape]), x], axis=1)
    x = g.op("Add", [x, g.const("pos_embed", g.normal((1, n_tok, d), 0.02))])

    for i in range(cfg["layers"]):
        x = g.op("Add", [x, g.mha(g.layernorm(x, f"blocks.{i}.ln1", d, 1e-6), f"blocks.{i}.attn", d, heads)])
        x = g.op("Add", [x, g.gelu_mlp(g.layernorm(x, f"blocks.{i}.ln2", d, 1e-6), f"blocks.{i}.mlp", d, cfg["d_ff"])])
    x = g.layernorm(x, "norm", d, 1e-6)
    x = g.op("Gather", [x, g.c64(0)], axis=1)  # class token [B, d]
    w = g.const("head.weight", g.normal((d, cfg["classes"]), 1.0 / math.sqrt(d)))
    g.op("Add", [g.op("MatMul", [x, w]), g.const("head.bias", g.normal((cfg["classes"],), 0.02))],
         out="logits")
    return g.model([tensor("pixel_values", TensorProto.FLOAT, ["batch", 3, res, res])],
                   [tensor("logits", TensorProto.FLOAT, ["batch", cfg["classes"]])],
                   doc=f"edgetune zoo: {TITLE} ({size}), seeded random weights")
