"""Measurement: raw samples -> statistics (docs/design.md §4).

Every raw sample is kept; statistics are derived, never stored instead of samples. A speedup is
a ratio of medians with its own bootstrap CI, and "faster" is claimed only when the whole CI lies
above 1.0.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, replace
from typing import Sequence, TypeVar

import numpy as np

BOOTSTRAP_RESAMPLES = 2000
BOOTSTRAP_SEED = 20261129
T = TypeVar("T")
_CHUNK_ELEMS = 4_000_000  # bound the bootstrap's memory: resamples x n per chunk


def _cover(value: float, lo: float, hi: float) -> tuple[float, float]:
    """A percentile-bootstrap interval of a median can miss the point estimate itself when the
    resampled medians are lumpy (few rounds, ties): widen it to include the estimate (conservative)."""
    return min(lo, value), max(hi, value)


def iterations_for_budget(budget_ms: float, estimate_ns: float, min_iters: int = 3, max_iters: int = 100_000) -> int:
    """Turn a millisecond budget into an iteration count from a per-iteration estimate."""
    if estimate_ns <= 0 or not math.isfinite(estimate_ns):
        return min_iters
    n = int(budget_ms * 1e6 // estimate_ns)
    return max(min_iters, min(max_iters, n))


@dataclass(frozen=True)
class Stats:
    n: int
    median_ns: float
    p10_ns: float
    p90_ns: float
    mean_ns: float
    min_ns: float
    cv: float  # std / mean
    ci_low_ns: float  # bootstrap 95% CI of the median
    ci_high_ns: float

    @property
    def median_ms(self) -> float:
        return self.median_ns / 1e6

    def as_dict(self) -> dict:
        return {
            "n": self.n,
            "median_ms": self.median_ns / 1e6,
            "p10_ms": self.p10_ns / 1e6,
            "p90_ms": self.p90_ns / 1e6,
            "mean_ms": self.mean_ns / 1e6,
            "min_ms": self.min_ns / 1e6,
            "cv": self.cv,
            "ci95_ms": [self.ci_low_ns / 1e6, self.ci_high_ns / 1e6],
        }


def _as_array(samples: Sequence[float] | np.ndarray) -> np.ndarray:
    arr = np.asarray(samples, dtype=np.float64).ravel()
    if arr.size == 0:
        raise ValueError("no samples")
    if not np.all(np.isfinite(arr)) or np.any(arr < 0):
        raise ValueError("samples must be finite and non-negative")
    return arr


def _bootstrap_medians(arr: np.ndarray, rng: np.random.Generator, resamples: int) -> np.ndarray:
    n = arr.size
    per_chunk = max(1, _CHUNK_ELEMS // n)
    out = np.empty(resamples)
    done = 0
    while done < resamples:
        k = min(per_chunk, resamples - done)
        idx = rng.integers(0, n, size=(k, n))
        out[done : done + k] = np.median(arr[idx], axis=1)
        done += k
    return out


def summarize(samples: Sequence[float] | np.ndarray, resamples: int = BOOTSTRAP_RESAMPLES) -> Stats:
    """Figures of one set of samples; the CI bootstraps them as independent (see summarize_rounds
    for samples that came in rounds). ``resamples=0``: no CI (the median for both ends)."""
    arr = _as_array(samples)
    med = float(np.median(arr))
    if arr.size == 1 or resamples == 0:
        lo = hi = med
    else:
        rng = np.random.default_rng(BOOTSTRAP_SEED)
        meds = _bootstrap_medians(arr, rng, resamples)
        lo, hi = _cover(med, *(float(v) for v in np.percentile(meds, [2.5, 97.5])))
    mean = float(arr.mean())
    cv = float(arr.std(ddof=1) / mean) if arr.size > 1 and mean > 0 else 0.0
    return Stats(
        n=int(arr.size),
        median_ns=med,
        p10_ns=float(np.percentile(arr, 10)),
        p90_ns=float(np.percentile(arr, 90)),
        mean_ns=mean,
        min_ns=float(arr.min()),
        cv=cv,
        ci_low_ns=lo,
        ci_high_ns=hi,
    )


# Below this many independent rounds no "faster"/"slower" verdict is given (the interval would rest
# on too few units to keep its 95% promise).
MIN_VERDICT_ROUNDS = 3


@dataclass(frozen=True)
class Ratio:
    """speedup = median(baseline) / median(candidate); > 1 means the candidate is faster.

    ``rounds``: the number of independent rounds behind the interval (None: samples of one process
    treated as independent, only for descriptive figures). With rounds below MIN_VERDICT_ROUNDS
    the verdict is "insufficient rounds", whatever the interval says."""

    value: float
    ci_low: float
    ci_high: float
    rounds: int | None = None
    method: str = "bootstrap"
    level: float = 0.95  # the interval's confidence (a sequential look's is wider than 95%)
    # the smallest speedup (or slowdown, 1/x) these rounds had 80% power to find at this level; None: unknown
    detectable: float | None = None

    @property
    def verdict(self) -> str:
        if self.rounds is not None and self.rounds < MIN_VERDICT_ROUNDS:
            return "insufficient rounds"
        if self.ci_low > 1.0:
            return "faster"
        if self.ci_high < 1.0:
            return "slower"
        return "no significant difference"

    def as_dict(self) -> dict:
        return {"speedup": self.value, "ci95": [self.ci_low, self.ci_high], "verdict": self.verdict,
                "rounds": self.rounds, "method": self.method, "level": self.level,
                **({"detectable": self.detectable} if self.detectable is not None else {})}


# two-sided 97.5% quantiles of Student's t for 1..30 degrees of freedom (beyond: normal 1.96 + 2.4/df)
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145,
         2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048,
         2.045, 2.042)


def t975(df: int) -> float:
    if df < 1:
        raise ValueError("a t interval needs at least 2 rounds")
    return _T975[df - 1] if df <= len(_T975) else 1.96 + 2.4 / df


def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the regularized incomplete beta function (Lentz's method)."""
    tiny, qab, qap, qam = 1e-300, a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 300):
        m2 = 2 * m
        for aa in (m * (b - m) * x / ((qam + m2) * (a + m2)), -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))):
            d = 1.0 + aa * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + aa / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-15:
            break
    return h


