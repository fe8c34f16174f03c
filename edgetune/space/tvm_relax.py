"""TVM Relax builds of the model as further runtimes.

* ``tvm-relax``: the model compiled by TVM with default (untuned) schedules, × VM threads.
* ``tvm-tuned``: the model's kernels tuned with MetaSchedule on THIS device (every measured kernel
  verified), the records applied, the model rebuilt — then measured and verified end to end like
  every other candidate. Needs ``TuneConfig.tvm_trials > 0``.

The device runs the artifact with its TVM runtime through the Python agent. Artifacts are built on
the host (cross-compiled for aarch64) and cached by model, shapes, target, device fingerprint,
trials and build identity (edgetune and TVM versions, compiler, threads: ``artifact_key``).
"""

from __future__ import annotations

import hashlib
import json
import platform
from pathlib import Path

from edgetune.agent.host import AgentInfo
from edgetune.build.identity import build_identity
from edgetune.build.tvm_kernel import resolve_cross_cc
from edgetune.build.tvm_relax import build_relax_model, tune_relax_model
from edgetune.candidate import Candidate
from edgetune.errors import EdgetuneError
from edgetune.kernels.device_measure import DeviceMeasure
from edgetune.kernels.targets import cuda_target_name, device_sm, host_target, load_target
from edgetune.space import BuildFailed, Prepared
from edgetune.space.ort import thread_counts
from edgetune.modelfile import Model
from edgetune.workload import Workload


def tvm_on_host() -> bool:
    """Whether the host can build with TVM (the optional ``tvm`` extra)."""
    try:
        import tvm  # noqa: F401
    except ImportError:
        return False
    return True


def device_target(info: AgentInfo) -> tuple[dict, str | None]:
    """The TVM target for a device (from what its agent reports) and the cross compiler if any."""
    cores = int(info.fingerprint.get("cores") or 1)
    arch = info.arch
    if arch in ("x86_64", "amd64"):
        if platform.machine() == "x86_64":
            host = host_target()
            same_cpu = info.fingerprint.get("cpu_model") and host.tvm_target.get("mcpu")
            tt = dict(host.tvm_target) if same_cpu else {"kind": "llvm", "mtriple": "x86_64-linux-gnu"}
        else:
            tt = {"kind": "llvm", "mtriple": "x86_64-linux-gnu"}
            return {**tt, "num-cores": cores}, "x86_64-linux-gnu-gcc"
        tt["num-cores"] = cores
        return tt, None
    if arch in ("aarch64", "arm64"):
        t = load_target("linux-aarch64")
        tt = dict(t.tvm_target)
        tt["num-cores"] = cores
        return tt, (None if platform.machine() == "aarch64" else (t.cross_cc or "aarch64-linux-gnu-gcc"))
    raise BuildFailed(f"no TVM target for architecture {arch}")


def gpu_target(info: AgentInfo) -> dict | None:
    """The TVM target of the device's first NVIDIA GPU (``targets/cuda-smXY.toml`` for the SM its agent
    reports), or None: no GPU, or an SM without a target."""
    name = cuda_target_name(device_sm(info.fingerprint))
    return dict(load_target(name).tvm_target) if name else None


def artifact_key(workload: Workload, info: AgentInfo, target: dict, cross_cc: str | None, tuned: bool,
                 trials: int) -> str:
    """The cache key of a tvm-relax / tvm-tuned artifact: model, shapes, target, device fingerprint,
    tuning trials, and the build identity (edgetune and TVM versions, the compiler that links it:
    path + ``--version``, and the kernel threads: the target's ``num-cores``, which tvm-tuned tunes
    with). The VM's run-time ``num_threads`` is a run parameter of one shared artifact."""
    ident = json.dumps({"model": workload.model.sha256, "shapes": {k: list(v) for k, v in workload.input_shapes.items()},
                        "target": target, "tuned": tuned, "trials": trials, "fp": info.fingerprint_key,
                        "build": build_identity(resolve_cross_cc(target, cross_cc), _threads(target, info))},
                       sort_keys=True, default=str)
    return hashlib.sha256(ident.encode()).hexdigest()[:20]


def _threads(target: dict, info: AgentInfo) -> int:
    return int(target.get("num-cores") or info.fingerprint.get("cores") or 1)


