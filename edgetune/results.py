"""Summaries derived from stored records: per shape, every candidate's verdict, statistics and
speedup over the baselines measured in the same run. Used by tune, report and db best alike, so a
resumed or re-read run gives the same figures as the live one."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from edgetune.candidate import Candidate
from edgetune.db import RecordRow, Store
from dataclasses import replace

from edgetune.measure import Ratio, Stats, grouped_median_ci, grouped_speedup, speedup, summarize

REPORT_SCHEMA = "edgetune.report/1"


@dataclass
class CandidateSummary:
    candidate: Candidate
    status: str  # verified | failed
    reason: str
    phase: str  # final (raced in interleaved rounds) | screened
    rounds: list[int]
    stats: Stats | None
    max_abs_err: float | None
    max_rel_err: float | None
    vs_default: Ratio | None = None
    vs_best_baseline: Ratio | None = None
    samples: np.ndarray | None = field(default=None, repr=False)

    def as_dict(self) -> dict[str, Any]:
        return {
            "candidate": self.candidate.as_dict(), "label": self.candidate.label(), "status": self.status,
            "reason": self.reason, "phase": self.phase, "rounds": self.rounds,
            "stats": self.stats.as_dict() if self.stats else None,
            "max_abs_err": self.max_abs_err, "max_rel_err": self.max_rel_err,
            "speedup_vs_default": self.vs_default.as_dict() if self.vs_default else None,
            "speedup_vs_best_baseline": self.vs_best_baseline.as_dict() if self.vs_best_baseline else None,
        }


@dataclass
class ShapeSummary:
    shape: dict[str, int]
    shape_key: str
    workload_key: str
    candidates: list[CandidateSummary]
    default_key: str | None
    best_baseline_key: str | None
    best_key: str | None

    def get(self, key: str | None) -> CandidateSummary | None:
        return next((c for c in self.candidates if c.candidate.key() == key), None)

    @property
    def best(self) -> CandidateSummary | None:
        return self.get(self.best_key)

    def as_dict(self) -> dict[str, Any]:
        return {"shape": self.shape, "shape_key": self.shape_key, "workload_key": self.workload_key,
                "default": self.default_key, "best_baseline": self.best_baseline_key, "best": self.best_key,
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


def _summarize_shape(rows: list[RecordRow], emulated: bool) -> ShapeSummary:
    by_cand: dict[str, list[RecordRow]] = {}
    for r in rows:
        by_cand.setdefault(r.candidate_key, []).append(r)
    raced_rounds = sorted({r.round for r in rows if r.round > 0})
    cands: list[CandidateSummary] = []
    for key, recs in by_cand.items():
        recs.sort(key=lambda r: r.round)
        cand = Candidate.from_dict(recs[0].candidate)
        failed = [r for r in recs if r.status != "verified"]
        rounds = [r.round for r in recs]
        raced = [r for r in recs if r.round > 0]
        use = raced if raced else recs
        phase = "final" if raced else "screened"
        errs_abs = [r.verdict.get("max_abs_err") for r in recs if r.verdict.get("max_abs_err") is not None]
        errs_rel = [r.verdict.get("max_rel_err") for r in recs if r.verdict.get("max_rel_err") is not None]
        errs_abs = [e for e in errs_abs if e == e]  # drop NaN
        errs_rel = [e for e in errs_rel if e == e]
        samples = np.concatenate([r.samples_ns for r in use]) if use else np.array([], dtype=np.int64)
        status = "failed" if failed else "verified"
        reason = failed[0].reason if failed else ""
        if failed and failed[0].round > 0:
            reason = f"round {failed[0].round}: {reason}"
        stats = summarize(samples) if samples.size else None
        groups = [r.samples_ns for r in use if r.samples_ns.size]
        if stats is not None and len(groups) > 1:
            lo, hi = grouped_median_ci(groups, resamples=500)
            stats = replace(stats, ci_low_ns=min(lo, stats.median_ns), ci_high_ns=max(hi, stats.median_ns))
        cands.append(CandidateSummary(cand, status, reason, phase, rounds, stats,
                                      max(errs_abs) if errs_abs else None, max(errs_rel) if errs_rel else None,
                                      samples=samples))

    def round_samples(c: CandidateSummary, rnd: int) -> np.ndarray:
        sel = [r.samples_ns for r in by_cand[c.candidate.key()] if r.round == rnd]
        return np.concatenate(sel) if sel else np.array([], dtype=np.int64)

    verified = [c for c in cands if c.status == "verified" and c.stats is not None]
    baselines = [c for c in verified if c.candidate.baseline]
    # the runtime default: onnxruntime's (or TFLite's for .tflite models) default configuration
    default = next((c for c in baselines if c.candidate.backend == "ort"), None) or (baselines[0] if baselines else None)
    finals = [c for c in verified if c.phase == "final"] or verified
    best = min(finals, key=lambda c: c.stats.median_ns) if finals else None
    base_finals = [c for c in baselines if c in finals] or baselines
    best_base = min(base_finals, key=lambda c: c.stats.median_ns) if base_finals else None

    for c in verified:
        # compare on the rounds both ran in: interleaved samples, same session
        for ref, attr in ((default, "vs_default"), (best_base, "vs_best_baseline")):
            if ref is None:
                continue
            common = sorted(set(c.rounds) & set(ref.rounds))
            if c.phase == "final":
                common = [r for r in common if r > 0] or common
            if not common:
                continue
            pairs = [(round_samples(ref, r), round_samples(c, r)) for r in common]
            pairs = [(a, b) for a, b in pairs if a.size and b.size]
            if pairs:
                setattr(c, attr, grouped_speedup(pairs, resamples=500))

    order = {"final": 0, "screened": 1}
    cands.sort(key=lambda c: (c.status != "verified", order[c.phase],
                              c.stats.median_ns if c.stats else float("inf"), c.candidate.label()))
    first = rows[0]
    return ShapeSummary(first.shape, first.shape_key, first.workload_key, cands,
                        default.candidate.key() if default else None,
                        best_base.candidate.key() if best_base else None,
                        best.candidate.key() if best else None)


def summarize_run(store: Store, run_id: str) -> RunSummary:
    run = store.get_run(run_id)
    if run is None:
        from edgetune.errors import UserInputError

        raise UserInputError(f"no run '{run_id}' in {store.path}")
    rows = store.records(run_id=run_id)
    by_shape: dict[str, list[RecordRow]] = {}
    for r in rows:
        by_shape.setdefault(r.shape_key, []).append(r)
    fp = json.loads(run["fingerprint"])
    emulated = bool(fp.get("emulated"))
    shapes = [_summarize_shape(v, emulated) for v in by_shape.values()]
    return RunSummary(run["id"], run["device"], run["model_path"], run["model_sha256"], run["fingerprint_key"], fp,
                      json.loads(run["versions"]), json.loads(run["config"]), run["status"], emulated, shapes)
