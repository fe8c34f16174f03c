"""Whisper encoder (Radford et al. 2022; "base" at full size) with seeded random weights.

Conv stem: Conv1d(mels -> d, k=3, pad 1) + GELU, Conv1d(d -> d, k=3, stride 2, pad 1) + GELU,
then [batch, frames/2, d] plus sinusoidal positions (Whisper's table, an initializer named
``embed_positions``), pre-LN blocks (LayerNormalization, MHA — key projection without bias as in
Whisper — exact-GELU MLP 4d), final LayerNorm.

Input ``input_features`` float32 [batch, mels, frames]; output ``last_hidden_state`` float32
[batch, frames/2, d]. Frames are fixed (3000 full = 30 s of audio, 64 small): Whisper's encoder
takes exactly the 30 s window its position table was made for, so only ``batch`` is dynamic.

full (base): 80 mel bins, 3000 frames, d=512, 6 layers, 8 heads of 64, MLP 2048 (~20.6M parameters
counting the 1500x512 position table as HF does, 19.8M without). small: 32 mel bins, 64 frames,
d=64, 2 layers, 4 heads, MLP 256.
"""

from __future__ import annotations

import math

import numpy as np
import onnx
from onnx import TensorProto

from models.zoo._nn import NO_TFLITE, Net, tensor

TITLE = "Whisper encoder (base)"
FAMILY = "audio"
TFLITE = NO_TFLITE
SEED = 1_500
DIMS = {"small": {"batch": 1}, "full": {"batch": 1}}

CONFIGS = {
    "small": dict(mels=32, frames=64, d=64, layers=2, heads=4, d_ff=256),
    "full": dict(mels=80, frames=3000, d=512, layers=6, heads=8, d_ff=2048),
}


def sinusoids(length: int, channels: int, max_timescale: float = 10000.0) -> np.ndarray:
    """Whisper's position table: [sin | cos] of position * geometric timescales."""
    inc = math.log(max_timescale) / (channels // 2 - 1)
    inv = np.exp(-inc * np.arange(channels // 2, dtype=np.float64))
    t = np.arange(length, dtype=np.float64)[:, None] * inv[None, :]
    return np.concatenate([np.sin(t), np.cos(t)], axis=1).astype(np.float32)


def model(size: str) -> onnx.ModelProto:
    c = CONFIGS[size]
    d, heads, mels = c["d"], c["heads"], c["mels"]
    hd = d // heads
    g = Net(f"whisper_encoder_{size}", SEED)

    def conv(x: str, name: str, c_in: int, stride: int) -> str:
        w = g.const(f"{name}.weight", g.normal((d, c_in, 3), math.sqrt(2.0 / (3 * c_in))))
        b = g.const(f"{name}.bias", g.normal((d,), 0.02))
        return g.gelu(g.op("Conv", [x, w, b], kernel_shape=[3], pads=[1, 1], strides=[stride]))

    x = conv("input_features", "conv1", mels, 1)
    x = conv(x, "conv2", d, 2)
    x = g.op("Transpose", [x], perm=[0, 2, 1])  # [B, T, d]
    x = g.op("Add", [x, g.const("embed_positions", sinusoids(c["frames"] // 2, d))])

    for i in range(c["layers"]):
        p = f"layers.{i}"
        h = g.layernorm(x, f"{p}.attn_ln", d)
        q = g.split_heads(g.linear(h, f"{p}.attn.q", d, d), heads, hd)
        k = g.split_heads(g.linear(h, f"{p}.attn.k", d, d, bias=False), heads, hd)
        v = g.split_heads(g.linear(h, f"{p}.attn.v", d, d), heads, hd)
        o = g.merge_heads(g.sdpa(q, k, v, hd), heads, hd)
        x = g.op("Add", [x, g.linear(o, f"{p}.attn.out", d, d, gain=0.5)])
        x = g.op("Add", [x, g.gelu_mlp(g.layernorm(x, f"{p}.mlp_ln", d), f"{p}.mlp", d, c["d_ff"])])
    x = g.layernorm(x, "ln_post", d)
    g.op("Identity", [x], out="last_hidden_state")
    return g.model([tensor("input_features", TensorProto.FLOAT, ["batch", mels, c["frames"]])],
                   [tensor("last_hidden_state", TensorProto.FLOAT, ["batch", c["frames"] // 2, d])],
                   doc=f"edgetune zoo: {TITLE} ({size}), seeded random weights")
