"""The CLI as a user meets it: real subprocesses, exit codes, one error line, no tracebacks."""

from __future__ import annotations

import html
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

EDGETUNE = [sys.executable, "-m", "edgetune.cli.main"]
QUICK = ["--budget", "1.5", "--rounds", "1", "--finalists", "1", "--max-candidates", "2", "--space", "ort"]


def run(args, home, timeout=180, **kw):
    env = {**os.environ, "EDGETUNE_HOME": str(home), "COLUMNS": "200"}
    return subprocess.run(EDGETUNE + list(args), capture_output=True, text=True, timeout=timeout, env=env, **kw)


def assert_one_line_error(p, code=None, needle=None):
    assert p.returncode != 0, p.stdout
    if code is not None:
        assert p.returncode == code, (p.returncode, p.stderr)
    assert "Traceback" not in p.stderr and "Traceback" not in p.stdout
    lines = [l for l in p.stderr.strip().splitlines() if l.strip()]
    assert len(lines) == 1, p.stderr
    assert lines[0].startswith("error:")
    if needle:
        assert needle in lines[0], lines[0]


@pytest.fixture
def home(tmp_path):
    return tmp_path / "home"


def test_bad_inputs_give_one_line_errors(tiny_model, tmp_path, home):
    db = tmp_path / "x.db"
    assert_one_line_error(run(["tune", str(tmp_path / "missing.onnx"), "--db", str(db)], home), 2, "not found")
    corrupt = tmp_path / "corrupt.onnx"
    corrupt.write_bytes(tiny_model.read_bytes()[:200])
    assert_one_line_error(run(["tune", str(corrupt), "--db", str(db)], home), 2)
    text = tmp_path / "notes.onnx"
    text.write_text("this is not a model\n" * 10)
    assert_one_line_error(run(["tune", str(text), "--db", str(db)], home), 2)
    assert_one_line_error(run(["tune", str(tiny_model), "--sweep", "seq=1,2", "--db", str(db)], home), 2, "seq")
    assert_one_line_error(run(["tune", str(tiny_model), "--sweep", "batch=a", "--db", str(db)], home), 2)
    assert_one_line_error(run(["tune", str(tiny_model), "--device", "ghost", "--db", str(db)], home), 2, "unknown device")
    assert_one_line_error(run(["tune", str(tiny_model), "--space", "magic", "--db", str(db)], home), 2)
    np_bad = tmp_path / "bad.npy"
    np_bad.write_bytes(b"garbage")
    assert_one_line_error(run(["tune", str(tiny_model), "--input", f"x={np_bad}", "--db", str(db)], home), 2)
    assert not db.exists()  # nothing half-written
    # unwritable database path (a file where a directory should be)
    blocker = tmp_path / "blocker"
    blocker.write_text("")
    assert_one_line_error(run(["tune", str(tiny_model), *QUICK, "--db", str(blocker / "sub" / "t.db")], home), 4)
    # a corrupt database is refused, not overwritten
    bad_db = tmp_path / "bad.db"
    bad_db.write_bytes(b"not sqlite" * 100)
    assert_one_line_error(run(["tune", str(tiny_model), *QUICK, "--db", str(bad_db)], home), 4)
    assert bad_db.read_bytes() == b"not sqlite" * 100
    # unknown config key, missing database
    assert_one_line_error(run(["bench", str(tiny_model), "--config", "abcdef", "--db", str(tmp_path / "none.db")],
                              home), 4, "not found")
    # unwritable report path
    assert_one_line_error(run(["report", "--db", str(tmp_path / "none.db")], home), 4)


