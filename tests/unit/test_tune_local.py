"""The whole loop on the local device: real agent processes, real onnxruntime, real SQLite."""

import json
import sqlite3

import numpy as np
import pytest

from edgetune.db import Store
from edgetune.errors import UserInputError
from edgetune.report import markdown, report_dict
from edgetune.space.adapter import adapter_candidate
from edgetune.tune import tune
from edgetune.tune_config import TuneConfig
from tests.conformance.suite import ADAPTERS


def _cfg(**kw):
    base = dict(budget_s=1.5, rounds=1, finalists=2, timeout_s=8, spaces=("ort",), max_candidates=2, confirm_rounds=3)
    base.update(kw)
    return TuneConfig(**base)


def test_bad_candidates_are_rejected_and_never_selected(tiny_model, adapters, tmp_path):
    names = ["correct", "wrong", "crash", "hang", "mutate", "constant", "noisy"]
    cheats = ["stale", "skip_warm", "sometimes"]  # fast because they skip work once warm
    extra = [adapter_candidate(str(adapters / f"{n}.py")) for n in names + cheats]
    # batch 4: at batch 1 "computing only the first row" is computing everything
    out = tune(tiny_model, ["local"], dims=["batch=4"], db=tmp_path / "t.db", config=_cfg(extra=extra))
    dev = out.devices[0]
    assert dev.status == "complete", dev.error
    shape = dev.summary.shapes[0]
    by_name = {c.candidate.param_dict.get("name"): c for c in shape.candidates if c.candidate.backend == "adapter"}
    assert by_name["correct"].status == "verified"
    expect = {"wrong": "tolerance", "crash": "SIGSEGV", "hang": "hung", "mutate": "modified its inputs",
              "constant": "insensitive", "noisy": "non-deterministic", "stale": "stale output",
              "skip_warm": "timed iteration", "sometimes": "timed iteration"}
    for name, needle in expect.items():
        c = by_name[name]
        assert c.status == "failed", name
        assert needle in c.reason, (name, c.reason)
    wrong = by_name["wrong"]
    assert wrong.max_rel_err is not None and wrong.max_rel_err > 1e-4  # error reported even when failed
    best = shape.best
    assert best is not None and best.status == "verified"
    assert best.candidate.param_dict.get("name") not in expect
    # every verified candidate carries its error figures and a descriptive race ratio vs the default;
    # a ratio with a CI and a verdict only the confirmed winner (from its confirmation rounds)
    for c in shape.candidates:
        if c.status == "verified":
            assert c.max_rel_err is not None and c.max_rel_err <= 1e-4
            assert c.race_vs_default is not None or c.candidate.key() == shape.default_key
            if c.candidate.key() != shape.winner_key:
                assert c.vs_default is None
    winner = shape.winner
    assert winner is not None and winner.status == "verified" and winner.candidate.param_dict.get("name") not in expect
    assert winner.vs_default is not None and winner.vs_default.rounds == 3
    assert winner.vs_default.ci_low <= winner.vs_default.value <= winner.vs_default.ci_high
    # the failures are stored, with reasons, in the database
    store = Store(tmp_path / "t.db")
    failed = [r for r in store.records() if r.status == "failed"]
    assert {json.loads(json.dumps(r.candidate))["params"].get("name") for r in failed} >= set(expect)
    store.close()


def test_sweep_tunes_each_shape(tiny_model, tmp_path):
    out = tune(tiny_model, ["local"], sweeps=["batch=1,4"], db=tmp_path / "t.db", config=_cfg())
    shapes = out.devices[0].summary.shapes
    assert sorted(s.shape["batch"] for s in shapes) == [1, 4]
    for s in shapes:
        assert s.default_key is not None and s.best_key is not None
        default = s.get(s.default_key)
        assert default.candidate.baseline and default.stats.n >= 3
    rep = report_dict(out)
    assert rep["schema"] == "edgetune.report/1"
    run = rep["runs"][0]
    assert run["fingerprint"]["cores"] >= 1 and run["versions"]["device_runtimes"]["onnxruntime"]
    md = markdown(rep)
    assert "batch=1" in md and "batch=4" in md and "speedup vs default" in md


def test_identical_rerun_reuses_records(tiny_model, tmp_path):
    db = tmp_path / "t.db"
    first = tune(tiny_model, ["local"], db=db, config=_cfg())
    second = tune(tiny_model, ["local"], db=db, config=_cfg())
    assert first.devices[0].run_id == second.devices[0].run_id
    assert second.devices[0].resumed and second.devices[0].jobs_run == 0
    assert second.devices[0].jobs_skipped == first.devices[0].jobs_run
    fresh = tune(tiny_model, ["local"], db=db, config=_cfg(fresh=True))
    assert fresh.devices[0].run_id != first.devices[0].run_id and fresh.devices[0].jobs_run > 0


