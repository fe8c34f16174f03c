"""Device text is data (issue 8): every human output prints it escaped, never as markup or terminal
control, and never crashes on it; JSON keeps it raw."""

from __future__ import annotations

import html
import io
import json
import re

import pytest
import typer
from typer.testing import CliRunner

from edgetune.agent.host import AgentInfo
from edgetune.candidate import Candidate
from edgetune.cli import common
from edgetune.cli.common import OutputConsole, run_guarded
from edgetune.cli.main import app
from edgetune.errors import DeviceError
from edgetune.measure import Stats
from edgetune.report import markdown, report_dict
from edgetune.report.html import render
from edgetune.results import CandidateSummary, RunSummary, ShapeSummary
from edgetune.text import device_text, html_text, md_code, md_text, safe
from edgetune.tune_config import DeviceOutcome, TuneOutcome

# markup that crashes rich ([/bold] closes nothing), screen clear, window title (OSC ... BEL), DEL, a bidi
# override, a link and HTML for the reports, a table separator, a newline
EVIL = "a[/bold]b\x1b[2Jc\x1b]0;title\x07d\x7fe\u202ef[red]g<script>x</script>[l](javascript:x)|h\ni"
BIG = "B" * 65536 + "\x1b[2J"
RAW = ("\x1b", "\x07", "\x7f", "\u202e", "\u061c")


def assert_inert(out: str, shown: bool = True) -> None:
    """No raw control or bidi character; the text is there, escaped; 64 KB strings are capped."""
    for ch in RAW:
        assert ch not in out, (ch, out[:2000])
    if shown:
        assert "[/bold]" in out and "\\x1b[2J" in out and "\\x1b]0;title\\x07" in out and "\\x7f" in out
        assert "\\u202e" in out
    assert len(out) < 60_000


class _Terminal(OutputConsole):
    """An OutputConsole that believes it is on a terminal (rich tables, progress bars), without colour
    codes, so any ESC in its output came from the data."""

    def on_terminal(self) -> bool:
        return True


def _without_live_controls(out: str) -> str:
    """A progress display's own cursor controls (hide/show cursor, erase line, cursor up) removed."""
    return re.sub(r"\x1b\[(\?25[lh]|2K|\d*A)", "", out)


def _terminal() -> _Terminal:
    return _Terminal(file=io.StringIO(), force_terminal=True, color_system=None, width=6000)


def _invoke(args):
    r = CliRunner().invoke(app, args, env={"COLUMNS": "240"})
    assert "Traceback" not in r.output, r.output
    assert not isinstance(r.exception, Exception) or isinstance(r.exception, SystemExit), repr(r.exception)
    return r


def _assert_markdown_renders_as_text(md: str) -> None:
    """Rendered as Markdown (CommonMark + tables, raw HTML allowed as GitHub does before sanitizing),
    the device's text makes no element, no link, and no extra table cell."""
    from markdown_it import MarkdownIt

    page = MarkdownIt("commonmark", {"html": True}).enable("table").render(md)
    assert "<script" not in page and "<a " not in page and "javascript:x)" in page
    for table in page.split("<table>")[1:]:
        rows = table.split("</table>")[0].split("<tr>")[1:]
        assert len({r.count("<td") + r.count("<th") for r in rows}) == 1, "a cell was split"


# -- the helpers -------------------------------------------------------------------------------

@pytest.mark.parametrize("value", [EVIL, BIG, "\u061c\u2066x\u2069", "\x9b31m", 12, None])
def test_helpers_escape_everything(value):
    for f in (device_text, safe, md_text, md_code, html_text):
        out = f(value)
        assert_inert(out, shown=False)
        assert "\n" not in out and "\x9b" not in out
    assert len(device_text(BIG)) <= 2000
    assert "<" not in html_text(EVIL) and "&lt;script&gt;" in html_text(EVIL)
    md = md_text(EVIL)
    assert "\\[l\\](javascript:x)" in md and "\\<script\\>" in md and "\\|" in md


def test_md_code_fences_any_backticks():
    assert md_code("a`b") == "``a`b``"
    assert md_code("`x`") == "`` `x` ``"
    assert md_code("plain") == "`plain`"


# -- the one error line --------------------------------------------------------------------------

def _hostile_error():
    raise DeviceError(f"device said: {EVIL} {BIG}")


def test_error_line_is_data(capsys, monkeypatch):
    with pytest.raises(typer.Exit) as exc:
        run_guarded(_hostile_error)
    assert exc.value.exit_code == 3
    err = capsys.readouterr().err
    assert_inert(err)
    assert err.startswith("error: device said: ") and len(err.strip().splitlines()) == 1
    term = _terminal()
    monkeypatch.setattr(common, "err_console", term)
    with pytest.raises(typer.Exit):
        run_guarded(_hostile_error)
    out = term.file.getvalue()
    assert_inert(out)
    assert "error: device said: a[/bold]b" in out