def test_tune_json_then_bench_verify_db_report(tiny_model, tmp_path, home):
    db = tmp_path / "t.db"
    p = run(["tune", str(tiny_model), *QUICK, "--sweep", "batch=1,3", "--db", str(db), "--format", "json"], home)
    assert p.returncode == 0, p.stderr
    rep = json.loads(p.stdout)
    assert rep["schema"] == "edgetune.report/1"
    shapes = rep["runs"][0]["shapes"]
    assert sorted(s["shape"]["batch"] for s in shapes) == [1, 3]
    best = shapes[0]["best"]
    assert best

    assert rep["runs"][0]["command"].startswith(f"edgetune tune {tiny_model} --budget 1.5 ")
    assert "--sweep batch=1,3" in rep["runs"][0]["command"]

    p = run(["verify", str(tiny_model), "--config", best, "--db", str(db), "--dim", "batch=2"], home)
    assert p.returncode == 0, p.stderr
    assert "verified" in p.stdout and "max rel err" in p.stdout
    assert "fresh seed" in p.stdout and "--seed" in p.stdout
    # a fresh seed each time, never the tune's own (0), recorded so that --seed replays it
    p = run(["verify", str(tiny_model), "--config", best, "--db", str(db), "--format", "json"], home)
    assert p.returncode == 0, p.stderr
    first = json.loads(p.stdout)
    p = run(["verify", str(tiny_model), "--config", best, "--db", str(db), "--format", "json"], home)
    second = json.loads(p.stdout)
    assert first["seed_source"] == second["seed_source"] == "fresh"
    assert first["seed"] != 0 and second["seed"] != 0 and first["seed"] != second["seed"]
    p = run(["verify", str(tiny_model), "--config", best, "--db", str(db), "--seed", str(first["seed"]),
             "--format", "json"], home)
    replay = json.loads(p.stdout)
    assert replay["seed"] == first["seed"] and replay["seed_source"] == "given" and replay["ok"]

    p = run(["bench", str(tiny_model), "--config", best[:8], "--db", str(db), "--rounds", "2", "--budget", "2",
             "--format", "json"], home)
    assert p.returncode == 0, p.stderr
    b = json.loads(p.stdout)
    labels = {c["candidate"]["key"] for c in b["shapes"][0]["candidates"]}
    assert best in labels

    assert_one_line_error(run(["verify", str(tiny_model), "--config", "ffffffff", "--db", str(db)], home), 2,
                          "unknown config key")

    p = run(["db", "ls", "--db", str(db), "--format", "json"], home)
    assert p.returncode == 0 and json.loads(p.stdout)[0]["records"] > 0
    p = run(["db", "best", "--db", str(db), "--format", "json"], home)
    assert p.returncode == 0 and {r["shape"]["batch"] for r in json.loads(p.stdout)} == {1, 3}
    out = tmp_path / "export.jsonl"
    p = run(["db", "export", str(out), "--db", str(db)], home)
    assert p.returncode == 0
    lines = [json.loads(l) for l in out.read_text().splitlines()]
    assert lines and all(len(l["samples_ns"]) >= 3 for l in lines if l["status"] == "verified")
    p = run(["report", "--db", str(db), "--out", str(tmp_path / "r.md")], home)
    assert p.returncode == 0
    md = (tmp_path / "r.md").read_text()
    assert "fingerprint" in md and "versions" in md
    assert f"- command: `{rep['runs'][0]['command']}`" in md  # the recorded command, not a made-up one
    p = run(["report", "--db", str(db), "--format", "json"], home)
    assert json.loads(p.stdout)["schema"] == "edgetune.report/1"
    p = run(["report", "--db", str(db), "--format", "html", "--out", str(tmp_path / "r.html")], home)
    assert p.returncode == 0, p.stderr
    page = (tmp_path / "r.html").read_text()
    import re
    import xml.etree.ElementTree as ET

    svgs = re.findall(r"<svg.*?</svg>", page, flags=re.S)
    assert len(svgs) == 2  # one chart per shape (batch 1 and 3)
    for svg in svgs:
        root = ET.fromstring(svg)  # well-formed
        assert len(root.findall("{*}rect") or root.findall("rect")) >= 1
    assert best in page and "95% CI" in page
    assert html.escape(rep["runs"][0]["command"]) in page


def test_table_output_shows_status_latency_and_speedup(tiny_model, tmp_path, home, adapters):
    p = run(["tune", str(tiny_model), *QUICK, "--adapter", str(adapters / "wrong.py"), "--db", str(tmp_path / "t.db")],
            home)
    assert p.returncode == 0, p.stderr
    out = p.stdout
    assert "verified" in out and "failed" in out and "tolerance" in out
    assert "speedup vs default" in out and "95% CI" in out and "★" in out


def _table_rows(text):
    """The Markdown table rows of ``text``, as lists of cells (escaped pipes kept inside cells)."""
    import re

    return [[c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]]
            for line in text.splitlines() if line.startswith("|")]


