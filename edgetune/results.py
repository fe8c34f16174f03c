"""Summaries derived from stored records: per shape, every candidate's verdict and statistics, the
race's selection and the confirmation that judges it (edgetune/select.py). Used by tune, report and
db best alike, so a resumed or re-read run gives the same figures as the live one.

Figures and their standing:
  - ``stats``: every candidate's samples from the race rounds (descriptive, comparable across finalists);
  - ``race_vs_default`` / ``race_vs_best_baseline``: geometric mean of per-round ratios in the race,
    descriptive, no interval and no verdict (these rounds selected the winner);
  - ``vs_default`` / ``vs_best_baseline``: only for the confirmation's participants, from the
    confirmation rounds only (t interval on per-round log ratios), and only from MIN_VERDICT_ROUNDS
    complete rounds on; the shape's ``confirmation`` carries the ratio (and "insufficient rounds")
    whatever the count. These are the only "faster"/"slower" claims.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from edgetune.candidate import Candidate
from edgetune.db import RecordRow, Store
from edgetune.errors import UserInputError
from edgetune.measure import MIN_VERDICT_ROUNDS, Ratio, Stats, summarize_rounds
from edgetune.select import (SEQUENTIAL, Confirmation, RaceRatio, both_verdict, confirm_index, confirmed_ratio,
                             is_confirmation, race_field, race_ratio, replay, selected, stored_round, strongest_baseline)

REPORT_SCHEMA = "edgetune.report/1"


def _ratio_dict(r: Ratio | RaceRatio | None) -> dict[str, Any] | None:
    return r.as_dict() if r is not None else None


@dataclass
class CandidateSummary:
    candidate: Candidate
    status: str  # verified | failed
    reason: str
    phase: str  # confirmed (took part in confirmation) | final (raced in interleaved rounds) | screened
    rounds: list[int]  # screen and race rounds it ran in
    stats: Stats | None  # race rounds (descriptive)
    max_abs_err: float | None
    max_rel_err: float | None
    vs_default: Ratio | None = None  # confirmation rounds only (see module docstring)
    vs_best_baseline: Ratio | None = None
    samples: np.ndarray | None = field(default=None, repr=False)
    confirm_rounds: list[int] = field(default_factory=list)  # confirmation rounds k it ran in
    confirm_stats: Stats | None = None  # its samples in the counted confirmation rounds
    race_vs_default: RaceRatio | None = None
    race_vs_best_baseline: RaceRatio | None = None
    # approximate candidates: the worst accuracy over all its records (edgetune/accuracy.py)
    accuracy: dict[str, Any] | None = None
    # where its nodes ran, when the device reported it (a provider other than the CPU's): the
    # record with the smallest share on the intended provider
    placement: dict[str, Any] | None = None
    # two timing modes across its processes (timing_modes), None when it has one
    modes: list[dict[str, float]] | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "candidate": self.candidate.as_dict(), "label": self.candidate.label(), "status": self.status,
            "reason": self.reason, "phase": self.phase, "rounds": self.rounds,
            "stats": self.stats.as_dict() if self.stats else None,
            "max_abs_err": self.max_abs_err, "max_rel_err": self.max_rel_err,
            "speedup_vs_default": _ratio_dict(self.vs_default),
            "speedup_vs_best_baseline": _ratio_dict(self.vs_best_baseline),
            "confirm_rounds": self.confirm_rounds,
            "confirm_stats": self.confirm_stats.as_dict() if self.confirm_stats else None,
            "race_speedup_vs_default": _ratio_dict(self.race_vs_default),
            "race_speedup_vs_best_baseline": _ratio_dict(self.race_vs_best_baseline),
            "approximate": self.candidate.approximate, "accuracy": self.accuracy,
            "placement": self.placement, "placement_label": placement_label(self.placement),
            "modes": self.modes,
        }


@dataclass(frozen=True)
class ConfirmationSummary:
    """Where the confirmation of one shape stands, with its ratios whatever the number of rounds
    (below MIN_VERDICT_ROUNDS their verdict says "insufficient rounds")."""

    state: Confirmation
    vs_best_baseline: Ratio | None  # contender vs the race's strongest baseline (state.baseline)
    vs_default: Ratio | None  # contender vs the runtime default
    # the baseline a selection falls back to (select.strongest_baseline) and, when the race's
    # strongest is another runtime's default, its ratio to the onnxruntime default that decided it
    strongest: str | None = None
    baseline_vs_default: Ratio | None = None

    @property
    def verdict(self) -> str | None:
        """"faster" only when faster than each runtime default it ran beside (select.both_verdict)."""
        return both_verdict(self.vs_best_baseline, self.vs_default if self.state.default_beside else None)

    def as_dict(self) -> dict[str, Any]:
        st = self.state
        return {"contender": st.contender, "baseline": st.baseline, "default": st.default,
                "rounds": list(st.rounds), "stored_rounds": [stored_round(k) for k in st.rounds],
                "complete": st.next_round is None,
                "disqualified": [{"key": d.key, "round": d.round, "reason": d.reason} for d in st.disqualified],
                # contenders whose confirmation ended without "faster" before the runner-up's began
                "ended": [{"key": e.key, "rounds": list(e.rounds), "verdict": e.verdict, "level": e.level,
                           "speedup_vs_best_baseline": _ratio_dict(e.ratio)} for e in st.ended],
                "verdict": self.verdict, "speedup_vs_best_baseline": _ratio_dict(self.vs_best_baseline),
                "speedup_vs_default": _ratio_dict(self.vs_default), "strongest_baseline": self.strongest,
                "baseline_vs_default": _ratio_dict(self.baseline_vs_default)}


@dataclass
class ShapeSummary:
    shape: dict[str, int]
    shape_key: str
    workload_key: str
    candidates: list[CandidateSummary]
    default_key: str | None
    best_baseline_key: str | None
    best_key: str | None  # the selected configuration (select.selected)
    winner_key: str | None = None  # the race's winner under confirmation (may differ from best)
    confirmation: ConfirmationSummary | None = None
    # the device (identity) that measured it, when the run's points were claimed; "a,b": begun on a,
    # resumed on b (another device of the same kind: its records' verdicts name the device of each job)
    measured_on: str | None = None

    def get(self, key: str | None) -> CandidateSummary | None:
        return next((c for c in self.candidates if c.candidate.key() == key), None)

    @property
    def best(self) -> CandidateSummary | None:
        return self.get(self.best_key)

    @property
    def winner(self) -> CandidateSummary | None:
        return self.get(self.winner_key)

    def as_dict(self) -> dict[str, Any]:
        return {"shape": self.shape, "shape_key": self.shape_key, "workload_key": self.workload_key,
                "default": self.default_key, "best_baseline": self.best_baseline_key, "best": self.best_key,
                "winner": self.winner_key, "measured_on": self.measured_on,
                "confirmation": self.confirmation.as_dict() if self.confirmation else None,
                "candidates": [c.as_dict() for c in self.candidates]}


@dataclass
class RunSummary:
    run_id: str
    device: str
    model_path: str
    model_sha256: str
    fingerprint_key: str
    fingerprint: dict[str, Any]
    versions: dict[str, Any]
    config: dict[str, Any]
    status: str
    emulated: bool
    shapes: list[ShapeSummary]

    def as_dict(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "device": self.device, "model": self.model_path,
                "model_sha256": self.model_sha256, "fingerprint_key": self.fingerprint_key,
                "fingerprint": self.fingerprint, "versions": self.versions, "config": self.config,
                "status": self.status, "emulated": self.emulated, "shapes": [s.as_dict() for s in self.shapes]}


def _finite(values: list[Any]) -> list[float]:
    return [v for v in values if v is not None and v == v]  # drop missing and NaN


def _failure(recs: list[RecordRow]) -> tuple[str, str]:
    failed = [r for r in recs if r.status != "verified"]
    if not failed:
        return "verified", ""
    first = failed[0]
    if is_confirmation(first.round):
        return "failed", f"confirmation round {confirm_index(first.round)}: {first.reason}"
    return "failed", (f"round {first.round}: {first.reason}" if first.round > 0 else first.reason)


def _race_stats(use: list[RecordRow]) -> tuple[Stats | None, np.ndarray]:
    samples = np.concatenate([r.samples_ns for r in use]) if use else np.array([], dtype=np.int64)
    stats = summarize_rounds([r.samples_ns for r in use]) if samples.size else None
    return stats, samples


def _candidate(key: str, recs: list[RecordRow], conf: Confirmation) -> CandidateSummary:
    recs = sorted(recs, key=lambda r: r.round)
    race = [r for r in recs if not is_confirmation(r.round)]
    confirm = [r for r in recs if is_confirmation(r.round)]
    raced = [r for r in race if r.round > 0]
    status, reason = _failure(recs)
    stats, samples = _race_stats(raced or race)
    counted = [r.samples_ns for r in confirm if confirm_index(r.round) in conf.rounds and r.samples_ns.size]
    confirm_stats = summarize_rounds(counted) if counted and key in conf.participants else None
    phase = "confirmed" if confirm else ("final" if raced else "screened")
    return CandidateSummary(
        Candidate.from_dict(recs[0].candidate), status, reason, phase, [r.round for r in race], stats,
        max(_finite([r.verdict.get("max_abs_err") for r in recs]), default=None),
        max(_finite([r.verdict.get("max_rel_err") for r in recs]), default=None),
        samples=samples, confirm_rounds=[confirm_index(r.round) for r in confirm], confirm_stats=confirm_stats,
        accuracy=_worst_accuracy(recs), placement=_worst_placement(recs),
        modes=timing_modes([float(np.median(r.samples_ns)) for r in recs if r.samples_ns.size]))


MODE_GAP = 1.25  # process medians this far apart (and each side >= MODE_SHARE of them) are two modes
MODE_SHARE = 0.2
MODE_MIN_PROCESSES = 6


def timing_modes(process_medians: list[float]) -> list[dict[str, float]] | None:
    """Two timing modes of one candidate across its processes (each job is a fresh process), or None:
    on some machines a process lands in a fast or a slow mode for its whole life (where its threads
    and memory were placed), so a median over rounds hides a device that is bimodal. The split is at
    the widest gap between sorted process medians, when it is at least MODE_GAP and both sides hold
    MODE_SHARE of the processes."""
    m = sorted(x for x in process_medians if x > 0)
    if len(m) < MODE_MIN_PROCESSES:
        return None
    logs = np.log(m)
    gaps = np.diff(logs)
    i = int(np.argmax(gaps))
    lo, hi = m[: i + 1], m[i + 1:]
    if gaps[i] < np.log(MODE_GAP) or min(len(lo), len(hi)) < MODE_SHARE * len(m):
        return None
    return [{"median_ms": float(np.median(side)) / 1e6, "share": len(side) / len(m)} for side in (lo, hi)]


def placement_share(p: dict[str, Any] | None) -> float | None:
    """Share of the nodes that ran on the intended provider (None: unknown)."""
    if not p or "nodes" not in p:
        return None
    total = sum(p["nodes"].values())
    return p["nodes"].get(p.get("intended"), 0) / total if total else None


def placement_label(p: dict[str, Any] | None) -> str | None:
    """"all 57 nodes on Xnnpack", "fell back: 12 of 57 nodes on Xnnpack, the rest on CPU", or why unknown."""
    if not p:
        return None
    if "error" in p:
        return f"placement unknown: {p['error']}"
    short = lambda n: str(n).replace("ExecutionProvider", "")  # noqa: E731
    total = sum(p["nodes"].values())
    mine = p["nodes"].get(p.get("intended"), 0)
    if total and mine == total:
        return f"all {total} nodes on {short(p['intended'])}"
    others = ", ".join(f"{short(k)} {v}" for k, v in sorted(p["nodes"].items()) if k != p.get("intended"))
    return f"fell back: {mine} of {total} nodes on {short(p['intended'])} ({others})"


def _worst_placement(recs: list[RecordRow]) -> dict[str, Any] | None:
    ps = [r.verdict["placement"] for r in recs if isinstance(r.verdict.get("placement"), dict)]
    if not ps:
        return None
    known = [p for p in ps if placement_share(p) is not None]
    return min(known, key=lambda p: placement_share(p)) if known else ps[0]


def _worst_accuracy(recs: list[RecordRow]) -> dict[str, Any] | None:
    accs = [r.verdict["accuracy"] for r in recs if isinstance(r.verdict.get("accuracy"), dict)]
    if not accs:
        return None
    top1 = _finite([a.get("top1") for a in accs])
    return {"cosine": min(_finite([a.get("cosine") for a in accs]), default=None),
            "max_abs": max(_finite([a.get("max_abs") for a in accs]), default=None),
            "top1": min(top1) if top1 else None, "runs": sum(int(a.get("runs") or 0) for a in accs)}


def _claim(r: Ratio | None) -> Ratio | None:
    """A candidate's vs_* fields carry a ratio only once it may carry a verdict."""
    return r if r is not None and (r.rounds or 0) >= MIN_VERDICT_ROUNDS else None


