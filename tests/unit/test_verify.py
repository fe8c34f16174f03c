"""The one verifier on synthetic agent results: every check, and the named code of each failure."""

import numpy as np
import pytest

from edgetune.agent.fresh import fresh_inputs
from edgetune.agent.host import JobResult, TimedCheck
from edgetune.verify import Tolerance, array_sha256, compare, verify_job
from edgetune import verify

W = np.random.default_rng(3).standard_normal((6, 5)).astype(np.float32)
SEED = 987654321


def ref_fn(inputs):
    return [(np.asarray(inputs[0], np.float64) @ W.astype(np.float64)).astype(np.float32)]


def _sets(n=3):
    rng = np.random.default_rng(0)
    return [[rng.standard_normal((4, 6)).astype(np.float32)] for _ in range(n)]


def _honest(sets, iters=(10, 17, 23), compute=ref_fn, n_samples=40, first=5, **kw) -> JobResult:
    """What an honest agent + candidate would return."""
    checks = []
    for t in iters:
        x = fresh_inputs(sets, SEED, t)
        checks.append(TimedCheck(t, compute(x), [array_sha256(a) for a in x]))
    base = dict(samples_ns=[100_000] * n_samples, outputs=[compute(s) for s in sets],
                repeat_outputs=compute(sets[0]), input_sha256_before=[array_sha256(a) for s in sets for a in s],
                input_sha256_after_sets=[[array_sha256(a) for a in s] for s in sets], timed_checks=checks,
                first_timed_iter=first, fresh_seed=SEED, probe_repeat_ns=[100_000] * 12,
                probe_distinct_ns=[101_000] * 12, input_check="runtime buffers")
    base.update(kw)
    return JobResult("ok", **base)


def _verify(res, sets, **kw):
    return verify_job(res, sets, [ref_fn(s) for s in sets], ref_fn, ["y"], **kw)


def test_honest_result_passes_with_timed_iterations_checked():
    sets = _sets()
    v = _verify(_honest(sets), sets)
    assert v.ok, v.reason
    assert v.code == "ok" and v.timed_checked == 3 and v.bitwise_deterministic
    assert any("timed iterations verified" in c for c in v.checks)


def test_fresh_inputs_replay_the_agent_definition():
    sets = _sets()
    a = fresh_inputs(sets, SEED, 41)[0]
    assert a.shape == sets[0][0].shape and not any(np.array_equal(a, s[0]) for s in sets)
    # every value comes from the host's sets, and two iterations differ
    assert set(a.ravel().tolist()) <= set(np.concatenate([s[0].ravel() for s in sets]).tolist())
    assert not np.array_equal(a, fresh_inputs(sets, SEED, 42)[0])
    assert np.array_equal(a, fresh_inputs(sets, SEED, 41)[0])


@pytest.mark.parametrize("status,code", [("crashed", "crashed"), ("timeout", "hung"), ("error", "error")])
def test_failed_runs_keep_their_name(status, code):
    v = _verify(JobResult(status, "boom"), _sets())
    assert not v.ok and v.code == code


def test_out_of_bounds_write_reported_by_the_agent():
    v = _verify(JobResult("error", "out-of-bounds write past the end of output 0 (its guard zone was overwritten)"),
                _sets())
    assert v.code == "out-of-bounds-write"


def test_mutated_inputs_in_checked_and_timed_runs():
    sets = _sets()
    res = _honest(sets)
    res.input_sha256_after_sets[1] = ["0" * 64]
    assert _verify(res, sets).code == "input-mutated"
    res = _honest(sets)
    res.timed_checks[0] = TimedCheck(res.timed_checks[0].iteration, res.timed_checks[0].outputs, ["0" * 64])
    assert _verify(res, sets).code == "input-mutated"


def test_constant_output_is_insensitive_not_wrong():
    sets = _sets()
    res = _honest(sets)
    res.outputs = [res.outputs[0]] * 3
    assert _verify(res, sets).code == "insensitive"


def test_tolerance_is_per_element_not_relative_to_the_largest_value():
    """Outliers make max|ref| ~30x the typical value: a max-scaled tolerance let most elements be
    far off. Relative to the RMS, and per element, they are caught."""
    r = np.random.default_rng(1).standard_normal(1000)
    r[0] = 300.0  # one outlier
    y = r.copy()
    y[1:] += 3e-3 * np.sign(r[1:])  # every ordinary element off by 3e-3 (~0.3%)
    old_style = np.max(np.abs(y - r)) / np.max(np.abs(r))
    assert old_style < 1e-4  # what the former check would have accepted
    e = compare(y.astype(np.float32), r.astype(np.float32), Tolerance(2e-4, 1e-4, 1e-4))
    assert e.excess > 1.0 and e.norm_rel > 1e-4


def test_wrong_and_imprecise_are_told_apart():
    sets = _sets()
    wrong = _honest(sets, compute=lambda x: [ref_fn(x)[0] + np.float32(0.5)])
    assert _verify(wrong, sets).code == "wrong-output"
    lowp = _honest(sets, compute=lambda x: [ref_fn(x)[0].astype(np.float16).astype(np.float32)])
    v = _verify(lowp, sets)
    assert v.code == "imprecise" and 1e-4 < v.norm_rel_err < 1e-2


def test_unwritten_poisoned_elements_are_non_finite():
    sets = _sets()

    def poisoned(x):
        y = ref_fn(x)[0]
        y[0, 0] = np.nan
        return [y]
    assert _verify(_honest(sets, compute=poisoned), sets).code == "non-finite"


