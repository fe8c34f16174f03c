"""Tune kernels on one device: operators (``--op``) or the tasks of a model, measured on the
device's native agent, every kernel verified, results stored in edgetune's SQLite database.

``tune_kernels(KernelSessionConfig(...))`` is the whole flow behind ``edgetune tune-kernels``:

1. parse the workloads (bad specs fail before any device work);
2. provision the native agent, read the device's cpuinfo → its TVM target and cross compiler;
3. per workload, MetaSchedule search with ``DeviceMeasure`` (tuning database under
   ``EDGETUNE_HOME/kernels/<device fingerprint>/<target>/``, so a rerun reuses its records);
4. the selected kernel is measured again in ``rounds`` rounds on a fresh input set, interleaved
   with onnxruntime's default running the same operator as a one-node ONNX model on the same
   device (when the device has onnxruntime and the op has an ONNX form): kernel, ort, ort,
   kernel, ... so drift hits both; every run's output is verified;
5. one record per workload and round (tuned kernel, and the ort baseline) in a run of config
   kind "kernels", so ``edgetune db``/``report`` read it like any other run.
"""

from __future__ import annotations

import hashlib
import json
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from edgetune.errors import DeviceError, UserInputError

KernelEvent = Callable[[dict[str, Any]], None]


@dataclass
class KernelSessionConfig:
    device: str = "local"
    ops: Sequence[str] = ()
    model: str | None = None
    dims: Sequence[str] = ()
    trials: int = 64
    rounds: int = 3  # final interleaved rounds (kernel vs baseline)
    baseline: bool = True
    budget_ms: float = 100.0
    timeout_s: float = 60.0
    num_threads: int | None = None
    max_tasks: int | None = None
    db: str | None = None  # edgetune SQLite store
    tuning_dir: str | None = None  # MetaSchedule databases (default EDGETUNE_HOME/kernels)
    command: str = ""
    inventory: Any = None  # an Inventory (tests); default: the user's


@dataclass
class KernelResult:
    """One workload's outcome on the device (what the table / JSON shows)."""

    name: str
    spec: str
    workload_key: str
    flops: int
    weight: int
    verified: bool
    reason: str
    gflops: float | None
    median_ns: float | None
    p10_ns: float | None
    p90_ns: float | None
    peak_pct: float | None
    trials_measured: int
    trials_failed: int
    reused_records: int
    tuning_s: float
    emulated: bool
    failures: dict[str, int] = field(default_factory=dict)
    baseline: dict[str, Any] | None = None  # {"backend","median_ns","gflops","ratio","ci95","faster","reason"}
    artifact: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class KernelSessionOutcome:
    run_id: str
    device: str
    fingerprint_key: str
    fingerprint: dict[str, Any]
    emulated: str | None
    target: dict[str, Any]
    cross_cc: str | None
    peak_gflops: float | None
    results: list[KernelResult]
    db_path: str
    tuning_dir: str

    def as_dict(self) -> dict[str, Any]:
        return {"schema": "edgetune.kernels/1", "run_id": self.run_id, "device": self.device,
                "fingerprint_key": self.fingerprint_key, "fingerprint": self.fingerprint,
                "emulated": self.emulated, "timings": "emulated" if self.emulated else "device",
                "target": self.target, "cross_cc": self.cross_cc, "fp32_peak_gflops": self.peak_gflops,
                "db": self.db_path, "tuning_dir": self.tuning_dir,
                "workloads": [r.as_dict() for r in self.results]}


# ---------------------------------------------------------------------------------------------
# Workloads
# ---------------------------------------------------------------------------------------------


def parse_ops(specs: Sequence[str]):
    from edgetune.kernels.workloads import parse_workload

    out, seen = [], set()
    for s in specs:
        w = parse_workload(s)
        if w.key() not in seen:
            seen.add(w.key())
            out.append(w)
    return out


def model_input_shapes(model_path: str, dims: Sequence[str]) -> tuple[Any, dict[str, tuple[int, ...]]]:
    """(Model, {input name: static shape}) with --dim bindings (well-known dims defaulted, like tune)."""
    from edgetune.workload import load_model, parse_dims, shape_points

    model = load_model(model_path)
    if model.format != "onnx":
        raise UserInputError(f"{model.path.name}: kernel tuning takes ONNX models (TVM Relax import)")
    point = shape_points(model, parse_dims(dims, model), {})[0]
    return model, {s.name: s.resolve(point) for s in model.inputs}


