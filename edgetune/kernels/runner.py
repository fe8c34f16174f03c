"""The MetaSchedule runner (``tvm.s_tir.meta_schedule.runner.PyRunner``): every built candidate is
measured through a ``Measure`` and verified (``verify_run``) before MetaSchedule sees a time. A
kernel that is wrong, crashes, hangs or errors comes back as a failed ``RunnerResult`` (with
``error_msg``), so the tuning database stores it as failed and it is never selected."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from edgetune.kernels.measurement import KernelRun, verify_run
from edgetune.ops.base import KernelWorkload, TensorSpec


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
            progress_cb: Callable[[int, float], None] | None = None,
        ) -> None:
            super().__init__()
            self.measure = measure
            self.workload = workload
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
            verdict = verify_run(run, self.workload, self.inputs, self.reference,
                                 peak_gflops=getattr(self.measure, "peak_gflops", None),
                                 timings_trusted=getattr(self.measure, "timings_trusted", True))
            if not verdict.ok:
                return TrialRecord(index, "wrong", f"{verdict.code}: {verdict.reason}", max_abs_err=verdict.max_abs_err,
                                   max_rel_err=verdict.max_rel_err, samples=len(run.samples_ns))
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
    """``EdgetuneRunner(measure, workload, seed=0, progress_cb=None)`` (a MetaSchedule PyRunner)."""
    global _RUNNER_CLASS
    if _RUNNER_CLASS is None:
        _RUNNER_CLASS = _make_runner_class()
    return _RUNNER_CLASS(measure, workload, **kwargs)