def test_user_inputs_are_verified_too(tiny_model, tmp_path):
    x = np.random.default_rng(3).standard_normal((2, 16)).astype(np.float32) * 100
    np.save(tmp_path / "x.npy", x)
    out = tune(tiny_model, ["local"], inputs=[f"x={tmp_path / 'x.npy'}"], db=tmp_path / "t.db", config=_cfg())
    dev = out.devices[0]
    assert dev.status == "complete" and dev.summary.shapes[0].shape == {"batch": 2}
    assert dev.summary.shapes[0].best is not None
    with pytest.raises(UserInputError, match="shape"):
        np.save(tmp_path / "bad.npy", np.zeros((2, 15), np.float32))
        tune(tiny_model, ["local"], inputs=[f"x={tmp_path / 'bad.npy'}"], dims=["batch=2"], db=tmp_path / "t.db",
             config=_cfg())


def test_bad_sweep_and_dims(tiny_model, tmp_path):
    with pytest.raises(UserInputError, match="not a dynamic dimension"):
        tune(tiny_model, ["local"], sweeps=["seq=32"], db=tmp_path / "t.db", config=_cfg())
    with pytest.raises(UserInputError, match="positive integers"):
        tune(tiny_model, ["local"], sweeps=["batch=0,2"], db=tmp_path / "t.db", config=_cfg())
    with pytest.raises(UserInputError, match="unknown device"):
        tune(tiny_model, ["nope"], db=tmp_path / "t.db", config=_cfg())
    assert not (tmp_path / "t.db").exists()  # nothing written for bad input


def test_database_survives_and_is_consistent(tiny_model, tmp_path):
    db = tmp_path / "t.db"
    tune(tiny_model, ["local"], db=db, config=_cfg())
    con = sqlite3.connect(db)
    assert con.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    assert con.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    rows = con.execute("SELECT samples, status FROM records").fetchall()
    assert rows and all(len(s) % 8 == 0 for s, _ in rows)
    assert all(len(s) >= 8 * 3 for s, st in rows if st == "verified")  # every raw sample kept
    con.close()


def test_tflite_model_tunes_with_litert_and_reference_kernels(tmp_path):
    import importlib.util

    from tests.conftest import require

    require(importlib.util.find_spec("ai_edge_litert") is not None, "ai-edge-litert not installed")
    import models

    path = models.build_tflite("mobilenet", tmp_path / "mn.tflite", {"batch": 1})
    out = tune(path, ["local"], db=tmp_path / "t.db",
               config=_cfg(spaces=("tflite",), max_candidates=2, budget_s=2))
    dev = out.devices[0]
    assert dev.status == "complete", dev.error
    s = dev.summary.shapes[0]
    assert s.default_key is not None and s.get(s.default_key).candidate.backend == "tflite"
    ok = [c for c in s.candidates if c.status == "verified"]
    assert ok and all(c.max_rel_err <= 1e-4 for c in ok), [(c.candidate.label(), c.reason) for c in s.candidates]


def test_tvm_relax_build_is_a_verified_candidate(tiny_model, tmp_path):
    import importlib.util

    from tests.conftest import require

    require(importlib.util.find_spec("tvm") is not None, "apache-tvm not installed")
    out = tune(tiny_model, ["local"], db=tmp_path / "t.db", config=_cfg(spaces=("ort", "tvm-relax"), max_candidates=1,
                                                                         timeout_s=60))  # nothing here hangs
    s = out.devices[0].summary.shapes[0]
    tvm_rows = [c for c in s.candidates if c.candidate.backend == "tvm-relax"]
    assert tvm_rows and all(c.status == "verified" for c in tvm_rows), [c.reason for c in tvm_rows]
    assert all(c.race_vs_default is not None for c in tvm_rows)  # compared with onnxruntime in the same run


def test_tvm_tuned_candidate_is_tuned_verified_and_compared(tiny_model, tmp_path):
    import importlib.util

    from tests.conftest import require

    require(importlib.util.find_spec("tvm") is not None, "apache-tvm not installed")
    events = []
    out = tune(tiny_model, ["local"], db=tmp_path / "t.db", progress=events.append,
               config=_cfg(spaces=("ort", "tvm-tuned"), max_candidates=1, tvm_trials=4, timeout_s=60))
    s = out.devices[0].summary.shapes[0]
    tuned = [c for c in s.candidates if c.candidate.backend == "tvm-tuned"]
    assert tuned and all(c.status == "verified" for c in tuned), [c.reason for c in tuned]
    assert all(c.race_vs_default is not None and c.max_rel_err <= 1e-4 for c in tuned)
    # the minutes of kernel tuning inside the candidate's build are reported as they happen
    builds = [e for e in events if e["event"] == "build"]
    assert builds and all(e["candidate"].startswith("tvm-tuned") and e["kernel"] and e["trials"] >= 1 for e in builds)
    assert builds[0]["device"] == "local"


