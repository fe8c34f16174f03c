"""Tune kernels on one device: operators (``--op``) or the tasks of a model, measured on the
device's native agent, every kernel verified, results stored in edgetune's SQLite database.

``tune_kernels(KernelSessionConfig(...))`` is the whole flow behind ``edgetune tune-kernels``:

1. parse the workloads (bad specs fail before any device work);
2. provision the native agent, read the device's cpuinfo → its TVM target and cross compiler;
3. per workload, MetaSchedule search with ``DeviceMeasure`` (tuning database under
   ``EDGETUNE_HOME/kernels/<device fingerprint>/<target>/``, so a rerun reuses its records);
4. the selected kernel is measured again in ``rounds`` fresh rounds against the STRONGEST BASELINE
   (DESIGN.md §4.5): every honest form of the same operator the device can run —
   onnxruntime with constant weights (initializers) and with runtime weights (graph inputs), on the
   native agent; numpy/BLAS and LiteRT/XNNPACK (a .tflite written here) on the Python agent where
   the device has Python. Kernel and forms are interleaved with a rotating order (K A B C, A B C K,
   …) so drift hits all; each round has new activations, while a weight operand keeps the same
   values in every round and every form (the constant-weight forms are built from exactly the
   values the kernel receives). Every run is verified; a form that fails is recorded as failed and
   not used (the forms are built and run by edgetune/kernels/baselines.py, from the operator's
   forms in edgetune/ops/). The form with the lowest median over the rounds is the verdict's
   baseline; the speedup and verdict come from ``measure.round_ratio`` (t interval on per-round log
   ratios, no verdict below 3 rounds);
5. one record per workload, round and participant (tuned kernel, each baseline form) in a run of
   config kind "kernels", so ``edgetune db``/``report`` read it like any other run.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np

import edgetune
from edgetune.build.tvm_kernel import resolve_cross_cc
from edgetune.candidate import Candidate
from edgetune.db import Record, Store
from edgetune.devices.inventory import Inventory, device_identity, edgetune_home
from edgetune.errors import DeviceError, UserInputError
from edgetune.kernels.baselines import (BaselineDevice, BaselineForm, baseline_device, baseline_forms,
                                        close_baseline_agent, run_baseline_form)
from edgetune.kernels.device_measure import DeviceMeasure, PythonTvmMeasure, device_kernel_target
from edgetune.kernels.measurement import verify_run
from edgetune.kernels.search import tune_workload
from edgetune.kernels.targets import TARGETS_DIR, cuda_target_name, device_sm, gpu_peak_gflops, load_target
from edgetune.kernels.workloads import extract_onnx_tasks, parse_workload
from edgetune.ops.forms import weight_inputs
from edgetune.measure import round_median, round_ratio, summarize
from edgetune.rounds import interleaved
from edgetune.modelfile import load_model
from edgetune.workload import parse_dims, resolve_model, shape_points

KernelEvent = Callable[[dict[str, Any]], None]

DEFAULT_ROUNDS = 5  # final interleaved rounds; a verdict needs measure.MIN_VERDICT_ROUNDS (3)
FINAL_WEIGHT_SEED = 2  # the weight operands of the final rounds (the same in every round and form)
FINAL_SEED_BASE = 100  # round r's activations: random_inputs(FINAL_SEED_BASE + r)


@dataclass
class KernelSessionConfig:
    device: str = "local"
    ops: Sequence[str] = ()
    model: str | None = None
    dims: Sequence[str] = ()
    trials: int = 64
    rounds: int = DEFAULT_ROUNDS  # final interleaved rounds (kernel vs every baseline form)
    baseline: bool = True
    budget_ms: float = 100.0
    timeout_s: float = 60.0
    num_threads: int | None = None
    max_tasks: int | None = None
    db: str | None = None  # edgetune SQLite store
    tuning_dir: str | None = None  # MetaSchedule databases (default EDGETUNE_HOME/kernels)
    command: str = ""
    inventory: Any = None  # an Inventory (tests); default: the user's
    gpu: bool = False  # CUDA kernels for the device's GPU (this machine's), not its CPU


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
    # the verdict against the strongest baseline form: {"backend" (its label), "form", "median_ns",
    # "gflops", "speedup", "ci95", "verdict", "rounds", "method", "reason", "forms": [every form:
    # {"form","label","status","reason","median_ns","gflops","rounds","speedup","ci95","verdict","strongest"}]}
    baseline: dict[str, Any] | None = None
    artifact: str | None = None
    reference: str = ""  # how the host's reference was computed (independent or not)

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
    peak_is_bound: bool = False  # the peak is at a bound clock (no cpufreq on an x86 guest), not the device's

    def as_dict(self) -> dict[str, Any]:
        return {"schema": "edgetune.kernels/1", "run_id": self.run_id, "device": self.device,
                "fingerprint_key": self.fingerprint_key, "fingerprint": self.fingerprint,
                "emulated": self.emulated, "timings": "emulated" if self.emulated else "device",
                "target": self.target, "cross_cc": self.cross_cc, "fp32_peak_gflops": self.peak_gflops,
                "fp32_peak_is_bound": self.peak_is_bound,
                "db": self.db_path, "tuning_dir": self.tuning_dir,
                "workloads": [r.as_dict() for r in self.results]}


# ---------------------------------------------------------------------------------------------
# Workloads
# ---------------------------------------------------------------------------------------------


def parse_ops(specs: Sequence[str]):
    out, seen = [], set()
    for s in specs:
        w = parse_workload(s)
        if w.key() not in seen:
            seen.add(w.key())
            out.append(w)
    return out


def model_input_shapes(model_path: str, dims: Sequence[str]) -> tuple[Any, dict[str, tuple[int, ...]]]:
    """(Model, {input name: static shape}) with --dim bindings (well-known dims defaulted, like tune)."""
    model = load_model(model_path)
    if model.format != "onnx":
        raise UserInputError(f"{model.path.name}: kernel tuning takes ONNX models (TVM Relax import)")
    point = shape_points(model, parse_dims(dims, model), {})[0]
    return model, {s.name: s.resolve(point) for s in model.inputs}


# ---------------------------------------------------------------------------------------------
# The final rounds' inputs: fresh activations each round, the weights fixed
# ---------------------------------------------------------------------------------------------


def final_weights(w) -> dict[int, np.ndarray]:
    """The weight operands of the final rounds: one seeded draw, used in every round and every form."""
    idx = weight_inputs(w)
    if not idx:
        return {}
    xs = w.random_inputs(FINAL_WEIGHT_SEED)
    return {k: xs[k] for k in idx}


def final_inputs(w, rnd: int, weights: Mapping[int, np.ndarray]) -> list[np.ndarray]:
    """Round ``rnd``'s input set: fresh activations, the fixed weights (exactly these values)."""
    xs = w.random_inputs(FINAL_SEED_BASE + rnd)
    for k, v in weights.items():
        xs[k] = v
    return xs


