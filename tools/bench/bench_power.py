#!/usr/bin/env python3
"""Power of the verdict: how often a candidate of known true effect is confirmed faster.

The planted effect is built honestly, from real work: the baseline is the bundled model with a
padding branch added to it, ``y' = y + 0 * ReduceSum(Tanh^k(x))`` — k chained Tanh over the input,
summed, multiplied by zero and added to the output. onnxruntime computes all of it (it does not
fold ``0 * s``: s could be inf or NaN), so the baseline does the model's work plus the padding's;
Tanh is bounded, so the sum is finite and the output equals the model's exactly, and both forms are
verified against the same float64 reference like any candidate. The candidate is the plain model.
k is calibrated here so that the baseline takes about ``--effect`` times the plain model.

The true effect is then measured independently of edgetune's verdict: ``--truth-procs`` fresh
processes, each timing the two sessions alternately (``--truth-iters`` calls each, one call of
each in turn) and taking the ratio of their medians; the table gives the median of those ratios
and its range. Then each tune is a whole ``edgetune tune`` of the plain model at the default budget
(60 s) with just these two candidates: round 0, the race, and the sequential confirmation against
the planted baseline (fresh processes, new inputs, interleaved), exactly as a user's run.

    .venv/bin/python tools/bench/bench_power.py [--effect 1.25] [--tunes 10] [--model mobilenet]
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime
from onnx import TensorProto, helper

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import edgetune  # noqa: E402
from edgetune.api import resolve_model  # noqa: E402
from edgetune.candidate import Candidate  # noqa: E402
from edgetune.space import Prepared  # noqa: E402
from edgetune.tune import tune  # noqa: E402
from edgetune.tune_config import TuneConfig  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_aa import clopper_pearson  # noqa: E402


def padded(model_path: str, k: int, out: Path) -> Path:
    """The model with a padding branch of k chained Tanh over its first input, times zero, added to
    its first output (same function, more work)."""
    m = onnx.load(model_path)
    g = m.graph
    x = g.input[0].name
    y = g.output[0].name
    for node in g.node:  # the output's producer now writes y_model; the padding adds to it
        node.output[:] = [f"{y}__model" if o == y else o for o in node.output]
    prev = x
    for i in range(k):
        g.node.append(helper.make_node("Tanh", [prev], [f"pad_tanh_{i}"]))
        prev = f"pad_tanh_{i}"
    g.node.append(helper.make_node("ReduceSum", [prev], ["pad_sum"], keepdims=0))
    g.initializer.append(helper.make_tensor("pad_zero", TensorProto.FLOAT, [], [0.0]))
    g.node.append(helper.make_node("Mul", ["pad_sum", "pad_zero"], ["pad_nothing"]))
    g.node.append(helper.make_node("Add", [f"{y}__model", "pad_nothing"], [y]))
    onnx.checker.check_model(m)
    onnx.save(m, str(out))
    return out


TRUTH = r"""
import sys, time, numpy as np, onnxruntime as ort
plain, pad, iters, seed = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
so = ort.SessionOptions(); so.log_severity_level = 3
a = ort.InferenceSession(plain, so, providers=["CPUExecutionProvider"])
b = ort.InferenceSession(pad, so, providers=["CPUExecutionProvider"])
i = a.get_inputs()[0]
shape = [d if isinstance(d, int) else 1 for d in i.shape]
rng = np.random.default_rng(seed)
xs = [rng.standard_normal(shape).astype(np.float32) for _ in range(8)]
for s in (a, b):
    for x in xs[:4]:
        s.run(None, {i.name: x})
ta, tb = [], []
for n in range(iters):
    x = xs[n % len(xs)]
    for s, t in ((a, ta), (b, tb)) if n % 2 == 0 else ((b, tb), (a, ta)):
        t0 = time.perf_counter_ns(); s.run(None, {i.name: x}); t.append(time.perf_counter_ns() - t0)
