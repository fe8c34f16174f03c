"""edgetune zoo ls | build | check"""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from edgetune.cli.common import DbOpt, Format, FormatOpt, console, emit_json, err_console, run_guarded
from edgetune.cli.examples import epilog
from edgetune.text import device_text, plain

app = typer.Typer(no_args_is_help=True, epilog=epilog("zoo"), help="The model zoo: ten architectures people ship, built from code "
                  "(seeded weights, no downloads), and their correctness across devices and runtimes.")


@app.command("ls", epilog=epilog("zoo ls"))
def ls_cmd(fmt: Format = FormatOpt) -> None:
    """List the zoo: architectures, families, sizes, dynamic dims, .tflite status."""
    run_guarded(_ls, fmt)


def _ls(fmt):
    import models.zoo as zoo

    from edgetune.convert.onnx2tflite import unavailable_reason

    why = unavailable_reason()  # every zoo model is ONNX: its .tflite form is the litert space's conversion
    tflite_text = f"none here: {why}" if why else "converted by onnx2tf (litert space), verified per shape"
    have = set(zoo.available())
    rows = []
    for name, e in zoo.ZOO.items():
        if name not in have:
            rows.append({"name": name, "available": False})
            continue
        rows.append({"name": name, "available": True, "title": e.title, "family": e.family,
                     "dims": {s: e.dims(s) for s in zoo.SIZES}, "tflite": tflite_text})
    if fmt == Format.json:
        emit_json({"schema": "edgetune.zoo/1", "models": rows})
        return
    from rich.table import Table

    t = Table("model", "architecture", "family", "small dims", "full dims", ".tflite")
    for r in rows:
        if not r["available"]:
            t.add_row(r["name"], "(not in this edgetune yet)", "", "", "", "")
            continue
        t.add_row(r["name"], r["title"], r["family"], _dims(r["dims"]["small"]), _dims(r["dims"]["full"]),
                  plain(r["tflite"]))
    console.print(t)


def _dims(d: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in d.items()) or "static"


@app.command("build", epilog=epilog("zoo build"))
def build_cmd(names: List[str] = typer.Argument(None, help="zoo models (default: all)"),
              size: str = typer.Option("small", "--size", help="small | full"),
              out: str = typer.Option(..., "--out", "-o", help="directory for the .onnx files"),
              fmt: Format = FormatOpt) -> None:
    """Build zoo models (byte-reproducible: the same sha256 on every machine)."""
    run_guarded(_build, names or [], size, out, fmt)


def _build(names, size, out, fmt):
    import models.zoo as zoo
    from edgetune.errors import UserInputError

    if size not in zoo.SIZES:
        raise UserInputError(f"--size must be one of {', '.join(zoo.SIZES)}, got {size!r}")
    names = names or zoo.available()
    for n in names:
        if n not in zoo.ZOO:
            raise UserInputError(f"unknown zoo model {n!r}; known: {', '.join(zoo.ZOO)}")
    outdir = Path(out).expanduser()
    try:
        outdir.mkdir(parents=True, exist_ok=True)
        probe = outdir / ".edgetune-write-test"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise UserInputError(f"--out {outdir}: cannot write there ({exc.strerror or exc})") from None
    done = []
    for n in names:
        p = zoo.build(n, size, outdir)
        done.append({"name": n, "size": size, "path": str(p), "sha256": zoo.sha256(p)})
        if fmt != Format.json:
            console.print(plain(f"{p}  sha256 {done[-1]['sha256']}"), highlight=False)
    if fmt == Format.json:
        emit_json({"schema": "edgetune.zoo-build/1", "models": done})


@app.command("check", epilog=epilog("zoo check"))
def check_cmd(names: List[str] = typer.Argument(None, help="zoo models (default: all)"),
              size: str = typer.Option("small", "--size", help="small | full"),
              device: List[str] = typer.Option(["local"], "--device", "-d", help="device(s), repeatable"),
              html_out: Optional[str] = typer.Option(None, "--html", help="also write the matrix as HTML here"),
              timeout: float = typer.Option(300.0, "--timeout", help="seconds per cell before it is a timeout"),
              seed: Optional[int] = typer.Option(None, "--seed", help="input seed (default: fresh; printed)"),
              tvm: bool = typer.Option(True, "--tvm/--no-tvm", help="include TVM Relax (untuned) where the device "
                                       "has the TVM runtime"),
              litert: bool = typer.Option(True, "--litert/--no-litert", help="include LiteRT on the onnx2tf "
                                          "conversion (verified on the host; a conversion takes seconds to minutes)"),
              fmt: Format = FormatOpt) -> None:
    """Correctness matrix: every model x device x runtime family, against an independent float64 reference."""
    run_guarded(_check, names or [], size, device, html_out, timeout, seed, tvm, fmt, litert)


