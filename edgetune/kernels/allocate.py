"""How a model's trial budget is shared among its kernels.

An even split spends as many trials on a 10 µs reshape-like kernel as on the 200 µs convolution
that dominates the model. ``TrialAllocator`` gives every kernel an equal first slice (half the
budget), then hands out the rest in chunks, each to the kernel that currently costs the model the
most time: ``weight × best latency`` (weight = calls per model run), halved for every chunk that
did not improve that kernel by at least ``min_gain`` (a converged or memory-bound kernel stops
soaking up trials). It is the idea of MetaSchedule's gradient task scheduler, kept outside TVM so
that every trial still goes through edgetune's verified measurement. ``first_share=1.0`` is the
even split (the remainder, fewer trials than kernels, goes to the slowest kernel), which is what
``tune_relax_model`` uses by default: at 256 trials on the bundled MobileNet the weighted share did
not beat it (tools/bench/bench_model_tuning.py; see docs/results/tvm-models.md).

Pure bookkeeping (no TVM): ``first_round()`` gives the cumulative targets of the first slice;
after each tuning call, ``report(name, best_latency_ns)``; ``next_chunk()`` returns
``(name, cumulative_target)`` or None when the budget is spent.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass
class _Task:
    weight: int
    target: int = 0
    best_ns: float | None = None
    stalls: int = 0


@dataclass
class TrialAllocator:
    weights: dict[str, int]
    total: int
    first_share: float = 0.5
    min_gain: float = 0.01
    chunk: int = 0  # 0: max(8, total // (2 · kernels))
    _tasks: dict[str, _Task] = field(init=False, default_factory=dict)
    _left: int = field(init=False, default=0)

    def __post_init__(self) -> None:
        if self.total < 0:
            raise ValueError(f"total trials must be >= 0, got {self.total}")
        if any(w < 1 for w in self.weights.values()):
            raise ValueError("kernel weights must be >= 1")
        self._tasks = {name: _Task(weight=w) for name, w in self.weights.items()}
        self._left = self.total
        n = len(self._tasks)
        if not self.chunk:
            self.chunk = max(8, self.total // (2 * n)) if n else 0

    @property
    def left(self) -> int:
        return self._left

    def first_round(self) -> dict[str, int]:
        """Cumulative trial targets of the equal first slice (at least 1 each while trials last)."""
        n = len(self._tasks)
        if n == 0 or self.total == 0:
            return {}
        each = max(1, int(self.total * self.first_share) // n)
        out = {}
        for name, t in self._tasks.items():
            give = min(each, self._left)
            if give <= 0:
                break
            t.target += give
            self._left -= give
            out[name] = t.target
        return out

    def report(self, name: str, best_ns: float | None) -> None:
        """The kernel's best verified latency after its latest tuning call (None: nothing valid)."""
        t = self._tasks[name]
        if best_ns is None or not math.isfinite(best_ns) or best_ns <= 0:
            t.stalls += 1
            return
        if t.best_ns is not None and best_ns > t.best_ns * (1.0 - self.min_gain):
            t.stalls += 1
        if t.best_ns is None or best_ns < t.best_ns:
            t.best_ns = best_ns
        # an improvement keeps `stalls` where it was: one lucky chunk does not reset a slow kernel

    def priority(self, name: str) -> float:
        t = self._tasks[name]
        if t.best_ns is None:  # no valid kernel from its first slice: behind every kernel with a cost
            return -1.0
        return t.weight * t.best_ns * 0.5 ** t.stalls

    def next_chunk(self) -> tuple[str, int] | None:
        if self._left <= 0 or not self._tasks:
            return None
        name = max(self._tasks, key=lambda k: (self.priority(k), k))
        give = min(self.chunk, self._left)
        self._tasks[name].target += give
        self._left -= give
        return name, self._tasks[name].target

    def targets(self) -> dict[str, int]:
        return {name: t.target for name, t in self._tasks.items()}
