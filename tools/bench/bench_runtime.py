#!/usr/bin/env python3
"""Issue-2 benchmark, with issue 7's select-then-confirm: for each bundled model at batch 1 and 16,
the race's winner (fastest verified configuration in the race) confirmed against the strongest
baseline (the fastest runtime default; for an ONNX model, onnxruntime's) in fresh interleaved rounds
on new inputs. Medians and the ratio with its 95% CI (t on per-round log ratios) come from those
confirmation rounds only; the race's own ratio is shown as descriptive. Also the per-candidate
overhead of the agent path vs the candidate's own run time.

    .venv/bin/python tools/bench/bench_runtime.py [--budget 40] [--device local]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from edgetune.api import resolve_model  # noqa: E402
from edgetune.db import Store  # noqa: E402
from edgetune.tune import tune  # noqa: E402
from edgetune.tune_config import TuneConfig  # noqa: E402


def _median(c) -> str:
    return f"{c.confirm_stats.median_ms:.3f}" if c is not None and c.confirm_stats else "—"


def confirmed_row(device: str, name: str, s) -> str:
    """One shape: the race's winner, judged only by its confirmation rounds against the strongest baseline."""
    shape = " ".join(f"{k}={v}" for k, v in s.shape.items())
    win, base, conf = s.winner, s.get(s.best_baseline_key), s.confirmation
    race = win.race_vs_best_baseline if win else None
    sp = conf.vs_best_baseline if conf else None
    best = s.best.candidate.label() if s.best else "none"
    return (f"| {device} | {name} | {shape} | {win.candidate.label() if win else 'none'} | "
            + (f"{race.value:.3f}× ({race.rounds} rounds)" if race else "—") + " | "
            + f"{base.candidate.label() if base else 'none'} | {_median(base)} | {_median(win)} | "
            + (f"{sp.value:.3f}× [{sp.ci_low:.3f}, {sp.ci_high:.3f}] | {sp.rounds} | {sp.verdict}" if sp else "— | 0 | —")
            + f" | {best} |")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--budget", type=float, default=40.0, help="seconds per model (both batch sizes)")
    ap.add_argument("--device", action="append", default=None)
    ap.add_argument("--models", default="mobilenet,transformer")
    ap.add_argument("--rounds", type=int, default=3, help="race rounds")
    ap.add_argument("--confirm-rounds", type=int, default=TuneConfig.confirm_rounds)
    args = ap.parse_args()
    devices = args.device or ["local"]
    home = Path(tempfile.mkdtemp(prefix="edgetune-bench-"))
    os.environ.setdefault("EDGETUNE_HOME", str(home))
    db = home / "bench.db"
    print(f"# bench_runtime: budget {args.budget:g} s per model, race rounds {args.rounds}, confirmation rounds "
          f"{args.confirm_rounds}, devices {devices}")
    print("| device | model | shape | race winner | race ratio (descriptive) | strongest baseline | baseline median ms | "
          "winner median ms | confirmed speedup [95% CI] | rounds | verdict | selected |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    overhead_rows = []
    for name in args.models.split(","):
        model = resolve_model(name)
        cfg = TuneConfig(budget_s=args.budget, rounds=args.rounds, confirm_rounds=args.confirm_rounds, spaces=("ort",))
        out = tune(model, devices, sweeps=["batch=1,16"], db=db, config=cfg)
        for d in out.devices:
            if d.summary is None:
                print(f"| {d.device} | {name} | — | down: {d.error} |")
                continue
            for s in d.summary.shapes:
                print(confirmed_row(d.device, name, s))
            store = Store(db)
            for r in store.records(run_id=d.run_id):
                if r.status != "verified":
                    continue
                own = float(r.samples_ns.sum()) / 1e6
                overhead_rows.append((d.device, name, r.wall_ms - own, r.wall_ms - r.agent_ms, r.agent_ms - own, own))
            store.close()
    print()
    print("Per-candidate overhead of the agent path (median over every verified job of the runs above):")
    print()
    print("| device | model | jobs | total overhead ms | host side (set-up, transport, parsing) ms | agent process (start, load, verification runs, warm-up) ms | candidate's own timed runs ms |")
    print("|---|---|---|---|---|---|---|")
    keys = sorted({(r[0], r[1]) for r in overhead_rows})
    for dev, name in keys:
        rows = np.array([r[2:] for r in overhead_rows if (r[0], r[1]) == (dev, name)])
        med = np.median(rows, axis=0)
        print(f"| {dev} | {name} | {len(rows)} | {med[0]:.0f} | {med[1]:.0f} | {med[2]:.0f} | {med[3]:.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