def test_piped_tables_are_plain_one_line_per_row(tiny_model, tmp_path, home, adapters):
    """Not on a terminal (a file, a pipe, a CI log): no box drawing, no cell folded over lines at 80 columns."""
    db = tmp_path / "t.db"
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "FORCE_COLOR", "TTY_COMPATIBLE")}
    env.update(EDGETUNE_HOME=str(home), COLUMNS="80")
    p = subprocess.run(EDGETUNE + ["tune", str(tiny_model), *QUICK, "--adapter", str(adapters / "wrong.py"),
                                   "--db", str(db)], capture_output=True, text=True, timeout=180, env=env)
    assert p.returncode == 0, p.stderr
    out = p.stdout
    assert not any(ch in out for ch in "│┃━─╭╰┏┗"), out
    assert "\x1b[" not in out  # no colour codes in a file
    rows = _table_rows(out)
    header = rows[0]
    assert header[:3] == ["candidate", "key", "status"] and "speedup vs default [95% CI]" in header
    assert all(len(r) == len(header) for r in rows), out  # every row whole, on one line
    body = [r for r in rows[2:]]
    assert len(body) >= 3
    assert any(r[2] == "verified" for r in body) and any(r[2].startswith("failed: ") for r in body)
    keys = json.loads(subprocess.run(EDGETUNE + ["db", "ls", "--db", str(db), "--format", "json"],
                                     capture_output=True, text=True, env=env).stdout)
    assert keys
    p = subprocess.run(EDGETUNE + ["db", "ls", "--db", str(db)], capture_output=True, text=True, env=env)
    rows = _table_rows(p.stdout)
    assert rows[0][:3] == ["run", "device", "model"] and rows[2][0] == keys[0]["run_id"]
    assert all(len(r) == len(rows[0]) for r in rows)


def test_every_command_help_has_examples():
    from typer.main import get_command
    from typer.testing import CliRunner

    from edgetune.cli.main import app

    def walk(cmd, path):
        yield path
        for name, sub in getattr(cmd, "commands", {}).items():
            yield from walk(sub, path + [name])

    paths = list(walk(get_command(app), []))
    assert ["tune"] in paths and ["db", "export"] in paths and ["devices", "check"] in paths
    runner = CliRunner()
    for path in paths:
        r = runner.invoke(app, path + ["--help"], env={"COLUMNS": "200"})
        assert r.exit_code == 0, (path, r.output)
        examples = r.output[r.output.index("Examples:"):]
        lines = [l.strip(" │") for l in examples.splitlines()]
        assert any(l.startswith("edgetune " + " ".join(path)) for l in lines), (path, examples)


def test_report_without_a_recorded_command_says_so():
    from edgetune.report import markdown
    from edgetune.report.html import render

    run_ = {"model": "/m/tiny.onnx", "device": "local", "fingerprint": {}, "fingerprint_key": "fp", "emulated": False,
            "versions": {}, "model_sha256": "0" * 64, "run_id": "r1", "status": "complete", "shapes": [],
            "config": {"budget_s": 1.0}}
    rep = {"schema": "edgetune.report/1", "generated": "now", "runs": [run_], "comparison": [], "devices_down": []}
    for text in (markdown(rep), render(rep)):
        assert "none recorded" in text and "edgetune tune" not in text
    run_["config"]["command"] = "edgetune tune /m/tiny.onnx --budget 1"
    assert "- command: `edgetune tune /m/tiny.onnx --budget 1`" in markdown(rep)
    assert "<code>edgetune tune /m/tiny.onnx --budget 1</code>" in render(rep)


def test_devices_add_ls_rm(home, tmp_path):
    p = run(["devices", "add", "pi", "ssh://pi@127.0.0.1:1", "--key", "/nonexistent/key"], home)
    assert p.returncode == 0, p.stderr
    assert_one_line_error(run(["devices", "add", "pi", "ssh://pi@127.0.0.1:1"], home), 2, "already exists")
    assert_one_line_error(run(["devices", "add", "x", "ftp://nope"], home), 2, "not understood")
    p = run(["devices", "ls", "--format", "json"], home, timeout=120)
    rows = {r["name"]: r for r in json.loads(p.stdout)}
    assert rows["local"]["health"] == "ok" and rows["local"]["cores"] >= 1 and rows["local"]["fingerprint_key"]
    assert "onnxruntime" in rows["local"]["runtimes"]
    assert rows["pi"]["health"] == "down" and rows["pi"]["error"]
    p = run(["devices", "check", "pi"], home, timeout=120)
    assert p.returncode == 3
    assert run(["devices", "rm", "pi"], home).returncode == 0
    assert_one_line_error(run(["devices", "rm", "pi"], home), 2)


