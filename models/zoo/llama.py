"""LLaMA-style decoder (TinyLlama-1.1B config at full size) with a KV cache, seeded random weights.

Pre-norm blocks: ``x += Wo . GQA(RoPE(Wq h), RoPE(Wk h), Wv h)`` with ``h = RMSNorm(x)``, then
``x += W2 (SiLU(W1 h) * W3 h)`` (SwiGLU) with ``h = RMSNorm(x)``; final RMSNorm, untied LM head.
No biases. RMSNorm is written with standard ops (``x / Sqrt(ReduceMean(Pow(x, 2)) + eps) * g``).
RoPE (theta 10000, HF "rotate_half" layout): cos/sin tables [max_pos, head_dim] are initializers
(``rope.cos`` / ``rope.sin``, not parameters) gathered at positions ``past .. past+seq-1``;
``rotate_half(x)`` is ``x @ R`` with a fixed signed permutation matrix (``rope.rotate``).

Grouped-query attention: the cache holds the KV heads only — ``past_key_<i>`` /
``past_value_<i>`` float32 [batch, kv_heads, past, head_dim], ``present_*`` [batch, kv_heads,
past+seq, head_dim]; in the graph each KV head is repeated to its group of query heads
(Unsqueeze -> Expand -> Reshape). Inputs/outputs, the causal mask (query i sees keys
j <= past + i) and prefill/decode usage are as in :mod:`models.zoo.gpt2`: one graph, prefill with a
zero-length past (``DIMS``), decode with seq 1 (``DECODE``).

full (TinyLlama-1.1B): vocab 32000, 22 layers, d=2048, 32 query heads / 4 KV heads of 64, FFN
5632, RMSNorm eps 1e-5, max positions 2048 — 1,100,048,384 parameters = 4.4 GB float32, which
``models.zoo.build`` writes as external data (weights are raw_data initializers). small: vocab
512, 2 layers, d=64, 4 query / 2 KV heads of 16, FFN 172, max positions 128.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto

from models.zoo._nn import NO_TFLITE, Net, tensor
from models.zoo.gpt2 import causal_bias

TITLE = "LLaMA (TinyLlama-1.1B config, GQA, KV cache)"
FAMILY = "decoder"
TFLITE = NO_TFLITE
SEED = 11_000
DIMS = {"small": {"batch": 1, "seq": 8, "past": 0}, "full": {"batch": 1, "seq": 128, "past": 0}}
DECODE = {"small": {"batch": 1, "seq": 1, "past": 8}, "full": {"batch": 1, "seq": 1, "past": 128}}

CONFIGS = {
    "small": dict(vocab=512, layers=2, d=64, heads=4, kv_heads=2, d_ff=172, max_pos=128,
                  eps=1e-5, theta=10000.0),
    "full": dict(vocab=32000, layers=22, d=2048, heads=32, kv_heads=4, d_ff=5632, max_pos=2048,
                 eps=1e-5, theta=10000.0),
}


def param_count(size: str) -> int:
    """Parameters from the config arithmetic (what ``model(size)`` holds, RoPE tables aside)."""
    c = CONFIGS[size]
    d, hd = c["d"], c["d"] // c["heads"]
    attn = d * d + 2 * d * c["kv_heads"] * hd + d * d
    mlp = 3 * d * c["d_ff"]
    return 2 * c["vocab"] * d + c["layers"] * (attn + mlp + 2 * d) + d


def rope_tables(head_dim: int, max_pos: int, theta: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    inv = 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    freqs = np.outer(np.arange(max_pos, dtype=np.float64), inv)
    emb = np.concatenate([freqs, freqs], axis=1)
    half = head_dim // 2
    rot = np.zeros((head_dim, head_dim), np.float32)  # x @ rot == cat(-x[half:], x[:half])
    for j in range(half):
        rot[j + half, j] = -1.0
        rot[j, j + half] = 1.0
    return np.cos(emb).astype(np.float32), np.sin(emb).astype(np.float32), rot


def model(size: str) -> onnx.ModelProto:
    c = CONFIGS[size]
    d, heads, kvh, n_layers = c["d"], c["heads"], c["kv_heads"], c["layers"]
    hd, rep = d // heads, heads // kvh
    g = Net(f"llama_{size}", SEED)

    cos_t, sin_t, rot_m = rope_tables(hd, c["max_pos"], c["theta"])
    cos_tab, sin_tab, rot = g.const("rope.cos", cos_t), g.const("rope.sin", sin_t), g.const("rope.rotate", rot_m)
    embed = g.const("embed_tokens", g.normal((c["vocab"], d), 0.02))
    pos, bias = causal_bias(g, g.dim("past_key_0", 2), g.dim("input_ids", 1))
    cos = g.op("Gather", [cos_tab, pos], axis=0)  # [S, Dh], broadcast over [B, H, S, Dh]
    sin = g.op("Gather", [sin_tab, pos], axis=0)
    expand = g.c64([1, 1, rep, 1, 1])
    grouped = g.c64([0, heads, -1, hd])

    def rope(t: str) -> str:
        return g.op("Add", [g.op("Mul", [t, cos]), g.op("Mul", [g.op("MatMul", [t, rot]), sin])])

    def repeat_kv(t: str) -> str:  # [B, KVH, T, Dh] -> [B, H, T, Dh], query head h uses KV head h // rep
        if rep == 1:
            return t
        t = g.op("Expand", [g.op("Unsqueeze", [t, g.c64([2])]), expand])
        return g.op("Reshape", [t, grouped])

    x = g.op("Gather", [embed, "input_ids"], axis=0)
    for i in range(n_layers):
        p = f"layers.{i}"
        h = g.rmsnorm(x, f"{p}.input_norm", d, c["eps"])
        q = rope(g.split_heads(g.linear(h, f"{p}.attn.q", d, heads * hd, bias=False), heads, hd))
        k = rope(g.split_heads(g.linear(h, f"{p}.attn.k", d, kvh * hd, bias=False), kvh, hd))
        v = g.split_heads(g.linear(h, f"{p}.attn.v", d, kvh * hd, bias=False), kvh, hd)
        k = g.op("Concat", [f"past_key_{i}", k], out=f"present_key_{i}", axis=2)
        v = g.op("Concat", [f"past_value_{i}", v], out=f"present_value_{i}", axis=2)
        o = g.merge_heads(g.sdpa(q, repeat_kv(k), repeat_kv(v), hd, bias), heads, hd)
        x = g.op("Add", [x, g.linear(o, f"{p}.attn.o", heads * hd, d, bias=False, gain=0.5)])
        h = g.rmsnorm(x, f"{p}.post_attention_norm", d, c["eps"])
        gate = g.silu(g.linear(h, f"{p}.mlp.gate", d, c["d_ff"], bias=False))
        up = g.linear(h, f"{p}.mlp.up", d, c["d_ff"], bias=False)
        x = g.op("Add", [x, g.linear(g.op("Mul", [gate, up]), f"{p}.mlp.down", c["d_ff"], d,
                                     bias=False, gain=0.5)])
    x = g.rmsnorm(x, "norm", d, c["eps"])
    g.op("MatMul", [x, g.const("lm_head.weight", g.normal((d, c["vocab"]), d ** -0.5))], out="logits")

    cache = ["batch", kvh, "past", hd]
    inputs = [tensor("input_ids", TensorProto.INT64, ["batch", "seq"])]
    outputs = [tensor("logits", TensorProto.FLOAT, ["batch", "seq", c["vocab"]])]
    for i in range(n_layers):
        inputs += [tensor(f"past_key_{i}", TensorProto.FLOAT, cache),
                   tensor(f"past_value_{i}", TensorProto.FLOAT, cache)]
        outputs += [tensor(f"present_key_{i}", TensorProto.FLOAT, ["batch", kvh, "past+seq", hd]),
                    tensor(f"present_value_{i}", TensorProto.FLOAT, ["batch", kvh, "past+seq", hd])]
    return g.model(inputs, outputs, doc=f"edgetune zoo: {TITLE} ({size}), seeded random weights")
