"""Select, then confirm (edgetune/select.py): the verdict comes from fresh confirmation rounds only.

Synthetic records (exact, instant) check which records a verdict is computed from; runs on the local
device check the tuner end to end (new processes, new inputs, resume, a winner failing confirmation).
No test asserts that anything is faster: timings are noisy, structure is not."""

from __future__ import annotations

import json

import numpy as np
import pytest

from edgetune.candidate import Candidate
from edgetune.db import Record, Store
from edgetune.measure import MIN_VERDICT_ROUNDS, round_ratio
from edgetune.report import verdict_line
from edgetune.results import summarize_run
from edgetune.select import (CONFIRM_BASE, confirm_seed, confirm_workload, is_confirmation, race_field, replay,
                             stored_round)
from edgetune.space.adapter import adapter_candidate
from edgetune.tune import tune
from edgetune.tune_config import TuneConfig
from edgetune.modelfile import load_model
from edgetune.workload import build_workload

BASE = Candidate.make("ort", {}, baseline=True)
A = Candidate.make("ort", {"intra_op_num_threads": 1})
B = Candidate.make("ort", {"intra_op_num_threads": 2})


class _Store:
    """A run's records written by hand: (candidate, stored round, median ms, status)."""

    def __init__(self, tmp_path, confirm_rounds: int | None):
        self.store = Store(tmp_path / "s.db")
        config = {} if confirm_rounds is None else {"confirm_rounds": confirm_rounds, "confirmation": "sequential"}
        self.store.start_run("r", "m.onnx", "0" * 64, "local", "fp", {"cores": 2}, {}, config)
        self.rng = np.random.default_rng(1)

    def add(self, cand: Candidate, rnd: int, median_ms: float, status: str = "verified", reason: str = "") -> None:
        samples = (median_ms * 1e6 * self.rng.uniform(0.99, 1.01, 21)).astype(np.int64)
        self.store.add_record(Record(run_id="r", workload_key=f"w{rnd}", shape={"batch": 1}, shape_key="x=1x16",
                                     fingerprint_key="fp", candidate=cand.as_dict(), versions={}, round=rnd,
                                     status=status, reason=reason, verdict={"max_rel_err": 0.0}, samples_ns=samples,
                                     wall_ms=1.0, agent_ms=1.0))

    def race(self, medians: dict[Candidate, float], rounds: int = 2) -> None:
        for rnd in range(rounds + 1):
            for cand, ms in medians.items():
                self.add(cand, rnd, ms)

    def shape(self):
        return summarize_run(self.store, "r").shapes[0]

    def rows(self):
        return self.store.records(run_id="r")


def _confirm_pairs(rows, ref: Candidate, cand: Candidate, rounds):
    s = {(r.candidate_key, r.round): r.samples_ns for r in rows}
    return [(s[(ref.key(), stored_round(k))], s[(cand.key(), stored_round(k))]) for k in rounds]


def test_race_winner_not_faster_in_confirmation_is_not_called_faster(tmp_path):
    st = _Store(tmp_path, confirm_rounds=5)
    st.race({BASE: 2.0, A: 1.0, B: 1.5})  # the race says A is 2x faster than the default
    for k, (base_ms, a_ms) in enumerate([(2.0, 2.02), (2.1, 2.08), (1.9, 1.95), (2.0, 1.97), (2.05, 2.06)], 1):
        st.add(A, stored_round(k), a_ms)
        st.add(BASE, stored_round(k), base_ms)
    s = st.shape()
    a = s.get(A.key())
    assert s.winner_key == A.key() and s.best_baseline_key == BASE.key() == s.default_key
    # the verdict is exactly round_ratio over the five confirmation rounds, nothing from the race, at
    # the level of the last sequential look (looks at 3, 4, 5 rounds; A shares the 5% with runner-up B)
    level = s.confirmation.state.level
    assert 0.95 < level < 1.0
    expect = round_ratio(_confirm_pairs(st.rows(), BASE, A, range(1, 6)), level=level)
    assert a.vs_default == expect and a.vs_best_baseline == expect and expect.rounds == 5
    assert a.vs_default.verdict != "faster"
    assert s.confirmation.verdict == expect.verdict and s.confirmation.state.rounds == (1, 2, 3, 4, 5)
    # not confirmed faster: the default stays the selected configuration
    assert s.best_key == BASE.key()
    # the race figure is kept, descriptive: no interval, no verdict
    assert a.race_vs_default.value == pytest.approx(2.0, rel=0.05) and "verdict" not in a.race_vs_default.as_dict()
    # B raced but was never confirmed: no claim at all
    assert s.get(B.key()).vs_default is None and s.get(B.key()).race_vs_default is not None
    assert a.phase == "confirmed" and s.get(B.key()).phase == "final"
    assert a.confirm_rounds == [1, 2, 3, 4, 5] and a.rounds == [0, 1, 2]