# ---------------------------------------------------------------------------------------------
# The session
# ---------------------------------------------------------------------------------------------


def check_kernel_run(run, workload, inputs, reference, *, peak_gflops=None, timings_trusted=True):
    """(ok, reason, max_abs, max_rel) of a KernelRun: the one verifier (timed iterations on fresh
    inputs included), against the host's float64 reference; the reason starts with its code."""
    v = verify_run(run, workload, inputs, reference, peak_gflops=peak_gflops, timings_trusted=timings_trusted)
    if v.ok:
        return True, "", v.max_abs_err, v.max_rel_err
    reason = v.reason.removeprefix("error: ")
    return False, reason if reason.startswith(f"{v.code}:") else f"{v.code}: {reason}", v.max_abs_err, v.max_rel_err


def tune_kernels(cfg: KernelSessionConfig, progress: KernelEvent | None = None) -> KernelSessionOutcome:
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
        model, shapes = model_input_shapes(resolve_model(cfg.model), cfg.dims)
    elif cfg.dims:
        raise UserInputError("--dim applies to a MODEL, not to --op workloads")
    spec = (cfg.inventory or Inventory()).get(cfg.device)
    store = Store(cfg.db)
    tuning_dir = Path(cfg.tuning_dir) if cfg.tuning_dir else edgetune_home() / "kernels"

    measure = DeviceMeasure(spec, cfg.num_threads, cfg.budget_ms, cfg.timeout_s, max_iters=20_000)
    kmeasure = measure  # what runs the kernels: the device's native agent, or (--gpu) the CUDA worker
    bdev = BaselineDevice()
    try:
        probe = measure.probe()
        info = probe.info
        peak_bound = False
        if cfg.gpu:
            target, peak, kmeasure = _gpu_target(cfg, spec, info)
            cross_cc = None
        else:
            kt = device_kernel_target(info, probe.cpuinfo)
            target = dict(kt.tvm_target)
            cross_cc = kt.cross_cc if kt.arch != "x86_64" else None
            if cross_cc:
                resolve_cross_cc(target, cross_cc)  # ToolchainError (one line) before any tuning
            peak = None if probe.emulated else kt.fp32_peak_gflops()
            peak_bound = kt.clock_is_bound
        if model is not None:
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

        bdev = baseline_device(cfg, spec, measure, info, workloads)
        versions = {"edgetune": edgetune.__version__, "agent": f"{info.agent} {info.agent_version}",
                    "tvm": tvm.__version__,
                    "device_runtimes": {k: v for k, v in sorted(info.runtimes.items()) if not isinstance(v, list)}}
        if bdev.python_info is not None:
            versions["python_agent_runtimes"] = {k: v for k, v in sorted(bdev.python_info.runtimes.items())
                                                 if not isinstance(v, list)}
        run_id = "k" + uuid.uuid4().hex[:15]
        store.acquire_device(device_identity(spec), run_id)  # one process drives a device at a time
        store.start_run(run_id, source, source_sha, spec.name, fp_key, fp, versions,
                        {"kind": "kernels", "trials": cfg.trials, "rounds": cfg.rounds, "budget_ms": cfg.budget_ms,
                         "workloads": [_name(w) for w in workloads], "target": target, "cross_cc": cross_cc,
                         "baseline": cfg.baseline, "num_threads": measure.num_threads, "command": cfg.command,
                         "dims": list(cfg.dims), "timeout_s": cfg.timeout_s})
        emit({"event": "start", "run_id": run_id, "device": spec.name, "workloads": len(workloads),
              "emulated": probe.emulated, "target": target})
        results = []
        for i, w in enumerate(workloads):
            name = _name(w)
            emit({"event": "workload", "index": i, "name": name, "trials": cfg.trials})

            def cb(done, best, _name=name):
                emit({"event": "trial", "name": _name, "done": done, "best_gflops": best})

            out = tune_workload(w, target, cfg.trials, kmeasure, tuning_dir, cb, fingerprint=fp_key, cross_cc=cross_cc)
            if measure.device_error is not None:
                raise DeviceError(f"{spec.name}: device lost while tuning {name}: {measure.device_error}")
            emit({"event": "final", "name": name, "rounds": cfg.rounds})
            res = _finish_workload(store, run_id, w, name, out, measure, bdev, cfg, fp_key, versions, target,
                                   peak, probe.emulated, kmeasure=kmeasure)
            if measure.device_error is not None:
                raise DeviceError(f"{spec.name}: device lost while measuring {name}: {measure.device_error}")
            results.append(res)
            emit({"event": "done", "name": name, "result": res})
        outcome = KernelSessionOutcome(run_id, spec.name, fp_key, fp, probe.emulated, target, cross_cc, peak,
                                       results, str(store.path), str(tuning_dir), peak_is_bound=peak_bound)
        store.finish_run(run_id, {"kind": "kernels", **outcome.as_dict()})
        return outcome
    finally:
        close_baseline_agent(bdev)
        if kmeasure is not measure:
            kmeasure.close()
        measure.close()
        store.close()


