#!/usr/bin/env python3
"""Host side, after the GPU search: verify every candidate against float64 references computed
HERE, pick the fastest verified schedule per workload, and compare it with TVM's default DLight
schedule and with cuBLAS from the same session (ratios of medians, 95% CI over interleaved rounds).

    .venv/bin/python tools/gpu/verify_search.py .gpu OUTDIR [--json FILE]

Every candidate: finite, bitwise repeatable, inputs unchanged, and its row and column sketches
(output @ r, r' @ output with seeded ±1 vectors) within tolerance of the reference's. A wrong
element e at (i, j) moves sketch_col[i] by ±e, so any error above the tolerance shows, unless
several errors in one row and one column cancel exactly. Tolerance: 1e-4 of the output's scale,
the bound the element-wise check puts on one element (sketches of right fp32 GEMMs measured 2.6e-6
of scale on the H200 with K=1024; rounding adds up like a random walk, far below the bound).
The fastest few candidates also sent their whole output: that is compared element-wise (max rel
err <= 1e-4 of scale, DESIGN.md section 5), and only a fully compared candidate is selected.
The candidate that is wrong on purpose must be rejected, or this script fails.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from edgetune.kernels.workloads import parse_workload  # noqa: E402
from edgetune.measure import grouped_speedup, summarize  # noqa: E402
from edgetune.verify import compare  # noqa: E402

RTOL = 1e-4


def sketch_ok(got: list[float], ref: np.ndarray, scale: float) -> tuple[bool, float]:
    """(within tolerance, max error relative to the output's scale) of one sketch."""
    g = np.asarray(got, dtype=np.float64)
    if g.shape != ref.shape or not np.all(np.isfinite(g)):
        return False, float("inf")
    err = float(np.max(np.abs(g - ref))) if g.size else 0.0
    return err <= RTOL * scale, err / max(scale, 1e-30)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("src", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--json", type=Path, default=None, help="also write the table's data here")
    args = ap.parse_args()
    sdir = args.src / "search"
    res = json.loads((args.out / "search_results.json").read_text())
    manifest = json.loads((sdir / "manifest.json").read_text())
    print(f"GPU: {res['gpu']}; tvm {res['tvm']} (runtime only), cupy {res['cupy']}; {res['rounds']} interleaved rounds")
    print("| workload | candidates | verified | screened out (slow) | rejected (wrong) | wrong-on-purpose rejected | best schedule GFLOP/s | "
          "DLight default GFLOP/s | cuBLAS GFLOP/s | best vs default [95% CI] | best vs cuBLAS [95% CI] |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    ok_all = True
    summary = []
    for wk, r in zip(manifest, res["results"]):
        wl = parse_workload(wk["spec"])
        inputs = [np.load(sdir / n) for n in wk["inputs"]]
        ref = wl.reference(inputs)[0]
        rcol = np.load(sdir / wk["sketch"]["col"])
        rrow = np.load(sdir / wk["sketch"]["row"])
        scale = float(np.max(np.abs(ref)))
        ref_col, ref_row = ref @ rcol, rrow @ ref
        verdicts = {}
        for c in r["candidates"]:
            why = []
            if "error" in c:
                why.append(c["error"])
            elif c.get("screened") and not c.get("expect_wrong"):
                why.append(f"screened out: first launch {c['first_launch_ms']:.2f} ms, far slower than the default")
                if not (sketch_ok(c["sketch_col"], ref_col, scale)[0]
                        and sketch_ok(c["sketch_row"], ref_row, scale)[0]):
                    why.append("and its sketches disagree with the reference")
            else:
                if c["nonfinite"]:
                    why.append(f"{c['nonfinite']} non-finite outputs")
                if not c["repeat_equal"]:
                    why.append("not bitwise repeatable")
                if not c["inputs_unchanged"]:
                    why.append("changed its inputs")
                col_ok, col_err = sketch_ok(c["sketch_col"], ref_col, scale)
                row_ok, row_err = sketch_ok(c["sketch_row"], ref_row, scale)
                if not (col_ok and row_ok):
                    why.append(f"sketch mismatch (rel {max(col_err, row_err):.1e})")
                c["full_checked"] = False
                if "output" in c and not why:
                    got = np.load(args.out / c["output"])
                    e = compare(got, ref.astype(got.dtype))
                    c["max_rel_err"] = float(e.max_rel)
                    c["full_checked"] = True
                    if not (e.max_rel <= RTOL):
                        why.append(f"output max rel err {e.max_rel:.1e}")
            verdicts[c["id"]] = why
        wrong = [c for c in r["candidates"] if c.get("expect_wrong")]
        wrong_rejected = all(verdicts[c["id"]] for c in wrong)
        ok_all &= wrong_rejected and not verdicts.get("dlight-default")
        verified = [c for c in r["candidates"] if not verdicts[c["id"]] and not c.get("expect_wrong")]
        selectable = [c for c in verified if c.get("full_checked")]
        med = {c["id"]: float(np.median(sum(c["samples_ns"], []))) for c in verified}
        blas = r["cublas_samples_ns"]
        if not selectable:
            print(f"| {wk['spec']} | {len(r['candidates'])} | {len(verified)} | — | — | {wrong_rejected} | none fully checked | | | | |")
            ok_all = False
            continue
        best = min(selectable, key=lambda c: med[c["id"]])
        default = next(c for c in r["candidates"] if c["id"] == "dlight-default")
        vs_def = grouped_speedup(list(zip(default["samples_ns"], best["samples_ns"])))
        vs_blas = grouped_speedup(list(zip(blas, best["samples_ns"])))
        gf = lambda samples: wk["flops"] / summarize(sum(samples, [])).median_ns  # noqa: E731
        screened = sum(1 for c in r["candidates"] if c.get("screened") and not c.get("expect_wrong"))
        rejected = len(r["candidates"]) - len(verified) - len(wrong) - screened
        print(f"| {wk['spec']} | {len(r['candidates'])} | {len(verified)} | {screened} | {rejected} | {wrong_rejected} | "
              f"{gf(best['samples_ns']):.0f} ({best['id']}) | {gf(default['samples_ns']):.0f} | {gf(blas):.0f} | "
              f"{vs_def.value:.2f}× [{vs_def.ci_low:.2f}, {vs_def.ci_high:.2f}] | "
              f"{vs_blas.value:.2f}× [{vs_blas.ci_low:.2f}, {vs_blas.ci_high:.2f}] |")
        for c in r["candidates"]:
            if verdicts[c["id"]] and not c.get("expect_wrong") and not c.get("screened"):
                print(f"  rejected {wk['spec']} {c['id']}: {'; '.join(verdicts[c['id']])}")
        for c in wrong:
            print(f"  wrong on purpose {wk['spec']} {c['id']}: {'; '.join(verdicts[c['id']]) or 'NOT REJECTED'}")
        summary.append({"spec": wk["spec"], "candidates": len(r["candidates"]), "verified": len(verified),
                        "screened_out": screened, "rejected": rejected,
                        "wrong_on_purpose_rejected": wrong_rejected, "best": best["id"],
                        "best_gflops": gf(best["samples_ns"]), "default_gflops": gf(default["samples_ns"]),
                        "cublas_gflops": gf(blas), "best_max_rel_err": best.get("max_rel_err"),
                        "best_vs_default": [vs_def.value, vs_def.ci_low, vs_def.ci_high],
                        "best_vs_cublas": [vs_blas.value, vs_blas.ci_low, vs_blas.ci_high],
                        "rejections": {c["id"]: verdicts[c["id"]] for c in r["candidates"] if verdicts[c["id"]]}})
    if any("dtype=float16" in wk["spec"] for wk in manifest):
        print("cuBLAS on the float16 GEMMs: cupy.matmul of the float16 operands into a float16 output "
              "(cuBLAS's tensor-core GEMM), against kernels that write float32")
    if args.json:
        args.json.write_text(json.dumps({"gpu": res["gpu"], "tvm": res["tvm"], "cupy": res["cupy"],
                                         "rounds": res["rounds"], "workloads": summary}, indent=1))
    return 0 if ok_all else 1


if __name__ == "__main__":
    sys.exit(main())
