"""edgetune tune-kernels (MODEL | --op SPEC ...) --device D --trials N"""

from __future__ import annotations

import sys
from typing import List, Optional

import typer

from edgetune.cli.common import DbOpt, DeviceOpt, DimOpt, Format, FormatOpt, console, emit_json, err_console, run_guarded
from edgetune.text import device_text, plain, safe


def tune_kernels_cmd(
    model: Optional[str] = typer.Argument(None, help="ONNX model (or bundled name) whose TVM tasks to tune"),
    op: List[str] = typer.Option([], "--op", help="operator workload, repeatable: gemm:M=512,N=512,K=512, "
                                 "conv2d_nchw:N=1,C=64,H=56,W=56,K=64,R=3,S=3,pad=1, depthwise_conv2d_nchw:..., batch_matmul:..., "
                                 "dwconv2d_fused:N,C,H,W,R,S,SH,SW,PT,PL,PB,PR,bias=0|1,act=0..3 (a model's depthwise "
                                 "Conv + Relu/Clip(0,6)/HardSwish, as the ort-tvm hybrid tunes it)"),
    device: str = DeviceOpt,
    trials: int = typer.Option(64, "--trials", "-n", help="measured kernels per workload (records already in the device's tuning database count)"),
    dim: List[str] = DimOpt,
    rounds: int = typer.Option(5, "--rounds", help="final interleaved rounds, fresh inputs each: the selected kernel vs "
                               "every baseline form (a verdict needs at least 3)"),
    baseline: bool = typer.Option(True, "--baseline/--no-baseline",
                                  help="race the op against its strongest baseline on the device: onnxruntime with "
                                  "constant and with runtime weights, numpy/BLAS and LiteRT/XNNPACK (Python agent)"),
    budget_ms: float = typer.Option(100.0, "--budget-ms", help="timing budget per kernel measurement"),
    timeout: float = typer.Option(60.0, "--timeout", help="seconds before a kernel counts as hung"),
    threads: Optional[int] = typer.Option(None, "--threads", min=1, help="kernel threads (default: the device's cores)"),
    max_tasks: Optional[int] = typer.Option(None, "--max-tasks", min=1, help="MODEL: tune only the N heaviest tasks"),
    gpu: bool = typer.Option(False, "--gpu", help="tune CUDA kernels for the device's NVIDIA GPU (its SM, from "
                             "nvidia-smi; float16 matmuls get tensor-core schedules) instead of its CPU, run "
                             "through the TVM runtime of the device's Python (TVM with CUDA there)"),
    db: Optional[str] = DbOpt,
    fmt: Format = FormatOpt,
) -> None:
    """Tune TVM kernels ON the device (native agent), verify every one, store the best per device."""
    run_guarded(_tune_kernels, model, op, device, trials, dim, rounds, baseline, budget_ms, timeout, threads,
                max_tasks, db, fmt, gpu)