def _gpu_target(cfg, spec, info):
    """(TVM target, roofline, kernel measurer) for ``--gpu``: the CUDA target of the SM the device's
    agent reports (nvidia-smi), its tensor-core peak, and the device's Python agent running the
    kernels through the device's TVM runtime (``PythonTvmMeasure``: the whole agent protocol). One
    line, before any tuning, for what cannot be served."""
    sm = device_sm(info.fingerprint)
    if sm is None:
        raise UserInputError(f"--gpu: {spec.name} reports no NVIDIA GPU (nvidia-smi)")
    name = cuda_target_name(sm)
    if name is None:
        known = sorted(p.stem for p in TARGETS_DIR.glob("cuda-sm*.toml"))
        raise UserInputError(f"--gpu: no kernel target for {sm} (targets: {', '.join(known)})")
    kmeasure = PythonTvmMeasure(spec, "cuda", cfg.budget_ms, cfg.timeout_s, max_iters=20_000)
    try:
        kmeasure.check()
    except BaseException:
        kmeasure.close()
        raise
    return dict(load_target(name).tvm_target), gpu_peak_gflops(sm), kmeasure


def _name(w) -> str:
    spec = getattr(w, "spec", None)
    return spec() if callable(spec) else f"{w.name} (x{w.weight})"


