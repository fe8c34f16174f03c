"""Measuring one kernel artifact and verifying what came back (the MetaSchedule "measurement").

``measure(artifact_path, inputs, output_specs) -> KernelRun`` is the only contact with a device:
``edgetune.kernels.device_measure.DeviceMeasure`` runs the artifact through the device's native
agent (protocol 2, device_agents/PROTOCOL.md) and keeps the agent's whole result in ``KernelRun.job``;
``verify_run`` hands it to the one verifier (``edgetune.verify.verify_job``) with the workload's
float64 numpy reference, so a kernel is checked exactly like a model candidate: timed iterations on
fresh inputs, TEST04, late writes, guard zones, the roofline.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, Sequence

import numpy as np

import edgetune
from edgetune.agent.host import JobResult
from edgetune.ops.base import KernelWorkload, TensorSpec
from edgetune.seeded import KERNEL, seeded_array
from edgetune.verify import Verdict, array_sha256, verify_job

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
    job: JobResult | None = field(default=None, repr=False)  # the agent's full result (protocol 2)
    # the legacy CUDA worker: (inputs, outputs) of new input sets run after timing through the timed buffers
    post_checks: list[tuple[list[np.ndarray], list[np.ndarray]]] = field(default_factory=list, repr=False)

    def __post_init__(self) -> None:
        if self.status not in RUN_STATUSES:
            raise ValueError(f"KernelRun.status must be one of {RUN_STATUSES}, got {self.status!r}")


class Measure(Protocol):
    def __call__(self, artifact_path: str, inputs: list[np.ndarray], output_specs: Sequence[TensorSpec]) -> KernelRun: ...


def verify_run(run: KernelRun, workload: KernelWorkload, inputs: Sequence[np.ndarray],
               reference: Sequence[np.ndarray], *, peak_gflops: float | None = None,
               timings_trusted: bool = True) -> Verdict:
    """A kernel measurement against the host's float64 reference of ``inputs`` (one input set)."""
    if run.status != "ok" and run.job is None:
        code = {"crashed": "crashed", "timeout": "hung"}.get(run.status, "error")
        if "out-of-bounds" in run.reason:
            code = "out-of-bounds-write"
        return Verdict.failed(f"{run.status}: {run.reason}", code)
    job = run.job
    sets, refs = [list(inputs)], [list(reference)]
    if job is None:  # the legacy CUDA worker: one set and a repeat, then new sets through the timed buffers
        sets += [list(x) for x, _ in run.post_checks]
        refs += [list(workload.reference(x)) for x, _ in run.post_checks]
        job = JobResult("ok", samples_ns=list(run.samples_ns),
                        outputs=[list(run.outputs), *[list(o) for _, o in run.post_checks]],
                        repeat_outputs=list(run.repeat_outputs),
                        input_sha256_after_sets=[[array_sha256(x) for x in s] for s in sets])
    return verify_job(job, sets, refs, workload.reference, [s.name for s in workload.outputs],
                      flops=float(workload.flops()), peak_gflops=peak_gflops, timings_trusted=timings_trusted,
                      output_dtypes=[s.dtype for s in workload.outputs], require_timed=run.job is not None)


def _fresh_like(inputs: Sequence[np.ndarray], seed: int) -> list[np.ndarray]:
    """New inputs of the same shapes and dtypes, drawn as the kernel's own are (``seeded.KERNEL``);
    integers stay within [0, the input's max] (indices must stay valid)."""
    rng = np.random.default_rng(seed)
    return [seeded_array(x.dtype, x.shape, rng, KERNEL,
                         None if np.issubdtype(x.dtype, np.floating) else (0, max(2, int(np.max(x)) + 1 if x.size else 2)))
            for x in inputs]


def _package_root() -> str:
    return str(Path(edgetune.__file__).resolve().parent.parent)


class CudaLocalMeasure:
    """Measure CUDA kernels on this host in a child process through the TVM runtime (legacy).

    CPU kernels are measured by the native agent (``edgetune.kernels.device_measure.LocalMeasure``),
    which follows the whole protocol. This worker predates protocol 2: it returns one input set's
    outputs, times iterations whose outputs are not returned, then runs ``post_checks`` new input
    sets (chosen here) through the buffers it timed, outputs poisoned, and returns those: a kernel
    that stops computing once timed is caught (``verify_run``). The GPU path is to move onto an
    agent (the GPU-devices issue).

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
        cache_flush_bytes: int | None = None,
        post_checks: int = 2,
    ) -> None:
        self.device = device
        self.num_threads = num_threads
        self.warmup_ms, self.budget_ms = float(warmup_ms), float(budget_ms)
        self.min_iters, self.max_iters = int(min_iters), int(max_iters)
        self.timeout_s = float(timeout_s)
        self.python = python or sys.executable
        # written before each timed run: larger than any GPU's L2 (H200: 60 MB), so no run is timed warm
        self.cache_flush_bytes = int(cache_flush_bytes if cache_flush_bytes is not None
                                     else (256 << 20 if device != "cpu" else 0))
        self.post_checks = int(post_checks)  # new input sets run after timing, through the timing buffers
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

    def __enter__(self) -> "CudaLocalMeasure":
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
            # after the timed runs, new inputs the kernel has never seen go through the very buffers it was
            # timed on (the host chose them; a kernel that returns what it computed before is caught)
            fresh = [_fresh_like(inputs, secrets.randbits(52)) for _ in range(self.post_checks)]
            sets = []
            for i, s in enumerate([inputs, *fresh]):
                sets.append([f"in_{i}_{k}.npy" for k in range(len(s))])
                for k, x in enumerate(s):
                    np.save(jobdir / sets[i][k], np.ascontiguousarray(x))
            artifact = Path(artifact_path).resolve()
            request = {
                "protocol": 1, "backend": "tvm-kernel", "artifact": str(artifact),
                "artifact_sha256": hashlib.sha256(artifact.read_bytes()).hexdigest(),
                "params": {"device": self.device},
                "input_names": [f"arg{k}" for k in range(len(inputs))], "inputs": sets[:1],
                "post_timing_sets": sets[1:],
                "outputs": [
                    {"name": s.name, "dtype": s.dtype, "shape": list(s.shape)} for s in output_specs
                ],
                "timing_set": 0, "warmup_ms": self.warmup_ms, "budget_ms": self.budget_ms,
                "cache_flush_bytes": self.cache_flush_bytes,
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
            post = result.get("post_timing_outputs") or []
            if len(post) != len(fresh):
                return KernelRun("error", f"the worker returned {len(post)} post-timing checks of {len(fresh)}")
            checks = [(f, [np.load(jobdir / n) for n in names]) for f, names in zip(fresh, post)]
            return KernelRun("ok", "", [int(s) for s in result["samples_ns"]], outputs, repeats, result.get("load_ms"),
                             post_checks=checks)
        finally:
            shutil.rmtree(jobdir, ignore_errors=True)


