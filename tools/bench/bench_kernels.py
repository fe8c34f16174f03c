"""Kernel benchmark: edgetune-tuned TVM kernels vs onnxruntime vs numpy, on this host.

    PYTHONPATH=. .venv/bin/python tools/bench/bench_kernels.py --trials 64
    PYTHONPATH=. .venv/bin/python tools/bench/bench_kernels.py --trials 8 --only gemm512

For each workload: MetaSchedule tuning with the verifying runner (N trials; records kept per
device under --db, so a rerun reuses them), then the selected kernel, onnxruntime (a one-node ONNX
model, default session options, intra-op threads = cores) and numpy (float32) are each timed with
the same protocol: warm-up discarded, then a time budget of iterations timed one by one; the
median is reported as GFLOP/s and % of the fp32 FMA peak (cores x GHz x lanes x 2). Every
implementation's output is checked against the float64 reference before it is timed.
Candidates are measured one after another, not interleaved: a quick comparison, not a claim.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from edgetune.kernels.search import LocalMeasure, tune_workload, verify_outputs  # noqa: E402
from edgetune.kernels.targets import host_target  # noqa: E402
from edgetune.kernels.workloads import parse_workload  # noqa: E402

WORKLOADS = {
    "gemm512": "gemm:M=512,N=512,K=512",
    "gemm1024": "gemm:M=1024,N=1024,K=1024",
    "gemm_vit": "gemm:M=197,N=3072,K=768",
    "dw3x3_mbv2": "depthwise_conv2d_nchw:N=1,C=144,H=56,W=56,R=3,S=3,stride=1,pad=1",
    "conv1x1_mbv2": "conv2d_nchw:N=1,C=144,H=56,W=56,K=24,R=1,S=1",
}


def time_fn(fn, warmup_ms: float, budget_ms: float, min_iters: int = 5) -> float:
    """Median ns of ``fn()`` over a time budget (warm-up discarded)."""
    start = time.perf_counter_ns()
    n = 0
    while True:
        fn()
        n += 1
        if time.perf_counter_ns() - start >= warmup_ms * 1e6:
            break
    est = (time.perf_counter_ns() - start) / n
    iters = max(min_iters, int(budget_ms * 1e6 / max(est, 1.0)))
    samples = []
    for _ in range(iters):
        t = time.perf_counter_ns()
        fn()
        samples.append(time.perf_counter_ns() - t)
    return float(np.median(samples))


def onnx_model(w):
    """A one-node ONNX model computing workload ``w`` (weights as graph inputs, like the kernel)."""
    from onnx import TensorProto, helper

    def vi(name, shape):
        return helper.make_tensor_value_info(name, TensorProto.FLOAT, list(shape))

    ins, outs = w.inputs, w.outputs
    if w.op == "gemm":
        node = helper.make_node("MatMul", [ins[0].name, ins[1].name], [outs[0].name])
    elif w.op in ("conv2d_nchw", "depthwise_conv2d_nchw"):
        attrs = dict(strides=[w.stride, w.stride], pads=[w.pad] * 4, kernel_shape=[w.R, w.S])
        if w.op == "depthwise_conv2d_nchw":
            attrs["group"] = w.C
        node = helper.make_node("Conv", [ins[0].name, ins[1].name], [outs[0].name], **attrs)
    else:
        return None
    graph = helper.make_graph([node], w.op, [vi(s.name, s.shape) for s in ins], [vi(s.name, s.shape) for s in outs])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def numpy_fn(w, inputs):
    x, k = inputs
    if w.op == "gemm":
        return lambda: [x @ k]
    if w.op == "conv2d_nchw" and w.R == w.S == 1 and w.stride == 1 and w.pad == 0:
        return lambda: [(k.reshape(w.K, w.C) @ x.reshape(w.C, -1)).reshape(1, w.K, w.P, w.Q)]
    if w.op == "depthwise_conv2d_nchw":
        from numpy.lib.stride_tricks import sliding_window_view

        def dw():
            xp = np.pad(x, ((0, 0), (0, 0), (w.pad, w.pad), (w.pad, w.pad)))
            win = sliding_window_view(xp, (w.R, w.S), axis=(2, 3))[:, :, :: w.stride, :: w.stride]
            return [np.einsum("ncpqrs,crs->ncpq", win, k[:, 0], optimize=True)]

        return dw
    return None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", type=int, default=64, help="MetaSchedule trials per workload")
    ap.add_argument("--only", nargs="*", default=None, help=f"subset of {', '.join(WORKLOADS)}")
    ap.add_argument("--db", default=None, help="tuning database root (default: a fresh temp dir)")
    ap.add_argument("--budget-ms", type=float, default=300.0)
    ap.add_argument("--warmup-ms", type=float, default=50.0)
    args = ap.parse_args(argv)

    import onnxruntime as ort
    import tvm

    target = host_target()
    cores = target.cores or os.cpu_count() or 1
    peak = target.fp32_peak_gflops()
    fingerprint = f"host:{tvm.target.codegen.llvm_get_system_cpu()}:{cores}c"
    db = args.db or tempfile.mkdtemp(prefix="edgetune-bench-db-")
    names = args.only or list(WORKLOADS)
    print(f"host target: {target.tvm_target}")
    print(f"fp32 peak: {peak:.1f} GFLOP/s ({cores} cores x {target.max_freq_ghz} GHz x {target.fma_lanes_per_cycle} lanes x 2)"
          if peak else "fp32 peak: unknown")
    print(f"tvm {tvm.__version__}, onnxruntime {ort.__version__}, numpy {np.__version__}; trials={args.trials}; db={db}")
    rows = []
    with LocalMeasure(num_threads=cores, warmup_ms=args.warmup_ms, budget_ms=args.budget_ms) as measure:
        for name in names:
            w = parse_workload(WORKLOADS[name])
            flops = w.flops()
            inputs = w.random_inputs(0)
            ref = w.reference(inputs)
            t0 = time.perf_counter()
            outcome = tune_workload(w, target.tvm_target, args.trials, measure, db, fingerprint=fingerprint)
            tune_s = time.perf_counter() - t0
            row = {"name": name, "spec": w.spec(), "tune_s": tune_s, "trials": outcome.trials_measured,
                   "failed": sum(r.status != "ok" for r in outcome.records)}
            row["tvm"] = flops / outcome.best_latency_ns if outcome.verified else None

            model = onnx_model(w)
            if model is not None:
                so = ort.SessionOptions()
                so.intra_op_num_threads = cores
                sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
                feed = {s.name: x for s, x in zip(w.inputs, inputs)}
                out = sess.run(None, feed)
                ok = verify_outputs(out, ref, w.outputs).ok
                row["ort"] = flops / time_fn(lambda: sess.run(None, feed), args.warmup_ms, args.budget_ms) if ok else None
            fn = numpy_fn(w, inputs)
            if fn is not None:
                ok = verify_outputs([np.asarray(o, np.float32) for o in fn()], ref, w.outputs).ok
                row["numpy"] = flops / time_fn(fn, args.warmup_ms, args.budget_ms) if ok else None
            rows.append(row)
            print(f"  {name}: tuned {row['trials']} trials ({row['failed']} failed) in {tune_s:.1f} s", flush=True)

    def cell(v):
        if v is None:
            return f"{'-':>16}"
        pct = f" ({100 * v / peak:4.1f}%)" if peak else ""
        return f"{v:8.1f}{pct:>8}"

    print()
    print(f"{'workload':<14} {'spec':<58} {'edgetune-tvm':>16} {'onnxruntime':>16} {'numpy':>16} {'tune s':>7}")
    print(f"{'':<14} {'':<58} {'GFLOP/s (%peak)':>16} {'GFLOP/s (%peak)':>16} {'GFLOP/s (%peak)':>16}")
    for r in rows:
        print(f"{r['name']:<14} {r['spec']:<58} {cell(r.get('tvm'))} {cell(r.get('ort'))} {cell(r.get('numpy'))} {r['tune_s']:7.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
