"""Self-contained HTML report: the Markdown report's tables plus, per shape, an inline SVG chart of
every verified candidate's median latency with its 95% CI (no scripts, no external assets)."""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any

from edgetune.report import NO_COMMAND, fmt_err, recorded_command
from edgetune.text import html_text

_CSS = """body{font-family:system-ui,sans-serif;margin:2em;max-width:1200px;color:#222}
table{border-collapse:collapse;font-size:13px;margin:1em 0}td,th{border:1px solid #ccc;padding:3px 6px}
th{background:#f3f3f3}.failed{color:#b00}.best{font-weight:bold}code{font-size:12px}
.meta{font-size:13px;color:#444}svg text{font-size:11px;font-family:system-ui,sans-serif}"""


def _chart(shape: dict[str, Any]) -> str:
    rows = [c for c in shape["candidates"] if c["status"] == "verified" and c["stats"]]
    if not rows:
        return "<p>No verified candidate.</p>"
    left_out = rows[25:]
    rows = rows[:25]
    hi = max(c["stats"]["ci95_ms"][1] for c in rows) or 1.0
    left, width, bar_h, gap = 400, 520, 14, 6
    height = len(rows) * (bar_h + gap) + 30
    out = [f'<svg width="{left + width + 90}" height="{height}" role="img" '
           f'aria-label="median latency with 95% CI per candidate">']
    for i, c in enumerate(rows):
        y = 10 + i * (bar_h + gap)
        med, (lo, up) = c["stats"]["median_ms"], c["stats"]["ci95_ms"]
        x = lambda v: left + width * v / hi  # noqa: E731
        color = "#2a7" if c["candidate"]["key"] == shape["best"] else ("#68a" if c["candidate"]["baseline"] else "#99b")
        label = html_text(c["label"], 66)
        out.append(f'<text x="{left - 6}" y="{y + bar_h - 3}" text-anchor="end">{label}</text>')
        out.append(f'<rect x="{left}" y="{y}" width="{max(1.0, x(med) - left):.1f}" height="{bar_h}" fill="{color}"/>')
        out.append(f'<line x1="{x(lo):.1f}" x2="{x(up):.1f}" y1="{y + bar_h / 2}" y2="{y + bar_h / 2}" '
                   f'stroke="#000" stroke-width="1.5"/>')
        out.append(f'<text x="{x(up) + 4:.1f}" y="{y + bar_h - 3}">{med:.4g} ms</text>')
    out.append(f'<text x="{left}" y="{height - 4}">0 ms</text>'
               f'<text x="{left + width}" y="{height - 4}" text-anchor="end">{hi:.4g} ms</text></svg>')
    note = "<p class='meta'>Race medians (screening figures: the verdict comes from the confirmation rounds)."
    if left_out:  # never drop candidates without a word
        slow = ", ".join(f"{html_text(c['label'], 60)} {c['stats']['median_ms']:.4g} ms" for c in left_out[-3:])
        note += (f" Not drawn: the {len(left_out)} slowest verified candidates of {len(rows) + len(left_out)} "
                 f"(the slowest: {slow}); all are in the table.")
    return "".join(out) + note + "</p>"