def _finish_workload(store, run_id, w, name, out, measure, bdev: BaselineDevice, cfg, fp_key, versions, target,
                     peak, emulated, kmeasure=None):
    """The final rounds: the selected kernel and every baseline form, interleaved with a rotating
    order, fresh activations per round (fixed weights), every run verified and recorded; the verdict
    against the strongest verified form (lowest median over the rounds) by ``round_ratio``."""
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
                       artifact=str(out.artifact_path) if out.artifact_path else None,
                       reference=str(getattr(w, "reference_kind", "numpy float64 (independent of TVM)")))
    tuning_info = {"trials_measured": out.trials_measured, "reused_records": out.reused_records,
                   "tuning_s": out.tuning_seconds, "failures": failures, "target_key": out.target_key,
                   "emulated": emulated, "reference": res.reference}
    kernel_sha = hashlib.sha256(out.artifact_path.read_bytes()).hexdigest() if out.artifact_path else None
    kmeasure = kmeasure or measure  # the kernel's runner; baseline forms run on the device's agents
    kcand = Candidate.make("tvm-kernel", {"workload": name, "target": json.dumps(target, sort_keys=True),
                                          "kernel_sha256": kernel_sha, "num_threads": kmeasure.num_threads})
    if not out.verified:
        store.add_record(Record(**common, candidate=kcand.as_dict(), versions=versions, round=1, status="failed",
                                reason=out.reason or "no verified kernel",
                                verdict={"ok": False, "reason": out.reason, **tuning_info},
                                samples_ns=[], wall_ms=out.tuning_seconds * 1e3, agent_ms=0.0))
        return res

    weights = final_weights(w)
    workdir = Path(tempfile.mkdtemp(prefix="edgetune-kbase-"))
    kernel_info = {"weights_sha256": _weights_sha(weights), **tuning_info}

    def run_kernel(inputs):
        run = kmeasure(str(out.artifact_path), inputs, list(w.outputs))
        return None, run

    def record(who, rnd, ok, reason, mabs, mrel, run, jr, wall_ms):
        verdict = {"ok": ok, "reason": reason, "max_abs_err": mabs, "max_rel_err": mrel}
        if who.form is None:
            store.add_record(Record(**common, candidate=kcand.as_dict(), versions=versions, round=rnd,
                                    status="verified" if ok else "failed", reason=reason,
                                    verdict={**verdict, "load_ms": run.load_ms, **kernel_info},
                                    samples_ns=run.samples_ns, wall_ms=wall_ms, agent_ms=wall_ms))
            return
        record_form(store, common, versions, who.form, rnd, ok, reason, verdict, jr,
                    weights_sha256=_weights_sha(weights))

    try:
        forms, skipped = baseline_forms(w, weights, workdir, bdev)
        rounds = final_rounds(w, [Entrant("kernel", run_kernel, peak_gflops=peak if kmeasure is not measure else None)],
                              forms, cfg.rounds, weights,
                              lambda form, xs: run_baseline_form(form, xs, measure, bdev, cfg), record,
                              device_lost=lambda: measure.device_error is not None)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    if rounds is None:
        return res  # the caller raises: the device is gone
    k_groups = rounds.groups["kernel"]
    k_ok, k_reason = "kernel" not in rounds.failed, rounds.failed.get("kernel", "")
    groups, failed = rounds.groups, rounds.failed
    if not k_ok or not k_groups:
        res.reason = f"selected kernel failed the final check: {k_reason}"
        return res
    st = summarize(np.concatenate(k_groups), resamples=200)
    res.verified, res.reason = True, ""
    # the round is the unit: the median of per-round medians (a round with more, faster iterations
    # must not outweigh the others), the same statistic as every baseline form's
    res.median_ns, res.p10_ns, res.p90_ns = round_median(k_groups), st.p10_ns, st.p90_ns
    res.gflops = flops / res.median_ns
    res.peak_pct = 100.0 * res.gflops / peak if peak else None
    res.baseline = strongest_baseline(forms, skipped, groups, failed, k_groups, flops, round_ratio)
    return res


