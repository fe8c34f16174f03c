#!/usr/bin/env python3
"""Host side of the GPU check: build CUDA kernels with TVM for sm_90 (no GPU needed here), write
seeded inputs, and a slim TVM *runtime* (no compiler) that the GPU machine can load.

    .venv/bin/python tools/gpu/build_cuda_kernels.py .gpu
Then on the GPU machine: bash tools/gpu/run_on_device.sh .gpu $OUT ; then here:
    .venv/bin/python tools/gpu/verify_results.py .gpu OUTDIR
References never go to the GPU machine: verify_results.py computes them here in float64.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from edgetune.build.tvm_kernel import as_tvm_target, compile_module, default_schedule, export_module  # noqa: E402
from edgetune.kernels.targets import load_target  # noqa: E402
from edgetune.kernels.workloads import parse_workload  # noqa: E402

SPECS = ["gemm:M=1024,N=1024,K=1024", "gemm:M=197,N=3072,K=768", "batch_matmul:B=12,M=128,N=128,K=64"]


def build_one(mod, tgt, kdir: Path, name: str) -> str:
    """Compile ``mod`` for ``tgt`` into ``kdir/NAME.so``; return the file name.

    TVM 0.27 keeps CUDA *source* in the library and compiles it when loaded: nvcc it HERE for
    sm_90, so the GPU machine answers TVM's compile callback with a host-built binary (matched by
    the source's sha256) and compiles nothing itself.
    """
    rt_mod = compile_module(mod, tgt)
    so = export_module(rt_mod, kdir / f"{name}.so")
    src = rt_mod.mod.imports[0].inspect_source()
    digest = hashlib.sha256(src.encode()).hexdigest()
    fatbin = kdir / f"{digest}.fatbin"
    if not fatbin.exists():
        cu = kdir / f"{digest}.cu"
        cu.write_text(src)
        subprocess.run(["nvcc", "-fatbin", "-O3", "-arch=sm_90", "-o", str(fatbin), str(cu)], check=True)
        cu.unlink()
    return so.name


def main(out: Path) -> int:
    out.mkdir(parents=True, exist_ok=True)
    (out / "kernels").mkdir(exist_ok=True)
    target = load_target("cuda-sm90").tvm_target
    manifest = []
    for i, spec in enumerate(SPECS):
        wl = parse_workload(spec)
        tgt = as_tvm_target(target)
        so_name = build_one(default_schedule(wl.ir_module(), tgt), tgt, out / "kernels", f"k{i}")
        inputs = wl.random_inputs(seed=i)
        names = []
        for k, a in enumerate(inputs):
            np.save(out / "kernels" / f"k{i}_in{k}.npy", a)
            names.append(f"k{i}_in{k}.npy")
        manifest.append({"spec": spec, "so": so_name, "inputs": names, "flops": wl.flops(),
                         "outputs": [{"name": t.name, "shape": list(t.shape), "dtype": t.dtype} for t in wl.outputs]})
        so = out / "kernels" / so_name
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
