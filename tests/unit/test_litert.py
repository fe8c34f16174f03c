"""LiteRT candidates of ONNX models through the onnx2tf converter: real conversions (the converter
environment of tools/setup.sh), real LiteRT runs on the local device's agent, no mocks."""

from __future__ import annotations

import importlib.util
import json
import shutil

import numpy as np

import pytest

from edgetune.accuracy import AccuracyBudget
from edgetune.candidate import Candidate
from edgetune.convert import onnx2tflite
from edgetune.space import BuildFailed
from edgetune.space.litert import SPACE
from edgetune.tune import tune
from edgetune.tune_config import TuneConfig
from edgetune.verify import compare, tolerance_for
from edgetune.modelfile import load_model
from edgetune.workload import build_workload
from tests.conftest import require, share_conversions


def _need_converter():
    require(importlib.util.find_spec("ai_edge_litert") is not None, "ai-edge-litert not installed")
    why = onnx2tflite.unavailable_reason()
    require(why is None, why or "")


@pytest.fixture(scope="module")
def home(tmp_path_factory, conversions):
    """One edgetune home for the module, its conversions in the run's shared cache (tests/conftest.py)."""
    return share_conversions(tmp_path_factory.mktemp("litert-home"), conversions)


@pytest.fixture
def shared_home(home, monkeypatch):
    monkeypatch.setenv("EDGETUNE_HOME", str(home))
    return home


@pytest.fixture(scope="module")
def mobilenet(tmp_path_factory):
    import models

    return load_model(models.build_onnx("mobilenet", tmp_path_factory.mktemp("m") / "mobilenet.onnx"))


def _cfg(**kw):
    base = dict(budget_s=1.5, rounds=1, finalists=2, timeout_s=20, spaces=("litert",), max_candidates=2,
                confirm_rounds=2)
    base.update(kw)
    return TuneConfig(**base)


def _shape(out):
    dev = out.devices[0]
    assert dev.status == "complete", dev.error
    return dev.summary.shapes[0]


def test_fp32_conversion_has_a_verified_layout_mapping(mobilenet, home):
    _need_converter()
    from ai_edge_litert.interpreter import Interpreter

    wl = build_workload(mobilenet, {"batch": 1})
    conv = onnx2tflite.convert(wl, "fp32", home / "artifacts")
    # NCHW [1, 3, 96, 96] -> NHWC, matched by name; logits [1, 1000] as they are
    assert [(m.name, m.perm) for m in conv.inputs] == [("input", (0, 2, 3, 1))]
    assert [(m.name, m.perm) for m in conv.outputs] == [("logits", (0, 1))]
    params = conv.layout_params()
    assert params["inputs"][0]["perm"] == [0, 2, 3, 1] and isinstance(params["outputs"][0]["index"], int)
    # the mapping, applied by hand, gives the ONNX model's outputs within the float32 tolerance
    interp = Interpreter(model_path=str(conv.path))
    interp.allocate_tensors()
    for x, (ref,) in zip(wl.input_sets, wl.references()):
        interp.set_tensor(conv.inputs[0].index, np.ascontiguousarray(x[0].transpose(conv.inputs[0].perm)))
        interp.invoke()
        y = interp.get_tensor(conv.outputs[0].index).transpose(conv.outputs[0].perm)
        e = compare(y, ref, tolerance_for("float32"))
        assert e.excess <= 1.0 and e.norm_rel <= 1e-4
    # cached: the same key is not converted again
    assert onnx2tflite.convert(wl, "fp32", home / "artifacts").path == conv.path


def test_corrupted_conversion_is_a_conversion_mismatch(mobilenet, home, tmp_path):
    _need_converter()
    wl = build_workload(mobilenet, {"batch": 1})
    conv = onnx2tflite.convert(wl, "fp32", home / "artifacts")
    bad = tmp_path / "bad.tflite"
    shutil.copyfile(conv.path, bad)
    data = bytearray(bad.read_bytes())
    mid = len(data) // 2  # inside the classifier's 256x1000 weights (most of the file)
    data[mid: mid + 65536] = np.random.default_rng(0).standard_normal(16384).astype(np.float32).tobytes()
    bad.write_bytes(bytes(data))
    with pytest.raises(BuildFailed, match="^conversion-mismatch: "):
        onnx2tflite.map_and_verify(bad, wl, "fp32")