def _betainc(a: float, b: float, x: float) -> float:
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def t_sf(t: float, df: int) -> float:
    """P(T > t) for Student's t with ``df`` degrees of freedom."""
    tail = 0.5 * _betainc(df / 2.0, 0.5, df / (df + t * t))
    return tail if t >= 0 else 1.0 - tail


@functools.lru_cache(maxsize=1024)
def t_quantile(p: float, df: int) -> float:
    """The ``p`` quantile of Student's t (p in (0.5, 1)), by bisection on ``t_sf`` (cached: a
    sequential confirmation asks for the same few levels and degrees of freedom at every look)."""
    if df < 1:
        raise ValueError("a t interval needs at least 2 rounds")
    lo, hi = 0.0, 1.0
    while t_sf(hi, df) > 1.0 - p:
        hi *= 2.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if t_sf(mid, df) > 1.0 - p else (lo, mid)
        if hi - lo < 1e-10 * max(1.0, hi):
            break
    return 0.5 * (lo + hi)


def round_ratio(pairs: Sequence[tuple[np.ndarray, np.ndarray]], level: float = 0.95) -> Ratio:
    """Speedup from independent interleaved rounds: pairs[r] = (baseline samples, candidate samples)
    of round r (fresh processes each round). Each round gives one log ratio of medians; the interval
    is Student's t on those per-round log ratios, exact for few rounds when round effects are roughly
    log-normal, and back-transformed (geometric mean of per-round ratios). One round gives the point
    value with no interval and no verdict. ``level``: the interval's confidence (a sequential look
    spends only part of the 5%, ``alpha_spent``); ``detectable``: the smallest effect these rounds
    had 80% power to find at that level, from their spread."""
    meds = [(float(np.median(_as_array(b))), float(np.median(_as_array(c)))) for b, c in pairs]
    logs = np.array([math.log(mb / mc) for mb, mc in meds if mc > 0 and mb > 0])
    n = int(logs.size)
    if n == 0:
        raise ValueError("no rounds with positive medians")
    mean = float(logs.mean())
    if n == 1:
        v = math.exp(mean)
        return Ratio(v, v, v, rounds=1, method="t on per-round log ratios", level=level)
    q = t975(n - 1) if level == 0.95 else t_quantile(1.0 - (1.0 - level) / 2.0, n - 1)
    se = float(logs.std(ddof=1)) / math.sqrt(n)
    half = q * se
    detectable = math.exp((q + t_quantile(0.8, n - 1)) * se)
    return Ratio(math.exp(mean), math.exp(mean - half), math.exp(mean + half), rounds=n,
                 method="t on per-round log ratios", level=level, detectable=detectable)