def test_confirmed_win_is_selected(tmp_path):
    st = _Store(tmp_path, confirm_rounds=3)
    st.race({BASE: 2.0, A: 1.0})
    for k, f in enumerate([0.50, 0.52, 0.49], 1):
        st.add(BASE, stored_round(k), 2.0)
        st.add(A, stored_round(k), 2.0 * f)
    s = st.shape()
    assert s.confirmation.verdict == "faster" and s.best_key == A.key() == s.winner_key
    rep = s.as_dict()
    assert rep["confirmation"]["stored_rounds"] == [CONFIRM_BASE + 1, CONFIRM_BASE + 2, CONFIRM_BASE + 3]
    assert rep["winner"] == A.key() and rep["best"] == A.key()
    json.dumps(rep)  # the report stays plain JSON


def test_no_verdict_below_min_rounds(tmp_path):
    st = _Store(tmp_path, confirm_rounds=MIN_VERDICT_ROUNDS - 1)
    st.race({BASE: 2.0, A: 1.0})
    for k in range(1, MIN_VERDICT_ROUNDS):
        st.add(BASE, stored_round(k), 3.0)
        st.add(A, stored_round(k), 1.0)  # 3x in every round, and still too few rounds to say so
    s = st.shape()
    assert s.confirmation.vs_best_baseline.rounds == MIN_VERDICT_ROUNDS - 1
    assert s.confirmation.verdict == "insufficient rounds"
    assert s.get(A.key()).vs_default is None and s.get(A.key()).vs_best_baseline is None
    assert s.best_key == BASE.key()


def test_winner_failing_confirmation_is_disqualified_and_next_best_confirmed(tmp_path):
    st = _Store(tmp_path, confirm_rounds=3)
    st.race({BASE: 2.0, A: 1.0, B: 1.5})
    st.add(A, stored_round(1), 1.0)
    st.add(BASE, stored_round(1), 2.0)
    st.add(BASE, stored_round(2), 2.0)  # round 2 order: baseline first, then A, which fails
    st.add(A, stored_round(2), 0.1, status="failed", reason="tolerance exceeded")
    conf = replay(st.rows(), 3)
    assert conf.contender == B.key() and conf.rounds == () and conf.next_round == 3
    assert [(d.key, d.round) for d in conf.disqualified] == [(A.key(), 2)]
    assert conf.walked[-1] == (3, (B.key(), BASE.key()))  # odd rounds: contender first, even: baseline first
    for k in (3, 4, 5):
        st.add(B, stored_round(k), 1.9)
        st.add(BASE, stored_round(k), 2.0)
    s = st.shape()
    a = s.get(A.key())
    assert a.status == "failed" and a.reason.startswith("confirmation round 2:")
    assert s.winner_key == B.key() and s.confirmation.state.rounds == (3, 4, 5)
    # B is judged on its own rounds only, not on the rounds the baseline ran beside A
    assert s.get(B.key()).vs_default == round_ratio(_confirm_pairs(st.rows(), BASE, B, (3, 4, 5)),
                                                    level=s.confirmation.state.level)
    assert s.best_key in (B.key(), BASE.key()) and s.best_key != A.key()
    assert s.confirmation.as_dict()["disqualified"][0]["reason"] == "tolerance exceeded"


def test_interleaving_and_the_default_beside_a_stronger_baseline(tmp_path):
    other = Candidate.make("tflite", {}, baseline=True)  # another runtime's default, faster than ort's
    st = _Store(tmp_path, confirm_rounds=3)
    st.race({BASE: 2.0, other: 1.8, A: 1.0})
    f = race_field(st.rows())
    assert f.contenders == (A.key(),) and f.baselines == (other.key(), BASE.key()) and f.default == BASE.key()
    conf = replay(st.rows(), 3)
    assert conf.baseline == other.key() and conf.participants == (A.key(), other.key(), BASE.key())
    assert [order for _, order in conf.walked] == [(A.key(), other.key(), BASE.key())]
    assert conf.order(2) == (other.key(), BASE.key(), A.key())
    assert conf.order(4) == conf.order(1)


