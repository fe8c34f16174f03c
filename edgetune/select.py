"""Select, then confirm (docs/design.md §4.4).

The race (round 0 screens every candidate, rounds 1..R race the finalists) only *selects*:
  - the winner: the fastest verified non-baseline candidate by race-round medians;
  - the strongest baseline: the fastest verified baseline candidate (every runtime default the
    spaces mark ``baseline=True``: onnxruntime's, OpenVINO's, LiteRT's, ...);
  - the default: onnxruntime's default (TFLite's for a .tflite model), what "vs default" refers to.
A few race rounds can rank two near-equal runtime defaults either way, so another runtime's default
replaces onnxruntime's as the one a selection falls back to only when the confirmation rounds, which
run both, confirm it faster (strongest_baseline); a contender is "faster" only when faster than both
(both_verdict). With no contender, the other runtimes' defaults are confirmed against onnxruntime's.
Choosing the minimum of many and judging it on the same rounds is the winner's curse, so the
winner is then *confirmed*: fresh interleaved rounds of the winner, the strongest baseline and (when
it is neither) the default, each job a new agent process, each round on new inputs (the shape's
workload rebuilt from a seed derived from the run's seed and the round: a re-run or resume builds
the same ones). Only those rounds give the verdict, through ``measure.round_ratio`` (Student t on
per-round log ratios, no verdict below MIN_VERDICT_ROUNDS). A participant that fails verification
in a confirmation round is disqualified; the next-best contender (or baseline) takes its place and
the count of confirming rounds starts again, so every counted round holds the same pair.

Record encoding (the DB ``round`` column is an int): confirmation round k (1, 2, ...) of a shape is
stored as round ``CONFIRM_BASE + k``, with ``{"phase": "confirm", "confirm_round": k,
"input_seed": seed}`` added to the verdict JSON. Race rounds stay 0..R with R < CONFIRM_BASE
(TuneConfig refuses more), so a database written before confirmation existed reads as a run without
confirmation (descriptive race figures, no faster/slower claim), and the UNIQUE (run, shape,
candidate, round) key lets a resumed run skip stored confirmation jobs like any other job.

Everything here is derived from stored records only (``replay``), so the tuner deciding what to run
next, a resumed run, and a report re-read from the database all see the same confirmation.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np

from edgetune.db import RecordRow
from edgetune.measure import ALPHA, Ratio, look_levels, looks, rotation, round_median, round_ratio
from edgetune.workload import Workload, build_workload

CONFIRM_BASE = 1000  # stored round = CONFIRM_BASE + confirmation round (1, 2, ...)


def is_confirmation(stored_round: int) -> bool:
    return stored_round > CONFIRM_BASE


def stored_round(k: int) -> int:
    return CONFIRM_BASE + k


def confirm_index(stored: int) -> int:
    return stored - CONFIRM_BASE


def confirm_seed(seed: int, k: int) -> int:
    """Input seed of confirmation round k: new inputs every round, the same ones on a re-run."""
    digest = hashlib.sha256(f"edgetune-confirm:{seed}:{k}".encode()).digest()
    return int.from_bytes(digest[:4], "little") & 0x7FFFFFFF


def confirm_workload(wl: Workload, seed: int) -> Workload:
    """The shape's workload on new seeded inputs. A user-given input set (always the last set) is the
    user's data and is kept as it is; only the seeded sets change."""
    user = dict(zip(wl.input_names, wl.input_sets[-1])) if wl.user_input_sets else {}
    return build_workload(wl.model, wl.bindings, user, n_seeded=len(wl.input_sets) - wl.user_input_sets, seed=seed)


def confirm_tags(k: int, seed: int) -> dict[str, object]:
    """What a confirmation record adds to its verdict JSON."""
    return {"phase": "confirm", "confirm_round": k, "input_seed": seed}


# ---- the race: who is selected ------------------------------------------------------------

@dataclass(frozen=True)
class RaceField:
    """The race's outcome, each list fastest first (ties by key, so it is deterministic)."""

    contenders: tuple[str, ...]  # verified non-baseline candidate keys
    baselines: tuple[str, ...]  # verified baseline candidate keys
    default: str | None  # onnxruntime's default if verified, else the strongest baseline
    median_ns: Mapping[str, float]  # race median (median of per-round medians) per candidate


