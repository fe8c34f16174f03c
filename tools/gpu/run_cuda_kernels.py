#!/usr/bin/env python3
"""GPU side of the check (runs on the GPU machine with the slim TVM runtime): for each kernel in the
manifest, poison the output (NaN), run once, save the output for the host to verify, run again
(determinism), then time every launch alone with CUDA events after an L2 flush (cupy; wall clock
without it); cuBLAS (cupy, out=) and, where PyTorch is installed, torch.matmul (out=) and
torch.compile in the same interleaved rounds, on the same data (cuBLAS and torch.matmul into
preallocated outputs, as the TVM kernel writes into one; the baselines' outputs are compared with
the kernel's). Writes results.json and the outputs to OUTDIR. Never sees a reference."""

import json
import os
import sys
import time

import numpy as np


def _load_cuda_runtime(tvm):
    """Runtime-only TVM does not autoload its CUDA runtime: load it (after libcudart) by hand."""
    import ctypes
    import glob

    libdir = os.path.join(os.path.dirname(tvm.__file__), "lib")
    for pat in ("/usr/local/cuda*/lib64/libcudart.so.13*", "/usr/local/cuda*/targets/*/lib/libcudart.so.13*",
                "/usr/lib/x86_64-linux-gnu/libcudart.so.13*", sys.prefix + "/lib/python3*/site-packages/nvidia/*/lib/libcudart.so.13*",
                "/opt/*/.venv/lib/python3*/site-packages/nvidia/*/lib/libcudart.so.13*",
                "/opt/*/.venv/lib/python3*/site-packages/nvidia/cu13/lib/libcudart.so.13*"):
        hits = sorted(glob.glob(pat))
        if hits:
            ctypes.CDLL(hits[0], mode=ctypes.RTLD_GLOBAL)
            print("libcudart:", hits[0])
            break
    try:
        import tvm.backend.cuda  # noqa: F401
    except Exception as exc:
        print("tvm.backend.cuda import:", type(exc).__name__, exc)
    if not tvm.cuda(0).exist:
        ctypes.CDLL(os.path.join(libdir, "libtvm_runtime_cuda.so"), mode=ctypes.RTLD_GLOBAL)
    print("cuda exists:", tvm.cuda(0).exist)


def _use_host_built_binaries(tvm, kdir):
    """TVM compiles a library's CUDA source when it is loaded: answer with the fatbin nvcc built on
    the host for that exact source (sha256), so nothing is compiled on this machine."""
    import hashlib

    import tvm_ffi

    @tvm_ffi.register_global_func("tvm_callback_cuda_compile", override=True)
    def _compile(code, *rest):
        digest = hashlib.sha256(code.encode()).hexdigest()
        path = os.path.join(kdir, digest + ".fatbin")
        if not os.path.exists(path):
            raise RuntimeError("no host-built fatbin for this CUDA source (%s)" % digest[:12])
        return open(path, "rb").read()