def test_killed_tune_resumes_without_remeasuring(tiny_model, tmp_path, home):
    db = tmp_path / "t.db"
    args = ["tune", str(tiny_model), "--budget", "8", "--rounds", "2", "--finalists", "3", "--max-candidates", "6",
            "--space", "ort", "--db", str(db), "--format", "json"]
    env = {**os.environ, "EDGETUNE_HOME": str(home)}
    proc = subprocess.Popen(EDGETUNE + args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                            start_new_session=True)
    deadline = time.monotonic() + 120
    n = 0
    while time.monotonic() < deadline:
        if db.exists():
            try:
                con = sqlite3.connect(db)
                n = con.execute("SELECT COUNT(*) FROM records").fetchone()[0]
                con.close()
            except sqlite3.Error:
                n = 0
        if n >= 3:
            break
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)  # kill -9, agent included
    proc.wait()
    assert n >= 3
    con = sqlite3.connect(db)
    assert con.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    before = con.execute("SELECT COUNT(*) FROM records").fetchone()[0]
    con.close()
    p = run(args, home)
    assert p.returncode == 0, p.stderr
    rep = json.loads(p.stdout)
    dev = rep["devices"][0]
    assert dev["resumed"] and dev["jobs_skipped"] == before
    con = sqlite3.connect(db)
    dup = con.execute("SELECT COUNT(*) FROM (SELECT run_id, shape_key, candidate_key, round, COUNT(*) c FROM records "
                      "GROUP BY 1,2,3,4 HAVING c > 1)").fetchone()[0]
    assert dup == 0
    assert con.execute("SELECT status FROM runs").fetchone()[0] == "complete"
    con.close()


class _Captured(Exception):
    pass


def _capture_tune(monkeypatch):
    """api.tune's call into the tuner, captured instead of run (no device work)."""
    from edgetune import api

    seen: list[dict] = []

    def fake(model_path, devices, **kw):
        seen.append({"model": str(model_path), "devices": list(devices), **kw})
        raise _Captured()

    monkeypatch.setattr(api, "_tune", fake)
    return seen


def test_tune_command_is_the_api_call(monkeypatch, tmp_path):
    """`edgetune tune` runs api.tune: the same arguments give the same run configuration, so a lab
    script and the CLI cannot drift apart (spaces, accuracy, tvm-tuned, adapters' absence alike)."""
    from typer.testing import CliRunner

    from edgetune import api
    from edgetune.cli.main import app

    seen = _capture_tune(monkeypatch)
    db = str(tmp_path / "c.db")
    res = CliRunner().invoke(app, ["tune", "transformer", "--budget", "7", "--space", "ort,ort-fused",
                                   "--accuracy", "cosine=0.999", "--tvm-trials", "4", "--rounds", "2",
                                   "--finalists", "3", "--max-candidates", "2", "--timeout", "9", "--fresh",
                                   "--sweep", "seq=32,64", "--db", db])
    assert isinstance(res.exception, _Captured), res.output
    with pytest.raises(_Captured):
        api.tune("transformer", budget_s=7, spaces=("ort", "ort-fused"), accuracy="cosine=0.999", tvm_trials=4,
                 rounds=2, finalists=3, max_candidates=2, timeout_s=9, fresh=True, sweeps=["seq=32,64"], db=db)
    cli, py = seen
    assert cli["config"].key_dict() == py["config"].key_dict()
    assert cli["config"].spaces == ("ort", "ort-fused", "tvm-tuned", "ort-int8", "ort-gpu-fp16")
    assert cli["config"].accuracy.set and cli["config"].timeout_s == 9
    assert cli["sweeps"] == py["sweeps"] == ["seq=32,64"] and cli["db"] == py["db"]
    assert "edgetune tune transformer" in cli["command"] and cli["progress"] is not None
    assert not Path(db).exists()


def test_api_refuses_what_the_cli_refuses(monkeypatch, tmp_path):
    from edgetune import api
    from edgetune.errors import UserInputError

    seen = _capture_tune(monkeypatch)
    for kw, needle in (({"budget_s": 0}, "budget"), ({"budget_s": -3}, "budget"),
                       ({"spaces": ("ort", "magic")}, "unknown space magic"),
                       ({"accuracy": "cosine=2"}, "cosine"), ({"accuracy": "fast=1"}, "fast"),
                       ({"rounds": 5000}, "rounds")):
        with pytest.raises(UserInputError, match=needle):
            api.tune("transformer", db=str(tmp_path / "r.db"), **kw)
    assert not seen and not (tmp_path / "r.db").exists()  # refused before any device work
