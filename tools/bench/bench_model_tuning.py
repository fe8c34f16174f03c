#!/usr/bin/env python3
"""How a model's trial budget is shared: even split (the default) vs time-weighted allocation.

    PYTHONPATH=. .venv/bin/python tools/bench/bench_model_tuning.py --model mobilenet --trials 256

Tunes the model's kernels twice with the same number of MetaSchedule trials (each into its own
fresh database, so neither reuses the other's records): ``allocation="even"`` (trials / kernels
each) and ``allocation="weighted"`` (half evenly, the rest to the kernel that costs the model the
most time; edgetune.kernels.allocate). Then, in one process, the two tuned builds and the
onnxruntime default session are timed side by side in interleaved rounds (each round: every
candidate runs ``--iters`` iterations, one after another), every output checked against the
onnxruntime reference with optimizations off. Speedups are ratios of medians with a two-level
bootstrap 95% CI over rounds (edgetune.measure.grouped_speedup).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from edgetune.api import resolve_model  # noqa: E402
from edgetune.kernels.session import model_input_shapes  # noqa: E402
from edgetune.kernels.targets import host_target  # noqa: E402
from edgetune.measure import grouped_speedup, summarize  # noqa: E402


def _tune(onnx_path, shapes, target, trials: int, work: Path, allocation: str) -> dict:
    from edgetune.build.tvm_relax import tune_relax_model

    t0 = time.perf_counter()
    out = tune_relax_model(onnx_path, shapes, target, trials, work / allocation / "db", fingerprint="bench",
                           out_path=work / allocation / "model.so", allocation=allocation)
    per_kernel = {t.name: (o.trials_measured + o.reused_records if o else 0) for t, o in out.tasks if t.flops() > 0}
    return {"artifact": out.artifact_path, "tuning_s": time.perf_counter() - t0, "tuned_functions": out.tuned_functions,
            "trials_per_kernel": per_kernel}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="mobilenet", help="ONNX file or bundled model name")
    ap.add_argument("--dim", action="append", default=[], help="bind a dynamic dim, e.g. batch=1")
    ap.add_argument("--trials", type=int, default=256, help="MetaSchedule trials per tuned build")
    ap.add_argument("--rounds", type=int, default=15, help="interleaved measuring rounds")
    ap.add_argument("--iters", type=int, default=100, help="timed iterations per candidate per round")
    ap.add_argument("--work", default=None, help="keep databases and builds here (default: a temp dir)")
    ap.add_argument("--format", choices=["text", "json"], default="text")
    args = ap.parse_args()

    import onnxruntime as ort
    import tvm
    from tvm import relax

    threads = os.cpu_count() or 1
    os.environ.setdefault("TVM_NUM_THREADS", str(threads))
    model, shapes = model_input_shapes(resolve_model(args.model), args.dim)
    kt = host_target()
    target = dict(kt.tvm_target)
    work = Path(args.work or tempfile.mkdtemp(prefix="edgetune-bench-alloc-"))
    tuned = {alloc: _tune(model.path, shapes, target, args.trials, work, alloc) for alloc in ("even", "weighted")}

    rng = np.random.default_rng(0)
    feeds = {name: rng.standard_normal(shape).astype(np.float32) for name, shape in shapes.items()}
    ref_opts = ort.SessionOptions()
    ref_opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    reference = ort.InferenceSession(str(model.path), ref_opts, providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    sess = ort.InferenceSession(str(model.path), providers=["CPUExecutionProvider"])
    args_tvm = [tvm.runtime.tensor(feeds[name]) for name in shapes]

    def tvm_runner(path):
        vm = relax.VirtualMachine(tvm.runtime.load_module(str(path)), tvm.cpu())
        main = vm["main"]

        def run():
            out = main(*args_tvm)
            return out.numpy() if hasattr(out, "numpy") else out[0].numpy()

        return run

    candidates = {"onnxruntime default": lambda: sess.run(None, feeds)[0]}
    alloc_of = {}  # candidate label -> allocation, for the tvm-tuned rows
    for alloc, t in tuned.items():
        label = f"tvm-tuned, {alloc} allocation"
        candidates[label] = tvm_runner(t["artifact"])
        alloc_of[label] = alloc
    errors = {}
    for name, fn in candidates.items():
        out = fn()
        err = float(np.max(np.abs(out - reference)) / max(float(np.max(np.abs(reference))), 1e-30))
        errors[name] = err
        if not (np.all(np.isfinite(out)) and err <= 1e-4):
            print(f"error: {name} disagrees with the onnxruntime reference (max rel err {err:.2e})", file=sys.stderr)
            return 1
        for _ in range(20):  # warm-up
            fn()
    rounds: dict[str, list[np.ndarray]] = {name: [] for name in candidates}
    for _ in range(args.rounds):
        for name, fn in candidates.items():
            s = np.empty(args.iters)
            for i in range(args.iters):
                t0 = time.perf_counter_ns()
                fn()
                s[i] = time.perf_counter_ns() - t0
            rounds[name].append(s / 1e6)

    base = rounds["onnxruntime default"]
    even = next(rounds[label] for label, alloc in alloc_of.items() if alloc == "even")
    rows = []
    for name, rs in rounds.items():
        st = summarize(np.concatenate(rs))
        vs_ort = grouped_speedup(list(zip(base, rs)))
        vs_even = grouped_speedup(list(zip(even, rs)))
        alloc = alloc_of.get(name)
        rows.append({"candidate": name, "median_ms": st.median_ns, "ci_ms": [st.ci_low_ns, st.ci_high_ns],
                     "vs_ort": [vs_ort.value, vs_ort.ci_low, vs_ort.ci_high],
                     "vs_even": [vs_even.value, vs_even.ci_low, vs_even.ci_high] if alloc else None,
                     "max_rel_err": errors[name],
                     "tuning_s": round(tuned[alloc]["tuning_s"], 1) if alloc else None,
                     "trials_per_kernel": tuned[alloc]["trials_per_kernel"] if alloc else None})
    if args.format == "json":
        print(json.dumps({"model": model.path.name, "shapes": {k: list(v) for k, v in shapes.items()},
                          "trials": args.trials, "threads": threads, "rounds": args.rounds, "iters": args.iters,
                          "target": target, "rows": rows}, indent=2, default=str))
        return 0
    print(f"{model.path.name} {shapes} on {kt.name} ({target.get('mcpu', kt.arch)}), "
          f"{threads} threads; {args.trials} trials per tuned build; {args.rounds} rounds x {args.iters} iterations")
    print("| candidate | tuning s | median ms [95% CI] | vs onnxruntime default [95% CI] | vs even allocation [95% CI] |")
    print("|---|---|---|---|---|")
    for r in rows:
        vo = "{:.2f}× [{:.2f}, {:.2f}]".format(*r["vs_ort"])
        ve = "{:.2f}× [{:.2f}, {:.2f}]".format(*r["vs_even"]) if r["vs_even"] else "—"
        ts = f"{r['tuning_s']:.0f}" if r["tuning_s"] is not None else "—"
        print(f"| {r['candidate']} | {ts} | {r['median_ms']:.3f} [{r['ci_ms'][0]:.3f}, {r['ci_ms'][1]:.3f}] | {vo} | {ve} |")
    for r in rows:
        if r["trials_per_kernel"]:
            counts = sorted(r["trials_per_kernel"].values(), reverse=True)
            print(f"{r['candidate']}: trials per kernel (most to least) {counts}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
