"""The Python API the CLI is a thin layer over.

    from edgetune import api
    outcome = api.tune("mobilenet.onnx", devices=["local"], sweeps=["batch=1,16"], budget_s=60)
    print(api.report_markdown(outcome))
"""

from __future__ import annotations

import hashlib
import json
import secrets
import time
from typing import Any, Sequence

from edgetune.accuracy import AccuracyBudget
from edgetune.candidate import Candidate
from edgetune.db import Store, device_lease
from edgetune.devices.inventory import Inventory, device_identity
from edgetune.errors import UserInputError
from edgetune.judge import JudgeConfig
from edgetune.judge import judge as _judge
from edgetune.report import markdown, report_dict
from edgetune.results import RunSummary, summarize_run
from edgetune.space import SPACES, BuildFailed, space_of, with_approximate
from edgetune.tune import DeviceTuner, ProgressFn
from edgetune.tune_config import DEFAULT_SPACES, TuneConfig, TuneOutcome, run_versions
from edgetune.tune import tune as _tune
from edgetune.modelfile import load_model
from edgetune.workload import build_workload, load_user_inputs, parse_dims, resolve_model, shape_points

def tune(model: str, devices: Sequence[str] = ("local",), *, budget_s: float = 60.0, sweeps: Sequence[str] = (),
         dims: Sequence[str] = (), inputs: Sequence[str] = (), db: str | None = None,
         accuracy: str | Sequence[str] | AccuracyBudget | None = None, progress: ProgressFn | None = None,
         command: str = "", **cfg: Any) -> TuneOutcome:
    """Tune MODEL on DEVICES (what ``edgetune tune`` runs). ``accuracy``: the budget approximate
    (int8, bf16, fp16) candidates are selectable within, as for ``--accuracy`` ("cosine=0.999,top1=0.99"
    or an AccuracyBudget); it adds the approximate spaces. ``tvm_trials`` > 0 adds the tvm-tuned space.
    ``progress``: called with each event (start, job, skip, build, ...); ``command``: the command line
    that reproduces this run (recorded with it). ``cfg``: any other TuneConfig field (``spaces``
    defaults to DEFAULT_SPACES), or ``config`` (a TuneConfig, used as given), ``inventory``, ``join``.
    Bad arguments raise UserInputError before any device work."""
    inventory = cfg.pop("inventory", None)
    join = cfg.pop("join", None)  # a run id in db to measure on these devices too (tune.tune)
    config = cfg.pop("config", None)
    if config is None:
        if budget_s <= 0:
            raise UserInputError(f"the budget must be a positive number of seconds, got {budget_s:g}")
        acc = accuracy if isinstance(accuracy, AccuracyBudget) else AccuracyBudget.parse(
            [accuracy] if isinstance(accuracy, str) else (accuracy or ()))
        spaces = tuple(cfg.pop("spaces", None) or DEFAULT_SPACES)
        if int(cfg.get("tvm_trials") or 0) > 0 and "tvm-tuned" not in spaces:
            spaces += ("tvm-tuned",)
        spaces = with_approximate(spaces, acc.set)
        bad = [s for s in spaces if s not in SPACES]
        if bad:
            raise UserInputError(f"unknown space {', '.join(bad)} (known: {', '.join(SPACES)})")
        config = TuneConfig(budget_s=budget_s, spaces=spaces, accuracy=acc, **cfg)
    elif cfg or accuracy is not None:
        raise UserInputError(f"give either config or its fields, not both ({', '.join(sorted(cfg)) or 'accuracy'})")
    return _tune(resolve_model(model), devices, dims=dims, sweeps=sweeps, inputs=inputs, db=db, config=config,
                 inventory=inventory, progress=progress, command=command, join=join)


def find_candidate(store: Store, key: str) -> Candidate:
    if len(key) < 4:
        raise UserInputError(f"config key '{key}' is too short (give at least 4 characters)")
    recs = store.records(candidate_key=key)
    keys = {r.candidate_key for r in recs}
    if not keys:
        raise UserInputError(f"unknown config key '{key}' (see 'edgetune db ls' or a tune report)")
    if len(keys) > 1:
        raise UserInputError(f"config key '{key}' is ambiguous ({', '.join(sorted(keys))})")
    return Candidate.from_dict(recs[0].candidate)


def bench(model: str, config_key: str, device: str = "local", *, dims: Sequence[str] = (), db: str | None = None,
          rounds: int = 5, budget_s: float = 20.0, inventory: Inventory | None = None,
          command: str = "", accuracy: AccuracyBudget | None = None) -> RunSummary:
    """Measure one stored configuration against the runtime default, interleaved, now.
    ``command``: the command line that reproduces this (recorded with the run; "" for none).
    ``accuracy``: the budget an approximate configuration is held to (default: the one it was
    tuned under, ``stored_budget``)."""
    m = load_model(resolve_model(model))
    store = Store(db, create=False) if db else Store()
    try:
        cand = find_candidate(store, config_key)
        spec = (inventory or Inventory()).get(device)
        default = Candidate.make(cand.backend if cand.backend in ("ort", "tflite") else "ort", {}, baseline=True)
        acc = accuracy if accuracy is not None and accuracy.set else stored_budget(store, cand.key())
        cfg = TuneConfig(budget_s=budget_s, rounds=rounds, finalists=1, spaces=(), accuracy=acc)
        tuner = DeviceTuner(spec, store, cfg)
        info = tuner.info()
        cands = []
        for c in ([default] if default.key() != cand.key() else []) + [cand]:
            cands.append((c, space_of(c)))
        points = shape_points(m, parse_dims(dims, m), {})
        run_id = "bench-" + hashlib.sha256(f"{m.sha256}{cand.key()}{time.time_ns()}".encode()).hexdigest()[:10]
        versions = run_versions(info)
        store.acquire_device(device_identity(spec), run_id)  # one process drives a device at a time
        store.start_run(run_id, str(m.path), m.sha256, spec.name, info.fingerprint_key,
                        {**info.fingerprint, "arch": info.arch}, versions,
                        {"kind": "bench", "config": cand.key(), "rounds": rounds, "points": points,
                         "command": command, **({"accuracy": acc.as_dict()} if acc.set else {})})
        deadline = time.monotonic() + budget_s
        for p in points:
            wl = build_workload(m, p)
            tuner.tune_shape(run_id, m, info, wl, cands, versions, deadline)
        summary = summarize_run(store, run_id)
        store.finish_run(run_id, summary.as_dict())
        return summary
    finally:
        store.close()


