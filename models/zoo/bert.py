"""BERT-base encoder (Devlin et al. 2018) with seeded random weights.

Embeddings: token + position + segment (segment 0 for every token: there is no
``token_type_ids`` input), each a Gather on its table, summed, LayerNorm (eps 1e-12). Post-LN
blocks: ``x = LN(x + MHA(x, mask)); x = LN(x + W2 GELU(W1 x))``. The attention mask is additive:
``Where(attention_mask != 0, 0, -1e9)`` broadcast as [batch, 1, 1, seq] — the same as HF's
``(1 - mask) * min`` for 0/1 masks, and any nonzero id counts as "attend" (so seeded integer
inputs stay a valid mask). No pooler (the output is the encoder's ``last_hidden_state``).

Inputs ``input_ids`` int64 [batch, seq], ``attention_mask`` int64 [batch, seq] (1 = attend);
output ``last_hidden_state`` float32 [batch, seq, d]. seq <= max positions (512 full, 64 small).

full: vocab 30522, 12 layers, d=768, 12 heads, FFN 3072 (~108.9M parameters with embeddings;
110M with the 0.6M pooler this graph leaves out). small: vocab 512, 2 layers, d=64, 4 heads, FFN 256.
"""

from __future__ import annotations

import onnx
from onnx import TensorProto

from models.zoo._nn import NEG, NO_TFLITE, Net, tensor

TITLE = "BERT-base (encoder)"
FAMILY = "text"
TFLITE = NO_TFLITE
SEED = 30_522
DIMS = {"small": {"batch": 1, "seq": 8}, "full": {"batch": 1, "seq": 128}}

CONFIGS = {
    "small": dict(vocab=512, max_pos=64, types=2, layers=2, d=64, heads=4, d_ff=256),
    "full": dict(vocab=30522, max_pos=512, types=2, layers=12, d=768, heads=12, d_ff=3072),
}
EPS = 1e-12


def model(size: str) -> onnx.ModelProto:
    cfg = CONFIGS[size]
    d, heads = cfg["d"], cfg["heads"]
    g = Net(f"bert_base_{size}", SEED)

    wte = g.const("embeddings.word", g.normal((cfg["vocab"], d), 0.02))
    wpe = g.const("embeddings.position", g.normal((cfg["max_pos"], d), 0.02))
    wtt = g.const("embeddings.token_type", g.normal((cfg["types"], d), 0.02))
    seq = g.dim("input_ids", 1)
    pos = g.op("Range", [g.c64(0), seq, g.c64(1)])
    x = g.op("Gather", [wte, "input_ids"], axis=0)
    x = g.op("Add", [x, g.op("Gather", [wpe, pos], axis=0)])
    x = g.op("Add", [x, g.op("Gather", [wtt, g.c64(0)], axis=0)])
    x = g.layernorm(x, "embeddings.ln", d, EPS)

    keep = g.op("Cast", ["attention_mask"], to=TensorProto.BOOL)  # nonzero = attend
    bias = g.op("Where", [keep, g.c(0.0), g.c(NEG)])
    bias = g.op("Unsqueeze", [bias, g.c64([1, 2])])  # [B, 1, 1, S]

    for i in range(cfg["layers"]):
        a = g.mha(x, f"layers.{i}.attn", d, heads, bias=bias)
        x = g.layernorm(g.op("Add", [x, a]), f"layers.{i}.ln1", d, EPS)
        f = g.gelu_mlp(x, f"layers.{i}.ffn", d, cfg["d_ff"])
        x = g.layernorm(g.op("Add", [x, f]), f"layers.{i}.ln2", d, EPS)
    g.op("Identity", [x], out="last_hidden_state")
    return g.model([tensor("input_ids", TensorProto.INT64, ["batch", "seq"]),
                    tensor("attention_mask", TensorProto.INT64, ["batch", "seq"])],
                   [tensor("last_hidden_state", TensorProto.FLOAT, ["batch", "seq", d])],
                   doc=f"edgetune zoo: {TITLE} ({size}), seeded random weights")