# -- devices ls / check ----------------------------------------------------------------------------

def _info(**fp) -> AgentInfo:
    base = {"cores": 4, "os": "Linux", "kernel": "6.1", "cpu_model": "cpu", "governor": "performance"}
    return AgentInfo(agent="python", agent_version="1", arch="x86_64", python="3.11",
                     runtimes={"onnxruntime": "1.20"}, fingerprint={**base, **fp})


HOSTILE_INFO = AgentInfo(agent=EVIL, agent_version=EVIL, arch=EVIL, python=EVIL, runtimes={EVIL: EVIL},
                         fingerprint={"cores": EVIL, "os": EVIL, "kernel": EVIL, "cpu_model": BIG, "soc": EVIL,
                                      "governor": EVIL, "max_freq_khz": [2400000]})


class _FakeClient:
    """The agent as each named device answers it."""

    def __init__(self, spec):
        self.spec = spec

    def provision(self):
        name = self.spec.name
        if name == "evil":
            return HOSTILE_INFO
        if name == "down":
            raise DeviceError(f"agent stderr: {EVIL}")
        if name == "boom":  # a reply the host did not expect: any exception while probing
            raise ValueError(f"malformed info\nsecond line {EVIL}")
        if name == "odd":  # fields of the wrong types: runtimes is not a dict
            return AgentInfo(agent="python", agent_version="1", arch="x86_64", python=None,
                             runtimes=["onnxruntime"], fingerprint={})  # type: ignore[arg-type]
        if name == "weird":  # shown, wrong types and all
            return _info(max_freq_khz="fast", cores={"big": 4}, cpu_model=None)
        return _info()

    def close(self):
        if self.spec.name == "boom":
            raise RuntimeError("close failed too")


@pytest.fixture
def farm(tmp_path, monkeypatch):
    inv = str(tmp_path / "devices.toml")
    for name in ("evil", "down", "boom", "odd", "weird", "good"):
        r = _invoke(["devices", "add", name, "ssh://u@127.0.0.1:1", "--inventory", inv])
        assert r.exit_code == 0, r.output
    monkeypatch.setattr("edgetune.agent.host.AgentClient", _FakeClient)
    return inv


def test_devices_ls_survives_every_device(farm, monkeypatch):
    r = _invoke(["devices", "ls", "--inventory", farm])  # piped: Markdown rows
    assert r.exit_code == 0, r.output
    assert_inert(r.output)
    rows = {ln.split("|")[1].strip(): ln for ln in r.output.splitlines() if ln.startswith("| ")}
    assert {"evil", "down", "boom", "odd", "weird", "good"} <= set(rows)
    assert "| ok" in rows["good"] and "| ok" in rows["evil"] and "| ok" in rows["weird"]
    assert "down: agent stderr: a[/bold]b\\x1b[2J" in rows["down"]
    assert "down: unexpected ValueError while probing the device: malformed info " in rows["boom"]
    assert "second line" not in rows["boom"]  # one line: the first of the exception's
    assert "down: unexpected AttributeError while probing the device" in rows["odd"]
    assert len(r.output.splitlines()) == len(rows) + 2  # one line per device, header, separator

    term = _terminal()
    monkeypatch.setattr("edgetune.cli.devices.console", term)
    r = _invoke(["devices", "ls", "--inventory", farm])
    assert r.exit_code == 0, r.output
    out = term.file.getvalue()
    assert_inert(out)
    for name in ("evil", "down", "boom", "odd", "weird", "good"):
        assert name in out

    r = _invoke(["devices", "check", "--inventory", farm])
    assert r.exit_code == 3  # as before: a device is down


def test_devices_json_keeps_the_raw_strings(farm):
    r = _invoke(["devices", "ls", "--inventory", farm, "--format", "json"])
    assert r.exit_code == 0, r.output
    for ch in RAW:
        assert ch not in r.output  # json escapes them itself...
    rows = {row["name"]: row for row in json.loads(r.output)}
    assert rows["evil"]["os"] == EVIL and rows["evil"]["cpu"] == BIG  # ...and they come back as they were
    assert rows["evil"]["runtimes"] == {EVIL: EVIL}
    assert rows["down"]["error"] == f"agent stderr: {EVIL}"
    assert rows["boom"]["health"] == "down" and "\n" not in rows["boom"]["error"]