def op_onnx_model(w):
    """A one-node ONNX model computing operator workload ``w`` (weights as graph inputs, like the
    kernel), or None for ops without a plain ONNX form."""
    from onnx import TensorProto, helper

    op = getattr(w, "op", None)
    ins, outs = w.inputs, w.outputs
    if op in ("gemm", "batch_matmul"):
        node = helper.make_node("MatMul", [ins[0].name, ins[1].name], [outs[0].name])
    elif op in ("conv2d_nchw", "depthwise_conv2d_nchw"):
        attrs = dict(strides=[w.stride, w.stride], pads=[w.pad] * 4, kernel_shape=[w.R, w.S])
        if op == "depthwise_conv2d_nchw":
            attrs["group"] = w.C
        node = helper.make_node("Conv", [ins[0].name, ins[1].name], [outs[0].name], **attrs)
    else:
        return None

    def vi(s):
        return helper.make_tensor_value_info(s.name, TensorProto.FLOAT, list(s.shape))

    graph = helper.make_graph([node], op, [vi(s) for s in ins], [vi(s) for s in outs])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


# ---------------------------------------------------------------------------------------------
# The session
# ---------------------------------------------------------------------------------------------


def _verify_run(run, workload, inputs, reference, rtol=1e-4):
    """(ok, reason, max_abs, max_rel) of a KernelRun against the host's reference."""
    from edgetune.kernels.search import verify_outputs

    if run.status != "ok":
        return False, f"{run.status}: {run.reason}", None, None
    if not run.samples_ns:
        return False, "no timing samples", None, None
    v = verify_outputs(run.outputs, reference, workload.outputs, rtol=rtol, repeat_outputs=run.repeat_outputs)
    return v.ok, v.reason, v.max_abs_err, v.max_rel_err


def tune_kernels(cfg: KernelSessionConfig, progress: KernelEvent | None = None) -> KernelSessionOutcome:
    from edgetune import __version__
    from edgetune.candidate import Candidate
    from edgetune.db import Store
    from edgetune.devices.inventory import Inventory, edgetune_home
    from edgetune.kernels.device_measure import DeviceMeasure, device_kernel_target
    from edgetune.kernels.search import tune_workload
    from edgetune.measure import grouped_speedup, summarize

    emit = progress or (lambda ev: None)
    if cfg.trials < 0:
        raise UserInputError(f"--trials must be >= 0, got {cfg.trials}")
    if cfg.rounds < 1:
        raise UserInputError(f"--rounds must be >= 1, got {cfg.rounds}")
    if bool(cfg.ops) == bool(cfg.model):
        raise UserInputError("give either a MODEL or one or more --op specs (e.g. --op gemm:M=64,N=64,K=64)")
    # everything the user typed is checked before any device work
    ops = parse_ops(cfg.ops) if cfg.ops else []
    model = shapes = None
    if cfg.model:
        from edgetune.api import resolve_model

        model, shapes = model_input_shapes(resolve_model(cfg.model), cfg.dims)
    elif cfg.dims:
        raise UserInputError("--dim applies to a MODEL, not to --op workloads")
    spec = (cfg.inventory or Inventory()).get(cfg.device)
    store = Store(cfg.db)
    tuning_dir = Path(cfg.tuning_dir) if cfg.tuning_dir else edgetune_home() / "kernels"

    measure = DeviceMeasure(spec, cfg.num_threads, cfg.budget_ms, cfg.timeout_s, max_iters=20_000)
    try:
        probe = measure.probe()
        info = probe.info
        kt = device_kernel_target(info, probe.cpuinfo)
        target = dict(kt.tvm_target)
        cross_cc = kt.cross_cc if kt.arch != "x86_64" else None
        if cross_cc:
            from edgetune.build.tvm_kernel import resolve_cross_cc

            resolve_cross_cc(target, cross_cc)  # ToolchainError (one line) before any tuning
        peak = None if probe.emulated else kt.fp32_peak_gflops()
        if model is not None:
            from edgetune.kernels.workloads import extract_onnx_tasks

            workloads = extract_onnx_tasks(model.path, shapes, target)
            workloads.sort(key=lambda t: -t.flops() * t.weight)
            if cfg.max_tasks:
                workloads = workloads[: cfg.max_tasks]
            if not workloads:
                raise UserInputError(f"{model.path.name}: TVM found no tunable tasks")
            source, source_sha = str(model.path), model.sha256
        else:
            workloads = ops
            source = "kernels:" + ";".join(w.spec() for w in ops)
            source_sha = hashlib.sha256(source.encode()).hexdigest()
        fp, fp_key = probe.fingerprint, probe.fingerprint_key
        import tvm

        versions = {"edgetune": __version__, "agent": f"{info.agent} {info.agent_version}", "tvm": tvm.__version__,
                    "device_runtimes": {k: v for k, v in sorted(info.runtimes.items()) if not isinstance(v, list)}}
        run_id = "k" + uuid.uuid4().hex[:15]
        store.start_run(run_id, source, source_sha, spec.name, fp_key, fp, versions,
                        {"kind": "kernels", "trials": cfg.trials, "rounds": cfg.rounds, "budget_ms": cfg.budget_ms,
                         "workloads": [_name(w) for w in workloads], "target": target, "cross_cc": cross_cc,
                         "baseline": cfg.baseline, "num_threads": measure.num_threads, "command": cfg.command,
                         "dims": list(cfg.dims), "timeout_s": cfg.timeout_s})
        emit({"event": "start", "run_id": run_id, "device": spec.name, "workloads": len(workloads),
              "emulated": probe.emulated, "target": target})
        ort_ok = cfg.baseline and bool(info.runtimes.get("onnxruntime"))
        results = []
        for i, w in enumerate(workloads):
            name = _name(w)
            emit({"event": "workload", "index": i, "name": name, "trials": cfg.trials})

            def cb(done, best, _name=name):
                emit({"event": "trial", "name": _name, "done": done, "best_gflops": best})

            out = tune_workload(w, target, cfg.trials, measure, tuning_dir, cb, fingerprint=fp_key, cross_cc=cross_cc)
            if measure.device_error is not None:
                raise DeviceError(f"{spec.name}: device lost while tuning {name}: {measure.device_error}")
            res = _finish_workload(store, run_id, w, name, out, measure, ort_ok, cfg, fp_key, versions, target,
                                   peak, probe.emulated, Candidate, summarize, grouped_speedup)
            if measure.device_error is not None:
                raise DeviceError(f"{spec.name}: device lost while measuring {name}: {measure.device_error}")
            results.append(res)
            emit({"event": "done", "name": name, "result": res})
        outcome = KernelSessionOutcome(run_id, spec.name, fp_key, fp, probe.emulated, target, cross_cc, peak,
                                       results, str(store.path), str(tuning_dir))
        store.finish_run(run_id, {"kind": "kernels", **outcome.as_dict()})
        return outcome
    finally:
        measure.close()
        store.close()


