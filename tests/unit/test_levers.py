"""The levers beyond session options (issue 11): int8 models and transformer fusions, built on the
host, measured and verified on the device; int8 selectable only under the user's accuracy budget,
and a stored int8 configuration re-run (verify, bench) on the int8 model it was tuned with."""

from __future__ import annotations

import json

import onnx
import pytest

from edgetune.agent.host import AgentInfo
from edgetune.api import resolve_model
from edgetune.candidate import Candidate
from edgetune.errors import UserInputError
from edgetune.space import BuildFailed, space_of
from edgetune.space.ort_rewrite import FUSED, INT8, calibration_feeds, fusion_types
from edgetune.modelfile import load_model
from edgetune.workload import build_workload, shape_points
from tests.unit.test_cli import assert_one_line_error, run

LEVERS = ["--budget", "6", "--rounds", "1", "--finalists", "1", "--max-candidates", "1",
          "--space", "ort,ort-fused,ort-int8"]


@pytest.fixture
def home(tmp_path):
    return tmp_path / "home"


def _info() -> AgentInfo:
    return AgentInfo(agent="python", agent_version="t", arch="x86_64", python="3", runtimes={"onnxruntime": "x"},
                     fingerprint={"cores": 2})


def _candidates(rep):
    return {c["label"]: c for c in rep["runs"][0]["shapes"][0]["candidates"]}


def test_spaces_offer_what_the_graph_allows(tiny_model, tmp_path):
    tf = load_model(resolve_model("transformer"))
    assert fusion_types(tf) == ["bert"]
    assert fusion_types(load_model(tiny_model)) == []  # no attention: nothing to fuse, no candidate
    assert FUSED.candidates(load_model(tiny_model), _info()) == []
    int8 = INT8.candidates(tf, _info())
    assert all(c.approximate for c in int8) and len(int8) == 6  # five recipes, and fused + dynamic
    wl = build_workload(tf, shape_points(tf, {}, {})[0])
    # calibration never uses the inputs the candidate is verified on
    cal = calibration_feeds(wl)
    sent = {a.tobytes() for s in wl.input_sets for a in s}
    assert len(cal) == 8 and not any(a.tobytes() in sent for f in cal for a in f.values())
    for c in int8 + FUSED.candidates(tf, _info()):
        p = space_of(c).prepare(c, wl, _info(), tmp_path)
        assert p.backend == "ort" and p.params == {} and p.artifact.exists()  # the agent never sees the recipe
        m = onnx.load(str(p.artifact))
        ops = {n.op_type for n in m.graph.node}
        if c.approximate:
            assert ops & {"DynamicQuantizeLinear", "QuantizeLinear", "MatMulInteger", "DynamicQuantizeMatMul"}, ops
        else:
            assert ops & {"Attention", "SkipLayerNormalization", "LayerNormalization", "BiasGelu", "Gelu"}, ops
        again = space_of(c).prepare(c, wl, _info(), tmp_path)
        assert again.artifact == p.artifact  # content-addressed: built once
    assert not list(tmp_path.rglob(".build-*"))  # no half-written build left behind
    with pytest.raises(BuildFailed, match="nothing to fuse"):
        FUSED.prepare(Candidate.make("ort", {"rewrite": "fuse-bert"}), build_workload(
            load_model(tiny_model), {"batch": 1}), _info(), tmp_path)


def test_int8_selected_only_under_a_budget_then_rechecked(tmp_path, home):
    db = tmp_path / "l.db"
    # no budget: int8 is measured, its accuracy reported, and it is never selected
    p = run(["tune", "transformer", *LEVERS, "--db", str(db), "--format", "json"], home, timeout=400)
    assert p.returncode == 0, p.stderr
    rep = json.loads(p.stdout)
    cands = _candidates(rep)
    int8 = [c for c in cands.values() if c["approximate"]]
    assert int8 and all(c["status"] == "failed" and c["reason"].startswith("approximate") for c in int8)
    assert all(0.99 < c["accuracy"]["cosine"] <= 1.0 and c["accuracy"]["runs"] >= 3 for c in int8)
    fused = cands["ort rewrite=fuse-bert"]
    assert fused["status"] == "verified" and not fused["approximate"] and fused["accuracy"] is None
    assert not rep["runs"][0]["shapes"][0]["best"] in {c["candidate"]["key"] for c in int8}

    # a budget it keeps: verified with its accuracy; whether it is selected is the confirmation's call
    p = run(["tune", "transformer", *LEVERS, "--accuracy", "cosine=0.99", "--db", str(db), "--format", "json",
             "--report-dir", str(tmp_path / "r")], home, timeout=400)
    assert p.returncode == 0, p.stderr
    rep = json.loads(p.stdout)
    int8 = [c for c in _candidates(rep).values() if c["approximate"]]
    assert int8 and all(c["status"] == "verified" and c["accuracy"]["cosine"] >= 0.99 for c in int8)
    page = (tmp_path / "r" / "report.html").read_text()
    assert "accuracy loss (1 - cosine) versus median latency" in page and "cos 0.99" in page
    key = int8[0]["candidate"]["key"]

    # verify re-runs the int8 model (not the fp32 one) under the budget it was tuned with ...
    p = run(["verify", "transformer", "--config", key, "--db", str(db), "--format", "json"], home)
    assert p.returncode == 0, p.stderr
    v = json.loads(p.stdout)
    assert v["accuracy_budget"] == {"cosine": 0.99} and v["ok"]
    assert all(0.99 <= s["accuracy"]["cosine"] < 1.0 for s in v["shapes"])  # int8's error, so the int8 model ran
    # ... or one the user names; a budget it cannot keep is named, with exit 1
    p = run(["verify", "transformer", "--config", key, "--db", str(db), "--accuracy", "max-abs=1e-9"], home)
    assert p.returncode == 1 and "outside the accuracy budget" in p.stdout


def test_bad_accuracy_is_one_error_line(home):
    for bad in (["--accuracy", "cosine=2"], ["--accuracy", "fast=1"], ["--space", "ort-int9"]):
        assert_one_line_error(run(["tune", "transformer", "--budget", "1", *bad], home), 2)


def test_the_python_api_takes_a_budget_too(tmp_path):
    from edgetune import api

    out = api.tune("transformer", budget_s=6, rounds=1, finalists=1, max_candidates=1, spaces=("ort",),
                   accuracy="cosine=0.99", db=str(tmp_path / "a.db"))
    cands = out.devices[0].summary.shapes[0].candidates
    assert any(c.candidate.approximate and c.status == "verified" and c.accuracy["cosine"] >= 0.99 for c in cands)
    with pytest.raises(UserInputError):
        api.tune("transformer", budget_s=6, accuracy="cosine=7")


def test_a_rewrite_that_fails_is_the_candidates_build_failure(tmp_path):
    """The rewrite runs in a child process: its failure (here a corrupt model; on a big model, the
    OOM killer) is a named build failure and leaves nothing behind, and the tuner goes on."""
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"\x08\x07not a model")
    from edgetune.space.ort_rewrite import cached_build

    with pytest.raises(BuildFailed, match="ort-int8|quantize"):
        cached_build(tmp_path / "cache", "ort-int8", {"model": "x"}, {"op": "quantize", "src": str(bad),
                                                                  "variant": "dynamic-matmul"})
    assert not [p for p in (tmp_path / "cache" / "ort-int8").iterdir()]  # no half-built model left
