"""edgetune judge --op SPEC KERNEL... [-d DEVICE ...] [--format json] [--report-dir DIR]"""

from __future__ import annotations

from typing import List, Optional

import typer

from edgetune.cli.common import (DbOpt, Format, FormatOpt, console, emit_json, err_console, reproducing_command,
                                 run_guarded)
from edgetune.text import device_text, plain


def judge_cmd(
    ctx: typer.Context,
    kernels: List[str] = typer.Argument(..., help="kernel files (.c, .cc/.cpp, .cu, a prebuilt .so or a TVM-exported "
                                        "module) or directories of them"),
    op: str = typer.Option(..., "--op", help="the operator the kernels compute: gemm:M=97,N=130,K=75, "
                           "batch_matmul:..., conv2d_nchw:..., depthwise_conv2d_nchw:..., softmax:M=..,N=.., "
                           "layernorm:M=..,N=.., attention:B=..,H=..,S=..,D=..[,L=..][,causal=1]"),
    device: List[str] = typer.Option(["local"], "--device", "-d", help="device(s) from 'edgetune devices ls' "
                                     "(repeatable)"),
    rounds: int = typer.Option(5, "--rounds", help="interleaved rounds, fresh inputs each: every kernel vs every "
                               "baseline form (a speed verdict needs at least 3)"),
    budget_ms: float = typer.Option(50.0, "--budget-ms", help="timing budget per kernel run"),
    timeout: float = typer.Option(60.0, "--timeout", help="seconds before a kernel counts as hung"),
    memory_mb: int = typer.Option(4096, "--memory-mb", help="resident memory a kernel run may use (all its "
                                  "processes); past it: out-of-memory"),
    threads: Optional[int] = typer.Option(None, "--threads", min=1, help="TVM modules' thread pool (default: cores)"),
    cflag: List[str] = typer.Option([], "--cflag", help="extra compiler flag for C/C++/CUDA sources (repeatable)"),
    exact_shape: bool = typer.Option(False, "--exact-shape", help="check correctness at the spec's shape only "
                                     "(default: also at an odd-sized variant)"),
    baseline: bool = typer.Option(True, "--baseline/--no-baseline", help="race against the strongest baseline"),
    report_dir: Optional[str] = typer.Option(None, "--report-dir", help="write judge.json (every sample), judge.md, "
                                             "the kernels, the binaries judged and rerun.sh here"),
    db: Optional[str] = DbOpt,
    fmt: Format = FormatOpt,
) -> None:
    """Judge third-party kernels: correct? memory-safe? faster than the strongest baseline? Per device."""
    run_guarded(_judge, reproducing_command(ctx), kernels, op, device, rounds, budget_ms, timeout, memory_mb, threads, cflag,
                exact_shape, baseline, report_dir, db, fmt)


def _judge(command, kernels, op, devices, rounds, budget_ms, timeout, memory_mb, threads, cflags, exact_shape, baseline,
           report_dir, db, fmt):
    from edgetune.judge import JudgeConfig, judge  # lazy: CLI start-up (imports numpy)

    cfg = JudgeConfig(op=op, kernels=list(kernels), devices=list(devices), rounds=rounds, budget_ms=budget_ms,
                      timeout_s=timeout, memory_mb=memory_mb, num_threads=threads, cflags=list(cflags), exact_shape=exact_shape,
                      baseline=baseline, db=db, report_dir=report_dir, command=command)
    quiet = fmt == Format.json

    def on_event(ev):
        if quiet:
            return
        kind = ev["event"]
        if kind == "start":
            err_console.print(plain(f"judging {ev['kernels']} kernel(s) for {ev['op']} on {', '.join(ev['devices'])}"),
                              highlight=False)
        elif kind == "device":
            emu = f", EMULATED ({ev['emulated']}): correctness only" if ev["emulated"] else ""
            err_console.print(device_text(f"{ev['device']}: {ev['arch']}, sandbox {ev['sandbox']}{emu}"),
                              highlight=False, markup=False)
        elif kind == "failed":
            err_console.print(device_text(f"  {ev['device']}: {ev['kernel']}: {ev['code']}"), highlight=False,
                              markup=False)
        elif kind == "rounds":
            err_console.print(device_text(f"{ev['device']}: {ev['rounds']} rounds, {ev['kernels']} kernel(s) vs "
                                          f"{', '.join(ev['forms']) or 'no baseline form'}"),
                              highlight=False, markup=False)

    doc = judge(cfg, on_event)
    if fmt == Format.json:
        emit_json(doc)
        return
    _print(doc)


def _print(doc) -> None:
    from rich.table import Table
    from rich.text import Text

    from edgetune.judge import fmt_ns, speed_text

    for d in doc["devices"]:
        fp = d.get("fingerprint") or {}
        b = d.get("baseline") or {}
        base = (f"strongest baseline {b.get('form')} {fmt_ns(b.get('median_ns'))}" if b.get("form")
                else f"no baseline verdict ({b.get('reason')})")
        title = (f"{d['device']} ({fp.get('cpu_model')}, {d['arch']}"
                 + (f", EMULATED: {d['emulated']}" if d["emulated"] else "") + f", sandbox {d['sandbox']}) — {base}")
        t = Table("kernel", "abi", "verdict", "failure", "median", "vs strongest baseline [95% CI]",
                  title=device_text(title))
        rows = [r for r in doc["results"] if r["device"] == d["device"]]
        rows.sort(key=lambda r: (not r["correct"], -((r.get("speed") or {}).get("speedup") or 0), r["kernel"]))
        for r in rows:
            err = r["errors"][0] if r["errors"] else ""
            t.add_row(device_text(r["kernel"]), r.get("abi") or "—",
                      Text("correct", style="green") if r["correct"] else Text("rejected", style="red"),
                      device_text(err[:160]) if r["failure"] else "",
                      fmt_ns(r.get("median_ns")), device_text(speed_text(r.get("speed"))))
        console.print(t)
        board = d["leaderboard"]
        cells = [f"{board['correct']}/{board['kernels']} correct"]
        for p in doc["fast_p"]:
            v = board.get(f"fast_{p:g}")
            cells.append(f"fast_{p:g} {v:.0%}" if v is not None else f"fast_{p:g} n/a")
        console.print(plain(f"{d['device']}: " + " · ".join(cells)), highlight=False)
    if doc.get("report_dir"):
        console.print(plain(f"report: {doc['report_dir']} (judge.json, judge.md, kernels/, built/, rerun.sh)"),
                      highlight=False)