def test_determinism_requires_repeat_outputs():
    sets = _sets()
    assert _verify(_honest(sets, repeat_outputs=[]), sets).code == "non-deterministic"
    noisy = _honest(sets)
    noisy.repeat_outputs = [noisy.outputs[0][0] + np.float32(1e-3)]
    assert _verify(noisy, sets).code == "non-deterministic"


def test_stale_timed_outputs():
    sets = _sets()
    res = _honest(sets)
    stale = res.timed_checks[0].outputs
    res.timed_checks = [res.timed_checks[0]] + [TimedCheck(c.iteration, stale, c.input_sha256_after)
                                                for c in res.timed_checks[1:]]
    v = _verify(res, sets)
    assert v.code == "stale-output" and "timed iteration" in v.reason


def test_right_when_checked_wrong_when_timed():
    sets = _sets()
    res = _honest(sets)
    c = res.timed_checks[1]
    half = [c.outputs[0].copy()]
    half[0][1:] = 0.0  # only the first row computed
    res.timed_checks[1] = TimedCheck(c.iteration, half, c.input_sha256_after)
    assert _verify(res, sets).code == "wrong-when-timed"


def test_no_timed_outputs_is_a_protocol_error():
    sets = _sets()
    v = _verify(_honest(sets, iters=()), sets)
    assert not v.ok and "timed iterations" in v.reason
    outside = _honest(sets, iters=(1,))  # before the first timed iteration
    assert not _verify(outside, sets).ok


def test_late_write_and_caching_and_roofline():
    sets = _sets()
    assert _verify(_honest(sets, late_change={"iter": 44, "outputs": [0]}), sets).code == "late-write"
    cached = _honest(sets, probe_repeat_ns=[5_000] * 10 + [120_000, 4_000_000], probe_distinct_ns=[100_000] * 12)
    assert _verify(cached, sets).code == "caching"
    # a noisy machine: both groups from one bimodal distribution, medians 6x apart by chance, not separated
    noisy = _honest(sets, probe_repeat_ns=[1_000_000] * 7 + [6_000_000] * 5,
                    probe_distinct_ns=[1_000_000] * 5 + [6_000_000] * 7)
    assert _verify(noisy, sets).ok
    # an emulated device's timings are not judged; its outputs still are
    assert _verify(cached, sets, timings_trusted=False).ok
    # 1e9 FLOP in 100 us is 10 TFLOP/s: impossible on a 100 GFLOP/s device
    v = _verify(_honest(sets), sets, flops=1e9, peak_gflops=100.0)
    assert v.code == "impossible-timing"
    assert _verify(_honest(sets), sets, flops=1e6, peak_gflops=100.0).ok


def test_caching_is_a_binomial_test_against_the_noise_the_timed_calls_show():
    sets = _sets()
    # a first-in-first-out cache of 4 results forgets the repeated input every fourth pair (the
    # distinct inputs push it out), and a loaded machine spoils one more pair: 11 of 16 clearly faster
    rep = [5_000] * 16
    for i in (3, 7, 11, 15):
        rep[i] = 100_000
    rep[5] = 900_000
    forgetful = _honest(sets, probe_repeat_ns=rep, probe_distinct_ns=[100_000] * 16)
    v = _verify(forgetful, sets)
    assert v.code == "caching" and "in 11 of 16 back-to-back pairs, where noise would make at most 10" in v.reason
    assert _verify(_honest(sets, probe_repeat_ns=rep[:5] + [100_000] + rep[6:],
                           probe_distinct_ns=[100_000] * 16), sets).code == "caching"
    # an honest candidate on a machine whose timed calls spread over 8x (log-uniform): a repeat is
    # clearly faster in 11 of 16 pairs by chance more often than the quiet null allows, and the
    # count needed rises with the noise measured
    spread = [int(100_000 * 8 ** (i / 39)) for i in range(40)]
    q = verify.probe_null_rate(spread)
    assert 0.3 < q < 0.5 and verify.probe_threshold(16, q) > 11
    noisy = _honest(sets, samples_ns=spread, probe_repeat_ns=[100_000] * 11 + [400_000] * 5,
                    probe_distinct_ns=[400_000] * 11 + [100_000] * 5)
    v = _verify(noisy, sets)
    assert v.ok and "no caching of repeated inputs (TEST04)" in v.checks, v.reason
    # the same pairs on a quiet machine: caught
    assert _verify(_honest(sets, probe_repeat_ns=[100_000] * 11 + [400_000] * 5,
                           probe_distinct_ns=[400_000] * 11 + [100_000] * 5), sets).code == "caching"
    # the null rate is the share of ordered pairs of timed calls over 1.5x apart
    assert verify.probe_null_rate([100, 100, 200, 200]) == 4 / 12
    assert verify.probe_null_rate([100] * 10) == 0.0 and verify.probe_null_rate([100]) == 0.0
    assert verify.probe_threshold(16, 0.25) == 11 and verify.probe_threshold(8, 0.25) == 7


def test_higher_precision_references_with_output_dtypes():
    sets = _sets()
    res = _honest(sets)
    refs64 = [[np.asarray(ref_fn(s)[0], np.float64)] for s in sets]
    v = verify_job(res, sets, refs64, lambda x: [np.asarray(ref_fn(x)[0], np.float64)], ["y"],
                   output_dtypes=["float32"])
    assert v.ok, v.reason
