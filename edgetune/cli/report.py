"""edgetune report"""

from __future__ import annotations

import json
from pathlib import Path
from typing import List, Optional

import typer

from edgetune.cli.common import DbOpt, run_guarded
from edgetune.errors import UserInputError


def report_cmd(
    run: List[str] = typer.Option([], "--run", help="run id(s); default: the latest run of each device"),
    fmt: str = typer.Option("md", "--format", "-f", help="md, json or html (charts of medians with 95% CIs)"),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="write to a file instead of stdout"),
    db: Optional[str] = DbOpt,
) -> None:
    """Markdown or versioned JSON report of stored runs (every figure with fingerprint and versions)."""
    run_guarded(_report, run, fmt, out, db)


def _report(runs, fmt, out, db):
    # lazy: CLI start-up (these import numpy; --help does not need it)
    from edgetune.db import Store
    from edgetune.report import markdown, report_dict, write_atomic
    from edgetune.report.html import render
    from edgetune.results import summarize_run

    if fmt not in ("md", "json", "html"):
        raise UserInputError(f"--format must be md, json or html, not {fmt}")
    store = Store(db, create=False) if db else Store(create=False)
    try:
        ids = list(runs)
        if not ids:
            latest: dict[str, str] = {}
            for r in store.runs(limit=1000):
                if not r["id"].startswith("bench-"):
                    latest.setdefault(r["device"], r["id"])
            ids = list(latest.values())
            if not ids:
                raise UserInputError(f"no runs in {store.path}; run 'edgetune tune' first")
        rep = report_dict([summarize_run(store, i) for i in ids])
    finally:
        store.close()
    if fmt == "json":
        text = json.dumps(rep, indent=2, default=str) + "\n"
    elif fmt == "html":
        text = render(rep)
    else:
        text = markdown(rep)
    if out:
        write_atomic(out, text)
    else:
        typer.echo(text, nl=False)
