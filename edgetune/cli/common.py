"""Shared option aliases, output helpers and the one error map to exit codes."""

from __future__ import annotations

import json
import shlex
import sys
from enum import Enum
from typing import Any

import typer
from rich.cells import cell_len
from rich.console import Console
from rich.errors import MarkupError
from rich.table import Table
from rich.text import Text

from edgetune.errors import EdgetuneError
from edgetune.text import device_text


class OutputConsole(Console):
    """Output for people that fits where it goes.

    On a terminal, tables are drawn to fit its width. Anywhere else (a file, a pipe, a CI log) rich
    would lay them out for 80 columns and fold every cell over several lines; there a table is
    printed as plain Markdown rows instead (one line per row, no cell ever broken, no colour) and
    long lines are not wrapped."""

    def on_terminal(self) -> bool:
        isatty = getattr(self.file, "isatty", None)
        try:
            return bool(isatty and isatty())
        except ValueError:  # a closed stream
            return False

    def print(self, *objects: Any, **kwargs: Any) -> None:  # noqa: A003 - rich's name
        if self.on_terminal():
            return super().print(*objects, **kwargs)
        kwargs.setdefault("soft_wrap", True)
        if not any(isinstance(o, Table) for o in objects):
            return super().print(*objects, **kwargs)
        for o in objects:
            if isinstance(o, Table):
                super().print(plain_table(o), markup=False, highlight=False, emoji=False, soft_wrap=True)
            else:
                super().print(o, **kwargs)
        return None


def _plain(cell: Any) -> str:
    """One Markdown cell: the text a cell shows (a str cell is markup, as in the rich table), on one
    line, controls escaped (a cell may hold device text), ``|`` escaped."""
    if isinstance(cell, Text):
        text = cell.plain
    elif isinstance(cell, str):
        try:
            text = Text.from_markup(cell).plain
        except MarkupError:
            text = cell
    else:
        text = "" if cell is None else str(cell)
    return device_text(" ".join(text.split())).replace("|", "\\|")


def plain_table(table: Table) -> str:
    """A rich Table as Markdown: its title, a header row, one line per row, columns aligned."""
    headers = [_plain(c.header) for c in table.columns]
    columns = [[_plain(x) for x in c.cells] for c in table.columns]
    widths = [max([cell_len(h), 3] + [cell_len(x) for x in col]) for h, col in zip(headers, columns)]

    def row(cells: list[str]) -> str:
        return "| " + " | ".join(c + " " * (w - cell_len(c)) for c, w in zip(cells, widths)) + " |"

    lines = [_plain(table.title), ""] if table.title else []
    lines += [row(headers), "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    lines += [row(list(r)) for r in zip(*columns)] if columns else []
    if table.caption:
        lines += ["", _plain(table.caption)]
    return "\n".join(lines) + "\n"


console = OutputConsole(stderr=False)
err_console = OutputConsole(stderr=True)


class Format(str, Enum):
    table = "table"
    json = "json"


FormatOpt = typer.Option(Format.table, "--format", "-f", help="table for people, json for scripts")
DbOpt = typer.Option(None, "--db", help="SQLite file or postgresql://user@host:port/db URL "
                                        "(default $EDGETUNE_DB or ~/.edgetune/edgetune.db)")
DeviceOpt = typer.Option("local", "--device", "-d", help="device name from 'edgetune devices ls'")
DimOpt = typer.Option([], "--dim", help="bind a dynamic dimension, e.g. --dim seq=128")


def emit_json(obj: Any) -> None:
    sys.stdout.write(json.dumps(obj, indent=2, sort_keys=False, default=str) + "\n")


def reproducing_command(ctx: typer.Context) -> str:
    """The command line that reproduces this invocation: ``edgetune <command> ...`` with every
    parameter that did not come from its default (given on the command line or from the
    environment), shell-quoted, in the command's own parameter order."""
    names, c = [], ctx
    while c.parent is not None:  # the root's name is however Python was started (edgetune, python -m ...)
        names.append(c.info_name)
        c = c.parent
    words = ["edgetune", *reversed(names)]
    for param in ctx.command.params:
        source = ctx.get_parameter_source(param.name)
        if getattr(source, "name", "DEFAULT") in ("DEFAULT", "DEFAULT_MAP") or param.name not in ctx.params:
            continue
        value = ctx.params[param.name]
        if param.param_type_name == "argument":
            words += [_word(v) for v in (value if isinstance(value, (list, tuple)) else [value]) if v is not None]
            continue
        opt = max(param.opts, key=len)
        if getattr(param, "is_flag", False):
            if value:
                words.append(opt)
            elif param.secondary_opts:
                words.append(max(param.secondary_opts, key=len))
            continue
        for v in value if getattr(param, "multiple", False) else [value]:
            if v is not None:
                words += [opt, _word(v)]
    return shlex.join(words)


def _word(value: Any) -> str:
    return str(value.value if isinstance(value, Enum) else value)


def run_guarded(fn, *args, **kwargs):
    """Run a command body: EdgetuneError -> one line + its exit code; Ctrl-C -> 130. No tracebacks."""
    try:
        return fn(*args, **kwargs)
    except EdgetuneError as exc:
        # the message may quote a device (stderr, a reason): printed as data, never as markup
        err_console.print(Text.assemble(("error:", "bold red"), " ", device_text(exc)), highlight=False,
                          soft_wrap=True)
        raise typer.Exit(exc.exit_code)
    except KeyboardInterrupt:
        err_console.print("interrupted: everything measured so far is saved; run the same command to resume")
        raise typer.Exit(130)
    except BrokenPipeError:
        raise typer.Exit(0)
