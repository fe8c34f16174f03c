#!/usr/bin/env python3
"""Sequential confirmation's stopping rule, simulated: false verdicts and power of the exact
group-sequential looks (``measure.look_levels``) beside the union-bound looks they replaced.

Each simulated confirmation is one contender against its baseline, judged like ``select.replay``
judges it (Student's t on per-round log ratios, looks at ``measure.looks(cap)``, stopping at the
first interval that excludes 1.0). A round's log ratio is drawn from a noise model: ``normal:SD``
(per-round log ratios normal with that spread) or ``bimodal`` (each process in a slow mode 1.8x a
third of the time, as this VM's processes are, plus 3% log-normal jitter on each side). Seeded:
the same command prints the same table.

    .venv/bin/python tools/bench/bench_boundaries.py --cap 20 --alpha 0.035 --paths 20000
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from edgetune.measure import look_levels, looks, spent, t_quantile  # noqa: E402


def union_levels(cap: int, alpha: float) -> dict[int, float]:
    """The rule before: each look at its spending increment alone (the union bound)."""
    out, before = {}, 0.0
    for n in looks(cap):
        now = spent(n / cap, alpha)
        out[n] = 1.0 - (now - before)
        before = now
    return out


def draw(model: str, effect: float, shape: tuple[int, int], rng: np.random.Generator) -> np.ndarray:
    if model == "bimodal":
        def side():
            return np.where(rng.random(shape) < 1 / 3, math.log(1.8), 0.0) + rng.normal(0, 0.03, shape)
        return side() - side() + math.log(effect)
    sd = float(model.split(":", 1)[1])
    return rng.normal(math.log(effect), sd, shape)


def verdicts(x: np.ndarray, levels: dict[int, float]) -> tuple[float, float, float]:
    """Shares of paths whose first deciding look says faster / slower, and the mean rounds run."""
    n_paths = x.shape[0]
    decided = np.zeros(n_paths, dtype=np.int8)  # 1 faster, -1 slower
    rounds = np.full(n_paths, max(levels), dtype=np.int64)
    for n, lv in sorted(levels.items()):
        m = x[:, :n].mean(axis=1)
        half = t_quantile(1 - (1 - lv) / 2, n - 1) * x[:, :n].std(axis=1, ddof=1) / math.sqrt(n)
        new = decided == 0
        fast, slow = new & (m - half > 0), new & (m + half < 0)
        decided[fast], decided[slow] = 1, -1
        rounds[fast | slow] = n
    return float(np.mean(decided == 1)), float(np.mean(decided == -1)), float(rounds.mean())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cap", type=int, default=20)
    ap.add_argument("--alpha", type=float, default=0.05, help="the contender's share of the 5%% (0.035: the winner's)")
    ap.add_argument("--paths", type=int, default=20000)
    ap.add_argument("--effects", default="1.0,1.1,1.2,1.25,1.5")
    ap.add_argument("--noise", default="normal:0.15,normal:0.25,bimodal")
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    rules = {"exact (now)": look_levels(a.cap, a.alpha), "union bound (before)": union_levels(a.cap, a.alpha)}
    print(f"cap {a.cap}, alpha {a.alpha}, {a.paths} paths per cell, looks {looks(a.cap)}")
    for name, lv in rules.items():
        print(f"- {name}: levels " + ", ".join(f"{n}: {100 * v:.2f}%" for n, v in lv.items()))
    print()
    print("| noise | true speedup | rule | faster | slower | mean rounds |")
    print("|---|---|---|---|---|---|")
    for noise in a.noise.split(","):
        for e in (float(v) for v in a.effects.split(",")):
            x = draw(noise, e, (a.paths, a.cap), np.random.default_rng([a.seed, int(e * 1000)]))
            for name, lv in rules.items():  # the same paths for both rules
                f, s, r = verdicts(x, lv)
                print(f"| {noise} | {e:.2f} | {name} | {100 * f:.1f}% | {100 * s:.1f}% | {r:.1f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
