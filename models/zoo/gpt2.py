"""GPT-2 (124M; Radford et al. 2019) decoder with a KV cache, seeded random weights.

One graph serves prefill and decode. Inputs: ``input_ids`` int64 [batch, seq] and, per layer i,
``past_key_<i>`` / ``past_value_<i>`` float32 [batch, heads, past, head_dim]; outputs ``logits``
[batch, seq, vocab] and ``present_key_<i>`` / ``present_value_<i>`` [batch, heads, past+seq,
head_dim] (the past with this step's keys/values appended on axis 2).

* prefill: ``past = 0`` — zero-length past tensors (shape [batch, heads, 0, head_dim]); both
  onnxruntime and ``onnx.reference`` accept them (tests/unit/test_zoo_text.py runs it), so no
  separate prefill graph is needed. ``DIMS`` is the prefill setting.
* decode: ``seq = 1`` with the previous step's ``present_*`` fed back as ``past_*`` — ``DECODE``.

Positions are ``past .. past+seq-1`` (learned table, Gather). The causal mask accounts for the past:
query i (absolute position past+i) sees keys j <= past + i; it is additive (0 / -1e9, [seq, past+seq]).
Pre-LN blocks (LayerNorm eps 1e-5, exact-erf GELU — GPT-2's tanh "gelu_new" differs by <1e-3),
final LayerNorm, LM head tied to the token embedding (``logits = h @ wte^T``).

full: vocab 50257, ctx 1024, 12 layers, d=768, 12 heads of 64, MLP 3072 (124.4M parameters).
small: vocab 512, ctx 128, 2 layers, d=64, 4 heads of 16, MLP 256.
"""

from __future__ import annotations

import onnx
from onnx import TensorProto

from models.zoo._nn import NEG, NO_TFLITE, Net, tensor

TITLE = "GPT-2 (124M, KV cache)"
FAMILY = "decoder"
TFLITE = NO_TFLITE
SEED = 50_257
DIMS = {"small": {"batch": 1, "seq": 8, "past": 0}, "full": {"batch": 1, "seq": 128, "past": 0}}
# one decode step after a prefill of DIMS[size]["seq"] tokens
DECODE = {"small": {"batch": 1, "seq": 1, "past": 8}, "full": {"batch": 1, "seq": 1, "past": 128}}

CONFIGS = {
    "small": dict(vocab=512, ctx=128, layers=2, d=64, heads=4, d_ff=256),
    "full": dict(vocab=50257, ctx=1024, layers=12, d=768, heads=12, d_ff=3072),
}


def causal_bias(g: Net, past: str, seq: str) -> tuple[str, str]:
    """(positions [seq] = past..past+seq-1, additive mask [seq, past+seq]: 0 where j <= past+i)."""
    total = g.op("Add", [past, seq])
    pos = g.op("Range", [past, total, g.c64(1)])
    keys = g.op("Range", [g.c64(0), total, g.c64(1)])
    allowed = g.op("LessOrEqual", [keys, g.op("Unsqueeze", [pos, g.c64([1])])])
    return pos, g.op("Where", [allowed, g.c(0.0), g.c(NEG)])


def model(size: str) -> onnx.ModelProto:
    cfg = CONFIGS[size]
    d, heads, n_layers = cfg["d"], cfg["heads"], cfg["layers"]
    hd = d // heads
    g = Net(f"gpt2_{size}", SEED)

    wte = g.const("wte", g.normal((cfg["vocab"], d), 0.02))
    wpe = g.const("wpe", g.normal((cfg["ctx"], d), 0.01))
    pos, bias = causal_bias(g, g.dim("past_key_0", 2), g.dim("input_ids", 1))
    x = g.op("Add", [g.op("Gather", [wte, "input_ids"], axis=0), g.op("Gather", [wpe, pos], axis=0)])

    for i in range(n_layers):
        p = f"h.{i}"
        h = g.layernorm(x, f"{p}.ln_1", d)
        q = g.split_heads(g.linear(h, f"{p}.attn.q", d, d), heads, hd)
        k = g.split_heads(g.linear(h, f"{p}.attn.k", d, d), heads, hd)
        v = g.split_heads(g.linear(h, f"{p}.attn.v", d, d), heads, hd)
        k = g.op("Concat", [f"past_key_{i}", k], out=f"present_key_{i}", axis=2)
        v = g.op("Concat", [f"past_value_{i}", v], out=f"present_value_{i}", axis=2)
        o = g.merge_heads(g.sdpa(q, k, v, hd, bias), heads, hd)
        x = g.op("Add", [x, g.linear(o, f"{p}.attn.proj", d, d, gain=0.5)])
        x = g.op("Add", [x, g.gelu_mlp(g.layernorm(x, f"{p}.ln_2", d), f"{p}.mlp", d, cfg["d_ff"])])
    x = g.layernorm(x, "ln_f", d)
    g.op("MatMul", [x, g.op("Transpose", [wte], perm=[1, 0])], out="logits")

    cache = ["batch", heads, "past", hd]
    inputs = [tensor("input_ids", TensorProto.INT64, ["batch", "seq"])]
    outputs = [tensor("logits", TensorProto.FLOAT, ["batch", "seq", cfg["vocab"]])]
    for i in range(n_layers):
        inputs += [tensor(f"past_key_{i}", TensorProto.FLOAT, cache),
                   tensor(f"past_value_{i}", TensorProto.FLOAT, cache)]
        outputs += [tensor(f"present_key_{i}", TensorProto.FLOAT, ["batch", heads, "past+seq", hd]),
                    tensor(f"present_value_{i}", TensorProto.FLOAT, ["batch", heads, "past+seq", hd])]
    return g.model(inputs, outputs, doc=f"edgetune zoo: {TITLE} ({size}), seeded random weights")
