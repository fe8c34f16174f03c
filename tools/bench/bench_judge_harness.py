"""What the judge's harness costs a kernel: the same binary timed in-process (the native agent's
``tvm-kernel`` backend: the worker calls it and reads the clock) and through the judge backend
(a sandboxed child, timed by the worker across processes), interleaved in rounds, fresh inputs.

    .venv/bin/python tools/bench/bench_judge_harness.py [--rounds 7] [--sizes 64x48x40,256x256x256]

For each size it tunes a TVM GEMM briefly (MetaSchedule, on this machine), then times it as
``tvm-kernel`` (in-process) and as ``judge`` with the timer's default (it spins on a call's return
only while the kernel leaves it a core, else it sleeps and the child wakes it), sleeping at once,
and always spinning, and prints each form's median of per-round medians and its ratio to in-process
with a 95% interval (t on per-round log ratios). A ratio near 1.0 means the sandbox and the
cross-process clock cost the kernel nothing measurable.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from edgetune.agent.host import Job  # noqa: E402
from edgetune.kernels.device_measure import LocalMeasure  # noqa: E402
from edgetune.kernels.workloads import parse_workload  # noqa: E402
from edgetune.measure import round_median, round_ratio  # noqa: E402


def tuned_kernel(w, trials: int, work: Path) -> Path:
    from edgetune.kernels.device_measure import device_kernel_target
    from edgetune.kernels.search import tune_workload

    m = LocalMeasure(budget_ms=20.0)
    try:
        probe = m.probe()
        target = dict(device_kernel_target(probe.info, probe.cpuinfo).tvm_target)
        out = tune_workload(w, target, trials, m, work / "tuning", lambda *a: None, fingerprint="bench")
    finally:
        m.close()
    if not out.verified:
        raise SystemExit(f"{w.spec()}: no verified kernel ({out.reason})")
    return Path(out.artifact_path)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--sizes", default="64x48x40,256x256x256")
    ap.add_argument("--trials", type=int, default=16)
    ap.add_argument("--budget-ms", type=float, default=50.0)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="edgetune-bench-judge-"))
    os.environ.setdefault("EDGETUNE_HOME", str(work / "home"))
    m = LocalMeasure(budget_ms=args.budget_ms)
    n = m.num_threads
    print(f"{m.probe().info.fingerprint.get('cpu_model')}, {n} threads, {args.rounds} rounds, "
          f"budget {args.budget_ms:g} ms per run")
    forms = [("in-process (tvm-kernel)", "tvm-kernel", {}), ("judge (default: adaptive)", "judge", {}),
             ("judge, timer sleeps at once", "judge", {"spin_us": 0}),
             ("judge, timer always spins", "judge", {"spin_us": 10**9})]
    try:
        for size in args.sizes.split(","):
            M, N, K = (int(x) for x in size.split("x"))
            w = parse_workload(f"gemm:M={M},N={N},K={K}")
            so = tuned_kernel(w, args.trials, work)
            groups: dict[str, list[np.ndarray]] = {f[0]: [] for f in forms}
            for rnd in range(args.rounds):
                xs = w.random_inputs(100 + rnd)
                order = forms[rnd % len(forms):] + forms[:rnd % len(forms)]
                for label, backend, extra in order:
                    params = {"num_threads": n, **({"abi": "tvm"} if backend == "judge" else {}), **extra}
                    job = Job(backend=backend, artifact=so, params=params, input_names=["A", "B"],
                              input_sets=[[x.copy() for x in xs]], output_specs=[s.as_json() for s in w.outputs],
                              budget_ms=args.budget_ms, warmup_ms=10.0, max_iters=100_000, timeout_s=60.0)
                    jr = m.run_job(job)
                    if not jr.ok:
                        raise SystemExit(f"{label}: {jr.reason}")
                    groups[label].append(np.asarray(jr.samples_ns, np.int64))
            base = groups[forms[0][0]]
            print(f"\ngemm {M}x{N}x{K} ({2 * M * N * K / 1e6:.2f} MFLOP), TVM kernel tuned {args.trials} trials")
            print(f"  {'form':<30} {'median':>10}  {'time vs in-process [95% CI]':>28}")
            for label, _, _ in forms:
                g = groups[label]
                med = round_median(g)
                if label == forms[0][0]:
                    print(f"  {label:<30} {med / 1e3:>8.2f} µs")
                    continue
                r = round_ratio(list(zip(g, base)))  # the judge's time over in-process time, per round
                print(f"  {label:<30} {med / 1e3:>8.2f} µs  {r.value:>6.2f}× [{r.ci_low:.2f}, {r.ci_high:.2f}]")
    finally:
        m.close()


if __name__ == "__main__":
    main()