def _summarize_shape(rows: list[RecordRow], confirm_target: int | None, sequential: bool = True) -> ShapeSummary:
    by_cand: dict[str, list[RecordRow]] = {}
    for r in rows:
        by_cand.setdefault(r.candidate_key, []).append(r)
    fld = race_field(rows)
    conf = replay(rows, confirm_target, sequential=sequential)
    cands = {key: _candidate(key, recs, conf) for key, recs in by_cand.items()}
    default = conf.default
    base, base_vs_default = strongest_baseline(rows, conf)
    for key, c in cands.items():
        if c.status != "verified" or c.stats is None:
            continue
        c.race_vs_default = race_ratio(rows, default, key)
        c.race_vs_best_baseline = race_ratio(rows, base, key)
        c.vs_default = _claim(confirmed_ratio(rows, conf, default, key))
        c.vs_best_baseline = _claim(confirmed_ratio(rows, conf, base, key))
    summary = ConfirmationSummary(conf, confirmed_ratio(rows, conf, conf.baseline, conf.contender),
                                  confirmed_ratio(rows, conf, default, conf.contender), base,
                                  base_vs_default) if conf.contender else None
    best = selected(fld, conf, summary.verdict if summary else None, base)
    order = {"confirmed": 0, "final": 1, "screened": 2}
    ranked = sorted(cands.values(), key=lambda c: (c.status != "verified", order[c.phase],
                                                   c.stats.median_ns if c.stats else float("inf"), c.candidate.label()))
    first = min(rows, key=lambda r: (r.round, r.id))  # the race workload (confirmation rounds use others)
    return ShapeSummary(first.shape, first.shape_key, first.workload_key, ranked, default, base, best,
                        conf.contender, summary)


def summarize_run(store: Store, run_id: str) -> RunSummary:
    run = store.get_run(run_id)
    if run is None:
        raise UserInputError(f"no run '{run_id}' in {store.path}")
    rows = store.records(run_id=run_id)
    by_shape: dict[str, list[RecordRow]] = {}
    for r in rows:
        by_shape.setdefault(r.shape_key, []).append(r)
    fp = json.loads(run["fingerprint"])
    config = json.loads(run["config"])
    # runs recorded before confirmation existed have no confirm_rounds: count what is stored
    target = config.get("confirm_rounds")
    # runs recorded before sequential confirmation looked once, at 95%: judged as they were designed
    sequential = config.get("confirmation") == SEQUENTIAL
    shapes = [_summarize_shape(v, target, sequential) for v in by_shape.values()]
    # which device measured each point (a joined run's points are measured on several devices of one kind)
    on = {p["shape_key"]: p["device"] for p in store.shapes(run_id)}
    for s in shapes:
        s.measured_on = on.get(s.shape_key)
    return RunSummary(run["id"], run["device"], run["model_path"], run["model_sha256"], run["fingerprint_key"], fp,
                      json.loads(run["versions"]), config, run["status"], bool(fp.get("emulated")), shapes)