def record_form(store, common: Mapping[str, Any], versions: Mapping[str, Any], form: "BaselineForm", rnd: int,
                ok: bool, reason: str, verdict: Mapping[str, Any], jr, **extra: Any) -> None:
    """Store one baseline form's run of a final round (``jr``: its JobResult, or None)."""
    store.add_record(Record(**common, candidate=form.candidate.as_dict(),
                            versions={**versions, "job_runtime": jr.runtime_versions if jr else {}},
                            round=rnd, status="verified" if ok else "failed", reason=reason,
                            verdict={**verdict, "load_ms": jr.load_ms if jr else None, "form": form.key,
                                     "label": form.label, **extra},
                            samples_ns=jr.samples_ns if jr else [], wall_ms=jr.wall_ms if jr else 0.0,
                            agent_ms=jr.agent_ms if jr else 0.0))


@dataclass
class Entrant:
    """One contender of the final rounds besides the baseline forms: ``run(inputs)`` runs it on the
    round's input set (the operator's own layout) and returns ``(JobResult or None, KernelRun)``;
    ``form`` is set for baseline forms only (their view maps inputs and references)."""

    key: str
    run: Callable[[list[np.ndarray]], tuple[Any, Any]] | None = None
    form: "BaselineForm | None" = None
    peak_gflops: float | None = None
    timings_trusted: bool = True


@dataclass
class FinalRounds:
    groups: dict[str, list[np.ndarray]]  # every participant's samples, one array per verified round
    failed: dict[str, str]  # participant -> the reason of its first failed round (it ran no more)
    rounds: int


def final_rounds(w, entrants: Sequence[Entrant], forms: Sequence["BaselineForm"], rounds: int,
                 weights: Mapping[int, np.ndarray], run_form, record, *, device_lost=lambda: False,
                 on_round=None) -> FinalRounds | None:
    """The final rounds of a kernel verdict (DESIGN.md §4.4-4.6), on the one round loop
    (``rounds.interleaved``): every entrant and every baseline form, in the rotating order, on fresh
    activations each round with the same weight values everywhere; every run verified against the host's float64 reference. A participant that
    fails a round is out (recorded once, never the baseline, never selected).
    ``record(participant, round, ok, reason, max_abs, max_rel, KernelRun, JobResult|None, wall_ms)``
    stores each run; ``run_form(form, form_inputs)`` runs a baseline form. None when the device was
    lost (``device_lost()`` after a DeviceError)."""
    participants = list(entrants) + [Entrant(f.key, form=f) for f in forms]
    groups: dict[str, list[np.ndarray]] = {p.key: [] for p in participants}
    if not entrants:
        return FinalRounds(groups, {}, 0)  # nothing to race: no baseline is measured for nobody

    def start(rnd: int):
        inputs = final_inputs(w, rnd, weights)
        reference = w.reference(inputs)
        if on_round:
            on_round(rnd)
        return inputs, reference

    def one(who: Entrant, rnd: int, ctx) -> str | None:
        inputs, reference = ctx
        t0 = time.perf_counter()
        if who.form is None:
            view, xs, ref = w, [x.copy() for x in inputs], reference
            jr, kr = who.run(xs)
        else:
            view = who.form.view
            xs, ref = view.to_form(inputs), view.outputs_to_form(reference)
            jr, kr = run_form(who.form, xs)
        wall = (time.perf_counter() - t0) * 1e3
        checks = {}  # an entrant's roofline and emulation flag (baseline forms: the defaults)
        if who.peak_gflops is not None:
            checks["peak_gflops"] = who.peak_gflops
        if not who.timings_trusted:
            checks["timings_trusted"] = False
        ok, reason, mabs, mrel = check_kernel_run(kr, view, xs, ref, **checks)
        if ok:
            groups[who.key].append(np.asarray(kr.samples_ns, np.int64))
        record(who, rnd, ok, reason, mabs, mrel, kr, jr, wall)
        return None if ok else (reason or "failed")

    try:
        failed = interleaved(participants, rounds, one, before_round=start, key=lambda p: p.key)
    except DeviceError:
        if device_lost():
            return None
        raise
    return FinalRounds(groups, {str(k): v for k, v in failed.items()}, rounds)


