"""Host side of the agent protocol (device_agents/PROTOCOL.md).

One ``AgentClient`` per device. A job is a sequence of named steps — upload, run, fetch, cleanup
in ``finally`` — and its failures are values: a crash, a hang (timeout) or a backend error comes
back as a ``JobResult`` with a status and a reason. Only infrastructure errors (device gone) raise.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import secrets
import signal
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from edgetune.build.native import build_agent
from edgetune.devices.base import Completed, Transport
from edgetune.devices.inventory import DeviceSpec, fingerprint_key, open_transport
from edgetune.errors import DeviceError, DeviceUnreachable
from edgetune.hashing import sha256_file

PROTOCOL = 2
CHECK_ITERS = 4  # timed iterations, picked at random after they returned, whose outputs are verified
CHECK_FASTEST = 2  # ... and the fastest timed iterations (where skipped work would show)
PROBE_PAIRS = 16  # TEST04 probe: at most this many repeated-input / new-input pairs (at least 8)
REPO_ROOT = Path(__file__).resolve().parents[2]
PYTHON_AGENT = REPO_ROOT / "device_agents" / "python" / "edgetune_agent.py"


@dataclass(frozen=True)
class AgentInfo:
    agent: str  # "python" | "native"
    agent_version: str
    arch: str
    python: str | None
    runtimes: dict[str, Any]
    fingerprint: dict[str, Any]

    @property
    def fingerprint_key(self) -> str:
        return fingerprint_key({**self.fingerprint, "arch": self.arch})

    @property
    def emulated(self) -> bool:
        return bool(self.fingerprint.get("emulated"))


@dataclass
class Job:
    backend: str
    artifact: Path
    params: dict[str, Any]
    input_names: list[str]
    input_sets: list[list[np.ndarray]]
    output_specs: list[dict[str, Any]]  # name, dtype, shape: never values
    model: Path | None = None
    budget_ms: float = 200.0
    warmup_ms: float = 20.0
    min_iters: int = 3
    max_iters: int = 100_000
    timeout_s: float = 120.0
    # seed of the fresh inputs of timed iterations: chosen by the host per job, never reused
    fresh_seed: int = field(default_factory=lambda: secrets.randbits(52))  # exact in a JSON double
    check_iters: int = CHECK_ITERS
    check_fastest: int = CHECK_FASTEST
    probe_pairs: int = PROBE_PAIRS


@dataclass(frozen=True)
class TimedCheck:
    """Outputs of one timed iteration the agent kept (chosen after it returned)."""

    iteration: int
    outputs: list[np.ndarray | None]
    input_sha256_after: list[str] | None


@dataclass
class JobResult:
    status: str  # ok | error | crashed | timeout
    reason: str = ""
    samples_ns: list[int] = field(default_factory=list)
    outputs: list[list[np.ndarray | None]] = field(default_factory=list)
    repeat_outputs: list[np.ndarray | None] = field(default_factory=list)
    input_sha256_before: list[str] | None = None
    load_ms: float | None = None
    runtime_versions: dict[str, Any] = field(default_factory=dict)
    device_state: dict[str, Any] = field(default_factory=dict)
    input_sha256_after_sets: list[list[str]] | None = None  # work buffers after each input set's run
    timed_checks: list[TimedCheck] = field(default_factory=list)
    first_timed_iter: int | None = None
    fresh_seed: int | None = None
    late_change: dict[str, Any] | None = None
    probe_repeat_ns: list[int] = field(default_factory=list)
    probe_distinct_ns: list[int] = field(default_factory=list)
    input_check: str = ""
    guard_violation: str = ""  # native agent: a guard zone around a buffer was overwritten
    wall_ms: float = 0.0  # host-side wall time of the whole job (transfer + process + run)
    agent_ms: float = 0.0  # time of the remote agent command alone

    @property
    def ok(self) -> bool:
        return self.status == "ok"


BUNDLE_MAGIC = b"EDGETUNE-BUNDLE 1\n"


def parse_bundle(out: bytes) -> dict[str, bytes] | None:
    """Parse an agent's run-stdio bundle; None when it is missing or truncated (agent died)."""
    start = out.find(BUNDLE_MAGIC)
    if start < 0:
        return None
    pos = start + len(BUNDLE_MAGIC)
    files: dict[str, bytes] = {}
    while True:
        nl = out.find(b"\n", pos)
        if nl < 0:
            return None
        line = out[pos:nl].decode("utf-8", "replace")
        if line == "END":
            return files
        name, _, size = line.rpartition(" ")
        if not name or not size.isdigit() or "/" in name:
            return None
        n = int(size)
        if nl + 1 + n > len(out):
            return None
        files[name] = out[nl + 1 : nl + 1 + n]
        pos = nl + 1 + n


