"""edgetune judge on this machine: inputs checked before any device work, the odd-size variant,
fast_p with intervals, and the CLI end to end (JSON, report directory, database records)."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from edgetune.errors import UserInputError
from edgetune.judge import FAST_P, Judged, collect_kernels, leaderboard, odd_variant
from edgetune.kernels.workloads import parse_workload

KERNELS = Path(__file__).resolve().parents[1] / "judge_kernels"


def _cli(*args, home, check_rc=None):
    env = {**os.environ, "EDGETUNE_HOME": str(home), "COLUMNS": "250"}
    p = subprocess.run([sys.executable, "-m", "edgetune.cli.main", *args], capture_output=True, text=True, env=env,
                       timeout=900)
    if check_rc is not None:
        assert p.returncode == check_rc, (p.returncode, p.stdout[-3000:], p.stderr[-3000:])
    return p


def test_odd_variant_changes_dimensions_only():
    assert odd_variant(parse_workload("gemm:M=64,N=48,K=40")).spec() == "gemm:M=63,N=47,K=39"
    assert odd_variant(parse_workload("gemm:M=97,N=129,K=75")) is None
    conv = odd_variant(parse_workload("conv2d_nchw:N=1,C=8,H=12,W=12,K=16,R=3,S=3,stride=2,pad=1"))
    assert conv.params()["stride"] == 2 and conv.params()["pad"] == 1 and conv.params()["H"] == 11
    att = odd_variant(parse_workload("attention:B=2,H=4,S=16,D=8,causal=1"))
    assert att.params()["causal"] == 1 and att.params()["S"] == 15 and att.params()["D"] == 7


def test_op_attributes_reach_source_kernels_as_macros():
    from edgetune.judge import op_macros

    assert op_macros(parse_workload("attention:B=1,H=2,S=8,D=4,causal=1")) == ["-DEDGETUNE_ATTENTION_CAUSAL=1"]
    assert op_macros(parse_workload("gemm:M=2,N=2,K=2")) == []
    assert "-DEDGETUNE_CONV2D_NCHW_STRIDE=2" in op_macros(
        parse_workload("conv2d_nchw:N=1,C=8,H=12,W=12,K=16,R=3,S=3,stride=2,pad=1"))


def test_transformer_kernels_are_judged(tmp_path, monkeypatch):
    """The same attention source judged without and with the causal mask (the spec's attribute
    reaches it as -DEDGETUNE_ATTENTION_CAUSAL), softmax and layernorm: correct, with a speed verdict."""
    from edgetune import api

    monkeypatch.setenv("EDGETUNE_HOME", str(tmp_path / "home"))
    for op, kernel, race in (("attention:B=1,H=2,S=12,D=8,L=16,causal=1", "attention_naive.c", True),
                             ("attention:B=1,H=2,S=12,D=8", "attention_naive.c", False),
                             ("softmax:M=10,N=33", "softmax_naive.c", True),
                             ("layernorm:M=10,N=33", "layernorm_naive.c", False)):
        doc = api.judge(op, [str(KERNELS / kernel)], rounds=3, budget_ms=10.0, db=str(tmp_path / "j.db"),
                        baseline=race)
        (r,) = doc["results"]
        assert r["correct"], (op, r["errors"])
        if race:  # a speed verdict against the op's baseline forms
            assert r["speed"]["baseline"] and r["speed"]["ci95"], (op, r["speed"])


def test_collect_kernels(tmp_path):
    with pytest.raises(UserInputError, match="no such kernel"):
        collect_kernels([str(tmp_path / "missing.c")])
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "README").write_text("no kernels here")
    with pytest.raises(UserInputError, match="no kernels in this directory"):
        collect_kernels([str(tmp_path / "empty")])
    with pytest.raises(UserInputError):
        collect_kernels([])
    fake = tmp_path / "fake.so"
    fake.write_text("not an ELF file")
    with pytest.raises(UserInputError):
        collect_kernels([str(fake)])
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    (a / "k.c").write_text("int x;\n")
    (b / "k.c").write_text("int y;\n")
    ks = collect_kernels([str(a), str(b), str(a / "k.c")])  # the same file twice is judged once
    assert [k.name for k in ks] == ["k.c", "b/k.c"] and {k.kind for k in ks} == {"c"}
    assert len({k.sha256 for k in ks}) == 2


def _judged(name, correct, fast):
    j = Judged(name, name, "c", "0" * 64, "dev", correct=correct, failure=None if correct else "wrong-output")
    j.fast = fast
    return j


def test_leaderboard_fast_p_counts_correct_kernels_whose_whole_interval_clears_p():
    rs = [_judged("a", True, {1.0: True, 1.5: True, 2.0: False}),
          _judged("b", True, {1.0: False, 1.5: False, 2.0: False}),
          _judged("c", False, {1.0: True, 1.5: True, 2.0: True}),  # a rejected kernel never counts
          _judged("d", True, {1.0: True, 1.5: False, 2.0: False})]
    board = leaderboard(rs)
    assert board["kernels"] == 4 and board["correct"] == 3 and board["fraction_correct"] == 0.75
    assert (board["fast_1"], board["fast_1.5"], board["fast_2"]) == (0.5, 0.25, 0.0)
    assert board["failures"] == {"wrong-output": 1}
    assert all(leaderboard(rs, emulated="qemu")[f"fast_{p:g}"] is None for p in FAST_P)


@pytest.mark.parametrize("args,needle", [
    (["--op", "gemm:M=8,N=8", "K.c"], "missing parameter"),
    (["--op", "nosuchop:M=1", "K.c"], "unknown kernel op"),
    (["--op", "gemm:M=8,N=8,K=8", "/nonexistent/k.c"], "no such kernel file"),
    (["--op", "gemm:M=8,N=8,K=8", "K.c", "-d", "nosuchdevice"], "nosuchdevice"),
    (["--op", "gemm:M=8,N=8,K=8", "K.c", "--report-dir", "/proc/edgetune-report"], "cannot write"),
    (["--op", "gemm:M=8,N=8,K=8", "K.c", "--rounds", "0"], "--rounds"),
])
def test_bad_input_is_one_line_and_leaves_nothing(tmp_path, args, needle):
    home = tmp_path / "home"
    args = [str(KERNELS / "gemm_naive.c") if a == "K.c" else a for a in args]
    p = _cli("judge", *args, home=home)
    assert p.returncode != 0
    lines = [x for x in p.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and needle in lines[0], p.stderr
    assert "Traceback" not in p.stderr + p.stdout
    assert not (Path("/proc") / "edgetune-report").exists()


def test_judge_cli_end_to_end_json_report_and_records(tmp_path, monkeypatch):
    home = tmp_path / "home"
    names = ["gemm_naive.c", "gemm_blocked.c", "gemm_odd_sizes.c", "gemm_oob_write.c", "gemm_network.c",
             "gemm_mutate_input.c"]
    report = tmp_path / "report"
    db = tmp_path / "j.db"
    p = _cli("judge", "--op", "gemm:M=32,N=24,K=16", *[str(KERNELS / n) for n in names], "--rounds", "3",
             "--budget-ms", "10", "--report-dir", str(report), "--db", str(db), "-f", "json", home=home, check_rc=0)
    doc = json.loads(p.stdout)
    assert doc["schema"] == "edgetune.judge/1" and doc["odd_shape"] == "gemm:M=31,N=23,K=15"
    got = {r["kernel"]: ("correct" if r["correct"] else r["failure"]) for r in doc["results"]}
    assert got["gemm_naive.c"] == got["gemm_blocked.c"] == "correct"
    assert got["gemm_odd_sizes.c"] in ("wrong-output", "non-finite")  # right on multiples of 8, not at 31x23x15
    assert any(c["spec"] == doc["odd_shape"] and c["ok"] is False for r in doc["results"] for c in r["checks"]
               if r["kernel"] == "gemm_odd_sizes.c")
    assert got["gemm_oob_write.c"] in ("out-of-bounds-write", "out-of-bounds-access")
    assert got["gemm_network.c"] == "forbidden-network"
    assert got["gemm_mutate_input.c"] == "input-mutated"
    for r in doc["results"]:
        assert set(r["fast"]) == {"1", "1.5", "2"}
        if r["correct"]:
            s = r["speed"]
            assert s["baseline"] and s["ci95"][0] <= s["speedup"] <= s["ci95"][1] and s["rounds"] == 3
            assert len(r["round_samples_ns"]) == 3 and r["sandbox"] == "seccomp" and r["handshake_ns"] > 0
            assert r["build"]["command"][0].endswith(("cc", "gcc")) and "-O3" in r["build"]["command"]
        else:
            assert r["errors"] and not any(r["fast"].values())
    (dev,) = doc["devices"]
    assert dev["leaderboard"]["correct"] == 2 and dev["baseline"]["form"]
    # evidence: the report and the database hold the same run, every sample
    stored = json.loads((report / "judge.json").read_text())
    assert stored["results"] == doc["results"]
    md = (report / "judge.md").read_text()
    assert "fast_1" in md and "gemm_blocked.c" in md
    con = sqlite3.connect(db)
    try:
        kinds = [json.loads(c)["kind"] for (c,) in con.execute("SELECT config FROM runs")]
        n = con.execute("SELECT COUNT(*) FROM records WHERE run_id = ?", (dev["run_id"],)).fetchone()[0]
    finally:
        con.close()
    assert kinds == ["judge"] and n >= 2 * 3 + 4  # two kernels x 3 rounds + odd-size checks + baselines
    # the package re-runs: rerun.sh judges the same kernels again (measured afresh, nothing read back)
    env = {**os.environ, "EDGETUNE_HOME": str(home), "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    p = subprocess.run(["sh", str(report / "rerun.sh"), "--rounds", "1", "--no-baseline", "--db", str(db), "-f", "json"],
                       capture_output=True, text=True, env=env, timeout=900)
    assert p.returncode == 0, p.stderr[-2000:]
    again = json.loads(p.stdout)
    assert {r["kernel"]: r["correct"] for r in again["results"]} == {r["kernel"]: r["correct"] for r in doc["results"]}
    assert {r["artifact_sha256"] for r in again["results"]} == {r["artifact_sha256"] for r in doc["results"]}
    assert (report / "rerun" / "judge.json").is_file()
    # the Python API gives the same document
    from edgetune import api

    monkeypatch.setenv("EDGETUNE_HOME", str(home))
    via_api = api.judge("gemm:M=32,N=24,K=16", [str(KERNELS / "gemm_naive.c")], rounds=1, baseline=False, db=str(db))
    assert via_api["schema"] == "edgetune.judge/1" and via_api["results"][0]["correct"]
    # the table form of the same judgement
    p = _cli("judge", "--op", "gemm:M=32,N=24,K=16", str(KERNELS / "gemm_naive.c"), str(KERNELS / "gemm_file.c"),
             "--rounds", "3", "--budget-ms", "10", "--no-baseline", "--db", str(db), home=home, check_rc=0)
    assert "forbidden-file" in p.stdout and "1/2 correct" in p.stdout


def test_unreachable_device_is_one_line_and_leaves_no_report_dir(tmp_path):
    import socket

    home = tmp_path / "home"
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now
    key = tmp_path / "key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    _cli("devices", "add", "gone", f"ssh://nobody@127.0.0.1:{port}", "--key", str(key), home=home, check_rc=0)
    report = tmp_path / "out" / "report"
    p = _cli("judge", "--op", "gemm:M=8,N=8,K=8", str(KERNELS / "gemm_naive.c"), "-d", "gone", "--report-dir",
             str(report), home=home)
    lines = [x for x in p.stderr.splitlines() if x.strip() and not x.startswith("judging")]
    assert p.returncode == 3 and len(lines) == 1 and lines[0].startswith("error:"), p.stderr  # 3: device
    assert "Traceback" not in p.stderr and not report.exists()
