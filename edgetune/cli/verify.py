"""edgetune verify MODEL --config KEY"""

from __future__ import annotations

from typing import List, Optional

import typer

from edgetune.cli.common import DbOpt, DeviceOpt, DimOpt, Format, FormatOpt, console, emit_json, run_guarded


def verify_cmd(
    model: str = typer.Argument(..., help="model file or bundled model name"),
    config: str = typer.Option(..., "--config", "-c", help="candidate key"),
    device: str = DeviceOpt,
    dim: List[str] = DimOpt,
    input: List[str] = typer.Option([], "--input", help="name=file.npy"),
    db: Optional[str] = DbOpt,
    fmt: Format = FormatOpt,
) -> None:
    """Verify one configuration on the device against host references (exit 1 when it fails)."""
    run_guarded(_verify, model, config, device, dim, input, db, fmt)


def _verify(model, config, device, dims, inputs, db, fmt):
    from edgetune.api import verify_config

    res = verify_config(model, config, device, dims=dims, inputs=inputs, db=db)
    if fmt == Format.json:
        emit_json(res)
    else:
        for s in res["shapes"]:
            shape = " ".join(f"{k}={v}" for k, v in s["shape"].items())
            if s["ok"]:
                console.print(f"[green]verified[/] {res['label']} [{res['candidate']['key']}] on {res['device']} {shape}: "
                              f"max abs err {s['max_abs_err']:.2e}, max rel err {s['max_rel_err']:.2e} "
                              f"(tolerance {s['tolerance']:.0e}); {'; '.join(s['checks'])}", highlight=False)
            else:
                console.print(f"[red]FAILED[/] {res['label']} [{res['candidate']['key']}] on {res['device']} {shape}: "
                              f"{s['reason']}", highlight=False)
    if not res["ok"]:
        raise typer.Exit(1)
