#!/usr/bin/env python3
"""Host side, after the GPU run: verify every CUDA kernel's output against a float64 numpy
reference computed HERE (the GPU machine never saw it), and print GFLOP/s vs cuBLAS from the same
session with the ratio's 95% CI.

    .venv/bin/python tools/gpu/verify_results.py .gpu OUTDIR
"""

import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from edgetune.kernels.workloads import parse_workload  # noqa: E402
from edgetune.measure import speedup, summarize  # noqa: E402
from edgetune.verify import compare  # noqa: E402


def main(src: Path, out: Path) -> int:
    res = json.loads((out / "results.json").read_text())
    manifest = json.loads((src / "manifest.json").read_text())
    print(f"GPU: {res['gpu']}; tvm {res['tvm']} (runtime only), cupy {res['cupy']}; "
          f"timing: {res['results'][0].get('timing', 'wall clock') if res['results'] else '-'}; "
          f"torch: {res['results'][0].get('torch') if res['results'] else '-'}")
    print("| kernel | verified | max rel err | repeat bitwise | inputs unchanged | edgetune/TVM GFLOP/s | cuBLAS GFLOP/s | TVM vs cuBLAS [95% CI] |")
    print("|---|---|---|---|---|---|---|---|")
    ok_all = True
    for k, r in zip(manifest, res["results"]):
        wl = parse_workload(k["spec"])
        inputs = [np.load(src / "kernels" / n) for n in k["inputs"]]
        ref = wl.reference(inputs)[0] if isinstance(wl.reference(inputs), (list, tuple)) else wl.reference(inputs)
        got = np.load(out / r["output"])
        err = compare(got, ref.astype(got.dtype))
        ok = bool(np.all(np.isfinite(got))) and err.max_rel <= 1e-4 and r["repeat_equal"] and r["inputs_unchanged"]
        ok_all &= ok
        t = summarize(r["tvm_samples_ns"])
        gf = k["flops"] / t.median_ns
        if r["cublas_samples_ns"]:
            b = summarize(r["cublas_samples_ns"])
            ratio = speedup(r["cublas_samples_ns"], r["tvm_samples_ns"])
            blas = f"{k['flops'] / b.median_ns:.0f}"
            rt = f"{ratio.value:.2f}× [{ratio.ci_low:.2f}, {ratio.ci_high:.2f}]"
        else:
            blas, rt = "—", "—"
        print(f"| {k['spec']} | {'yes' if ok else 'NO'} | {err.max_rel:.1e} | {r['repeat_equal']} | "
              f"{r['inputs_unchanged']} | {gf:.0f} | {blas} | {rt} |")
        for name in ("torch_matmul", "torch_compile"):  # PyTorch's baselines, where the GPU machine had it
            if r.get(f"{name}_samples_ns"):
                b = summarize(r[f"{name}_samples_ns"])
                ratio = speedup(r[f"{name}_samples_ns"], r["tvm_samples_ns"])
                print(f"|   {name} (max rel diff to the kernel {r.get(name + '_vs_tvm_max_rel_diff', float('nan')):.1e}) "
                      f"| | | | | | {k['flops'] / b.median_ns:.0f} | {ratio.value:.2f}× [{ratio.ci_low:.2f}, "
                      f"{ratio.ci_high:.2f}] |")
    return 0 if ok_all else 1


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]), Path(sys.argv[2])))