# ---- sequential confirmation: looks and alpha spending ----------------------------------------
# Confirmation rounds go on until a look's interval excludes 1.0 or the cap is reached. Looking more
# than once at growing data would inflate the false verdict rate, so the looks share the 5% by
# Lan-DeMets alpha spending, Pocock-shaped: alpha(t) = alpha ln(1 + (e - 1) t) spent by information
# fraction t = n / cap, so early looks can stop on a clear effect and the last keeps a fair share.
# Each look's boundary is exact for the looks' joint distribution (group-sequential, Armitage-
# McPherson-Rowe recursive integration: the statistic at n rounds is a partial sum of independent
# per-round log ratios, so looks at n_j < n_k correlate as sqrt(n_j / n_k)): look k rejects with
# probability alpha(t_k) - alpha(t_{k-1}) among the paths no earlier look stopped, under no effect.
# The boundary's nominal level is then used with Student's t at the look's rounds (the significance
# level approach, Jennison & Turnbull ch. 3.4), since the per-round spread is estimated. The union
# bound (each look at its increment) holds whatever the dependence but ignores the strong positive
# correlation of one confirmation's looks and so spends less than the 5% it is given; the exact
# boundaries give the later looks narrower intervals at the same promise. Several contenders
# confirmed one after another share the 5% by the union bound (select.CONTENDER_SHARES): their
# rounds are separate.
ALPHA = 0.05
LOOK_FRACTIONS = (0.25, 0.4, 0.6, 0.8, 1.0)
_GS_GRID = 241  # Simpson points per look's continuation region (error far below 1e-6 of alpha)


def looks(cap: int) -> tuple[int, ...]:
    """The round counts at which a confirmation of at most ``cap`` rounds is judged."""
    pts = {max(MIN_VERDICT_ROUNDS, round(cap * f)) for f in LOOK_FRACTIONS}
    return tuple(sorted(n for n in pts if n <= cap)) or (cap,)


def spent(t: float, alpha: float = ALPHA) -> float:
    """Pocock-shaped alpha spending function: the share of ``alpha`` spent by information fraction t."""
    return alpha * math.log(1.0 + (math.e - 1.0) * min(1.0, max(0.0, t)))


_erfc = np.frompyfunc(math.erfc, 1, 1)


def _norm_sf(x: np.ndarray | float) -> np.ndarray:
    return 0.5 * np.asarray(_erfc(np.asarray(x, dtype=np.float64) / math.sqrt(2.0)), dtype=np.float64)


def _simpson(b: float, m: int) -> tuple[np.ndarray, np.ndarray]:
    """Points and Simpson weights on [-b, b] (m odd)."""
    x = np.linspace(-b, b, m)
    w = np.ones(m)
    w[1:-1:2], w[2:-1:2] = 4.0, 2.0
    return x, w * (2.0 * b / (m - 1)) / 3.0


@functools.lru_cache(maxsize=256)
def group_sequential_bounds(fractions: tuple[float, ...], alpha: float = ALPHA) -> tuple[float, ...]:
    """Two-sided symmetric boundaries |Z_k| >= c_k for looks at information fractions ``fractions``
    (increasing, the last 1.0) spending ``spent(t, alpha)``: exact under no effect for the looks'
    joint normal distribution, by recursive numerical integration of the partial-sum density over
    each look's continuation region. Deterministic (no simulation)."""
    bounds: list[float] = []
    grid = dens = None  # the sub-density of S_t (Var t) over the last look's continuation region
    prev = 0.0
    for t in fractions:
        share = spent(t, alpha) - spent(prev, alpha)
        sd = math.sqrt(t - prev)

        def crossing(c: float) -> float:
            b = c * math.sqrt(t)
            if grid is None:
                return float(2.0 * _norm_sf(c))
            return float(np.sum(dens * (_norm_sf((b - grid) / sd) + _norm_sf((b + grid) / sd))))

        lo, hi = 0.0, 12.0
        for _ in range(100):  # crossing() falls as c grows
            mid = 0.5 * (lo + hi)
            lo, hi = (mid, hi) if crossing(mid) > share else (lo, mid)
            if hi - lo < 1e-10:
                break
        c = 0.5 * (lo + hi)
        bounds.append(c)
        x, w = _simpson(c * math.sqrt(t), _GS_GRID)
        if grid is None:
            new = np.exp(-0.5 * x * x / t) / math.sqrt(2.0 * math.pi * t)
        else:
            z = (x[:, None] - grid[None, :]) / sd
            new = (np.exp(-0.5 * z * z) / (sd * math.sqrt(2.0 * math.pi))) @ dens
        grid, dens, prev = x, new * w, t  # dens holds density x weight: sums are integrals
    return tuple(bounds)


