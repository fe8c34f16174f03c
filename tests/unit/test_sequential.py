"""Sequential confirmation (select.replay with looks and alpha spending, measure.look_levels).

Records are built in memory (RecordRow) so thousands of simulated confirmations run through the
real ``replay``: the false verdict rate it promises is checked by simulation, with noise shaped like
this machine's (per-process bimodal medians), and so is its power."""

from __future__ import annotations

import math

import numpy as np
import pytest

from edgetune.candidate import Candidate
from edgetune.db import RecordRow
from edgetune.measure import ALPHA, group_sequential_bounds, look_levels, looks, spent, t_quantile
from edgetune.select import CONTENDER_SHARES, confirmed_ratio, replay, stored_round

BASE = Candidate.make("ort", {}, baseline=True)
A = Candidate.make("ort", {"intra_op_num_threads": 1})
B = Candidate.make("ort", {"intra_op_num_threads": 2})


def _row(cand: Candidate, rnd: int, median_ns: float, i: list[int]) -> RecordRow:
    i[0] += 1
    return RecordRow(i[0], "r", f"w{rnd}", {"batch": 1}, "x", "fp", cand.key(), cand.as_dict(), {}, rnd, "verified",
                     "", {}, np.array([int(median_ns)], dtype=np.int64), 1.0, 1.0, 0.0)


def _race(i, contenders=(A,)):
    rows = []
    for rnd in range(3):
        rows.append(_row(BASE, rnd, 2e6, i))
        for n, c in enumerate(contenders):
            rows.append(_row(c, rnd, 1e6 * (1 + 0.1 * n), i))
    return rows


def _confirm(i, rows_by_round, cand=A):
    out = []
    for k, (base_ns, cand_ns) in rows_by_round.items():
        out += [_row(cand, stored_round(k), cand_ns, i), _row(BASE, stored_round(k), base_ns, i)]
    return out


def test_looks_and_spending():
    assert looks(3) == (3,) and look_levels(3) == {3: pytest.approx(0.95)}  # one look: the fixed design
    assert looks(20) == (5, 8, 12, 16, 20)
    for cap in (5, 8, 20, 40):
        levels = look_levels(cap)
        assert all(0.95 < v < 1 for v in levels.values()), levels
    # the exact boundaries spend what the union bound wastes: the later looks are judged at lower levels
    levels = look_levels(20)
    union = {n: 1 - (spent(n / 20) - spent(p / 20)) for p, n in zip((0,) + looks(20)[:-1], looks(20))}
    assert all(levels[n] < union[n] for n in (8, 12, 16, 20)), (levels, union)


def test_group_sequential_bounds_spend_exactly_their_shares():
    """The normal boundaries against seeded simulated looks: each look's first crossings match its
    spending increment, and all the looks together spend 5%, not less (the union bound's fault)."""
    cap, ns = 20, looks(20)
    c = np.array(group_sequential_bounds(tuple(n / cap for n in ns)))
    x = np.random.default_rng(1).standard_normal((200_000, cap)).cumsum(axis=1)
    hit = np.abs(np.stack([x[:, n - 1] / math.sqrt(n) for n in ns], axis=1)) >= c
    first = np.where(hit.any(axis=1), hit.argmax(axis=1), -1)
    for k, (p, n) in enumerate(zip((0,) + ns[:-1], ns)):
        assert np.mean(first == k) == pytest.approx(spent(n / cap) - spent(p / cap), abs=0.0012), k
    assert hit.any(axis=1).mean() == pytest.approx(ALPHA, abs=0.002)


@pytest.mark.parametrize("cap,alpha", [(5, ALPHA), (8, ALPHA), (20, ALPHA), (20, ALPHA * CONTENDER_SHARES[1])])
def test_t_looks_keep_the_promised_rate(cap, alpha):
    """Student's t at each look's level on simulated null confirmations (a seed the calibration did
    not use): the false verdict rate is the promised one, within Monte Carlo error."""
    ns, levels = looks(cap), look_levels(cap, alpha)
    x = np.random.default_rng(99).standard_normal((100_000, cap))
    hit = np.zeros(x.shape[0], dtype=bool)
    for n in ns:
        half = t_quantile(1 - (1 - levels[n]) / 2, n - 1) * x[:, :n].std(axis=1, ddof=1) / math.sqrt(n)
        hit |= np.abs(x[:, :n].mean(axis=1)) > half
    sd = math.sqrt(alpha * (1 - alpha) / x.shape[0])
    assert alpha - 5 * sd < hit.mean() <= alpha + 4 * sd, hit.mean()


def test_a_clear_effect_stops_at_the_first_look():
    i = [0]
    rows = _race(i) + _confirm(i, {k: (2e6, 1e6 * (1 + 0.01 * (k % 3))) for k in range(1, 6)})
    conf = replay(rows, 20)
    assert conf.rounds == (1, 2, 3, 4, 5) and conf.decided and conf.next_round is None
    assert conf.level == pytest.approx(look_levels(20)[5])


