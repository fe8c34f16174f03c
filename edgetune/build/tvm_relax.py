"""Build whole ONNX models with TVM Relax, untuned ("tvm-relax") or MetaSchedule-tuned ("tvm-tuned").

The artifact is one shared library holding the Relax VM executable and its kernels. How a
device-side runner (device_agents/python, backend ``tvm-relax``) executes it::

    import tvm
    from tvm import relax

    lib = tvm.runtime.load_module(path)
    vm = relax.VirtualMachine(lib, tvm.cpu())          # tvm.cuda(0) for CUDA builds
    out = vm["main"](*[tvm.runtime.tensor(x) for x in inputs])   # inputs: numpy arrays, graph order
    outputs = [out.numpy()] if hasattr(out, "numpy") else [o.numpy() for o in out]

(TVM 0.27: ``tvm.nd.array`` became ``tvm.runtime.tensor``; weights are bound into the library,
so ``main`` takes only the graph inputs.)

Tuning: ``tune_relax_model`` extracts the model's fused kernels (edgetune.kernels.workloads),
tunes each with ``edgetune.kernels.search.tune_workload`` (verified, pluggable measurement) into
one MetaSchedule database per device fingerprint, target and build identity (edgetune and TVM
versions, compiler, threads: ``edgetune.build.identity``), then builds with that database
applied to the fused module, the same pipeline extraction used, so records match.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from edgetune.build.tvm_kernel import as_tvm_target, export_module, import_tensor_intrinsics, is_gpu, resolve_cross_cc
from edgetune.errors import ToolchainError
from edgetune.kernels.allocate import TrialAllocator
from edgetune.kernels.search import database_dir, default_measure, open_database, tune_workload
from edgetune.kernels.workloads import extract_onnx_tasks, load_onnx_relax, relax_fuse_passes, relax_prepare


def _relax_pipeline(target, database=None, counter: dict | None = None):
    """Legalize + fuse (as task extraction does), apply ``database`` if any, default GPU
    schedules for whatever is left, then the target's standard lowering and finalization."""
    import tvm
    from tvm import relax
    from tvm.relax import pipeline as rp
    from tvm.relax.transform import MetaScheduleApplyDatabase

    tgt = as_tvm_target(target)
    try:
        dispatch = rp.library_dispatch_passes(tgt)
    except (ValueError, AttributeError):
        dispatch = []
    try:
        lower = rp.dataflow_lower_passes(tgt)
        finalize = rp.finalize_passes(tgt)
    except (ValueError, AttributeError):
        # 0.27's cpu_generic backend lacks these helpers: the same lists compile_relax falls back to
        lower = [
            relax.transform.RewriteDataflowReshape(),
            relax.transform.ToNonDataflow(),
            relax.transform.RemovePurityChecking(),
            relax.transform.CallTIRRewrite(),
        ]
        finalize = [
            relax.transform.StaticPlanBlockMemory(),
            relax.transform.LowerAllocTensor(),
            relax.transform.KillAfterLastUse(),
            relax.transform.LowerRuntimeBuiltin(),
            relax.transform.ComputePrimValue(),
            relax.transform.VMShapeLower(),
            relax.transform.AttachGlobalSymbol(),
        ]

    @tvm.transform.module_pass(opt_level=0, name="EdgetuneRelaxPipeline")
    def _pipeline(mod, _ctx):
        mod = tvm.transform.Sequential(
            [
                *dispatch,
                *relax_fuse_passes(),  # exactly extraction's list, so the tuned records match
            ]
        )(mod)
        if database is not None:
            mod = MetaScheduleApplyDatabase(enable_warning=False)(mod)
            if counter is not None:
                counter["tuned_functions"] = sum(
                    1
                    for f in mod.functions.values()
                    if isinstance(f, tvm.tirx.PrimFunc) and f.attrs is not None and bool(f.attrs.get("tirx.is_scheduled", False))
                )
        if is_gpu(tgt):
            from tvm.s_tir import dlight as dl

            mod = dl.ApplyDefaultSchedule(
                dl.gpu.Matmul(), dl.gpu.GEMV(), dl.gpu.Reduction(), dl.gpu.GeneralReduction(), dl.gpu.Fallback()
            )(mod)
        return tvm.transform.Sequential([*lower, *finalize])(mod)

    return _pipeline