def race_field(rows: Sequence[RecordRow]) -> RaceField:
    """Select from the screen and race records of one shape (confirmation records are ignored)."""
    race = [r for r in rows if not is_confirmation(r.round)]
    failed = {r.candidate_key for r in race if r.status != "verified"}
    raced = {r.candidate_key for r in race if r.round > 0}
    by_cand: dict[str, list[RecordRow]] = {}
    for r in race:
        # once there was a race, its finalists are the field; round 0 alone only screened
        if r.candidate_key in failed or (raced and r.candidate_key not in raced) or not r.samples_ns.size:
            continue
        if raced and r.round == 0:
            continue
        by_cand.setdefault(r.candidate_key, []).append(r)
    medians = {k: round_median([r.samples_ns for r in v]) for k, v in by_cand.items()}
    ranked = sorted(medians, key=lambda k: (medians[k], k))
    is_base = {k: bool(v[0].candidate.get("baseline")) for k, v in by_cand.items()}
    baselines = tuple(k for k in ranked if is_base[k])
    ort = [k for k in baselines if by_cand[k][0].candidate.get("backend") == "ort"]
    default = ort[0] if ort else (baselines[0] if baselines else None)
    return RaceField(tuple(k for k in ranked if not is_base[k]), baselines, default, medians)


# ---- confirmation: replayed from stored records ----------------------------------------------

@dataclass(frozen=True)
class Disqualified:
    key: str
    round: int  # confirmation round k
    reason: str


@dataclass(frozen=True)
class Ended:
    """A contender whose confirmation ended without a "faster" verdict, before a runner-up's began."""

    key: str
    rounds: tuple[int, ...]
    verdict: str  # slower | no significant difference
    ratio: Ratio  # its interval against the baseline at its last look

    @property
    def level(self) -> float:
        return self.ratio.level


# Contenders confirmed one after another (the winner, then runner-ups while the budget lasts) share
# the 5% false verdict rate: the winner's test gets 70% of it, the runner-up's 30% (union bound).
CONTENDER_SHARES = (0.7, 0.3)


@dataclass(frozen=True)
class Confirmation:
    contender: str | None  # the contender being (or last) confirmed (None: no verified contender left)
    baseline: str | None  # the strongest verified baseline
    default: str | None  # the runtime default, if still verified
    rounds: tuple[int, ...]  # confirmation rounds k, complete for the current participants
    disqualified: tuple[Disqualified, ...]
    next_round: int | None  # the round k to run next; None: done or nothing to confirm
    # every round k walked so far (next_round included), with its participants in running order:
    # what a run that was never interrupted has run, so a resumed one runs (or skips) exactly that
    walked: tuple[tuple[int, tuple[str, ...]], ...] = ()
    level: float = 0.95  # confidence level of the interval the verdict comes from (its look's)
    decided: bool = False  # a look's interval excluded 1.0 (faster or slower): no more rounds for it
    ended: tuple[Ended, ...] = ()  # earlier contenders whose confirmation gave no "faster"
    cap: int | None = None  # rounds at most per contender (None: a run that predates sequential looks)

    @property
    def default_beside(self) -> str | None:
        """The onnxruntime default when it runs as a third participant (neither contender nor baseline)."""
        return self.default if self.default not in (self.contender, self.baseline) else None

    @property
    def participants(self) -> tuple[str, ...]:
        if self.contender is None or self.baseline is None:
            return ()
        extra = (self.default_beside,) if self.default_beside is not None else ()
        return (self.contender, self.baseline) + extra  # type: ignore[return-value]

    def order(self, k: int) -> tuple[str, ...]:
        """Interleaving of round k: W B (D), B (D) W, ... so drift and position hit all alike."""
        return tuple(rotation(self.participants, k))


def _confirm_records(rows: Sequence[RecordRow]) -> dict[tuple[str, int], RecordRow]:
    return {(r.candidate_key, confirm_index(r.round)): r for r in rows if is_confirmation(r.round)}


def _level(cap: int | None, shares: Sequence[float], slot: int, n: int) -> float:
    """The confidence level of the look at n counted rounds of contender ``slot``: a planned look's,
    or, between looks, the next planned look's (a confirmation cut short there takes that look at the
    rounds it has: each path takes each look once, so the spending bound holds)."""
    if not cap:  # a run before sequential looks, or one without confirmation rounds
        return 0.95
    alpha = ALPHA * shares[min(slot, len(shares) - 1)]
    levels = look_levels(cap, alpha)
    return next((lv for m, lv in sorted(levels.items()) if m >= n), levels[max(levels)])