def test_no_effect_runs_to_the_cap_then_the_runner_up_gets_its_turn_only_with_time():
    i = [0]
    rng = np.random.default_rng(3)
    rows = _race(i, (A, B)) + _confirm(i, {k: (1e6, 1e6 * math.exp(rng.normal(0, 0.05))) for k in range(1, 9)})
    conf = replay(rows, 8)  # looks at 3, 5, 6, 8 (cap 8)
    assert conf.contender == A.key() and conf.rounds == tuple(range(1, 9)) and not conf.decided
    assert conf.next_round is None and not conf.ended  # out of time: A's undecided verdict stands
    more = replay(rows, 8, extend=True)  # time left: B's rounds, with B's share of the 5%
    assert more.contender == B.key() and more.next_round == 9 and more.rounds == ()
    assert more.ended[0].key == A.key() and more.ended[0].verdict == "no significant difference"
    rows += _confirm(i, {9: (1e6, 1e6)}, cand=B)
    again = replay(rows, 8)  # B's stored round: a report sees the same walk without being told
    assert again.contender == B.key() and again.rounds == (9,)


def test_a_confirmation_cut_short_is_judged_at_the_next_looks_level():
    i = [0]
    rows = _race(i) + _confirm(i, {k: (1e6, 1e6 * (1.0 + 0.02 * (-1) ** k)) for k in range(1, 8)})
    conf = replay(rows, 20)  # 7 rounds: past the look at 5, short of the one at 8
    assert conf.rounds == tuple(range(1, 8)) and conf.next_round == 8
    assert conf.level == pytest.approx(look_levels(20)[8])


def _simulate(effect: float, n_sims: int, cap: int, seed: int, two: bool = False) -> dict[str, int]:
    """Confirmations whose rounds are drawn like this machine's: each process lands in one of two
    timing modes (the slow one 1.8x, a third of the time), so a round's log ratio is bimodal."""
    rng = np.random.default_rng(seed)
    counts = {"faster": 0, "slower": 0, "none": 0}
    for _ in range(n_sims):
        i = [0]
        conts = (A, B) if two else (A,)
        rows = _race(i, conts)

        def draw():
            return (1.8 if rng.random() < 1 / 3 else 1.0) * math.exp(rng.normal(0, 0.03))

        k = 1
        for c in conts:
            for _ in range(cap):
                rows += _confirm(i, {k: (1e6 * draw(), 1e6 * draw() / effect)}, cand=c)
                k += 1
                conf = replay(rows, cap, extend=True)
                if conf.next_round is None:
                    break
                if conf.contender != c.key():
                    break
            conf = replay(rows, cap, extend=True)
            if conf.next_round is None:
                break
        conf = replay(rows, cap)
        r = confirmed_ratio(rows, conf, BASE.key(), conf.contender)
        v = r.verdict if r else "none"
        counts["faster" if v == "faster" else "slower" if v == "slower" else "none"] += 1
    return counts


@pytest.mark.parametrize("two", [False, True])
def test_a_a_false_verdicts_stay_within_the_promise(two):
    n = 150
    c = _simulate(1.0, n, 12, seed=11 + two, two=two)  # cap 12: looks at 3, 5, 7, 10, 12
    # 5% two-sided: at most 2.5% each side in expectation; binomial slack of 3 sd
    bound = n * 0.025 + 3 * math.sqrt(n * 0.025 * 0.975)
    assert c["faster"] <= bound and c["slower"] <= bound, c


def test_a_real_win_is_found():
    c = _simulate(1.5, 50, 20, seed=5)
    assert c["faster"] >= 40, c  # bimodal noise and all: a 1.5x win is confirmed nearly always
    assert c["slower"] == 0, c


def test_contender_shares_add_up():
    assert sum(CONTENDER_SHARES) == pytest.approx(1.0)


def test_bimodal_process_timings_are_named_not_hidden():
    from edgetune.results import timing_modes

    ms = [0.34, 0.36, 0.35, 0.63, 0.65, 0.33, 0.64, 0.37]  # this VM's mobilenet default, process medians
    modes = timing_modes([x * 1e6 for x in ms])
    assert modes is not None
    assert modes[0]["median_ms"] == pytest.approx(0.35, abs=0.01) and modes[0]["share"] == pytest.approx(5 / 8)
    assert modes[1]["median_ms"] == pytest.approx(0.64, abs=0.01) and modes[1]["share"] == pytest.approx(3 / 8)
    assert timing_modes([x * 1e6 for x in (0.44, 0.47, 0.5, 0.55, 0.52, 0.49)]) is None  # one spread mode
    assert timing_modes([x * 1e6 for x in (0.35, 0.35, 0.35, 0.35, 0.35, 0.35, 0.35, 0.64)]) is None  # one outlier
