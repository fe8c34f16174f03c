#!/usr/bin/env python3
"""Tuning cost (issue 11): how much tuning time the bundled models need before the selected
configuration is within 90% of the speedup a long tune reaches.

For each bundled model, ``edgetune tune MODEL --accuracy cosine=0.999 --budget B --fresh`` runs at
each budget B on the local device; each run's wall time (the whole command: model checks, int8
builds, screening, race and confirmation) and its selected configuration's confirmed speedup over
the onnxruntime default (1.0 where the default stays selected) are printed. "90% reached at" is the
first budget whose speedup is at least 1 + 0.9 x (final - 1), final being the longest budget's.

    .venv/bin/python tools/bench/bench_tuning_cost.py [--budgets 10,20,40,120] [--out DIR] [MODEL ...]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def tune(model: str, budget: float, db: Path) -> tuple[float, dict]:
    cmd = [sys.executable, "-m", "edgetune.cli.main", "tune", model, "--accuracy", "cosine=0.999",
           "--budget", str(budget), "--fresh", "--db", str(db), "--format", "json"]
    t0 = time.monotonic()
    p = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env={**os.environ, "COLUMNS": "200"})
    wall = time.monotonic() - t0
    if p.returncode != 0:
        sys.exit(f"{model} budget {budget}: tune failed (exit {p.returncode}): {p.stderr.strip()[-1500:]}")
    return wall, json.loads(p.stdout)


def selected(rep: dict) -> list[tuple[str, str, float, str]]:
    out = []
    for s in rep["runs"][0]["shapes"]:
        shape = " ".join(f"{k}={v}" for k, v in s["shape"].items())
        best = next((c for c in s["candidates"] if c["candidate"]["key"] == s["best"]), None)
        sp = best and best.get("speedup_vs_default")
        ratio = sp["speedup"] if sp and sp.get("verdict") == "faster" else 1.0
        text = (f"{sp['speedup']:.2f}× [{sp['ci95'][0]:.2f}, {sp['ci95'][1]:.2f}] {sp['verdict']}" if sp
                else "the default")
        out.append((shape, best["label"] if best else "—", ratio, text))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("models", nargs="*", default=["mobilenet", "transformer"])
    ap.add_argument("--budgets", default="10,20,40,120")
    ap.add_argument("--out", type=Path, default=Path("out/bench-tuning-cost"))
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    budgets = [float(b) for b in args.budgets.split(",")]
    print("| model | shape | budget s | wall s | selected | vs onnxruntime default [95% CI] |")
    print("|---|---|---|---|---|---|")
    summary = []
    for model in args.models:
        rows = []
        for b in budgets:
            wall, rep = tune(model, b, args.out / "cost.db")
            (args.out / f"{model}-{b:g}.json").write_text(json.dumps(rep, indent=2))
            for shape, label, ratio, text in selected(rep):
                rows.append((shape, b, wall, ratio))
                print(f"| {model} | {shape} | {b:g} | {wall:.1f} | {label} | {text} |", flush=True)
        for shape in dict.fromkeys(r[0] for r in rows):
            mine = [r for r in rows if r[0] == shape]
            final = mine[-1][3]
            goal = 1.0 + 0.9 * (final - 1.0)
            hit = next((r for r in mine if r[3] >= goal), None)
            summary.append(f"{model} {shape}: final {final:.2f}× at budget {mine[-1][1]:g} s; 90% "
                           + (f"reached at budget {hit[1]:g} s ({hit[2]:.0f} s wall)" if hit else "not reached"))
    print()
    print("\n".join(summary))


if __name__ == "__main__":
    main()
