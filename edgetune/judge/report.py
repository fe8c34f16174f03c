"""A judgement's report directory: judge.json (every sample of every round), the Markdown
leaderboard, the kernels judged (sources and binaries) and a script that re-runs the judgement."""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import shutil
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from edgetune.errors import UserInputError
from edgetune.judge.inputs import KernelFile
from edgetune.judge.results import JudgeConfig
from edgetune.report import write_atomic
from edgetune.text import md_text

def prepare_report_dir(path: str) -> tuple[Path, bool]:
    """The report directory and whether this call made it: made now, so an unwritable path fails
    before any device work. A re-run into the same directory replaces its files (each written
    whole, then renamed)."""
    p = Path(path).expanduser()
    if p.exists() and not p.is_dir():
        raise UserInputError(f"--report-dir {p}: exists and is not a directory")
    made = not p.exists()
    try:
        p.mkdir(parents=True, exist_ok=True)
        probe = p / f".edgetune-write-test-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        if made:
            shutil.rmtree(p, ignore_errors=True)
        raise UserInputError(f"--report-dir {p}: cannot write there ({exc.strerror or exc})") from None
    return p, made


def write_report(report: Path, doc: dict[str, Any], kernels: Sequence[KernelFile], cfg: JudgeConfig) -> None:
    kdir = report / "kernels"
    kdir.mkdir(exist_ok=True)
    for k in kernels:
        dest = kdir / k.name.replace("/", "__")
        if not dest.exists() or hashlib.sha256(dest.read_bytes()).hexdigest() != k.sha256:
            write_atomic(dest, k.path.read_bytes())
    bdir = report / "built"
    bdir.mkdir(exist_ok=True)
    for r in doc["results"]:
        b = r.get("build") or {}
        sha = r.get("artifact_sha256")
        if sha and b.get("binary") and not (bdir / f"{sha}.so").exists():
            data = Path(b["binary"]).read_bytes()
            if hashlib.sha256(data).hexdigest() == sha:  # the binary judged, byte for byte
                write_atomic(bdir / f"{sha}.so", data)
    write_atomic(report / "judge.json", (json.dumps(doc, indent=1, default=json_default) + "\n").encode())
    write_atomic(report / "judge.md", markdown(doc).encode())
    devices = " ".join(f"-d {shlex.quote(d['device'])}" for d in doc["devices"])
    flags = " ".join(f"--cflag={shlex.quote(c)}" for c in cfg.cflags)
    rerun = (f"#!/bin/sh\n# re-run this judgement: the same op, the same kernels (sha256 in judge.json),\n"
             f"# on your devices (edit -d). Every figure is measured again; nothing is read from this report.\n"
             f"cd \"$(dirname \"$0\")\" && exec edgetune judge --op {shlex.quote(doc['op'])} kernels "
             f"{devices} --rounds {doc['rounds']} --budget-ms {doc['budget_ms']:g}"
             + (" --exact-shape" if cfg.exact_shape else "") + (f" {flags}" if flags else "")
             + " --report-dir rerun \"$@\"\n")
    write_atomic(report / "rerun.sh", rerun.encode())
    os.chmod(report / "rerun.sh", 0o755)


def json_default(o: Any) -> Any:
    if isinstance(o, (np.integer,)):
        return int(o)
    if isinstance(o, (np.floating,)):
        return float(o)
    if isinstance(o, Path):
        return str(o)
    raise TypeError(f"not JSON: {type(o).__name__}")


def fmt_ns(ns: float | None) -> str:
    if ns is None:
        return "—"
    if ns < 1e3:
        return f"{ns:.0f} ns"
    if ns < 1e6:
        return f"{ns / 1e3:.1f} µs"
    return f"{ns / 1e6:.2f} ms"


def speed_text(s: dict[str, Any] | None) -> str:
    if not s:
        return "—"
    if s.get("speedup") is None:
        return f"— ({s.get('reason') or 'no verdict'})"
    lo, hi = s["ci95"] or (None, None)
    ci = f" [{lo:.2f}, {hi:.2f}]" if lo is not None else ""
    return f"{s['speedup']:.2f}×{ci} {s['verdict']} vs {s['baseline']}"


def markdown(doc: dict[str, Any]) -> str:
    """The leaderboard and the per-kernel verdicts as Markdown (every device-given string escaped)."""
    out = [f"# edgetune judge: `{md_text(doc['op'])}`", ""]
    if doc.get("odd_shape"):
        out.append(f"Correctness also checked at `{md_text(doc['odd_shape'])}` (odd sizes).")
    out.append(f"{doc['rounds']} interleaved rounds per kernel and baseline form, {doc['budget_ms']:g} ms budget "
               f"per run; fast_p = correct and the whole 95% interval of the speedup over the strongest baseline ≥ p.")
    if doc.get("command"):
        out += ["", f"Command: `{md_text(doc['command'])}`"]
    for d in doc["devices"]:
        fp = d.get("fingerprint") or {}
        board = d["leaderboard"]
        out += ["", f"## {md_text(d['device'])} — {md_text(str(fp.get('cpu_model')))}, {d['arch']}"
                + (f", EMULATED ({md_text(str(d['emulated']))})" if d["emulated"] else "")
                + f", sandbox: {md_text(d['sandbox'])}", ""]
        b = d.get("baseline") or {}
        if b.get("form"):
            out.append(f"Strongest baseline: {md_text(str(b.get('backend')))} ({b['form']}), median "
                       f"{fmt_ns(b.get('median_ns'))}.")
        else:
            out.append(f"No baseline verdict: {md_text(str(b.get('reason')))}")
        fr = board["fraction_correct"]
        cells = [f"{board['correct']}/{board['kernels']} correct ({fr:.0%})" if fr is not None else "no kernels"]
        for p in doc["fast_p"]:
            v = board.get(f"fast_{p:g}")
            cells.append(f"fast_{p:g} = {v:.0%}" if v is not None else f"fast_{p:g} = n/a (emulated)")
        out += ["", "**" + " · ".join(cells) + "**", "",
                "| kernel | abi | verdict | failure | detail | median | vs strongest baseline [95% CI] |",
                "|---|---|---|---|---|---|---|"]
        rows = [r for r in doc["results"] if r["device"] == d["device"]]
        rows.sort(key=lambda r: (not r["correct"], -((r.get("speed") or {}).get("speedup") or 0), r["kernel"]))
        for r in rows:
            verdict = "correct" if r["correct"] else "rejected"
            err = md_text(r["errors"][0][:140]) if r["errors"] else ""
            out.append(f"| {md_text(r['kernel'])} | {r.get('abi') or '—'} | {verdict} | "
                       f"{md_text(r['failure'] or '')} | {err} | {fmt_ns(r.get('median_ns'))} | "
                       f"{md_text(speed_text(r.get('speed')))} |")
    return "\n".join(out) + "\n"
