"""A judgement's settings (``JudgeConfig``), one kernel's verdict on one device (``Judged``) and
the leaderboard over them (fast_p: the share of kernels whose whole 95% interval is at or above p)."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Sequence

SCHEMA = "edgetune.judge/1"
FAST_P = (1.0, 1.5, 2.0)
DEFAULT_ROUNDS = 5


@dataclass
class JudgeConfig:
    op: str = ""
    kernels: Sequence[str] = ()
    devices: Sequence[str] = ("local",)
    rounds: int = DEFAULT_ROUNDS
    budget_ms: float = 50.0
    timeout_s: float = 60.0
    memory_mb: int = 4096  # resident memory of a kernel run, all its processes (the agent's supervisor)
    num_threads: int | None = None
    cflags: Sequence[str] = ()
    exact_shape: bool = False
    baseline: bool = True
    db: str | None = None
    report_dir: str | None = None
    command: str = ""
    inventory: Any = None  # an Inventory (tests); default: the user's
    build_dir: str | None = None  # where built kernels are cached (default EDGETUNE_HOME/judge)


@dataclass
class Judged:
    """One kernel on one device: what the JSON and the leaderboard show."""

    kernel: str
    path: str
    kind: str
    file_sha256: str
    device: str
    abi: str | None = None
    artifact_sha256: str | None = None
    build: dict[str, Any] | None = None
    correct: bool = False
    failure: str | None = None  # the first failed check by name
    errors: list[str] = field(default_factory=list)
    checks: list[dict[str, Any]] = field(default_factory=list)  # every verification: spec, round, ok, code
    speed: dict[str, Any] | None = None
    fast: dict[str, bool | None] = field(default_factory=dict)
    sandbox: str | None = None
    handshake_ns: float | None = None
    timer: str | None = None  # how the agent's worker waited for the kernel's return: spin | sleep
    median_ns: float | None = None
    round_samples_ns: list[list[int]] = field(default_factory=list)

    def fail(self, code: str, error: str) -> None:
        if self.correct or self.failure is None:
            self.failure = code
        self.correct = False
        self.errors.append(error)

    def as_dict(self) -> dict[str, Any]:
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        d["fast"] = {fast_key(p): v for p, v in self.fast.items()} if self.fast else {}
        return d


def fast_key(p: float) -> str:
    return f"{p:g}"


def leaderboard(results: Sequence[Judged], emulated: Any = None) -> dict[str, Any]:
    """KernelBench's fast_p with intervals: the fraction correct, and the fraction correct with
    the whole 95% interval of the speedup over the strongest baseline at or above p."""
    n = len(results)
    correct = sum(1 for r in results if r.correct)
    board: dict[str, Any] = {"kernels": n, "correct": correct, "fraction_correct": correct / n if n else None}
    for p in FAST_P:
        if emulated:
            board[f"fast_{fast_key(p)}"] = None
            continue
        hits = sum(1 for r in results if r.correct and r.fast.get(p))
        board[f"fast_{fast_key(p)}"] = hits / n if n else None
    failures: dict[str, int] = {}
    for r in results:
        if r.failure:
            failures[r.failure] = failures.get(r.failure, 0) + 1
    board["failures"] = dict(sorted(failures.items()))
    return board


# ---------------------------------------------------------------------------------------------
# Evidence: the report directory
# ---------------------------------------------------------------------------------------------
