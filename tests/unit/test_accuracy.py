"""Approximate candidates: their accuracy verdict (worst over every checked run, timed ones too),
the user's budget, and that every other check of the verifier still applies to them."""

import numpy as np
import pytest

from edgetune.accuracy import Accuracy, AccuracyBudget, class_axis, cosine
from edgetune.agent.host import TimedCheck
from edgetune.candidate import Candidate
from edgetune.errors import UserInputError
from tests.unit.test_verify import _honest, _sets, _verify, ref_fn


def int8ish(inputs):
    """A quantized-looking computation: the reference plus a small, input-dependent error."""
    y = ref_fn(inputs)[0]
    step = float(np.abs(y).max()) / 127.0
    return [(np.round(y / step) * step).astype(np.float32)]


def test_budget_parsing_and_errors():
    b = AccuracyBudget.parse(["cosine=0.999", "max-abs=0.05,top1=0.99"])
    assert (b.cosine, b.max_abs, b.top1) == (0.999, 0.05, 0.99) and b.set
    assert not AccuracyBudget.parse([]).set
    assert b.label() == "cosine=0.999, max-abs=0.05, top1=0.99"
    for bad in ("cosine", "cosine=x", "cos=0.9", "cosine=1.5", "max-abs=-1", "top1=nan", "cosine=0.9,cosine=0.8"):
        with pytest.raises(UserInputError):
            AccuracyBudget.parse([bad])


def test_metrics():
    r = np.array([1.0, -2.0, 3.0])
    assert cosine(r, r) == pytest.approx(1.0)
    assert cosine(-r, r) == pytest.approx(-1.0)
    assert cosine(np.zeros(3), r) == 0.0 and cosine(np.zeros(3), np.zeros(3)) == 1.0
    assert cosine(np.array([np.nan, 1, 1]), r) == 0.0
    assert class_axis("logits", (2, 1000)) == 1 and class_axis("logits", (1, 5, 3, 3)) == 1
    assert class_axis("logits", (1, 8, 50257)) == 2 and class_axis("hidden", (1, 8, 768)) is None
    assert class_axis("y", (4, 10)) == 1 and class_axis("y", (4, 5)) is None
    acc = Accuracy()
    ref = np.eye(4, 12)
    out = ref.copy()
    out[3] = np.roll(out[3], 1)  # one row of four picks another class
    acc.add_run(["logits"], [out], [ref])
    assert acc.top1 == pytest.approx(0.75) and acc.max_abs == 1.0 and acc.runs == 1
    assert AccuracyBudget(top1=0.8).violations(acc) and not AccuracyBudget(top1=0.7).violations(acc)
    assert AccuracyBudget(top1=0.5).violations(Accuracy()) == [
        "top1 asked for, but the model has no classifier output"]


def test_candidate_is_approximate_by_precision():
    assert Candidate.make("ort", {"precision": "int8", "quant": "dynamic"}).approximate
    assert not Candidate.make("ort", {"rewrite": "fuse-bert"}).approximate
    assert not Candidate.make("ort", {}, baseline=True).approximate


def test_exact_verification_rejects_what_an_accuracy_verdict_measures():
    sets = _sets()
    res = _honest(sets, compute=int8ish)
    assert _verify(res, sets).code in ("imprecise", "wrong-output")
    v = _verify(res, sets, approximate=True)
    assert not v.ok and v.code == "approximate" and "--accuracy" in v.reason
    assert v.accuracy["cosine"] > 0.999 and v.accuracy["runs"] == 3 + 3  # the input sets and the timed iterations


def test_within_and_outside_the_budget():
    sets = _sets()
    res = _honest(sets, compute=int8ish)
    ok = _verify(res, sets, approximate=True, budget=AccuracyBudget(cosine=0.999))
    assert ok.ok and ok.code == "ok" and any("accuracy budget" in c for c in ok.checks)
    assert ok.max_abs_err == pytest.approx(ok.accuracy["max_abs"])
    bad = _verify(res, sets, approximate=True, budget=AccuracyBudget(max_abs=1e-9))
    assert not bad.ok and bad.code == "over-accuracy-budget" and "max-abs" in bad.reason


def test_accuracy_is_the_worst_run_timed_iterations_included():
    """Accurate when checked, sloppy when timed: judged by the sloppy timed run."""
    sets = _sets()
    res = _honest(sets, compute=int8ish)
    c = res.timed_checks[1]
    noisy = [c.outputs[0] + np.float32(0.5) * np.random.default_rng(1).standard_normal(c.outputs[0].shape).astype(
        np.float32)]
    res.timed_checks[1] = TimedCheck(c.iteration, noisy, c.input_sha256_after)
    v = _verify(res, sets, approximate=True, budget=AccuracyBudget(cosine=0.999))
    assert not v.ok and v.code == "over-accuracy-budget" and v.accuracy["cosine"] < 0.999


@pytest.mark.parametrize("cheat", ["stale", "mutate", "nondeterministic", "constant"])
def test_an_approximate_candidate_gets_every_other_check(cheat):
    sets = _sets()
    res = _honest(sets, compute=int8ish)
    if cheat == "stale":
        first = res.timed_checks[0].outputs
        res.timed_checks = [res.timed_checks[0]] + [TimedCheck(c.iteration, first, c.input_sha256_after)
                                                    for c in res.timed_checks[1:]]
        want = "stale-output"
    elif cheat == "mutate":
        res.input_sha256_after_sets = [["0" * 64] for _ in sets]
        want = "input-mutated"
    elif cheat == "nondeterministic":
        res.repeat_outputs = [res.repeat_outputs[0] * np.float32(1.01)]
        want = "non-deterministic"
    else:
        res.outputs = [res.outputs[0]] * len(sets)
        want = "insensitive"
    v = _verify(res, sets, approximate=True, budget=AccuracyBudget(cosine=0.5))
    assert not v.ok and v.code == want, v.reason
