"""edgetune zoo bench through the CLI: two small models (a vision net and a decoder) on this machine
with a tiny budget: the edgetune.zoo-bench/1 document, every shape point, ratios that agree with
their intervals and verdicts, the runs stored as ordinary tune runs; bad input as one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from edgetune.measure import MIN_VERDICT_ROUNDS


def _cli(*args, home, check_rc=None):
    env = {**os.environ, "EDGETUNE_HOME": str(home), "COLUMNS": "250"}
    env.pop("EDGETUNE_DB", None)
    p = subprocess.run([sys.executable, "-m", "edgetune.cli.main", *args], capture_output=True, text=True, env=env,
                       timeout=600)
    if check_rc is not None:
        assert p.returncode == check_rc, (p.returncode, p.stdout[-3000:], p.stderr[-3000:])
    return p


def _check_ratio(r, identity_word):
    if r is None:
        return
    if r["verdict"] and r["verdict"].startswith("is the "):
        assert identity_word in r["verdict"] and r["ratio"] == 1.0 and r["ci95"] == [1.0, 1.0]
        return
    lo, hi = r["ci95"]
    assert lo <= r["ratio"] <= hi and lo > 0, r
    if r["rounds"] is not None and r["rounds"] < MIN_VERDICT_ROUNDS:
        assert r["verdict"] == "insufficient rounds"
    elif lo > 1.0:
        assert r["verdict"] == "faster"
    elif hi < 1.0:
        assert r["verdict"] == "slower"
    else:
        assert r["verdict"] == "no significant difference"


def test_points_per_family():
    from edgetune.zoo_bench import points

    assert [p["dims"]["batch"] for p in points("resnet50", "full")] == [1, 8, 32]
    assert [p["dims"]["batch"] for p in points("unet", "small")] == [1, 8, 32]
    bert_full = [(p["dims"]["seq"], p["dims"]["batch"]) for p in points("bert_base", "full")]
    assert bert_full == [(32, 1), (32, 8), (128, 1), (128, 8), (512, 1), (512, 8)]
    bert_small = [(p["dims"]["seq"], p["dims"]["batch"]) for p in points("bert_base", "small")]
    assert bert_small == [(32, 1), (32, 8), (64, 1), (64, 8)]  # small max_pos is 64
    assert [p["dims"] for p in points("whisper_encoder", "full")] == [{"batch": 1}, {"batch": 8}]
    for name in ("gpt2", "llama"):
        assert [p["dims"] for p in points(name, "full")] == [{"batch": 1, "seq": 128, "past": 0},
                                                             {"batch": 1, "seq": 1, "past": 128}]
        # small context is 128: the decode step after 127 tokens
        assert [p["dims"] for p in points(name, "small")] == [{"batch": 1, "seq": 128, "past": 0},
                                                              {"batch": 1, "seq": 1, "past": 127}]


def test_zoo_bench_a_decoder(tmp_path):
    db = tmp_path / "bench.db"
    p = _cli("zoo", "bench", "gpt2", "--size", "small", "-d", "local", "--budget", "1",
             "--space", "ort", "--max-candidates", "1", "--rounds", "1", "--finalists", "1",
             "--db", str(db), "-f", "json", home=tmp_path, check_rc=0)
    doc = json.loads(p.stdout)
    assert doc["schema"] == "edgetune.zoo-bench/1" and doc["size"] == "small" and doc["devices"] == ["local"]
    assert doc["wall_s"] > 0
    want = {"gpt2": ["prefill seq=128", "decode past=127"]}  # every family's points: the shape-point tests above
    assert [m["name"] for m in doc["models"]] == list(want)
    run_ids = set()
    for m in doc["models"]:
        assert [r["status"] for r in m["runs"]] == ["complete"]
        run_ids.add(m["runs"][0]["run_id"])
        assert [s["point"] for s in m["shapes"]] == want[m["name"]]
        for s in m["shapes"]:
            assert s["run_id"] == m["runs"][0]["run_id"]
            assert s["config"]["label"] and s["config"]["key"] and s["median_ns"] > 0
            assert set(s["vs_strongest"]) >= {"baseline", "ratio", "ci95", "verdict"}
            assert s["vs_strongest"]["baseline"]["label"] and s["vs_strongest"]["baseline"]["key"]
            assert s["vs_default"] is not None and set(s["vs_default"]) >= {"ratio", "ci95", "verdict"}
            _check_ratio(s["vs_default"], "onnxruntime default")
            _check_ratio(s["vs_strongest"], "strongest baseline")
            if s["contender"]:
                _check_ratio(s["contender"]["vs_strongest"], "strongest baseline")
                _check_ratio(s["contender"]["vs_default"], "onnxruntime default")
        if m["name"] == "gpt2":
            assert [s["shape"] for s in m["shapes"]] == [{"batch": 1, "seq": 128, "past": 0},
                                                          {"batch": 1, "seq": 1, "past": 127}]
    assert len(run_ids) == 1
    # ordinary tune runs in the database: db ls lists them, complete
    ls = _cli("db", "ls", "--db", str(db), home=tmp_path, check_rc=0).stdout
    for rid in run_ids:
        assert rid in ls
    from edgetune.db import Store

    store = Store(str(db), create=False)
    try:
        for rid in run_ids:
            assert store.get_run(rid)["status"] == "complete"
    finally:
        store.close()


@pytest.mark.parametrize("args,needle", [
    (["zoo", "bench", "nosuchnet"], "unknown zoo model"),
    (["zoo", "bench", "gpt2", "--size", "huge"], "--size"),
    (["zoo", "bench", "gpt2", "-d", "nosuchdevice"], "nosuchdevice"),
    (["zoo", "bench", "gpt2", "--budget", "0"], "--budget"),
    (["zoo", "bench", "gpt2", "--space", "nosuchspace"], "nosuchspace"),
])
def test_zoo_bench_bad_input_is_one_line(tmp_path, args, needle):
    p = _cli(*args, home=tmp_path)
    lines = [x for x in p.stderr.splitlines() if x.strip()]
    assert p.returncode != 0 and len(lines) == 1 and needle in lines[0], p.stderr
    assert "Traceback" not in p.stderr