def _z_levels(ns: tuple[int, ...], alpha: float) -> list[float]:
    cap = ns[-1]
    return [1.0 - 2.0 * float(_norm_sf(c)) for c in group_sequential_bounds(tuple(n / cap for n in ns), alpha)]


_T_CALIBRATION_PATHS = 100_000
_T_CALIBRATION_SEED = 20261204


@functools.lru_cache(maxsize=2)  # 4 MB each; only the calibration reads them (its levels are cached)
def _null_t_paths(ns: tuple[int, ...]) -> np.ndarray:
    """|t| at each look of seeded confirmations under no effect (normal per-round log ratios): a
    (looks, paths) array, the same in every process."""
    rng = np.random.default_rng([_T_CALIBRATION_SEED, ns[-1], len(ns)])
    out = np.empty((len(ns), _T_CALIBRATION_PATHS))
    step = 20_000  # bound the memory: paths x cap per chunk
    for a in range(0, _T_CALIBRATION_PATHS, step):
        x = rng.standard_normal((step, ns[-1]))
        s1, s2 = np.cumsum(x, axis=1), np.cumsum(x * x, axis=1)
        for j, n in enumerate(ns):
            mean = s1[:, n - 1] / n
            sd = np.sqrt(np.maximum(s2[:, n - 1] - n * mean * mean, 0.0) / (n - 1))
            out[j, a:a + step] = np.abs(mean) / np.maximum(sd / math.sqrt(n), 1e-300)
    return out


@functools.lru_cache(maxsize=256)
def _t_levels(ns: tuple[int, ...], alpha: float) -> tuple[float, ...]:
    """The looks' levels for Student's t at each look's rounds. The exact normal boundaries, used
    with t at few rounds, reject a little more often than they spend (the looks' t statistics
    correlate less than their z, since each estimates its own spread: 5.4-5.6% for 5% at caps 5-20),
    so the spending is scaled down until the seeded null confirmations (``_null_t_paths``) reject
    at no more than ``alpha`` in all (within their Monte Carlo error, 0.07% at 5%)."""
    paths = _null_t_paths(ns)

    def error(a: float) -> float:
        qs = np.array([t_quantile(1.0 - (1.0 - lv) / 2.0, n - 1) for lv, n in zip(_z_levels(ns, a), ns)])
        return float(np.mean(np.any(paths > qs[:, None], axis=0)))

    lo, hi = alpha / len(ns), alpha  # the union bound's total never exceeds alpha; the exact z's may
    if error(hi) <= alpha:
        return tuple(_z_levels(ns, hi))
    for _ in range(14):  # error() grows with the spending: common paths make it monotone
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if error(mid) <= alpha else (lo, mid)
    return tuple(_z_levels(ns, lo))


def look_levels(cap: int, alpha: float = ALPHA) -> dict[int, float]:
    """Round count -> the confidence level of its look's t interval: the exact group-sequential
    boundary for the looks' joint distribution (``group_sequential_bounds``), its spending scaled to
    keep ``alpha`` for t at few rounds (``_t_levels``); a single look: 1 - alpha."""
    ns = looks(cap)
    if len(ns) == 1:
        return {ns[0]: 1.0 - alpha}
    return dict(zip(ns, _t_levels(ns, alpha)))


def speedup(baseline: Sequence[float] | np.ndarray, candidate: Sequence[float] | np.ndarray,
            resamples: int = BOOTSTRAP_RESAMPLES) -> Ratio:
    """Ratio of medians with a bootstrap 95% CI (baseline and candidate resampled independently)."""
    b = _as_array(baseline)
    c = _as_array(candidate)
    value = float(np.median(b) / np.median(c))
    rng = np.random.default_rng(BOOTSTRAP_SEED + 1)
    mb = _bootstrap_medians(b, rng, resamples)
    mc = _bootstrap_medians(c, rng, resamples)
    ratios = mb / mc
    lo, hi = (float(v) for v in np.percentile(ratios, [2.5, 97.5]))
    return Ratio(value, *_cover(value, lo, hi))