def verify_config(model: str, config_key: str, device: str = "local", *, dims: Sequence[str] = (),
                  inputs: Sequence[str] = (), db: str | None = None, inventory: Inventory | None = None,
                  seed: int | None = None, accuracy: AccuracyBudget | None = None) -> dict:
    """Run one stored configuration once on seeded (and user) inputs and verify it. An approximate
    configuration is held to ``accuracy`` (default: the budget it was tuned under, ``stored_budget``).

    The inputs come from a fresh random ``seed`` by default, never one a tune of this configuration
    used (the candidate must not be checked on data it was selected on); pass ``seed`` to replay a
    verification. The seed used is in the result (``seed``, ``seed_source``: fresh | given)."""
    m = load_model(resolve_model(model))
    store = Store(db, create=False) if db else Store()
    try:
        cand = find_candidate(store, config_key)
        seed_source = "given" if seed is not None else "fresh"
        if seed is None:
            seed = fresh_seed(tune_seeds(store, cand.key()))
        acc = accuracy if accuracy is not None and accuracy.set else stored_budget(store, cand.key())
    finally:
        store.close()
    spec = (inventory or Inventory()).get(device)
    with device_lease(spec, db):  # one process drives a device at a time
        tuner = DeviceTuner(spec, Store(":memory:"), TuneConfig(spaces=(), seed=seed, accuracy=acc))
        info = tuner.info()
        results = []
        for p in shape_points(m, parse_dims(dims, m), {}):
            wl = build_workload(m, p, load_user_inputs(inputs), seed=seed)
            try:
                prep = space_of(cand).prepare(cand, wl, info, tuner.cache_dir)
            except BuildFailed as exc:
                results.append({"shape": p, "ok": False, "reason": f"build failed: {exc}"})
                continue
            res = tuner._job(wl, prep, budget_ms=50.0)
            verdict = tuner._verify(wl, res, cand)
            results.append({"shape": p, **verdict.as_dict(), "status": res.status})
    return {"candidate": cand.as_dict(), "label": cand.label(), "device": spec.name, "accuracy_budget": acc.as_dict(),
            "fingerprint_key": info.fingerprint_key, "seed": seed, "seed_source": seed_source,
            "ok": all(r["ok"] for r in results), "shapes": results}


def tune_seeds(store: Store, candidate_key: str) -> set[int]:
    """The input seeds of every stored run that measured ``candidate_key``."""
    seeds = set()
    for run_id in {r.run_id for r in store.records(candidate_key=candidate_key)}:
        run = store.get_run(run_id) or {}
        try:
            config = json.loads(run.get("config") or "{}")
        except (TypeError, ValueError):
            config = {}
        seeds.add(int(config.get("seed", 0)) if isinstance(config, dict) else 0)
    return seeds


def stored_budget(store: Store, candidate_key: str) -> AccuracyBudget:
    """The accuracy budget of the newest stored run that measured ``candidate_key`` under one (an
    approximate configuration is re-checked against the budget it was selected under); none if no
    such run."""
    runs = [store.get_run(rid) or {} for rid in {r.run_id for r in store.records(candidate_key=candidate_key)}]
    for run in sorted(runs, key=lambda r: float(r.get("created") or 0), reverse=True):
        try:
            config = json.loads(run.get("config") or "{}")
        except (TypeError, ValueError):
            continue
        acc = config.get("accuracy") if isinstance(config, dict) else None
        if isinstance(acc, dict) and acc:
            try:
                return AccuracyBudget.from_dict(acc)
            except (TypeError, ValueError):
                continue
    return AccuracyBudget()


def fresh_seed(avoid: set[int] = frozenset()) -> int:
    """A new random input seed (31 bits, so any tool can replay it), none of ``avoid``."""
    while True:
        seed = secrets.randbelow(2**31 - 1) + 1
        if seed not in avoid:
            return seed


def report_markdown(outcome: TuneOutcome) -> str:
    return markdown(report_dict(outcome))


__all__ = ["tune", "bench", "verify_config", "report_markdown", "resolve_model", "TuneConfig"]


def judge(op: str, kernels: Sequence[str], devices: Sequence[str] = ("local",), *, rounds: int = 5,
          budget_ms: float = 50.0, report_dir: str | None = None, db: str | None = None, **options: Any) -> dict:
    """Judge third-party kernels (``edgetune judge``): the JSON document of schema ``edgetune.judge/1``
    (one entry per kernel per device: ``correct``, ``failure``, ``speed`` with its 95% interval, the
    build and every sample; per device the strongest baseline and the fast_p leaderboard).
    ``options``: any other field of ``edgetune.judge.JudgeConfig`` (timeout_s, memory_mb, cflags,
    exact_shape, baseline, num_threads)."""
    return _judge(JudgeConfig(op=op, kernels=list(kernels), devices=list(devices), rounds=rounds, budget_ms=budget_ms,
                              report_dir=report_dir, db=db, **options))
