"""edgetune bench MODEL --config KEY"""

from __future__ import annotations

from typing import List, Optional

import typer

from edgetune.cli.common import (DbOpt, DeviceOpt, DimOpt, Format, FormatOpt, console, emit_json, reproducing_command,
                                 run_guarded)


def bench_cmd(
    ctx: typer.Context,
    model: str = typer.Argument(..., help="model file or bundled model name"),
    config: str = typer.Option(..., "--config", "-c", help="candidate key (from a report or 'edgetune db ls')"),
    device: str = DeviceOpt,
    dim: List[str] = DimOpt,
    rounds: int = typer.Option(5, "--rounds", min=1),
    budget: float = typer.Option(20.0, "--budget", help="seconds"),
    db: Optional[str] = DbOpt,
    fmt: Format = FormatOpt,
) -> None:
    """Measure one configuration against the runtime default now, interleaved, with 95% CIs."""
    run_guarded(_bench, model, config, device, dim, rounds, budget, db, fmt, reproducing_command(ctx))


def _bench(model, config, device, dims, rounds, budget, db, fmt, command=""):
    # lazy: CLI start-up (these import numpy and the tuner; --help needs neither)
    from edgetune.api import bench
    from edgetune.cli.tables import run_tables

    summary = bench(model, config, device, dims=dims, db=db, rounds=rounds, budget_s=budget, command=command)
    if fmt == Format.json:
        emit_json(summary.as_dict())
        return
    for t in run_tables(summary):
        console.print(t)
