"""MetaSchedule kernel search: the loop only.

MetaSchedule proposes schedules and builds them (``LocalBuilder``, cross-compiling for the
device); the runner (``edgetune.kernels.runner.EdgetuneRunner``) measures each built kernel on the
device through a ``Measure`` (``edgetune.kernels.measurement``) and verifies it before MetaSchedule
sees a time; records live in a database per device and build identity
(``edgetune.kernels.database``). Entry point: ``tune_workload``.
"""

from __future__ import annotations

import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from edgetune import tvm_without_torch
from edgetune.build.tvm_kernel import (
    HOST_ARCH, as_tvm_target, compile_module, export_module, import_tensor_intrinsics, ms_build, ms_export_function,
    resolve_cross_cc, target_arch,
)
from edgetune.errors import UserInputError
from edgetune.kernels.database import num_cores, slug, database_dir, open_database, target_key, workload_records
from edgetune.kernels.device_measure import LocalMeasure
from edgetune.kernels.measurement import CudaLocalMeasure, KernelRun, Measure, verify_run
from edgetune.kernels.runner import EdgetuneRunner, TrialRecord
from edgetune.ops.base import KernelWorkload

__all__ = ["CudaLocalMeasure", "EdgetuneRunner", "KernelRun", "LocalMeasure", "Measure", "TrialRecord", "TuneOutcome",
           "database_dir", "default_measure", "open_database", "target_key", "tune_workload", "verify_run",
           "workload_records"]


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


def cost_model(trials: int, num_tuning_cores: int):
    """MetaSchedule's cost model for one call that measures ``trials`` candidates.

    Its XGBoost model predicts uniform random scores until it holds ``num_warmup_samples`` measured
    candidates (100), yet it retrains after every batch (about 200 boosting rounds, seconds on a
    small board). A call that measures no more than that never uses one trained prediction, so it
    gets the random model: the same search, without the training.
    """
    from tvm.s_tir.meta_schedule.cost_model import RandomModel, XGBModel

    xgb = XGBModel(num_tuning_cores=num_tuning_cores)
    return RandomModel() if trials <= xgb.num_warmup_samples else xgb


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


def _tensorcore_rules():
    """MetaSchedule's "cuda-tensorcore" schedule rules with one change: the wmma accumulator is
    staged through static shared memory instead of dynamic. TVM 0.27 merges every dynamic shared
    buffer of a kernel into one, and when the float32 accumulator shares it with the float16
    operands, lowering fails (``tvm_access_ptr element type must match the source buffer``): 32 of
    40 sampled schedules of a float16 GEMM with float32 accumulation for sm_80, against 0 of 40
    with this rule set (tests/unit/test_gpu_device.py). Everything else is TVM's default: the
    operands in dynamic shared memory, the same tiling structure, bindings and reuse levels, the
    mma.sync rule with its software pipeline, and the plain CUDA rules after them."""
    from tvm.s_tir import meta_schedule as ms
    from tvm.s_tir.tensor_intrin.cuda import get_wmma_intrin_group

    rule = ms.schedule_rule
    tiling = dict(structure="SSSRRSRS", tile_binds=["blockIdx.y", "blockIdx.x", "threadIdx.y"],
                  max_innermost_factor=4, vector_load_lens=[1, 2, 3, 4, 8, 16])
    wmma = [get_wmma_intrin_group("shared.dyn", "shared", i, o, trans_b)
            for i, o in (("float16", "float32"), ("float16", "float16"), ("int8", "int32")) for trans_b in (False, True)]
    mma = [{"init": f"mma_init_m16n8k8_{acc}", "load_a": "mma_load_m16n8k8_f16_A_shared_dyn",
            "load_b": "mma_load_m16n8k8_f16_B_shared_dyn", "compute": f"mma_sync_m16n8k8_f16f16{acc}",
            "store": f"mma_store_m16n8k8_{acc}_global"} for acc in ("f16", "f32")]
    return [
        rule.ApplyCustomRule(),
        rule.MultiLevelTilingTensorCore(
            intrin_groups=wmma, **tiling, use_software_pipeline=False,
            reuse_read=rule.ReuseType(req="must", levels=[4], scope="shared.dyn"),
            reuse_write=rule.ReuseType(req="must", levels=[2], scope="shared")),
        rule.MultiLevelTilingTensorCore(
            intrin_groups=mma, **tiling, use_software_pipeline=True,
            reuse_read=rule.ReuseType(req="must", levels=[4], scope="shared.dyn"),
            reuse_write=rule.ReuseType(req="no", levels=[2], scope="shared.dyn")),
        *list(rule.ScheduleRule.create("cuda"))[1:],
    ]


