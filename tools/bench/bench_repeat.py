#!/usr/bin/env python3
"""The same tune, N times: how often each configuration is selected, and with what verdict.

A verdict that finds a real win reliably selects the same configuration run after run; one that
decides by luck does not. Each run is a whole ``edgetune tune MODEL ARGS --fresh --report-dir D``
in a fresh process (its own EDGETUNE_HOME, so nothing is resumed or cached between runs but the
converted and quantized artifacts of the first, copied from a warm-up run's home, which the
verdict does not depend on); the selection and its confirmation are read from each run's
report.json. Prints a Markdown table and, with ``--json FILE``, every run's figures.

    .venv/bin/python tools/bench/bench_repeat.py transformer --runs 10 -- \\
        --space ort,ort-fused,ort-int8 --max-candidates 2 --budget 40 --accuracy cosine=0.999
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
EDGETUNE = ROOT / ".venv" / "bin" / "edgetune"


def clopper_pearson(k: int, n: int, level: float = 0.95) -> tuple[float, float]:
    """Exact binomial interval on k of n (scipy-free: bisection on the binomial tail)."""
    if n == 0:
        return 0.0, 1.0
    a = (1 - level) / 2

    def tail_ge(p: float) -> float:  # P(X >= k)
        return sum(math.comb(n, i) * p ** i * (1 - p) ** (n - i) for i in range(k, n + 1))

    def bisect(f, target: float, increasing: bool) -> float:
        lo, hi = 0.0, 1.0
        for _ in range(60):
            mid = (lo + hi) / 2
            if (f(mid) < target) == increasing:
                lo = mid
            else:
                hi = mid
        return (lo + hi) / 2

    low = 0.0 if k == 0 else bisect(tail_ge, a, True)
    high = 1.0 if k == n else bisect(lambda p: 1 - tail_ge(p) + math.comb(n, k) * p ** k * (1 - p) ** (n - k), a,
                                     False)
    return low, high


def one_run(model: str, args: list[str], home: Path, out: Path, code: str | None = None) -> dict:
    env = dict(os.environ, EDGETUNE_HOME=str(home))
    if code:  # another checkout's edgetune (PYTHONPATH comes before the installed one)
        env["PYTHONPATH"] = code
    t0 = time.monotonic()
    p = subprocess.run([str(EDGETUNE), "tune", model, *args, "--fresh", "--report-dir", str(out)],
                       env=env, capture_output=True, text=True)
    wall = time.monotonic() - t0
    rep = out / "report.json"
    if p.returncode != 0 or not rep.is_file():
        lines = [ln.strip(" │╭╰─╮╯") for ln in p.stderr.splitlines()]
        lines = [ln for ln in lines if ln and not ln.startswith(("Usage", "Try"))]
        return {"ok": False, "wall_s": wall, "error": " ".join(lines[-3:]) or f"exit {p.returncode}"}
    data = json.loads(rep.read_text())
    rows = []
    for run in data.get("runs", []):
        for shape in run.get("shapes", []):
            cands = {c["candidate"]["key"]: c for c in shape["candidates"]}
            best = cands.get(shape.get("best"))
            conf = shape.get("confirmation") or {}
            sp = conf.get("speedup_vs_default") if conf.get("contender") == shape.get("best") else None
            cr = conf.get("speedup_vs_best_baseline")  # the contender's, whatever its verdict
            rows.append({"shape": shape["shape"], "selected": best["label"] if best else None,
                         "selected_is_default": shape.get("best") == shape.get("default"),
                         "contender": cands[conf["contender"]]["label"] if conf.get("contender") in cands else None,
                         "verdict": conf.get("verdict"), "rounds": len(conf.get("rounds") or []),
                         "vs_default": sp, "contender_ratio": cr,
                         # earlier contenders whose confirmation ended without "faster"
                         "ended": [{"contender": cands[e["key"]]["label"] if e["key"] in cands else e["key"],
                                    "verdict": e["verdict"], "rounds": len(e["rounds"]),
                                    "ratio": e.get("speedup_vs_best_baseline")} for e in conf.get("ended") or []]})
    return {"ok": True, "wall_s": wall, "shapes": rows}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--json", dest="json_out")
    ap.add_argument("--code", default="", help="comma-separated checkouts whose edgetune the runs alternate "
                    "between (A B A B ...), for a side-by-side comparison of two versions; default: this one")
    argv = sys.argv[1:]
    cut = argv.index("--") if "--" in argv else len(argv)
    a = ap.parse_args(argv[:cut])  # after --: the tune's own arguments
    args = argv[cut + 1:]
    codes = [str(Path(c).resolve()) for c in a.code.split(",") if c] or [str(ROOT)]
    runs = []
    with tempfile.TemporaryDirectory(prefix="edgetune-repeat-") as tmp:
        warm = Path(tmp) / "warm-home"
        # a warm-up run builds the artifacts (int8 models, conversions) once; not counted
        first = one_run(a.model, args, warm, Path(tmp) / "warm-out")
        if not first["ok"]:
            print(f"error: the warm-up run failed: {first['error']}", file=sys.stderr)
            return 1
        for i in range(a.runs):
            home = Path(tmp) / f"home{i}"
            shutil.copytree(warm, home, symlinks=True, ignore=shutil.ignore_patterns("*.db", "*.db-*"))
            code = codes[i % len(codes)]
            r = one_run(a.model, args, home, Path(tmp) / f"out{i}", code)
            r["code"] = code
            runs.append(r)
            shapes = r.get("shapes") or [{}]
            s = shapes[0]
            vs = s.get("contender_ratio") or {}
            print(f"run {i + 1}/{a.runs} ({Path(code).name}): {s.get('selected') if r['ok'] else 'failed: ' + r['error']}"
                  f" ({s.get('verdict')}, {s.get('rounds')} rounds"
                  + (f", the contender {s.get('contender')} {vs['speedup']:.2f}x [{vs['ci95'][0]:.2f}, {vs['ci95'][1]:.2f}]"
                     f" at {100 * vs.get('level', 0.95):.1f}% vs the strongest baseline" if vs else "")
                  + "".join(f"; before it {e['contender']}: {e['verdict']}, {e['rounds']} rounds"
                            + (f", {e['ratio']['speedup']:.2f}x [{e['ratio']['ci95'][0]:.2f}, {e['ratio']['ci95'][1]:.2f}]"
                               if e.get("ratio") else "") for e in s.get("ended") or [])
                  + f"), {r['wall_s']:.0f} s", file=sys.stderr, flush=True)
            shutil.rmtree(home, ignore_errors=True)
    print(f"\n`edgetune tune {a.model} {' '.join(args)} --fresh`, {a.runs} runs; machine: {platform.machine()}, "
          f"{os.cpu_count()} CPUs, load average at the end {os.getloadavg()[0]:.2f}\n")
    print("| code | shape | selected | runs [95% CI] | verdicts of the contender | median rounds | median vs default (when selected) |")
    print("|---|---|---|---|---|---|---|")
    by_shape: dict[tuple[str, str], list[dict]] = collections.defaultdict(list)
    n_runs = collections.Counter(r["code"] for r in runs)
    for r in runs:
        for s in r.get("shapes") or []:
            by_shape[(r["code"], json.dumps(s["shape"], sort_keys=True))].append(s)
    failed = sum(1 for r in runs if not r["ok"])
    for (code, shape), rows in by_shape.items():
        n = n_runs[code]
        counts = collections.Counter(s["selected"] for s in rows)
        verdicts = collections.Counter(s["verdict"] for s in rows)
        rounds = sorted(s["rounds"] for s in rows)
        for label, k in counts.most_common():
            lo, hi = clopper_pearson(k, n)
            sps = sorted(s["vs_default"]["speedup"] for s in rows if s["selected"] == label and s["vs_default"])
            med = f"{sps[len(sps) // 2]:.2f}×" if sps else "—"
            print(f"| {Path(code).name} | {shape} | {label} | {k}/{n} = {100 * k / n:.0f}% [{100 * lo:.0f}, {100 * hi:.0f}] | "
                  f"{', '.join(f'{v}: {c}' for v, c in verdicts.items())} | {rounds[len(rounds) // 2]} | {med} |")
    if failed:
        print(f"\n{failed} run(s) failed: " + "; ".join(r["error"] for r in runs if not r["ok"]))
    if a.json_out:
        Path(a.json_out).write_text(json.dumps({"model": a.model, "args": args, "runs": runs}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