def test_old_database_without_confirmation_reads_without_claims(tmp_path):
    st = _Store(tmp_path, confirm_rounds=None)  # a run recorded before confirmation existed
    st.race({BASE: 2.0, A: 1.0}, rounds=3)
    s = st.shape()
    assert s.winner_key == A.key() and s.confirmation.state.rounds == () and s.confirmation.verdict is None
    assert all(c.vs_default is None for c in s.candidates)
    assert s.get(A.key()).race_vs_default.rounds == 3
    assert s.best_key == BASE.key()  # nothing was confirmed faster


def test_confirmation_inputs_are_new_each_round_and_deterministic(tiny_model):
    wl = build_workload(load_model(tiny_model), {"batch": 2}, seed=0)
    w1, w2 = (confirm_workload(wl, confirm_seed(0, k)) for k in (1, 2))
    assert len({wl.key(), w1.key(), w2.key()}) == 3 and w1.shape_key == wl.shape_key
    assert confirm_workload(wl, confirm_seed(0, 1)).key() == w1.key()
    assert confirm_seed(0, 1) != confirm_seed(1, 1)
    user = build_workload(load_model(tiny_model), {"batch": 2}, {"x": np.ones((2, 16), np.float32)}, seed=0)
    u1 = confirm_workload(user, confirm_seed(0, 1))
    assert np.array_equal(u1.input_sets[-1][0], user.input_sets[-1][0])  # the user's own data is kept
    assert not np.array_equal(u1.input_sets[0][0], user.input_sets[0][0])


# ---- on the local device ------------------------------------------------------------------------

def _cfg(**kw):
    base = dict(budget_s=1.0, rounds=1, finalists=2, timeout_s=8, spaces=("ort",), max_candidates=1, confirm_rounds=3)
    base.update(kw)
    return TuneConfig(**base)


class _Killed(BaseException):  # a kill, not an error: DeviceTuner turns errors into "down"
    pass


def test_resume_skips_stored_confirmation_jobs(tiny_model, tmp_path):
    db = tmp_path / "t.db"
    seen: list[dict] = []

    def kill_in_round_2(ev):  # the record is committed before its event: as if killed right after it
        seen.append(ev)
        if ev["event"] == "job" and ev.get("confirm_round") == 2:
            raise _Killed

    with pytest.raises(_Killed):
        tune(tiny_model, ["local"], db=db, config=_cfg(), progress=kill_in_round_2)
    stored = [r for r in Store(db).records() if is_confirmation(r.round)]
    assert len(stored) == 3  # round 1 (two jobs) and the first job of round 2
    events: list[dict] = []
    out = tune(tiny_model, ["local"], db=db, config=_cfg(), progress=events.append)
    dev = out.devices[0]
    assert dev.resumed and dev.status == "complete", dev.error
    ran = [(e["candidate"], e["round"]) for e in events if e["event"] == "job"]
    assert all(rnd > CONFIRM_BASE for _, rnd in ran) and len(ran) == 3  # round 2's second job, round 3
    assert len([e for e in events if e["event"] == "skip" and e["round"] > CONFIRM_BASE]) == 3
    rows = Store(db).records(run_id=dev.run_id)
    confirm = [r for r in rows if is_confirmation(r.round)]
    assert sorted({r.round for r in confirm}) == [CONFIRM_BASE + k for k in (1, 2, 3)]
    # interleaved, alternating who goes first; new inputs every round, the same for both in a round
    s = dev.summary.shapes[0]
    w, b = s.winner_key, s.best_baseline_key
    by_round = {}
    for r in sorted(confirm, key=lambda r: r.id):
        by_round.setdefault(r.round - CONFIRM_BASE, []).append(r)
    assert [x.candidate_key for x in by_round[1]] == [w, b] and [x.candidate_key for x in by_round[2]] == [b, w]
    for k, recs in by_round.items():
        assert {x.verdict["input_seed"] for x in recs} == {confirm_seed(0, k)}
        assert len({x.workload_key for x in recs}) == 1
    race_keys = {r.workload_key for r in rows if not is_confirmation(r.round)}
    assert len({recs[0].workload_key for recs in by_round.values()} | race_keys) == 4
    assert s.confirmation.state.rounds == (1, 2, 3) and s.confirmation.vs_best_baseline.rounds == 3


