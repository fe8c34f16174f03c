"""edgetune db ls | best | export | migrate"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Optional

import typer
from rich.markup import escape
from rich.table import Table

from edgetune.cli.common import DbOpt, Format, FormatOpt, console, emit_json, run_guarded
from edgetune.cli.examples import epilog
from edgetune.errors import UserInputError
from edgetune.text import safe

app = typer.Typer(no_args_is_help=True, help="Inspect and export the results database.", epilog=epilog("db"))


def _store(db):
    from edgetune.db import Store  # lazy: CLI start-up (imports numpy)

    return Store(db, create=False) if db else Store(create=False)


@app.command("ls", epilog=epilog("db ls"))
def ls_cmd(db: Optional[str] = DbOpt, fmt: Format = FormatOpt, limit: int = typer.Option(50, "--limit")) -> None:
    """List tuning runs."""
    def body():
        store = _store(db)
        try:
            runs = store.runs(limit)
            counts = store.record_counts()
            rows = []
            for r in runs:
                n = counts.get(r["id"], (0, 0))
                # status as it stands: a run nobody runs any more reads 'interrupted', never 'running'
                rows.append({"run_id": r["id"], "device": r["device"], "model": r["model_path"],
                             "status": r["status"], "holder": r["holder"], "records": n[0], "verified": n[1],
                             "fingerprint_key": r["fingerprint_key"], "created": r["created"]})
        finally:
            store.close()
        if fmt == Format.json:
            emit_json(rows)
            return
        t = Table("run", "device", "model", "status", "records", "verified", "fingerprint")
        for r in rows:
            status = f"{r['status']} ({r['holder']})" if r["holder"] else r["status"]
            t.add_row(r["run_id"], safe(r["device"]), safe(Path(r["model"]).name), safe(status), str(r["records"]),
                      str(r["verified"]), r["fingerprint_key"])
        console.print(t)
    run_guarded(body)


@app.command("best", epilog=epilog("db best"))
def best_cmd(model: Optional[str] = typer.Argument(None, help="only runs of this model file"),
             db: Optional[str] = DbOpt, fmt: Format = FormatOpt) -> None:
    """Best verified configuration per model, device fingerprint and shape (latest complete run)."""
    def body():
        from edgetune.results import summarize_run  # lazy: CLI start-up (imports numpy)

        store = _store(db)
        try:
            seen = set()
            rows = []
            for r in store.runs(1000):
                if r["status"] != "complete" or r["id"].startswith("bench-"):
                    continue
                if model and Path(r["model_path"]).resolve() != Path(model).resolve() and r["model_path"] != model:
                    continue
                ident = (r["model_sha256"], r["fingerprint_key"])
                if ident in seen:
                    continue
                seen.add(ident)
                s = summarize_run(store, r["id"])
                for sh in s.shapes:
                    b = sh.best
                    rows.append({"model": Path(r["model_path"]).name, "device": r["device"],
                                 "fingerprint_key": r["fingerprint_key"], "shape": sh.shape,
                                 "best": b.candidate.label() if b else None, "key": b.candidate.key() if b else None,
                                 "median_ms": b.stats.median_ms if b and b.stats else None,
                                 "speedup_vs_default": b.vs_default.as_dict() if b and b.vs_default else None,
                                 "run_id": r["id"]})
        finally:
            store.close()
        if fmt == Format.json:
            emit_json(rows)
            return
        t = Table("model", "device", "shape", "best verified configuration", "key", "median ms", "speedup vs default")
        for r in rows:
            sp = r["speedup_vs_default"]
            t.add_row(r["model"], r["device"], " ".join(f"{k}={v}" for k, v in r["shape"].items()), escape(r["best"] or "none"),
                      r["key"] or "—", f"{r['median_ms']:.4f}" if r["median_ms"] else "—",
                      f"{sp['speedup']:.2f}× [{sp['ci95'][0]:.2f}, {sp['ci95'][1]:.2f}]" if sp else "—")
        console.print(t)
    run_guarded(body)


@app.command("export", epilog=epilog("db export"))
def export_cmd(out: Path = typer.Argument(..., help="JSON Lines file: one record per line, every sample"),
               db: Optional[str] = DbOpt) -> None:
    """Export every record (all raw samples) as JSON Lines."""
    def body():
        store = _store(db)
        tmp = out.with_name(out.name + f".tmp{os.getpid()}")
        n = 0
        try:
            with open(tmp, "w") as f:
                for r in store.iter_all():
                    f.write(json.dumps({"run_id": r.run_id, "workload_key": r.workload_key, "shape": r.shape,
                                        "fingerprint_key": r.fingerprint_key, "candidate": r.candidate,
                                        "versions": r.versions, "round": r.round, "status": r.status,
                                        "reason": r.reason, "verdict": r.verdict,
                                        "samples_ns": r.samples_ns.tolist(), "wall_ms": r.wall_ms,
                                        "created": r.created}) + "\n")
                    n += 1
            os.replace(tmp, out)
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            raise UserInputError(f"cannot write {out}: {exc.strerror or exc}") from exc
        finally:
            store.close()
        console.print(f"exported {n} records to {out}")
    run_guarded(body)


@app.command("migrate", epilog=epilog("db migrate"))
def migrate_cmd(source: str = typer.Argument(..., help="the SQLite database to copy (a file)"),
                to: str = typer.Option(..., "--to", help="the database to copy into: postgresql://user@host:port/db"),
                fmt: Format = FormatOpt) -> None:
    """Copy every run and record of an SQLite database into another (a lab's PostgreSQL); runs again safely."""
    def body():
        from edgetune.db import Store, redact

        src = Store(source, create=False)
        try:
            dst = Store(to)
            try:
                out = dst.copy_from(src)
            finally:
                dst.close()
        finally:
            src.close()
        if fmt == Format.json:
            emit_json({"source": str(source), "to": redact(to), **out})
            return
        console.print(f"copied {out['runs']} runs and {out['records']} records into {redact(to)} "
                      f"({out['runs_present']} runs and {out['records_present']} records were there already)",
                      highlight=False, markup=False)
    run_guarded(body)