SEQUENTIAL = "sequential"  # a run's recorded confirmation design (its config's "confirmation")


def replay(rows: Sequence[RecordRow], target: int | None, extend: bool = False,
           sequential: bool = True) -> Confirmation:
    """Walk the stored confirmation rounds of one shape in order and say where confirmation stands.

    Sequential (``target``: the cap of rounds per contender): after each planned look
    (``measure.looks``) the contender-vs-baseline interval at that look's level decides: "faster"
    ends the confirmation; "slower", or the cap without a verdict, hands the rounds to the runner-up
    (at most ``len(CONTENDER_SHARES)`` contenders, each with its share of the 5%) when its rounds are
    stored or ``extend`` says there is time to run them (the tuner's call). ``sequential`` False: a
    run recorded with the fixed design (one look at ``target`` rounds, 95%). ``target`` None:
    a run recorded before sequential looks, every stored round counted at 95%. Deterministic in the
    stored records, so the tuner, a resumed run and a report all agree."""
    field = race_field(rows)
    stored = _confirm_records(rows)
    contenders, baselines, default = list(field.contenders), list(field.baselines), field.default
    if not contenders and default is not None and len(baselines) > 1:
        # only runtime defaults verified: the others are confirmed against the onnxruntime default
        # like any contender (one of them is selected only when confirmed faster than it)
        contenders, baselines = [b for b in baselines if b != default], [default]
    counted: list[int] = []
    out: list[Disqualified] = []
    ended: list[Ended] = []
    walked: list[tuple[int, tuple[str, ...]]] = []
    planned = (set(looks(target)) if sequential else {target}) if target else set()
    # a race with one contender has no runner-up to share the 5% with (fixed by the race, not the rounds)
    shares = CONTENDER_SHARES if len(contenders) > 1 and sequential else (1.0,)
    cap = target if sequential else None  # (_level: None is the fixed 95%)
    k = 1

    def state(next_round: int | None, decided: bool = False) -> Confirmation:
        return Confirmation(contenders[0] if contenders else None, baselines[0] if baselines else None, default,
                            tuple(counted), tuple(out), next_round, tuple(walked),
                            _level(cap, shares, len(ended), len(counted)), decided, tuple(ended), target)

    while contenders and baselines and (target is None or len(counted) < target):
        parts = state(None).participants
        recs = {p: stored.get((p, k)) for p in parts}
        walked.append((k, state(None).order(k)))
        bad = [p for p, r in recs.items() if r is not None and r.status != "verified"]
        if bad:
            pair = (contenders[0], baselines[0])
            for p in bad:
                out.append(Disqualified(p, k, recs[p].reason))  # type: ignore[union-attr]
                contenders = [c for c in contenders if c != p]
                baselines = [b for b in baselines if b != p]
                default = None if p == default else default
            if not contenders or not baselines or pair != (contenders[0], baselines[0]):
                counted = []  # a new pair: earlier rounds judged someone else
            k += 1
            continue
        if any(r is None for r in recs.values()):
            return state(k)  # round k is (partly) still to run
        counted.append(k)
        k += 1
        n = len(counted)
        if target is None or (n not in planned and n < target):
            continue
        st = state(None)
        r = _pair_ratio(stored, contenders[0], baselines[0], counted, st.level)
        rd = _pair_ratio(stored, contenders[0], st.default_beside, counted, st.level) if st.default_beside else None
        verdict = both_verdict(r, rd)
        if verdict == "faster":
            return state(None, decided=True)
        if verdict == "slower" or n >= target:  # this contender is done: the runner-up's turn, if any
            runs_next = len(contenders) > 1 and (extend or any(
                key in (contenders[1], baselines[0]) and kk == k for key, kk in stored))
            if len(ended) + 1 >= len(shares) or not runs_next:
                return state(None, decided=verdict == "slower")
            ended.append(Ended(contenders[0], tuple(counted), verdict, r))
            contenders = contenders[1:]
            counted = []
    return state(None)