def _tune_kernels(model, ops, device, trials, dims, rounds, baseline, budget_ms, timeout, threads, max_tasks, db, fmt,
                  gpu=False):
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
    from rich.text import Text

    from edgetune.kernels.session import KernelSessionConfig, tune_kernels  # lazy: CLI start-up (imports numpy)

    command = "edgetune " + " ".join(sys.argv[1:]) if sys.argv and "edgetune" in sys.argv[0] else ""
    cfg = KernelSessionConfig(device=device, ops=list(ops), model=model, dims=list(dims), trials=trials, rounds=rounds,
                              baseline=baseline, budget_ms=budget_ms, timeout_s=timeout, num_threads=threads,
                              max_tasks=max_tasks, db=db, command=command, gpu=gpu)
    progress = Progress(TextColumn("[bold]{task.fields[name]}[/]"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                        TimeElapsedColumn(), TextColumn("{task.description}"), console=err_console,
                        disable=fmt == Format.json or not err_console.is_terminal, transient=True)
    log_lines = fmt != Format.json and not err_console.is_terminal
    tasks: dict[str, int] = {}

    def on_event(ev):
        kind = ev["event"]
        if kind == "start":
            if fmt != Format.json:  # device name, emulation note, workload names: data, never markup
                line = Text(device_text(f"{ev['device']}: run {ev['run_id']}: {ev['workloads']} workload(s)"))
                if ev["emulated"]:
                    line.append(device_text(f" (EMULATED: {ev['emulated']}; timings are not the real chip's)"),
                                style="yellow")
                err_console.print(line, highlight=False)
        elif kind == "workload":
            tasks[ev["name"]] = progress.add_task("", total=max(1, ev["trials"]), name=safe(ev["name"]))
        elif kind == "trial" and ev["name"] in tasks:
            progress.update(tasks[ev["name"]], completed=ev["done"],
                            description=f"best {ev['best_gflops']:.2f} GFLOP/s" if ev["best_gflops"] else "no verified kernel yet")
        elif kind == "final" and ev["name"] in tasks:
            progress.update(tasks[ev["name"]], description=f"final: {ev['rounds']} rounds vs the baseline forms")
        elif kind == "done":
            r = ev["result"]
            if ev["name"] in tasks:
                progress.update(tasks[ev["name"]], completed=progress.tasks[tasks[ev["name"]]].total)
            if log_lines:
                best = f"{r.gflops:.2f} GFLOP/s" if r.gflops else f"no verified kernel ({r.reason})"
                err_console.print(plain(f"  {r.name}: {r.trials_measured} measured, {r.reused_records} reused, {best}"),
                                  highlight=False)

    with progress:
        outcome = tune_kernels(cfg, on_event)
    if fmt == Format.json:
        emit_json(outcome.as_dict())
    else:
        _print_table(outcome)
    if not any(r.verified for r in outcome.results):
        raise typer.Exit(1)


def _print_table(outcome) -> None:
    from rich.table import Table
    from rich.text import Text

    from edgetune.kernels.targets import X86_MAX_BOOST_GHZ

    emu = bool(outcome.emulated)
    fp = outcome.fingerprint
    peak = "fp32 peak unknown"
    if outcome.peak_gflops:
        peak = f"fp32 peak {outcome.peak_gflops:.1f} GFLOP/s"
        if outcome.peak_is_bound:  # % peak is of that bound too
            peak = (f"fp32 peak ≤ {outcome.peak_gflops:.1f} GFLOP/s (a bound: no cpufreq, so at {X86_MAX_BOOST_GHZ:g} "
                    f"GHz, the fastest x86 boost clock)")
    title = (f"{outcome.device} ({fp.get('cpu_model')}, {fp.get('cores')} cores, {fp.get('arch')}"
             + (f", EMULATED: {outcome.emulated}" if emu else "") + f") — {peak} — run {outcome.run_id}")
    tag = " (emulated)" if emu else ""
    t = Table("workload", f"GFLOP/s{tag}", f"median{tag}", "% peak", "trials", "reused", "tune s", "verified",
              f"baseline forms GFLOP/s{tag}", "vs strongest baseline [95% CI]", title=plain(title))
    for r in outcome.results:
        b = r.baseline
        if b and b.get("speedup"):
            vs = (f"{b['speedup']:.2f}× [{b['ci95'][0]:.2f}, {b['ci95'][1]:.2f}] {b['verdict']} "
                  f"vs {b['form']}, {b['rounds']} rounds{tag}")
        elif b:
            vs = f"— ({b['reason']})"
        else:
            vs = "—"
        forms = "; ".join(f"{f['form']}{'*' if f.get('strongest') else ''} {f['gflops']:.2f}" if f.get("gflops")
                          else f"{f['form']} {f['status']}" for f in (b or {}).get("forms", []))
        # names, reasons, forms and verdicts may quote the device: Text cells, never markup
        t.add_row(plain(r.name), f"{r.gflops:.2f}" if r.gflops else "—", _fmt_ns(r.median_ns),
                  f"{r.peak_pct:.1f}%" if r.peak_pct is not None else "—",
                  f"{r.trials_measured}" + (f" ({r.trials_failed} failed)" if r.trials_failed else ""),
                  str(r.reused_records), f"{r.tuning_s:.1f}",
                  Text("yes", style="green") if r.verified
                  else Text.assemble(("no", "red"), " ", device_text(r.reason, 80)),
                  plain(forms or "—"), plain(vs))
    console.print(t)
    notes = [f"  {r.name}: {f['form']} {f['status']}: {f['reason']}" for r in outcome.results
             for f in (r.baseline or {}).get("forms", []) if f["status"] != "verified"]
    notes += [f"  {r.name}: reference {r.reference}" for r in outcome.results if "not independent" in r.reference]
    if notes:
        console.print("\n".join(["baseline forms not used / references:"] + [device_text(n) for n in notes]),
                      highlight=False, markup=False)
    if any(r.baseline and r.baseline.get("forms") for r in outcome.results):
        console.print("* the strongest verified baseline form (lowest median over the final rounds): the verdict "
                      "is against it (t interval on per-round log ratios; no verdict below 3 rounds)", highlight=False)
    console.print(plain(f"tuning records: {outcome.tuning_dir} (device {outcome.fingerprint_key}); "
                        f"results: {outcome.db_path}"), highlight=False)


def _fmt_ns(ns) -> str:
    if ns is None:
        return "—"
    if ns < 1e3:
        return f"{ns:.0f} ns"
    if ns < 1e6:
        return f"{ns / 1e3:.2f} µs"
    return f"{ns / 1e6:.3f} ms"
