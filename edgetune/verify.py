"""Verifier: the host compares what the device returned with references it never sent (DESIGN.md §5).

Checks, each recorded with a reason when it fails:
  * every output present, right shape and dtype, no NaN/Inf where the reference is finite
    (outputs are poisoned with NaN before each run, so a skipped write shows up here);
  * every input set within tolerance of the reference (per-dtype tolerance, max abs/rel error kept);
  * determinism: the timed input run twice gives the same output;
  * sensitivity: different inputs give different outputs (catches constant or cached outputs);
  * immutability: the inputs' sha256 after the run equals what the host sent.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

# Allowed error relative to the output's scale (max |ref|), per output dtype.
TOLERANCE = {
    "float64": 1e-6,
    "float32": 1e-4,
    "float16": 1e-2,
    "bfloat16": 3e-2,
}
LOOSE_DTYPES = {"float16", "bfloat16", "int8", "uint8"}


def tolerance_for(dtype: str, override: float | None = None) -> float:
    if override is not None:
        return override
    if dtype in TOLERANCE:
        return TOLERANCE[dtype]
    return 0.0  # integers and bools must match exactly


def array_sha256(arr: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(arr).tobytes()).hexdigest()


@dataclass(frozen=True)
class ErrorStats:
    max_abs: float
    max_rel: float  # max |y - ref| / max(|ref|) over the output: error relative to the output's scale


@dataclass(frozen=True)
class Verdict:
    ok: bool
    reason: str
    max_abs_err: float
    max_rel_err: float
    tolerance: float
    deterministic: bool
    bitwise_deterministic: bool
    checks: tuple[str, ...] = field(default=())

    def as_dict(self) -> dict:
        return {
            "ok": self.ok,
            "reason": self.reason,
            "max_abs_err": self.max_abs_err,
            "max_rel_err": self.max_rel_err,
            "tolerance": self.tolerance,
            "deterministic": self.deterministic,
            "bitwise_deterministic": self.bitwise_deterministic,
            "checks": list(self.checks),
        }

    @classmethod
    def failed(cls, reason: str) -> "Verdict":
        return cls(False, reason, float("nan"), float("nan"), float("nan"), False, False)


def compare(out: np.ndarray, ref: np.ndarray) -> ErrorStats:
    o = out.astype(np.float64)
    r = ref.astype(np.float64)
    if o.size == 0:
        return ErrorStats(0.0, 0.0)
    diff = np.abs(o - r)
    max_abs = float(np.nanmax(diff)) if not np.all(np.isnan(diff)) else float("inf")
    if np.any(np.isnan(diff) & ~np.isnan(r)):
        max_abs = float("inf")
    scale = float(np.max(np.abs(r[np.isfinite(r)]))) if np.any(np.isfinite(r)) else 0.0
    max_rel = max_abs / scale if scale > 0 else (0.0 if max_abs == 0 else float("inf"))
    return ErrorStats(max_abs, max_rel)


def _check_array(name: str, out: np.ndarray | None, ref: np.ndarray) -> str | None:
    if out is None:
        return f"output {name} missing"
    if tuple(out.shape) != tuple(ref.shape):
        return f"output {name} has shape {tuple(out.shape)}, reference {tuple(ref.shape)}"
    if out.dtype != ref.dtype:
        return f"output {name} has dtype {out.dtype}, reference {ref.dtype}"
    if out.dtype.kind == "f":
        bad = ~np.isfinite(out) & np.isfinite(ref)
        if np.any(bad):
            nan = int(np.isnan(out[bad]).sum())
            return (f"output {name} has {int(bad.sum())} non-finite values ({nan} NaN) where the "
                    f"reference is finite (unwritten or overflowed elements)")
    return None


def verify(
    output_names: Sequence[str],
    references: Sequence[Sequence[np.ndarray]],
    outputs: Sequence[Sequence[np.ndarray | None]],
    repeat_outputs: Sequence[np.ndarray | None],
    timing_set: int,
    input_hashes_sent: Sequence[str],
    input_hashes_before: Sequence[str] | None,
    input_hashes_after: Sequence[str] | None,
    tolerance: float | None = None,
) -> Verdict:
    """references[i][k]: reference for input set i, output k; outputs likewise from the device."""
    checks: list[str] = []
    if len(outputs) != len(references):
        return Verdict.failed(f"device returned {len(outputs)} output sets, expected {len(references)}")

    # integrity of what we sent, then immutability of the inputs
    if input_hashes_before is not None and list(input_hashes_before) != list(input_hashes_sent):
        return Verdict.failed("inputs arrived corrupted on the device (sha256 differs from what was sent)")
    if input_hashes_after is None or list(input_hashes_after) != list(input_hashes_sent):
        return Verdict.failed("candidate modified its inputs (input sha256 changed during the run)")
    checks.append("inputs unchanged")

    worst_abs = 0.0
    worst_rel = 0.0
    tol_used = 0.0
    for i, (refs, outs) in enumerate(zip(references, outputs)):
        if len(outs) != len(refs):
            return Verdict.failed(f"input set {i}: {len(outs)} outputs, expected {len(refs)}")
        for name, ref, out in zip(output_names, refs, outs):
            problem = _check_array(name, out, ref)
            if problem:
                return Verdict.failed(f"input set {i}: {problem}")
            err = compare(out, ref)
            tol = tolerance_for(str(ref.dtype), tolerance)
            tol_used = max(tol_used, tol)
            worst_abs = max(worst_abs, err.max_abs)
            worst_rel = max(worst_rel, err.max_rel)
            if not err.max_rel <= tol:
                return Verdict(False, f"input set {i}: output {name} off by {err.max_rel:.3g} of its scale "
                               f"(max abs {err.max_abs:.3g}) > tolerance {tol:.0e}",
                               worst_abs, worst_rel, tol, False, False, tuple(checks))
    checks.append(f"{len(references)} input sets within tolerance")

    # determinism
    firsts = outputs[timing_set]
    bitwise = True
    deterministic = True
    for name, a, b, ref in zip(output_names, firsts, repeat_outputs, references[timing_set]):
        if b is None:
            return Verdict(False, f"repeat run returned no output {name}", worst_abs, worst_rel, tol_used,
                           False, False, tuple(checks))
        if a.shape != b.shape or not np.array_equal(a, b, equal_nan=False):
            bitwise = False
            if a.shape != b.shape:
                deterministic = False
            else:
                err = compare(b, a)
                tol = tolerance_for(str(ref.dtype), tolerance)
                if not err.max_rel <= tol / 10:
                    deterministic = False
    if not deterministic:
        return Verdict(False, "non-deterministic: the same input twice gave different outputs",
                       worst_abs, worst_rel, tol_used, False, False, tuple(checks))
    checks.append("deterministic" + (" (bitwise)" if bitwise else " (within tolerance/10)"))

    # sensitivity: a different input must give a different output
    if len(outputs) > 1:
        for i in range(1, len(outputs)):
            refs_differ = any(not np.array_equal(r0, ri) for r0, ri in zip(references[0], references[i]))
            outs_differ = any(not np.array_equal(o0, oi) for o0, oi in zip(outputs[0], outputs[i]))
            if refs_differ and not outs_differ:
                return Verdict(False, f"insensitive: input sets 0 and {i} gave identical outputs",
                               worst_abs, worst_rel, tol_used, deterministic, bitwise, tuple(checks))
        checks.append("different inputs give different outputs")

    return Verdict(True, "", worst_abs, worst_rel, tol_used, deterministic, bitwise, tuple(checks))
