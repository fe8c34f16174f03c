"""Rich tables for run summaries."""

from __future__ import annotations

from pathlib import Path

from rich.table import Table
from rich.text import Text

from edgetune.report import fmt_err, fmt_ms, fmt_speedup, verdict_line
from edgetune.results import placement_label
from edgetune.results import RunSummary
from edgetune.text import device_text, plain


def run_tables(summary: RunSummary) -> list[Table]:
    tables = []
    fp = summary.fingerprint
    devices = set(",".join(s.measured_on or "" for s in summary.shapes).split(","))
    for s in summary.shapes:
        shape = " ".join(f"{k}={v}" for k, v in s.shape.items()) or s.shape_key
        if len(devices) > 1:  # a joined run: its points were measured on several devices of one kind
            shape += f" (measured on {(s.measured_on or '?').replace(',', ', resumed on ')})"
        # the fingerprint, reasons and labels come from the device or a user's adapter: Text, never markup
        t = Table(title=plain(f"{Path(summary.model_path).name} on {summary.device} ({fp.get('cpu_model')}, "
                              f"{fp.get('cores')} cores{', EMULATED' if summary.emulated else ''}) — {shape}"),
                  title_justify="left", caption=plain(verdict_line(s.as_dict())), caption_justify="left")
        for col in ("candidate", "key", "status", "median ms", "95% CI ms", "CV", "n", "max rel err / accuracy",
                    "speedup vs default [95% CI]"):
            t.add_column(col, overflow="fold")
        for c in s.candidates:
            best = c.candidate.key() == s.best_key
            label = plain(("★ " if best else "") + c.candidate.label())
            status = (Text("verified", style="green") if c.status == "verified"
                      else Text.assemble(("failed", "red"), ": ", device_text(c.reason)))
            if c.status == "verified" and c.phase == "screened":
                status.append(" (screened)")
            where = placement_label(c.placement)
            if where:
                status.append(Text.assemble("; ", (device_text(where), "yellow" if "fell back" in where else "")))
            key = plain(c.candidate.key())
            if c.stats:
                t.add_row(label, key, status, fmt_ms(c.stats.median_ns),
                          f"{fmt_ms(c.stats.ci_low_ns)}–{fmt_ms(c.stats.ci_high_ns)}", f"{c.stats.cv:.2f}",
                          str(c.stats.n), fmt_err(c), fmt_speedup(c, summary.emulated))
            else:
                t.add_row(label, key, status, "—", "—", "—", "0", fmt_err(c), "—")
        tables.append(t)
    return tables


def family_tables(run: dict) -> list[Table]:
    """The compact view of a run (report dict): per shape, the best of each runtime family and
    precision, and the verdict line naming the baseline the selection was judged against."""
    tables = []
    for s in run["shapes"]:
        shape = " ".join(f"{k}={v}" for k, v in s["shape"].items()) or s["shape_key"]
        t = Table(title=plain(f"{Path(run['model']).name} on {run['device']} — {shape}: the best of each runtime "
                              f"family and precision (race medians)"), title_justify="left",
                  caption=plain(s["verdict"]), caption_justify="left")
        for col in ("family", "precision", "best configuration", "median ms", "95% CI ms", "error / accuracy"):
            t.add_column(col, overflow="fold")
        for f in s["families"]:
            prec = f["precision"] + (" (approximate)" if f["approximate"] else "")
            t.add_row(plain(f["family"]), plain(prec), plain(("★ " if f["selected"] else "") + f["label"]),
                      f"{f['median_ms']:.4g}", f"{f['ci95_ms'][0]:.4g}–{f['ci95_ms'][1]:.4g}", fmt_err(f))
        tables.append(t)
    return tables
