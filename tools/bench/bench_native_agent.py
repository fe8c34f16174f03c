#!/usr/bin/env python3
"""Per-iteration time of one TVM kernel run by the native agent (its own hooks and thread pool)
vs. the same exported .so called through TVM's runtime in this process, for 1..nproc threads;
and of an ONNX model run by the native agent through libonnxruntime.so vs. onnxruntime's Python API.

    PYTHONPATH=. .venv/bin/python tools/bench/bench_native_agent.py [--size 256] [--budget-ms 500]

Prints median / p10 / p90 in microseconds. Both sides time single calls on a monotonic clock after
a warm-up; neither includes loading. Figures are for this host only (docs/design.md §4.6: name the
machine, the versions and this command alongside any figure you quote).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from edgetune.build import native  # noqa: E402


def stats(samples_us: list[float]) -> str:
    q = np.percentile(samples_us, [50, 10, 90])
    return f"median {q[0]:9.1f} us   p10 {q[1]:9.1f}   p90 {q[2]:9.1f}   (n={len(samples_us)})"


def agent_job(agent: Path, work: Path, name: str, backend: str, artifact: Path, inputs: list[np.ndarray],
              outputs: list[dict], params: dict, budget_ms: float) -> list[float]:
    job = work / name
    job.mkdir()
    paths = []
    for k, a in enumerate(inputs):
        np.save(job / f"in_{k}.npy", a)
        paths.append(f"in_{k}.npy")
    req = {"protocol": 3, "backend": backend, "artifact": str(artifact),
           "artifact_sha256": hashlib.sha256(artifact.read_bytes()).hexdigest(), "params": params,
           "input_names": [f"x{k}" for k in range(len(inputs))] if backend != "ort" else ["x"],
           "inputs": [paths], "outputs": outputs, "fresh_seed": 12345, "check_iters": 4, "check_fastest": 2, "probe_pairs": 8, "warmup_ms": 100.0,
           "budget_ms": budget_ms, "min_iters": 10, "max_iters": 100000}
    (job / "request.json").write_text(json.dumps(req))
    subprocess.run([str(agent), "run", str(job)], check=True, timeout=600)
    res = json.loads((job / "result.json").read_text())
    if res["status"] != "ok":
        raise SystemExit(f"agent failed: {res['reason']}")
    return [s / 1e3 for s in res["samples_ns"]]


def in_process(fn, budget_ms: float) -> list[float]:
    t_end = time.perf_counter() + 0.1
    while time.perf_counter() < t_end:  # warm-up, as the agent does
        fn()
    xs: list[float] = []
    t_end = time.perf_counter() + budget_ms / 1e3
    while time.perf_counter() < t_end or len(xs) < 10:
        t0 = time.perf_counter_ns()
        fn()
        xs.append((time.perf_counter_ns() - t0) / 1e3)
    return xs


def bench_tvm(agent: Path, work: Path, size: int, budget_ms: float) -> None:
    import tvm
    from tvm import te

    a_ph = te.placeholder((size, size), name="A")
    b_ph = te.placeholder((size, size), name="B")
    k = te.reduce_axis((0, size), name="k")
    c = te.compute((size, size), lambda i, j: te.sum(a_ph[i, k] * b_ph[k, j], axis=k), name="C")
    sch = tvm.s_tir.Schedule(te.create_prim_func([a_ph, b_ph, c]))
    blk = sch.get_sblock("C")
    i, j, kk = sch.get_loops(blk)
    jo, ji = sch.split(j, [None, 16])
    sch.reorder(i, jo, kk, ji)
    sch.parallel(i)
    sch.vectorize(ji)
    so = work / "matmul.so"
    tvm.compile(sch.mod, target="llvm").export_library(str(so))
    rng = np.random.default_rng(0)
    a = rng.standard_normal((size, size)).astype(np.float32)
    b = rng.standard_normal((size, size)).astype(np.float32)
    out = [{"name": "C", "dtype": "float32", "shape": [size, size]}]
    print(f"TVM kernel: {size}x{size}x{size} float32 matmul, parallel + vectorized")
    for threads in range(1, (os.cpu_count() or 1) + 1):
        xs = agent_job(agent, work, f"tvm{threads}", "tvm-kernel", so, [a, b], out, {"num_threads": threads}, budget_ms)
        print(f"  native agent    threads={threads}: {stats(xs)}")
        # TVM's runtime reads TVM_NUM_THREADS when its pool starts: one subprocess per count
        code = (
            "import sys,time,numpy as np,tvm\n"
            f"m=tvm.runtime.load_module({str(so)!r}); f=m['main']\n"
            f"a=tvm.runtime.tensor(np.load({str(work / f'tvm{threads}' / 'in_0.npy')!r}));"
            f"b=tvm.runtime.tensor(np.load({str(work / f'tvm{threads}' / 'in_1.npy')!r}));"
            f"c=tvm.runtime.tensor(np.zeros(({size},{size}),'float32'))\n"
            "t=time.perf_counter()+0.1\n"
            "while time.perf_counter()<t: f(a,b,c)\n"
            f"xs=[];t=time.perf_counter()+{budget_ms / 1e3}\n"
            "while time.perf_counter()<t or len(xs)<10:\n"
            " t0=time.perf_counter_ns(); f(a,b,c); xs.append((time.perf_counter_ns()-t0)/1e3)\n"
            "print(' '.join(map(str,xs)))\n")
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                              env={**os.environ, "TVM_NUM_THREADS": str(threads)})
        print(f"  TVM runtime     threads={threads}: {stats([float(x) for x in proc.stdout.split()])}")


def bench_ort(agent: Path, work: Path, budget_ms: float) -> None:
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper

    rng = np.random.default_rng(1)
    dims = [256, 512, 512, 10]
    nodes, inits, prev = [], [], "x"
    for li in range(len(dims) - 1):
        w = rng.standard_normal((dims[li], dims[li + 1])).astype(np.float32) / np.sqrt(dims[li])
        inits.append(helper.make_tensor(f"w{li}", TensorProto.FLOAT, list(w.shape), w.ravel()))
        nodes.append(helper.make_node("MatMul", [prev, f"w{li}"], [f"h{li}"]))
        prev = f"h{li}"
        if li < len(dims) - 2:
            nodes.append(helper.make_node("Relu", [prev], [f"r{li}"]))
            prev = f"r{li}"
    nodes.append(helper.make_node("Identity", [prev], ["y"]))
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [32, dims[0]])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [32, dims[-1]])], inits)
    model = work / "mlp.onnx"
    model.write_bytes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8).SerializeToString())
    onnx.checker.check_model(str(model))
    lib = sorted((Path(ort.__file__).parent / "capi").glob("libonnxruntime.so*"))[0]
    x = rng.standard_normal((32, dims[0])).astype(np.float32)
    print(f"ONNX MLP {dims} batch 32, onnxruntime {ort.__version__}, graph_optimization_level=99")
    for threads in sorted({1, os.cpu_count() or 1}):
        xs = agent_job(agent, work, f"ort{threads}", "ort", model, [x],
                       [{"name": "y", "dtype": "float32", "shape": [32, dims[-1]]}],
                       {"ort_lib": str(lib), "intra_op_num_threads": threads, "graph_optimization_level": 99},
                       budget_ms)
        print(f"  native agent    intra_op={threads}: {stats(xs)}")
        so = ort.SessionOptions()
        so.intra_op_num_threads = threads
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        sess = ort.InferenceSession(str(model), so, providers=["CPUExecutionProvider"])
        print(f"  python ORT      intra_op={threads}: {stats(in_process(lambda: sess.run(['y'], {'x': x}), budget_ms))}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=int, default=256)
    ap.add_argument("--budget-ms", type=float, default=500.0)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        agent = native.build_agent(None, static=False, out_dir=work / "agent")
        info = json.loads(subprocess.run([str(agent), "info"], capture_output=True, text=True, check=True).stdout)
        print(f"host: {info['fingerprint']['cpu_model']}, {info['fingerprint']['cores']} cores, "
              f"{info['fingerprint']['os']}, kernel {info['fingerprint']['kernel']}; agent {info['agent_version']}; "
              f"python {platform.python_version()}")
        print(f"command: {' '.join(sys.argv)}")
        bench_tvm(agent, work, args.size, args.budget_ms)
        bench_ort(agent, work, args.budget_ms)


if __name__ == "__main__":
    main()
