"""edgetune tune MODEL"""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.text import Text

from edgetune.cli.common import (DbOpt, DimOpt, Format, FormatOpt, console, emit_json, err_console, reproducing_command,
                                 run_guarded)
from edgetune.errors import UserInputError
from edgetune.text import device_text, plain, safe


def tune_cmd(
    ctx: typer.Context,
    model: str = typer.Argument(..., help="ONNX or .tflite file, or a bundled model name (mobilenet, transformer)"),
    device: List[str] = typer.Option(["local"], "--device", "-d", help="device name; repeat for a farm (run in parallel)"),
    budget: float = typer.Option(60.0, "--budget", help="seconds of tuning per device (all shapes together)"),
    sweep: List[str] = typer.Option([], "--sweep", help="tune per shape: --sweep batch=1,4,16 --sweep seq=32,128"),
    dim: List[str] = DimOpt,
    input: List[str] = typer.Option([], "--input", help="user input data: --input name=file.npy (verified too)"),
    space: str = typer.Option("default", "--space",
                              help="candidate spaces: ort, ort-fused, ort-int8, openvino, litert, tflite, tvm-relax, "
                                   "tvm-tuned, ort-tvm (hybrid; both with --tvm-trials); 'default': ort, ort-fused, "
                                   "openvino, litert, tflite, tvm-relax"),
    accuracy: List[str] = typer.Option([], "--accuracy",
                                       help="accuracy budget for approximate (int8, bf16, fp16) candidates, e.g. "
                                            "--accuracy cosine=0.999 [max-abs=X, top1=X]; adds 'ort-int8' to "
                                            "--space. Without it only exact candidates are selected"),
    tvm_trials: int = typer.Option(0, "--tvm-trials", min=0,
                                   help="MetaSchedule trials in all, the same total for the tvm-tuned and ort-tvm (hybrid) "
                                        "candidates (adds 'tvm-tuned' to --space)"),
    adapter: List[str] = typer.Option([], "--adapter", help="a Python runtime adapter .py to add as a candidate"),
    rounds: int = typer.Option(3, "--rounds", min=1, help="interleaved measuring rounds for the finalists"),
    finalists: int = typer.Option(5, "--finalists", min=1, help="candidates raced against the baselines"),
    max_candidates: Optional[int] = typer.Option(None, "--max-candidates", min=1, help="cap per space (quick runs; each precision form still gets one)"),
    timeout: float = typer.Option(60.0, "--timeout", help="seconds before a candidate counts as hung"),
    fresh: bool = typer.Option(False, "--fresh", help="start a new run instead of resuming an identical one"),
    join: Optional[str] = typer.Option(None, "--join", metavar="RUN_ID",
                                       help="measure a run another host started (in --db) on these devices too: "
                                            "same hardware; the run's settings and shapes; each device claims "
                                            "the shape points nobody measures yet"),
    ray: Optional[str] = typer.Option(None, "--ray", metavar="ADDRESS",
                                      help="run the host's heavy work (references, tvm-relax builds) on this Ray "
                                           "cluster (same edgetune, onnxruntime and TVM on its nodes); "
                                           "measurements stay on the devices"),
    report_dir: Optional[Path] = typer.Option(None, "--report-dir", help="also write report.md, report.json and report.html here"),
    brief: bool = typer.Option(False, "--brief", help="print only the best of each runtime family and precision "
                               "and the verdict per shape (the full tables go to --report-dir)"),
    db: Optional[str] = DbOpt,
    fmt: Format = FormatOpt,
) -> None:
    """Tune MODEL on one or more devices: every candidate verified, speedups with 95% CIs."""
    run_guarded(_tune, model, device, budget, sweep, dim, input, space, adapter, rounds, finalists, max_candidates,
                timeout, fresh, report_dir, db, fmt, tvm_trials, reproducing_command(ctx), accuracy, join, ray, brief)