def _weights_sha(weights: Mapping[int, np.ndarray]) -> dict[str, str]:
    return {str(k): hashlib.sha256(np.ascontiguousarray(v).tobytes()).hexdigest()[:16] for k, v in weights.items()}


def strongest_baseline(forms: Sequence[BaselineForm], skipped: Sequence[dict[str, Any]],
                       groups: Mapping[str, Sequence[np.ndarray]], failed: Mapping[str, str],
                       k_groups: Sequence[np.ndarray], flops: int, round_ratio) -> dict[str, Any]:
    """The verdict's baseline: among the forms verified in every round, the one with the lowest
    median (over the rounds, of per-round medians: ``measure.round_median``); speedup and verdict by
    ``round_ratio`` on per-round (form, kernel) pairs. Every form is listed (verified with its
    figures, failed or unavailable with its reason)."""
    rows: list[dict[str, Any]] = []
    candidates = []
    for f in forms:
        row: dict[str, Any] = {"form": f.key, "label": f.label, "candidate": f.candidate.as_dict(),
                               "status": "verified", "reason": "", "median_ns": None, "gflops": None, "rounds": 0,
                               "speedup": None, "ci95": None, "verdict": None, "strongest": False}
        g = list(groups.get(f.key, []))
        if f.key in failed:
            row.update(status="failed", reason=failed[f.key], rounds=len(g))
        elif len(g) != len(k_groups) or not g:
            row.update(status="failed", reason="not verified in every round", rounds=len(g))
        else:
            med = round_median(g)
            r = round_ratio(list(zip(g, k_groups)))
            row.update(median_ns=med, gflops=flops / med if med > 0 else None, rounds=len(g),
                       round_medians_ns=[float(np.median(x)) for x in g], speedup=r.value,
                       ci95=[r.ci_low, r.ci_high], verdict=r.verdict, method=r.method)
            candidates.append((med, f.key, row, r))
        rows.append(row)
    rows.extend(dict(s, median_ns=None, gflops=None, rounds=0, speedup=None, ci95=None, verdict=None,
                     strongest=False) for s in skipped)
    if not candidates:
        reasons = "; ".join(f"{r['label']}: {r['reason']}" for r in rows) or "no baseline form"
        return {"backend": None, "form": None, "median_ns": None, "gflops": None, "speedup": None, "ci95": None,
                "verdict": None, "rounds": 0, "method": None, "reason": f"no baseline form verified ({reasons})",
                "kernel_round_medians_ns": [float(np.median(x)) for x in k_groups], "forms": rows}
    med, key, row, r = min(candidates, key=lambda c: c[0])
    row["strongest"] = True
    return {"backend": row["label"], "form": key, "median_ns": med, "gflops": row["gflops"], "speedup": r.value,
            "ci95": [r.ci_low, r.ci_high], "verdict": r.verdict, "rounds": r.rounds, "method": r.method,
            "reason": "", "kernel_round_medians_ns": [float(np.median(x)) for x in k_groups], "forms": rows}
