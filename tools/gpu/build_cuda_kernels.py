#!/usr/bin/env python3
"""Host side of the GPU check: build CUDA kernels with TVM for sm_90 (no GPU needed here), write
seeded inputs, and a slim TVM *runtime* (no compiler) that the GPU machine can load.

    .venv/bin/python tools/gpu/build_cuda_kernels.py .gpu
Then on the GPU machine: bash tools/gpu/run_on_device.sh .gpu $OUT ; then here:
    .venv/bin/python tools/gpu/verify_results.py .gpu OUTDIR
References never go to the GPU machine: verify_results.py computes them here in float64.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import hashlib  # noqa: E402
import subprocess  # noqa: E402

from edgetune.build.tvm_kernel import as_tvm_target, compile_module, default_schedule, export_module  # noqa: E402
from edgetune.kernels.targets import load_target  # noqa: E402
from edgetune.kernels.workloads import parse_workload  # noqa: E402

SPECS = ["gemm:M=1024,N=1024,K=1024", "gemm:M=197,N=3072,K=768", "batch_matmul:B=12,M=128,N=128,K=64"]


def main(out: Path) -> int:
    out.mkdir(parents=True, exist_ok=True)
    (out / "kernels").mkdir(exist_ok=True)
    target = load_target("cuda-sm90").tvm_target
    manifest = []
    for i, spec in enumerate(SPECS):
        wl = parse_workload(spec)
        tgt = as_tvm_target(target)
        rt_mod = compile_module(default_schedule(wl.ir_module(), tgt), tgt)
        so = export_module(rt_mod, out / "kernels" / f"k{i}.so")
        # TVM 0.27 keeps CUDA *source* in the library and compiles it when loaded; compile it HERE
        # with nvcc for sm_90, so the GPU machine loads host-built binaries (matched by source hash)
        src_code = rt_mod.mod.imports[0].inspect_source()
        digest = hashlib.sha256(src_code.encode()).hexdigest()
        cu = out / "kernels" / f"{digest}.cu"
        cu.write_text(src_code)
        subprocess.run(["nvcc", "-fatbin", "-O3", "-arch=sm_90", "-o", str(out / "kernels" / f"{digest}.fatbin"),
                        str(cu)], check=True)
        inputs = wl.random_inputs(seed=i)
        names = []
        for k, a in enumerate(inputs):
            np.save(out / "kernels" / f"k{i}_in{k}.npy", a)
            names.append(f"k{i}_in{k}.npy")
        manifest.append({"spec": spec, "so": so.name, "inputs": names, "flops": wl.flops(),
                         "outputs": [{"name": t.name, "shape": list(t.shape), "dtype": t.dtype} for t in wl.outputs]})
        print(f"built {spec} -> {so} ({so.stat().st_size} bytes)")
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1))
    # slim runtime: the tvm package without its compiler library and headers
    import tvm

    src = Path(tvm.__file__).parent
    dst = out / "site" / "tvm"
    if dst.exists():
        shutil.rmtree(dst)
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("libtvm_compiler.so", "3rdparty", "include", "__pycache__",
                                                             "*.a", "src"))
    size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    print(f"total to carry: {size / 2**20:.1f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1] if len(sys.argv) > 1 else ".gpu")))
