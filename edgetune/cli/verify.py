"""edgetune verify MODEL --config KEY"""

from __future__ import annotations

from typing import List, Optional

import typer
from rich.text import Text

from edgetune.cli.common import DbOpt, DeviceOpt, DimOpt, Format, FormatOpt, console, emit_json, run_guarded
from edgetune.text import device_text


def verify_cmd(
    model: str = typer.Argument(..., help="model file or bundled model name"),
    config: str = typer.Option(..., "--config", "-c", help="candidate key"),
    device: str = DeviceOpt,
    dim: List[str] = DimOpt,
    input: List[str] = typer.Option([], "--input", help="name=file.npy"),
    seed: Optional[int] = typer.Option(None, "--seed", min=0,
                                       help="input seed to replay (default: a fresh random seed, printed)"),
    accuracy: List[str] = typer.Option([], "--accuracy",
                                       help="budget for an approximate (int8) configuration, e.g. cosine=0.999 "
                                            "(default: the budget it was tuned under)"),
    db: Optional[str] = DbOpt,
    fmt: Format = FormatOpt,
) -> None:
    """Verify one configuration on the device against host references (exit 1 when it fails).

    The seeded inputs come from a fresh random seed, not the one the configuration was tuned on;
    the seed is printed (and in --format json) so that --seed replays the same check."""
    run_guarded(_verify, model, config, device, dim, input, db, fmt, seed, accuracy)


def _verify(model, config, device, dims, inputs, db, fmt, seed=None, accuracy=()):
    from edgetune.accuracy import AccuracyBudget
    from edgetune.api import verify_config  # lazy: CLI start-up (imports numpy and the tuner)

    res = verify_config(model, config, device, dims=dims, inputs=inputs, db=db, seed=seed,
                        accuracy=AccuracyBudget.parse(accuracy))
    if fmt == Format.json:
        emit_json(res)
    else:
        replay = "" if res["seed_source"] == "given" else f" (replay: --seed {res['seed']})"
        console.print(f"inputs from {res['seed_source']} seed {res['seed']}{replay}", highlight=False)
        # the label (a user's adapter), the checks and the reason (the device) are data, never markup
        what = f"{res['label']} [{res['candidate']['key']}] on {res['device']}"
        for s in res["shapes"]:
            shape = " ".join(f"{k}={v}" for k, v in s["shape"].items())
            if s["ok"] and s.get("accuracy"):
                a = s["accuracy"]
                top1 = f", top-1 agreement {a['top1']:.4f}" if a.get("top1") is not None else ""
                line = (f"{what} {shape}: approximate, cosine {a['cosine']:.6f}, max abs err {a['max_abs']:.3g}{top1} "
                        f"(worst of {a['runs']} runs) within budget {res['accuracy_budget']}; "
                        f"{'; '.join(map(str, s['checks']))}")
                console.print(Text.assemble(("verified", "green"), " ", device_text(line)), highlight=False)
            elif s["ok"]:
                line = (f"{what} {shape}: max abs err {s['max_abs_err']:.2e}, max rel err {s['max_rel_err']:.2e} "
                        f"(tolerance {s['tolerance']:.0e}); {'; '.join(map(str, s['checks']))}")
                console.print(Text.assemble(("verified", "green"), " ", device_text(line)), highlight=False)
            else:
                line = f"{what} {shape}: {s['reason']}"
                console.print(Text.assemble(("FAILED", "red"), " ", device_text(line)), highlight=False)
    if not res["ok"]:
        raise typer.Exit(1)
