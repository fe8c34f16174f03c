"""Kernel benchmark: edgetune-tuned TVM kernels vs the STRONGEST BASELINE, on this host.

    PYTHONPATH=. .venv/bin/python tools/bench/bench_kernels.py --trials 128 --rounds 5
    PYTHONPATH=. .venv/bin/python tools/bench/bench_kernels.py --trials 8 --rounds 3 --only gemm512

Runs exactly what ``edgetune tune-kernels --op ... --device local`` runs (``tune_kernels``): for
each workload, MetaSchedule tuning with the verifying runner on the native agent (N trials;
records kept under --home, so a rerun reuses them), then the final rounds: the selected kernel and
every baseline form of the same operator the device offers —

* onnxruntime, constant weights (initializers: its path in a real model, prepacked weights),
* onnxruntime, runtime weights (graph inputs, like the kernel),
* numpy (float32, BLAS) through the Python agent's adapter backend,
* eager PyTorch (oneDNN/BLAS) through the Python agent's torch backend, where the host's Python has it
  (and torch.compile for softmax, layernorm and attention),
* LiteRT with XNNPACK (a one-op .tflite written here, NHWC for convolutions, constant weights),

interleaved with a rotating order over ``--rounds`` rounds, fresh activations each round and the
same weight values everywhere, every output verified against a float64 reference. The verdict is
against the form with the lowest median (``measure.round_ratio``: t interval on per-round log
ratios, no verdict below 3 rounds). All figures of one workload come from the same rounds.

Prints a markdown table (GFLOP/s of the kernel and of every form, the strongest form, the kernel vs
the strongest and vs the old one-node onnxruntime form) and, with --json, the full outcome.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

WORKLOADS = {
    "gemm512": "gemm:M=512,N=512,K=512",
    "gemm1024": "gemm:M=1024,N=1024,K=1024",
    "gemm_vit": "gemm:M=197,N=3072,K=768",
    "dw3x3_mbv2": "depthwise_conv2d_nchw:N=1,C=144,H=56,W=56,R=3,S=3,stride=1,pad=1",
    "dw3x3s2_mbv2": "depthwise_conv2d_nchw:N=1,C=96,H=56,W=56,R=3,S=3,stride=2,pad=1",
    "conv1x1_mbv2": "conv2d_nchw:N=1,C=144,H=56,W=56,K=24,R=1,S=1",
}
FORMS = ("ort-constant", "ort-runtime", "numpy", "torch", "tflite")


def _fmt_ratio(d) -> str:
    if not d or d.get("speedup") is None:
        return "—"
    return f"{d['speedup']:.2f}× [{d['ci95'][0]:.2f}, {d['ci95'][1]:.2f}] {d['verdict']}"


def table(outcome) -> str:
    peak = outcome.peak_gflops
    head = ("| workload | kernel GFLOP/s | % peak | " + " | ".join(f"{f} GFLOP/s" for f in FORMS)
            + " | strongest | kernel vs strongest [95% CI] | kernel vs ort-runtime [95% CI] |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in outcome.results:
        b = r.baseline or {}
        forms = {f["form"]: f for f in b.get("forms", [])}
        cells = []
        for key in FORMS:
            f = forms.get(key)
            if f is None:
                cells.append("—")
            elif f.get("gflops"):
                cells.append(f"{f['gflops']:.1f}" + (" *" if f.get("strongest") else ""))
            else:
                cells.append(f["status"])
        pct = f"{100 * r.gflops / peak:.1f}%" if (peak and r.gflops) else "—"
        lines.append(f"| {r.name} | {r.gflops:.1f} | {pct} | " if r.gflops else f"| {r.name} | not verified | — | ")
        lines[-1] += " | ".join(cells) + f" | {b.get('form') or '—'} | {_fmt_ratio(b)} | {_fmt_ratio(forms.get('ort-runtime'))} |"
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", type=int, default=128, help="MetaSchedule trials per workload")
    ap.add_argument("--rounds", type=int, default=5, help="final interleaved rounds (>= 3 for a verdict)")
    ap.add_argument("--only", nargs="*", default=None, help=f"subset of {', '.join(WORKLOADS)}")
    ap.add_argument("--home", default=None, help="EDGETUNE_HOME (tuning databases; default: a fresh temp dir)")
    ap.add_argument("--budget-ms", type=float, default=100.0, help="timing budget per measurement")
    ap.add_argument("--json", default=None, help="write the whole outcome (every form's figures) here")
    args = ap.parse_args(argv)
    home = args.home or tempfile.mkdtemp(prefix="edgetune-bench-home-")
    os.environ["EDGETUNE_HOME"] = home

    import numpy as np
    import onnxruntime as ort
    import tvm

    from edgetune.kernels.session import KernelSessionConfig, tune_kernels

    names = args.only or list(WORKLOADS)
    unknown = [n for n in names if n not in WORKLOADS]
    if unknown:
        ap.error(f"unknown workload(s) {unknown}; known: {', '.join(WORKLOADS)}")
    command = "PYTHONPATH=. .venv/bin/python tools/bench/bench_kernels.py " + " ".join(argv if argv is not None else sys.argv[1:])
    t_start = time.perf_counter()

    def progress(ev):
        kind = ev["event"]
        if kind == "start":
            print(f"run {ev['run_id']} on {ev['device']}: {ev['workloads']} workloads; target {ev['target']}", flush=True)
        elif kind == "workload":
            print(f"  {ev['name']}: tuning ({ev['trials']} trials)", flush=True)
        elif kind == "final":
            print(f"  {ev['name']}: final {ev['rounds']} rounds vs the baseline forms", flush=True)
        elif kind == "done":
            r = ev["result"]
            print(f"  {ev['name']}: {r.trials_measured} measured in {r.tuning_s:.0f} s, "
                  f"{'%.1f GFLOP/s' % r.gflops if r.gflops else 'not verified: ' + r.reason} "
                  f"({time.perf_counter() - t_start:.0f} s elapsed)", flush=True)

    cfg = KernelSessionConfig(device="local", ops=[WORKLOADS[n] for n in names], trials=args.trials,
                              rounds=args.rounds, budget_ms=args.budget_ms, db=str(Path(home) / "results.db"),
                              command=command)
    outcome = tune_kernels(cfg, progress)
    fp = outcome.fingerprint
    print()
    print(f"command: {command}")
    print(f"device: {fp.get('cpu_model')}, {fp.get('cores')} cores ({outcome.fingerprint_key}); "
          f"fp32 FMA peak {outcome.peak_gflops:.1f} GFLOP/s" if outcome.peak_gflops else "fp32 peak unknown")
    print(f"tvm {tvm.__version__}, onnxruntime {ort.__version__}, numpy {np.__version__}; "
          f"trials={args.trials}, rounds={args.rounds}, budget {args.budget_ms:g} ms; "
          f"total {time.perf_counter() - t_start:.0f} s; run {outcome.run_id}")
    print()
    print(table(outcome))
    for r in outcome.results:
        for f in (r.baseline or {}).get("forms", []):
            if f["status"] != "verified":
                print(f"  {r.name}: {f['form']} {f['status']}: {f['reason']}")
    if args.json:
        Path(args.json).write_text(json.dumps({"command": command, **outcome.as_dict()}, indent=1, default=str))
        print(f"outcome: {args.json}")
    return 0 if all(r.verified for r in outcome.results) else 1


if __name__ == "__main__":
    sys.exit(main())
