"""The zoo's correctness matrix (``edgetune zoo check``): every architecture x every device x every
runtime family the device offers, each cell checked against an INDEPENDENT float64 reference
(``onnx.reference`` on a float64 copy of the model, never the runtime under test).

A cell is ``pass`` (with its errors), ``n/a`` (the device has no such runtime, or the model has no
form for it: the reason is given), or a failure mode: ``unsupported-op``, ``mismatch`` (with the
verifier's code and errors), ``crash``, ``timeout``, ``out-of-memory``, ``build-failed`` or
``error``. Runtime families: onnxruntime's default session and every other execution provider the
device's onnxruntime offers, LiteRT/XNNPACK (from the model's .tflite form, where one can be
written), TVM Relax untuned (built here for the device's target, run by the TVM runtime on the
device). Every job is the agent protocol's (checked runs, timed iterations on fresh inputs whose
outputs are checked too), so a cell that passes passed on more than one input.
"""

from __future__ import annotations

import html
import re
import secrets
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from edgetune.candidate import Candidate
from edgetune.db import Store, device_lease
from edgetune.devices.inventory import Inventory, home_subdir
from edgetune.errors import DeviceError, UserInputError
from edgetune.space import BuildFailed, space_of
from edgetune.space.litert import SPACE as LITERT
from edgetune.space.openvino import SPACE as OPENVINO
from edgetune.space.ort import NOT_FOR_INFERENCE
from edgetune.space.tvm_relax import SPACE as TVM
from edgetune.text import md_text
from edgetune.tune import DeviceTuner
from edgetune.tune_config import TuneConfig
from edgetune.verify import verify_job
from edgetune.modelfile import load_model
from edgetune.workload import build_workload

SCHEMA = "edgetune.zoo-check/1"
Event = Callable[[dict[str, Any]], None]
_UNSUPPORTED = re.compile(r"NOT_IMPLEMENTED|Could not find an implementation|No Op registered|not supported|"
                          r"[Uu]nsupported|is not implemented|not registered", re.S)
_MISMATCH = {"wrong-output", "imprecise", "non-finite", "insensitive", "non-deterministic", "stale-output",
             "wrong-when-timed", "input-mutated", "late-write"}


@dataclass
class Cell:
    model: str
    size: str
    device: str
    runtime: str
    status: str  # pass | n/a | unsupported-op | mismatch | crash | timeout | out-of-memory | build-failed | error
    reason: str = ""
    code: str | None = None  # the verifier's code behind a failure
    max_abs_err: float | None = None
    max_rel_err: float | None = None
    seconds: float = 0.0
    runtime_version: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def failure_mode(code: str, reason: str) -> str:
    """The matrix's failure mode for a verifier code and its reason."""
    if code in _MISMATCH:
        return "mismatch"
    if code == "crashed":
        return "crash"
    if code == "hung":
        return "timeout"
    if code == "out-of-memory":
        return "out-of-memory"
    if _UNSUPPORTED.search(reason or ""):
        return "unsupported-op"
    return "error"


