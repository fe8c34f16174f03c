"""Reports: versioned JSON (schema edgetune.report/1) and Markdown. Every figure carries the device
fingerprint, the versions and the command that reproduces it."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any, Iterable

from edgetune.errors import UserInputError
from edgetune.private import write_atomic_file
from edgetune.results import REPORT_SCHEMA, CandidateSummary, RunSummary
from edgetune.text import md_code, md_text


def report_dict(outcome_or_runs: Any) -> dict[str, Any]:
    runs: list[RunSummary]
    devices_down: list[dict[str, str]] = []
    devices: list[dict[str, Any]] = []
    if hasattr(outcome_or_runs, "devices"):
        runs = [d.summary for d in outcome_or_runs.devices if d.summary is not None]
        devices = [{"device": d.device, "status": d.status, "error": d.error, "run_id": d.run_id,
                    "resumed": d.resumed, "jobs_run": d.jobs_run, "jobs_skipped": d.jobs_skipped,
                    "joined": d.joined, "shapes_measured": list(d.shapes), "host_work": d.host_work,
                    "families_not_run": dict(d.families_not_run)}
                   for d in outcome_or_runs.devices]
        devices_down = [{"device": d.device, "error": d.error} for d in outcome_or_runs.devices
                        if d.status not in ("complete", "joined")]
    else:
        runs = list(outcome_or_runs)
    return {
        "schema": REPORT_SCHEMA,
        "generated": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "runs": [_with_command(r.as_dict()) for r in runs],
        "devices": devices,
        "devices_down": devices_down,
        "comparison": compare_devices(runs),
    }


def _with_command(run: dict[str, Any]) -> dict[str, Any]:
    """A run with ``command``: the recorded command line that reproduces it, null when none was;
    each shape with the choice a user faces (``families``) and its verdict in words (``verdict``)."""
    shapes = [{**s, "families": families(s), "verdict": verdict_line(s)} for s in run.get("shapes", [])]
    return {**run, "shapes": shapes, "command": recorded_command(run), "families_not_built": dict(NOT_BUILT)}


# runtime families a user might pick that edgetune does not build candidates for, with the reason:
# every report says so for each model, so a family's absence is never mistaken for its defeat
NOT_BUILT = {"ExecuTorch": "not built in edgetune: ExecuTorch runs .pte programs exported from a PyTorch "
                           "model (torch.export), and edgetune tunes ONNX and .tflite models; no ONNX-to-PyTorch "
                           "conversion is raced"}

FAMILIES = {"ort": "onnxruntime", "openvino": "OpenVINO", "tflite": "LiteRT", "litert": "LiteRT", "tvm-relax": "TVM",
            "tvm-tuned": "TVM", "adapter": "adapter", "torch": "PyTorch"}


def family_of(cand: dict[str, Any]) -> tuple[str, str]:
    """(runtime family, precision) of a candidate as the report shows it."""
    params = cand.get("params") or {}
    return FAMILIES.get(cand["backend"], cand["backend"]), str(params.get("precision") or "fp32")


def families(shape: dict[str, Any]) -> list[dict[str, Any]]:
    """The best verified candidate of each runtime family and precision (by its race median): what
    a user picking a runtime by hand would choose between. Fastest first; the selected one marked."""
    best: dict[tuple[str, ...], dict[str, Any]] = {}
    for c in shape["candidates"]:
        if c["status"] != "verified" or not c["stats"]:
            continue
        fam = family_of(c["candidate"])
        if fam not in best or c["stats"]["median_ms"] < best[fam]["stats"]["median_ms"]:
            best[fam] = c
    chosen = next((c for c in shape["candidates"] if c["candidate"]["key"] == shape["best"] and c["stats"]), None)
    if chosen is not None and all(c is not chosen for c in best.values()):  # the selection is always shown
        best[family_of(chosen["candidate"]) + ("selected",)] = chosen
    rows = []
    for (fam, prec, *_), c in sorted(best.items(), key=lambda kv: kv[1]["stats"]["median_ms"]):
        rows.append({"family": fam, "precision": prec, "approximate": bool(c.get("approximate")),
                     "label": c["label"], "key": c["candidate"]["key"], "median_ms": c["stats"]["median_ms"],
                     "ci95_ms": c["stats"]["ci95_ms"], "accuracy": c.get("accuracy"), "max_rel_err": c.get("max_rel_err"),
                     "selected": c["candidate"]["key"] == shape["best"]})
    return rows


def _ratio_text(sp: dict[str, Any], what: str = "confirmation rounds") -> str:
    level = f"{100 * sp.get('level', 0.95):.1f}% interval" if sp.get("level", 0.95) != 0.95 else "95% interval"
    return f"{sp['speedup']:.2f}× [{sp['ci95'][0]:.2f}, {sp['ci95'][1]:.2f}], {level}, over {sp['rounds']} {what}"


def verdict_line(shape: dict[str, Any]) -> str:
    """The selection and the confirmation it rests on, naming the baselines it was judged against."""
    by = {c["candidate"]["key"]: c for c in shape["candidates"]}
    best = by.get(shape["best"])
    if best is None:
        return "nothing verified: no configuration is selected"
    conf = shape.get("confirmation") or {}
    base = by.get(conf.get("baseline") or shape.get("best_baseline"))
    contender = by.get(conf.get("contender"))
    sp = conf.get("speedup_vs_best_baseline")
    if contender is None or base is None or sp is None:
        return f"selected {best['label']} (no contender was confirmed against a baseline)"
    meds = ""
    if contender.get("confirm_stats") and base.get("confirm_stats"):
        meds = (f"; confirmation medians {contender['confirm_stats']['median_ms']:.4g} ms vs "
                f"{base['confirm_stats']['median_ms']:.4g} ms")
    fig = _ratio_text(sp) + meds
    if sp["verdict"] == "no significant difference" and sp.get("detectable"):
        fig += f"; these rounds could have detected {sp['detectable']:.2f}× or more"
    default = by.get(conf.get("default"))
    sd = conf.get("speedup_vs_default")
    beside = default is not None and default is not contender and default is not base and sd is not None
    ended = [e for e in conf.get("ended") or [] if e.get("key") in by and e.get("speedup_vs_best_baseline")]
    before = "".join(f"; before it, the {'race winner' if i == 0 else 'next contender'} {by[e['key']]['label']} was "
                     f"{'confirmed slower' if e['verdict'] == 'slower' else 'not confirmed faster'} "
                     f"({_ratio_text(e['speedup_vs_best_baseline'])})" for i, e in enumerate(ended))
    if conf.get("verdict") == "faster":
        line = f"selected {contender['label']}: confirmed faster than the strongest baseline, {base['label']}, {fig}"
        return line + (f", and than {default['label']}, {_ratio_text(sd)}" if beside else "") + before
    strongest = by.get(conf.get("strongest_baseline")) or base
    it = "it" if strongest is base else base["label"]
    said = {"slower": f"was confirmed slower than {it}", "no significant difference": "showed no significant "
            f"difference from {it}", "insufficient rounds": "had too few confirmation rounds for a verdict"}.get(
                sp["verdict"], sp["verdict"])
    if sp["verdict"] == "faster" and beside:  # faster than the race's strongest, not than the default
        said = f"was faster than {it} but not confirmed faster than {default['label']} ({_ratio_text(sd)})"
    role = "the runner-up" if ended else "the race's winner"
    line = f"selected the strongest baseline, {strongest['label']}: {role} {contender['label']} {said} ({fig}){before}"
    bd = conf.get("baseline_vs_default")
    if bd and default is not None and base is not default:
        line += (f"; the race's fastest runtime default, {base['label']}, was "
                 f"{'confirmed' if bd['verdict'] == 'faster' else 'not confirmed'} faster than "
                 f"{default['label']} ({_ratio_text(bd)})")
    return line


def compare_devices(runs: Iterable[RunSummary]) -> list[dict[str, Any]]:
    """Best verified configuration per device and shape, side by side (emulated devices labelled)."""
    rows = []
    for r in runs:
        for s in r.shapes:
            best = s.best
            if best is None or best.stats is None:
                rows.append({"device": r.device, "fingerprint_key": r.fingerprint_key, "shape": s.shape,
                             "best": None, "emulated": r.emulated})
                continue
            rows.append({"device": r.device, "fingerprint_key": r.fingerprint_key, "shape": s.shape,
                         "best": best.candidate.label(), "best_key": best.candidate.key(),
                         "median_ms": best.stats.median_ms,
                         "ci95_ms": [best.stats.ci_low_ns / 1e6, best.stats.ci_high_ns / 1e6],
                         "speedup_vs_default": best.vs_default.as_dict() if best.vs_default else None,
                         "emulated": r.emulated})
    return rows


NO_COMMAND = "none recorded (this run was not started from the edgetune command line)"


def recorded_command(run: dict[str, Any]) -> str | None:
    """The command line recorded with a run, or None (runs started through the Python API)."""
    return (run.get("config") or {}).get("command") or None


def command_text(run: dict[str, Any]) -> str:
    """The reproducing command as Markdown code, or a plain statement that none was recorded."""
    cmd = recorded_command(run)
    return md_code(cmd) if cmd else NO_COMMAND


def fmt_ms(ns: float) -> str:
    ms = ns / 1e6
    if ms < 0.01:
        return f"{ms * 1000:.2f} µs"
    if ms < 1:
        return f"{ms:.4f}"
    return f"{ms:.3f}"


def fmt_speedup(c: CandidateSummary, emulated: bool) -> str:
    if c.vs_default is None:
        return "—"
    r = c.vs_default
    level = f" ({100 * r.level:.1f}% interval, sequential)" if r.level != 0.95 else ""
    text = f"{r.value:.2f}× [{r.ci_low:.2f}, {r.ci_high:.2f}]{level}"
    if emulated:
        return text + " (emulated)"
    return text + {"faster": " faster", "slower": " slower", "no significant difference": " ≈"}.get(
        r.verdict, f" ({r.verdict})")


def fmt_err(c: CandidateSummary | dict[str, Any]) -> str:
    """The error column: max relative error of an exact candidate; the accuracy of an approximate one."""
    acc = c.get("accuracy") if isinstance(c, dict) else c.accuracy
    if acc and acc.get("cosine") is not None:
        top1 = f" top1 {acc['top1']:.3f}" if acc.get("top1") is not None else ""
        return f"cos {acc['cosine']:.5f}{top1}"
    err = c.get("max_rel_err") if isinstance(c, dict) else c.max_rel_err
    return "—" if err is None else f"{err:.1e}"


def markdown(rep: dict[str, Any]) -> str:
    # what the device said (fingerprint, reasons), labels of users' adapters, paths and commands from
    # the database: md_text (escaped, never links or HTML) or md_code, never pasted as Markdown
    t = md_text
    out = ["# edgetune report", "", f"schema {md_code(rep['schema'])}, generated {t(rep['generated'])}", ""]
    for run in rep["runs"]:
        fp = run["fingerprint"]
        out += [f"## {t(Path(run['model']).name)} on {md_code(run['device'])}", "",
                f"- device fingerprint {md_code(run['fingerprint_key'])}: {t(fp.get('cpu_model'))}, "
                f"{t(fp.get('cores'))} cores, {t(fp.get('arch', ''))}, kernel {t(fp.get('kernel'))}, "
                f"{t(fp.get('os'))}, governor {t(fp.get('governor'))}"
                + (f", **emulated ({t(fp.get('emulated'))}): timings are not comparable**" if run["emulated"] else ""),
                f"- versions: {md_code(json.dumps(run['versions'], sort_keys=True))}",
                f"- model sha256 {md_code(str(run['model_sha256'])[:16] + '…')}, run {md_code(run['run_id'])} "
                f"({t(run['status'])})",
                f"- command: {command_text(run)}"]
        out += [f"- not raced: {t(name)}, {t(why)}" for name, why in sorted(run.get("families_not_built", {}).items())]
        out.append("")
        on = [s.get("measured_on") or "" for s in run["shapes"]]
        several = len(set(",".join(on).split(","))) > 1
        for s in run["shapes"]:
            shape = t(" ".join(f"{k}={v}" for k, v in s["shape"].items()) or s["shape_key"])
            if several:  # a joined run: each point measured, baselines included, on one device of the kind
                first, *then = (s.get("measured_on") or "?").split(",")
                shape += f" (measured on {md_code(first)}" + "".join(f", resumed on {md_code(x)}" for x in then) + ")"
            out += [f"### {shape}", "", f"**{t(s['verdict'])}**", "",
                    "The best of each runtime family and precision (race medians, screening figures):", "",
                    "| family | precision | best configuration | median ms | 95% CI ms | error / accuracy |",
                    "|---|---|---|---|---|---|"]
            for f in s["families"]:
                mark = " **selected**" if f["selected"] else ""
                prec = f["precision"] + (" (approximate)" if f["approximate"] else "")
                out.append(f"| {t(f['family'])} | {t(prec)} | {t(f['label'])}{mark} | {f['median_ms']:.4f} | "
                           f"{f['ci95_ms'][0]:.4f}–{f['ci95_ms'][1]:.4f} | {fmt_err(f)} |")
            out += ["",
                    "| candidate | key | status | phase | race median ms (screening) | 95% CI ms | p10–p90 ms | CV | n | max rel err / accuracy | confirmed speedup vs default [interval] |",
                    "|---|---|---|---|---|---|---|---|---|---|---|"]
            for c in s["candidates"]:
                st = c["stats"]
                sp = c["speedup_vs_default"]
                sp_txt = (f"{sp['speedup']:.2f}× [{sp['ci95'][0]:.2f}, {sp['ci95'][1]:.2f}] {sp['verdict']}"
                          if sp else "—")
                status = t(c["status"] + (f": {c['reason']}" if c["reason"] else "")
                           + (f"; {c['placement_label']}" if c.get("placement_label") else ""))
                mark = " **best**" if c["candidate"]["key"] == s["best"] else ""
                # GFM: a | inside a table cell's code span is written \|
                label, key, phase = t(c["label"]), md_code(c["candidate"]["key"]).replace("|", "\\|"), t(c["phase"])
                if st:
                    out.append(f"| {label}{mark} | {key} | {status} | {phase} | "
                               f"{st['median_ms']:.4f} | {st['ci95_ms'][0]:.4f}–{st['ci95_ms'][1]:.4f} | "
                               f"{st['p10_ms']:.4f}–{st['p90_ms']:.4f} | {st['cv']:.2f} | {t(st['n'])} | "
                               f"{fmt_err(c)} | {sp_txt} |")
                else:
                    out.append(f"| {label} | {key} | {status} | {phase} | — | — | — | — | 0 | — | — |")
            for c in s["candidates"]:
                if c.get("modes"):
                    lo, hi = c["modes"]
                    out.append(f"- {t(c['label'])}: timing is bimodal across its processes: "
                               f"{lo['median_ms']:.4g} ms ({lo['share']:.0%} of them) and {hi['median_ms']:.4g} ms "
                               f"({hi['share']:.0%}); its medians mix the two")
            out.append("")
    if len({r["device"] for r in rep["runs"]}) > 1:
        out += ["## Devices side by side", "", "| device | shape | best configuration | median ms | 95% CI ms | speedup vs default |",
                "|---|---|---|---|---|---|"]
        for row in rep["comparison"]:
            shape = t(" ".join(f"{k}={v}" for k, v in row["shape"].items()))
            if row.get("best") is None:
                out.append(f"| {t(row['device'])} | {shape} | none verified | — | — | — |")
                continue
            sp = row["speedup_vs_default"]
            emu = " (emulated)" if row["emulated"] else ""
            out.append(f"| {t(row['device'])}{emu} | {shape} | {t(row['best'])} | {row['median_ms']:.4f} | "
                       f"{row['ci95_ms'][0]:.4f}–{row['ci95_ms'][1]:.4f} | "
                       + (f"{sp['speedup']:.2f}× [{sp['ci95'][0]:.2f}, {sp['ci95'][1]:.2f}]" if sp else "—") + " |")
        out.append("")
    for d in rep.get("devices_down", []):
        out.append(f"- device {md_code(d['device'])} went down: {t(d['error'])}")
    return "\n".join(out) + "\n"


def write_atomic(path: str | os.PathLike, text: str | bytes) -> Path:
    """Write ``path`` whole or not at all (a temp file renamed over it); one line when it cannot."""
    p = Path(path)
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        return write_atomic_file(p, text, 0o644)
    except OSError as exc:
        raise UserInputError(f"cannot write {p}: {exc.strerror or exc}") from exc