def test_confirmation_rounds_run_and_verify_on_their_new_inputs(tiny_model, tmp_path, monkeypatch):
    """Each record's workload is the one its job ran and was verified on: a confirmation round's new
    inputs, not the race's (the record said new inputs while the job ran the race's)."""
    from edgetune.select import is_confirmation
    from edgetune.tune import DeviceTuner

    ran, verified = [], []
    job, verify = DeviceTuner._job, DeviceTuner._verify
    monkeypatch.setattr(DeviceTuner, "_job", lambda self, wl, *a, **k: ran.append(wl.key()) or job(self, wl, *a, **k))
    monkeypatch.setattr(DeviceTuner, "_verify",
                        lambda self, wl, *a, **k: verified.append(wl.key()) or verify(self, wl, *a, **k))
    extra = [adapter_candidate(str(ADAPTERS / "correct.py"))]
    out = tune(tiny_model, ["local"], dims=["batch=4"], db=tmp_path / "t.db", config=_cfg(extra=extra))
    assert out.devices[0].status == "complete", out.devices[0].error
    store = Store(tmp_path / "t.db")
    recs = store.records()
    store.close()
    conf = [r for r in recs if is_confirmation(r.round)]
    assert conf and len({r.workload_key for r in conf}) == 3  # three rounds, each on inputs of its own
    race_keys = {r.workload_key for r in recs if not is_confirmation(r.round)}
    assert not race_keys & {r.workload_key for r in conf}
    assert sorted(r.workload_key for r in recs) == sorted(ran) == sorted(verified)


def test_time_limits_scale_with_load_and_with_what_the_job_took(tmp_path):
    """A busy device gets longer limits (an honest job there is slow, not hung), and a candidate
    whose jobs took long gets at least three times that."""
    from edgetune.devices.inventory import DeviceSpec
    from edgetune.agent.host import MAX_LOAD_SCALE
    from edgetune.tune import DeviceTuner

    store = Store(tmp_path / "t.db")
    try:
        board = DeviceTuner(DeviceSpec("board", "ssh://u@board.example:22"), store, _cfg(timeout_s=10))
        base = board._time_limit(1000.0, "k")
        assert base == pytest.approx(13.0)  # timeout 10 s + 3 x the 1 s budget, an idle device
        board._device_state = {"load1": 6.0, "cpus": 2}
        assert board._time_limit(1000.0, "k") == pytest.approx(3 * base)
        board._device_state = {"load1": 1000.0, "cpus": 2}
        assert board._time_limit(1000.0, "k") == pytest.approx(MAX_LOAD_SCALE * base)
        board._device_state = {"load1": "forged", "cpus": 0}  # what a device says is data: no effect
        assert board._time_limit(1000.0, "k") == pytest.approx(base)
        board._wall_s["k"] = 20.0
        assert board._time_limit(1000.0, "k") == pytest.approx(60.0)
        assert board._time_limit(1000.0, "other") == pytest.approx(base)
    finally:
        store.close()


def test_the_race_leaves_the_confirmation_its_reserve(tiny_model, tmp_path, monkeypatch):
    """The race's rounds after its first run only outside the time the confirmation's rounds need:
    with no time to spare the race ends at round 1 and the confirmation still runs; with time to
    spare all its rounds run."""
    import edgetune.tune as tune_mod
    from edgetune.select import is_confirmation

    assert tune_mod.confirm_reserve(30.0, 40, 0.27) == pytest.approx(10.8)  # the cap's jobs at 0.27 s
    assert tune_mod.confirm_reserve(30.0, 40, 1.0) == pytest.approx(15.0)  # at most half the share
    extra = [adapter_candidate(str(ADAPTERS / "correct.py"))]
    for name, reserve, race_rounds in (("tight", float("inf"), {1}), ("ample", float("-inf"), {1, 2, 3})):
        monkeypatch.setattr(tune_mod, "confirm_reserve", lambda *a, _r=reserve: _r)
        out = tune(tiny_model, ["local"], dims=["batch=4"], db=tmp_path / f"{name}.db",
                   config=_cfg(rounds=3, extra=extra))
        assert out.devices[0].status == "complete", out.devices[0].error
        store = Store(tmp_path / f"{name}.db")
        recs = store.records()
        store.close()
        assert {r.round for r in recs if r.round > 0 and not is_confirmation(r.round)} == race_rounds, name
        assert len({r.round for r in recs if is_confirmation(r.round)}) == 3, name  # the confirmation ran
