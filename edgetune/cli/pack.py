"""edgetune pack RUN_ID... -o DIR; edgetune repro check DIR -d DEVICE (docs/repro.md)"""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer
from rich.table import Table

from edgetune.cli.common import DbOpt, DeviceOpt, Format, FormatOpt, console, emit_json, run_guarded


def pack_examples(*pairs: tuple[str, str]) -> str:  # the layout of edgetune.cli.examples.epilog
    lines = ["Examples:"]
    for cmd, what in pairs:
        lines += ["", f"  # {what}", f"  {cmd}"]
    return "\n".join(lines)


PACK_EPILOG = pack_examples(
    ("edgetune pack 3f2a9c1e0b7d4e55 -o mobilenet-repro", "package a tune run (id from 'edgetune db ls')"),
    ("edgetune pack RUN_A RUN_B -o farm-repro --no-models", "two runs; bundled models rebuilt instead of copied"))
CHECK_EPILOG = pack_examples(
    ("edgetune repro check mobilenet-repro -d local", "re-measure and re-verify a package on this machine"),
    ("edgetune repro check mobilenet-repro -d pi --format json --rounds 7", "on another device, for scripts"))
repro_app = typer.Typer(no_args_is_help=True, help="Re-run a package 'edgetune pack' wrote.", epilog=CHECK_EPILOG)


def pack_cmd(
    run_id: List[str] = typer.Argument(..., help="tune run id(s) (see 'edgetune db ls')"),
    out: Path = typer.Option(..., "--out", "-o", help="package directory to create (must not exist)"),
    no_models: bool = typer.Option(False, "--no-models",
                                   help="leave bundled models out (the manifest has the command that rebuilds them)"),
    db: Optional[str] = DbOpt,
) -> None:
    """Write a self-contained reproduction package of tune runs: manifest, models, Dockerfile, setup.sh."""
    run_guarded(_pack, run_id, out, no_models, db)


def _pack(run_ids, out, no_models, db):
    from edgetune.pack import pack

    path = pack(run_ids, out, db=db, no_models=no_models)
    console.print(f"package written: {path} (re-run: edgetune repro check {path} -d DEVICE)", highlight=False,
                  markup=False)


@repro_app.command("check", epilog=CHECK_EPILOG)
def check_cmd(
    package: Path = typer.Argument(..., help="package directory written by 'edgetune pack'"),
    device: str = DeviceOpt,
    rounds: int = typer.Option(5, "--rounds", min=2, help="fresh interleaved rounds per shape"),
    seed: Optional[int] = typer.Option(None, "--seed", min=0,
                                       help="the fresh input seed to verify on (default: a new random one)"),
    budget: float = typer.Option(30.0, "--budget", help="seconds of measuring per run (all shapes together)"),
    fmt: Format = FormatOpt,
) -> None:
    """Re-measure and re-verify a package on DEVICE; exit 1 unless >= 95% of figures reproduce and all verify."""
    run_guarded(_check, package, device, rounds, seed, budget, fmt)


def _fmt(v, unit):
    if v is None:
        return "-"
    return f"{v:.3f}" if unit == "ms" else f"{v:.3f}x"


def _ci(ci):
    return f"[{ci[0]:.3f}, {ci[1]:.3f}]" if ci else "-"


def _check(package, device, rounds, seed, budget, fmt):
    from edgetune.pack import repro_check

    res = repro_check(package, device, rounds=rounds, seed=seed, budget_s=budget)
    v = res["verdict"]
    if fmt == Format.json:
        emit_json(res)
    else:
        for r in res["runs"]:
            where = "same device" if r["same_device"] else (
                f"DIFFERENT DEVICE (fingerprint {r['fingerprint_key']}, packed {r['packed_fingerprint_key']})")
            console.print(f"run {r['run_id']}: packed on {r['packed_device']}, re-measured on {r['device']}: {where}",
                          highlight=False, markup=False)
        t = Table(title=f"repro check on {res['device']} ({res['rule']})")
        for col in ("figure", "packed", "re-measured", "Δ%", "packed 95% CI", "re-measured 95% CI", "reproduced"):
            t.add_column(col)
        for f in res["figures"]:
            t.add_row(f["figure"], _fmt(f["packed"], f["unit"]), _fmt(f["measured"], f["unit"]),
                      "-" if f["delta_pct"] is None else f"{f['delta_pct']:+.1f}", _ci(f["packed_ci95"]),
                      _ci(f["measured_ci95"]), ("yes" if f["reproduced"] else "no")
                      + ("" if f["device"] == "same device" else " (different device)"))
        console.print(t)
        failed = [x for x in res["verifications"] if not x["ok"]]
        for x in failed:
            console.print(f"verification FAILED: {x['candidate']} at {x['shape']} on {x['seed_source']} seed "
                          f"{x['seed']}: {x['reason']}", highlight=False, markup=False)
        console.print(f"{v['reproduced_figures']}/{v['figures']} figures reproduced ({v['fraction']:.0%}, "
                      f"need {v['threshold']:.0%}); {len(res['verifications']) - len(failed)}/"
                      f"{len(res['verifications'])} verifications passed: "
                      f"{'REPRODUCED' if v['ok'] else 'NOT REPRODUCED'}", highlight=False, markup=False)
    if not v["ok"]:
        raise typer.Exit(1)
