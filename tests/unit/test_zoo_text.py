"""Zoo transformers (ViT, BERT, GPT-2, LLaMA, Whisper encoder): reproducible builds, onnxruntime
(float32) against onnx.reference on a float64 copy, KV-cache correctness for the decoders, and
parameter counts at the published sizes."""

from __future__ import annotations

import copy

import numpy as np
import onnx
import pytest
from onnx import TensorProto, numpy_helper

from models import zoo
from models.zoo import _nn

import onnxruntime as ort  # noqa: E402  (a core dependency)
from onnx.reference import ReferenceEvaluator  # noqa: E402

NAMES = ["vit_b16", "bert_base", "gpt2", "llama", "whisper_encoder"]
TOL = 1e-4


def float64_copy(m: onnx.ModelProto) -> onnx.ModelProto:
    """The same model in double: float initializers, float graph I/O and Cast-to-float become
    double (value_info dropped so shapes are re-inferred)."""
    m = copy.deepcopy(m)
    g = m.graph
    for i, t in enumerate(g.initializer):
        if t.data_type == TensorProto.FLOAT:
            g.initializer[i].CopyFrom(numpy_helper.from_array(numpy_helper.to_array(t).astype(np.float64), t.name))
    for v in list(g.input) + list(g.output):
        if v.type.tensor_type.elem_type == TensorProto.FLOAT:
            v.type.tensor_type.elem_type = TensorProto.DOUBLE
    del g.value_info[:]
    for n in g.node:
        for a in n.attribute:
            if n.op_type == "Cast" and a.name == "to" and a.i == TensorProto.FLOAT:
                a.i = TensorProto.DOUBLE
            if a.name == "value" and a.t.data_type == TensorProto.FLOAT:
                a.t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(a.t).astype(np.float64), a.t.name))
    return m


def rel_err(a: np.ndarray, ref: np.ndarray) -> float:
    return float(np.linalg.norm(a.astype(np.float64) - ref) / max(np.linalg.norm(ref), 1e-30))


def feeds(m: onnx.ModelProto, dims: dict[str, int], seed: int = 0, vocab: int = 512) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    out = {}
    for v in m.graph.input:
        shape = [d.dim_value if d.HasField("dim_value") else dims[d.dim_param] for d in v.type.tensor_type.shape.dim]
        if v.type.tensor_type.elem_type == TensorProto.INT64:
            if v.name == "attention_mask":
                a = np.ones(shape, np.int64)
                a[..., shape[-1] - 1:] = 0 if shape[-1] > 1 else 1  # last token padded
                out[v.name] = a
            else:
                out[v.name] = rng.integers(0, vocab, shape, dtype=np.int64)
        else:
            out[v.name] = rng.standard_normal(shape).astype(np.float32)
    return out


def session(m: onnx.ModelProto) -> "ort.InferenceSession":
    return ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])


class _Lazy(dict):
    def __missing__(self, name: str) -> onnx.ModelProto:
        self[name] = zoo.entry(name).mod().model("small")
        return self[name]


@pytest.fixture(scope="module")
def small_models() -> dict[str, onnx.ModelProto]:
    return _Lazy()


@pytest.mark.parametrize("name", NAMES)
def test_small_build_is_reproducible(name, tmp_path):
    a = zoo.build(name, "small", tmp_path / "a")
    b = zoo.build(name, "small", tmp_path / "b")
    assert zoo.sha256(a) == zoo.sha256(b)
    m = onnx.load(str(a))
    assert m.opset_import[0].version in (17, 18) and m.ir_version <= 9
    assert all(n.domain in ("", "ai.onnx") for n in m.graph.node)
    e = zoo.entry(name)
    assert e.title and e.family and isinstance(e.tflite, str)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("batch", [None, 2])
def test_small_matches_float64_reference(name, batch, small_models):
    m = small_models[name]
    dims = zoo.entry(name).dims("small")
    if batch:
        dims["batch"] = batch
    if "past" in dims and batch:
        dims["past"] = 3  # a decode-like step with a non-empty cache too
    x = feeds(m, dims)
    got = session(m).run(None, x)
    ref = ReferenceEvaluator(float64_copy(m)).run(
        None, {k: v.astype(np.float64) if v.dtype == np.float32 else v for k, v in x.items()})
    assert len(got) == len(ref)
    for v, g_, r in zip(m.graph.output, got, ref):
        assert g_.shape == r.shape, v.name
        assert np.isfinite(g_).all(), v.name
        assert np.abs(r).max() > 1e-3, v.name  # not vanished
        assert rel_err(g_, r) < TOL, (v.name, rel_err(g_, r))


