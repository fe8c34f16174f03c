"""The Python agent's session (device_agents/PROTOCOL.md "The session"): one agent process per
device connection serves every runtime configuration, each job still in its own fork under its
own supervisor; a job the session does not serve goes by run-stdio; a session that stops answering
is killed at the job's deadline and the next job opens another; a session killed mid-job leaves
nothing of the job running."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from edgetune.agent.bundle import python_agent
from edgetune.agent.host import ANSWER_MARGIN_S, MAX_LOAD_SCALE, AgentClient, Job
from edgetune.devices.inventory import DeviceSpec
from tests.fixtures.tiny import build_tiny
from tests.unit.test_zygote import bundle, request


def _gone(pid: int, within: float = 10.0) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                if f.read().rsplit(b")", 1)[1].split()[0] == b"Z":
                    return True
        except FileNotFoundError:
            return True
        time.sleep(0.05)
    return False


def _running(cmdline: bytes) -> list[int]:
    out = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                if Path(f"/proc/{pid}/cmdline").read_bytes() == cmdline and not _gone(int(pid), 0):
                    out.append(int(pid))
            except OSError:
                continue
    return out


@pytest.fixture
def tiny(tmp_path):
    return build_tiny(tmp_path / "tiny.onnx")


def _job(tiny: Path, budget_ms: float = 5.0, timeout_s: float = 60.0, min_iters: int = 3, **params) -> Job:
    import numpy as np

    x = np.random.default_rng(1).standard_normal((4, 16)).astype(np.float32)
    return Job(backend="ort", artifact=tiny, params=params, input_names=["x"], input_sets=[[x]],
               output_specs=[{"name": "y", "dtype": "float32", "shape": [4, 8]}], budget_ms=budget_ms,
               warmup_ms=2.0, timeout_s=timeout_s, min_iters=min_iters, max_iters=max(100_000, min_iters))


def _client(tmp_path: Path) -> AgentClient:
    return AgentClient(DeviceSpec("dev", "local", {"workdir": str(tmp_path / "wd")}))


def test_a_session_that_stops_answering_is_killed_at_the_deadline_and_the_next_job_opens_another(tmp_path, tiny):
    client = _client(tmp_path)
    try:
        res = client.run_job(_job(tiny))
        assert res.status == "ok" and res.limits_enforced["isolation"] == "fork of the agent session", res.reason
        stuck = client._session.proc.pid
        os.kill(stuck, signal.SIGSTOP)  # it reads nothing more, answers nothing
        job = _job(tiny, timeout_s=3.0)
        wait = client.answer_wait_s(job)  # 3 s, and longer on a busy machine (load_factor)
        assert 3.0 <= wait <= 3.0 + ANSWER_MARGIN_S * (MAX_LOAD_SCALE - 1)
        t0 = time.monotonic()
        res = client.run_job(job)
        took = time.monotonic() - t0
        m = re.fullmatch(r"hung: no result within ([0-9.]+) s \(killed\)", res.reason)
        assert res.status == "timeout" and m, res.reason
        assert took >= float(m.group(1)) - 0.01 and abs(float(m.group(1)) - wait) < 1.0 and took < wait + 7
        assert _gone(stuck)
        res = client.run_job(_job(tiny))
        assert res.status == "ok" and client.sessions_opened == 2, res.reason
    finally:
        client.close()
    assert not list((tmp_path / "wd" / "jobs").iterdir())


def test_a_bound_the_supervisor_enforces_fails_the_job_and_the_session_serves_on(tmp_path, tiny):
    client = _client(tmp_path)
    try:
        # far more timed calls than the job's time bound allows: the supervisor stops it (timeout_s - 2 s),
        # and answers before the host stops waiting, on a loaded machine too (answer_wait_s)
        res = client.run_job(_job(tiny, timeout_s=4.0, min_iters=10**9))
        assert res.status == "timeout" and res.limit == "time" and "hung: still running after" in res.reason, res.reason
        assert "(limit 2 s)" in res.reason
        res = client.run_job(_job(tiny))
        assert res.status == "ok" and client.sessions_opened == 1, res.reason
    finally:
        client.close()


def test_a_job_the_session_does_not_serve_runs_by_run_stdio_beside_it(tmp_path, tiny):
    from tests.conformance import suite

    client = _client(tmp_path)
    case = suite.mlp_case(suite.build_mlp(tmp_path / "mlp.onnx"))
    try:
        assert client.run_job(_job(tiny)).status == "ok"
        v, res = suite.run_case(client, case, "adapter", suite.ADAPTERS / "correct.py", model=tmp_path / "mlp.onnx",
                                timeout_s=60)
        assert v.ok, v.reason
        assert res.limits_enforced["isolation"] == "fresh process"  # code a candidate brings: a process of its own
        res = client.run_job(_job(tiny))
        assert res.limits_enforced["isolation"] == "fork of the agent session" and client.sessions_opened == 1
    finally:
        client.close()


def test_closing_the_client_ends_its_session(tmp_path, tiny):
    client = _client(tmp_path)
    assert client.run_job(_job(tiny)).status == "ok"
    pid = client._session.proc.pid
    client.close()
    assert _gone(pid)


def test_a_session_killed_mid_job_leaves_nothing_of_the_job_running(tmp_path, tiny):
    """At the agent: the session is SIGKILLed while its job runs (what the host's kill does); the
    job's supervisor, in a process group of its own, gets SIGTERM from the kernel (PDEATHSIG),
    stops its worker, sweeps and removes the job dir."""
    agent = tmp_path / "agent" / "edgetune_agent.py"
    agent.parent.mkdir()
    shutil.copyfile(python_agent(), agent)
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    argv = [sys.executable, "-S", str(agent), "session", str(jobs)]
    p = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                         start_new_session=True)
    try:
        assert p.stdout.readline().startswith(b"EDGETUNE-SESSION 3 ")
        req = json.dumps(request(tmp_path, tiny, min_iters=10**9, max_iters=10**9)).encode()
        jid = uuid.uuid4().hex[:16]
        p.stdin.write(b"JOB %s %d\n" % (jid.encode(), len(req)) + req)
        p.stdin.flush()
        deadline = time.monotonic() + 20
        while not (jobs / jid / "agent.log").exists():  # the worker is up
            assert time.monotonic() < deadline
            time.sleep(0.05)
        time.sleep(0.5)
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
        deadline = time.monotonic() + 15
        while (jobs / jid).exists() or _running(b"\0".join(os.fsencode(a) for a in argv) + b"\0"):
            assert time.monotonic() < deadline, "the job outlived its session"
            time.sleep(0.05)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()


def test_the_session_refuses_what_it_does_not_serve_and_a_bad_header_ends_it(tmp_path, tiny):
    agent = tmp_path / "agent" / "edgetune_agent.py"
    agent.parent.mkdir()
    shutil.copyfile(python_agent(), agent)
    p = subprocess.Popen([sys.executable, "-S", str(agent), "session", str(tmp_path / "jobs")],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    try:
        assert p.stdout.readline().startswith(b"EDGETUNE-SESSION 3 ")
        for extra in ({"backend": "adapter"}, {"params": {"custom_ops_library": "/x.so"}}, {"fresh_process": True}):
            req = json.dumps(request(tmp_path, tiny, **extra)).encode()
            p.stdin.write(b"JOB 0123456789abcdef %d\n" % len(req) + req)
            p.stdin.flush()
            assert p.stdout.readline() == b"RESULT 0123456789abcdef refused 0 0\n"
        req = json.dumps(request(tmp_path, tiny)).encode()
        p.stdin.write(b"JOB 00112233aabbccdd %d\n" % len(req) + req)
        p.stdin.flush()
        head = p.stdout.readline().split()
        assert head[:3] == [b"RESULT", b"00112233aabbccdd", b"0"], head
        out, _ = p.stdout.read(int(head[3])), p.stdout.read(int(head[4]))
        assert json.loads(bundle(out)["result.json"])["status"] == "ok"
        p.stdin.write(b"JOB ../../etc 5\nhello")
        p.stdin.flush()
        assert p.stdout.readline() == b"ERROR bad job header\n"
        assert p.wait(timeout=10) == 2
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


def test_an_agent_file_rewritten_under_an_open_session_changes_nothing_that_runs(tmp_path, tiny):
    """The session runs the agent it was started from (checked right before), from memory: a file
    rewritten on the device afterwards runs nowhere. The next job that starts the agent file (an
    adapter, by run-stdio) finds it changed and pushes ours again, as before every such job."""
    from tests.conformance import suite

    client = _client(tmp_path)
    mlp = suite.build_mlp(tmp_path / "mlp.onnx")
    try:
        assert client.run_job(_job(tiny)).status == "ok"
        agent = tmp_path / "wd" / "agent" / "edgetune_agent.py"
        genuine = agent.read_bytes()
        agent.write_text("import sys\nsys.stdout.write('EDGETUNE-BUNDLE 1\\nEND\\n')\n")  # a forger
        res = client.run_job(_job(tiny))
        assert res.status == "ok" and res.limits_enforced["isolation"] == "fork of the agent session", res.reason
        assert client.agent_repushes == 0 and client.sessions_opened == 1
        v, _ = suite.run_case(client, suite.mlp_case(mlp), "adapter", suite.ADAPTERS / "correct.py", model=mlp,
                              timeout_s=60)
        assert v.ok, v.reason
        assert client.agent_repushes == 1 and agent.read_bytes() == genuine
    finally:
        client.close()
