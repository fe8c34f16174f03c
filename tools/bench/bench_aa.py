#!/usr/bin/env python3
"""A/A proof of the verdict's promise (docs/design.md §4.4, issue 7): one configuration raced and confirmed
against an identical copy of itself must be called "faster" at most 5% of the time.

Each comparison is a whole `tune` of a bundled model at its default shape on the device, with two
candidates that run the very same onnxruntime default session: the baseline (``ort default``) and a
copy under another key (not a baseline, so it is the race's winner and gets confirmed). Everything
goes through the tuner's own path: round 0, the race, then the confirmation rounds (fresh agent
processes, new inputs every round, interleaved), verdict by ``measure.round_ratio``. Each comparison
has its own seed, hence its own inputs. ``--copies N`` races N copies, so the winner is the luckiest
of N and the confirmation must undo the selection (winner's curse). For contrast, the table also gives
what the race rounds alone would have said (the pre-issue-7 method: the race's fastest, judged by a
grouped bootstrap on the same rounds).

    .venv/bin/python tools/bench/bench_aa.py [--comparisons 20] [--models mobilenet,transformer] [--copies 1]
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnxruntime

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import edgetune  # noqa: E402
from edgetune.api import resolve_model  # noqa: E402
from edgetune.candidate import Candidate  # noqa: E402
from edgetune.db import Store  # noqa: E402
from edgetune.measure import grouped_speedup  # noqa: E402
from edgetune.select import is_confirmation  # noqa: E402
from edgetune.space import Prepared  # noqa: E402
from edgetune.tune import tune  # noqa: E402
from edgetune.tune_config import TuneConfig  # noqa: E402

VERDICTS = ("faster", "slower", "no significant difference", "insufficient rounds", "no verdict")


@dataclass(frozen=True)
class Outcome:
    model: str
    verdict: str  # the confirmed verdict of the copy vs the baseline (identical configurations)
    value: float  # confirmed speedup
    ci: tuple[float, float]
    race_verdict: str  # what the race rounds alone would have claimed ("none": the race's fastest was the baseline)
    reason: str = ""  # why there is no verdict (a job failed verification)


def aa_candidates(model_path: str, copies: int) -> list[tuple[Candidate, Prepared]]:
    """The onnxruntime default, and COPIES copies of it under other keys: every one runs the same
    session (empty params), only the candidate key differs so each is recorded on its own."""
    same = Prepared("ort", Path(model_path), {})
    base = Candidate.make("ort", {}, baseline=True)
    return [(base, same)] + [(Candidate.make("ort", {"aa_copy": j}), same) for j in range(1, copies + 1)]


def race_only_verdict(store: Store, run_id: str, base_key: str) -> str:
    """The pre-issue-7 method on the same run: the race's fastest (by pooled race median), judged by a
    grouped bootstrap on the race rounds that chose it."""
    rows = [r for r in store.records(run_id=run_id) if not is_confirmation(r.round) and r.status == "verified"]
    raced = [r for r in rows if r.round > 0] or rows
    by_cand: dict[str, dict[int, np.ndarray]] = {}
    for r in raced:
        by_cand.setdefault(r.candidate_key, {})[r.round] = r.samples_ns
    if base_key not in by_cand or len(by_cand) < 2:
        return "none"
    best = min(by_cand, key=lambda k: float(np.median(np.concatenate(list(by_cand[k].values())))))
    if best == base_key:
        return "none"
    common = sorted(set(by_cand[best]) & set(by_cand[base_key]))
    return grouped_speedup([(by_cand[base_key][k], by_cand[best][k]) for k in common], resamples=500).verdict


def one_comparison(name: str, model_path: str, i: int, args: argparse.Namespace, db: Path) -> Outcome:
    extra = aa_candidates(model_path, args.copies)
    # the tuner splits a run's budget among its jobs: give each about --budget-ms of timing
    jobs = (1 + args.copies) * (1 + args.race_rounds + args.confirm_rounds)
    cfg = TuneConfig(budget_s=jobs * (args.budget_ms + 800) / 1e3, rounds=args.race_rounds, finalists=args.copies,
                     spaces=(), seed=i, fresh=True, confirm_rounds=args.confirm_rounds, timeout_s=30, extra=extra)
    dev = tune(model_path, [args.device], db=db, config=cfg).devices[0]
    if dev.summary is None or dev.status != "complete":
        raise SystemExit(f"comparison {i} on {name}: device {dev.device} {dev.status}: {dev.error}")
    shape = dev.summary.shapes[0]
    conf = shape.confirmation
    store = Store(db)
    try:
        race = race_only_verdict(store, dev.run_id, extra[0][0].key())
    finally:
        store.close()
    if conf is None or conf.vs_best_baseline is None:
        # identical configurations, yet one was disqualified: counted apart, never as a verdict
        why = "; ".join(f"{c.candidate.label()}: {c.reason}" for c in shape.candidates if c.reason)
        return Outcome(name, "no verdict", float("nan"), (float("nan"), float("nan")), race, why)
    r = conf.vs_best_baseline
    return Outcome(name, r.verdict, r.value, (r.ci_low, r.ci_high), race)


def clopper_pearson(k: int, n: int, level: float = 0.95) -> tuple[float, float]:
    """Exact binomial interval for k successes in n trials (conservative: covers at least LEVEL)."""
    a = (1 - level) / 2

    def cdf(p: float, upto: int) -> float:  # P(X <= upto) for X ~ Binomial(n, p)
        return sum(math.comb(n, j) * p ** j * (1 - p) ** (n - j) for j in range(upto + 1))

    def solve(f, target: float) -> float:  # f decreasing in p on [0, 1]
        lo, hi = 0.0, 1.0
        for _ in range(60):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if f(mid) > target else (lo, mid)
        return (lo + hi) / 2

    lower = 0.0 if k == 0 else solve(lambda p: cdf(p, k - 1), 1 - a)
    upper = 1.0 if k == n else solve(lambda p: cdf(p, k), a)
    return lower, upper


def rate_cell(k: int, n: int) -> str:
    if n == 0:
        return "—"
    lo, hi = clopper_pearson(k, n)
    return f"{k}/{n} = {100 * k / n:.1f}% [{100 * lo:.1f}, {100 * hi:.1f}]"


def table(outcomes: list[Outcome], models: list[str]) -> list[str]:
    out = ["| model | comparisons | confirmed \"faster\" [95% CI] | confirmed \"slower\" [95% CI] | "
           "no significant difference | no verdict (a job failed verification) | median confirmed ratio (p5–p95) | "
           "race-only \"faster\" (old method) |",
           "|---|---|---|---|---|---|---|---|"]
    for name in models + ["all"]:
        rows = [o for o in outcomes if name in ("all", o.model)]
        judged = [o for o in rows if o.verdict != "no verdict"]
        if not rows:
            continue
        n = len(judged)
        count = {v: sum(o.verdict == v for o in rows) for v in VERDICTS}
        vals = np.array([o.value for o in judged] or [float("nan")])
        race_fast = sum(o.race_verdict == "faster" for o in rows)
        label = "**all**" if name == "all" else name
        out.append(f"| {label} | {len(rows)} | {rate_cell(count['faster'], n)} | {rate_cell(count['slower'], n)} | "
                   f"{count['no significant difference']} | {count['no verdict']} | {np.median(vals):.3f} "
                   f"({np.percentile(vals, 5):.3f}–{np.percentile(vals, 95):.3f}) | {rate_cell(race_fast, len(rows))} |")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    # 20 per model: about 10 minutes on a quiet 2-core machine (~15 s a comparison: 14 agent processes)
    ap.add_argument("--comparisons", type=int, default=20, help="A/A comparisons per model")
    ap.add_argument("--models", default="mobilenet,transformer")
    ap.add_argument("--copies", type=int, default=1, help="identical copies raced against the baseline")
    ap.add_argument("--race-rounds", type=int, default=1)
    ap.add_argument("--confirm-rounds", type=int, default=TuneConfig.confirm_rounds)
    ap.add_argument("--budget-ms", type=float, default=100.0, help="timing budget of each job, about")
    ap.add_argument("--device", default="local")
    ap.add_argument("--first", type=int, default=0, help="index (and seed) of the first comparison: a second "
                    "batch with --first N draws new inputs and adds to a first batch of N per model")
    args = ap.parse_args()
    home = Path(tempfile.mkdtemp(prefix="edgetune-aa-"))
    os.environ.setdefault("EDGETUNE_HOME", str(home))
    db = home / "aa.db"
    models = args.models.split(",")
    print(f"# bench_aa: {args.comparisons} A/A comparisons per model, {args.copies} identical cop"
          f"{'y' if args.copies == 1 else 'ies'} vs the onnxruntime default, race rounds {args.race_rounds}, "
          f"confirmation rounds {args.confirm_rounds}, ~{args.budget_ms:g} ms timing per job, device {args.device}")
    print(f"# host {platform.node()} {platform.processor() or platform.machine()}, {os.cpu_count()} cores; "
          f"edgetune {edgetune.__version__}, onnxruntime {onnxruntime.__version__}; {time.strftime('%Y-%m-%d %H:%M')}")
    print(f"# command: .venv/bin/python tools/bench/bench_aa.py {' '.join(sys.argv[1:])}".rstrip())
    outcomes: list[Outcome] = []
    t0 = time.monotonic()
    for name in models:
        path = resolve_model(name)
        for i in range(args.first, args.first + args.comparisons):
            o = one_comparison(name, path, i, args, db)
            outcomes.append(o)
            print(f"#   {name} {i + 1}/{args.first + args.comparisons}: {o.value:.3f} [{o.ci[0]:.3f}, {o.ci[1]:.3f}] {o.verdict}"
                  f" (race only: {o.race_verdict}){' — ' + o.reason if o.reason else ''}", flush=True)
    print(f"# {len(outcomes)} comparisons in {time.monotonic() - t0:.0f} s")
    print()
    print("\n".join(table(outcomes, models)))
    n = sum(o.verdict != "no verdict" for o in outcomes)
    k = sum(o.verdict == "faster" for o in outcomes)
    if n == 0:
        print("\nNo comparison reached a verdict.")
        return 1
    lo, hi = clopper_pearson(k, n)
    print()
    print(f"Promise (\"faster\" at most 5% of the time for identical configurations): measured {100 * k / n:.1f}% "
          f"(95% CI {100 * lo:.1f}–{100 * hi:.1f}%): {'kept' if k / n <= 0.05 else 'NOT kept'}"
          + ("" if hi <= 0.05 else f"; more comparisons narrow the interval (its upper end is {100 * hi:.1f}%)"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
