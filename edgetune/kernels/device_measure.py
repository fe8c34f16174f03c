"""Measuring TVM kernels on a device through its NATIVE agent, and the device's kernel target.

``DeviceMeasure(spec)`` implements the ``measure(artifact_path, inputs, output_specs) -> KernelRun``
contract of ``edgetune.kernels.search``: every kernel MetaSchedule builds is pushed to the device
(content-addressed), run by the native agent (backend ``tvm-kernel``, no TVM runtime on the device)
in its own process with a timeout, and its samples and raw outputs come back; the host verifies
them (search.EdgetuneRunner). The native agent is forced even on boards that have Python (a copy of
the DeviceSpec with ``native=True`` and its own work dir), so kernels always run the way they will
ship: a plain shared library called through its C entry point.

``device_target(info, cpuinfo)`` is the TVM target for the device: its architecture's
targets/*.toml refined by what the device reports (ISA features from its /proc/cpuinfo, core count
and clock from the agent's fingerprint), plus the cross compiler that links its kernels.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from edgetune.agent.host import AgentClient, AgentInfo, Job, JobResult, default_workdir
from edgetune.devices.inventory import DeviceSpec, fingerprint_key
from edgetune.errors import DeviceError, UserInputError
from edgetune.kernels.measurement import CudaLocalMeasure, KernelRun
from edgetune.kernels.targets import KernelTarget, cpuinfo_features, host_target, load_target, refine_from_cpuinfo
from edgetune.ops.base import TensorSpec
from edgetune.text import device_text

KERNEL_WORKDIR_SUFFIX = "-kernels"


def kernel_spec(spec: DeviceSpec, suffix: str = KERNEL_WORKDIR_SUFFIX) -> DeviceSpec:
    """``spec`` forced onto the native agent, in a work dir of its own (next to the device's usual one)."""
    base = default_workdir(spec)
    options = {**spec.options, "native": True, "workdir": base.rstrip("/") + suffix}
    return DeviceSpec(spec.name, spec.url, options)


@dataclass(frozen=True)
class DeviceProbe:
    """What the host learned about the device before tuning for it."""

    info: AgentInfo
    cpuinfo: str  # the device's /proc/cpuinfo ("" where unreadable)
    emulated: str | None  # e.g. "qemu-aarch64": timings are not the real chip's

    @property
    def fingerprint(self) -> dict[str, Any]:
        """The agent's fingerprint + arch (+ emulation, when detected): kernel results are keyed by it."""
        fp = {**self.info.fingerprint, "arch": self.info.arch}
        if self.emulated:
            fp["emulated"] = self.emulated
        return fp

    @property
    def fingerprint_key(self) -> str:
        return fingerprint_key(self.fingerprint)


class DeviceMeasure:
    """``measure(artifact_path, inputs, output_specs) -> KernelRun`` on a device's native agent.

    * ``num_threads``: the kernel's thread pool size (default: the device's core count).
    * ``budget_ms`` / ``warmup_ms``: timing budget per kernel (PROTOCOL.md step 6).
    * ``timeout_s``: a kernel job that takes longer is killed and recorded as ``timeout``.

    Failures of a kernel (crash, hang, error, changed inputs) come back as a KernelRun status.
    A failure of the device itself (unreachable, gone) is retried once with a fresh connection;
    if it persists, every later call returns an error at once and ``device_error`` holds it, so
    a tuning loop ends quickly and its caller can raise it.
    """

    def __init__(
        self,
        spec: DeviceSpec,
        num_threads: int | None = None,
        budget_ms: float = 100.0,
        timeout_s: float = 60.0,
        *,
        warmup_ms: float = 10.0,
        min_iters: int = 3,
        max_iters: int = 100_000,
        workdir_suffix: str = KERNEL_WORKDIR_SUFFIX,
        client: AgentClient | None = None,
    ) -> None:
        self.device_spec = spec
        self.spec = kernel_spec(spec, workdir_suffix)
        self.client = client or AgentClient(self.spec)
        self._num_threads = num_threads
        self.budget_ms, self.warmup_ms = float(budget_ms), float(warmup_ms)
        self.timeout_s = float(timeout_s)
        self.min_iters, self.max_iters = int(min_iters), int(max_iters)
        self.device_error: DeviceError | None = None
        self.jobs = 0
        self._probe: DeviceProbe | None = None

    # ----------------------------------------------------------------------------- device
    def info(self) -> AgentInfo:
        return self.client.provision()

    def probe(self) -> DeviceProbe:
        """Provision the native agent and read what the target needs (cpuinfo, emulation)."""
        if self._probe is None:
            info = self.info()
            t = self.client.transport
            c = t.run(["cat", "/proc/cpuinfo"], timeout=30)
            cpuinfo = c.text() if c.ok else ""
            emulated = info.fingerprint.get("emulated") or None
            if not emulated:
                env = t.run(["printenv", "EDGETUNE_EMULATED"], timeout=30)
                emulated = (env.text().strip() or None) if env.ok else None
            if not emulated:
                emulated = _foreign_cpuinfo(info.arch, cpuinfo)
            self._probe = DeviceProbe(info, cpuinfo, emulated)
        return self._probe

    @property
    def timings_trusted(self) -> bool:
        """False on an emulated device (qemu): its timings are not the hardware's."""
        return not self.probe().emulated

    @property
    def peak_gflops(self) -> float | None:
        """The device's fp32 peak for the roofline check (None when unknown or emulated)."""
        if not hasattr(self, "_peak"):
            self._peak = None if self.probe().emulated else device_kernel_target(
                self.probe().info, self.probe().cpuinfo).fp32_peak_gflops()
        return self._peak

    @property
    def num_threads(self) -> int:
        if self._num_threads:
            return int(self._num_threads)
        return int(self.info().fingerprint.get("cores") or 1)

    # -------------------------------------------------------------------------- measuring
    def run_job(self, job: Job, wrap: Sequence[str] = ()) -> JobResult:
        """One agent job with one reconnect on a device error (raises DeviceError if it persists)."""
        if self.device_error is not None:
            raise self.device_error
        try:
            return self.client.run_job(job, wrap)
        except DeviceError:
            try:
                self.client.close()
            except Exception:  # noqa: BLE001 - the old connection is gone anyway
                pass
            self.client = AgentClient(self.spec)
            try:
                return self.client.run_job(job, wrap)
            except DeviceError as exc:
                self.device_error = exc
                raise

    def __call__(self, artifact_path: str, inputs: list[np.ndarray], output_specs: Sequence[TensorSpec]) -> KernelRun:
        if self.device_error is not None:
            return KernelRun("error", f"device unavailable: {self.device_error}")
        self.jobs += 1
        inputs = [np.ascontiguousarray(x) for x in inputs]
        job = Job(
            backend="tvm-kernel", artifact=Path(artifact_path), params=self.kernel_params(),
            input_names=[f"arg{k}" for k in range(len(inputs))], input_sets=[inputs],
            output_specs=[{"name": s.name, "dtype": s.dtype, "shape": [int(d) for d in s.shape]} for s in output_specs],
            budget_ms=self.budget_ms, warmup_ms=self.warmup_ms, min_iters=self.min_iters, max_iters=self.max_iters,
            timeout_s=self.timeout_s,
        )
        try:
            res = self.run_job(job)
        except DeviceError as exc:
            return KernelRun("error", f"device unavailable: {exc}")
        return job_to_kernel_run(res, inputs, output_specs)

    def kernel_params(self) -> dict[str, Any]:
        """The ``params`` of a kernel's job (the native agent: its thread pool size)."""
        return {"num_threads": self.num_threads}

    def close(self) -> None:
        """Remove this run's kernels and job dirs from the device (the agent and inputs stay cached)."""
        try:
            if self.client._info is not None and self.device_error is None:  # noqa: SLF001 - provisioned
                w = self.client.workdir
                self.client.transport.run(["rm", "-rf", f"{w}/artifacts", f"{w}/jobs"], timeout=60)
                self.client.transport.run(["mkdir", "-p", f"{w}/artifacts", f"{w}/jobs"], timeout=60)
                self.client._pushed.clear()  # noqa: SLF001 - its cache of what is on the device
        except Exception:  # noqa: BLE001 - best effort on the way out
            pass
        finally:
            try:
                self.client.close()
            except Exception:  # noqa: BLE001
                pass

    def __enter__(self) -> "DeviceMeasure":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class PythonTvmMeasure(DeviceMeasure):
    """Kernels on the device's Python agent, through the device's own TVM runtime (its ``tvm-kernel``
    backend), on ``device`` "cuda" (``edgetune tune-kernels --gpu``: TVM CUDA modules, which the
    native agent cannot run) or "cpu". The whole agent protocol: fresh inputs per timed run, timed
    runs' outputs kept and verified, the probe, the late-write check; on a GPU each new input
    uploaded, outputs poisoned in GPU memory and 256 MiB copied on the device before each timed run
    (no run finds its data in L2), the run timed with the device synchronized (host clock, as the
    device's onnxruntime baselines are). Its own work dir next to the device's usual one."""

    def __init__(self, spec: DeviceSpec, device: str = "cuda", budget_ms: float = 100.0, timeout_s: float = 60.0,
                 **kwargs) -> None:
        base = default_workdir(spec)
        options = {k: v for k, v in spec.options.items() if k != "native"}
        options["workdir"] = base.rstrip("/") + "-tvmkernels"
        pspec = DeviceSpec(spec.name, spec.url, options)
        super().__init__(spec, 1, budget_ms, timeout_s, client=AgentClient(pspec), **kwargs)
        self.spec = pspec  # (a reconnect after a device error: the Python agent again)
        self.device = device

    def kernel_params(self) -> dict[str, Any]:
        return {"device": self.device}

    def check(self) -> str:
        """The device's TVM version; UserInputError (one line) when its Python agent has no TVM or its
        TVM cannot reach ``device``."""
        info = self.client.provision()
        if info.agent != "python":
            raise UserInputError(f"{self.spec.name}: no Python agent (python3 with numpy) for TVM kernels")
        version = info.runtimes.get("tvm")
        if not version:
            raise UserInputError(f"{self.spec.name}: its Python has no TVM (the device runs the kernels through "
                                 f"TVM's runtime: pip install apache-tvm there)")
        # the agent opens the device as its tvm backends do (TVM's CUDA runtime loaded by hand when
        # `import tvm` skipped it) and says why not
        c = self.client.agent_command(["tvm-device", self.device], timeout=120)
        try:
            answer = json.loads(c.text().strip().splitlines()[-1]) if c.ok else {}
        except (ValueError, IndexError):
            answer = {}
        if answer.get("ok") is not True:
            why = str(answer.get("why") or f"the agent's check failed: {c.text().strip()[-300:]}")
            raise UserInputError(f"{self.spec.name}: its TVM ({version}) cannot run {self.device} kernels: "
                                 f"{device_text(why, 400)}")
        return str(version)


def job_to_kernel_run(res: JobResult, inputs: Sequence[np.ndarray], output_specs: Sequence[TensorSpec]) -> KernelRun:
    """An agent JobResult as a KernelRun. All checks (inputs, outputs, timed iterations) are the
    verifier's (``edgetune.kernels.measurement.verify_run``), on the whole result kept in ``job``."""
    if res.status != "ok":
        status = res.status if res.status in ("error", "crashed", "timeout") else "error"
        return KernelRun(status, res.reason or status, load_ms=res.load_ms, job=res)
    outs = res.outputs[0] if res.outputs else []
    return KernelRun("ok", "", [int(s) for s in res.samples_ns], list(outs), list(res.repeat_outputs), res.load_ms,
                     job=res)


def LocalMeasure(*, device: str = "cpu", num_threads: int | None = None, warmup_ms: float = 10.0,  # noqa: N802
                 budget_ms: float = 100.0, min_iters: int = 3, max_iters: int = 100_000, timeout_s: float = 60.0,
                 workdir: str | None = None):
    """A measurer for kernels on this host: the native agent on the ``local`` device (the same
    protocol as every other device); ``device="cuda"``: the legacy CUDA worker."""
    if device == "cuda":
        return CudaLocalMeasure(device="cuda", num_threads=num_threads, warmup_ms=warmup_ms, budget_ms=budget_ms,
                                min_iters=min_iters, max_iters=max_iters, timeout_s=timeout_s)
    own = workdir is None  # a work dir of its own: two measurers on this host never clean up each other's files
    workdir = workdir or tempfile.mkdtemp(prefix="edgetune-localmeasure-")
    return _LocalMeasure(DeviceSpec("local", "local", {"workdir": workdir}), num_threads, budget_ms, timeout_s,
                         warmup_ms=warmup_ms, min_iters=min_iters, max_iters=max_iters, workdir_suffix="",
                         remove=workdir if own else None)


class _LocalMeasure(DeviceMeasure):
    def __init__(self, *args, remove: str | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self._remove = remove

    def close(self) -> None:
        super().close()
        if self._remove:
            shutil.rmtree(self._remove, ignore_errors=True)


# ---------------------------------------------------------------------------------------------
# The device's kernel target
# ---------------------------------------------------------------------------------------------

_X86_MARKERS = ("GenuineIntel", "AuthenticAMD", "\nflags\t", "\nflags ")


def _foreign_cpuinfo(arch: str, cpuinfo: str) -> str | None:
    """An aarch64 agent reading an x86 /proc/cpuinfo runs under qemu-user (its cpuinfo is the host's)."""
    if arch in ("aarch64", "arm64") and any(m in cpuinfo for m in _X86_MARKERS):
        return "qemu-user (x86-64 host cpuinfo)"
    return None


def _cpuinfo_model(cpuinfo: str) -> str | None:
    for line in cpuinfo.splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return None


def _local_cpuinfo() -> str:
    try:
        return Path("/proc/cpuinfo").read_text()
    except OSError:
        return ""


def _local_model() -> str | None:
    return _cpuinfo_model(_local_cpuinfo())


def device_kernel_target(info: AgentInfo, cpuinfo: str = "", mcpu: bool = True) -> KernelTarget:
    """The KernelTarget (TVM target, cross compiler, peak) of the device ``info`` describes.

    * x86-64 with this host's CPU model and ISA flags (local, or a sandbox on this machine):
      ``host_target()`` (its ``mcpu`` is the host's), with the device's core count.
    * other x86-64: host-x86_64.toml refined from the device's cpuinfo (no ``mcpu``: generic).
    * aarch64: linux-aarch64.toml (android-arm64.toml when the OS is Android) refined from the
      device's cpuinfo ``Features``; the TOML's ``+neon`` stays when the features are unreadable.
    Cores and max clock come from the agent's fingerprint. ``mcpu=False``: the host's LLVM CPU name
    is left out (enough for the peak figures, and TVM is not imported for it).
    """
    fp = info.fingerprint
    cores = int(fp.get("cores") or 0) or None
    freqs = [int(f) for f in (fp.get("max_freq_khz") or []) if f]
    fmax = max(freqs) if freqs else None
    arch = {"arm64": "aarch64", "amd64": "x86_64"}.get(info.arch, info.arch)
    if arch == "x86_64":
        model = _cpuinfo_model(cpuinfo) if cpuinfo else None
        same_cpu = (model or fp.get("cpu_model")) == _local_model()
        if same_cpu and cpuinfo:  # same model name is not enough: a hypervisor may mask features
            same_cpu = cpuinfo_features(cpuinfo, "x86_64") == cpuinfo_features(_local_cpuinfo(), "x86_64")
        if same_cpu:
            t = host_target(mcpu=mcpu)
            if cores:
                t = replace(t.with_tvm_target(**{"num-cores": cores}), cores=cores)
            return t
        return refine_from_cpuinfo(load_target("host-x86_64"), cpuinfo, cores=cores, max_freq_khz=fmax)
    if arch == "aarch64":
        android = str(fp.get("os") or "").startswith("Android")
        base = load_target("android-arm64" if android else "linux-aarch64")
        return refine_from_cpuinfo(base, cpuinfo, cores=cores, max_freq_khz=fmax)
    raise UserInputError(f"no kernel target for a {info.arch} device (supported: x86_64, aarch64)")


def device_target(info: AgentInfo, cpuinfo: str = "") -> tuple[dict[str, Any], str | None]:
    """``(tvm target dict, cross_cc or None)`` for the device: what MetaSchedule compiles for and
    the compiler that links its kernels (None: the host's own, for x86-64 devices)."""
    t = device_kernel_target(info, cpuinfo)
    cross = t.cross_cc if t.arch != "x86_64" else None
    return dict(t.tvm_target), cross or None


def device_peak_gflops(client: AgentClient, info: AgentInfo) -> float | None:
    """The device's fp32 peak (cores x clock x FMA lanes x 2) for the roofline check; None when a
    factor is unknown (then no timing is rejected as impossible)."""
    return device_peaks(client, info)[0]


def device_peaks(client: AgentClient, info: AgentInfo) -> tuple[float | None, float | None]:
    """(fp32 peak GFLOP/s, int8 peak GOP/s) of the device, each None when unknown."""
    try:
        c = client.transport.run(["cat", "/proc/cpuinfo"], timeout=30)
        t = device_kernel_target(info, c.text() if c.ok else "", mcpu=False)
        return t.fp32_peak_gflops(), t.int8_peak_gops()
    except (UserInputError, DeviceError):
        return None, None