def build_relax_model(
    onnx_path: str | os.PathLike,
    input_shapes: Mapping[str, Sequence[int]],
    target: Any,
    out_path: str | os.PathLike,
    tuning_db_dir: str | os.PathLike | None = None,
    *,
    cross_cc: str | None = None,
    info: dict | None = None,
) -> Path:
    """Compile ``onnx_path`` with static ``input_shapes`` for ``target`` into ``out_path`` (.so).

    ``tuning_db_dir``: a MetaSchedule database directory (``search.database_dir(root,
    fingerprint, target, cross_cc=..., threads=...)``, keyed by the build identity too) whose
    records are applied; None builds with default schedules.
    ``info`` (optional dict) receives ``tuned_functions``: how many kernels came from the database.
    """
    import tvm
    from tvm import relax

    tgt = as_tvm_target(target)
    cc_name = resolve_cross_cc(tgt, cross_cc)
    mod = relax_prepare(load_onnx_relax(onnx_path, input_shapes))
    counter: dict = {"tuned_functions": 0}
    try:
        if tuning_db_dir is not None:
            import_tensor_intrinsics(tgt)
            db = open_database(tuning_db_dir)
            with tgt, db, tvm.transform.PassContext(opt_level=3):
                ex = relax.build(mod, target=tgt, relax_pipeline=_relax_pipeline(tgt, db, counter))
        else:
            with tvm.transform.PassContext(opt_level=3):
                ex = relax.build(mod, target=tgt, relax_pipeline=_relax_pipeline(tgt))
    except Exception as exc:  # noqa: BLE001 - TVM's compile errors have many types
        raise ToolchainError(f"TVM Relax failed to compile {Path(onnx_path).name} for {tgt.kind.name}: {exc}") from exc
    if info is not None:
        info.update(counter)
    return export_module(ex, out_path, cc_name)


@dataclass(frozen=True)
class RelaxTuneOutcome:
    artifact_path: Path
    db_path: Path
    tasks: list = field(default_factory=list)  # list[tuple[TirWorkload, TuneOutcome | None]]
    tuned_functions: int = 0


def tune_relax_model(
    onnx_path: str | os.PathLike,
    input_shapes: Mapping[str, Sequence[int]],
    target: Any,
    trials: int,
    db_dir: str | os.PathLike,
    measure: Callable | None = None,
    *,
    fingerprint: str = "local",
    out_path: str | os.PathLike | None = None,
    cross_cc: str | None = None,
    progress_cb: Callable[[str, int, float], None] | None = None,
    seed: int = 0,
    allocation: str = "even",
) -> RelaxTuneOutcome:
    """Tune every compute kernel of the model (``trials`` in total; pure data movement such as
    reshape keeps its default schedule), then build with the database applied ("tvm-tuned").

    Trials are shared by ``edgetune.kernels.allocate.TrialAllocator``. ``allocation="even"``
    (default): trials // kernels each, in one MetaSchedule call per kernel, the remainder to the
    slowest kernel. ``"weighted"``: half evenly, the rest in chunks to whichever kernel costs the
    model the most time (weight × best latency so far). Measured side by side at 256 trials on
    the bundled MobileNet (tools/bench/bench_model_tuning.py), "weighted" did not beat "even"
    (0.92× [0.90, 0.94]): many short searches restart MetaSchedule's cost model cold; so "even"
    stays the default and "weighted" is there to be measured again.
    Each call asks ``tune_workload`` for a cumulative count, so records already in the database
    count and a rerun measures nothing new. ``progress_cb(task_name, trials_done, best_gflops)``
    (trials_done: that kernel's records so far, across calls).
    """
    tgt = as_tvm_target(target)
    tasks = extract_onnx_tasks(onnx_path, input_shapes, tgt)
    # keyed by position: task names are unique in practice, but nothing here depends on it
    compute = {f"{i}:{t.name}": t for i, t in enumerate(tasks) if t.flops() > 0}
    if allocation not in ("weighted", "even"):
        raise ValueError(f"allocation must be 'weighted' or 'even', got {allocation!r}")
    alloc = TrialAllocator({name: max(1, t.weight) for name, t in compute.items()}, max(0, trials),
                           first_share=1.0 if allocation == "even" else 0.5)
    own = measure is None
    if own and compute and trials > 0:
        measure = default_measure(tgt)
    latest: dict[str, object] = {}

    def run(name: str, target_trials: int) -> None:
        task = compute[name]
        before = latest[name].trials_measured + latest[name].reused_records if name in latest else 0
        cb = (lambda n, g, _name=task.name: progress_cb(_name, before + n, g)) if progress_cb else None
        outcome = tune_workload(task, tgt, target_trials, measure, db_dir, cb, fingerprint=fingerprint,
                                cross_cc=cross_cc, seed=seed, search_seed=seed + target_trials)
        latest[name] = outcome
        alloc.report(name, outcome.best_latency_ns if outcome.verified else None)

    try:
        for name, target_trials in alloc.first_round().items():
            run(name, target_trials)
        while (step := alloc.next_chunk()) is not None:
            run(*step)
    finally:
        if own and measure is not None:
            measure.close()
    results = [(t, latest.get(f"{i}:{t.name}")) for i, t in enumerate(tasks)]
    # the same directory tune_workload chose: same compiler, same measurer threads
    db_path = database_dir(db_dir, fingerprint, tgt, cross_cc=cross_cc, threads=getattr(measure, "num_threads", None))
    out = Path(out_path) if out_path else db_path / "models" / f"{Path(onnx_path).stem}-tuned.so"
    info: dict = {}
    artifact = build_relax_model(onnx_path, input_shapes, tgt, out, tuning_db_dir=db_path, cross_cc=cross_cc, info=info)
    return RelaxTuneOutcome(artifact, db_path, results, info.get("tuned_functions", 0))
