"""``edgetune zoo bench``: edgetune's tune on every zoo model over its family's shape points, each
selection reported against the onnxruntime default and the strongest baseline with the 95% interval
and verdict of the tune's own confirmation rounds (edgetune/results.py), nothing measured here.

Shape points (``points(name, size)``), one tune run per model per device, all points in that run:

* vision, detection, segmentation: ``batch`` 1, 8, 32 (both sizes);
* text encoder (bert_base): ``seq`` 32, 128, 512 x ``batch`` 1, 8; seq values above the model's
  position table (``max_pos``: 512 full, 64 small) are capped to it and duplicates dropped, so small
  runs seq 32, 64 x batch 1, 8;
* audio encoder (whisper_encoder): ``batch`` 1, 8 (its frames are fixed by the graph);
* decoders (gpt2, llama): prefill (``seq`` 128, ``past`` 0, ``batch`` 1) and one decode step
  (``seq`` 1, ``past`` 128, ``batch`` 1), the full size's ``DIMS``/``DECODE`` seq and past; where
  seq + past exceeds the model's context (small gpt2 ctx 128, small llama max_pos 128) the prefill
  seq is capped to the context and the decode step's past to context - 1 (so small decodes at
  past 127).

The runs are ordinary tune runs (``DeviceTuner.tune``, the machinery of ``edgetune tune``) in the
database: ``edgetune db ls`` and ``edgetune report`` read them. The points are passed to the tuner
directly rather than as ``--dim``/``--sweep`` strings: a prefill has ``past`` = 0, which the string
form refuses, and prefill/decode are two points, not a cartesian product.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Sequence

from edgetune.accuracy import AccuracyBudget
from edgetune.devices.inventory import Inventory, home_subdir
from edgetune.errors import UserInputError
from edgetune.space import SPACES, with_approximate
from edgetune.tune import tune
from edgetune.tune_config import DEFAULT_SPACES, TuneConfig

SCHEMA = "edgetune.zoo-bench/1"
VISION = ("vision", "detection", "segmentation")
BATCHES = (1, 8, 32)
TEXT_SEQ = (32, 128, 512)
TEXT_BATCH = (1, 8)
AUDIO_BATCH = (1, 8)
PREFILL_SEQ = 128
DECODE_PAST = 128


def _context(entry: Any, size: str) -> int | None:
    cfg = getattr(entry.mod(), "CONFIGS", {}).get(size, {})
    for k in ("ctx", "max_pos"):
        if k in cfg:
            return int(cfg[k])
    return None


def points(name: str, size: str) -> list[dict[str, Any]]:
    """The shape points of one zoo model: [{"label": ..., "dims": {...}}] (see the module docstring)."""
    import models.zoo as zoo

    e = zoo.entry(name)
    fam = e.family
    dims = e.dims(size)
    ctx = _context(e, size)
    if fam in VISION:
        return [{"label": f"batch={b}", "dims": {**dims, "batch": b}} for b in BATCHES]
    if fam == "text":
        seqs = list(dict.fromkeys(min(s, ctx) if ctx else s for s in TEXT_SEQ))
        return [{"label": f"seq={s} batch={b}", "dims": {**dims, "seq": s, "batch": b}}
                for s in seqs for b in TEXT_BATCH]
    if fam == "audio":
        return [{"label": f"batch={b}", "dims": {**dims, "batch": b}} for b in AUDIO_BATCH]
    if fam == "decoder":
        mod = e.mod()
        full_pre = mod.DIMS["full"]
        full_dec = getattr(mod, "DECODE", {}).get("full", {"batch": 1, "seq": 1, "past": DECODE_PAST})
        pre_seq = int(full_pre.get("seq", PREFILL_SEQ))
        dec_past = int(full_dec.get("past", DECODE_PAST))
        if ctx:
            pre_seq = min(pre_seq, ctx)
            dec_past = min(dec_past, ctx - int(full_dec.get("seq", 1)))
        pre = {**dims, "batch": 1, "seq": pre_seq, "past": 0}
        dec = {**dims, "batch": 1, "seq": int(full_dec.get("seq", 1)), "past": dec_past}
        return [{"label": f"prefill seq={pre_seq}", "dims": pre},
                {"label": f"decode past={dec_past}", "dims": dec}]
    return [{"label": ",".join(f"{k}={v}" for k, v in dims.items()) or "static", "dims": dims}]


def nominal_points(name: str, size: str) -> list[dict[str, Any]]:
    """Only the size's own shape: batch 1 (and its seq) for encoders, the prefill and the decode
    step for decoders (whose two points are both nominal)."""
    pts = points(name, size)
    import models.zoo as zoo

    e = zoo.entry(name)
    if e.family == "decoder":
        return pts
    dims = e.dims(size)
    want = {**dims, "batch": 1} if "batch" in dims or any("batch" in p["dims"] for p in pts) else dims
    same = [p for p in pts if all(p["dims"].get(k) == v for k, v in want.items())]
    return same or [{"label": ",".join(f"{k}={v}" for k, v in want.items()) or "static", "dims": want}]


def _ratio(r: Any) -> dict[str, Any] | None:
    if r is None:
        return None
    return {"ratio": r.value, "ci95": [r.ci_low, r.ci_high], "verdict": r.verdict, "rounds": r.rounds}


def _identity(what: str) -> dict[str, Any]:
    return {"ratio": 1.0, "ci95": [1.0, 1.0], "verdict": f"is the {what}", "rounds": None}


def _label(shape: Any, key: str | None) -> str | None:
    c = shape.get(key) if key else None
    return c.candidate.label() if c else None


def shape_row(shape: Any, label: str, run_id: str, device: str) -> dict[str, Any]:
    """One shape of a run summary as a zoo-bench row: figures straight from results.ShapeSummary."""
    best = shape.best
    stats = (best.confirm_stats or best.stats) if best else None
    row: dict[str, Any] = {
        "device": device, "point": label, "shape": shape.shape, "run_id": run_id,
        "config": {"label": best.candidate.label(), "key": shape.best_key} if best else None,
        "median_ns": stats.median_ns if stats else None,
        "median_basis": ("confirmation rounds" if best and best.confirm_stats else "race rounds") if stats else None,
    }
    # vs the onnxruntime default
    if best is None:
        row["vs_default"] = None
    elif shape.best_key == shape.default_key:
        row["vs_default"] = _identity("onnxruntime default")
    else:
        r = best.vs_default
        if r is None and shape.confirmation and shape.best_key == shape.confirmation.state.contender:
            r = shape.confirmation.vs_default
        row["vs_default"] = _ratio(r)
    if row["vs_default"] is not None:
        row["vs_default"]["default"] = {"label": _label(shape, shape.default_key), "key": shape.default_key}
    # vs the strongest baseline
    base = {"label": _label(shape, shape.best_baseline_key), "key": shape.best_baseline_key}
    if best is None:
        row["vs_strongest"] = {"baseline": base, "ratio": None, "ci95": None, "verdict": None}
    elif shape.best_key == shape.best_baseline_key:
        row["vs_strongest"] = {"baseline": base, **_identity("strongest baseline")}
    else:
        r = best.vs_best_baseline
        if r is None and shape.confirmation and shape.best_key == shape.confirmation.state.contender:
            r = shape.confirmation.vs_best_baseline
        row["vs_strongest"] = {"baseline": base, **(_ratio(r) or {"ratio": None, "ci95": None, "verdict": None})}
    # the race's winner and what its confirmation said (the selection falls back to the strongest
    # baseline unless the winner is confirmed faster)
    conf = shape.confirmation
    row["contender"] = None if conf is None else {
        "label": _label(shape, conf.state.contender), "key": conf.state.contender,
        "vs_strongest": _ratio(conf.vs_best_baseline), "vs_default": _ratio(conf.vs_default)}
    return row


def bench(names: Sequence[str], size: str = "small", devices: Sequence[str] = ("local",), *, budget_s: float = 60.0,
          spaces: Sequence[str] | None = None, db: str | None = None, rounds: int = 3, finalists: int = 5,
          max_candidates: int | None = None, command: str = "",
          progress: Callable[[dict[str, Any]], None] | None = None, accuracy: Sequence[str] = (),
          shapes: str = "sweep") -> dict[str, Any]:
    """Tune each zoo model (``budget_s`` per model per device) over its shape points; the
    ``edgetune.zoo-bench/1`` document. Bad input raises UserInputError before any device work.
    ``accuracy``: the budget for approximate candidates (``--accuracy`` strings; adds the approximate
    spaces); ``shapes``: ``sweep`` (the family's points) or ``nominal`` (``nominal_points``)."""
    import models.zoo as zoo

    emit = progress or (lambda ev: None)
    if size not in zoo.SIZES:
        raise UserInputError(f"--size must be one of {', '.join(zoo.SIZES)}, got {size!r}")
    if budget_s <= 0:
        raise UserInputError("--budget must be positive")
    have = zoo.available()
    names = list(dict.fromkeys(names)) or have
    for n in names:
        if n not in zoo.ZOO:
            raise UserInputError(f"unknown zoo model {n!r}; known: {', '.join(zoo.ZOO)}")
        if n not in have:
            raise UserInputError(f"zoo model {n!r} is not in this edgetune yet")
    if shapes not in ("sweep", "nominal"):
        raise UserInputError(f"--shapes must be sweep or nominal, got {shapes!r}")
    acc = AccuracyBudget.parse(accuracy)
    spaces = with_approximate(tuple(spaces) if spaces else DEFAULT_SPACES, acc.set)
    bad = [s for s in spaces if s not in SPACES]
    if bad:
        raise UserInputError(f"unknown space {', '.join(bad)} (known: {', '.join(SPACES)})")
    inv = Inventory()
    specs = [inv.get(d) for d in dict.fromkeys(devices or ["local"])]
    cfg = TuneConfig(budget_s=budget_s, rounds=rounds, finalists=finalists, spaces=spaces,
                     max_candidates=max_candidates, accuracy=acc)
    t_all = time.monotonic()
    model_dir = home_subdir("zoo") / size
    out_models = []
    for n in names:
        e = zoo.entry(n)
        pts = points(n, size) if shapes == "sweep" else nominal_points(n, size)
        emit({"event": "build", "model": n, "size": size})
        path = zoo.build(n, size, model_dir)
        emit({"event": "model", "model": n, "points": [p["label"] for p in pts], "devices": len(specs)})
        t0 = time.monotonic()
        # the tuner's own multi-device loop (a device that fails is that device's outcome)
        outcomes = tune(path, [s.name for s in specs], db=db, config=cfg, inventory=inv, progress=emit,
                        command=command, points=[p["dims"] for p in pts]).devices
        label_of = {_key(p["dims"]): p["label"] for p in pts}
        runs, rows = [], []
        for spec, o in zip(specs, outcomes):
            runs.append({"device": spec.name, "run_id": o.run_id, "status": o.status, "error": o.error,
                         "resumed": o.resumed, "jobs_run": o.jobs_run})
            if o.summary is None:
                continue
            by_key = {_key(s.shape): s for s in o.summary.shapes}
            for p in pts:
                s = by_key.get(_key(p["dims"]))
                if s is None:
                    rows.append({"device": spec.name, "point": p["label"], "shape": p["dims"], "run_id": o.run_id,
                                 "config": None, "median_ns": None, "vs_default": None,
                                 "vs_strongest": None, "contender": None,
                                 "missing": o.error or "no records for this point"})
                else:
                    rows.append(shape_row(s, label_of.get(_key(s.shape), p["label"]), o.run_id, spec.name))
        wall = time.monotonic() - t0
        out_models.append({"name": n, "title": e.title, "family": e.family, "size": size, "model": str(path),
                           "sha256": zoo.sha256(path), "points": pts, "runs": runs, "shapes": rows,
                           "wall_s": round(wall, 2)})
        emit({"event": "done", "model": n, "wall_s": wall, "runs": runs})
    return {"schema": SCHEMA, "size": size, "devices": [s.name for s in specs], "budget_s_per_model": budget_s,
            "spaces": list(spaces), "shapes": shapes, "accuracy": acc.as_dict(), "models": out_models, "wall_s": round(time.monotonic() - t_all, 2)}


def _key(d: dict[str, Any]) -> tuple:
    return tuple(sorted((k, int(v)) for k, v in d.items()))


def _fmt_ratio(r: dict[str, Any] | None) -> str:
    if not r or r.get("ratio") is None:
        return "-"
    if r.get("rounds") is None and r["ci95"] == [1.0, 1.0]:
        return "1 (itself)"
    lo, hi = r["ci95"]
    return f"{r['ratio']:.3f} [{lo:.3f}, {hi:.3f}] {r['verdict']}"


def _fmt_contender(c: dict[str, Any] | None) -> str:
    if not c:
        return "-"
    return f"{c['label']}: {_fmt_ratio(c.get('vs_strongest'))}"


def _fmt_ms(ns: float | None) -> str:
    return "-" if ns is None else f"{ns / 1e6:.4f} ms"


def table_rows(doc: dict[str, Any]) -> list[list[str]]:
    """Rows for the text table: model, device, point, config, median, vs default, strongest baseline,
    vs strongest, the race winner's confirmation vs the strongest baseline, run."""
    out = []
    for m in doc["models"]:
        for r in m["shapes"]:
            vs = r.get("vs_strongest") or {}
            base = (vs.get("baseline") or {}).get("label") or "-"
            out.append([m["name"], r["device"], r["point"], (r.get("config") or {}).get("label") or "-",
                        _fmt_ms(r.get("median_ns")), _fmt_ratio(r.get("vs_default")), base,
                        _fmt_ratio(vs if vs else None), _fmt_contender(r.get("contender")),
                        (r.get("run_id") or "-")])
    return out


def markdown(doc: dict[str, Any]) -> str:
    head = ["model", "device", "shape", "selected config", "median", "vs ort default (95% CI)",
            "strongest baseline", "vs strongest (95% CI)", "race winner vs strongest (confirmation)", "run"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in table_rows(doc):
        lines.append("| " + " | ".join(c.replace("|", "/") for c in row) + " |")
    return "\n".join(lines)