# -- tune, bench, verify, reports ------------------------------------------------------------------

def _stats() -> Stats:
    return Stats(n=3, median_ns=1e6, p10_ns=0.9e6, p90_ns=1.1e6, mean_ns=1e6, min_ns=0.9e6, cv=0.05,
                 ci_low_ns=0.95e6, ci_high_ns=1.05e6)


def _summary(device: str = EVIL) -> RunSummary:
    ok = CandidateSummary(Candidate.make("adapter", {"name": EVIL}), "verified", "", "final", [1], _stats(), 0.0, 0.0)
    failed = CandidateSummary(Candidate.make("ort", {"note": EVIL}), "failed", f"{EVIL} {BIG}", "screened", [0],
                              None, None, None)
    shape = ShapeSummary(shape={"batch": 1}, shape_key=EVIL, workload_key="w", candidates=[ok, failed],
                         default_key=None, best_baseline_key=None, best_key=ok.candidate.key())
    fp = {k: EVIL for k in ("cpu_model", "cores", "os", "kernel", "governor", "arch", "emulated")}
    return RunSummary(run_id=EVIL, device=device, model_path=f"/m/{EVIL}.onnx", model_sha256="0" * 64,
                      fingerprint_key=EVIL, fingerprint=fp, versions={"agent": EVIL}, config={"command": EVIL},
                      status=EVIL, emulated=True, shapes=[shape])


def _fake_tune(model_path, devices, *, progress=None, **kw):
    events = [
        {"event": "start", "device": EVIL, "run_id": EVIL, "resumed": True, "candidates": 2, "points": 1,
         "total_jobs": 3},
        {"event": "job", "device": EVIL, "shape": EVIL, "round": 0, "phase": "race", "candidate": EVIL,
         "status": "failed", "reason": BIG, "median_ms": None},
        {"event": "job", "device": EVIL, "shape": EVIL, "round": 1001, "phase": "confirm", "confirm_round": 1,
         "candidate": EVIL, "status": "verified", "reason": "", "median_ms": 1.0},
        {"event": "build", "device": EVIL, "shape": EVIL, "candidate": EVIL, "kernel": EVIL, "trials": 3,
         "best_gflops": 1.0},
        {"event": "retry", "device": EVIL, "error": EVIL},
        {"event": "down", "device": "two", "error": BIG},
    ]
    for ev in events:
        progress(ev)
    return TuneOutcome(model_path, [DeviceOutcome(EVIL, "complete", run_id=EVIL, summary=_summary()),
                                    DeviceOutcome("two", "down", error=f"{EVIL} {BIG}")])


def test_tune_output_and_reports_are_data(tmp_path, monkeypatch):
    monkeypatch.setattr("edgetune.api._tune", _fake_tune)  # what `edgetune tune` runs through api.tune
    out_dir = tmp_path / "rep"
    r = _invoke(["tune", "m.onnx", "--report-dir", str(out_dir), "--db", str(tmp_path / "t.db")])
    assert r.exit_code == 3, r.output  # a device is down
    assert_inert(r.output)
    assert "failed: a[/bold]b" in r.output and "two: down: a[/bold]b" in r.output

    md = (out_dir / "report.md").read_text()
    assert_inert(md)
    _assert_markdown_renders_as_text(md)
    page = (out_dir / "report.html").read_text()
    assert_inert(page)
    assert "<script>" not in page and "&lt;script&gt;" in page and "[/bold]" in page
    rep = json.loads((out_dir / "report.json").read_text())
    assert rep["runs"][0]["fingerprint"]["cpu_model"] == EVIL and rep["devices_down"][0]["error"] == f"{EVIL} {BIG}"

    # on a terminal: rich tables and the progress display
    term, term_err = _terminal(), _terminal()
    monkeypatch.setattr("edgetune.cli.tune.console", term)
    monkeypatch.setattr("edgetune.cli.tune.err_console", term_err)
    r = _invoke(["tune", "m.onnx", "--db", str(tmp_path / "t.db")])
    assert r.exit_code == 3, r.output
    out = term.file.getvalue()
    assert_inert(out)
    assert "failed" in out and "two: down: a[/bold]b" in out
    live = _without_live_controls(term_err.file.getvalue())
    assert_inert(live, shown=False)
    assert "run a[/bold]b" in live  # the progress description, escaped

    r = _invoke(["tune", "m.onnx", "--db", str(tmp_path / "t.db"), "--format", "json"])
    for ch in RAW:
        assert ch not in r.output
    assert json.loads(r.output)["runs"][0]["candidates" if False else "shapes"][0]["shape_key"] == EVIL


