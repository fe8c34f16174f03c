"""edgetune bench MODEL --config KEY"""

from __future__ import annotations

from typing import List, Optional

import typer

from edgetune.cli.common import (DbOpt, DeviceOpt, DimOpt, Format, FormatOpt, console, emit_json, reproducing_command,
                                 run_guarded)


def bench_cmd(
    ctx: typer.Context,
    model: str = typer.Argument(..., help="model file or bundled model name"),
    config: str = typer.Option(..., "--config", "-c",
                               help="candidate key (from a report or 'edgetune db ls'); with --loadgen also "
                                    "'default' (onnxruntime's default session options)"),
    device: str = DeviceOpt,
    dim: List[str] = DimOpt,
    rounds: int = typer.Option(5, "--rounds", min=1),
    budget: float = typer.Option(20.0, "--budget", help="seconds"),
    accuracy: List[str] = typer.Option([], "--accuracy",
                                       help="budget for an approximate (int8) configuration, e.g. cosine=0.999 "
                                            "(default: the budget it was tuned under)"),
    db: Optional[str] = DbOpt,
    fmt: Format = FormatOpt,
    loadgen: Optional[str] = typer.Option(
        None, "--loadgen", help="run the configuration under MLPerf LoadGen instead: singlestream | offline "
                                "(local device only; --config default for onnxruntime's default; "
                                "needs the 'mlperf' extra)"),
    loadgen_queries: Optional[int] = typer.Option(
        None, "--loadgen-queries", min=1, help="LoadGen minimum query count (SingleStream) or samples (Offline); "
                                               "below MLPerf's 1024 / 24576 the run is labelled shortened"),
    loadgen_seconds: Optional[float] = typer.Option(
        None, "--loadgen-seconds", help="LoadGen minimum duration; below MLPerf's 600 s the run is labelled shortened"),
    loadgen_samples: int = typer.Option(64, "--loadgen-samples", min=1,
                                        help="seeded input samples in LoadGen's query sample library"),
) -> None:
    """Measure one configuration against the runtime default now, interleaved, with 95% CIs.

    With --loadgen: run it under MLPerf LoadGen on this machine (SingleStream: p90 latency; Offline:
    samples per second), outputs of a random subset of queries checked after the run."""
    if loadgen is not None:
        run_guarded(_loadgen, model, config, device, dim, db, fmt, loadgen, loadgen_queries, loadgen_seconds,
                    loadgen_samples)
        return
    if loadgen_queries is not None or loadgen_seconds is not None:
        from edgetune.errors import UserInputError

        run_guarded(_raise, UserInputError("--loadgen-queries and --loadgen-seconds need "
                                           "--loadgen singlestream|offline"))
    run_guarded(_bench, model, config, device, dim, rounds, budget, db, fmt, reproducing_command(ctx), accuracy)


def _raise(exc):
    raise exc


def _loadgen(model, config, device, dims, db, fmt, scenario, queries, seconds, samples):
    from rich.table import Table

    from edgetune.loadgen import run_loadgen

    doc = run_loadgen(model, config, scenario, device, dims=dims, db=db, queries=queries, seconds=seconds,
                      samples=samples)
    if fmt == Format.json:
        emit_json(doc)
    else:
        t = Table(title=f"MLPerf LoadGen {doc['scenario']}: {doc['config']} ({doc['candidate']['key']}) on "
                        f"{doc['device']}, {doc['shape']}")
        t.add_column("field")
        t.add_column("value")
        fig = doc.get("figures") or {}
        if not doc["ok"]:
            t.add_row("result", f"FAILED ({doc['code']}): {doc['reason']}")
        elif doc["scenario"] == "SingleStream":
            t.add_row("p90 latency", _ms(fig.get("p90_latency_ms")))
            t.add_row("mean latency", _ms(fig.get("mean_latency_ms")))
            t.add_row("queries / duration", f"{fig.get('queries')} in {fig.get('duration_s', 0):.1f} s")
        else:
            sps = fig.get("samples_per_second")
            t.add_row("samples per second", f"{sps:.1f}" if sps is not None else "?")
            t.add_row("samples / duration", f"{fig.get('samples')} in {fig.get('duration_s', 0):.1f} s")
        if "checked" in doc:
            c = doc["checked"]
            t.add_row("outputs checked", f"{c['queries']} random queries of {c['of']}, chosen after the run "
                                         f"(max error {c['max_rel_err']:.2g} of RMS)")
            t.add_row("edgetune", doc["verdict"]["edgetune"])
            lgd = doc["loadgen"]
            unmet = [what for what, key in (("min duration", "min_duration_satisfied"),
                                            ("min queries", "min_queries_satisfied")) if lgd.get(key) == "NO"]
            t.add_row("LoadGen", f"Result is : {doc['verdict']['loadgen']}"
                                 + (f" ({', '.join(unmet)} not met)" if unmet else ""))
            t.add_row("run", doc["label"])
        console.print(t)
    if not doc["ok"]:
        raise typer.Exit(1)


def _ms(v) -> str:
    return f"{v:.3f} ms" if isinstance(v, (int, float)) else "?"


def _bench(model, config, device, dims, rounds, budget, db, fmt, command="", accuracy=()):
    # lazy: CLI start-up (these import numpy and the tuner; --help needs neither)
    from edgetune.accuracy import AccuracyBudget
    from edgetune.api import bench
    from edgetune.cli.tables import run_tables

    summary = bench(model, config, device, dims=dims, db=db, rounds=rounds, budget_s=budget, command=command,
                    accuracy=AccuracyBudget.parse(accuracy))
    if fmt == Format.json:
        emit_json(summary.as_dict())
        return
    for t in run_tables(summary):
        console.print(t)