_GROUP_CAP = 1000  # samples kept per round for the grouped bootstrap (bounds its cost)


def _capped(groups: Sequence[np.ndarray], rng: np.random.Generator) -> list[np.ndarray]:
    out = []
    for g in groups:
        g = _as_array(g)
        out.append(g if g.size <= _GROUP_CAP else rng.choice(g, _GROUP_CAP, replace=False))
    return out


def grouped_speedup(pairs: Sequence[tuple[np.ndarray, np.ndarray]], resamples: int = BOOTSTRAP_RESAMPLES) -> Ratio:
    """Speedup from interleaved rounds: pairs[r] = (baseline samples, candidate samples) of round r.

    Samples within one process are correlated; rounds are the independent units. The CI comes from a
    two-level bootstrap: rounds resampled with replacement (baseline and candidate together, since
    they ran side by side), then samples within each chosen round. The point value is the ratio of
    pooled medians.
    """
    if len(pairs) < 2:
        b, c = pairs[0]
        return speedup(b, c, resamples)
    b_all = np.concatenate([_as_array(b) for b, _ in pairs])
    c_all = np.concatenate([_as_array(c) for _, c in pairs])
    value = float(np.median(b_all) / np.median(c_all))
    rng = np.random.default_rng(BOOTSTRAP_SEED + 2)
    bs = _capped([b for b, _ in pairs], rng)
    cs = _capped([c for _, c in pairs], rng)
    n_rounds = len(pairs)
    ratios = np.empty(resamples)
    for i in range(resamples):
        picks = rng.integers(0, n_rounds, size=n_rounds)
        bb = np.concatenate([bs[p][rng.integers(0, bs[p].size, size=bs[p].size)] for p in picks])
        cc = np.concatenate([cs[p][rng.integers(0, cs[p].size, size=cs[p].size)] for p in picks])
        ratios[i] = np.median(bb) / np.median(cc)
    lo, hi = (float(v) for v in np.percentile(ratios, [2.5, 97.5]))
    return Ratio(value, *_cover(value, lo, hi))


def round_median(groups: Sequence[np.ndarray]) -> float:
    """Median over rounds of each round's median: the rounds (one process each) are the independent
    units, so one slow or fast process moves it by one rank, not by its number of samples."""
    meds = [np.median(g) for g in groups if np.size(g)]
    return float(np.median(meds)) if meds else float("nan")


def rotation(items: Sequence[T], k: int) -> list[T]:
    """Running order of interleaved round k (1-based): A B C, B C A, C A B, ... so drift and position
    within a round fall on every participant alike. The one rotation rule of every round loop."""
    items = list(items)
    s = (k - 1) % max(1, len(items))
    return items[s:] + items[:s]


def summarize_rounds(groups: Sequence[np.ndarray]) -> Stats:
    """Figures of samples that came in rounds (one process each): the pooled samples' figures, with
    the median's CI from the rounds as the independent units (grouped_median_ci) when there are
    several, never narrower than the median itself."""
    groups = [g for g in groups if np.size(g)]
    if len(groups) <= 1:
        return summarize(groups[0] if groups else [])
    stats = summarize(np.concatenate(groups), resamples=0)
    lo, hi = grouped_median_ci(groups, resamples=500)
    return replace(stats, ci_low_ns=min(lo, stats.median_ns), ci_high_ns=max(hi, stats.median_ns))


def grouped_median_ci(groups: Sequence[np.ndarray], resamples: int = BOOTSTRAP_RESAMPLES) -> tuple[float, float]:
    """95% CI of the pooled median with rounds as the independent units (see grouped_speedup)."""
    rng = np.random.default_rng(BOOTSTRAP_SEED + 3)
    gs = _capped(groups, rng)
    meds = np.empty(resamples)
    for i in range(resamples):
        picks = rng.integers(0, len(gs), size=len(gs))
        meds[i] = np.median(np.concatenate([gs[p][rng.integers(0, gs[p].size, size=gs[p].size)] for p in picks]))
    lo, hi = np.percentile(meds, [2.5, 97.5])
    return float(lo), float(hi)