LATE = '''"""Correct while it is being selected, wrong once confirmation starts (its 3rd process)."""
import onnxruntime as ort
from pathlib import Path

COUNTER = Path({counter!r})


def load(model_path, params):
    n = int(COUNTER.read_text()) + 1 if COUNTER.exists() else 1
    COUNTER.write_text(str(n))
    sess = ort.InferenceSession(model_path, providers=["CPUExecutionProvider"])
    names = [i.name for i in sess.get_inputs()]
    if n >= 3:
        return lambda inputs: [o * 0 + 1 for o in sess.run(None, dict(zip(names, inputs)))]
    return lambda inputs: sess.run(None, dict(zip(names, inputs)))
'''

SLOW = '''"""Correct and deliberately slow (so the race's order is known without trusting a timing)."""
import time
import onnxruntime as ort


def load(model_path, params):
    sess = ort.InferenceSession(model_path, providers=["CPUExecutionProvider"])
    names = [i.name for i in sess.get_inputs()]

    def run(inputs):
        time.sleep(0.003)
        return sess.run(None, dict(zip(names, inputs)))
    return run
'''


def test_winner_failing_confirmation_on_device_is_not_selected(tiny_model, tmp_path):
    (tmp_path / "late.py").write_text(LATE.format(counter=str(tmp_path / "late.count")))
    (tmp_path / "slow.py").write_text(SLOW)
    extra = [adapter_candidate(str(tmp_path / f"{n}.py")) for n in ("late", "slow")]
    late_key, slow_key = (c.key() for c, _ in extra)
    out = tune(tiny_model, ["local"], db=tmp_path / "t.db", config=_cfg(max_candidates=0, extra=extra))
    dev = out.devices[0]
    assert dev.status == "complete", dev.error
    s = dev.summary.shapes[0]
    late = s.get(late_key)
    assert late.status == "failed" and late.reason.startswith("confirmation round 1:"), late.reason
    assert [(d.key, d.round) for d in s.confirmation.state.disqualified] == [(late_key, 1)]
    assert s.winner_key == slow_key and s.confirmation.state.rounds == (2, 3, 4)
    assert s.best_key != late_key and s.get(slow_key).vs_default.rounds == 3


def test_a_run_recorded_before_sequential_looks_is_judged_as_it_was_designed(tmp_path):
    """One look at its confirm_rounds, at 95%: the rounds it ran are not re-judged by a later rule."""
    st = _Store(tmp_path, confirm_rounds=5)
    st.store.close()
    st.store = Store(tmp_path / "old.db")
    st.store.start_run("r", "m.onnx", "0" * 64, "local", "fp", {"cores": 2}, {}, {"confirm_rounds": 5})
    st.race({BASE: 2.0, A: 1.0, B: 1.5})
    for k, (base_ms, a_ms) in enumerate([(2.0, 2.02), (2.1, 2.08), (1.9, 1.95), (2.0, 1.97), (2.05, 2.06)], 1):
        st.add(A, stored_round(k), a_ms)
        st.add(BASE, stored_round(k), base_ms)
    s = st.shape()
    assert s.confirmation.state.level == 0.95 and s.confirmation.state.rounds == (1, 2, 3, 4, 5)
    assert s.get(A.key()).vs_default == round_ratio(_confirm_pairs(st.rows(), BASE, A, range(1, 6)))


OV = Candidate.make("openvino", {}, baseline=True)  # another runtime's default


def _add_confirmation(st, ms: dict[Candidate, list[float]]) -> None:
    """Confirmation rounds 1..n: each candidate's median ms per round."""
    for k in range(1, len(next(iter(ms.values()))) + 1):
        for cand, v in ms.items():
            st.add(cand, stored_round(k), v[k - 1])


def _defaults_shape(path, cap: int, race: dict[Candidate, float], confirm: dict[Candidate, list[float]]):
    path.mkdir(exist_ok=True)
    st = _Store(path, confirm_rounds=cap)
    st.race(race)
    _add_confirmation(st, confirm)
    return st.shape()


def test_another_runtimes_default_that_only_raced_faster_is_not_the_fallback(tmp_path):
    # the race ranks OpenVINO's default first (by noise: two rounds); the confirmation rounds, which
    # run it beside onnxruntime's, show it slower: the selection stays onnxruntime's default
    s = _defaults_shape(tmp_path, 5, {BASE: 2.0, OV: 1.9, A: 1.8},
                        {A: [2.0, 2.02, 1.98, 2.01, 2.0], OV: [2.08, 2.1, 2.07, 2.09, 2.08],
                         BASE: [2.0, 2.01, 1.99, 2.0, 2.02]})
    conf = s.confirmation
    assert conf.state.baseline == OV.key() and conf.state.default == BASE.key()
    assert conf.verdict != "faster" and conf.baseline_vs_default.verdict == "slower"
    assert s.best_baseline_key == BASE.key() and s.best_key == BASE.key()
    line = verdict_line(s.as_dict())
    assert line.startswith("selected the strongest baseline, ort default") and "not confirmed faster" in line


