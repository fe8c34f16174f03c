"""A device's per-job bounds are the user's to set (``devices add --memory-mb/--max-procs``), and a
job stopped at the memory bound says how to raise it."""

from __future__ import annotations

import json

import pytest

from tests.unit.test_cli import assert_one_line_error, run


@pytest.fixture
def home(tmp_path):
    return tmp_path / "home"


def test_memory_bound_is_set_per_device_and_named_when_hit(tiny_model, adapters, tmp_path, home):
    p = run(["devices", "add", "small", "local", "--memory-mb", "256", "--max-procs", "64"], home)
    assert p.returncode == 0, p.stderr
    toml = (home / "devices.toml").read_text()
    assert "memory_mb = 256" in toml and "max_procs = 64" in toml
    p = run(["tune", str(tiny_model), "-d", "small", "--space", "ort", "--max-candidates", "1", "--budget", "3",
             "--rounds", "1", "--finalists", "1", "--adapter", str(adapters / "hog.py"), "--db", str(tmp_path / "t.db"),
             "--format", "json"], home)
    assert p.returncode == 0, p.stderr
    cands = json.loads(p.stdout)["runs"][0]["shapes"][0]["candidates"]
    hog = next(c for c in cands if c["candidate"]["backend"] == "adapter")
    assert hog["status"] == "failed" and "--memory-mb N" in hog["reason"], hog["reason"]
    assert_one_line_error(run(["devices", "add", "tiny", "local", "--memory-mb", "1"], home), 2)