def main(src, out):
    import tvm

    _load_cuda_runtime(tvm)
    _use_host_built_binaries(tvm, os.path.join(src, "kernels"))

    dev = tvm.cuda(0)
    manifest = json.load(open(os.path.join(src, "manifest.json")))
    try:
        import cupy as cp
    except Exception:
        cp = None
    results = []
    for i, k in enumerate(manifest):
        lib = tvm.runtime.load_module(os.path.join(src, "kernels", k["so"]))
        fn = lib["main"]
        host_in = [np.load(os.path.join(src, "kernels", n)) for n in k["inputs"]]
        args = [tvm.runtime.tensor(a, dev) for a in host_in]
        outs = [tvm.runtime.tensor(np.full(o["shape"], np.nan, dtype=o["dtype"]), dev) for o in k["outputs"]]
        fn(*args, *outs)
        dev.sync()
        first = [o.numpy() for o in outs]
        np.save(os.path.join(out, "k%d_out.npy" % i), first[0])
        for o in outs:
            o.copyfrom(np.full(o.shape, np.nan, dtype=o.dtype))
        fn(*args, *outs)
        dev.sync()
        repeat_equal = all(np.array_equal(a, o.numpy()) for a, o in zip(first, outs))
        inputs_unchanged = all(np.array_equal(a, t.numpy()) for a, t in zip(host_in, args))

        def timed(call, budget_s=0.1):
            """Each launch alone: the L2 flushed first (a 256 MiB write, more than any L2), then
            timed with CUDA events on the stream TVM, cuBLAS and torch all launch on (the legacy
            default stream), into the preallocated outputs. Without cupy: blocks of 20 launches,
            synchronized, by wall clock (and said so in the results)."""
            for _ in range(3):
                call()
            dev.sync()
            if cp is None:
                t0 = time.perf_counter()
                n = 0
                while time.perf_counter() - t0 < 0.05:
                    call(); n += 1
                dev.sync()
                iters = max(10, int(budget_s / ((time.perf_counter() - t0) / n)))
                samples = []
                for _ in range(max(1, iters // 20)):
                    s = time.perf_counter()
                    for _ in range(20):
                        call()
                    dev.sync()
                    samples.append((time.perf_counter() - s) / 20 * 1e9)
                return samples
            samples = []
            t_end = time.perf_counter() + budget_s
            while time.perf_counter() < t_end or len(samples) < 10:
                flush.fill(len(samples) & 0xFF)
                ev0.record()
                call()
                ev1.record()
                ev1.synchronize()
                samples.append(cp.cuda.get_elapsed_time(ev0, ev1) * 1e6)
            return samples

        if cp is not None:
            flush = cp.empty(256 << 20, dtype=cp.uint8)
            ev0, ev1 = cp.cuda.Event(), cp.cuda.Event()
        tvm_call = lambda: fn(*args, *outs)
        blas_call = None
        blas_check = None
        torch_calls = {}
        torch_checks = {}
        if cp is not None and k["spec"].startswith(("gemm", "batch_matmul")):
            ca = [cp.asarray(a) for a in host_in]
            b = ca[1]
            if k["spec"].startswith("batch_matmul") and b.shape[1] != ca[0].shape[2]:
                b = cp.ascontiguousarray(cp.swapaxes(b, 1, 2))  # once, outside the timing: no per-call copy
            # cuBLAS writes into a PREALLOCATED output, like the TVM kernel: timing cp.matmul without
            # out= measured an allocation per call (the old "batch_matmul 4.95x vs cuBLAS")
            c_out = cp.matmul(ca[0], b)
            cp.cuda.Device().synchronize()
            blas_check = float(np.max(np.abs(c_out.get() - first[0])) / max(np.max(np.abs(first[0])), 1e-30))
            blas_call = lambda: cp.matmul(ca[0], b, out=c_out)
            try:  # PyTorch where the GPU machine has it: its cuBLAS call (out=) and torch.compile
                import torch

                ta, tb = torch.from_dlpack(ca[0]), torch.from_dlpack(b)
                t_out = torch.matmul(ta, tb)
                torch_calls["torch_matmul"] = lambda: torch.matmul(ta, tb, out=t_out)
                compiled = torch.compile(lambda x, y: torch.matmul(x, y), mode="max-autotune-no-cudagraphs")
                compiled(ta, tb)  # compile and autotune once, outside the timing
                torch_calls["torch_compile"] = lambda: compiled(ta, tb)  # (its output: the caching allocator's)
                for name, call in torch_calls.items():
                    got = call()
                    got = t_out if got is None else got
                    torch.cuda.synchronize()
                    torch_checks[name] = float(np.max(np.abs(got.cpu().numpy() - first[0]))
                                               / max(np.max(np.abs(first[0])), 1e-30))
                torch_version = torch.__version__
            except Exception as exc:  # no torch, or no compiler for torch.compile: say why
                torch_calls, torch_checks = {}, {}
                torch_version = f"unavailable: {type(exc).__name__}: {str(exc)[:200]}"
        else:
            torch_version = None
        tvm_s, blas_s = [], []
        torch_s = {name: [] for name in torch_calls}
        for _ in range(5):  # interleaved rounds
            tvm_s += timed(tvm_call)
            if blas_call is not None:
                blas_s += timed(lambda: (blas_call(), None)[1])
            for name, call in torch_calls.items():
                torch_s[name] += timed(lambda: (call(), None)[1])
        results.append({"spec": k["spec"], "flops": k["flops"], "repeat_equal": bool(repeat_equal),
                        "inputs_unchanged": bool(inputs_unchanged), "tvm_samples_ns": tvm_s,
                        "cublas_samples_ns": blas_s, "cublas_out": "preallocated (out=)",
                        "cublas_vs_tvm_max_rel_diff": blas_check, "device": str(dev), "output": "k%d_out.npy" % i,
                        "timing": "CUDA events per launch, 256 MiB L2 flush before each" if cp is not None
                        else "wall clock, blocks of 20 synchronized launches",
                        "torch": torch_version, **{f"{n}_samples_ns": v for n, v in torch_s.items()},
                        **{f"{n}_vs_tvm_max_rel_diff": v for n, v in torch_checks.items()}})
        print(k["spec"], "tvm median us %.1f" % (np.median(tvm_s) / 1e3),
              "cublas median us %.1f" % (np.median(blas_s) / 1e3) if blas_s else "")
    info = {"gpu": os.popen("nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader").read().strip(),
            "tvm": tvm.__version__, "cupy": getattr(cp, "__version__", None), "results": results}
    json.dump(info, open(os.path.join(out, "results.json"), "w"), indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
