"""Host side of the agent protocol (device_agents/PROTOCOL.md).

One ``AgentClient`` per device. A job is a sequence of named steps — upload, run, fetch, cleanup
in ``finally`` — and its failures are values: a crash, a hang (timeout) or a backend error comes
back as a ``JobResult`` with a status and a reason. Only infrastructure errors (device gone) raise.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import stat
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from edgetune.agent import session, validate
from edgetune.agent.bundle import python_agent
from edgetune.agent.messages import MAX_PROCS, MEMORY_MB, TimedCheck  # noqa: F401 - re-exported
from edgetune.agent.messages import PROTOCOL, AgentInfo, Job, JobResult
from edgetune.agent.validate import BUNDLE_MAGIC, Invalid, parse_bundle  # noqa: F401 - re-exported
from edgetune.build.native import build_agent
from edgetune.devices.base import Completed, Stream, Transport
from edgetune.devices.inventory import DeviceSpec, edgetune_home, open_transport
from edgetune.errors import DeviceError, DeviceUnreachable, UserInputError
from edgetune.hashing import sha256_file
from edgetune.private import private_dir
from edgetune.text import device_text
from edgetune.modelfile import external_data_files

MAX_LOAD_SCALE = 8.0  # a job's time limit grows with the device's load up to this factor
# the agent's supervisor stops a job this long before the host stops waiting for its answer (times
# the device's load factor: stopping, sweeping and answering take longer on a busy device)
ANSWER_MARGIN_S = 2.0


def load_factor(spec: DeviceSpec, device_state: dict[str, Any]) -> float:
    """How much longer than on an idle device an honest job takes here: the 1-minute load average
    per CPU the device reported with its last job (``device_state``), between 1 and MAX_LOAD_SCALE.
    This host, or a device reached over its loopback: its own load now, before the device ever said.
    What a device says is data: a value that is not a number has no effect."""
    try:
        per_cpu = float(device_state["load1"]) / max(1, int(device_state["cpus"]))
    except (KeyError, TypeError, ValueError):
        per_cpu = 0.0
    if not per_cpu == per_cpu:  # NaN
        per_cpu = 0.0
    if spec.kind == "local" or "@127." in spec.url or "@localhost" in spec.url:
        per_cpu = max(per_cpu, os.getloadavg()[0] / max(1, os.cpu_count() or 1))
    return float(min(MAX_LOAD_SCALE, max(1.0, per_cpu)))


def default_workdir(spec: DeviceSpec) -> str:
    """The device's work dir: its ``workdir`` option, else a private per-user default (never a
    predictable shared /tmp path): EDGETUNE_HOME/work on the host, ~/.cache/edgetune over ssh,
    /data/local/tmp/edgetune on a phone (the shell user's own area)."""
    return spec.workdir or str(edgetune_home() / "work")


def _tighten_own_dir(path: str) -> None:
    """A work dir of ours that others may only read (0755, as older edgetune versions made it) is
    made private; one that others may write to (they could have put files in it), or that is not
    ours, is left to ``private_dir`` to refuse."""
    try:
        st = os.lstat(path)
    except OSError:
        return
    if stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid() and not st.st_mode & 0o022 and st.st_mode & 0o077:
        os.chmod(path, 0o700)


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
        self.workdir = workdir or default_workdir(spec)
        self._info: AgentInfo | None = None
        self._agent_argv: list[str] | None = None
        self._agent_files: dict[str, tuple[Path, str | None]] = {}  # remote path -> (local source, chmod)
        self._agent_digests: dict[str, str] = {}  # remote path -> sha256 it must have before every use
        self.agent_repushes = 0  # times the agent on the device differed from ours and was pushed again
        self._pushed: set[str] = set()
        self._digests: dict[tuple, str] = {}
        self._lock = threading.Lock()
        self._native = False
        self._session: Stream | None = None  # the agent's session (PROTOCOL.md "The session"), once open
        self._session_lock = threading.Lock()  # one job at a time on it; a concurrent one goes by run-stdio
        self.session_off: str | None = None  # why this device's jobs do not use a session, once known
        self.sessions_opened = 0
        self.device_state: dict[str, Any] = {}  # what the device said of itself with its last job (its load)

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
            self._prepare_workdir()
            w = self.workdir
            py = self._python()
            probe = self._run([py, "-c", "import numpy, sys; print(sys.version_info[0])"], timeout=60)
            if probe.ok and probe.text().strip() == "3" and not self.spec.options.get("native"):
                self._agent_argv = self._provision_python(py)
            else:
                self._agent_argv = self._provision_native()
            c = self._must(self._agent_argv + ["info"], "agent info", timeout=120)
            data = validate.info_dict(c.stdout, self.spec.name)
            if data.get("protocol") != PROTOCOL:
                raise DeviceError(f"{self.spec.name}: agent speaks protocol {device_text(data.get('protocol'), 40)}, "
                                  f"host {PROTOCOL}")
            self._info = validate.agent_info(data, self.spec.name)
            return self._info

    def _prepare_workdir(self) -> None:
        """Create the work dir private to the device user (0700) and refuse one that is not: owned
        by another user, open to others, or not a directory (a link planted in a shared /tmp).
        ``~/`` is the device user's home."""
        w = self.workdir
        if self.spec.kind == "local" and not w.startswith("~"):
            try:
                _tighten_own_dir(w)
                private_dir(w, "work dir")
            except UserInputError as exc:
                raise DeviceError(f"{self.spec.name}: {exc}") from None
        else:
            script = ('w=$1; case $w in "~/"*) w="$HOME/${w#"~/"}";; esac; '
                      'mkdir -p -- "$(dirname -- "$w")" 2>/dev/null; mkdir -m 700 -- "$w" 2>/dev/null; '
                      'printf "edgetune-workdir\\0%s\\0%s\\0%s\\0" "$w" "$(id -u)" "$(stat -c "%u %a %F" -- "$w" 2>/dev/null)"')
            c = self._must(["sh", "-c", script, "sh", w], f"creating work dir {w}")
            tag = c.stdout.rfind(b"edgetune-workdir\0")
            parts = c.stdout[tag:].decode("utf-8", "replace").split("\0") if tag >= 0 else []
            if len(parts) < 4 or not parts[2].isdigit():
                raise DeviceError(f"{self.spec.name}: cannot check work dir {device_text(w)}: unexpected answer "
                                  f"{device_text(c.stdout[-200:].decode('utf-8', 'replace'), 200)!r}")
            resolved, uid = parts[1], parts[2]
            owner, mode, kind = (parts[3].split(" ", 2) + ["", "", ""])[:3]
            if not resolved.startswith("/"):
                raise DeviceError(f"{self.spec.name}: work dir {device_text(resolved)} is not an absolute path")
            if kind != "directory":
                raise DeviceError(f"{self.spec.name}: work dir {device_text(resolved)} is not a directory "
                                  f"({device_text(kind or 'cannot be created', 60)}); refusing to use it")
            if owner != uid:
                raise DeviceError(f"{self.spec.name}: work dir {device_text(resolved)} is owned by uid "
                                  f"{device_text(owner, 20)}, not the device user (uid {uid}); refusing to use it "
                                  f"(someone else may have planted it)")
            if not mode or not all(ch in "01234567" for ch in mode) or int(mode, 8) & 0o022:
                raise DeviceError(f"{self.spec.name}: work dir {device_text(resolved)} has mode "
                                  f"{device_text(mode, 8)}, open to other users; refusing to use it")
            if int(mode, 8) & 0o077:  # ours and only readable by others (an older edgetune's 0755)
                self._must(["chmod", "700", resolved], f"making work dir {resolved} private")
            self.workdir = w = resolved
        self._must(["mkdir", "-p", f"{w}/agent", f"{w}/artifacts", f"{w}/inputs", f"{w}/jobs"],
                   f"creating work dir {w}")

    def _push_verified(self, local: Path, remote: str, mode: str | None = None) -> None:
        digest = sha256_file(local)
        self.transport.push(str(local), remote)
        if mode:
            self._must(["chmod", mode, remote], f"chmod {remote}")
        if self._remote_sha256([remote]).get(remote) != digest:
            raise DeviceError(f"{self.spec.name}: {remote} arrived corrupted (sha256 differs)")

    def _remote_sha256(self, paths: list[str]) -> dict[str, str]:
        """sha256 of remote files as the device's sha256sum reports them (missing ones left out).
        GNU sha256sum escapes a name holding a backslash or newline and marks the line with a
        leading backslash: lines are matched by order, not by name."""
        c = self._run(["sha256sum", "--", *paths], timeout=60)
        out: dict[str, str] = {}
        lines = c.text().splitlines()
        if len(lines) != len(paths):  # some missing: ask one by one
            if len(paths) == 1:
                lines = lines if c.ok else []
            else:
                for p in paths:
                    out.update(self._remote_sha256([p]))
                return out
        for p, line in zip(paths, lines):
            word = line.split(" ", 1)[0].lstrip("\\")
            if len(word) == 64:
                out[p] = word.lower()
        return out

    def _install_agent_file(self, local: Path, remote: str, mode: str | None = None) -> None:
        """Push one file of the agent unless the device already has exactly it; remember its hash,
        which is checked again before every job (``_check_agent``)."""
        digest = sha256_file(local)
        self._agent_files[remote] = (local, mode)
        self._agent_digests[remote] = digest
        if self._remote_sha256([remote]).get(remote) != digest:
            self._push_verified(local, remote, mode)

    def _check_agent(self) -> None:
        """Before every use: the agent (and the library it loads) on the device must still be the
        file we pushed, byte for byte. A changed one is pushed again; one that will not stay
        ours (something on the device rewrites it) is refused."""
        paths = list(self._agent_digests)
        if not paths:
            return
        have = self._remote_sha256(paths)
        for p in paths:
            if have.get(p) == self._agent_digests[p]:
                continue
            local, mode = self._agent_files[p]
            self._push_verified(local, p, mode)
            self.agent_repushes += 1
            if self._remote_sha256([p]).get(p) != self._agent_digests[p]:
                raise DeviceError(f"{self.spec.name}: the agent file {p} on the device does not keep "
                                  f"the content edgetune pushed; refusing to run it")

    def _provision_python(self, py: str) -> list[str]:
        remote = f"{self.workdir}/agent/edgetune_agent.py"
        # one file, bundled from the agent's modules (its sha256 is checked before every job)
        self._install_agent_file(python_agent(), remote)
        # -S: no site-packages at start-up (~50 ms of .pth files): a job the agent's zygote serves
        # needs none, and the agent adds them itself for everything else
        return [py, "-S", remote]

    def _provision_native(self) -> list[str]:
        c = self._must(["uname", "-m"], "uname -m")
        arch = c.text().strip()
        triple = {"x86_64": None, "aarch64": "aarch64-linux-gnu", "arm64": "aarch64-linux-gnu"}.get(arch, "unsupported")
        if triple == "unsupported":
            raise DeviceError(f"{self.spec.name}: no native agent for architecture {device_text(arch, 64)}")
        # static agents cannot dlopen kernels or libonnxruntime: only on request (kernel-only phones)
        static = bool(self.spec.options.get("static"))
        binary = Path(build_agent(triple, static=static))
        remote = f"{self.workdir}/agent/edgetune-agent"
        self._install_agent_file(binary, remote, mode="755")
        ort_lib = self._ort_library_for(arch)
        if ort_lib is not None:  # the agent finds it next to itself
            self._install_agent_file(ort_lib, f"{self.workdir}/agent/libonnxruntime.so")
        self._native = True
        return [remote]

    def _ort_library_for(self, arch: str) -> Path | None:
        """The libonnxruntime.so to give the native agent: the device option ``ort_lib`` (a library built
        for the device, e.g. from the onnxruntime wheel or Android package of its arch), else the host
        wheel's own library when the device has the host's architecture, else the one set-up put in
        the virtualenv for that architecture (``tools/setup.sh``: from onnxruntime's aarch64 wheel)."""
        if self.spec.options.get("ort_lib"):
            p = Path(self.spec.options["ort_lib"]).expanduser()
            if not p.is_file():
                raise DeviceError(f"{self.spec.name}: ort_lib {p} not found")
            return p
        import platform
        import sys

        if arch != platform.machine():
            arch = {"arm64": "aarch64"}.get(arch, arch)
            found = sorted((Path(sys.prefix) / "share" / "edgetune").glob(f"ort-{arch}-*/libonnxruntime.so"))
            return found[-1] if found else None
        try:
            import onnxruntime
        except ImportError:
            return None
        capi = Path(onnxruntime.__file__).parent / "capi"
        libs = sorted(capi.glob("libonnxruntime.so*"))
        return libs[0] if libs else None

    def push_files(self, files: Sequence[tuple[Path, str, str | None]]) -> None:
        """Put local files on the device at remote paths (parents created), each checked by sha256
        after the push; a file the device already has byte for byte is not pushed again."""
        dirs = sorted({r.rsplit("/", 1)[0] for _, r, _ in files if "/" in r})
        if dirs:
            self._must(["mkdir", "-p", *dirs], "creating directories")
        have = self._remote_sha256([r for _, r, _ in files])
        for local, remote, mode in files:
            if have.get(remote) != sha256_file(local):
                self._push_verified(Path(local), remote, mode)
            elif mode:
                self._must(["chmod", mode, remote], f"chmod {remote}")

    def ort_library_for(self, arch: str) -> Path | None:
        """The libonnxruntime.so this device's jobs run with (see _ort_library_for)."""
        return self._ort_library_for(arch)

    def agent_command(self, args: Sequence[str], timeout: float = 60.0) -> Completed:
        """One of the agent's own commands on the device (e.g. the Python agent's ``tvm-device``,
        ``gpu-check``), with the agent provision() put there; what it printed is data."""
        self.provision()
        return self._run([*self._agent_argv, *args], timeout)

    def cleanup(self) -> None:
        """Remove everything edgetune put on the device (the whole work dir)."""
        self._run(["rm", "-rf", self.workdir], timeout=60)
        self._pushed.clear()
        self._info = None

    # ------------------------------------------------------------------------------- jobs
    def _digest(self, path: Path) -> str:
        """sha256 of a local file, remembered by (path, size, mtime): a model's external data can be
        gigabytes, and every job of a candidate names the same artifact."""
        st = path.stat()
        key = (str(path.resolve()), st.st_size, st.st_mtime_ns)
        if key not in self._digests:
            self._digests[key] = sha256_file(path)
        return self._digests[key]

    def _ensure_artifact(self, path: Path) -> tuple[str, str]:
        digest = self._digest(path)
        extra = external_data_files(path)
        if not extra:
            remote = f"{self.workdir}/artifacts/{digest}{path.suffix}"
            files = [(path, remote)]
        else:
            # an ONNX model with external data: the model and its data files in a directory of their own,
            # under the names the model refers to, named by the digest of them all
            parts = [(path, digest)] + [(path.parent / x, self._digest(path.parent / x)) for x in extra]
            rdir = f"{self.workdir}/artifacts/" + hashlib.sha256(
                json.dumps([[p.name, d] for p, d in parts]).encode()).hexdigest()[:32]
            remote = f"{rdir}/model{path.suffix}"
            files = [(path.parent / x, f"{rdir}/{x}") for x in extra] + [(path, remote)]
            if remote not in self._pushed:
                self._must(["mkdir", "-p", rdir], "creating an artifact dir")
        if remote not in self._pushed:
            have = self._remote_sha256([r for _, r in files])
            for local, r in files:
                if have.get(r) != self._digest(local):
                    self._push_verified(local, r)
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

    def stage_job(self, job: Job, tmp: Path) -> dict[str, Any]:
        """Put the job's artifact, model and inputs on the device (what is there already stays)
        and return its request, as the agent reads it (``run_job``; tools/gpu/ort_gpu_replay.py
        stages jobs for a device to run offline)."""
        artifact, digest = self._ensure_artifact(job.artifact)
        model = None
        if job.model is not None:
            m_remote, m_digest = self._ensure_artifact(job.model)
            model = {"path": m_remote, "sha256": m_digest}
        inputs = self._ensure_inputs(job.input_sets, tmp)
        request = {
            "protocol": PROTOCOL, "backend": job.backend, "artifact": artifact,
            "artifact_sha256": digest, "params": self._agent_params(job.backend, job.params),
            "input_names": job.input_names, "inputs": inputs, "outputs": job.output_specs,
            "warmup_ms": job.warmup_ms, "budget_ms": job.budget_ms, "min_iters": job.min_iters,
            "max_iters": job.max_iters, "fresh_seed": job.fresh_seed, "check_iters": job.check_iters,
            "check_fastest": job.check_fastest, "probe_pairs": job.probe_pairs,
            **({"placement": True} if job.placement else {}),
            # devices.toml zygote = false: every job in a fresh agent process (Python agent)
            **({"fresh_process": True} if self.spec.options.get("zygote") is False else {}),
            # the agent's supervisor stops the job before the host gives up on it (answer_wait_s)
            "limits": {"memory_mb": job.memory_mb, "max_procs": job.max_procs,
                       "timeout_s": max(1.0, job.timeout_s - ANSWER_MARGIN_S)},
            "max_bundle_bytes": job.max_bundle_bytes(),
        }
        if model:
            request["model"] = model
        return request

    def answer_wait_s(self, job: Job) -> float:
        """How long the host waits for a job's answer: its time limit, and on a busy device longer,
        so that the supervisor's bound (ANSWER_MARGIN_S before the time limit) keeps a margin that
        grows with the load: "hung (killed)" by the host only when the agent could not answer."""
        return job.timeout_s + ANSWER_MARGIN_S * (load_factor(self.spec, self.device_state) - 1.0)

    def run_job(self, job: Job, wrap: Sequence[str] = ()) -> JobResult:
        """Run one job. ``wrap``: a command the agent runs under (``edgetune.sanitizer``: NVIDIA's
        compute-sanitizer, which follows the agent's processes)."""
        self.provision()
        t_start = time.perf_counter()
        jobdir = f"{self.workdir}/jobs/{uuid.uuid4().hex[:16]}"
        with tempfile.TemporaryDirectory(prefix="edgetune-job-") as tmpd:
            tmp = Path(tmpd)
            try:
                request = self.stage_job(job, tmp)
                max_bundle = request["max_bundle_bytes"]
                data = json.dumps(request).encode()
                wait_s = self.answer_wait_s(job)
                t_agent = time.perf_counter()
                c = None if wrap else self._in_session(jobdir, data, wait_s, max_bundle + 4096)
                if c is None:  # not a job a session serves (or none here): a command of its own
                    self._check_agent()  # the agent is ours, byte for byte, right before it runs
                    t_agent = time.perf_counter()
                    c = self.transport.run([*wrap, *self._agent_argv, "run-stdio", jobdir], timeout=wait_s,
                                           stdin=data, max_output=max_bundle + 4096)
                agent_ms = (time.perf_counter() - t_agent) * 1e3
                res = self._collect(c, job, agent_ms, wait_s)
                if res.device_state:
                    self.device_state = res.device_state
                if res.status in ("crashed", "timeout") or res.limit:  # the agent could not remove its job dir
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

    # -------------------------------------------------------------------- the agent's session
    def _in_session(self, jobdir: str, data: bytes, timeout: float, max_output: int) -> Completed | None:
        """Run the job on the agent's session (session.py): what the agent answered, as run-stdio's
        Completed, or None where it is not served there (not a runtime configuration, a device
        without sessions, the session busy with another job)."""
        if self._native or self.spec.options.get("zygote") is False or self.spec.options.get("session") is False \
                or self.session_off is not None \
                or not hasattr(self.transport, "open_stream") or not self._session_lock.acquire(blocking=False):
            return None
        try:
            if self._session is None:
                self._check_agent()  # the session runs the agent file once: it is ours right before it starts
                self._session, self.session_off = session.start(
                    self.transport, [*self._agent_argv, "session", f"{self.workdir}/jobs"], PROTOCOL)
                if self._session is None:
                    return None  # jobs go by run-stdio
                self.sessions_opened += 1
            try:
                c, usable = session.exchange(self._session, jobdir.rsplit("/", 1)[-1].encode(), data,
                                             time.monotonic() + timeout, max_output)
            except BaseException:
                self._drop_session(kill=True)
                raise
            if not usable:
                self._drop_session(kill=True)  # the next job opens another
            return c
        finally:
            self._session_lock.release()

    def _drop_session(self, kill: bool = False) -> None:
        stream, self._session = self._session, None
        if stream is not None:
            stream.kill() if kill else stream.close()

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

    def _collect(self, c: Completed, job: Job, agent_ms: float, wait_s: float | None = None) -> JobResult:
        """What the device answered, as a JobResult: every byte of it validated (validate.py);
        an answer that breaks the protocol is this candidate's failure ``invalid result: ...``."""
        stderr_tail = c.stderr.decode("utf-8", "replace").strip().splitlines()[-1:] or [""]
        tail = device_text(stderr_tail[0], 200)
        if c.overflow:
            return JobResult("error", f"result too large: the device sent more than {job.max_bundle_bytes()} "
                                      f"bytes (the most this job's outputs can take)", limit="output")
        if c.timed_out:
            waited = job.timeout_s if wait_s is None else wait_s  # None: an answer replayed, not waited for
            return JobResult("timeout", f"hung: no result within {round(waited, 2):g} s (killed)", limit="time")
        try:
            files = parse_bundle(c.stdout)
        except Invalid as exc:
            return JobResult("error", f"invalid result: {exc}", invalid=exc.code)
        if c.returncode != 0 or files is None or "result.json" not in files:
            if c.returncode < 0 or c.returncode > 128:
                sig = -c.returncode if c.returncode < 0 else c.returncode - 128
                why = f"crashed: agent killed by {_signal_name(sig)}"
            elif c.returncode != 0:
                why = f"crashed: agent exited with status {c.returncode}"
            else:
                why = "crashed: agent returned no result"
            return JobResult("crashed", f"{why}" + (f" ({tail})" if tail else ""))
        try:
            return validate.job_result(files, job, agent_ms * 1e6)
        except Invalid as exc:
            return JobResult("error", f"invalid result: {exc}", invalid=exc.code)
        except (ValueError, TypeError, ArithmeticError, RecursionError, MemoryError, SyntaxError) as exc:
            # a malformed answer the checks above did not name: still that candidate's failure
            return JobResult("error", f"invalid result: unreadable ({type(exc).__name__}: "
                                      f"{device_text(exc, 200)})", invalid="invalid-result")

    def close(self) -> None:
        with self._session_lock:
            self._drop_session()
        self.transport.close()