def design_space(tgt, workload):
    """MetaSchedule's design space for ``workload`` on ``tgt``: on a CUDA GPU of sm_70 or later,
    float16 operands get the tensor-core rules (wmma fragments, MultiLevelTilingTensorCore, its
    postprocessors and mutators; see _tensorcore_rules); anything else the target's own defaults."""
    from tvm.s_tir import meta_schedule as ms

    half = any(getattr(s, "dtype", "") == "float16" for s in getattr(workload, "inputs", ()))
    arch = str(tgt.attrs.get("arch", "")) if tgt.kind.name == "cuda" else ""
    sm = int(arch[3:]) if arch.startswith("sm_") and arch[3:].isdigit() else 0
    if half and sm >= 70:
        import_tensor_intrinsics(tgt)
        return ms.space_generator.PostOrderApply(sch_rules=_tensorcore_rules(), postprocs="cuda-tensorcore",
                                                 mutator_probs="cuda-tensorcore")
    return "post-order-apply"


def default_measure(target):
    """A measurer for a target this host runs (the native agent on ``local``; CUDA: the legacy
    worker); UserInputError for anything else."""
    tgt = as_tvm_target(target)
    if tgt.kind.name == "cuda":
        return CudaLocalMeasure(device="cuda")
    if tgt.kind.name != "llvm" or target_arch(tgt) != HOST_ARCH:
        raise UserInputError(
            f"kernels for {tgt.kind.name}/{target_arch(tgt)} cannot run on this {HOST_ARCH} host: "
            "pass the device's measure (agent) instead"
        )
    return LocalMeasure(num_threads=num_cores(tgt))


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
    from tvm.s_tir import meta_schedule as ms

    if trials < 0:
        raise UserInputError(f"trials must be >= 0, got {trials}")
    tgt = as_tvm_target(target)
    cc_name = resolve_cross_cc(tgt, cross_cc)
    import_tensor_intrinsics(tgt)
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
        runner = EdgetuneRunner(measure, workload, seed=seed, progress_cb=progress_cb)
        if remaining > 0:
            # its workers start without torch (tvm_without_torch): ~2 CPU s each, a pool per batch
            hide = tvm_without_torch.patch_popen_workers()
            builder = ms.builder.LocalBuilder(
                max_workers=builder_workers or num_cores(tgt), timeout_sec=build_timeout_s,
                f_build=ms_build, f_export=ms_export_function(cc_name),
                initializer=tvm_without_torch.builder_worker_init if hide else None,
            )
            ms.tune_tir(
                mod, tgt, str(db_path / "logs"), max_trials_global=remaining,
                num_trials_per_iter=max(1, min(num_trials_per_iter, remaining)),
                builder=builder, runner=runner, database=db, seed=seed if search_seed is None else search_seed,
                strategy=strategy if strategy is not None else search_strategy(remaining),
                space=design_space(tgt, workload),
                cost_model=cost_model(remaining, builder_workers or num_cores(tgt)),
                num_tuning_cores=builder_workers or num_cores(tgt),
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
        out = Path(export_path) if export_path else db_path / "artifacts" / f"{slug(workload.key())}.so"
        export_module(compile_module(sch.mod, tgt), out, cc_name)
        # An independent input set: the selected kernel must hold up on inputs it was not picked on.
        check = EdgetuneRunner(measure, workload, seed=verify_seed)
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
