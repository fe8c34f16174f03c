"""tools/farm/ssh_farm.py as a command: start prints JSON, stop kills by PID."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from tests.conftest import require
from tests.farm.ssh_fixtures import transport_for

FARM = Path(__file__).resolve().parents[2] / "tools" / "farm" / "ssh_farm.py"


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except FileNotFoundError:
        return False


def test_cli_start_stop(ssh_farm_module, tmp_path):
    missing = ssh_farm_module.missing_parts()
    require(not missing, "; ".join(missing))
    state = tmp_path / "state dir"
    r = subprocess.run([sys.executable, str(FARM), "start", "--state", str(state)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    info = json.loads(r.stdout)
    try:
        assert {"host", "port", "user", "key", "known_hosts", "pid"} <= set(info)
        assert info["host"] == "127.0.0.1" and info["port"] > 1024
        assert _alive(info["pid"])
        t = transport_for(info)
        assert t.run(["echo", "hi"], timeout=10).stdout == b"hi\n"
        # a session left open must not survive stop either
        t.close()
        t = transport_for(info)
        t.connect()
        sessions = ssh_farm_module.descendants(info["pid"])
        assert sessions
    finally:
        r = subprocess.run([sys.executable, str(FARM), "stop", "--state", str(state)],
                           capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and json.loads(r.stdout) == {"stopped": True}
    deadline = time.monotonic() + 5
    while any(_alive(p) for p in [info["pid"], *sessions]) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(_alive(p) for p in [info["pid"], *sessions])
    assert not (state / "farm.pid").exists()
    t.close()
