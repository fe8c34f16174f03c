#!/usr/bin/env python3
"""The levers of issue 11 on the zoo, selected configuration vs the onnxruntime default at each
model's nominal shape (batch 1; decoders: prefill and one decode step), on the local device:

* exact: the session-option space and transformer fusions (``--space ort,ort-fused``), only exact
  candidates selectable;
* approximate: the same plus int8 (``ort-int8``) under ``--accuracy cosine=0.999``.

Each is one ``edgetune zoo bench`` run (ordinary tune runs in the database, every figure from the
tune's confirmation rounds against the strongest baseline). Prints a Markdown table per mode, the
geometric mean of the selected/default ratios over every point (a point where the default stayed
selected counts 1.0: the default is always a candidate), and the wall time of each run.

    .venv/bin/python tools/bench/bench_levers.py [--size full] [--budget 90] [--out DIR] [MODEL ...]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MODES = {"exact": [], "approximate": ["--accuracy", "cosine=0.999"]}


def run_mode(mode: str, args, out: Path) -> dict:
    cmd = [sys.executable, "-m", "edgetune.cli.main", "zoo", "bench", *args.models, "--size", args.size,
           "--shapes", "nominal", "--space", "ort,ort-fused", *MODES[mode], "--budget", str(args.budget),
           "--max-candidates", str(args.max_candidates), "--rounds", "2", "--finalists", "3",
           "--db", str(out / "levers.db"), "--format", "json"]
    t0 = time.monotonic()
    p = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env={**os.environ, "COLUMNS": "200"})
    wall = time.monotonic() - t0
    if not p.stdout.strip():
        sys.exit(f"{mode}: zoo bench failed (exit {p.returncode}): {p.stderr.strip()[-2000:]}")
    doc = json.loads(p.stdout)
    doc["bench_wall_s"] = wall
    doc["bench_command"] = " ".join(["edgetune", *cmd[3:]])
    (out / f"levers-{mode}.json").write_text(json.dumps(doc, indent=2))
    return doc


def table(doc: dict) -> tuple[list[str], float, int]:
    lines = ["| model | point | selected | median ms | vs onnxruntime default [95% CI] |", "|---|---|---|---|---|"]
    logs = []
    for m in doc["models"]:
        for r in m["shapes"]:
            vd = r.get("vs_default") or {}
            ratio = vd.get("ratio")
            if ratio:
                logs.append(math.log(ratio))
            ci = vd.get("ci95")
            txt = (f"{ratio:.2f}× [{ci[0]:.2f}, {ci[1]:.2f}] {vd.get('verdict')}" if ratio and ci and vd.get("rounds")
                   else (vd.get("verdict") or r.get("missing") or "—"))
            med = f"{r['median_ns'] / 1e6:.3f}" if r.get("median_ns") else "—"
            cfg = (r.get("config") or {}).get("label") or "—"
            lines.append(f"| {m['name']} | {r['point']} | {cfg} | {med} | {txt} |")
    gm = math.exp(sum(logs) / len(logs)) if logs else float("nan")
    return lines, gm, len(logs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("models", nargs="*", help="zoo models (default: all)")
    ap.add_argument("--size", default="full", choices=["small", "full"])
    ap.add_argument("--budget", type=float, default=90.0, help="seconds of tuning per model (both points)")
    ap.add_argument("--max-candidates", type=int, default=4, help="cap per space, as for tune")
    ap.add_argument("--mode", choices=[*MODES, "both"], default="both")
    ap.add_argument("--out", type=Path, default=Path("out/bench-levers"))
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    modes = list(MODES) if args.mode == "both" else [args.mode]
    for mode in modes:
        doc = run_mode(mode, args, args.out)
        lines, gm, n = table(doc)
        print(f"\n### {mode}: `{doc['bench_command']}`\n")
        print("\n".join(lines))
        print(f"\ngeomean selected/default over {n} points: {gm:.3f}×; wall time {doc['bench_wall_s'] / 60:.1f} min")


if __name__ == "__main__":
    main()
