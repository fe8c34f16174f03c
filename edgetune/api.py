"""The Python API the CLI is a thin layer over.

    from edgetune import api
    outcome = api.tune("mobilenet.onnx", devices=["local"], sweeps=["batch=1,16"], budget_s=60)
    print(api.report_markdown(outcome))
"""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path
from typing import Any, Sequence

from edgetune.agent.host import AgentClient
from edgetune.candidate import Candidate
from edgetune.db import Store
from edgetune.devices.inventory import DeviceSpec, Inventory, edgetune_home
from edgetune.errors import UserInputError
from edgetune.report import markdown, report_dict
from edgetune.results import RunSummary, summarize_run
from edgetune.space import BuildFailed, load_space
from edgetune.tune import DeviceTuner, TuneConfig, TuneOutcome, _versions
from edgetune.tune import tune as _tune
from edgetune.verify import array_sha256
from edgetune.workload import build_workload, load_model, parse_dims, shape_points

BUNDLED = ("mobilenet", "transformer")


def resolve_model(name_or_path: str) -> str:
    """A path, or the name of a bundled model (generated reproducibly on first use)."""
    p = Path(name_or_path)
    if p.exists() or name_or_path not in BUNDLED:
        return name_or_path
    import models

    out = edgetune_home() / "models" / f"{name_or_path}.onnx"
    if not out.exists():
        models.build_onnx(name_or_path, out)
    return str(out)


def tune(model: str, devices: Sequence[str] = ("local",), *, budget_s: float = 60.0, sweeps: Sequence[str] = (),
         dims: Sequence[str] = (), inputs: Sequence[str] = (), db: str | None = None, **cfg: Any) -> TuneOutcome:
    config = cfg.pop("config", None) or TuneConfig(budget_s=budget_s, **cfg)
    return _tune(resolve_model(model), devices, dims=dims, sweeps=sweeps, inputs=inputs, db=db, config=config,
                 inventory=cfg.pop("inventory", None))


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
          rounds: int = 5, budget_s: float = 20.0, inventory: Inventory | None = None) -> RunSummary:
    """Measure one stored configuration against the runtime default, interleaved, now."""
    m = load_model(resolve_model(model))
    store = Store(db, create=False) if db else Store()
    try:
        cand = find_candidate(store, config_key)
        spec = (inventory or Inventory()).get(device)
        default = Candidate.make(cand.backend if cand.backend in ("ort", "tflite") else "ort", {}, baseline=True)
        cfg = TuneConfig(budget_s=budget_s, rounds=rounds, finalists=1, spaces=())
        tuner = DeviceTuner(spec, store, cfg)
        info = tuner.info()
        cands = []
        for c in ([default] if default.key() != cand.key() else []) + [cand]:
            cands.append((c, load_space(c.backend)))
        points = shape_points(m, parse_dims(dims, m), {})
        run_id = "bench-" + hashlib.sha256(f"{m.sha256}{cand.key()}{time.time_ns()}".encode()).hexdigest()[:10]
        versions = _versions(info)
        store.start_run(run_id, str(m.path), m.sha256, spec.name, info.fingerprint_key,
                        {**info.fingerprint, "arch": info.arch}, versions,
                        {"kind": "bench", "config": cand.key(), "rounds": rounds, "points": points})
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
                  inputs: Sequence[str] = (), db: str | None = None, inventory: Inventory | None = None) -> dict:
    """Run one stored configuration once on fresh seeded (and user) inputs and verify it."""
    from edgetune.workload import load_user_inputs

    m = load_model(resolve_model(model))
    store = Store(db, create=False) if db else Store()
    try:
        cand = find_candidate(store, config_key)
    finally:
        store.close()
    spec = (inventory or Inventory()).get(device)
    tuner = DeviceTuner(spec, Store(":memory:"), TuneConfig(spaces=()))
    info = tuner.info()
    results = []
    for p in shape_points(m, parse_dims(dims, m), {}):
        wl = build_workload(m, p, load_user_inputs(inputs))
        try:
            prep = load_space(cand.backend).prepare(cand, wl, info, tuner.cache_dir)
        except BuildFailed as exc:
            results.append({"shape": p, "ok": False, "reason": f"build failed: {exc}"})
            continue
        res = tuner._job(wl, prep, budget_ms=50.0)
        verdict = tuner._verify(wl, res)
        results.append({"shape": p, **verdict.as_dict(), "status": res.status})
    return {"candidate": cand.as_dict(), "label": cand.label(), "device": spec.name,
            "fingerprint_key": info.fingerprint_key, "ok": all(r["ok"] for r in results), "shapes": results}


def report_markdown(outcome: TuneOutcome) -> str:
    return markdown(report_dict(outcome))


__all__ = ["tune", "bench", "verify_config", "report_markdown", "resolve_model", "TuneConfig"]