def _signal_name(code: int) -> str:
    try:
        return signal.Signals(code).name
    except ValueError:
        return f"signal {code}"


class AgentClient:
    """Provisions the agent on a device and runs jobs on it."""

    def __init__(self, spec: DeviceSpec, transport: Transport | None = None, workdir: str | None = None):
        self.spec = spec
        self.transport = transport or open_transport(spec)
        self.workdir = workdir or spec.workdir or str(Path(tempfile.gettempdir()) / f"edgetune-local-{os.getuid()}")
        self._info: AgentInfo | None = None
        self._agent_argv: list[str] | None = None
        self._pushed: set[str] = set()
        self._lock = threading.Lock()
        self._native = False

    # ------------------------------------------------------------------------ provisioning
    def _run(self, argv: Sequence[str], timeout: float = 60.0) -> Completed:
        return self.transport.run(list(argv), timeout=timeout)

    def _must(self, argv: Sequence[str], what: str, timeout: float = 60.0) -> Completed:
        c = self._run(argv, timeout)
        if not c.ok:
            err = c.stderr.decode("utf-8", "replace").strip().splitlines()
            detail = err[-1] if err else f"exit {c.returncode}"
            raise DeviceError(f"{self.spec.name}: {what} failed: {detail[:300]}")
        return c

    def _python(self) -> str:
        if self.spec.kind == "local":
            return self.spec.options.get("python") or sys.executable
        return self.spec.options.get("python") or "python3"

    def provision(self) -> AgentInfo:
        """Put the right agent on the device (once per client) and return what it reports."""
        with self._lock:
            if self._info is not None:
                return self._info
            w = self.workdir
            self._must(["mkdir", "-p", f"{w}/agent", f"{w}/artifacts", f"{w}/inputs", f"{w}/jobs"],
                       f"creating work dir {w}")
            py = self._python()
            probe = self._run([py, "-c", "import numpy, sys; print(sys.version_info[0])"], timeout=60)
            if probe.ok and probe.text().strip() == "3" and not self.spec.options.get("native"):
                self._agent_argv = self._provision_python(py)
            else:
                self._agent_argv = self._provision_native()
            c = self._must(self._agent_argv + ["info"], "agent info", timeout=120)
            try:
                data = json.loads(c.text().strip().splitlines()[-1])
            except (ValueError, IndexError) as exc:
                raise DeviceError(f"{self.spec.name}: agent info returned no JSON") from exc
            if data.get("protocol") != PROTOCOL:
                raise DeviceError(f"{self.spec.name}: agent speaks protocol {data.get('protocol')}, host {PROTOCOL}")
            self._info = AgentInfo(data["agent"], data["agent_version"], data["arch"], data.get("python"),
                                   data.get("runtimes", {}), data.get("fingerprint", {}))
            return self._info

    def _push_verified(self, local: Path, remote: str, mode: str | None = None) -> None:
        digest = sha256_file(local)
        self.transport.push(str(local), remote)
        if mode:
            self._must(["chmod", mode, remote], f"chmod {remote}")
        c = self._must(["sha256sum", remote], f"checking {remote}")
        if c.text().split()[:1] != [digest]:
            raise DeviceError(f"{self.spec.name}: {remote} arrived corrupted (sha256 differs)")

    def _installed_version(self, version_file: str) -> str | None:
        c = self._run(["cat", version_file], timeout=30)
        return c.text().strip() if c.ok else None

    def _provision_python(self, py: str) -> list[str]:
        remote = f"{self.workdir}/agent/edgetune_agent.py"
        version = sha256_file(PYTHON_AGENT)
        vfile = f"{self.workdir}/agent/AGENT_VERSION.python"
        if self._installed_version(vfile) != version:
            self._push_verified(PYTHON_AGENT, remote)
            self._write_remote_text(vfile, version)
        return [py, remote]

    def _provision_native(self) -> list[str]:
        c = self._must(["uname", "-m"], "uname -m")
        arch = c.text().strip()
        triple = {"x86_64": None, "aarch64": "aarch64-linux-gnu", "arm64": "aarch64-linux-gnu"}.get(arch, "unsupported")
        if triple == "unsupported":
            raise DeviceError(f"{self.spec.name}: no native agent for architecture {arch}")
        # static agents cannot dlopen kernels or libonnxruntime: only on request (kernel-only phones)
        static = bool(self.spec.options.get("static"))
        binary = Path(build_agent(triple, static=static))
        remote = f"{self.workdir}/agent/edgetune-agent"
        version = sha256_file(binary)
        ort_lib = self._ort_library_for(arch)
        if ort_lib is not None:
            version += "+" + sha256_file(ort_lib)[:16]
        vfile = f"{self.workdir}/agent/AGENT_VERSION.native"
        if self._installed_version(vfile) != version:
            self._push_verified(binary, remote, mode="755")
            if ort_lib is not None:  # the agent finds it next to itself
                self._push_verified(ort_lib, f"{self.workdir}/agent/libonnxruntime.so")
            self._write_remote_text(vfile, version)
        self._native = True
        return [remote]

    def _ort_library_for(self, arch: str) -> Path | None:
        """The libonnxruntime.so to give the native agent: the device option ``ort_lib`` (a library built
        for the device, e.g. from the onnxruntime wheel or Android package of its arch), else the host
        wheel's own library when the device has the host's architecture."""
        if self.spec.options.get("ort_lib"):
            p = Path(self.spec.options["ort_lib"]).expanduser()
            if not p.is_file():
                raise DeviceError(f"{self.spec.name}: ort_lib {p} not found")
            return p
        import platform

        if arch != platform.machine():
            return None
        try:
            import onnxruntime
        except ImportError:
            return None
        capi = Path(onnxruntime.__file__).parent / "capi"
        libs = sorted(capi.glob("libonnxruntime.so*"))
        return libs[0] if libs else None

    def _write_remote_text(self, remote: str, text: str) -> None:
        with tempfile.NamedTemporaryFile("w", delete=False, suffix=".txt") as f:
            f.write(text)
        try:
            self.transport.push(f.name, remote)
        finally:
            os.unlink(f.name)

    def cleanup(self) -> None:
        """Remove everything edgetune put on the device (the whole work dir)."""
        self._run(["rm", "-rf", self.workdir], timeout=60)
        self._pushed.clear()
        self._info = None

    # ------------------------------------------------------------------------------- jobs
    def _ensure_artifact(self, path: Path) -> tuple[str, str]:
        digest = sha256_file(path)
        remote = f"{self.workdir}/artifacts/{digest}{path.suffix}"
        if remote not in self._pushed:
            c = self._run(["sha256sum", remote], timeout=60)
            if not (c.ok and c.text().split()[:1] == [digest]):
                self._push_verified(path, remote)
            self._pushed.add(remote)
        return remote, digest

    def _ensure_inputs(self, input_sets: list[list[np.ndarray]], tmp: Path) -> list[list[str]]:
        h = hashlib.sha256()
        for s in input_sets:
            for a in s:
                h.update(str((a.dtype.str, a.shape)).encode())
                h.update(np.ascontiguousarray(a).tobytes())
        key = h.hexdigest()[:24]
        rdir = f"{self.workdir}/inputs/{key}"
        names = [[f"in_{i}_{k}.npy" for k in range(len(s))] for i, s in enumerate(input_sets)]
        if rdir not in self._pushed:
            self._must(["mkdir", "-p", rdir], "creating input dir")
            for i, s in enumerate(input_sets):
                for k, a in enumerate(s):
                    local = tmp / names[i][k]
                    np.save(local, np.ascontiguousarray(a), allow_pickle=False)
                    self.transport.push(str(local), f"{rdir}/{names[i][k]}")
            self._pushed.add(rdir)
        return [[f"{rdir}/{n}" for n in row] for row in names]

    def run_job(self, job: Job) -> JobResult:
        self.provision()
        t_start = time.perf_counter()
        jobdir = f"{self.workdir}/jobs/{uuid.uuid4().hex[:16]}"
        with tempfile.TemporaryDirectory(prefix="edgetune-job-") as tmpd:
            tmp = Path(tmpd)
            try:
                artifact, digest = self._ensure_artifact(job.artifact)
                model = None
                if job.model is not None:
                    m_remote, m_digest = self._ensure_artifact(job.model)
                    model = {"path": m_remote, "sha256": m_digest}
                inputs = self._ensure_inputs(job.input_sets, tmp)
                request = {
                    "protocol": PROTOCOL, "backend": job.backend, "artifact": artifact,
                    "artifact_sha256": digest, "params": self._agent_params(job.backend, job.params), "input_names": job.input_names,
                    "inputs": inputs, "outputs": job.output_specs,
                    "warmup_ms": job.warmup_ms, "budget_ms": job.budget_ms, "min_iters": job.min_iters,
                    "max_iters": job.max_iters, "fresh_seed": job.fresh_seed, "check_iters": job.check_iters,
                    "check_fastest": job.check_fastest,
                    "probe_pairs": job.probe_pairs,
                }
                if model:
                    request["model"] = model
                t_agent = time.perf_counter()
                c = self.transport.run(self._agent_argv + ["run-stdio", jobdir], timeout=job.timeout_s,
                                       stdin=json.dumps(request).encode())
                agent_ms = (time.perf_counter() - t_agent) * 1e3
                res = self._collect(c, job)
                if res.status in ("crashed", "timeout"):  # the agent could not remove its job dir
                    self._run(["rm", "-rf", jobdir], timeout=30)
                res.agent_ms = agent_ms
                res.wall_ms = (time.perf_counter() - t_start) * 1e3
                return res
            except BaseException:
                # the agent removes its job dir itself; after a crash, hang or interrupt we do
                try:
                    self._run(["rm", "-rf", jobdir], timeout=30)
                except DeviceError:
                    pass
                raise

    _NATIVE_OPT_LEVELS = {"disable": 0, "basic": 1, "extended": 2, "all": 99}

    def _agent_params(self, backend: str, params: dict[str, Any]) -> dict[str, Any]:
        """Candidates use one vocabulary; the native agent takes onnxruntime's C API values."""
        if not self._native or backend != "ort":
            return params
        out = {}
        for k, v in params.items():
            if k == "graph_optimization_level":
                out[k] = self._NATIVE_OPT_LEVELS[v]
            elif k == "execution_provider":
                if v != "CPUExecutionProvider":
                    raise DeviceError(f"{self.spec.name}: the native agent runs onnxruntime's CPU provider only")
            else:
                out[k] = v
        return out

    def _collect(self, c: Completed, job: Job) -> JobResult:
        stderr_tail = c.stderr.decode("utf-8", "replace").strip().splitlines()[-1:] or [""]
        if c.timed_out:
            return JobResult("timeout", f"hung: no result within {job.timeout_s:g} s (killed)")
        files = parse_bundle(c.stdout)
        if c.returncode != 0 or files is None or "result.json" not in files:
            if c.returncode < 0 or c.returncode > 128:
                sig = -c.returncode if c.returncode < 0 else c.returncode - 128
                why = f"crashed: agent killed by {_signal_name(sig)}"
            elif c.returncode != 0:
                why = f"crashed: agent exited with status {c.returncode}"
            else:
                why = "crashed: agent returned no result"
            tail = stderr_tail[0][:200]
            return JobResult("crashed", f"{why}" + (f" ({tail})" if tail else ""))
        try:
            data = json.loads(files["result.json"].decode("utf-8"))
        except ValueError:
            return JobResult("crashed", "agent wrote an unreadable result.json")
        res = JobResult(
            status=data.get("status", "error"), reason=data.get("reason", ""),
            samples_ns=list(data.get("samples_ns", [])),
            input_sha256_before=data.get("input_sha256_before"),
            load_ms=data.get("load_ms"), runtime_versions=data.get("runtime_versions", {}),
            device_state=data.get("device_state", {}),
            fresh_seed=job.fresh_seed,
            guard_violation=str(data.get("guard_violation") or ""),
        )
        if res.status != "ok":
            res.status = "error"
            return res

        def load(name: str) -> np.ndarray | None:
            blob = files.get(name)
            if blob is None:
                return None
            try:
                return np.load(io.BytesIO(blob), allow_pickle=False)
            except ValueError:
                return None

        res.outputs = [[load(n) for n in row] for row in data.get("outputs", [])]
        res.repeat_outputs = [load(n) for n in data.get("repeat_outputs", [])]
        res.input_sha256_after_sets = data.get("input_sha256_after_sets")
        res.timed_checks = [TimedCheck(int(c.get("iter", -1)), [load(n) for n in c.get("outputs", [])],
                                       c.get("input_sha256_after"))
                            for c in data.get("timed_checks", []) if isinstance(c, dict)]
        res.first_timed_iter = data.get("first_timed_iter")
        res.late_change = data.get("late_change")
        probe = data.get("probe") or {}
        res.probe_repeat_ns = list(probe.get("repeat_ns", []))
        res.probe_distinct_ns = list(probe.get("distinct_ns", []))
        res.input_check = str(data.get("input_check", ""))
        return res

    def close(self) -> None:
        self.transport.close()
