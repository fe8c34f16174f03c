"""Local kernel runner process (host-side stand-in for the device agent's ``tvm-kernel`` backend).

Started by ``edgetune.kernels.search.LocalMeasure`` as ``python -m edgetune.kernels._local_worker``.
It reads one job directory per line on stdin, runs the job described by ``JOBDIR/request.json``
(the agent protocol's request, device_agents/PROTOCOL.md), writes outputs and ``result.json``,
then prints ``EDGETUNE-DONE <JOBDIR>``. A kernel that crashes takes this process down with it,
which is the point: the tuner survives and records the crash.

Steps per job, as the agent does them: load; poison outputs with NaN; run every input set once
and save the outputs; run the timing set again (determinism); warm up; time
``clamp(budget/estimate, min_iters, max_iters)`` iterations one by one on the device's clock (TVM's
time_evaluator: CUDA events on a GPU), caches flushed before each (``cache_flush_bytes``); check the
inputs were not modified; run the ``post_timing_sets`` through the timed buffers, outputs poisoned.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
import traceback
from pathlib import Path

import numpy as np

DONE = "EDGETUNE-DONE"


def _resolve(jobdir: Path, p: str) -> Path:
    q = Path(p)
    return q if q.is_absolute() else (jobdir / q)


def _sha(x: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(x).tobytes()).hexdigest()


def run_job(jobdir: Path) -> dict:
    import tvm

    req = json.loads((jobdir / "request.json").read_text())
    result: dict = {"protocol": 1, "status": "ok", "reason": "", "agent": "edgetune-local",
                    "clock": "perf_counter_ns", "samples_ns": [], "outputs": [], "repeat_outputs": []}
    artifact = _resolve(jobdir, req["artifact"])
    digest = hashlib.sha256(artifact.read_bytes()).hexdigest()
    if req.get("artifact_sha256") and req["artifact_sha256"] != digest:
        return {**result, "status": "error", "reason": "artifact sha256 mismatch"}
    params = req.get("params", {})
    dev = tvm.runtime.device(params.get("device", "cpu"), 0)
    t0 = time.perf_counter_ns()
    lib = tvm.runtime.load_module(str(artifact))
    entry = params.get("entry", "main")
    func = lib[entry]
    result["load_ms"] = (time.perf_counter_ns() - t0) / 1e6

    input_sets = [[np.load(_resolve(jobdir, p)) for p in paths] for paths in req["inputs"]]
    result["input_sha256_before"] = [_sha(x) for s in input_sets for x in s]
    out_specs = req["outputs"]

    def fresh_outputs():
        return [tvm.runtime.tensor(np.full(o["shape"], np.nan, o["dtype"]), dev) for o in out_specs]

    def run_and_save(args, outs, prefix: str) -> list[str]:
        """One run into ``outs`` (poisoned by the caller), its outputs saved as PREFIX_K.npy."""
        func(*args, *outs)
        dev.sync()
        names = [f"{prefix}_{k}.npy" for k in range(len(outs))]
        for name, o in zip(names, outs):
            np.save(jobdir / name, o.numpy())
        return names

    dev_inputs = [[tvm.runtime.tensor(np.ascontiguousarray(x), dev) for x in s] for s in input_sets]
    for i, args in enumerate(dev_inputs):
        result["outputs"].append(run_and_save(args, fresh_outputs(), f"out_{i}"))

    ts = int(req.get("timing_set", 0))
    args = dev_inputs[ts]
    outs = fresh_outputs()
    result["repeat_outputs"] = run_and_save(args, outs, "rep")

    warmup_ns = float(req.get("warmup_ms", 10.0)) * 1e6
    start = time.perf_counter_ns()
    warm = 0
    while True:
        func(*args, *outs)
        dev.sync()
        warm += 1
        if time.perf_counter_ns() - start >= warmup_ns:
            break
    estimate = max((time.perf_counter_ns() - start) / warm, 1.0)
    iters = int(float(req.get("budget_ms", 100.0)) * 1e6 / estimate)
    iters = max(int(req.get("min_iters", 3)), min(int(req.get("max_iters", 100000)), iters))
    # each run timed on the device's own clock (TVM's timer: CUDA events on a GPU) into the same
    # preallocated outputs, with the caches flushed before it (cache_flush_bytes: a buffer larger than
    # the GPU's L2 is written first, so no run finds the previous one's data there)
    flush = int(req.get("cache_flush_bytes", 0))
    timer = lib.time_evaluator(entry, dev, number=1, repeat=iters, cache_flush_bytes=flush)
    samples = [max(1, int(round(t * 1e9))) for t in timer(*args, *outs).results]
    result["clock"] = f"{'CUDA events' if dev.dlpack_device_type() == 2 else 'device timer'} (TVM time_evaluator)" \
        + (f", {flush >> 20} MiB cache flush before each run" if flush else "")
    result["warmup_iters"] = warm
    result["samples_ns"] = samples
    after = [[x.numpy() for x in s] for s in dev_inputs]
    result["input_sha256_after"] = [_sha(x) for s in after for x in s]
    if result["input_sha256_after"] != result["input_sha256_before"]:
        result["status"] = "error"
        result["reason"] = "kernel modified its inputs"
    # new inputs through the very buffers the kernel was timed on, outputs poisoned: the host verifies
    # these, so a kernel that stops computing once it has been timed is caught
    result["post_timing_outputs"] = []
    for i, paths in enumerate(req.get("post_timing_sets", [])):
        for buf, path in zip(args, paths):
            buf.copyfrom(np.ascontiguousarray(np.load(_resolve(jobdir, path))))
        for o, spec in zip(outs, out_specs):
            o.copyfrom(np.full(spec["shape"], np.nan, spec["dtype"]))
        result["post_timing_outputs"].append(run_and_save(args, outs, f"post_{i}"))
    result["runtime_versions"] = {"tvm": getattr(tvm, "__version__", "?")}
    return result


def main() -> int:
    for line in sys.stdin:
        jobdir = Path(line.strip())
        if not line.strip():
            continue
        try:
            result = run_job(jobdir)
        except Exception as exc:  # noqa: BLE001 - a failed kernel is a result, not a worker death
            result = {"protocol": 1, "status": "error", "reason": f"{type(exc).__name__}: {exc}".strip()[:2000],
                      "samples_ns": [], "outputs": [], "traceback": traceback.format_exc()[-4000:]}
        tmp = jobdir / "result.json.tmp"
        tmp.write_text(json.dumps(result))
        os.replace(tmp, jobdir / "result.json")
        sys.stdout.write(f"{DONE} {jobdir}\n")
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
