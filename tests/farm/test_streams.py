"""Every transport's ``open_stream`` (the agent session's channel, device_agents/PROTOCOL.md "The
session") against the real parts: a local process, OpenSSH's sshd and the adb server with the
adbd emulator, all on 127.0.0.1 (their processes run on this machine, so /proc shows them); and
the agent's session over ssh, through the host's real path."""

from __future__ import annotations

import hashlib
import os
import sys
import time

import numpy as np
import pytest

from edgetune.devices.base import StreamTimeout
from edgetune.devices.local import LocalTransport
from tests.farm.adb_fixtures import adb_transport_for
from tests.farm.ssh_fixtures import transport_for
from tests.farm.test_ssh_transport import _gone


@pytest.fixture(params=["local", "ssh", "adb"])
def transport(request):
    if request.param == "local":
        t = LocalTransport()
    elif request.param == "ssh":
        t = transport_for(request.getfixturevalue("ssh_farm"))
    else:
        t = adb_transport_for(request.getfixturevalue("adb_farm"))
    yield t
    t.close()


def _first_line(stream) -> int:
    line = stream.read_line(time.monotonic() + 20)
    assert line is not None and line.isdigit(), line
    return int(line)


def test_a_stream_carries_many_exchanges_both_ways_and_ends_when_its_input_does(transport):
    # as the session speaks: each request read whole before its answer (sent across many packets)
    s = transport.open_stream(["sh", "-c", "echo $$; read n; head -c $n | sha256sum; exec cat"])
    pid = _first_line(s)
    blob = np.random.default_rng(3).integers(0, 256, 300_000, dtype=np.uint8).tobytes()
    s.send(b"%d\n" % len(blob) + blob)
    assert s.read_line(time.monotonic() + 30) == hashlib.sha256(blob).hexdigest().encode() + b"  -"
    for k in range(3):
        s.send(b"line %d\n" % k)
        assert s.read_line(time.monotonic() + 20) == b"line %d" % k
    s.send(b"tail")
    assert s.read_exact(4, time.monotonic() + 20) == b"tail"
    s.close()  # EOF on its stdin: cat ends
    assert _gone(pid)


def test_a_silent_stream_times_out_and_a_killed_one_leaves_nothing(transport):
    s = transport.open_stream(["sh", "-c", "echo $$; sleep 300 & echo $!; exec cat"])
    pid, child = _first_line(s), _first_line(s)
    t0 = time.monotonic()
    with pytest.raises(StreamTimeout):
        s.read_line(time.monotonic() + 0.5)
    assert 0.4 < time.monotonic() - t0 < 5
    s.kill()  # its process group: the command and what it started
    assert _gone(pid) and _gone(child)


def test_a_stream_whose_command_exits_reads_as_eof(transport):
    s = transport.open_stream(["sh", "-c", "echo bye; echo oops >&2; exit 3"])
    assert s.read_line(time.monotonic() + 20) == b"bye"
    assert s.read_line(time.monotonic() + 20) is None
    s.close()


def test_jobs_over_ssh_run_on_one_agent_session(ssh_farm, tmp_path, monkeypatch):
    """The host's real path over sshd: the device's runtime configurations all run on one agent
    session, each verified as before; killing the session mid-job (the host gave up on it) stops
    and sweeps its job, and the next job opens a new session."""
    from edgetune.db import Store
    from edgetune.devices.inventory import Inventory
    from edgetune.modelfile import load_model
    from edgetune.space import Prepared
    from edgetune.tune import DeviceTuner
    from edgetune.tune_config import TuneConfig
    from edgetune.workload import build_workload
    from tests.fixtures.tiny import build_tiny

    monkeypatch.setenv("EDGETUNE_HOME", str(tmp_path / "home"))
    inv = Inventory(tmp_path / "devices.toml")
    f = ssh_farm
    inv.add("dev", f"ssh://{f['user']}@{f['host']}:{f['port']}", key=f["key"], known_hosts=f["known_hosts"],
            python=sys.executable, workdir=str(tmp_path / "wd"))
    model = load_model(build_tiny(tmp_path / "tiny.onnx"))
    wl = build_workload(model, {"batch": 4})
    tuner = DeviceTuner(inv.get("dev"), Store(":memory:"), TuneConfig(spaces=()))
    try:
        for _ in range(3):
            res = tuner._job(wl, Prepared("ort", model.path, {}), budget_ms=5.0)
            assert res.status == "ok", res.reason
            assert res.limits_enforced["isolation"] == "fork of the agent session"
        client = tuner.client
        assert client.sessions_opened == 1
        session_pid = client._session._pid
        client._drop_session(kill=True)
        assert _gone(session_pid)
        res = tuner._job(wl, Prepared("ort", model.path, {}), budget_ms=5.0)
        assert res.status == "ok" and client.sessions_opened == 2, res.reason
    finally:
        if tuner.client is not None:
            tuner.client.close()
    assert not os.listdir(tmp_path / "wd" / "jobs")