def _empty_cache(m: onnx.ModelProto, batch: int) -> dict[str, np.ndarray]:
    out = {}
    for v in m.graph.input:
        if v.name.startswith("past_"):
            dims = v.type.tensor_type.shape.dim
            out[v.name] = np.zeros((batch, dims[1].dim_value, 0, dims[3].dim_value), np.float32)
    return out


@pytest.mark.parametrize("name", [n for n in ("gpt2", "llama") if n in NAMES])
def test_kv_cache_decode_matches_longer_prefill(name, small_models):
    m = small_models[name]
    mod = zoo.entry(name).mod()
    assert mod.DIMS["small"]["past"] == 0  # prefill runs the same graph with a zero-length past
    dec = mod.DECODE["small"]
    seq, batch = dec["past"], 2
    sess = session(m)
    out_names = [o.name for o in m.graph.output]
    ids = np.random.default_rng(7).integers(0, 512, (batch, seq + 1), dtype=np.int64)

    pre = dict(zip(out_names, sess.run(None, {"input_ids": ids[:, :seq], **_empty_cache(m, batch)})))
    past = {k.replace("present_", "past_"): v for k, v in pre.items() if k.startswith("present_")}
    assert all(v.shape[2] == seq for v in past.values())
    step = dict(zip(out_names, sess.run(None, {"input_ids": ids[:, seq:], **past})))
    assert step["logits"].shape == (batch, dec["seq"], pre["logits"].shape[-1])
    assert all(step[k].shape[2] == seq + 1 for k in step if k.startswith("present_"))

    full = dict(zip(out_names, sess.run(None, {"input_ids": ids, **_empty_cache(m, batch)})))
    assert rel_err(step["logits"][:, -1], full["logits"][:, -1].astype(np.float64)) < TOL
    assert rel_err(pre["logits"], full["logits"][:, :seq].astype(np.float64)) < TOL  # causal
    for k in step:
        if k.startswith("present_"):
            assert rel_err(step[k], full[k].astype(np.float64)) < TOL, k


def _count(name: str) -> int:
    return _nn.count_params(zoo.entry(name).mod().model("full"))


@pytest.mark.parametrize("name, expected", [("vit_b16", 86.6e6), ("bert_base", 110e6), ("gpt2", 124.4e6), ("whisper_encoder", 20.6e6)])
def test_full_parameter_count(name, expected):
    assert name in NAMES, f"{name} is not in the zoo"
    n = _count(name)
    assert abs(n - expected) / expected < 0.05, n


def test_llama_gqa_cache_and_parameter_count(small_models):
    from models.zoo import llama

    m = small_models["llama"]
    kv = {v.name: v for v in m.graph.input if v.name.startswith("past_")}
    assert len(kv) == 2 * llama.CONFIGS["small"]["layers"]
    for v in kv.values():
        dims = v.type.tensor_type.shape.dim
        assert [dims[0].dim_param, dims[1].dim_value, dims[2].dim_param, dims[3].dim_value] == ["batch", 2, "past", 16]
    sess = session(m)
    out = sess.run(None, {"input_ids": np.zeros((1, 4), np.int64), **_empty_cache(m, 1)})
    assert all(o.shape == (1, 2, 4, 16) for o in out[1:])
    # the config arithmetic is what the graph holds (checked at small size) ...
    assert _nn.count_params(m, skip=("const_", "rope.")) == llama.param_count("small")
    # ... and at full size it is TinyLlama's 1.1B (not built here: 4.4 GB of float32)
    assert abs(llama.param_count("full") - 1.1e9) / 1.1e9 < 0.05
    assert llama.CONFIGS["full"]["heads"] // llama.CONFIGS["full"]["kv_heads"] == 8


def test_bert_mask_nonzero_means_attend(small_models):
    m = small_models["bert_base"]
    sess = session(m)
    rng = np.random.default_rng(3)
    ids = rng.integers(0, 512, (2, 8), dtype=np.int64)
    mask = rng.integers(0, 16, (2, 8), dtype=np.int64)
    mask[:, 0] = 5
    assert (mask == 0).any()
    a = sess.run(None, {"input_ids": ids, "attention_mask": mask})[0]
    b = sess.run(None, {"input_ids": ids, "attention_mask": (mask != 0).astype(np.int64)})[0]
    np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)
    # masked keys do not matter: change the ids under the mask, unmasked positions keep their output
    ids2 = np.where(mask == 0, (ids + 1) % 512, ids)
    c = sess.run(None, {"input_ids": ids2, "attention_mask": mask})[0]
    keep = mask != 0
    np.testing.assert_allclose(a[keep], c[keep], rtol=1e-5, atol=1e-5)