def test_tune_records_verified_litert_candidates(mobilenet, shared_home, tmp_path):
    _need_converter()
    out = tune(mobilenet.path, ["local"], dims=["batch=1"], db=tmp_path / "t.db",
               config=_cfg(spaces=("ort", "litert"), max_candidates=1))
    s = _shape(out)
    lite = [c for c in s.candidates if c.candidate.backend == "litert"]
    labels = {c.candidate.label(): c for c in lite}
    assert "litert default (fp32)" in labels, list(labels)
    assert all(c.status == "verified" for c in lite), [(c.candidate.label(), c.reason) for c in lite]
    assert all(c.max_rel_err <= 1e-4 for c in lite)
    assert any(c.candidate.backend == "ort" and c.status == "verified" for c in s.candidates)


def test_unconvertible_model_is_a_named_candidate_failure(shared_home, tmp_path):
    """onnxruntime runs a contrib op (com.microsoft FusedMatMul) onnx2tf has no conversion for."""
    _need_converter()
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(np.random.default_rng(1).standard_normal((16, 8)).astype(np.float32), "W")
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 16])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8])
    node = helper.make_node("FusedMatMul", ["x", "W"], ["y"], domain="com.microsoft", alpha=1.0)
    m = helper.make_model(helper.make_graph([node], "fused", [x], [y], [w]), ir_version=8,
                          opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    onnx.save(m, str(tmp_path / "fused.onnx"))
    out = tune(tmp_path / "fused.onnx", ["local"], db=tmp_path / "t.db", config=_cfg(max_candidates=1))
    lite = [c for c in _shape(out).candidates if c.candidate.backend == "litert"]
    assert lite and all(c.status == "failed" for c in lite)
    assert all(c.reason.startswith("build failed: conversion") for c in lite), [c.reason for c in lite]
    assert all("Traceback" not in c.reason and "\n" not in c.reason for c in lite)


def test_approximate_litert_candidates_are_judged_by_accuracy(mobilenet, shared_home, tmp_path):
    _need_converter()
    approx = [Candidate.make("litert", {"precision": "fp16", "num_threads": 1, "xnnpack": True}),
              Candidate.make("litert", {"precision": "int8", "quant": "full", "num_threads": 1, "xnnpack": True})]
    assert all(c.approximate for c in approx)
    extra = [(c, SPACE) for c in approx]
    base = Candidate.make("litert", {"precision": "fp32"}, baseline=True)
    cfg = dict(spaces=(), extra=[(base, SPACE), *extra], max_candidates=None)
    # without a budget: each fails as approximate (never selectable), with its accuracy measured
    s = _shape(tune(mobilenet.path, ["local"], dims=["batch=1"], db=tmp_path / "a.db", config=_cfg(**cfg)))
    by_key = {c.candidate.key(): c for c in s.candidates}
    for c in approx:
        got = by_key[c.key()]
        assert got.status == "failed" and "accuracy budget" in got.reason, (c.label(), got.reason)
        assert got.accuracy and got.accuracy["cosine"] > 0.9
    # with one: judged by it, fp16 and calibrated int8 within a cosine of 0.99
    budget = AccuracyBudget(cosine=0.99)
    s = _shape(tune(mobilenet.path, ["local"], dims=["batch=1"], db=tmp_path / "b.db",
                    config=_cfg(accuracy=budget, **cfg)))
    by_key = {c.candidate.key(): c for c in s.candidates}
    for c in approx:
        got = by_key[c.key()]
        assert got.status == "verified", (c.label(), got.reason)
        assert got.accuracy["cosine"] >= 0.99


def test_a_conversion_that_times_out_is_remembered_with_its_limit(mobilenet, tmp_path, monkeypatch):
    _need_converter()
    monkeypatch.setattr(onnx2tflite, "_load", lambda: 0.5)  # a machine not oversubscribed, then and now
    wl = build_workload(mobilenet, {"batch": 3}, {}, n_seeded=1)  # a shape no other test converts
    with pytest.raises(BuildFailed, match="timed out after 0.5 s"):
        onnx2tflite.convert(wl, "fp32", tmp_path, timeout_s=0.5)
    with pytest.raises(BuildFailed, match=r"timed out after 0.5 s .*\(earlier in this run\)"):
        onnx2tflite.convert(wl, "int8-dynamic", tmp_path, timeout_s=900)  # needs the same fp32 conversion
    assert not list((tmp_path / "onnx2tf").glob("*.failed"))  # never a deterministic failure
    marks = list((tmp_path / "onnx2tf").glob("*.timeout"))
    assert len(marks) == 1 and json.loads(marks[0].read_text())["timeout_s"] == 0.5
    # a later run (this process's memory of the run forgotten): within the same limit it fails at once,
    # without starting the converter
    monkeypatch.setattr(onnx2tflite, "_TRANSIENT", {})
    calls = []
    real_child = onnx2tflite._child
    monkeypatch.setattr(onnx2tflite, "_child", lambda *a, **k: (calls.append(a), real_child(*a, **k)))
    with pytest.raises(BuildFailed, match=r"timed out after 0.5 s .*in an earlier run.*a longer one tries again"):
        onnx2tflite.convert(wl, "fp32", tmp_path, timeout_s=0.5)
    assert calls == []
    # with a longer limit it tries again (and remembers the longer limit when that runs out too)
    with pytest.raises(BuildFailed, match="timed out after 0.7 s"):
        onnx2tflite.convert(wl, "fp32", tmp_path, timeout_s=0.7)
    assert len(calls) == 1 and json.loads(marks[0].read_text())["timeout_s"] == 0.7


def test_a_timeout_mark_is_kept_for_its_limit_and_removed_by_a_success(tmp_path, monkeypatch):
    """The rule of ``_build`` alone (no converter): a remembered timeout bounds what is retried."""
    load = [0.5]  # the load per core _build sees
    monkeypatch.setattr(onnx2tflite, "_load", lambda: load[0])
    monkeypatch.setattr(onnx2tflite, "_TRANSIENT", {})
    made = []

    def times_out(tmp):
        made.append("slow")
        raise onnx2tflite._Transient("conversion failed: timed out after 5 s", timeout_s=5.0)

    def succeeds(tmp):
        made.append("ok")
        (tmp / "mapping.json").write_text("{}")

    with pytest.raises(BuildFailed, match="timed out after 5 s"):
        onnx2tflite._build(tmp_path, "k", times_out, 5.0)
    onnx2tflite._TRANSIENT.clear()
    with pytest.raises(BuildFailed, match="in an earlier run"):
        onnx2tflite._build(tmp_path, "k", succeeds, 4.0)  # a shorter limit: not tried
    assert made == ["slow"]
    assert json.loads((tmp_path / "k.timeout").read_text())["load_per_core"] == 0.5
    # a timeout on an oversubscribed machine holds while it still is, and is tried again once it is not
    onnx2tflite._TRANSIENT.clear()
    load[0] = 3.0
    with pytest.raises(BuildFailed, match="in an earlier run"):
        onnx2tflite._build(tmp_path, "k", times_out, 5.0)  # a mark made at 0.5 per core holds at any load
    assert made == ["slow"]
    made.clear()
    onnx2tflite._TRANSIENT.clear()
    (tmp_path / "k.timeout").write_text(json.dumps({"timeout_s": 5.0, "reason": "r", "load_per_core": 3.0}))
    with pytest.raises(BuildFailed, match="in an earlier run"):
        onnx2tflite._build(tmp_path, "k", succeeds, 5.0)  # still oversubscribed: not tried
    load[0] = 0.8
    assert onnx2tflite._build(tmp_path, "k", succeeds, 5.0) == tmp_path / "k"  # not any more: tried, done
    assert made == ["ok"] and not (tmp_path / "k.timeout").exists()
    shutil.rmtree(tmp_path / "k")
    made.clear()
    (tmp_path / "k.timeout").write_text("not json")  # an unreadable mark is no mark
    assert onnx2tflite._build(tmp_path, "k", succeeds, 4.0) == tmp_path / "k"
    assert made == ["ok"] and not (tmp_path / "k.timeout").exists()
    assert not list(tmp_path.glob(".build-*"))  # no half-written directory left


def test_a_converted_models_layout_conversion_is_inside_its_timed_call(tmp_path):
    """The tflite backend with a layout mapping (what a converted model gets) takes inputs in the
    ONNX layout and returns outputs in it, and the transposes are inside ``run`` (PROTOCOL.md,
    step 6), as a user of the converted model pays them: new inputs written into the agent's buffers
    are what the next ``run`` computes with no other call, and the outputs come back NCHW. A shape
    that would only broadcast into the interpreter's tensor is refused, as ``set_tensor`` does."""
    require(importlib.util.find_spec("ai_edge_litert") is not None, "ai-edge-litert not installed")
    from edgetune.agent.bundle import python_agent
    from edgetune.kernels import session as S
    from edgetune.kernels.workloads import parse_workload
    from edgetune.ops import forms as F

    w = parse_workload("conv2d_nchw:N=1,C=4,H=9,W=9,K=6,R=3,S=3,stride=1,pad=1")
    weights = S.final_weights(w)
    blob, view = F.op_tflite_model(w, weights)
    assert view.in_perm == {0: (0, 2, 3, 1)} and view.out_perm == {0: (0, 2, 3, 1)}  # an NHWC model
    path = tmp_path / "conv.tflite"
    path.write_bytes(blob)
    where = tmp_path / "agent" / "edgetune_agent.py"
    where.parent.mkdir()
    shutil.copyfile(python_agent(), where)
    spec = importlib.util.spec_from_file_location("edgetune_agent_litert_test", where)
    agent = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(agent)

    from ai_edge_litert.interpreter import Interpreter

    it = Interpreter(model_path=str(path))
    (din,), (dout,) = it.get_input_details(), it.get_output_details()
    params = {"num_threads": 1, "inputs": [{"index": int(din["index"]), "perm": [0, 2, 3, 1]}],
              "outputs": [{"index": int(dout["index"]), "perm": [0, 3, 1, 2]}]}
    outs = [{"name": "y", "shape": list(w.outputs[0].shape), "dtype": "float32"}]
    b = agent.TfliteBackend(str(path), params, [w.inputs[0].name], outs)
    assert getattr(b, "stage", None) is None  # nothing runs outside the timed call
    work = [np.empty(w.inputs[0].shape, np.float32)]
    for seed in (1, 2):  # the same buffers, rewritten in place as the agent does
        xs = w.random_inputs(seed)
        for k, v in weights.items():
            xs[k] = v
        work[0][...] = xs[0]
        b.poison()
        b.run(work)
        (got,) = b.results()
        (ref,) = w.reference(xs)
        assert got.shape == tuple(w.outputs[0].shape)
        assert np.abs(got - ref).max() <= 1e-4 * np.abs(ref).max(), seed
    with pytest.raises(ValueError, match="shape"):
        b.run([np.ones((1, 4, 1, 9), np.float32)])  # (1, 1, 9, 4) would broadcast into (1, 9, 9, 4)


def test_two_builders_of_one_key_convert_it_once(tmp_path, monkeypatch):
    """The rule of ``_build`` alone: a second process (here a thread) that needs a key while the
    first converts it waits on the key's lock and then finds it built (two tunes on one home)."""
    import fcntl
    import threading

    monkeypatch.setattr(onnx2tflite, "_TRANSIENT", {})
    made, inside, release = [], threading.Event(), threading.Event()

    def slow(tmp):
        made.append(threading.current_thread().name)
        inside.set()
        assert release.wait(600)
        (tmp / "mapping.json").write_text("{}")

    got = {}

    def builder():
        got[threading.current_thread().name] = onnx2tflite._build(tmp_path, "k", slow, 5.0)

    a = threading.Thread(target=builder, name="a")
    a.start()
    assert inside.wait(600)
    with open(tmp_path / ".k.lock", "a") as probe:  # the first builder holds the key's lock while it converts
        with pytest.raises(BlockingIOError):
            fcntl.flock(probe, fcntl.LOCK_EX | fcntl.LOCK_NB)
    b = threading.Thread(target=builder, name="b")
    b.start()
    release.set()
    a.join(600)
    b.join(600)
    assert made == ["a"] and got == {"a": tmp_path / "k", "b": tmp_path / "k"}
