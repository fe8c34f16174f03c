"""Shared option aliases, output helpers and the one error map to exit codes."""

from __future__ import annotations

import json
import sys
from enum import Enum
from typing import Any, Optional

import typer
from rich.console import Console

console = Console(stderr=False)
err_console = Console(stderr=True)


class Format(str, Enum):
    table = "table"
    json = "json"


FormatOpt = typer.Option(Format.table, "--format", "-f", help="table for people, json for scripts")
DbOpt = typer.Option(None, "--db", help="SQLite database (default $EDGETUNE_DB or ~/.edgetune/edgetune.db)")
DeviceOpt = typer.Option("local", "--device", "-d", help="device name from 'edgetune devices ls'")
DimOpt = typer.Option([], "--dim", help="bind a dynamic dimension, e.g. --dim seq=128")


def emit_json(obj: Any) -> None:
    sys.stdout.write(json.dumps(obj, indent=2, sort_keys=False, default=str) + "\n")


def run_guarded(fn, *args, **kwargs):
    """Run a command body: EdgetuneError -> one line + its exit code; Ctrl-C -> 130. No tracebacks."""
    from edgetune.errors import EdgetuneError

    try:
        return fn(*args, **kwargs)
    except EdgetuneError as exc:
        err_console.print(f"[bold red]error:[/] {exc}", highlight=False, markup=True, soft_wrap=True)
        raise typer.Exit(exc.exit_code)
    except KeyboardInterrupt:
        err_console.print("interrupted: everything measured so far is saved; run the same command to resume")
        raise typer.Exit(130)
    except BrokenPipeError:
        raise typer.Exit(0)
