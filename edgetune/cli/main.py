"""edgetune command line."""

from __future__ import annotations

import typer

from edgetune import __version__, tvm_without_torch
from edgetune.cli import bench, db, devices, export, judge, kernels, pack, report, tune, verify, zoo
from edgetune.cli.examples import epilog

app = typer.Typer(no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
                  help="Tune ML inference on the device it ships on: verified, measured honestly, reproducible.",
                  epilog=epilog(""))
app.command("tune", epilog=epilog("tune"))(tune.tune_cmd)
app.command("tune-kernels", epilog=epilog("tune-kernels"))(kernels.tune_kernels_cmd)
app.command("judge", epilog=epilog("judge"))(judge.judge_cmd)
app.command("bench", epilog=epilog("bench"))(bench.bench_cmd)
app.command("verify", epilog=epilog("verify"))(verify.verify_cmd)
app.command("report", epilog=epilog("report"))(report.report_cmd)
app.add_typer(db.app, name="db")
app.command("pack", epilog=pack.PACK_EPILOG)(pack.pack_cmd)
app.add_typer(pack.repro_app, name="repro")
app.add_typer(export.app, name="export")
app.add_typer(devices.app, name="devices")
app.add_typer(zoo.app, name="zoo")


def _version(value: bool) -> None:
    if value:
        typer.echo(__version__)
        raise typer.Exit()


@app.callback()
def _root(version: bool = typer.Option(False, "--version", callback=_version, is_eager=True)) -> None:
    pass


def main() -> None:
    tvm_without_torch.install()
    app()


if __name__ == "__main__":
    main()
