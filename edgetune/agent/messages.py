"""What the host and a device agent exchange (device_agents/PROTOCOL.md): the agent's info reply
(``AgentInfo``), a job (``Job``) and its validated result (``JobResult``), with the protocol's
version and the bounds a job runs under. Plain values: ``host.py`` sends and receives them,
``validate.py`` builds them from a device's untrusted reply.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from edgetune.devices.inventory import fingerprint_key

PROTOCOL = 3
CHECK_ITERS = 4  # timed iterations, picked at random after they returned, whose outputs are verified
CHECK_FASTEST = 2  # ... and the fastest timed iterations (where skipped work would show)
PROBE_PAIRS = 16  # TEST04 probe: at most this many repeated-input / new-input pairs (at least 8)


# bounds a candidate runs under on the device (the agent's supervisor enforces them; PROTOCOL.md)
MEMORY_MB = 4096  # resident memory of the candidate and everything it spawns
MAX_PROCS = 64  # processes the candidate may have at once (itself included)
RESULT_SLACK = 8 << 20  # bytes of a result bundle beyond its arrays (result.json, headers)



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
    memory_mb: int | None = MEMORY_MB
    max_procs: int | None = MAX_PROCS
    placement: bool = False  # also report which execution provider ran each node (Python agent, onnxruntime)

    def max_bundle_bytes(self) -> int:
        """The most a correct agent can send back for this job: every output array of every input
        set, the repeat, the kept timed iterations and the late-write check, plus headers."""
        per_set = sum(int(np.prod(o["shape"], dtype=np.int64)) * 8 for o in self.output_specs)
        arrays = per_set * (len(self.input_sets) + 2 + self.check_iters + self.check_fastest)
        return int(arrays + RESULT_SLACK + 4096 * len(self.output_specs) * (len(self.input_sets) + 8))


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
    phases_ms: dict[str, float] = field(default_factory=dict)  # the worker's time per stage (informational)
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
    limit: str = ""  # a bound the agent's supervisor enforced: memory | processes | time | output
    limits_enforced: dict[str, Any] = field(default_factory=dict)  # how each bound was enforced
    invalid: str = ""  # the device's answer broke the protocol (validate.py): the verdict code it gets
    fault: dict[str, str] | None = None  # judge backend: {"code", "detail"} of what the kernel did
    backend_info: dict[str, Any] = field(default_factory=dict)  # how the backend ran (sandbox, ...)
    # {"intended": provider, "nodes": {provider: count}} or {"error": why} when asked for; None otherwise
    placement: dict[str, Any] | None = None
    wall_ms: float = 0.0  # host-side wall time of the whole job (transfer + process + run)
    agent_ms: float = 0.0  # time of the remote agent command alone

    @property
    def ok(self) -> bool:
        return self.status == "ok"
