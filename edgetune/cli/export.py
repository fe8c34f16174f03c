"""edgetune export RUN_ID... --target android|linux -o DIR; edgetune export check DIR -d DEVICE (docs/export.md)"""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer
from rich.table import Table
from typer.core import TyperGroup

from edgetune.cli.common import DbOpt, DeviceOpt, Format, FormatOpt, console, emit_json, err_console, run_guarded
from edgetune.cli.pack import pack_examples

EPILOG = pack_examples(
    ("edgetune export 3f2a9c1e0b7d4e55 1c0ffee5ba5e4d11 --target android -o app-artifact",
     "an Android artifact of two phones' tune runs (ids from 'edgetune db ls')"),
    ("edgetune export RUN_ID --target linux -o board-artifact", "a Linux board's artifact"),
    ("edgetune export check board-artifact -d pi", "run it on the device the way an app does"),
    ("edgetune export check app-artifact -d new-phone --fallback --format json",
     "a device it was not tuned on: check the fallback configuration"))

CREATE_EPILOG = pack_examples(
    ("edgetune export create 3f2a9c1e0b7d4e55 --target linux -o board-artifact", "one board's tune run"),
    ("edgetune export 3f2a9c1e0b7d4e55 1c0ffee5ba5e4d11 --target android -o app-artifact",
     "the same without 'create': two phones' runs, for an Android app"))
CHECK_EPILOG = pack_examples(
    ("edgetune export check board-artifact -d pi", "run it on the device the way an app does"),
    ("edgetune export check app-artifact -d new-phone --fallback --format json",
     "a device it was not tuned on: check the fallback configuration"))


class _ExportGroup(TyperGroup):
    """``edgetune export RUN_ID...`` is ``edgetune export create RUN_ID...``; ``check`` is the other verb."""

    def parse_args(self, ctx, args):
        if args and args[0] not in self.commands and args[0] not in ("--help", "-h"):
            args = ["create", *args]  # run ids, or create's options given before them
        return super().parse_args(ctx, args)


app = typer.Typer(cls=_ExportGroup, no_args_is_help=True, epilog=EPILOG,
                  help="App artifacts: the selected configurations, models, golden I/O and loaders per device.")


@app.command("create", epilog=CREATE_EPILOG)
def create_cmd(
    run_id: List[str] = typer.Argument(..., help="tune run id(s), one per device (see 'edgetune db ls')"),
    target: str = typer.Option(..., "--target", "-t", help="android (jniLibs/, assets/) or linux (lib/, bin/)"),
    out: Path = typer.Option(..., "--out", "-o", help="artifact directory to create (must not exist)"),
    abi: List[str] = typer.Option([], "--abi", help="build the loader for these ABIs only (default: the target's all)"),
    db: Optional[str] = DbOpt,
    fmt: Format = FormatOpt,
) -> None:
    """Write the app artifact of tune runs (also: 'edgetune export RUN_ID...')."""
    run_guarded(_create, run_id, target, out, abi, db, fmt)


def _create(run_ids, target, out, abis, db, fmt):
    from edgetune.export import export

    quiet = fmt == Format.json
    m = export(run_ids, target, out, db=db, abis=abis or None,
               progress=None if quiet else (lambda msg: err_console.print(msg, highlight=False, markup=False)))
    if quiet:
        emit_json({"artifact": str(out), "manifest": m})
        return
    for f in m["figures"]:
        ms = f"{f['median_ms']:.4g} ms" if f["median_ms"] is not None else "no timing"
        console.print(f"{f['device']} at {f['shape_key']}: {f['label']} ({ms}, {f['basis']})", highlight=False, markup=False)
    for a, b in m["loaders"]["built"].items():
        console.print(f"loader {a}: {b['library']}", highlight=False, markup=False)
    for a, why in m["loaders"]["not_built"].items():
        console.print(f"loader {a}: NOT BUILT: {why}", highlight=False, markup=False)
    console.print(f"artifact written: {out} (check it: edgetune export check {out} -d DEVICE)",
                  highlight=False, markup=False)


@app.command("check", epilog=CHECK_EPILOG)
def check_cmd(
    artifact: Path = typer.Argument(..., help="artifact directory written by 'edgetune export'"),
    device: str = DeviceOpt,
    fallback: bool = typer.Option(False, "--fallback",
                                  help="on a device the artifact was not tuned on, check its fallback configuration"),
    iters: int = typer.Option(20, "--iters", min=1, help="timed runs at least"),
    budget_ms: float = typer.Option(1000.0, "--budget-ms", min=0.0, help="timed runs for at least this long"),
    fmt: Format = FormatOpt,
) -> None:
    """Run the artifact on DEVICE through its C loader (no Python); exit 1 unless every shape point verifies."""
    run_guarded(_check, artifact, device, fallback, iters, budget_ms, fmt)


def _check(artifact, device, fallback, iters, budget_ms, fmt):
    from edgetune.export.check import export_check

    res = export_check(str(artifact), device, fallback=fallback, iters=iters, budget_ms=budget_ms)
    if fmt == Format.json:
        emit_json(res)
    else:
        console.print(f"{res['device']} (fingerprint {res['fingerprint_key']}): "
                      + (f"tuned as '{res['known_device']}'" if res["known_device"] else "not tuned: fallback configuration")
                      + f"; loader {res['abi']}; {res['files_checked']} files checked against the manifest"
                      + ("; emulated, timings not compared" if res["emulated"] else ""), highlight=False, markup=False)
        t = Table(title=f"export check on {res['device']}")
        for col in ("shape", "configuration", "match", "outputs", "placement", "loader ms [95% CI]", "tuned ms", "latency"):
            t.add_column(col)
        for s in res["shapes"]:
            lat = s.get("latency") or {}
            pl = s.get("placement") or {}
            t.add_row(s["shape_key"], s.get("label") or s["config"], str(s.get("loader_match", "-")),
                      "verified" if (s.get("host_verification") or {}).get("ok") else "FAILED",
                      ", ".join(f"{k.replace('ExecutionProvider', '')}: {v}" for k, v in (pl.get("nodes") or {}).items())
                      or str(pl.get("error", "-")),
                      f"{lat['median_ms']:.4g} [{lat['ci95_ms'][0]:.4g}, {lat['ci95_ms'][1]:.4g}]" if "median_ms" in lat else "-",
                      f"{lat['manifest_median_ms']:.4g}" if "manifest_median_ms" in lat else "-",
                      "GAP" if lat.get("gap") else ("ok" if "manifest_median_ms" in lat else "-"))
        console.print(t)
        for s in res["shapes"]:
            for p in s.get("problems", []) + ([s["error"]] if s.get("error") else []):
                console.print(f"{s['shape_key']}: {p}", highlight=False, markup=False)
            lat = s.get("latency") or {}
            if lat.get("gap"):
                console.print(f"{s['shape_key']}: latency {lat['compared']}", highlight=False, markup=False)
            if s.get("runtime_note"):
                console.print(f"{s['shape_key']}: note: {s['runtime_note']}", highlight=False, markup=False)
        console.print("PASSED" if res["ok"] else "FAILED", highlight=False, markup=False)
    if not res["ok"]:
        raise typer.Exit(1)