print(float(np.median(tb)) / float(np.median(ta)))
"""


def true_ratio(plain: str, pad: Path, procs: int, iters: int) -> list[float]:
    """Baseline / candidate time, one ratio of medians per fresh process."""
    out = []
    for p in range(procs):
        r = subprocess.run([sys.executable, "-c", TRUTH, plain, str(pad), str(iters), str(p)],
                           capture_output=True, text=True, timeout=600, check=True)
        out.append(float(r.stdout.strip().splitlines()[-1]))
    return out


def calibrate(plain: str, work: Path, effect: float) -> tuple[int, Path]:
    """The padding k whose baseline takes about ``effect`` times the plain model (3 processes each)."""
    one = padded(plain, 1, work / "pad-1.onnx")
    per_tanh = float(np.median(true_ratio(plain, one, 3, 300))) - 1.0
    k = max(1, round((effect - 1.0) / max(per_tanh, 1e-3)))
    for _ in range(4):  # the cost is close to linear in k; a few corrections
        path = padded(plain, k, work / f"pad-{k}.onnx")
        got = float(np.median(true_ratio(plain, path, 3, 300)))
        if abs(got - effect) < 0.02 * effect:
            return k, path
        k = max(1, round(k * (effect - 1.0) / max(got - 1.0, 1e-3)))
    return k, padded(plain, k, work / f"pad-{k}.onnx")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--effect", type=float, default=1.25, help="planted true speedup of the candidate, about")
    ap.add_argument("--tunes", type=int, default=10)
    ap.add_argument("--model", default="mobilenet")
    ap.add_argument("--budget", type=float, default=TuneConfig.budget_s, help="each tune's budget, s (the default)")
    ap.add_argument("--truth-procs", type=int, default=10)
    ap.add_argument("--truth-iters", type=int, default=1000)
    ap.add_argument("--device", default="local")
    args = ap.parse_args()
    home = Path(tempfile.mkdtemp(prefix="edgetune-power-"))
    os.environ.setdefault("EDGETUNE_HOME", str(home))
    plain = resolve_model(args.model)
    print(f"# bench_power: planted effect {args.effect:g}x on {args.model}, {args.tunes} tunes at --budget "
          f"{args.budget:g}, device {args.device}")
    print(f"# host {platform.node()} {platform.processor() or platform.machine()}, {os.cpu_count()} cores; "
          f"edgetune {edgetune.__version__}, onnxruntime {onnxruntime.__version__}; {time.strftime('%Y-%m-%d %H:%M')}")
    print(f"# command: .venv/bin/python tools/bench/bench_power.py {' '.join(sys.argv[1:])}".rstrip())
    k, pad = calibrate(plain, home, args.effect)
    truth = true_ratio(plain, pad, args.truth_procs, args.truth_iters)
    print(f"# padding: {k} Tanh; true effect (baseline/candidate, ratio of medians in each of "
          f"{len(truth)} fresh processes): median {np.median(truth):.3f}, range {min(truth):.3f}-{max(truth):.3f}",
          flush=True)
    base = Candidate.make("ort", {"planted": f"padding {k} tanh"}, baseline=True)
    cand = Candidate.make("ort", {"planted": "none"})
    extra = [(base, Prepared("ort", pad, {})), (cand, Prepared("ort", Path(plain), {}))]
    verdicts, t0 = [], time.monotonic()
    for i in range(args.tunes):
        cfg = TuneConfig(budget_s=args.budget, spaces=(), seed=i, fresh=True, extra=extra)
        dev = tune(plain, [args.device], db=home / "power.db", config=cfg).devices[0]
        if dev.summary is None or dev.status != "complete":
            raise SystemExit(f"tune {i}: device {dev.device} {dev.status}: {dev.error}")
        conf = dev.summary.shapes[0].confirmation
        r = conf.vs_best_baseline if conf is not None else None
        if r is None:
            why = "; ".join(f"{c.candidate.label()}: {c.reason}" for c in dev.summary.shapes[0].candidates if c.reason)
            verdicts.append(("no verdict", math.nan, 0))
            print(f"#   tune {i + 1}/{args.tunes}: no verdict ({why})", flush=True)
            continue
        verdicts.append((r.verdict, r.value, len(conf.state.rounds)))
        print(f"#   tune {i + 1}/{args.tunes}: {r.value:.3f} [{r.ci_low:.3f}, {r.ci_high:.3f}] {r.verdict} "
              f"({len(conf.state.rounds)} rounds)", flush=True)
    n = len(verdicts)
    hits = sum(v == "faster" for v, _, _ in verdicts)
    lo, hi = clopper_pearson(hits, n)
    print(f"# {n} tunes in {time.monotonic() - t0:.0f} s")
    print()
    print("| planted effect (true: median [range] over fresh processes) | tunes | confirmed faster [95% CI] | "
          "no significant difference | slower | median confirmed ratio | median rounds |")
    print("|---|---|---|---|---|---|---|")
    vals = [x for _, x, _ in verdicts if not math.isnan(x)]
    print(f"| {np.median(truth):.3f}× [{min(truth):.3f}, {max(truth):.3f}] | {n} | {hits}/{n} = {100 * hits / n:.0f}% "
          f"[{100 * lo:.0f}, {100 * hi:.0f}] | {sum(v == 'no significant difference' for v, _, _ in verdicts)} | "
          f"{sum(v == 'slower' for v, _, _ in verdicts)} | {np.median(vals) if vals else float('nan'):.3f} | "
          f"{int(np.median([r for _, _, r in verdicts]))} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
