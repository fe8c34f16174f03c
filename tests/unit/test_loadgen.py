"""edgetune bench --loadgen: a configuration under MLPerf LoadGen on the local device (shortened runs)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import require_module

require_module("mlperf_loadgen")  # the [mlperf] extra, in [all]: fails in CI when missing

import models  # noqa: E402
from edgetune.db import Store  # noqa: E402
from edgetune.devices.inventory import Inventory  # noqa: E402
from edgetune.loadgen import SHORTENED, run_loadgen  # noqa: E402
from edgetune.tune import tune  # noqa: E402
from edgetune.tune_config import TuneConfig  # noqa: E402

EDGETUNE = [sys.executable, "-m", "edgetune.cli.main"]
SHORT = ["--loadgen-queries", "64", "--loadgen-seconds", "1"]


def run(args, home, timeout=120, env_extra=None):
    env = {**os.environ, "EDGETUNE_HOME": str(home), "COLUMNS": "200", **(env_extra or {})}
    return subprocess.run(EDGETUNE + list(args), capture_output=True, text=True, timeout=timeout, env=env)


def one_line_error(p, needle):
    assert p.returncode != 0, p.stdout
    assert "Traceback" not in p.stderr and "Traceback" not in p.stdout
    lines = [l for l in p.stderr.strip().splitlines() if l.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), p.stderr
    assert needle in lines[0], lines[0]


@pytest.fixture(scope="module")
def transformer(tmp_path_factory) -> Path:
    return models.build_onnx("transformer", tmp_path_factory.mktemp("lg") / "transformer.onnx")


@pytest.fixture(scope="module")
def tuned(transformer, tmp_path_factory):
    """A database holding a brief tune of the transformer: (db path, a non-default onnxruntime key)."""
    db = tmp_path_factory.mktemp("lgdb") / "t.db"
    cfg = TuneConfig(budget_s=1.5, rounds=1, finalists=1, timeout_s=20, spaces=("ort",), max_candidates=2,
                     confirm_rounds=1)
    tune(str(transformer), ["local"], db=str(db), config=cfg)
    store = Store(str(db))
    try:
        keys = {r.candidate_key: r.candidate for r in store.records() if not r.candidate.get("baseline")}
    finally:
        store.close()
    assert keys
    key = sorted(keys)[0]
    return db, key, keys[key]


def test_singlestream_stored_candidate_json(transformer, tuned, tmp_path):
    db, key, cand = tuned
    p = run(["bench", str(transformer), "--config", key, "--db", str(db), "--loadgen", "singlestream", *SHORT,
             "-f", "json"], tmp_path / "home")
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert doc["schema"] == "edgetune.loadgen/1" and doc["scenario"] == "SingleStream"
    assert doc["candidate"]["key"] == key and doc["candidate"]["params"] == cand["params"]
    assert doc["ok"] and doc["shortened"] and doc["label"] == SHORTENED and doc["mlperf_valid"] is False
    assert doc["seed_source"] == "fresh" and doc["seed"] != 0  # never the tune's inputs
    assert SHORTENED in doc["verdict"]["edgetune"]
    assert doc["verdict"]["loadgen"] in ("VALID", "INVALID") and doc["loadgen"]["result"] == doc["verdict"]["loadgen"]
    f = doc["figures"]
    assert f["p90_latency_ms"] > 0 and f["queries"] >= 64 and f["duration_s"] > 0
    assert doc["completed_queries"] >= 64
    assert 0 < doc["checked"]["queries"] <= doc["checked"]["of"] == doc["completed_queries"]
    assert doc["loadgen"]["summary"]["Scenario"] == "SingleStream"


def test_offline_default_table(transformer, tmp_path):
    p = run(["bench", str(transformer), "--config", "default", "--loadgen", "offline", *SHORT], tmp_path / "home")
    assert p.returncode == 0, p.stderr
    out = p.stdout
    assert "MLPerf LoadGen Offline: ort default" in out
    assert "samples per second" in out and "outputs checked" in out
    assert SHORTENED in out and "Result is : " in out
    sps = next(l for l in out.splitlines() if "samples per second" in l).split("|")[2].strip()
    assert float(sps) > 0


def test_wrong_outputs_are_reported_failed_without_a_figure(transformer):
    def corrupt(index, outs):  # a configuration whose outputs are off by 1 everywhere
        return [o + 1.0 for o in outs]

    for scenario in ("singlestream", "offline"):
        doc = run_loadgen(str(transformer), "default", scenario, queries=16, seconds=0.2, check=4,
                          output_hook=corrupt)
        assert not doc["ok"] and doc["code"] == "wrong-output", doc["reason"]
        assert doc["figures"] == {} and doc["verdict"]["edgetune"] == "FAILED"
        assert doc["verdict"]["loadgen"] in ("VALID", "INVALID")


def test_another_device_is_one_line(transformer, tmp_path):
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    Inventory(home / "devices.toml").add("board", "ssh://pi@board.invalid")
    p = run(["bench", str(transformer), "--config", "default", "--loadgen", "singlestream", "-d", "board"], home)
    one_line_error(p, "LoadGen runs on the local device only")
    assert "in the process that times them" in p.stderr


def test_missing_loadgen_names_the_extra(transformer, tmp_path):
    fake = tmp_path / "fake"
    fake.mkdir()
    (fake / "mlperf_loadgen.py").write_text("raise ImportError('not installed')\n")
    p = run(["bench", str(transformer), "--config", "default", "--loadgen", "offline"], tmp_path / "home",
            env_extra={"PYTHONPATH": os.pathsep.join([str(fake), os.environ.get("PYTHONPATH", "")])})
    one_line_error(p, "pip install 'edgetune[mlperf]'")


def test_a_run_that_raises_fails_the_configuration_and_loadgen_still_finishes(transformer):
    def always(index, outs):
        raise RuntimeError("boom")

    doc = run_loadgen(str(transformer), "default", "singlestream", queries=16, seconds=0.2, output_hook=always)
    assert not doc["ok"] and doc["code"] == "run-failed" and "boom" in doc["reason"] and doc["figures"] == {}

    calls = [0]

    def later(index, outs):  # the warm-up (at most 50 runs) passes; queries on LoadGen's thread raise
        calls[0] += 1
        if calls[0] > 50:
            raise RuntimeError("boom on LoadGen's thread")
        return outs

    doc = run_loadgen(str(transformer), "default", "singlestream", queries=16, seconds=1, output_hook=later)
    assert not doc["ok"] and doc["code"] == "run-failed" and "LoadGen's thread" in doc["reason"]
    assert doc["figures"] == {} and doc["completed_queries"] >= 16 and doc["verdict"]["loadgen"]
