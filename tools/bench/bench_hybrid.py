#!/usr/bin/env python3
"""Hybrid onnxruntime + TVM (``ort-tvm``) against pure onnxruntime and pure TVM, on the local device.

One ``edgetune tune`` per model with ``--space ort,ort-tvm,tvm-relax --tvm-trials T``: the
onnxruntime session-option space and its default, the two hybrid candidates (depthwise convs as
MetaSchedule-tuned kernels spliced into the onnxruntime graph), TVM's whole-model build untuned
(``tvm-relax``) and tuned with the same total trial budget (``tvm-tuned``, added by --tvm-trials).
Every candidate races in the same interleaved rounds (``--finalists`` large enough for all), so the
medians of the table are side by side; the selected candidate's verdict comes from the tune's own
confirmation rounds against the default. Also prints the hybrid's per-kernel verdicts against
onnxruntime's own nodes (the kernel session the hybrid ran).

    .venv/bin/python tools/bench/bench_hybrid.py [--trials 768] [--budget 120] [--out DIR] MODEL ...

MODEL: an .onnx path, a bundled model name (mobilenet), or zoo:NAME (built at full size into --out).
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def resolve(model: str, out: Path) -> str:
    if not model.startswith("zoo:"):
        return model
    name = model[4:]
    subprocess.run([sys.executable, "-m", "edgetune.cli.main", "zoo", "build", name, "--size", "full", "-o", str(out)],
                   check=True, cwd=ROOT, capture_output=True)
    return str(out / f"{name}-full.onnx")


def family(c: dict) -> str:
    p = c["candidate"]["params"]
    b = c["candidate"]["backend"]
    if c["candidate"].get("baseline"):
        return f"{b} default"
    if "hybrid" in p:
        return f"hybrid {p['hybrid']}"
    return {"ort": "onnxruntime (configured)", "tvm-relax": "TVM untuned", "tvm-tuned": "TVM tuned"}.get(b, b)


def report(doc: dict, title: str, wall: float, command: str, db: Path) -> None:
    run = doc["runs"][0]
    shape = run["shapes"][0]
    print(f"\n### {title} — {shape['shape']} — {wall / 60:.1f} min\n")
    print(f"`{command}`\n")
    print("| family | candidate | status | median ms | race vs default (descriptive) |")
    print("|---|---|---|---|---|")
    rows = sorted(shape["candidates"], key=lambda c: (c["stats"] or {}).get("median_ms") or 1e18)
    for c in rows:
        st = c["stats"] or {}
        r = c.get("race_speedup_vs_default") or {}
        ratio = f"{r['speedup']:.2f}× ({r['rounds']} rounds)" if r.get("speedup") else "—"
        med = f"{st['median_ms']:.3f}" if st.get("median_ms") else "—"
        status = c["status"] if c["status"] == "verified" else f"{c['status']}: {c['reason'][:90]}"
        print(f"| {family(c)} | {c['label']} | {status} | {med} | {ratio} |")
    conf = shape.get("confirmation") or {}
    vd = conf.get("speedup_vs_default") or {}
    best = next((c for c in shape["candidates"] if c["candidate"]["key"] == shape.get("best")), None)
    if best:
        txt = (f"{vd['speedup']:.2f}× [{vd['ci95'][0]:.2f}, {vd['ci95'][1]:.2f}] {conf.get('verdict')}"
               if vd.get("speedup") and vd.get("ci95") else conf.get("verdict") or "the default")
        cont = next((c for c in shape["candidates"] if c["candidate"]["key"] == conf.get("contender")), None)
        print(f"\nselected: {best['label']}; confirmation of the race winner"
              f" ({cont['label'] if cont else '—'}) against the default, {len(conf.get('rounds') or [])} rounds: {txt}")
    # the hybrid's kernel session: each kernel against onnxruntime's own nodes
    con = sqlite3.connect(db)
    try:
        row = con.execute("SELECT summary FROM runs WHERE config LIKE '%\"kind\": \"kernels\"%' "
                          "ORDER BY created DESC LIMIT 1").fetchone()
    finally:
        con.close()
    if row and row[0]:
        ks = json.loads(row[0])
        print("\n| depthwise kernel | TVM median µs | onnxruntime nodes µs | kernel vs onnxruntime [95% CI] |")
        print("|---|---|---|---|")
        for w in ks.get("workloads", []):
            b = w.get("baseline") or {}
            ci = b.get("ci95")
            v = (f"{b['speedup']:.2f}× [{ci[0]:.2f}, {ci[1]:.2f}] {b.get('verdict')}"
                 if b.get("speedup") and ci else (w.get("reason") or "—"))
            kn = f"{w['median_ns'] / 1e3:.1f}" if w.get("median_ns") else "—"
            bn = f"{b['median_ns'] / 1e3:.1f}" if b.get("median_ns") else "—"
            print(f"| {w['spec'].removeprefix('dwconv2d_fused:')} | {kn} | {bn} | {v} |")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="*")
    ap.add_argument("--trials", type=int, default=768, help="--tvm-trials (total, the hybrid and tvm-tuned alike)")
    ap.add_argument("--budget", type=float, default=120.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", type=Path, default=Path("bench-hybrid"))
    ap.add_argument("--render", action="store_true", help="print the tables of runs already in --out, run nothing")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    db = args.out / "hybrid.db"
    if args.render:
        for meta in sorted(args.out.glob("*.meta.json")):
            m = json.loads(meta.read_text())
            doc = json.loads(meta.with_name(meta.name.replace(".meta.json", ".json")).read_text())
            report(doc, meta.name.replace(".meta.json", ".onnx"), m["wall_s"], m["command"], db)
        return 0
    for model in args.models:
        path = resolve(model, args.out)
        cmd = [sys.executable, "-m", "edgetune.cli.main", "tune", path, "--device", "local",
               "--space", "ort,ort-tvm,tvm-relax", "--tvm-trials", str(args.trials), "--budget", str(args.budget),
               "--max-candidates", "5", "--finalists", "14", "--rounds", str(args.rounds), "--db", str(db),
               "--format", "json"]
        t0 = time.monotonic()
        p = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env={**os.environ, "COLUMNS": "200"})
        wall = time.monotonic() - t0
        if not p.stdout.strip():
            print(f"{model}: tune failed (exit {p.returncode}): {p.stderr.strip()[-2000:]}", file=sys.stderr)
            return 1
        doc = json.loads(p.stdout)
        (args.out / f"{Path(path).stem}.json").write_text(json.dumps(doc, indent=2))
        (args.out / f"{Path(path).stem}.meta.json").write_text(json.dumps({"wall_s": wall, "command": " ".join(["edgetune", *cmd[3:]])}))
        report(doc, Path(path).name, wall, " ".join(["edgetune", *cmd[3:]]), db)
    return 0


if __name__ == "__main__":
    sys.exit(main())
