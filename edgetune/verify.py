"""Verifier: the host compares what the device returned with references it never sent (docs/design.md §5).

The one verifier of edgetune: model candidates (tune, bench, verify), kernels (tune-kernels, the
MetaSchedule runner) and baselines all go through ``verify_job``. Every failure has a named code
(``Verdict.code``) and a one-line reason; the conformance suite (tests/conformance) proves that each
kind of cheating or buggy candidate is caught under its own code.

What is checked, in order (device_agents/PROTOCOL.md describes what the agent does for each):
  * the job ran (crashed / hung / error / out-of-bounds write reported by the agent's guard zones);
  * inputs arrived intact (sha256 before the run) and the buffers the candidate received are
    unchanged after each checked run (``input-mutated``);
  * every input set: outputs present, right shape and dtype, finite where the reference is
    (outputs are poisoned before each run: ``non-finite`` catches unwritten elements), within
    tolerance elementwise and in norm (``wrong-output``, or ``imprecise`` when the error is at the
    level of a lower precision);
  * determinism: the same input twice gives the same output (repeat outputs are required);
  * sensitivity: different inputs give different outputs (``insensitive``);
  * timed work is verified work: outputs of timed iterations picked by the agent after they
    returned are checked against references of the fresh inputs the host replays
    (``stale-output`` when an output repeats one computed for other inputs);
  * the last timed call's outputs did not change after it returned (``late-write``);
  * MLPerf TEST04: a candidate much faster on a repeated input than on distinct ones (``caching``);
  * no timing faster than the device's roofline (``impossible-timing``).
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from edgetune.accuracy import Accuracy, AccuracyBudget
from edgetune.agent.fresh import fresh_inputs
from edgetune.agent.host import JobResult


@dataclass(frozen=True)
class Tolerance:
    """|y - r| <= atol * scale + rtol * |r| elementwise, with scale the reference's RMS (not its
    maximum: inputs carry 16x outliers, and a max-based scale would let most elements be far off),
    and ||y - r|| / ||r|| <= norm."""

    atol: float
    rtol: float
    norm: float

    def as_dict(self) -> dict:
        return {"atol": self.atol, "rtol": self.rtol, "norm": self.norm}


TOLERANCES = {
    "float64": Tolerance(1e-6, 1e-6, 1e-7),
    "float32": Tolerance(2e-4, 1e-4, 1e-4),
    "float16": Tolerance(1e-2, 1e-2, 5e-3),
    "bfloat16": Tolerance(3e-2, 3e-2, 1.5e-2),
}
EXACT = Tolerance(0.0, 0.0, 0.0)  # integers and bools must match exactly
# a norm-relative error above this is a wrong result, below it (but above tolerance) an imprecise one
WRONG_NORM = 1e-2
# TEST04: a candidate this much faster on one repeated input than on distinct inputs caches results
CACHE_RATIO = 1.5
# ... judged as a binomial test (``_check_probe``): "caching" when the repeat is clearly faster in
# more pairs than an honest candidate would be with probability PROBE_ALPHA, an honest one being
# clearly faster in a pair at the rate the timed calls show, and at least PROBE_NULL_RATE
PROBE_ALPHA = 1e-3
PROBE_NULL_RATE = 0.25
# A timing needs a kernel faster than this multiple of the device's peak FLOP/s to be "impossible".
# Above 1 because fast algorithms (Winograd, Strassen) do fewer multiplications than the op's count.
ROOFLINE_MARGIN = 1.25


def tolerance_for(dtype: str, override: float | None = None) -> Tolerance:
    if override is not None:
        return Tolerance(override, override, override)
    return TOLERANCES.get(dtype, EXACT)


def array_sha256(arr: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(arr).tobytes()).hexdigest()


@dataclass(frozen=True)
class ErrorStats:
    max_abs: float
    max_rel: float  # max |y - r| / scale (scale: RMS of the reference)
    norm_rel: float  # ||y - r|| / ||r||
    excess: float  # max over elements of |y - r| / (atol * scale + rtol * |r|): <= 1 passes
    worst_index: tuple[int, ...]


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
    code: str = "ok"
    norm_rel_err: float = float("nan")
    timed_checked: int = 0
    accuracy: dict | None = None  # approximate candidates: accuracy.Accuracy.as_dict() (worst over checked runs)

    def as_dict(self) -> dict:
        return {
            "ok": self.ok, "code": self.code, "reason": self.reason,
            "max_abs_err": self.max_abs_err, "max_rel_err": self.max_rel_err, "norm_rel_err": self.norm_rel_err,
            "tolerance": self.tolerance, "deterministic": self.deterministic,
            "bitwise_deterministic": self.bitwise_deterministic, "timed_checked": self.timed_checked,
            "checks": list(self.checks),
            **({"accuracy": self.accuracy} if self.accuracy is not None else {}),
        }

    @classmethod
    def failed(cls, reason: str, code: str = "error") -> "Verdict":
        return cls(False, reason, float("nan"), float("nan"), float("nan"), False, False, code=code)


def compare(out: np.ndarray, ref: np.ndarray, tol: Tolerance | None = None) -> ErrorStats:
    tol = tol or tolerance_for(str(ref.dtype))
    o = np.asarray(out, np.float64)
    r = np.asarray(ref, np.float64)
    if o.size == 0:
        return ErrorStats(0.0, 0.0, 0.0, 0.0, ())
    finite = np.isfinite(r)
    diff = np.abs(o - r)
    diff = np.where(finite, diff, np.where(o == r, 0.0, np.inf))  # a non-finite reference must be matched
    diff = np.where(np.isnan(diff), np.inf, diff)
    rf = np.where(finite, r, 0.0)
    scale = float(np.sqrt(np.mean(rf * rf)))
    max_abs = float(diff.max())
    max_rel = max_abs / scale if scale > 0 else (0.0 if max_abs == 0 else math.inf)
    rnorm = float(np.linalg.norm(rf))
    dn = float(np.linalg.norm(np.where(np.isfinite(diff), diff, 0.0))) if np.all(np.isfinite(diff)) else math.inf
    norm_rel = dn / rnorm if rnorm > 0 else (0.0 if dn == 0 else math.inf)
    bound = tol.atol * scale + tol.rtol * np.abs(rf)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(diff == 0, 0.0, diff / bound)
    idx = np.unravel_index(int(np.argmax(ratio)), ratio.shape)
    return ErrorStats(max_abs, max_rel, norm_rel, float(ratio[idx]), tuple(int(i) for i in idx))


class Fail(Exception):
    def __init__(self, code: str, reason: str):
        super().__init__(reason)
        self.code = code
        self.reason = reason


@dataclass
class Errors:
    max_abs: float = 0.0
    max_rel: float = 0.0
    norm_rel: float = 0.0
    tol: float = 0.0

    def add(self, e: ErrorStats, tol: Tolerance) -> None:
        self.max_abs = max(self.max_abs, e.max_abs)
        self.max_rel = max(self.max_rel, e.max_rel)
        self.norm_rel = max(self.norm_rel, e.norm_rel)
        self.tol = max(self.tol, tol.atol)


def _check_outputs(where: str, names: Sequence[str], outs: Sequence[np.ndarray | None], refs: Sequence[np.ndarray],
                   errors: Errors, override: float | None, timed: bool = False,
                   dtypes: Sequence[str] | None = None, acc: Accuracy | None = None) -> None:
    try:
        check_values(where, names, outs, refs, errors, override, dtypes, acc)
    except Fail as f:
        # right when checked, wrong when timed: the signature of work skipped once warm
        if timed and f.code in ("non-finite", "wrong-output", "imprecise"):
            raise Fail("wrong-when-timed", f.reason + " (the untimed runs were right)") from None
        raise


def check_values(where: str, names: Sequence[str], outs: Sequence[np.ndarray | None], refs: Sequence[np.ndarray],
                  errors: Errors, override: float | None, dtypes: Sequence[str] | None = None,
                  acc: Accuracy | None = None) -> None:
    """Presence, shape, dtype and finiteness of every output; then its values: within tolerance, or
    for an approximate candidate (``acc`` given) added to its accuracy instead."""
    if len(outs) != len(refs):
        raise Fail("missing-output", f"{where}: {len(outs)} outputs, expected {len(refs)}")
    for i, (name, out, ref) in enumerate(zip(names, outs, refs)):
        # the output's dtype is the spec's; a reference may be computed in higher precision (float64)
        want = np.dtype(dtypes[i]) if dtypes else ref.dtype
        if out is None:
            raise Fail("missing-output", f"{where}: output {name} missing")
        if tuple(out.shape) != tuple(ref.shape) or out.dtype != want:
            raise Fail("missing-output", f"{where}: output {name} is {out.dtype}{list(out.shape)}, "
                                          f"expected {want}{list(ref.shape)}")
        if out.dtype.kind == "f":
            bad = ~np.isfinite(out) & np.isfinite(ref)
            if np.any(bad):
                nan = int(np.isnan(out[bad]).sum())
                raise Fail("non-finite", f"{where}: output {name} has {int(bad.sum())} of {out.size} non-finite "
                                          f"values ({nan} NaN) where the reference is finite (unwritten or overflowed)")
        if acc is not None:
            acc.add(name, out, ref)
            continue
        tol = tolerance_for(str(want), override)
        e = compare(out, ref, tol)
        errors.add(e, tol)
        if e.excess > 1.0 or e.norm_rel > tol.norm:
            got, want = out[e.worst_index], ref[e.worst_index]
            code = "wrong-output" if e.norm_rel > WRONG_NORM else "imprecise"
            what = "wrong" if code == "wrong-output" else "imprecise (error at the level of a lower precision)"
            raise Fail(code, f"{where}: output {name} {what}: norm error {e.norm_rel:.3g} (tolerance {tol.norm:.0e}), "
                              f"max error {e.max_rel:.3g} of its RMS scale at {e.worst_index} "
                              f"(got {float(got):.6g}, want {float(want):.6g})")
    if acc is not None:
        acc.runs += 1


def _same(a: Sequence[np.ndarray | None], b: Sequence[np.ndarray | None]) -> bool:
    # NaN never equals NaN here: unwritten (poisoned) outputs are "non-finite", not a repeat
    return len(a) == len(b) and all(x is not None and y is not None and x.shape == y.shape and
                                    np.array_equal(x, y) for x, y in zip(a, b))


def _refs_differ(a: Sequence[np.ndarray], b: Sequence[np.ndarray]) -> bool:
    return any(x.shape != y.shape or not np.allclose(x, y, rtol=1e-3, atol=1e-6, equal_nan=True) for x, y in zip(a, b))


_LIMIT_CODES = {"memory": "out-of-memory", "processes": "too-many-processes", "time": "hung",
                "output": "result-too-large"}


def verify_job(
    res: JobResult,
    input_sets: Sequence[Sequence[np.ndarray]],
    references: Sequence[Sequence[np.ndarray]],
    reference_fn: Callable[[list[np.ndarray]], list[np.ndarray]],
    output_names: Sequence[str],
    *,
    tolerance: float | None = None,
    flops: float | None = None,
    peak_gflops: float | None = None,
    timings_trusted: bool = True,
    output_dtypes: Sequence[str] | None = None,
    require_timed: bool = True,
    approximate: bool = False,
    budget: AccuracyBudget | None = None,
) -> Verdict:
    """Verify one job's result. references[i][k]: reference of input set i, output k (what the host
    computed for what it sent); reference_fn(inputs) computes references of replayed fresh inputs.
    ``flops``/``peak_gflops``: the roofline check, when both are known. ``timings_trusted=False``
    (an emulated device, e.g. qemu, whose timings are not the hardware's) skips the two checks that
    rest on timings (TEST04 caching, roofline); every output check still applies.
    ``output_dtypes``: the outputs' dtypes when the references are computed in another precision.
    ``require_timed=False`` only for a measurer that cannot return timed iterations (legacy CUDA).
    ``approximate``: an int8/fp16 candidate, whose values get an accuracy verdict (edgetune/accuracy.py)
    instead of the tolerance: every other check applies; it passes only within a set ``budget``
    (code ``approximate`` without one, ``over-accuracy-budget`` outside it)."""
    if not res.ok:
        reason = res.reason or res.status
        if res.invalid:  # the device's answer broke the protocol (agent/validate.py)
            return Verdict.failed(reason, res.invalid)
        if res.fault:  # what the judge's sandbox or harness saw the kernel do
            return Verdict.failed(reason, res.fault["code"])
        if res.limit in _LIMIT_CODES:  # a bound the agent's supervisor enforced
            if res.limit == "memory":  # the bound is the user's to raise, for a model that needs more
                reason += " (a device's job memory bound: edgetune devices add NAME URL --memory-mb N)"
            return Verdict.failed(reason, _LIMIT_CODES[res.limit])
        if res.status == "crashed":
            return Verdict.failed(reason, "crashed")
        if res.status == "timeout":
            return Verdict.failed(reason, "hung")
        if "out-of-bounds" in reason:
            return Verdict.failed(reason, "out-of-bounds-write")
        return Verdict.failed(reason, "error")
    if not res.samples_ns:
        return Verdict.failed("no timing samples returned", "no-samples")
    errors = Errors()
    acc = Accuracy() if approximate else None
    checks: list[str] = []
    deterministic = bitwise = False
    names = list(output_names)
    try:
        sent = [[array_sha256(a) for a in s] for s in input_sets]
        if res.input_sha256_before is not None and list(res.input_sha256_before) != [h for s in sent for h in s]:
            raise Fail("error", "inputs arrived corrupted on the device (sha256 differs from what was sent)")
        if res.guard_violation:
            raise Fail("out-of-bounds-write", res.guard_violation)
        if len(res.outputs) != len(references):
            raise Fail("missing-output", f"device returned {len(res.outputs)} output sets, expected {len(references)}")
        after = res.input_sha256_after_sets
        if after is None or [list(x) for x in after] != sent:
            raise Fail("input-mutated", "candidate modified its inputs (input sha256 changed during a run)")
        checks.append(f"inputs unchanged ({res.input_check or 'agent copy'})")

        # sensitivity before values: a constant output is named as such, not as "wrong"
        for i in range(1, len(res.outputs)):
            if _refs_differ(references[0], references[i]) and _same(res.outputs[0], res.outputs[i]):
                raise Fail("insensitive", f"insensitive: input sets 0 and {i} gave identical outputs")
        if len(res.outputs) > 1:
            checks.append("different inputs give different outputs")
        for i, (refs, outs) in enumerate(zip(references, res.outputs)):
            _check_outputs(f"input set {i}", names, outs, refs, errors, tolerance, dtypes=output_dtypes, acc=acc)
        checks.append(f"{len(references)} input sets " + ("measured for accuracy" if acc else "within tolerance"))

        # determinism: required, not optional
        rep = res.repeat_outputs
        if not rep or len(rep) != len(names) or any(r is None for r in rep):
            raise Fail("non-deterministic", "no repeat outputs returned: determinism cannot be checked")
        bitwise = _same(res.outputs[0], rep)
        if not bitwise:
            for j, (name, a, b) in enumerate(zip(names, res.outputs[0], rep)):
                tol = tolerance_for(str(output_dtypes[j]) if output_dtypes else str(a.dtype), tolerance)
                e = compare(b, a, Tolerance(tol.atol / 10, tol.rtol / 10, tol.norm / 10))
                if a.shape != b.shape or e.excess > 1.0:
                    raise Fail("non-deterministic", f"non-deterministic: the same input twice gave different "
                                                     f"outputs ({name}: max difference {e.max_rel:.3g} of scale)")
        deterministic = True
        checks.append("deterministic" + (" (bitwise)" if bitwise else " (within tolerance/10)"))


        if res.late_change:
            raise Fail("late-write", f"outputs {res.late_change.get('outputs')} changed after the call of iteration "
                                      f"{res.late_change.get('iter')} returned (work finished outside the timed call)")
        if require_timed or res.timed_checks:
            n_timed = _check_timed(res, input_sets, references, reference_fn, names, errors, tolerance, output_dtypes,
                                   acc)
            checks.append(f"{n_timed} timed iterations verified on fresh inputs")
        else:
            n_timed = 0
            checks.append("timed iterations not verified (this measurer cannot return them)")
        if not timings_trusted:
            checks.append("timing checks not judged (emulated device)")
        elif len(res.probe_repeat_ns) >= 8:
            checks.append(_check_probe(res))
        else:
            checks.append("TEST04 not judged (fewer than 8 probe pairs fit the budget)")
        if flops and peak_gflops and timings_trusted:
            fastest = float(min(res.samples_ns))
            floor_ns = flops / (peak_gflops * ROOFLINE_MARGIN)
            if fastest < floor_ns:
                raise Fail("impossible-timing", f"impossible timing: {fastest:.0f} ns for {flops:.3g} FLOP is "
                                                 f"{flops / fastest:.1f} GFLOP/s, above the device's peak "
                                                 f"{peak_gflops:.1f} GFLOP/s x {ROOFLINE_MARGIN}")
            checks.append("within the device's roofline")
        if acc is not None:
            _check_budget(acc, budget)
            checks.append(f"within the accuracy budget ({budget.label()})")  # type: ignore[union-attr]
    except Fail as f:
        return Verdict(False, f.reason, errors.max_abs, errors.max_rel, errors.tol, deterministic, bitwise,
                       tuple(checks), f.code, errors.norm_rel, accuracy=acc.as_dict() if acc else None)
    if acc is not None:
        errors.max_abs = acc.max_abs
    return Verdict(True, "", errors.max_abs, errors.max_rel, errors.tol, True, bitwise, tuple(checks), "ok",
                   errors.norm_rel, n_timed, accuracy=acc.as_dict() if acc else None)


def _check_budget(acc: Accuracy, budget: AccuracyBudget | None) -> None:
    if budget is None or not budget.set:
        raise Fail("approximate", f"approximate ({acc.label()} over {acc.runs} checked runs): selectable only "
                                   f"under an accuracy budget (--accuracy cosine=X, max-abs=X, top1=X)")
    broken = budget.violations(acc)
    if broken:
        raise Fail("over-accuracy-budget", f"outside the accuracy budget: {'; '.join(broken)} "
                                            f"(worst of {acc.runs} checked runs)")


def _check_timed(res: JobResult, input_sets, references, reference_fn, names, errors: Errors, tolerance,
                 dtypes=None, acc: Accuracy | None = None) -> int:
    n = len(res.samples_ns)
    first = res.first_timed_iter
    if not res.timed_checks or first is None or res.fresh_seed is None:
        raise Fail("error", "the agent returned no outputs of timed iterations (protocol 2 needs them)")
    iters = [c.iteration for c in res.timed_checks]
    if len(set(iters)) != len(iters) or any(not (first <= it < first + n) for it in iters):
        raise Fail("error", f"timed checks name iterations {iters} outside the timed range [{first}, {first + n})")
    replayed = []
    for c in res.timed_checks:
        inputs = fresh_inputs(input_sets, res.fresh_seed, c.iteration)
        if c.input_sha256_after is None or list(c.input_sha256_after) != [array_sha256(a) for a in inputs]:
            raise Fail("input-mutated", f"timed iteration {c.iteration}: the candidate's input buffers differ from "
                                         f"the inputs it was given (modified during the run)")
        replayed.append(reference_fn(inputs))
    # stale first: an output that repeats one computed for other inputs is named as such, not as "wrong"
    seen = [(outs, refs, f"input set {i}") for i, (outs, refs) in enumerate(zip(res.outputs, references))]
    for c, refs in zip(res.timed_checks, replayed):
        for outs, other_refs, label in seen:
            if _same(c.outputs, outs) and _refs_differ(refs, other_refs):
                raise Fail("stale-output", f"stale output: timed iteration {c.iteration} returned exactly the "
                                            f"outputs of {label}, computed for other inputs")
        seen.append((c.outputs, refs, f"timed iteration {c.iteration}"))
    for c, refs in zip(res.timed_checks, replayed):
        _check_outputs(f"timed iteration {c.iteration}", names, c.outputs, refs, errors, tolerance, timed=True,
                       dtypes=dtypes, acc=acc)
    return len(res.timed_checks)


def probe_null_rate(samples_ns: Sequence[float]) -> float:
    """How often, on this machine at this moment, one timed call ran over CACHE_RATIO faster than
    another: the share of ordered pairs (i, j), i != j, of the timed samples with
    x_i * CACHE_RATIO < x_j. The timed calls all run fresh inputs, so a cache never serves them:
    this is the rate at which noise alone makes an honest repeat "clearly faster"."""
    x = np.sort(np.asarray(samples_ns, dtype=np.float64))
    n = len(x)
    if n < 2:
        return 0.0
    slower = n - np.searchsorted(x, x * CACHE_RATIO, side="right")  # samples over CACHE_RATIO x each
    return float(slower.sum()) / (n * (n - 1))


def probe_threshold(n: int, q: float) -> int | None:
    """The fewest of ``n`` pairs in which the repeat must be clearly faster for "caching": the
    smallest k with P(Binomial(n, q) >= k) < PROBE_ALPHA (the tail summed from k = n down). None:
    no count of n pairs is that unlikely."""
    tail, need = 0.0, None
    for k in range(n, -1, -1):
        tail += math.comb(n, k) * q ** k * (1 - q) ** (n - k)
        if tail >= PROBE_ALPHA:
            return need
        need = k
    return need


def _check_probe(res: JobResult) -> str:
    """TEST04, judged pair by pair: the agent runs the repeated input and a new one back to back, so
    each pair shares the machine's state at that moment. A caching candidate answers the repeat
    from its cache: clearly faster (over CACHE_RATIO) in most pairs. An honest candidate is clearly
    faster in a pair by chance only, at a rate ``q`` the timed calls measure (probe_null_rate; at
    least PROBE_NULL_RATE, the most two independent calls of a two-mode distribution reach). The
    verdict is a binomial test of that null at PROBE_ALPHA: of 16 pairs, 11 on a quiet machine.
    So a loaded machine that spoils a few pairs does not hide a cache, nor does a cache that
    forgets the repeated input now and then (one of 4 slots, first in first out), and noise the
    timed calls show raises the count needed instead of naming an honest candidate. What the
    check says is returned."""
    pairs = list(zip(res.probe_repeat_ns, res.probe_distinct_ns))
    q = max(PROBE_NULL_RATE, probe_null_rate(res.samples_ns))
    need = probe_threshold(len(pairs), q)
    if need is None:
        return (f"TEST04 not judged (the timed calls were too noisy for {len(pairs)} probe pairs: "
                f"{q:.0%} of their pairs over {CACHE_RATIO}x apart)")
    faster = sum(1 for r, d in pairs if r * CACHE_RATIO < d)
    if faster >= need:
        r = float(np.median(res.probe_repeat_ns))
        d = float(np.median(res.probe_distinct_ns))
        raise Fail("caching", f"caching: a repeated input ran {d / max(r, 1.0):.1f}x faster than distinct inputs "
                               f"(median {r / 1e3:.1f} vs {d / 1e3:.1f} us; faster by over {CACHE_RATIO}x in "
                               f"{faster} of {len(pairs)} back-to-back pairs, where noise would make at most "
                               f"{need - 1}; MLPerf TEST04)")
    return "no caching of repeated inputs (TEST04)"