def _name(w) -> str:
    spec = getattr(w, "spec", None)
    return spec() if callable(spec) else f"{w.name} (x{w.weight})"


def _finish_workload(store, run_id, w, name, out, measure, ort_ok, cfg, fp_key, versions, target, peak, emulated,
                     Candidate, summarize, grouped_speedup):
    """Re-measure the selected kernel (and the ort baseline, interleaved), verify, record."""
    from edgetune.agent.host import Job
    from edgetune.kernels.device_measure import job_to_kernel_run

    failures: dict[str, int] = {}
    for r in out.records:
        if r.status != "ok":
            failures[r.status] = failures.get(r.status, 0) + 1
    shape = {"op": name}
    shape_key = hashlib.sha256(w.key().encode()).hexdigest()[:16]
    common = dict(run_id=run_id, workload_key=w.key(), shape=shape, shape_key=shape_key, fingerprint_key=fp_key)
    flops = int(w.flops())
    res = KernelResult(name=name, spec=name, workload_key=w.key(), flops=flops, weight=int(getattr(w, "weight", 1)),
                       verified=False, reason=out.reason, gflops=None, median_ns=None, p10_ns=None, p90_ns=None,
                       peak_pct=None, trials_measured=out.trials_measured, trials_failed=sum(failures.values()),
                       reused_records=out.reused_records, tuning_s=round(out.tuning_seconds, 3),
                       emulated=bool(emulated), failures=failures,
                       artifact=str(out.artifact_path) if out.artifact_path else None)
    tuning_info = {"trials_measured": out.trials_measured, "reused_records": out.reused_records,
                   "tuning_s": out.tuning_seconds, "failures": failures, "target_key": out.target_key,
                   "emulated": emulated}
    kernel_sha = hashlib.sha256(out.artifact_path.read_bytes()).hexdigest() if out.artifact_path else None
    kcand = Candidate.make("tvm-kernel", {"workload": name, "target": json.dumps(target, sort_keys=True),
                                          "kernel_sha256": kernel_sha, "num_threads": measure.num_threads})
    if not out.verified:
        store.add_record(**common, candidate=kcand.as_dict(), versions=versions, round=1, status="failed",
                         reason=out.reason or "no verified kernel", verdict={"ok": False, "reason": out.reason,
                                                                             **tuning_info},
                         samples_ns=[], wall_ms=out.tuning_seconds * 1e3, agent_ms=0.0)
        return res

    # the final measurement: a fresh input set the kernel was not selected on
    inputs = w.random_inputs(2)
    reference = w.reference(inputs)
    onnx_path = None
    bcand = Candidate.make("ort", {}, baseline=True)
    base_reason = "" if ort_ok else ("no onnxruntime on the device" if cfg.baseline else "--no-baseline")
    if ort_ok:
        m = op_onnx_model(w)
        if m is None:
            ort_ok, base_reason = False, "no one-node ONNX form (fused task)"
        else:
            tmp = Path(tempfile.mkdtemp(prefix="edgetune-kbase-"))
            onnx_path = tmp / f"{shape_key}.onnx"
            onnx_path.write_bytes(m.SerializeToString())

    k_groups, b_groups, k_ok, b_ok = [], [], True, ort_ok
    k_reason = ""
    for rnd in range(1, cfg.rounds + 1):
        order = ["kernel", "ort"] if rnd % 2 else ["ort", "kernel"]
        for who in order:
            if who == "kernel":
                t0 = time.perf_counter()
                run = measure(str(out.artifact_path), [x.copy() for x in inputs], list(w.outputs))
                wall = (time.perf_counter() - t0) * 1e3
                ok, reason, mabs, mrel = _verify_run(run, w, inputs, reference)
                k_ok = k_ok and ok
                k_reason = k_reason or reason
                if ok:
                    k_groups.append(np.asarray(run.samples_ns, np.int64))
                store.add_record(**common, candidate=kcand.as_dict(), versions=versions, round=rnd,
                                 status="verified" if ok else "failed", reason=reason,
                                 verdict={"ok": ok, "reason": reason, "max_abs_err": mabs, "max_rel_err": mrel,
                                          "load_ms": run.load_ms, **tuning_info},
                                 samples_ns=run.samples_ns, wall_ms=wall, agent_ms=wall)
            elif ort_ok:
                job = Job(backend="ort", artifact=onnx_path, params={}, input_names=[s.name for s in w.inputs],
                          input_sets=[[x.copy() for x in inputs]],
                          output_specs=[s.as_json() for s in w.outputs], budget_ms=cfg.budget_ms,
                          warmup_ms=min(50.0, max(5.0, cfg.budget_ms / 5)), max_iters=20_000,
                          timeout_s=cfg.timeout_s)
                try:
                    jr = measure.run_job(job)
                except DeviceError as exc:
                    return res if measure.device_error is not None else _raise(exc)
                run = job_to_kernel_run(jr, inputs, w.outputs)
                ok, reason, mabs, mrel = _verify_run(run, w, inputs, reference)
                if ok:
                    b_groups.append(np.asarray(run.samples_ns, np.int64))
                else:
                    b_ok, base_reason = False, base_reason or reason
                store.add_record(**common, candidate=bcand.as_dict(), versions={**versions, "job_runtime": jr.runtime_versions},
                                 round=rnd, status="verified" if ok else "failed", reason=reason,
                                 verdict={"ok": ok, "reason": reason, "max_abs_err": mabs, "max_rel_err": mrel,
                                          "load_ms": jr.load_ms},
                                 samples_ns=jr.samples_ns, wall_ms=jr.wall_ms, agent_ms=jr.agent_ms)
    if onnx_path is not None:
        import shutil

        shutil.rmtree(onnx_path.parent, ignore_errors=True)
    if not k_ok or not k_groups:
        res.reason = f"selected kernel failed the final check: {k_reason}"
        return res
    st = summarize(np.concatenate(k_groups), resamples=200)
    res.verified, res.reason = True, ""
    res.median_ns, res.p10_ns, res.p90_ns = st.median_ns, st.p10_ns, st.p90_ns
    res.gflops = flops / st.median_ns
    res.peak_pct = 100.0 * res.gflops / peak if peak else None
    if b_ok and b_groups and len(b_groups) == len(k_groups):
        bst = summarize(np.concatenate(b_groups), resamples=200)
        ratio = grouped_speedup(list(zip(b_groups, k_groups)), resamples=500)
        res.baseline = {"backend": "onnxruntime (default session, one-node model)", "median_ns": bst.median_ns,
                        "gflops": flops / bst.median_ns, "speedup": ratio.value, "ci95": [ratio.ci_low, ratio.ci_high],
                        "verdict": ratio.verdict, "rounds": len(b_groups), "reason": ""}
    else:
        res.baseline = {"backend": "onnxruntime", "median_ns": None, "gflops": None, "speedup": None, "ci95": None,
                        "verdict": None, "rounds": 0, "reason": base_reason or "baseline failed"}
    return res


def _raise(exc):
    raise exc