def _check(names, size, devices, html_out, timeout, seed, tvm, fmt, litert=True):
    from edgetune.zoo import check, html_matrix, markdown

    def on_event(ev):
        if fmt == Format.json:
            return
        if ev["event"] == "build":
            err_console.print(plain(f"building {ev['model']} ({ev['size']})"), highlight=False)
        elif ev["event"] == "done":
            c = ev["cell"]
            err_console.print(device_text(f"  {c.model} / {c.device} / {c.runtime}: {c.status}"
                                          + (f" ({c.reason[:100]})" if c.status not in ("pass", "n/a") else "")),
                              highlight=False, markup=False)

    doc = check(names, size, devices, timeout_s=timeout, seed=seed, tvm=tvm, litert=litert, progress=on_event)
    if html_out:
        from edgetune.report import write_atomic

        write_atomic(Path(html_out).expanduser(), html_matrix(doc))
    if fmt == Format.json:
        emit_json(doc)
    else:
        console.print(markdown(doc), markup=False, highlight=False)
        console.print(plain(f"seed {doc['seed']}; " + ", ".join(f"{k} {v}" for k, v in doc["summary"].items())),
                      highlight=False)
    bad = {k: v for k, v in doc["summary"].items() if k not in ("pass", "n/a")}
    if bad:
        raise typer.Exit(1)


@app.command("bench", epilog=epilog("zoo bench"))
def bench_cmd(ctx: typer.Context,
              names: List[str] = typer.Argument(None, help="zoo models (default: all)"),
              size: str = typer.Option("small", "--size", help="small | full"),
              device: List[str] = typer.Option(["local"], "--device", "-d", help="device(s), repeatable"),
              budget: float = typer.Option(60.0, "--budget", help="seconds of tuning per model per device "
                                           "(all its shape points together)"),
              space: str = typer.Option("default", "--space",
                                        help="candidate spaces, as for tune"),
              accuracy: List[str] = typer.Option([], "--accuracy",
                                                 help="accuracy budget for approximate candidates, as for tune "
                                                      "(adds 'ort-int8' to --space)"),
              shapes: str = typer.Option("sweep", "--shapes",
                                         help="sweep: the family's shape points; nominal: only the size's own "
                                              "shape (batch 1; decoders: prefill and decode step)"),
              rounds: int = typer.Option(3, "--rounds", min=1, help="interleaved race rounds for the finalists"),
              finalists: int = typer.Option(5, "--finalists", min=1, help="candidates raced against the baselines"),
              max_candidates: Optional[int] = typer.Option(None, "--max-candidates", min=1,
                                                           help="cap per space (quick runs; each precision form still gets one)"),
              db: Optional[str] = DbOpt,
              fmt: Format = FormatOpt) -> None:
    """Speed across shapes: tune each zoo model over its family's shape points; the selected config
    against the onnxruntime default and the strongest baseline, 95% intervals from the tune's
    confirmation rounds. Every run is an ordinary tune run in the database."""
    from edgetune.cli.common import reproducing_command

    run_guarded(_bench, names or [], size, device, budget, space, rounds, finalists, max_candidates, db, fmt,
                reproducing_command(ctx), accuracy, shapes)


def _bench(names, size, devices, budget, space, rounds, finalists, max_candidates, db, fmt, command, accuracy=(),
           shapes="sweep"):
    from edgetune.zoo_bench import bench, markdown

    def on_event(ev):
        if fmt == Format.json:
            return
        if ev["event"] == "model":
            err_console.print(plain(f"{ev['model']}: tuning at {', '.join(ev['points'])}"), highlight=False)
        elif ev["event"] == "done":
            err_console.print(device_text(f"{ev['model']}: {ev['wall_s']:.1f} s; "
                                          + ", ".join(f"{r['device']} run {r['run_id']} {r['status']}"
                                                      for r in ev["runs"])), highlight=False, markup=False)
        elif ev["event"] in ("retry", "down"):
            err_console.print(device_text(f"{ev.get('device', '')}: {ev['event']}: {ev.get('error')}"),
                              highlight=False, markup=False)

    spaces = None if space == "default" else tuple(s.strip() for s in space.split(",") if s.strip())
    doc = bench(names, size, devices, budget_s=budget, spaces=spaces, db=db, rounds=rounds, finalists=finalists,
                max_candidates=max_candidates, command=command, progress=on_event, accuracy=accuracy, shapes=shapes)
    if fmt == Format.json:
        emit_json(doc)
    else:
        console.print(markdown(doc), markup=False, highlight=False)
        console.print(plain(f"{len(doc['models'])} models, size {doc['size']}, budget {doc['budget_s_per_model']:g} s "
                            f"per model per device; total wall time {doc['wall_s']:.1f} s"), highlight=False)
    if any(r["status"] != "complete" for m in doc["models"] for r in m["runs"]):
        raise typer.Exit(3)