class Float64Reference:
    """The independent reference of one model: ``onnx.reference`` on a float64 copy (weights and
    float inputs in float64), outputs kept in float64."""

    def __init__(self, path: Path):
        import onnx

        from models.zoo.reference import float64_copy

        self.model = onnx.load(str(path))
        self.names = [i.name for i in self.model.graph.input
                      if i.name not in {t.name for t in self.model.graph.initializer}]
        self.evaluator = _evaluator(float64_copy(self.model))

    def __call__(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        feeds = {n: (np.asarray(x, np.float64) if np.asarray(x).dtype.kind == "f" else np.asarray(x))
                 for n, x in zip(self.names, inputs)}
        return [np.asarray(o, np.float64) for o in self.evaluator.run(None, feeds)]


def _evaluator(model64):
    from onnx.reference import ReferenceEvaluator

    return ReferenceEvaluator(model64)


def _runtimes(info, m, entry) -> list[tuple[str, Candidate | None, str]]:
    """(column, candidate or None, why not) for every runtime family on this device."""
    out: list[tuple[str, Candidate | None, str]] = []
    if "onnxruntime" in info.runtimes and info.runtimes.get("onnxruntime"):
        out.append(("onnxruntime", Candidate.make("ort", {}, baseline=True), ""))
        for ep in info.runtimes.get("onnxruntime_providers") or []:
            if ep not in NOT_FOR_INFERENCE and ep != "CPUExecutionProvider":
                out.append((f"onnxruntime {ep}", Candidate.make("ort", {"execution_provider": ep}), ""))
    else:
        out.append(("onnxruntime", None, "no onnxruntime on the device"))

    why_not = OPENVINO.unavailable(m, info)
    # its exact form: OpenVINO's default is bf16 on CPUs with bf16 units, not what an exact check checks
    out.append(("OpenVINO (fp32)", None if why_not else Candidate.make("openvino", {"config": "default", "precision": "fp32"},
                                                                       baseline=True), why_not or ""))

    # the .tflite form is onnx2tf's conversion, verified on the host before it runs (a conversion
    # that fails or changes the function is this cell's build failure, with its reason)
    why_not = LITERT.unavailable(m, info)
    out.append(("LiteRT/XNNPACK (fp32)", None if why_not else Candidate.make("litert", {"config": "default",
                                                                                       "precision": "fp32"},
                                                                             baseline=True), why_not or ""))
    if TVM.available(m, info):
        cores = int(info.fingerprint.get("cores") or 1)
        out.append(("TVM Relax (untuned)", Candidate.make("tvm-relax", {"num_threads": cores}), ""))
    else:
        why = ("no TVM runtime on the device (the Python agent with tvm)" if "tvm" not in info.runtimes
               or info.python is None else "TVM is not installed here (the host builds the module)")
        out.append(("TVM Relax (untuned)", None, why))
    return out


def check(names: Sequence[str], size: str, devices: Sequence[str], *, inventory=None, timeout_s: float = 300.0,
          budget_ms: float = 20.0, seed: int | None = None, tvm: bool | Sequence[str] = True,
          litert: bool | Sequence[str] = True,
          progress: Event | None = None) -> dict[str, Any]:
    """The matrix as a JSON document (schema ``edgetune.zoo-check/1``)."""
    import models.zoo as zoo

    emit = progress or (lambda ev: None)
    if size not in zoo.SIZES:
        raise UserInputError(f"--size must be one of {', '.join(zoo.SIZES)}, got {size!r}")
    have = zoo.available()
    names = list(names) or have
    for n in names:
        if n not in zoo.ZOO:
            raise UserInputError(f"unknown zoo model {n!r}; known: {', '.join(zoo.ZOO)}")
        if n not in have:
            raise UserInputError(f"zoo model {n!r} is not in this edgetune yet")
    inv = inventory or Inventory()
    specs = [inv.get(d) for d in devices or ["local"]]
    seed = int(seed if seed is not None else secrets.randbits(31))
    model_dir = home_subdir("zoo") / size
    built: dict[str, Path] = {}
    for n in names:
        emit({"event": "build", "model": n, "size": size})
        built[n] = zoo.build(n, size, model_dir)
    cells: list[Cell] = []
    devices_doc = []
    prepared: dict[str, tuple] = {}
    for spec in specs:
        with device_lease(spec):  # one process drives a device at a time, whichever host
            tuner = DeviceTuner(spec, Store(":memory:"), TuneConfig(spaces=(), seed=seed, timeout_s=timeout_s))
            try:
                info = tuner.info()
                devices_doc.append({"device": spec.name, "fingerprint_key": info.fingerprint_key,
                                    "arch": info.arch, "agent": f"{info.agent} {info.agent_version}",
                                    "emulated": info.emulated, "runtimes": {k: v for k, v in info.runtimes.items()
                                                                            if isinstance(v, str) or v is None}})
                for n in names:
                    entry = zoo.entry(n)
                    m, wl, ref, refs64 = prepared[n] if n in prepared else _prepare(built[n], entry, size, seed)
                    prepared[n] = (m, wl, ref, refs64)  # the same inputs and references on every device
                    for column, cand, why in _runtimes(info, m, entry):
                        if cand is not None and cand.backend == "tvm-relax" and (
                                not tvm or (not isinstance(tvm, bool) and n not in tvm)):
                            cand, why = None, "not asked for (--no-tvm)"
                        if cand is not None and cand.backend == "litert" and (
                                not litert or (not isinstance(litert, bool) and n not in litert)):
                            cand, why = None, "not asked for (--no-litert)"
                        emit({"event": "cell", "model": n, "device": spec.name, "runtime": column})
                        cell = _cell(tuner, info, wl, refs64, n, size, spec.name, column, cand, why, budget_ms)
                        cells.append(cell)
                        emit({"event": "done", "cell": cell})
            finally:
                if getattr(tuner, "client", None) is not None:
                    tuner.client.close()
    doc = {"schema": SCHEMA, "size": size, "seed": seed, "models": [
        {"name": n, "title": zoo.entry(n).title, "family": zoo.entry(n).family, "sha256": zoo.sha256(built[n]),
         "dims": zoo.entry(n).dims(size), "tflite": zoo.entry(n).tflite} for n in names],
        "devices": devices_doc, "cells": [c.as_dict() for c in cells],
        "reference": "onnx.reference on a float64 copy of the model (independent of every runtime checked)"}
    doc["summary"] = summary(cells)
    return doc


def _prepare(path: Path, entry, size: str, seed: int):
    """(model, workload, float64 reference, the input sets' float64 references) of one zoo model."""
    m = load_model(path)
    wl = build_workload(m, entry.dims(size), seed=seed)
    ref = Float64Reference(path)
    refs64 = [ref(s) for s in wl.input_sets]
    # the job's output specs come from these (the model's own dtypes); verification uses refs64
    wl._references = [[r.astype(o.dtype) for r, o in zip(rs, m.outputs)] for rs in refs64]  # noqa: SLF001
    wl.reference_for = ref  # replayed fresh inputs of checked timed iterations: float64 too
    return m, wl, ref, refs64


def _cell(tuner, info, wl, refs, name, size, device, column, cand, why, budget_ms) -> Cell:
    if cand is None:
        return Cell(name, size, device, column, "n/a", why)
    t0 = time.monotonic()
    try:
        prep = space_of(cand).prepare(cand, wl, info, tuner.cache_dir)
    except BuildFailed as exc:
        msg = str(exc)
        mode = "unsupported-op" if _UNSUPPORTED.search(msg) else "build-failed"
        return Cell(name, size, device, column, mode, msg[:300], seconds=time.monotonic() - t0)
    try:
        res = tuner._job(wl, prep, budget_ms=budget_ms)  # noqa: SLF001 - the tuner's one job path
    except DeviceError:
        raise
    v = verify_job(res, wl.input_sets, refs, wl.reference_for, wl.output_names, flops=None,
                   timings_trusted=not info.emulated, output_dtypes=[s.dtype for s in wl.model.outputs])
    version = next((str(x) for k, x in (res.runtime_versions or {}).items() if x), None)
    if v.ok:
        return Cell(name, size, device, column, "pass", "", None, v.max_abs_err, v.max_rel_err,
                    time.monotonic() - t0, version)
    return Cell(name, size, device, column, failure_mode(v.code, v.reason), v.reason[:400], v.code, v.max_abs_err,
                v.max_rel_err, time.monotonic() - t0, version)


def summary(cells: Sequence[Cell]) -> dict[str, int]:
    out: dict[str, int] = {}
    for c in cells:
        out[c.status] = out.get(c.status, 0) + 1
    return dict(sorted(out.items()))


def columns(doc: dict[str, Any]) -> list[tuple[str, str]]:
    """(device, runtime) pairs in order of appearance."""
    seen: list[tuple[str, str]] = []
    for c in doc["cells"]:
        k = (c["device"], c["runtime"])
        if k not in seen:
            seen.append(k)
    return seen


def cell_text(c: dict[str, Any] | None) -> str:
    if c is None:
        return ""
    if c["status"] == "pass":
        return f"pass ({c['max_rel_err']:.1e})" if c.get("max_rel_err") is not None else "pass"
    if c["status"] == "n/a":
        return "n/a"
    return c["status"]


def markdown(doc: dict[str, Any]) -> str:
    cols = columns(doc)
    by = {(c["model"], c["device"], c["runtime"]): c for c in doc["cells"]}
    lines = [f"| model ({doc['size']}) | " + " | ".join(md_text(f"{d}: {r}") for d, r in cols) + " |",
             "|---|" + "---|" * len(cols)]
    for m in doc["models"]:
        lines.append(f"| {md_text(m['name'])} | "
                     + " | ".join(md_text(cell_text(by.get((m["name"], d, r)))) for d, r in cols) + " |")
    notes = sorted({f"{c['device']}: {c['runtime']}: {c['reason']}" for c in doc["cells"] if c["status"] == "n/a"})
    fails = [f"{c['model']} on {c['device']} / {c['runtime']}: {c['status']}: {c['reason']}" for c in doc["cells"]
             if c["status"] not in ("pass", "n/a")]
    out = "\n".join(lines) + "\n"
    if fails:
        out += "\nFailures:\n\n" + "\n".join(f"- {md_text(f)}" for f in fails) + "\n"
    if notes:
        out += "\nn/a:\n\n" + "\n".join(f"- {md_text(n)}" for n in notes) + "\n"
    return out


_COLORS = {"pass": "#c8e6c9", "n/a": "#eeeeee"}


def html_matrix(doc: dict[str, Any]) -> str:
    cols = columns(doc)
    by = {(c["model"], c["device"], c["runtime"]): c for c in doc["cells"]}
    head = "".join(f"<th>{html.escape(d)}<br>{html.escape(r)}</th>" for d, r in cols)
    rows = []
    for m in doc["models"]:
        tds = []
        for d, r in cols:
            c = by.get((m["name"], d, r))
            if c is None:
                tds.append("<td></td>")
                continue
            color = _COLORS.get(c["status"], "#ffcdd2")
            title = html.escape(c.get("reason") or "", quote=True)
            tds.append(f'<td style="background:{color}" title="{title}">{html.escape(cell_text(c))}</td>')
        rows.append(f"<tr><th>{html.escape(m['name'])}</th>{''.join(tds)}</tr>")
    return ("<!doctype html><meta charset='utf-8'><title>edgetune zoo check</title>"
            "<style>table{border-collapse:collapse;font:13px sans-serif}td,th{border:1px solid #999;"
            "padding:4px 8px}</style>"
            f"<h1>edgetune zoo check ({html.escape(doc['size'])})</h1>"
            f"<p>Reference: {html.escape(doc['reference'])}. Seed {doc['seed']}. Hover a cell for its reason.</p>"
            f"<table><tr><th>model</th>{head}</tr>{''.join(rows)}</table>\n")