class TvmRelaxSpace:
    name = "tvm-relax"
    wants_spec = True  # tvm-tuned measures kernels on the device itself
    wants_hostwork = True  # tvm-relax builds may run on a Ray cluster (edgetune/hostwork.py)
    wants_progress = True  # and takes minutes: progress({"kernel", "trials", "best_gflops"}) as it goes
    wants_trials = True  # candidates(..., trials): TuneConfig.tvm_trials (tvm-tuned only)

    def __init__(self, tuned: bool = False):
        self.tuned = tuned
        self.backend = "tvm-tuned" if tuned else "tvm-relax"

    def available(self, model: Model, info: AgentInfo) -> bool:
        return model.format == "onnx" and "tvm" in info.runtimes and info.python is not None and tvm_on_host()

    def candidates(self, model: Model, info: AgentInfo, trials: int = 0) -> list[Candidate]:
        if not self.available(model, info) or (self.tuned and trials <= 0):
            return []
        cores = int(info.fingerprint.get("cores") or 1)
        params = {"trials": trials} if self.tuned else {}
        out = [Candidate.make(self.backend, {**params, "num_threads": n}) for n in thread_counts(cores)]
        if not self.tuned and gpu_target(info) is not None:
            # the model built for the device's GPU (TVM's default GPU schedules, DLight), run by the
            # device's TVM runtime on it (tvm-tuned stays on the CPU: its kernels are measured by
            # the native agent, which cannot run CUDA)
            out.append(Candidate.make(self.backend, {"device": "cuda"}))
        return out

    def _artifact(self, cand: Candidate, workload: Workload, info: AgentInfo, cache_dir: Path):
        if cand.param_dict.get("device") == "cuda":
            target, cross_cc = gpu_target(info), None
            if target is None:
                raise BuildFailed("no CUDA target for this device's GPU")
        else:
            target, cross_cc = device_target(info)
        trials = int(cand.param_dict.get("trials", 0))
        try:
            key = artifact_key(workload, info, target, cross_cc, self.tuned, trials)
        except EdgetuneError as exc:  # e.g. the cross compiler is not installed
            raise BuildFailed(str(exc).splitlines()[0][:300]) from exc
        return target, cross_cc, cache_dir / f"{self.backend}-{workload.model.path.stem}-{key}.so"

    def prefetch(self, cand: Candidate, workload: Workload, info: AgentInfo, cache_dir: Path, hostwork) -> None:
        """Start this candidate's build on the Ray cluster ahead of its turn (tvm-relax; tvm-tuned
        measures on the device and stays here)."""
        if self.tuned or not hostwork.remote:
            return
        try:
            target, cross_cc, out = self._artifact(cand, workload, info, cache_dir)
        except BuildFailed:
            return  # prepare says why
        hostwork.start_build(workload.model, workload.input_shapes, target, cross_cc, _threads(target, info), out)

    def prepare(self, cand: Candidate, workload: Workload, info: AgentInfo, cache_dir: Path,
                spec=None, progress=None, hostwork=None) -> Prepared:
        target, cross_cc, out = self._artifact(cand, workload, info, cache_dir)
        shapes = {k: list(v) for k, v in workload.input_shapes.items()}
        params = cand.param_dict
        trials = int(params.get("trials", 0))
        run_params = ({"device": "cuda"} if params.get("device") == "cuda"
                      else {"num_threads": params.get("num_threads", 1)})
        if out.exists():
            return Prepared("tvm-relax", out, run_params)
        cache_dir.mkdir(parents=True, exist_ok=True)
        try:
            if self.tuned:
                # kernels are measured (and verified) where the model will run: on this device's
                # native agent; only the host itself may use the in-process local measurer
                measure = None
                if spec is not None and spec.kind != "local":
                    measure = DeviceMeasure(spec)
                try:
                    cb = None
                    if progress is not None:
                        def cb(kernel: str, done: int, best: float | None) -> None:
                            progress({"kernel": kernel, "trials": done, "best_gflops": best})
                    tune_relax_model(workload.model.path, shapes, target, trials, cache_dir / "tuning-db", measure,
                                     fingerprint=info.fingerprint_key, out_path=out, cross_cc=cross_cc,
                                     progress_cb=cb)
                finally:
                    if measure is not None:
                        measure.close()
            elif hostwork is not None and hostwork.remote:  # on the Ray cluster, checked against this host's identity
                hostwork.start_build(workload.model, shapes, target, cross_cc, _threads(target, info), out)
                hostwork.finish_build(out, build_identity(resolve_cross_cc(target, cross_cc), _threads(target, info)))
            else:
                build_relax_model(workload.model.path, shapes, target, out, cross_cc=cross_cc)
        except EdgetuneError as exc:
            raise BuildFailed(str(exc).splitlines()[0][:300]) from exc
        return Prepared("tvm-relax", out, run_params)

SPACE = TvmRelaxSpace()
TUNED = TvmRelaxSpace(tuned=True)
