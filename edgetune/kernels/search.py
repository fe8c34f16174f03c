"""MetaSchedule kernel search with a pluggable, verifying measurement.

MetaSchedule proposes schedules and builds them (``LocalBuilder``, cross-compiling for the
device); ``EdgetuneRunner`` measures each built kernel through ``measure`` and VERIFIES its
outputs against the workload's reference before MetaSchedule sees a time. A kernel that is wrong,
crashes, hangs or errors comes back as a failed ``RunnerResult`` (with ``error_msg``), so it is
stored as failed in the tuning database and never selected.

``measure(artifact_path, inputs, output_specs) -> KernelRun`` is the only contact with the device.
``LocalMeasure`` runs kernels in a child process on this host through the TVM runtime (a crash
kills the child, not the tuner); the device-agent path plugs in with the same signature.

Entry point: ``tune_workload``. Records live in a MetaSchedule JSONDatabase under
``db_dir/<device fingerprint>/<target>/``, so a second run on the same device reuses them.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Protocol, Sequence

import numpy as np

from edgetune.errors import UserInputError
from edgetune.kernels.workloads import KernelWorkload, TensorSpec

RUN_STATUSES = ("ok", "error", "crashed", "timeout")


@dataclass(frozen=True)
class KernelRun:
    """What one measurement of one kernel artifact returned (from the agent or LocalMeasure).

    ``samples_ns``: every timed iteration; ``outputs``: the outputs of the measured input set
    (computed into NaN-poisoned buffers); ``repeat_outputs``: the same input run again.
    """

    status: str
    reason: str = ""
    samples_ns: list[int] = field(default_factory=list)
    outputs: list[np.ndarray] = field(default_factory=list)
    repeat_outputs: list[np.ndarray] = field(default_factory=list)
    load_ms: float | None = None

    def __post_init__(self) -> None:
        if self.status not in RUN_STATUSES:
            raise ValueError(f"KernelRun.status must be one of {RUN_STATUSES}, got {self.status!r}")


class Measure(Protocol):
    def __call__(self, artifact_path: str, inputs: list[np.ndarray], output_specs: Sequence[TensorSpec]) -> KernelRun: ...


# ---------------------------------------------------------------------------------------------
# Verification
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Verdict:
    ok: bool
    reason: str = ""
    max_abs_err: float = float("nan")
    max_rel_err: float = float("nan")


def verify_outputs(
    outputs: Sequence[np.ndarray],
    reference: Sequence[np.ndarray],
    output_specs: Sequence[TensorSpec],
    *,
    rtol: float = 1e-4,
    repeat_outputs: Sequence[np.ndarray] | None = None,
) -> Verdict:
    """Outputs vs the host's reference: error relative to the output's scale (max |ref|).

    Fails on missing outputs, wrong shape/dtype, any non-finite value (NaN from the poisoned
    buffer means an element was never written), error above ``rtol`` × scale, or a repeat run
    that disagrees with the first.
    """
    if len(outputs) != len(output_specs):
        return Verdict(False, f"expected {len(output_specs)} outputs, got {len(outputs)}")
    worst_abs, worst_rel = 0.0, 0.0
    for k, (out, ref, spec) in enumerate(zip(outputs, reference, output_specs)):
        out = np.asarray(out)
        if tuple(out.shape) != tuple(spec.shape) or str(out.dtype) != spec.dtype:
            return Verdict(False, f"output {spec.name}: got {out.dtype}{list(out.shape)}, expected {spec.dtype}{list(spec.shape)}")
        finite = np.isfinite(out)
        if not finite.all():
            bad = int((~finite).sum())
            return Verdict(False, f"output {spec.name}: {bad} of {out.size} elements not finite (unwritten or overflow)")
        ref64 = np.asarray(ref, np.float64)
        err = np.abs(out.astype(np.float64) - ref64)
        scale = max(float(np.abs(ref64).max(initial=0.0)), 1e-30)
        max_abs = float(err.max(initial=0.0))
        worst_abs, worst_rel = max(worst_abs, max_abs), max(worst_rel, max_abs / scale)
        if max_abs > rtol * scale:
            idx = np.unravel_index(int(err.argmax()), err.shape)
            return Verdict(
                False,
                f"wrong output {spec.name}: max error {max_abs:.3g} = {max_abs / scale:.3g} x scale {scale:.3g} "
                f"at {tuple(int(i) for i in idx)} (got {float(out[idx]):.6g}, want {float(ref64[idx]):.6g})",
                max_abs, max_abs / scale,
            )
    if repeat_outputs:
        for out, rep, spec in zip(outputs, repeat_outputs, output_specs):
            if not np.array_equal(np.asarray(out), np.asarray(rep)):
                return Verdict(False, f"nondeterministic: output {spec.name} differs between two runs of the same input", worst_abs, worst_rel)
    return Verdict(True, "", worst_abs, worst_rel)


# ---------------------------------------------------------------------------------------------
# Local measurement in a child process
# ---------------------------------------------------------------------------------------------


def _package_root() -> str:
    import edgetune

    return str(Path(edgetune.__file__).resolve().parent.parent)


class LocalMeasure:
    """Measure kernels on this host in a child process through the TVM runtime.

    The child stays up between kernels (TVM import costs ~1 s) and is restarted after a crash or
    a timeout. Timing follows the agent protocol: warm-up discarded, then
    ``clamp(budget_ms / estimate, min_iters, max_iters)`` iterations timed one by one.
    """

    def __init__(
        self,
        *,
        device: str = "cpu",
        num_threads: int | None = None,
        warmup_ms: float = 10.0,
        budget_ms: float = 100.0,
        min_iters: int = 3,
        max_iters: int = 100_000,
        timeout_s: float = 60.0,
        python: str | None = None,
    ) -> None:
        self.device = device
        self.num_threads = num_threads
        self.warmup_ms, self.budget_ms = float(warmup_ms), float(budget_ms)
        self.min_iters, self.max_iters = int(min_iters), int(max_iters)
        self.timeout_s = float(timeout_s)
        self.python = python or sys.executable
        self._root = Path(tempfile.mkdtemp(prefix="edgetune-localmeasure-"))
        self._proc: subprocess.Popen | None = None
        self._stderr_path = self._root / "worker.stderr"
        self._buf = b""
        self.jobs = 0

    # -- worker lifecycle ---------------------------------------------------------------------
    def _start(self) -> subprocess.Popen:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [_package_root(), env.get("PYTHONPATH")]))
        if self.num_threads:
            env["TVM_NUM_THREADS"] = str(self.num_threads)
        self._stderr_file = open(self._stderr_path, "ab")
        self._buf = b""
        self._proc = subprocess.Popen(
            [self.python, "-m", "edgetune.kernels._local_worker"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr_file,
            env=env, start_new_session=True,
        )
        return self._proc

    def _kill(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                proc.kill()
        proc.wait()
        for stream in (proc.stdin, proc.stdout):
            try:
                stream.close()
            except OSError:
                pass
        self._stderr_file.close()

    def close(self) -> None:
        proc = self._proc
        if proc is not None and proc.poll() is None:
            try:
                proc.stdin.close()
                proc.wait(timeout=5)
            except (OSError, subprocess.TimeoutExpired):
                pass
        self._kill()
        shutil.rmtree(self._root, ignore_errors=True)

    def __enter__(self) -> "LocalMeasure":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:  # best effort; close() is the contract
        try:
            self._kill()
        except Exception:  # noqa: BLE001
            pass

    def _stderr_tail(self) -> str:
        try:
            data = self._stderr_path.read_bytes()[-1500:]
        except OSError:
            return ""
        return data.decode("utf-8", "replace").strip()

    def _wait_done(self, proc: subprocess.Popen, marker: bytes, deadline: float) -> str:
        """'done' | 'eof' | 'timeout'."""
        sel = selectors.DefaultSelector()
        sel.register(proc.stdout, selectors.EVENT_READ)
        try:
            while True:
                while b"\n" in self._buf:
                    line, self._buf = self._buf.split(b"\n", 1)
                    if line.strip() == marker:
                        return "done"
                left = deadline - time.monotonic()
                if left <= 0:
                    return "timeout"
                if not sel.select(timeout=left):
                    continue
                chunk = os.read(proc.stdout.fileno(), 65536)
                if not chunk:
                    return "eof"
                self._buf += chunk
        finally:
            sel.close()

    # -- one measurement ----------------------------------------------------------------------
    def __call__(self, artifact_path: str, inputs: list[np.ndarray], output_specs: Sequence[TensorSpec]) -> KernelRun:
        self.jobs += 1
        jobdir = self._root / f"job{self.jobs}"
        jobdir.mkdir()
        try:
            names = []
            for k, x in enumerate(inputs):
                np.save(jobdir / f"in_0_{k}.npy", np.ascontiguousarray(x))
                names.append(f"in_0_{k}.npy")
            artifact = Path(artifact_path).resolve()
            request = {
                "protocol": 1, "backend": "tvm-kernel", "artifact": str(artifact),
                "artifact_sha256": hashlib.sha256(artifact.read_bytes()).hexdigest(),
                "params": {"device": self.device},
                "input_names": [f"arg{k}" for k in range(len(inputs))], "inputs": [names],
                "outputs": [
                    {"name": s.name, "dtype": s.dtype, "shape": list(s.shape)} for s in output_specs
                ],
                "timing_set": 0, "warmup_ms": self.warmup_ms, "budget_ms": self.budget_ms,
                "min_iters": self.min_iters, "max_iters": self.max_iters,
            }
            (jobdir / "request.json").write_text(json.dumps(request))
            proc = self._proc if self._proc is not None and self._proc.poll() is None else self._start()
            try:
                proc.stdin.write(f"{jobdir}\n".encode())
                proc.stdin.flush()
            except BrokenPipeError:
                pass  # the worker is gone; _wait_done sees EOF
            state = self._wait_done(proc, f"EDGETUNE-DONE {jobdir}".encode(), time.monotonic() + self.timeout_s)
            if state == "timeout":
                self._kill()
                return KernelRun("timeout", f"no result within {self.timeout_s:g} s; kernel process killed")
            if state == "eof":
                rc = proc.wait()
                self._kill()
                how = f"signal {signal.Signals(-rc).name}" if rc < 0 else f"exit status {rc}"
                tail = self._stderr_tail().splitlines()[-3:]
                return KernelRun("crashed", f"kernel process died ({how})" + (": " + " | ".join(tail) if tail else ""))
            result = json.loads((jobdir / "result.json").read_text())
            if result.get("status") != "ok":
                return KernelRun("error", str(result.get("reason", "unknown error")))
            outputs = [np.load(jobdir / n) for n in result["outputs"][0]]
            repeats = [np.load(jobdir / n) for n in result.get("repeat_outputs", [])]
            return KernelRun("ok", "", [int(s) for s in result["samples_ns"]], outputs, repeats, result.get("load_ms"))
        finally:
            shutil.rmtree(jobdir, ignore_errors=True)


# ---------------------------------------------------------------------------------------------
# The MetaSchedule runner
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TrialRecord:
    """One measured candidate: status is 'ok', 'wrong' (failed verification), 'error', 'crashed' or 'timeout'."""

    index: int
    status: str
    reason: str = ""
    median_ns: float | None = None
    gflops: float | None = None
    max_abs_err: float | None = None
    max_rel_err: float | None = None
    samples: int = 0

    def as_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


def _arg_specs_match(args_info, specs: Sequence[TensorSpec]) -> str:
    got = [a.as_json() for a in args_info]
    want = [["TENSOR", s.dtype, list(s.shape)] for s in specs]
    got = [[g[0], str(g[1]), [int(d) for d in g[2]]] for g in got]
    return "" if got == want else f"kernel arguments {got} do not match the workload's {want}"


def _make_runner_class():
    """Define EdgetuneRunner lazily so importing this module does not import TVM."""
    from tvm.ir.utils import derived_object
    from tvm.s_tir.meta_schedule.runner import PyRunner, RunnerResult
    from tvm.s_tir.meta_schedule.runner.local_runner import LocalRunnerFuture

    @derived_object
    class EdgetuneRunner(PyRunner):
        """MetaSchedule runner: measure through ``measure``, verify, report to MetaSchedule.

        Only a verified kernel's median time reaches MetaSchedule; everything else is a
        RunnerResult with ``error_msg``, which the database stores as a failed record.
        """

        def __init__(
            self,
            measure: Callable[..., KernelRun],
            workload: KernelWorkload,
            *,
            seed: int = 0,
            rtol: float = 1e-4,
            progress_cb: Callable[[int, float], None] | None = None,
        ) -> None:
            super().__init__()
            self.measure = measure
            self.workload = workload
            self.rtol = rtol
            self.progress_cb = progress_cb
            self.inputs = workload.random_inputs(seed)
            self.reference = workload.reference(self.inputs)
            self.flops = workload.flops()
            self.records: list[TrialRecord] = []
            self.best_gflops = 0.0

        def measure_one(self, artifact_path: str, args_info=None) -> TrialRecord:
            index = len(self.records)
            specs = list(self.workload.inputs) + list(self.workload.outputs)
            mismatch = _arg_specs_match(args_info, specs) if args_info is not None else ""
            if mismatch:
                return TrialRecord(index, "error", mismatch)
            try:
                run = self.measure(artifact_path, [x.copy() for x in self.inputs], list(self.workload.outputs))
            except Exception as exc:  # noqa: BLE001 - a measurement failure is a result
                return TrialRecord(index, "error", f"measure raised {type(exc).__name__}: {exc}")
            if run.status != "ok":
                return TrialRecord(index, run.status, run.reason or run.status)
            verdict = verify_outputs(run.outputs, self.reference, self.workload.outputs,
                                     rtol=self.rtol, repeat_outputs=run.repeat_outputs)
            if not verdict.ok:
                return TrialRecord(index, "wrong", verdict.reason, max_abs_err=verdict.max_abs_err,
                                   max_rel_err=verdict.max_rel_err, samples=len(run.samples_ns))
            if not run.samples_ns:
                return TrialRecord(index, "error", "no timing samples")
            median = float(np.median(run.samples_ns))
            return TrialRecord(index, "ok", "", median, self.flops / median, verdict.max_abs_err,
                               verdict.max_rel_err, len(run.samples_ns))

        def run(self, runner_inputs):
            futures = []
            for runner_input in runner_inputs:
                rec = self.measure_one(str(runner_input.artifact_path), runner_input.args_info)
                self.records.append(rec)
                if rec.status == "ok":
                    self.best_gflops = max(self.best_gflops, rec.gflops or 0.0)
                    futures.append(LocalRunnerFuture(res=[rec.median_ns / 1e9], error_message=None))
                else:
                    futures.append(LocalRunnerFuture(res=None, error_message=f"edgetune {rec.status}: {rec.reason}"))
                if self.progress_cb is not None:
                    self.progress_cb(len(self.records), self.best_gflops)
            return futures

    return EdgetuneRunner


_RUNNER_CLASS = None


def EdgetuneRunner(measure, workload, **kwargs):  # noqa: N802 - a class to the caller
    """``EdgetuneRunner(measure, workload, seed=0, rtol=1e-4, progress_cb=None)`` (a MetaSchedule PyRunner)."""
    global _RUNNER_CLASS
    if _RUNNER_CLASS is None:
        _RUNNER_CLASS = _make_runner_class()
    return _RUNNER_CLASS(measure, workload, **kwargs)


# ---------------------------------------------------------------------------------------------
# Database and tuning
# ---------------------------------------------------------------------------------------------


def _slug(text: str, limit: int = 48) -> str:
    s = re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("_")[:limit] or "x"
    return f"{s}-{hashlib.sha256(text.encode()).hexdigest()[:10]}"


def target_key(target) -> str:
    """A stable short name for a TVM target: kind + hash of its full JSON."""
    from edgetune.build.tvm_kernel import as_tvm_target

    tgt = as_tvm_target(target)
    text = json.dumps(tgt.export(), sort_keys=True, default=str)
    return f"{tgt.kind.name}-{hashlib.sha256(text.encode()).hexdigest()[:12]}"


def database_dir(db_dir: str | os.PathLike, fingerprint: str, target, *, cross_cc: str | None = None,
                 threads: int | None = None) -> Path:
    """``db_dir/<fingerprint slug>/<target key>/<build identity key>``: records never mix across
    devices, targets, TVM versions, edgetune versions, compilers (``cross_cc`` as resolved for the
    target: path + ``--version``) or kernel thread counts (``threads``; default: the target's
    ``num-cores``, else this host's CPU count, which is what the default measurer uses)."""
    from edgetune.build.identity import build_identity, identity_key
    from edgetune.build.tvm_kernel import as_tvm_target, resolve_cross_cc

    tgt = as_tvm_target(target)
    identity = build_identity(resolve_cross_cc(tgt, cross_cc), threads or _num_cores(tgt))
    return Path(db_dir) / _slug(fingerprint) / target_key(tgt) / identity_key(identity)


def open_database(path: str | os.PathLike):
    from tvm.s_tir.meta_schedule.database import JSONDatabase

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    return JSONDatabase(str(path / "workloads.json"), str(path / "records.json"), allow_missing=True)


def workload_records(db, mod) -> list:
    """All records (valid and failed) of ``mod`` in ``db``."""
    import tvm_ffi

    return [r for r in db.get_all_tuning_records() if tvm_ffi.structural_equal(r.workload.mod, mod)]


def quiet_metaschedule_console() -> None:
    """MetaSchedule prints its task tables to stdout at DEBUG unless its logger has a level;
    keep the console to warnings (its log files under the database's logs/ keep everything)."""
    import logging

    global _QUIETED
    ms_logger = logging.getLogger("tvm.s_tir.meta_schedule")
    # MetaSchedule's logging config resets the level to DEBUG after each run: re-quiet what we quieted
    if ms_logger.level == logging.NOTSET or _QUIETED:
        ms_logger.setLevel(logging.WARNING)
        _QUIETED = True
    # MetaSchedule re-lists this logger's handlers by name in its dictConfig; an unnamed one
    # (e.g. added by a test harness or an application) makes it crash on None.format().
    for handler in list(ms_logger.handlers):
        if handler.get_name() is None:
            ms_logger.removeHandler(handler)


_QUIETED = False


def search_strategy(trials: int):
    """MetaSchedule's evolutionary search, scaled down for small trial budgets.

    The defaults (population 512, 4 genetic iterations, 50 random unmeasured seeds) cost tens of
    seconds of cost-model work per batch, which only pays off for hundreds of trials.
    """
    from tvm.s_tir.meta_schedule.search_strategy import EvolutionarySearch

    if trials >= 256:
        return EvolutionarySearch()
    population = max(64, min(512, 8 * trials))
    return EvolutionarySearch(population_size=population, init_min_unmeasured=min(50, population // 2),
                              genetic_num_iters=2 if trials < 64 else 3)


@dataclass(frozen=True)
class TuneOutcome:
    """Result of tuning one workload on one device.

    ``best_*`` and ``artifact_path`` are set only when the selected kernel, exported again,
    passed verification on a second, independent input set (``verified``).
    """

    workload_key: str
    target_key: str
    best_gflops: float | None
    best_latency_ns: float | None
    artifact_path: Path | None
    records: list[TrialRecord]
    verified: bool
    reason: str = ""
    final_run: KernelRun | None = None
    trials_measured: int = 0
    reused_records: int = 0
    tuning_seconds: float = 0.0
    db_path: Path | None = None


def _num_cores(tgt) -> int:
    try:
        return int(tgt.attrs.get("num-cores", 0)) or (os.cpu_count() or 1)
    except Exception:  # noqa: BLE001
        return os.cpu_count() or 1


def default_measure(target) -> LocalMeasure:
    """A LocalMeasure for a target this host can run; UserInputError for anything else."""
    from edgetune.build.tvm_kernel import _HOST_ARCH, as_tvm_target, target_arch

    tgt = as_tvm_target(target)
    if tgt.kind.name == "cuda":
        return LocalMeasure(device="cuda")
    if tgt.kind.name != "llvm" or target_arch(tgt) != _HOST_ARCH:
        raise UserInputError(
            f"kernels for {tgt.kind.name}/{target_arch(tgt)} cannot run on this {_HOST_ARCH} host: "
            "pass the device's measure (agent) instead"
        )
    return LocalMeasure(num_threads=_num_cores(tgt))


def tune_workload(
    workload: KernelWorkload,
    target,
    trials: int,
    measure: Callable[..., KernelRun] | None = None,
    db_dir: str | os.PathLike | None = None,
    progress_cb: Callable[[int, float], None] | None = None,
    *,
    fingerprint: str = "local",
    cross_cc: str | None = None,
    export_path: str | os.PathLike | None = None,
    seed: int = 0,
    verify_seed: int = 1,
    rtol: float = 1e-4,
    num_trials_per_iter: int = 64,
    strategy=None,
    search_seed: int | None = None,
    builder_workers: int | None = None,
    build_timeout_s: float = 60.0,
) -> TuneOutcome:
    """Tune ``workload`` for ``target`` with MetaSchedule, measuring through ``measure``.

    * ``target``: a tvm_target dict (targets/*.toml) or tvm.target.Target.
    * ``trials``: total measured candidates wanted for this workload on this device; records
      already in the database count, so a rerun with the same ``trials`` measures nothing new.
    * ``measure``: ``measure(artifact_path, inputs, output_specs) -> KernelRun``; default: a
      LocalMeasure (only for targets this host runs).
    * ``db_dir``: root of the tuning databases; records go to ``database_dir(db_dir, fingerprint, target)``.
    * ``progress_cb(trials_done, best_gflops_so_far)`` after every measured candidate.
    * ``seed``: the verification inputs; ``search_seed`` (default ``seed``): MetaSchedule's own
      sampling, varied by callers that tune one workload in several calls.

    The best valid record is rebuilt, exported to ``export_path`` (default: under the database
    dir), and measured again on a second seeded input set; only if that verifies is it reported.
    """
    import tvm
    from tvm.s_tir import meta_schedule as ms

    from edgetune.build.tvm_kernel import (
        as_tvm_target, compile_module, export_module, import_tensor_intrinsics, ms_build, ms_export_function,
        resolve_cross_cc,
    )

    if trials < 0:
        raise UserInputError(f"trials must be >= 0, got {trials}")
    tgt = as_tvm_target(target)
    cc_name = resolve_cross_cc(tgt, cross_cc)
    import_tensor_intrinsics()
    quiet_metaschedule_console()
    root = Path(db_dir) if db_dir is not None else Path(tempfile.mkdtemp(prefix="edgetune-msdb-"))
    db_path = database_dir(root, fingerprint, tgt, cross_cc=cc_name, threads=getattr(measure, "num_threads", None))
    db = open_database(db_path)
    mod = workload.ir_module()
    reused = len(workload_records(db, mod))
    remaining = max(0, trials - reused)
    own_measure = measure is None
    if own_measure:
        measure = default_measure(tgt)
    t0 = time.perf_counter()
    try:
        runner = EdgetuneRunner(measure, workload, seed=seed, rtol=rtol, progress_cb=progress_cb)
        if remaining > 0:
            builder = ms.builder.LocalBuilder(
                max_workers=builder_workers or _num_cores(tgt), timeout_sec=build_timeout_s,
                f_build=ms_build, f_export=ms_export_function(cc_name),
            )
            ms.tune_tir(
                mod, tgt, str(db_path / "logs"), max_trials_global=remaining,
                num_trials_per_iter=max(1, min(num_trials_per_iter, remaining)),
                builder=builder, runner=runner, database=db, seed=seed if search_seed is None else search_seed,
                strategy=strategy if strategy is not None else search_strategy(remaining),
                num_tuning_cores=builder_workers or _num_cores(tgt),
            )
        tuning_seconds = time.perf_counter() - t0
        records = list(runner.records)
        common = dict(workload_key=workload.key(), target_key=target_key(tgt), records=records,
                      trials_measured=len(records), reused_records=reused, tuning_seconds=tuning_seconds,
                      db_path=db_path)
        sch = db.query_schedule(mod, tgt, workload_name="main")
        if sch is None:
            return TuneOutcome(best_gflops=None, best_latency_ns=None, artifact_path=None, verified=False,
                               reason="no verified candidate in the database", **common)
        out = Path(export_path) if export_path else db_path / "artifacts" / f"{_slug(workload.key())}.so"
        export_module(compile_module(sch.mod, tgt), out, cc_name)
        # An independent input set: the selected kernel must hold up on inputs it was not picked on.
        check = EdgetuneRunner(measure, workload, seed=verify_seed, rtol=rtol)
        final = check.measure_one(str(out))
        if final.status != "ok":
            return TuneOutcome(best_gflops=None, best_latency_ns=None, artifact_path=None, verified=False,
                               reason=f"selected kernel failed re-verification: {final.status}: {final.reason}",
                               **common)
        return TuneOutcome(best_gflops=final.gflops, best_latency_ns=final.median_ns, artifact_path=out,
                           verified=True, final_run=None, **common)
    finally:
        if own_measure:
            measure.close()