def _tradeoff(shape: dict[str, Any]) -> str:
    """Accuracy versus latency, when the shape has approximate candidates: one point per measured
    candidate, x its median latency, y its accuracy loss 1 - cosine on a log scale (exact candidates,
    verified within the fp32 tolerance, on the top line). Hollow points: outside the budget or
    without one (never selectable)."""
    import math

    approx = [c for c in shape["candidates"] if c.get("accuracy") and c["stats"]]
    if not approx:
        return ""
    exact = [c for c in shape["candidates"] if not c.get("approximate") and c["status"] == "verified" and c["stats"]]
    pts = approx + exact
    xs = [c["stats"]["median_ms"] for c in pts]
    losses = [max(1e-9, 1.0 - float(c["accuracy"]["cosine"])) for c in approx if c["accuracy"].get("cosine") is not None]
    lo_e, hi_e = math.floor(math.log10(min(losses, default=1e-6))), math.ceil(math.log10(max(losses, default=1e-3)))
    hi_e = max(hi_e, lo_e + 1)
    left, top, w, h = 70, 24, 520, 200
    xmax = max(xs) * 1.1 or 1.0

    def px(v: float) -> float:
        return left + w * v / xmax

    def py(c: dict[str, Any]) -> float:
        if not c.get("accuracy"):
            return top - 12.0  # exact: the line above the plot
        loss = max(1e-9, 1.0 - float(c["accuracy"]["cosine"]))
        return top + h * (math.log10(loss) - lo_e) / (hi_e - lo_e)

    out = [f'<svg width="{left + w + 260}" height="{top + h + 40}" role="img" '
           f'aria-label="accuracy loss (1 - cosine) versus median latency">',
           f'<line x1="{left}" y1="{top + h}" x2="{left + w}" y2="{top + h}" stroke="#888"/>',
           f'<line x1="{left}" y1="{top}" x2="{left}" y2="{top + h}" stroke="#888"/>',
           f'<text x="{left - 6}" y="{top - 9}" text-anchor="end">exact</text>']
    for ex in range(lo_e, hi_e + 1):
        y = top + h * (ex - lo_e) / (hi_e - lo_e)
        out.append(f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end">1e{ex}</text>')
    for c in pts:
        sel = c["candidate"]["key"] == shape["best"]
        ok = c["status"] == "verified"
        color = "#2a7" if sel else ("#68a" if c["candidate"]["baseline"] else "#a63")
        fill = color if ok else "none"
        x, y = px(c["stats"]["median_ms"]), py(c)
        out.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="5" fill="{fill}" stroke="{color}" stroke-width="1.5"/>')
        if c.get("accuracy") or sel:  # exact points share one line: only the selected one is named
            out.append(f'<text x="{x + 8:.1f}" y="{y + 4:.1f}">{html_text(c["label"], 48)}</text>')
    out.append(f'<text x="{left}" y="{top + h + 16}">0 ms</text><text x="{left + w}" y="{top + h + 16}" '
               f'text-anchor="end">{xmax:.4g} ms (median latency)</text>'
               f'<text x="{left}" y="{top + h + 32}">y: accuracy loss 1 − cosine vs the fp32 reference (log); '
               f'hollow: not selectable (outside the budget or none set)</text></svg>')
    return "".join(out)


def command_html(run: dict[str, Any]) -> str:
    cmd = recorded_command(run)
    return f"<code>{html_text(cmd)}</code>" if cmd else html.escape(NO_COMMAND)


def render(rep: dict[str, Any]) -> str:
    # every string from the report (device text, labels, paths, commands from the database) goes
    # through e: controls and bidi overrides escaped, then HTML-escaped
    def e(value: Any) -> str:
        return html_text(value)

    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>edgetune report</title><style>{_CSS}</style>"
             f"</head><body><h1>edgetune report</h1><p class='meta'>schema <code>{e(rep['schema'])}</code>, generated "
             f"{e(rep['generated'])}. Bars: median latency; whiskers: 95% CI; green: best verified; "
             f"blue: runtime default baselines.</p>"]
    for run in rep["runs"]:
        fp = run["fingerprint"]
        emu = " — <b>emulated: timings not comparable</b>" if run["emulated"] else ""
        parts.append(f"<h2>{e(Path(run['model']).name)} on <code>{e(run['device'])}</code></h2>"
                     f"<p class='meta'>fingerprint <code>{e(run['fingerprint_key'])}</code>: {e(fp.get('cpu_model'))}, "
                     f"{e(fp.get('cores'))} cores, {e(fp.get('arch', ''))}, kernel {e(fp.get('kernel'))}, "
                     f"{e(fp.get('os'))}{emu}<br>versions <code>{e(json.dumps(run['versions'], sort_keys=True))}</code>"
                     f"<br>command {command_html(run)}, run <code>{e(run['run_id'])}</code>"
                     + "".join(f"<br>not raced: {e(name)}, {e(why)}"
                               for name, why in sorted(run.get("families_not_built", {}).items()))
                     + "</p>")
        for s in run["shapes"]:
            shape = " ".join(f"{k}={v}" for k, v in s["shape"].items()) or s["shape_key"]
            fam = "".join(f"<tr class='{'best' if f['selected'] else ''}'><td>{e(f['family'])}</td><td>"
                          f"{e(f['precision'] + (' (approximate)' if f['approximate'] else ''))}</td><td>{e(f['label'])}"
                          f"</td><td>{f['median_ms']:.4f}</td><td>{f['ci95_ms'][0]:.4f}–{f['ci95_ms'][1]:.4f}</td>"
                          f"<td>{e(fmt_err(f))}</td></tr>" for f in s["families"])
            parts.append(f"<h3>{e(shape)}</h3><p><b>{e(s['verdict'])}</b></p><table><tr><th>runtime family</th>"
                         f"<th>precision</th><th>best configuration</th><th>median ms</th><th>95% CI ms</th>"
                         f"<th>error / accuracy</th></tr>{fam}</table>")
            parts.append(f"{_chart(s)}{_tradeoff(s)}<table><tr><th>candidate</th><th>key</th><th>status</th>"
                         "<th>race median ms (screening)</th><th>95% CI ms</th><th>CV</th><th>n</th><th>max rel err / accuracy</th>"
                         "<th>confirmed speedup vs default [interval]</th></tr>")
            for c in s["candidates"]:
                st, sp = c["stats"], c["speedup_vs_default"]
                cls = "best" if c["candidate"]["key"] == s["best"] else ("failed" if c["status"] != "verified" else "")
                key = e(c["candidate"]["key"])
                status = e(c["status"] + (f": {c['reason']}" if c["reason"] else "")
                           + (f"; {c['placement_label']}" if c.get("placement_label") else ""))
                err = e(fmt_err(c))
                spt = f"{sp['speedup']:.2f}× [{sp['ci95'][0]:.2f}, {sp['ci95'][1]:.2f}] {e(sp['verdict'])}" if sp else "—"
                if st:
                    parts.append(f"<tr class='{cls}'><td>{e(c['label'])}</td><td><code>{key}</code></td>"
                                 f"<td>{status}</td><td>{st['median_ms']:.4f}</td><td>{st['ci95_ms'][0]:.4f}–"
                                 f"{st['ci95_ms'][1]:.4f}</td><td>{st['cv']:.2f}</td><td>{e(st['n'])}</td><td>{err}</td>"
                                 f"<td>{spt}</td></tr>")
                else:
                    parts.append(f"<tr class='{cls}'><td>{e(c['label'])}</td><td><code>{key}</code></td>"
                                 f"<td>{status}</td><td>—</td><td>—</td><td>—</td><td>0</td><td>{err}</td><td>—</td></tr>")
            parts.append("</table>")
    for d in rep.get("devices_down", []):
        parts.append(f"<p class='failed'>device <code>{e(d['device'])}</code> went down: {e(d['error'])}</p>")
    parts.append("</body></html>")
    return "\n".join(parts)
