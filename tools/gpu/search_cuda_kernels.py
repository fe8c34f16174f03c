#!/usr/bin/env python3
"""Host side of the CUDA schedule search: sample MetaSchedule schedules for each GEMM, build every
candidate for sm_90 here (no GPU needed), and lay out what the GPU machine needs to time them.

    .venv/bin/python tools/gpu/search_cuda_kernels.py .gpu --candidates 32
    .venv/bin/python tools/gpu/search_cuda_kernels.py .gpu --candidates 16 --specs "gemm:M=1024,N=1024,K=1024,dtype=float16"
Then on the GPU machine: bash tools/gpu/run_on_device.sh .gpu $OUT search ; then here:
    .venv/bin/python tools/gpu/verify_search.py .gpu OUTDIR

Candidates per workload: TVM's default DLight schedule (the baseline the earlier check measured),
N distinct schedules drawn from tune-kernels' design space for the workload (MetaSchedule's CUDA
space; for float16 operands its tensor-core space, edgetune.kernels.search) (ReplayTrace: random decisions,
then MetaSchedule's postprocessors, VerifyGPUCode included, reject invalid ones), and one kernel
that is wrong on purpose (its reduction skips the last k), which verification must reject. One
generation, no cost model: the GPU machine is lent in minutes, and each evolutionary round would
need another. Sketch vectors (seeded ±1) are shipped so that the GPU side can return a row and a
column sketch of every output (files back are limited); full outputs come back for the fastest
few. References stay here (verify_search.py).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from build_cuda_kernels import build_one  # noqa: E402

from edgetune.build.tvm_kernel import as_tvm_target, default_schedule, import_tensor_intrinsics  # noqa: E402
from edgetune.kernels.search import design_space  # noqa: E402
from edgetune.kernels.targets import load_target  # noqa: E402
from edgetune.kernels.workloads import parse_workload  # noqa: E402

SPECS = ["gemm:M=1024,N=1024,K=1024", "gemm:M=197,N=3072,K=768"]


def sample_schedules(mod, tgt, n: int, seed: int, space="post-order-apply") -> list:
    """Up to ``n`` structurally distinct schedules from MetaSchedule's design space ``space``
    (tune-kernels' own for the workload: ``edgetune.kernels.search.design_space``)."""
    import tvm_ffi
    from tvm.s_tir import meta_schedule as ms

    # first, the fast way: TuneContext's own import of the intrinsics takes ~40 s in a process with
    # many modules loaded (a pytest worker), where TVMScript's parser searches them all for each one
    import_tensor_intrinsics(tgt)
    ctx = ms.TuneContext(mod=mod, target=tgt, space_generator=space,
                         search_strategy=ms.search_strategy.ReplayTrace(), task_name="main",
                         rand_state=seed, num_threads=2)
    spaces = ctx.space_generator.generate_design_space(mod)
    strategy = ctx.search_strategy
    strategy.pre_tuning(4 * n, n, spaces, None, None)
    seen, out = set(), []
    while len(out) < n:
        cands = strategy.generate_measure_candidates()
        if not cands:
            break
        for c in cands:
            h = tvm_ffi.structural_hash(c.sch.mod)
            if h not in seen and len(out) < n:
                seen.add(h)
                out.append(c.sch)
        strategy.notify_runner_results([], [ms.runner.RunnerResult([1.0], None) for _ in cands])
    strategy.post_tuning()
    return out


def broken_gemm(wl):
    """C = A @ B with the last k left out: close to right, wrong everywhere by one product (float16
    operands: accumulated and written in float32, as the workload is)."""
    from tvm import te

    acc = wl.outputs[0].dtype
    a = te.placeholder((wl.M, wl.K), wl.dtype, name="A")
    b = te.placeholder((wl.K, wl.N), wl.dtype, name="B")
    k = te.reduce_axis((0, wl.K - 1), name="k")
    c = te.compute((wl.M, wl.N), lambda i, j: te.sum(a[i, k].astype(acc) * b[k, j].astype(acc), axis=k), name="C")
    import tvm

    return tvm.IRModule({"main": te.create_prim_func([a, b, c])})


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--candidates", type=int, default=32, help="sampled schedules per workload")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--specs", default=";".join(SPECS),
                    help="GEMMs to search, ';'-separated (e.g. gemm:M=1024,N=1024,K=1024,dtype=float16: "
                         "float16 operands, float32 accumulation, sampled from the tensor-core space; on the "
                         "GPU cuBLAS then runs the float16 GEMM with float16 output)")
    args = ap.parse_args()
    out: Path = args.out
    kdir = out / "search"
    kdir.mkdir(parents=True, exist_ok=True)
    tgt = as_tvm_target(load_target("cuda-sm90").tvm_target)
    manifest = []
    traces = {}
    specs = [x for x in args.specs.split(";") if x]
    for w, spec in enumerate(specs):
        wl = parse_workload(spec)
        mod = wl.ir_module()
        inputs = wl.random_inputs(seed=100 + w)
        names = []
        for k, a in enumerate(inputs):
            np.save(kdir / f"w{w}_in{k}.npy", a)
            names.append(f"w{w}_in{k}.npy")
        rng = np.random.default_rng(1000 + w)
        np.save(kdir / f"w{w}_rcol.npy", rng.choice([-1.0, 1.0], size=wl.N))  # sketch vectors, not references
        np.save(kdir / f"w{w}_rrow.npy", rng.choice([-1.0, 1.0], size=wl.M))
        # sample first, from a module nothing else has touched: after a DLight build in the same
        # process, the design space came out far smaller (8 distinct schedules instead of 40)
        sampled = sample_schedules(mod, tgt, args.candidates, args.seed + w, space=design_space(tgt, wl))
        cands = [{"id": "dlight-default", "so": build_one(default_schedule(wl.ir_module(), tgt), tgt, kdir,
                                                          f"w{w}_default")},
                 {"id": "wrong-on-purpose", "expect_wrong": True,
                  "so": build_one(default_schedule(broken_gemm(wl), tgt), tgt, kdir, f"w{w}_broken")}]
        for i, sch in enumerate(sampled):
            try:
                so = build_one(sch.mod, tgt, kdir, f"w{w}_ms{i}")
            except Exception as exc:  # noqa: BLE001 - a candidate that does not build is dropped, said so
                print(f"{spec}: candidate ms{i} did not build: {str(exc).splitlines()[0][:120]}")
                continue
            cands.append({"id": f"ms{i}", "so": so})
            traces[f"w{w}:ms{i}"] = str(sch.trace)
        manifest.append({"spec": spec, "flops": wl.flops(), "inputs": names,
                         "sketch": {"col": f"w{w}_rcol.npy", "row": f"w{w}_rrow.npy"},
                         "output": {"shape": [wl.M, wl.N], "dtype": wl.outputs[0].dtype}, "candidates": cands})
        print(f"built {spec}: {len(cands)} candidates")
    (kdir / "manifest.json").write_text(json.dumps(manifest, indent=1))
    (out / "search-traces.json").write_text(json.dumps(traces))  # host-side record; not needed there
    size = sum(p.stat().st_size for p in kdir.rglob("*") if p.is_file())
    print(f"search files: {size / 2**20:.1f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
