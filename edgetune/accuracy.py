"""Accuracy of approximate candidates (int8, fp16) against the fp32 reference, and the user's budget.

An exact candidate must match the reference within the dtype's tolerance (``verify.py``). An
approximate one cannot, by design, so it gets its own verdict instead: the accuracy it keeps,
taken as the WORST over every output it returned that the host checked (every input set, the
repeat, and every timed iteration replayed on fresh inputs), so a candidate that is accurate when
checked and sloppy when timed is judged by its sloppiest run. Every other check of the verifier
(inputs unchanged, sensitivity, determinism, stale and late outputs, TEST04, roofline) applies to
it unchanged.

* ``cosine``: cosine similarity of output and reference, each flattened, in float64 (minimum);
* ``max_abs``: largest absolute elementwise error (maximum);
* ``top1``: for classifier outputs, the share of rows whose arg-max class agrees with the
  reference's (minimum over outputs, pooled over runs). A classifier output is one named
  ``logits`` (classes on the last axis, or axis 1 for an NCHW segmentation map) or any float output
  of shape [N, C] with C >= 10. ``None`` when the model has none.

A budget (``--accuracy cosine=0.999 --accuracy max-abs=0.05 --accuracy top1=0.99``) names the floor
or ceiling of each metric; an approximate candidate is selectable only when a budget is set and
every metric it names holds. Without a budget only exact candidates are selected.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from edgetune.errors import UserInputError

METRICS = {"cosine": "cosine", "max-abs": "max_abs", "max_abs": "max_abs", "top1": "top1"}
TOP1_MIN_CLASSES = 10


@dataclass(frozen=True)
class AccuracyBudget:
    cosine: float | None = None  # minimum cosine similarity
    max_abs: float | None = None  # maximum absolute error
    top1: float | None = None  # minimum top-1 agreement (0..1)

    @property
    def set(self) -> bool:
        return any(v is not None for v in (self.cosine, self.max_abs, self.top1))

    @classmethod
    def parse(cls, specs: Sequence[str] | None) -> "AccuracyBudget":
        """``["cosine=0.999", "max-abs=0.05,top1=0.99"]`` -> a budget; bad input raises UserInputError."""
        vals: dict[str, float] = {}
        for spec in specs or ():
            for part in str(spec).split(","):
                part = part.strip()
                if not part:
                    continue
                name, sep, value = part.partition("=")
                key = METRICS.get(name.strip().lower())
                if not sep or key is None:
                    raise UserInputError(f"--accuracy {part!r}: expected cosine=X, max-abs=X or top1=X")
                try:
                    v = float(value)
                except ValueError:
                    raise UserInputError(f"--accuracy {part!r}: {value!r} is not a number") from None
                if not math.isfinite(v):
                    raise UserInputError(f"--accuracy {part!r}: must be finite")
                if key in ("cosine", "top1") and not 0.0 <= v <= 1.0:
                    raise UserInputError(f"--accuracy {part!r}: {name} is between 0 and 1")
                if key == "max_abs" and v < 0:
                    raise UserInputError(f"--accuracy {part!r}: max-abs must be >= 0")
                if key in vals:
                    raise UserInputError(f"--accuracy names {name} twice")
                vals[key] = v
        return cls(**vals)

    @classmethod
    def from_dict(cls, d: dict | None) -> "AccuracyBudget":
        """The budget ``as_dict`` wrote (a run's recorded config, a package): unknown keys ignored."""
        return cls(**{k: float(v) for k, v in (d or {}).items() if k in ("cosine", "max_abs", "top1")})

    def as_dict(self) -> dict:
        return {k: v for k, v in (("cosine", self.cosine), ("max_abs", self.max_abs), ("top1", self.top1))
                if v is not None}

    def label(self) -> str:
        d = self.as_dict()
        return ", ".join(f"{k.replace('_', '-')}={v:g}" for k, v in d.items()) or "none"

    def violations(self, acc: "Accuracy") -> list[str]:
        """What of this budget ``acc`` breaks (empty: within budget)."""
        out = []
        if self.cosine is not None and not acc.cosine >= self.cosine:
            out.append(f"cosine {acc.cosine:.6f} < {self.cosine:g}")
        if self.max_abs is not None and not acc.max_abs <= self.max_abs:
            out.append(f"max-abs {acc.max_abs:.3g} > {self.max_abs:g}")
        if self.top1 is not None:
            t = acc.top1
            if t is None:
                out.append("top1 asked for, but the model has no classifier output")
            elif not t >= self.top1:
                out.append(f"top-1 agreement {t:.4f} < {self.top1:g}")
        return out


def class_axis(name: str, shape: Sequence[int]) -> int | None:
    """The class axis of a classifier output (see the module docstring), else None."""
    rank = len(shape)
    if "logits" in name.lower():
        if rank == 4:
            return 1
        if rank >= 2 and shape[-1] >= 2:
            return rank - 1
        return None
    if rank == 2 and shape[-1] >= TOP1_MIN_CLASSES:
        return 1
    return None


def cosine(out: np.ndarray, ref: np.ndarray) -> float:
    o = np.asarray(out, np.float64).ravel()
    r = np.asarray(ref, np.float64).ravel()
    if not (np.all(np.isfinite(o)) and np.all(np.isfinite(r))):
        return 0.0 if not np.array_equal(o, r, equal_nan=True) else 1.0
    no, nr = float(np.linalg.norm(o)), float(np.linalg.norm(r))
    if no == 0.0 and nr == 0.0:
        return 1.0
    if no == 0.0 or nr == 0.0:
        return 0.0
    return float(np.dot(o, r) / (no * nr))


@dataclass
class Accuracy:
    """Worst-case accuracy over every checked output (accumulated by ``add``)."""

    cosine: float = 1.0
    max_abs: float = 0.0
    runs: int = 0
    _top1: dict[str, list[int]] = field(default_factory=dict)  # output -> [agree, rows]

    def add(self, name: str, out: np.ndarray, ref: np.ndarray) -> None:
        o = np.asarray(out, np.float64)
        r = np.asarray(ref, np.float64)
        self.cosine = min(self.cosine, cosine(o, r))
        if o.size:
            d = np.abs(o - r)
            d = np.where(np.isnan(d), np.inf, d)
            self.max_abs = max(self.max_abs, float(d.max()))
        ax = class_axis(name, r.shape)
        if ax is not None and o.shape == r.shape and r.size:
            agree = np.argmax(o, axis=ax) == np.argmax(r, axis=ax)
            t = self._top1.setdefault(name, [0, 0])
            t[0] += int(agree.sum())
            t[1] += int(agree.size)

    def add_run(self, names: Sequence[str], outs: Sequence[np.ndarray], refs: Sequence[np.ndarray]) -> None:
        for n, o, r in zip(names, outs, refs):
            self.add(n, o, r)
        self.runs += 1

    @property
    def top1(self) -> float | None:
        shares = [a / n for a, n in self._top1.values() if n]
        return min(shares) if shares else None

    def as_dict(self) -> dict:
        return {"cosine": self.cosine, "max_abs": self.max_abs, "top1": self.top1, "runs": self.runs}

    def label(self) -> str:
        t = self.top1
        return (f"cosine {self.cosine:.6f}, max-abs {self.max_abs:.3g}"
                + (f", top-1 {t:.4f}" if t is not None else ""))
