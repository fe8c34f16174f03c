import numpy as np
import pytest

from edgetune.measure import grouped_speedup, iterations_for_budget, rotation, round_median, speedup, summarize


def test_iterations_from_budget():
    assert iterations_for_budget(100, 1e6) == 100  # 100 ms at 1 ms each
    assert iterations_for_budget(100, 1e9, min_iters=3) == 3
    assert iterations_for_budget(1e6, 1, max_iters=50) == 50
    assert iterations_for_budget(100, 0) == 3


def test_summary_statistics():
    rng = np.random.default_rng(1)
    x = rng.normal(1e6, 1e4, 2001)
    s = summarize(x)
    assert s.n == 2001
    assert s.median_ns == pytest.approx(np.median(x))
    assert s.p10_ns < s.median_ns < s.p90_ns
    assert s.ci_low_ns <= s.median_ns <= s.ci_high_ns
    assert 0.005 < s.cv < 0.02
    # CI of the median shrinks with more samples
    assert (summarize(x[:100]).ci_high_ns - summarize(x[:100]).ci_low_ns) > (s.ci_high_ns - s.ci_low_ns)


def test_summary_rejects_bad_samples():
    with pytest.raises(ValueError):
        summarize([])
    with pytest.raises(ValueError):
        summarize([1.0, float("nan")])


def test_speedup_claims_only_when_ci_above_one():
    rng = np.random.default_rng(2)
    base = rng.normal(2e6, 2e4, 500)
    fast = rng.normal(1e6, 1e4, 500)
    r = speedup(base, fast)
    assert r.value == pytest.approx(2.0, rel=0.02)
    assert r.ci_low > 1.0 and r.verdict == "faster"
    same = speedup(base, rng.normal(2e6, 2e4, 500))
    assert same.ci_low < 1.0 < same.ci_high
    assert same.verdict == "no significant difference"
    assert speedup(fast, base).verdict == "slower"


def test_grouped_speedup_widens_ci_when_rounds_disagree():
    rng = np.random.default_rng(3)
    # per-round drift that hits both: the ratio stays ~1.5 and the grouped CI says so
    pairs = []
    for level in (1.0, 1.3, 0.8, 1.1):
        pairs.append((rng.normal(1.5e6 * level, 1e4, 300), rng.normal(1e6 * level, 1e4, 300)))
    r = grouped_speedup(pairs, resamples=300)
    assert r.ci_low > 1.0 and 1.35 < r.value < 1.65
    # rounds where the candidate's advantage flips: no claim, whatever the sample count
    flip = [(rng.normal(1e6, 1e3, 400), rng.normal(0.7e6, 1e3, 400)),
            (rng.normal(1e6, 1e3, 400), rng.normal(1.4e6, 1e3, 400)),
            (rng.normal(1e6, 1e3, 400), rng.normal(0.75e6, 1e3, 400)),
            (rng.normal(1e6, 1e3, 400), rng.normal(1.35e6, 1e3, 400))]
    pooled = speedup(np.concatenate([b for b, _ in flip]), np.concatenate([c for _, c in flip]))
    grouped = grouped_speedup(flip, resamples=300)
    assert grouped.ci_high - grouped.ci_low > pooled.ci_high - pooled.ci_low
    assert grouped.verdict == "no significant difference"


def test_intervals_always_cover_their_point_estimate():
    rng = np.random.default_rng(9)
    for trial in range(30):
        # two lumpy rounds with many ties: the case where percentile intervals can miss the estimate
        pairs = [(np.round(rng.normal(1e6, 3e5, 7), -5), np.round(rng.normal(6e5, 2e5, 5), -5) + 1e5)
                 for _ in range(2)]
        pairs = [(np.abs(b) + 1, np.abs(c) + 1) for b, c in pairs]
        r = grouped_speedup(pairs, resamples=200)
        assert r.ci_low <= r.value <= r.ci_high
        s = summarize(np.concatenate([b for b, _ in pairs]), resamples=200)
        assert s.ci_low_ns <= s.median_ns <= s.ci_high_ns


def test_round_ratio_t_interval_and_min_rounds():
    from edgetune.measure import MIN_VERDICT_ROUNDS, round_ratio

    rng = np.random.default_rng(7)
    # candidate twice as fast in every round, with round-to-round drift shared by both
    pairs = []
    for _ in range(6):
        drift = rng.uniform(0.8, 1.2)
        pairs.append((rng.normal(2e6 * drift, 1e4, 50), rng.normal(1e6 * drift, 1e4, 50)))
    r = round_ratio(pairs)
    assert r.rounds == 6 and r.verdict == "faster"
    assert r.ci_low < 2.0 < r.ci_high or abs(r.value - 2.0) < 0.05
    assert r.ci_low <= r.value <= r.ci_high
    # below the minimum number of rounds there is no verdict, however clear the samples look
    short = round_ratio(pairs[: MIN_VERDICT_ROUNDS - 1])
    assert short.verdict == "insufficient rounds"
    one = round_ratio(pairs[:1])
    assert one.rounds == 1 and one.verdict == "insufficient rounds"
    # rounds that disagree give a wide interval spanning 1
    flip = [(np.full(20, 2e6), np.full(20, 1e6)), (np.full(20, 1e6), np.full(20, 2e6)),
            (np.full(20, 1.5e6), np.full(20, 1.4e6))]
    assert round_ratio(flip).verdict == "no significant difference"


def test_summarize_rounds_takes_rounds_as_the_units():
    """Samples of one process are correlated: three rounds 5% apart, 2,000 samples each, leave the
    median uncertain by about that much, whatever the sample count says. The pooled bootstrap
    claims a far narrower interval; summarize_rounds does not."""
    from edgetune.measure import summarize_rounds

    rng = np.random.default_rng(5)
    groups = [rng.normal(level, 20.0, 2000) for level in (1000.0, 1050.0, 1100.0)]
    pooled = summarize(np.concatenate(groups))
    rounds = summarize_rounds(groups)
    assert rounds.median_ns == pooled.median_ns and rounds.n == 6000
    assert rounds.ci_high_ns - rounds.ci_low_ns > 5 * (pooled.ci_high_ns - pooled.ci_low_ns)
    assert rounds.ci_low_ns <= rounds.median_ns <= rounds.ci_high_ns
    # one round: the samples are all there is
    one = summarize_rounds(groups[:1] + [np.array([])])
    assert (one.ci_low_ns, one.ci_high_ns) == (summarize(groups[0]).ci_low_ns, summarize(groups[0]).ci_high_ns)


def test_round_median_takes_rounds_as_the_units():
    # one round of many slow samples moves it by one rank, not by its number of samples
    rounds = [np.full(3, 1.0), np.full(3, 2.0), np.full(1000, 50.0)]
    assert round_median(rounds) == 2.0
    assert float(np.median(np.concatenate(rounds))) == 50.0  # what pooling would say
    assert round_median([np.array([1.0, 3.0]), np.array([], float), np.array([5.0])]) == 3.5  # empty rounds skipped
    assert np.isnan(round_median([]))


def test_rotation_puts_every_participant_in_every_position():
    p = ["a", "b", "c"]
    orders = [rotation(p, k) for k in range(1, 7)]
    assert orders[:3] == [["a", "b", "c"], ["b", "c", "a"], ["c", "a", "b"]]
    assert orders[3:] == orders[:3]  # period = number of participants
    for pos in range(3):
        assert sorted(o[pos] for o in orders[:3]) == p
    assert rotation([], 5) == [] and rotation(("x",), 9) == ["x"]