def test_another_runtimes_default_confirmed_faster_is_the_fallback(tmp_path):
    s = _defaults_shape(tmp_path, 5, {BASE: 2.0, OV: 1.0, A: 0.9},
                        {A: [1.0, 1.02, 0.99, 1.01, 1.0], OV: [1.0, 1.01, 1.0, 0.99, 1.0],
                         BASE: [2.0, 2.05, 1.97, 2.0, 2.02]})
    assert s.confirmation.verdict != "faster"  # A ties OpenVINO's default
    assert s.confirmation.baseline_vs_default.verdict == "faster"
    assert s.best_baseline_key == OV.key() == s.best_key


def test_a_contender_faster_than_the_race_baseline_but_not_the_default_is_not_selected(tmp_path):
    # intersection-union: "faster" needs faster than both runtime defaults it ran beside
    s = _defaults_shape(tmp_path / "a", 3, {BASE: 2.0, OV: 1.9, A: 1.5},
                        {A: [2.0, 2.01, 1.99, 2.0, 2.0], OV: [2.6, 2.62, 2.58, 2.6, 2.61],
                         BASE: [2.0, 2.0, 2.01, 1.99, 2.0]})
    assert s.confirmation.vs_best_baseline.verdict == "faster"  # than OpenVINO's default
    assert s.confirmation.verdict != "faster" and s.best_key == BASE.key()
    # and a contender faster than both is selected, the line naming both
    s2 = _defaults_shape(tmp_path / "b", 3, {BASE: 2.0, OV: 1.9, A: 1.5},
                         {A: [1.0, 1.01, 0.99], OV: [2.6, 2.62, 2.58], BASE: [2.0, 2.0, 2.01]})
    assert s2.confirmation.verdict == "faster" and s2.best_key == A.key()
    line = verdict_line(s2.as_dict())
    assert "confirmed faster than the strongest baseline, openvino default" in line and ", and than ort default" in line


def test_with_only_runtime_defaults_the_others_are_confirmed_against_onnxruntimes(tmp_path):
    st = _Store(tmp_path, confirm_rounds=3)
    st.race({BASE: 2.0, OV: 1.9})
    conf = replay(st.rows(), 3)
    assert conf.contender == OV.key() and conf.baseline == BASE.key() and conf.next_round == 1
    _add_confirmation(st, {OV: [2.1, 2.12, 2.09], BASE: [2.0, 2.0, 2.01]})
    s = st.shape()
    assert s.confirmation.verdict == "slower" and s.best_key == BASE.key()


def test_a_contender_that_ended_without_faster_is_in_the_report_with_its_interval(tmp_path):
    """The winner confirmed slower hands the rounds to the runner-up; the report keeps the winner's
    verdict and interval beside the runner-up's (a user reads why the second was tried)."""
    st = _Store(tmp_path, confirm_rounds=8)
    st.race({BASE: 2.0, A: 1.0, B: 1.1})
    for k, f in enumerate([1.5, 1.52, 1.49], 1):  # A: slower at the first look (3 rounds of a cap of 8)
        st.add(A, stored_round(k), 2.0 * f)
        st.add(BASE, stored_round(k), 2.0)
    for k, f in enumerate([0.5, 0.51, 0.49], 4):  # B: faster at its own first look
        st.add(B, stored_round(k), 2.0 * f)
        st.add(BASE, stored_round(k), 2.0)
    s = st.shape()
    assert s.best_key == B.key() and s.confirmation.verdict == "faster"
    (ended,) = s.as_dict()["confirmation"]["ended"]
    assert ended["key"] == A.key() and ended["verdict"] == "slower" and ended["rounds"] == [1, 2, 3]
    r = ended["speedup_vs_best_baseline"]
    assert r["verdict"] == "slower" and r["ci95"][1] < 1.0 and r["rounds"] == 3 and ended["level"] == r["level"]
    line = verdict_line(s.as_dict())
    assert line.startswith(f"selected {s.get(B.key()).candidate.label()}: confirmed faster")
    assert f"before it, the race winner {s.get(A.key()).candidate.label()} was confirmed slower (" in line, line
