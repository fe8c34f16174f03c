"""A tune's settings and outcome: ``TuneConfig`` (what a run is keyed by), ``DeviceOutcome`` and
``TuneOutcome``, the run's identity (``run_key``) and what joining a recorded run takes
(``join_config``, ``check_join``); the candidate cap a quick run applies (``cap_candidates``)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

import edgetune
from edgetune.accuracy import AccuracyBudget
from edgetune.agent.host import AgentInfo
from edgetune.candidate import Candidate
from edgetune.errors import EdgetuneError, UserInputError
from edgetune.modelfile import Model
from edgetune.report import report_dict
from edgetune.results import RunSummary
from edgetune.select import CONFIRM_BASE, SEQUENTIAL
from edgetune.text import device_text

DEFAULT_SPACES = ("ort", "ort-fused", "openvino", "litert", "tflite", "tvm-relax")


@dataclass
class TuneConfig:
    budget_s: float = 60.0  # per device, all shape points together
    rounds: int = 3
    finalists: int = 5
    # fresh interleaved rounds that judge the race's winner, at most (select.py: sequential looks stop
    # earlier on a clear verdict; beyond the first look, rounds run only while the budget lasts)
    confirm_rounds: int = 20
    timeout_s: float = 60.0  # per job, on top of its measuring budget
    spaces: tuple[str, ...] = DEFAULT_SPACES
    max_candidates: int | None = None  # cap per space (baseline always kept), for quick runs
    seed: int = 0
    fresh: bool = False
    retries: int = 3
    tvm_trials: int = 0  # MetaSchedule trials for the tvm-tuned candidate (0: no tvm-tuned)
    # approximate candidates (int8, fp16) are selectable only within this budget (edgetune/accuracy.py)
    accuracy: AccuracyBudget = field(default_factory=AccuracyBudget)
    # candidates beyond the spaces (e.g. user adapters): each with its Space, or an already Prepared artifact
    extra: list[tuple[Candidate, Any]] = field(default_factory=list)
    # a Ray cluster for the host's heavy work (references, tvm-relax builds; edgetune/hostwork.py), None: here.
    # Not part of the run's identity: the cluster must compute what this host would (HostWork checks it)
    ray: str | None = None

    def __post_init__(self) -> None:
        # race rounds share the records' round column with confirmation rounds (select.CONFIRM_BASE + k)
        if not 0 <= self.rounds < CONFIRM_BASE:
            raise UserInputError(f"rounds must be between 0 and {CONFIRM_BASE - 1}, got {self.rounds}")
        if self.confirm_rounds < 0:
            raise UserInputError(f"confirm_rounds must be >= 0, got {self.confirm_rounds}")

    def key_dict(self) -> dict[str, Any]:
        return {"budget_s": self.budget_s, "rounds": self.rounds, "finalists": self.finalists,
                "confirm_rounds": self.confirm_rounds, "confirmation": SEQUENTIAL, "spaces": list(self.spaces),
                "max_candidates": self.max_candidates, "seed": self.seed, "tvm_trials": self.tvm_trials,
                "extra": [c.key() for c, _ in self.extra],
                **({"accuracy": self.accuracy.as_dict()} if self.accuracy.set else {})}


@dataclass
class DeviceOutcome:
    device: str
    status: str  # complete | down
    error: str = ""
    run_id: str | None = None
    summary: RunSummary | None = None
    resumed: bool = False
    jobs_run: int = 0
    jobs_skipped: int = 0
    shapes: list[str] = field(default_factory=list)  # the shape points this process measured
    joined: bool = False  # it joined a run another process holds (tune(join=...))
    # where the host's heavy work ran: None here; {"ray": address, "workers": [[node, pid], ...]}
    host_work: dict[str, Any] | None = None
    # runtime families asked for that this device or model cannot run: space -> why (never silently left out)
    families_not_run: dict[str, str] = field(default_factory=dict)


@dataclass
class TuneOutcome:
    model: str
    devices: list[DeviceOutcome]

    def as_dict(self) -> dict[str, Any]:
        return report_dict(self)


def form(cand: Candidate) -> tuple[Any, Any]:
    """What a candidate computes in: its precision and quantization (fp32 when it names none)."""
    p = cand.param_dict
    return (p.get("precision", "fp32"), p.get("quant"))


def cap_candidates(cands: list[Candidate], n: int) -> list[Candidate]:
    """A space's candidates capped at ``n`` besides its baselines (quick runs), spread evenly over
    the space's list; then the first of each form (precision, quantization) the spread missed is
    added, so a cap never drops a whole precision a user would hand-pick (OpenVINO's NNCF int8,
    LiteRT's fp16): a space of more forms than ``n`` gets one candidate of each."""
    base = [c for c in cands if c.baseline]
    if n <= 0:  # (TuneConfig(max_candidates=0): the baselines alone)
        return base
    rest = [c for c in cands if not c.baseline]
    step = max(1, len(rest) // max(1, n))
    picked = rest[::step][:n]
    seen = {form(c) for c in picked}
    for c in rest:
        if form(c) not in seen:
            seen.add(form(c))
            picked.append(c)
    keep = set(picked)
    return base + [c for c in rest if c in keep]  # the space's order


def run_versions(info: AgentInfo) -> dict[str, Any]:
    import onnxruntime

    return {"edgetune": edgetune.__version__, "agent": f"{info.agent} {info.agent_version}",
            "device_runtimes": {k: v for k, v in sorted(info.runtimes.items()) if not isinstance(v, list)},
            "host_reference": {"onnxruntime": onnxruntime.__version__}}


def run_key(device: str, model: Model, info: AgentInfo, points: list[dict[str, int]], cands: list[Candidate],
            cfg: TuneConfig, user_inputs_key: str, versions: dict) -> str:
    payload = {"device": device, "model": model.sha256, "fp": info.fingerprint_key, "points": points,
               "cands": sorted(c.key() for c in cands), "cfg": cfg.key_dict(), "inputs": user_inputs_key,
               "versions": versions}
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


def check_join(run: dict[str, Any], device: str, info: AgentInfo, versions: dict, cand_keys: str,
                ui_key: str) -> None:
    """A device may join a run only to measure what the run would have measured: the same hardware
    and OS (fingerprint), runtimes and versions, candidates and inputs. Else its figures would sit
    in one run beside figures that mean something else."""
    cfg = json.loads(run["config"])  # (join_config has read it)
    rid = run["id"]
    if info.fingerprint_key != run["fingerprint_key"]:
        raise UserInputError(f"{device} cannot join run {rid}: its fingerprint {info.fingerprint_key} is not the "
                             f"run's {run['fingerprint_key']} (another CPU, OS or kernel; tune it in a run of its own)")
    if json.loads(run["versions"]) != json.loads(json.dumps(versions, sort_keys=True)):
        raise UserInputError(f"{device} cannot join run {rid}: its runtimes or edgetune versions differ from the run's")
    if cfg["candidates"] != cand_keys:
        raise UserInputError(f"{device} cannot join run {rid}: it gets other candidates than the run's "
                             f"(give the run's --adapter options)")
    if cfg["inputs"] != ui_key:
        raise UserInputError(f"{device} cannot join run {rid}: other --inputs than the run's")


def join_config(run: dict[str, Any], base: TuneConfig) -> tuple[TuneConfig, list[dict[str, int]]]:
    """The settings and shape points of a recorded run, for a process that joins it (its own
    adapters, ``base.extra``, are checked against the run's candidates by the device)."""
    try:
        c = json.loads(run["config"])
        if "candidates" not in c:
            raise KeyError("candidates")
        cfg = TuneConfig(budget_s=float(c["budget_s"]), rounds=int(c["rounds"]), finalists=int(c["finalists"]),
                         confirm_rounds=int(c["confirm_rounds"]), timeout_s=float(c.get("timeout_s", base.timeout_s)),
                         spaces=tuple(c["spaces"]), max_candidates=c["max_candidates"], seed=int(c["seed"]),
                         tvm_trials=int(c["tvm_trials"]), accuracy=AccuracyBudget.from_dict(c.get("accuracy")),
                         extra=base.extra, retries=base.retries, ray=base.ray)
        return cfg, [{str(k): int(v) for k, v in p.items()} for p in c["points"]]
    except (KeyError, TypeError, ValueError, AttributeError):
        raise UserInputError(f"run {run['id']} has no recorded settings a tune can join (a run of an edgetune "
                             f"before joins, or not a tune's): resume it with its own command") from None


def outcome_error(exc: BaseException) -> str:
    """One line for a device's failure: edgetune's own errors as they are; anything else is a bug
    or a forged reply that slipped through, named as an internal error."""
    text = str(exc) if isinstance(exc, EdgetuneError) else f"internal error: {type(exc).__name__}: {exc}"
    return device_text(" ".join(text.split()), 500)  # it may quote what a device sent