def both_verdict(vs_baseline: Ratio | None, vs_default: Ratio | None) -> str | None:
    """The contender's verdict when it ran beside two runtime defaults (the race's strongest
    baseline and, when that is another runtime's, the onnxruntime default): "faster" only when
    faster than both (an intersection-union test: each at the look's level keeps the false "faster"
    rate at that level), "slower" when slower than either, else the first's."""
    if vs_baseline is None or vs_default is None:
        return vs_baseline.verdict if vs_baseline is not None else None
    verdicts = (vs_baseline.verdict, vs_default.verdict)
    if verdicts == ("faster", "faster"):
        return "faster"
    if "slower" in verdicts:
        return "slower"
    if "insufficient rounds" in verdicts:
        return "insufficient rounds"
    return "no significant difference"


def strongest_baseline(rows: Sequence[RecordRow], conf: Confirmation) -> tuple[str | None, Ratio | None]:
    """The baseline a selection falls back to, with the ratio it was decided by. The race picks the
    fastest verified runtime default (``conf.baseline``) from a few rounds; when that is another
    runtime's than the onnxruntime default (``conf.default``), it is the strongest only when the
    confirmation rounds, which run both side by side on new inputs, confirm it faster than the
    default (95% t interval over every confirmation round both ran verified); otherwise the default
    stays: a runtime switch a user would make by hand is recommended only on evidence."""
    b, d = conf.baseline, conf.default
    if b is None or d is None or b == d:
        return (b or d), None
    stored = _confirm_records(rows)
    ks = sorted(k for (key, k), r in stored.items() if key == b and r.status == "verified"
                and (d, k) in stored and stored[(d, k)].status == "verified")
    if not ks:
        return d, None
    r = _pair_ratio(stored, b, d, ks, 0.95)
    return (b if r.verdict == "faster" else d), r


def _pair_ratio(stored: Mapping[tuple[str, int], RecordRow], cand: str, ref: str, rounds: Sequence[int],
                level: float) -> Ratio:
    return round_ratio([(stored[(ref, k)].samples_ns, stored[(cand, k)].samples_ns) for k in rounds], level=level)


def confirmed_ratio(rows: Sequence[RecordRow], conf: Confirmation, ref: str | None, cand: str | None) -> Ratio | None:
    """cand vs ref from the counted confirmation rounds only (> 1: cand faster), at the level of the
    look the verdict comes from, or None."""
    if ref is None or cand is None or ref == cand or not conf.rounds:
        return None
    if ref not in conf.participants or cand not in conf.participants:
        return None
    return _pair_ratio(_confirm_records(rows), cand, ref, conf.rounds, conf.level)


def selected(field: RaceField, conf: Confirmation, verdict: str | None, strongest: str | None = None) -> str | None:
    """The configuration edgetune recommends. The contender only when its confirmation says "faster"
    than the runtime defaults it ran beside (both_verdict); otherwise the strongest baseline
    (strongest_baseline: a runtime default is the better choice when no win is shown); with no
    verified baseline to compare with, the contender."""
    strongest = strongest or conf.baseline
    if conf.contender is not None and conf.baseline is not None:
        return conf.contender if verdict == "faster" else strongest
    return strongest or (field.contenders[0] if field.contenders else None)


# ---- descriptive race figures -----------------------------------------------------------------

@dataclass(frozen=True)
class RaceRatio:
    """Descriptive speedup from race rounds: geometric mean of per-round ratios of medians. No
    interval and no verdict: these rounds chose the winner, so they cannot also judge it."""

    value: float
    rounds: int

    def as_dict(self) -> dict:
        return {"speedup": self.value, "rounds": self.rounds, "basis": "race rounds, descriptive (no verdict)"}


def race_ratio(rows: Sequence[RecordRow], ref: str | None, cand: str) -> RaceRatio | None:
    """cand vs ref on the race rounds both ran in (round 0 only when neither raced)."""
    if ref is None or ref == cand:
        return None
    meds: dict[tuple[str, int], float] = {}
    for r in rows:
        if not is_confirmation(r.round) and r.candidate_key in (ref, cand) and r.samples_ns.size:
            meds[(r.candidate_key, r.round)] = float(np.median(r.samples_ns))
    common = sorted({k for c, k in meds if c == ref} & {k for c, k in meds if c == cand})
    common = [k for k in common if k > 0] or common
    logs = [math.log(meds[(ref, k)] / meds[(cand, k)]) for k in common if meds[(ref, k)] > 0 and meds[(cand, k)] > 0]
    if not logs:
        return None
    return RaceRatio(math.exp(float(np.mean(logs))), len(logs))