def test_markdown_and_html_reports_direct():
    rep = report_dict([_summary(), _summary("second")])  # two devices: the side-by-side table too
    md = markdown(rep)
    assert_inert(md)
    _assert_markdown_renders_as_text(md)
    assert "## " + md_text("script>[l](javascript:x)|h\ni.onnx") + " on " in md  # the path's last part
    assert "Devices side by side" in md
    page = render(rep)
    assert_inert(page)
    assert html.escape("a[/bold]b", quote=True) in page


def test_bench_and_verify_print_data(tmp_path, monkeypatch):
    monkeypatch.setattr("edgetune.api.bench", lambda *a, **k: _summary())
    r = _invoke(["bench", "m.onnx", "--config", "k"])
    assert r.exit_code == 0, r.output
    assert_inert(r.output)
    term = _terminal()
    monkeypatch.setattr("edgetune.cli.bench.console", term)
    _invoke(["bench", "m.onnx", "--config", "k"])
    assert_inert(term.file.getvalue())

    res = {"seed_source": "random", "seed": 7, "label": EVIL, "candidate": {"key": EVIL}, "device": EVIL, "ok": False,
           "shapes": [{"shape": {"batch": 1}, "ok": True, "max_abs_err": 0.0, "max_rel_err": 0.0, "tolerance": 1e-5,
                       "checks": [EVIL, BIG]},
                      {"shape": {"batch": 2}, "ok": False, "reason": f"{EVIL} {BIG}"}]}
    monkeypatch.setattr("edgetune.api.verify_config", lambda *a, **k: res)
    r = _invoke(["verify", "m.onnx", "--config", "k"])
    assert r.exit_code == 1, r.output
    assert_inert(r.output)
    assert "verified a[/bold]b" in r.output and "FAILED a[/bold]b" in r.output
    r = _invoke(["verify", "m.onnx", "--config", "k", "--format", "json"])
    assert json.loads(r.output)["label"] == EVIL


def test_tune_kernels_prints_data(monkeypatch):
    from edgetune.kernels.session import KernelResult, KernelSessionOutcome

    form = {"form": EVIL, "status": "failed", "reason": BIG}
    result = KernelResult(name=EVIL, spec=EVIL, workload_key="w", flops=1, weight=1, verified=False, reason=BIG,
                          gflops=None, median_ns=None, p10_ns=None, p90_ns=None, peak_pct=None, trials_measured=1,
                          trials_failed=1, reused_records=0, tuning_s=0.1, emulated=True,
                          baseline={"reason": EVIL, "forms": [form]}, reference=f"not independent: {EVIL}")
    outcome = KernelSessionOutcome(run_id=EVIL, device=EVIL, fingerprint_key=EVIL, fingerprint={"cpu_model": EVIL},
                                   emulated=EVIL, target={}, cross_cc=None, peak_gflops=None, results=[result],
                                   db_path=EVIL, tuning_dir=EVIL)

    def fake(cfg, on_event):
        for ev in ({"event": "start", "device": EVIL, "run_id": EVIL, "workloads": 1, "emulated": EVIL},
                   {"event": "workload", "name": EVIL, "trials": 2},
                   {"event": "trial", "name": EVIL, "done": 1, "best_gflops": None},
                   {"event": "done", "name": EVIL, "result": result}):
            on_event(ev)
        return outcome

    monkeypatch.setattr("edgetune.kernels.session.tune_kernels", fake)
    r = _invoke(["tune-kernels", "--op", "gemm:M=8,N=8,K=8"])
    assert r.exit_code == 1, r.output  # no verified kernel
    assert_inert(r.output)
    term, term_err = _terminal(), _terminal()
    monkeypatch.setattr("edgetune.cli.kernels.console", term)
    monkeypatch.setattr("edgetune.cli.kernels.err_console", term_err)
    _invoke(["tune-kernels", "--op", "gemm:M=8,N=8,K=8"])
    assert_inert(term.file.getvalue())
    assert_inert(_without_live_controls(term_err.file.getvalue()))


def test_plain_markdown_rows_stay_one_line():
    """Piped output prints tables as Markdown rows: whatever a cell holds (escaped markup, a raw string
    that is not valid markup, a Text) stays in its cell, on its line, without controls."""
    from rich.table import Table
    from rich.text import Text

    t = Table("a", "b", "c", title=Text(EVIL))
    t.add_row(safe(EVIL), EVIL, Text(BIG))
    text = common.plain_table(t)
    assert_inert(text)
    lines = text.splitlines()
    assert len(lines) == 5  # title, blank, header, separator, one row
    assert lines[4].count(" | ") - lines[4].count("\\| ") == 2