def _tune(model, devices, budget, sweeps, dims, inputs, space, adapters, rounds, finalists, max_candidates, timeout,
          fresh, report_dir, db, fmt, tvm_trials=0, command="", accuracy=(), join=None, ray=None, brief=False):
    # lazy: CLI start-up (these import numpy and the tuner; --help needs neither)
    from edgetune import api
    from edgetune.cli.tables import family_tables, run_tables
    from edgetune.report import NOT_BUILT, markdown, report_dict, write_atomic
    from edgetune.report.html import render
    from edgetune.space.adapter import adapter_candidate
    from edgetune.tune_config import DEFAULT_SPACES

    spaces = DEFAULT_SPACES if space == "default" else tuple(s.strip() for s in space.split(",") if s.strip())
    if budget <= 0:
        raise UserInputError("--budget must be positive")
    # adapters are prepared by their space like any other candidate
    extra = [adapter_candidate(a) for a in adapters]

    # task fields and descriptions are formatted into markup: device names and candidate labels go in safe()
    progress = Progress(TextColumn("[bold]{task.fields[device]}[/]"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                        TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(),
                        TextColumn("{task.description}", style="dim"), console=err_console,
                        disable=fmt == Format.json or not err_console.is_terminal, transient=True)
    tasks: dict[str, int] = {}
    building: dict[str, tuple] = {}  # device -> (candidate, kernel) being tuned, for one log line per kernel
    log_lines = fmt != Format.json and not err_console.is_terminal
    said: dict[tuple, str] = {}  # (device, status, reason) -> the first candidate it was written for

    def on_event(ev):
        d = ev.get("device", "")
        if ev["event"] == "start":
            how = " (joining)" if ev.get("joined") else " (resuming)" if ev["resumed"] else ""
            tasks[d] = progress.add_task(safe(f"run {ev['run_id']}{how}"), total=ev["total_jobs"], device=safe(d))
            if log_lines:
                err_console.print(plain(f"{d}: run {ev['run_id']}{how}: "
                                        f"{ev['candidates']} candidates × {ev['points']} shapes"), highlight=False)
        elif ev["event"] in ("job", "skip") and d in tasks:
            progress.advance(tasks[d])
            if ev["event"] == "job":
                med = f"{ev['median_ms']:.4f} ms" if ev.get("median_ms") is not None else ""
                progress.update(tasks[d], description=safe(f"{ev['shape']} {_round_label(ev)} {ev['candidate']} "
                                                           f"{ev['status']} {med}"))
                if log_lines and ev["status"] != "verified":
                    # a reason many candidates share (a provider that cannot load) is written out once
                    first = said.setdefault((d, ev["status"], ev["reason"]), ev["candidate"])
                    why = ev["reason"] if first == ev["candidate"] else f"as for {first}"
                    err_console.print(plain(f"{d}: {ev['shape']} {ev['candidate']}: {ev['status']}: {why}"),
                                      highlight=False)
        elif ev["event"] == "build" and d in tasks:
            best = f", best {ev['best_gflops']:.1f} GFLOP/s" if ev.get("best_gflops") else ""
            progress.update(tasks[d], description=safe(f"{ev['shape']} tuning {ev['candidate']}: {ev['kernel']} "
                                                       f"trial {ev['trials']}{best}"))
            if log_lines and building.get(d) != (ev["candidate"], ev["kernel"]):
                building[d] = (ev["candidate"], ev["kernel"])
                err_console.print(plain(f"{d}: {ev['shape']} tuning {ev['candidate']}: kernel {ev['kernel']}"),
                                  highlight=False, soft_wrap=True)
        elif ev["event"] == "unavailable":
            err_console.print(plain(f"{d}: no {ev['space']} candidates: {ev['reason']}"), highlight=False)
        elif ev["event"] in ("retry", "down"):
            err_console.print(plain(f"{d}: {ev['event']}: {ev.get('error')}", style="yellow"), highlight=False)
        elif ev["event"] == "wait" and ev.get("joiners"):  # this run's other points, measured by joiners
            err_console.print(plain(f"{d}: {ev['message']}", style="yellow"), highlight=False)
        elif ev["event"] == "wait":  # an identical run holds this device's run: wait, then resume it
            err_console.print(plain(f"{d}: {ev['message']} (an identical tune is measuring this device; "
                                    f"this one resumes it when it ends)", style="yellow"), highlight=False)

    with progress:
        outcome = api.tune(model, devices, budget_s=budget, sweeps=sweeps, dims=dims, inputs=inputs, db=db,
                           accuracy=accuracy, progress=on_event, command=command, join=join, spaces=spaces,
                           rounds=rounds, finalists=finalists, timeout_s=timeout, max_candidates=max_candidates,
                           fresh=fresh, extra=extra, tvm_trials=tvm_trials, ray=ray)
    rep = report_dict(outcome)
    if report_dir is not None:
        write_atomic(report_dir / "report.json", __import__("json").dumps(rep, indent=2, default=str))
        write_atomic(report_dir / "report.md", markdown(rep))
        write_atomic(report_dir / "report.html", render(rep))
    if fmt == Format.json:
        emit_json(rep)
    else:
        runs = {r["run_id"]: r for r in rep["runs"]}
        for d in outcome.devices:
            if d.summary:
                brief_run = runs.get(d.run_id) if brief else None
                for t in (family_tables(brief_run) if brief_run else run_tables(d.summary)):
                    console.print(t)
            note = f" (resumed: {d.jobs_skipped} jobs already recorded)" if d.jobs_skipped else ""
            if d.status == "joined":
                console.print(plain(f"{d.device}: measured {len(d.shapes)} shape point(s) of run {d.run_id}, "
                                    f"{d.jobs_run} jobs run{note}; its holder ends the run"), highlight=False)
            elif d.status != "complete":
                console.print(Text.assemble((device_text(f"{d.device}: down: {d.error}"), "red"), note),
                              highlight=False)
            else:
                console.print(plain(f"{d.device}: run {d.run_id} complete, {d.jobs_run} jobs run{note}"),
                              highlight=False)
            # the families a user might pick that were not raced, and why: never silently left out
            for name, why in [*d.families_not_run.items(), *NOT_BUILT.items()]:
                console.print(plain(f"{d.device}: not raced: {name}: {why}"), highlight=False)
        if report_dir is not None:
            console.print(plain(f"report written to {report_dir}/report.md, report.json and report.html"),
                          highlight=False)
    if any(d.status not in ("complete", "joined") for d in outcome.devices):
        raise typer.Exit(3)


def _round_label(ev: dict) -> str:
    """Race rounds as r0, r1, ...; confirmation rounds (stored as 1000 + k) as c1, c2, ..."""
    if ev.get("phase") == "confirm" or ev["round"] >= 1000:
        return f"c{ev.get('confirm_round') or ev['round'] - 1000}"
    return f"r{ev['round']}"
