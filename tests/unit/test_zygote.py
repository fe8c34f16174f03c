"""The Python agent's zygote (device_agents/PROTOCOL.md "The zygote"): runtime configurations run
in a fork of a process that has the runtimes imported, under the same supervisor; everything else,
and every case where the zygote cannot be trusted to be ours, runs in a fresh process."""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import numpy as np
import pytest

from edgetune.agent.bundle import python_agent
from tests.conftest import require_module
from tests.fixtures.tiny import build_tiny

IDLE_S = "20"


@pytest.fixture
def agent(tmp_path):
    """A private copy of the agent (its own zygote) and the tiny model; its zygote is stopped after."""
    a = tmp_path / "agent" / "edgetune_agent.py"
    a.parent.mkdir()
    shutil.copyfile(python_agent(), a)
    yield a
    for pid in zygotes(a):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


@pytest.fixture
def tiny(tmp_path):
    return build_tiny(tmp_path / "tiny.onnx")


def zygotes(agent: Path) -> list[int]:
    want = b"\0".join(os.fsencode(x) for x in (sys.executable, os.path.realpath(agent), "serve")) + b"\0"
    out = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                if Path(f"/proc/{pid}/cmdline").read_bytes() == want:
                    out.append(int(pid))
            except OSError:
                continue
    return out


def zygote_name(agent: Path) -> str:
    key = hashlib.sha256(f"{os.getuid()}:{os.path.realpath(agent)}".encode()).hexdigest()[:32]
    return "\0edgetune-zygote-" + key


def wait_zygote(agent: Path, present: bool = True, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        up = bool(zygotes(agent))
        if up and present:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                s.connect(zygote_name(agent))  # bound: it serves (the connection it gets is dropped)
                return
            except OSError:
                pass
            finally:
                s.close()
        elif not up and not present:
            return
        time.sleep(0.05)
    raise AssertionError(f"zygote {'never came up' if present else 'still running'}")


def request(tmp_path: Path, model: Path, backend: str = "ort", **extra) -> dict:
    x = np.random.default_rng(5).standard_normal((4, 16)).astype(np.float32)
    xp = tmp_path / "x.npy"
    np.save(xp, x)
    art = model
    req = {"protocol": 3, "backend": backend, "artifact": str(art),
           "artifact_sha256": hashlib.sha256(art.read_bytes()).hexdigest(), "params": {}, "input_names": ["x"],
           "inputs": [[str(xp)]], "outputs": [{"name": "y", "dtype": "float32", "shape": [4, 8]}],
           "warmup_ms": 2.0, "budget_ms": 5.0, "min_iters": 5, "max_iters": 1000, "fresh_seed": 7,
           "check_iters": 2, "check_fastest": 1, "probe_pairs": 2,
           "limits": {"memory_mb": 1024, "max_procs": 16, "timeout_s": 30}, "max_bundle_bytes": 10 << 20}
    req.update(extra)
    return req


def run(agent: Path, req: dict, env: dict | None = None, timeout: float = 60) -> tuple[dict, dict]:
    jobdir = agent.parent.parent / "jobs" / uuid.uuid4().hex[:10]
    e = {**os.environ, "EDGETUNE_AGENT_ZYGOTE_IDLE_S": IDLE_S, **(env or {})}
    p = subprocess.run([sys.executable, "-S", str(agent), "run-stdio", str(jobdir)], input=json.dumps(req).encode(),
                       capture_output=True, timeout=timeout, env=e)
    assert p.returncode == 0, p.stderr.decode(errors="replace")[-2000:]
    files = bundle(p.stdout)
    assert not jobdir.exists()
    return json.loads(files["result.json"]), files


def bundle(out: bytes) -> dict[str, bytes]:
    assert out.startswith(b"EDGETUNE-BUNDLE 1\n"), out[:200]
    pos, files = len(b"EDGETUNE-BUNDLE 1\n"), {}
    while True:
        nl = out.index(b"\n", pos)
        line = out[pos:nl].decode()
        if line == "END":
            assert nl + 1 == len(out)
            return files
        name, size = line.rsplit(" ", 1)
        files[name] = out[nl + 1:nl + 1 + int(size)]
        pos = nl + 1 + int(size)


def isolation(res: dict) -> str:
    assert res["status"] == "ok", res["reason"]
    return res["limits_enforced"]["isolation"]


def test_runtime_configurations_run_on_the_zygote_with_the_same_outputs(agent, tiny, tmp_path):
    first, f1 = run(agent, request(tmp_path, tiny))
    assert isolation(first) == "fresh process"  # no zygote yet: started after this job
    wait_zygote(agent)
    second, f2 = run(agent, request(tmp_path, tiny))
    assert isolation(second) == "fork of the zygote"
    assert f1["out_0_0.npy"] == f2["out_0_0.npy"]  # the same job, the same answer
    assert second["limits_enforced"]["leftovers"] == "subreaper" and second["leftover_processes"] == 0
    zpid = zygotes(agent)
    assert len(zpid) == 1
    third, _ = run(agent, request(tmp_path, tiny))
    assert isolation(third) == "fork of the zygote" and zygotes(agent) == zpid  # one zygote, kept


def test_code_a_candidate_brings_and_opt_outs_run_fresh(agent, tiny, tmp_path):
    run(agent, request(tmp_path, tiny))
    wait_zygote(agent)
    adapter = tmp_path / "ad.py"
    adapter.write_text(
        "import onnxruntime as ort\n"
        "def load(model_path, params):\n"
        "    s = ort.InferenceSession(model_path)\n"
        "    return lambda inputs: s.run(None, {'x': inputs[0]})\n")
    req = request(tmp_path, adapter, backend="adapter")
    req["model"] = {"path": str(tiny), "sha256": hashlib.sha256(tiny.read_bytes()).hexdigest()}
    res, _ = run(agent, req)
    assert res["limits_enforced"]["isolation"] == "fresh process"
    res, _ = run(agent, request(tmp_path, tiny, fresh_process=True))
    assert isolation(res) == "fresh process"
    lib = request(tmp_path, tiny)
    lib["params"] = {"custom_ops_library": "libx.so"}  # a hybrid's native code: never on the zygote
    res, _ = run(agent, lib)
    assert res["limits_enforced"]["isolation"] == "fresh process"


def test_a_torch_operator_runs_on_the_zygote_and_its_imports_leave_no_trace(agent, tiny, tmp_path):
    """A torch job names an operator the agent holds (no code comes with it), so on the CPU it is a
    runtime configuration: it runs on the zygote, which has PyTorch imported; what those imports set
    in the zygote's own environment (torch._dynamo: TORCHINDUCTOR_CACHE_DIR) does not make every
    client's environment differ from it (a stale zygote would send every job back to a fresh
    process). A torch job on "cuda" starts fresh (CUDA does not survive a fork)."""
    require_module("torch")
    run(agent, request(tmp_path, tiny))
    wait_zygote(agent)
    (zpid,) = zygotes(agent)
    art = tmp_path / "softmax.json"
    art.write_text(json.dumps({"op": "softmax", "params": {"M": 4, "N": 16}, "dtype": "float32"}))
    req = request(tmp_path, art, backend="torch", outputs=[{"name": "y", "dtype": "float32", "shape": [4, 16]}])
    req["params"] = {"device": "cpu", "num_threads": 1}
    for _ in range(2):
        res, files = run(agent, req)
        assert isolation(res) == "fork of the zygote", res
        assert zygotes(agent) == [zpid]  # the same zygote: not stale
    gpu = dict(req, params={"device": "cuda"})  # CUDA and fork do not mix: fresh (and here: no CUDA)
    fresh, _ = run(agent, gpu)
    assert fresh["limits_enforced"]["isolation"] == "fresh process" and "has no CUDA device" in fresh["reason"], fresh
    x = np.load(tmp_path / "x.npy").astype(np.float64)
    e = np.exp(x - x.max(axis=1, keepdims=True))
    y = np.load(io.BytesIO(files[res["outputs"][0][0]]))
    assert np.abs(y - e / e.sum(axis=1, keepdims=True)).max() < 1e-6


def wait_gone(pids: list[int], timeout: float = 20.0) -> None:
    """These zygote processes exit (a new zygote the fresh job's client starts may take their place)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not any(_alive(p) for p in pids):
            return
        time.sleep(0.05)
    raise AssertionError(f"zygote {pids} still running")


def test_a_changed_agent_file_or_import_time_environment_gets_a_fresh_process(agent, tiny, tmp_path):
    run(agent, request(tmp_path, tiny))
    wait_zygote(agent)
    old = zygotes(agent)
    res, _ = run(agent, request(tmp_path, tiny), env={"OMP_NUM_THREADS": "1"})
    assert isolation(res) == "fresh process"  # the zygote imported its runtimes under another value
    wait_gone(old)  # and it went: stale
    # the rest under the same environment as that job: the zygote its client started is not stale for
    # these clients (otherwise one of them starts another, which may read the agent file only after
    # it changed below, and serve the changed file: a race), so the agent file is the one difference
    omp = {"OMP_NUM_THREADS": "1"}
    run(agent, request(tmp_path, tiny), env=omp)
    wait_zygote(agent)
    old = zygotes(agent)
    agent.write_bytes(agent.read_bytes() + b"\n# changed\n")
    res, _ = run(agent, request(tmp_path, tiny), env=omp)
    assert isolation(res) == "fresh process"
    wait_gone(old)


def test_an_impostor_on_the_zygote_socket_is_not_trusted(agent, tiny, tmp_path):
    """A process of the same user holding the zygote's name but not being `python AGENT serve`
    (what a candidate's leftover would be) gets no job: the client runs it itself."""
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(zygote_name(agent))
    srv.listen(4)
    served = []

    def fake():
        srv.settimeout(30)
        try:
            conn, _ = srv.accept()
        except OSError:
            return
        served.append(1)
        try:
            conn.sendall(b"go 1\nrc 0\n")  # claims the job ran and succeeded
        except OSError:  # (the client has already hung up on it: what this test wants)
            pass
        conn.close()

    t = threading.Thread(target=fake, daemon=True)
    t.start()
    try:
        res, files = run(agent, request(tmp_path, tiny), env={"EDGETUNE_AGENT_ZYGOTE": "1"})
        assert isolation(res) == "fresh process" and "out_0_0.npy" in files
    finally:
        srv.close()
        t.join(5)


def test_a_killed_client_stops_its_job_on_the_zygote(agent, tiny, tmp_path):
    run(agent, request(tmp_path, tiny))
    wait_zygote(agent)
    req = request(tmp_path, tiny, budget_ms=60_000.0, min_iters=10_000_000, max_iters=10_000_000)
    req["limits"]["timeout_s"] = 60
    jobdir = agent.parent.parent / "jobs" / "killed"
    p = subprocess.Popen([sys.executable, "-S", str(agent), "run-stdio", str(jobdir)], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         env={**os.environ, "EDGETUNE_AGENT_ZYGOTE_IDLE_S": IDLE_S})
    p.stdin.write(json.dumps(req).encode())
    p.stdin.close()
    zpid = zygotes(agent)[0]
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and not _supervised_job(zpid):
        time.sleep(0.02)
    job = _supervised_job(zpid)
    assert job, "the zygote took the job"
    time.sleep(0.3)
    p.kill()  # SIGKILL: no relay; the supervisor sees its client hang up
    p.wait(10)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(_alive(pid) for pid in job):
        time.sleep(0.05)
    assert not any(_alive(pid) for pid in job), "the job's supervisor kept running after its client died"
    assert not jobdir.exists()


def _children(pid: int) -> list[int]:
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                stat = Path(f"/proc/{d}/stat").read_text()
                if int(stat[stat.rfind(")") + 2:].split()[1]) == pid:
                    out.append(int(d))
            except (OSError, ValueError):
                continue
    return out


def _supervised_job(zpid: int) -> list[int]:
    """The zygote's child that supervises a running worker, and that worker: not just any child of
    the zygote (wait_zygote's probe connection leaves one that exits at once and stays a zombie
    until the zygote's accept loop reaps it; taken for the job, it made the test look for the job
    dir before the real supervisor had noticed its client's death)."""
    for sup in _children(zpid):
        if _alive(sup):
            workers = [w for w in _children(sup) if _alive(w)]
            if workers:
                return [sup, *workers]
    return []


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2:][:1] != "Z"


def test_the_zygote_leaves_when_idle(agent, tiny, tmp_path):
    run(agent, request(tmp_path, tiny), env={"EDGETUNE_AGENT_ZYGOTE_IDLE_S": "1"})
    wait_zygote(agent)
    wait_zygote(agent, present=False, timeout=15)


def test_host_jobs_use_the_session_or_the_zygote_unless_the_device_opts_out(tmp_path, tiny):
    """Through the host's real path: a device's runtime configurations run on its agent's session
    (one agent process per connection, PROTOCOL.md "The session"); a device added with
    --no-session sends one run-stdio command per job, which the zygote serves once it is up; one
    added with --no-zygote runs every job in a fresh agent process."""
    from edgetune.db import Store
    from edgetune.devices.inventory import Inventory
    from edgetune.space import Prepared
    from edgetune.tune import DeviceTuner
    from edgetune.tune_config import TuneConfig
    from edgetune.modelfile import load_model
    from edgetune.workload import build_workload
    from tests.unit.test_cli import run as cli

    home = tmp_path / "home"
    for name, flag in (("plain", "--no-zygote"), ("stdio", "--no-session")):
        p = cli(["devices", "add", name, "local", flag], home)
        assert p.returncode == 0, p.stderr
    toml = (home / "devices.toml").read_text()
    assert "zygote = false" in toml and "session = false" in toml
    inv = Inventory(home / "devices.toml")
    inv.add("kept", "local", workdir=str(tmp_path / "wd-kept"))
    specs = {"kept": inv.get("kept"), "stdio": dataclasses_replace(inv.get("stdio"), tmp_path / "wd-stdio"),
             "plain": dataclasses_replace(inv.get("plain"), tmp_path / "wd-plain")}
    model = load_model(tiny)
    wl = build_workload(model, {"batch": 4})
    prep = Prepared("ort", model.path, {})
    seen, opened = {}, {}
    for name, spec in specs.items():
        tuner = DeviceTuner(spec, Store(":memory:"), TuneConfig(spaces=()))
        try:
            got = []
            for i in range(3):
                res = tuner._job(wl, prep, budget_ms=5.0)
                assert res.status == "ok", res.reason
                got.append(res.limits_enforced.get("isolation"))
                if i == 0 and name == "stdio":
                    agent = Path(tuner.client.workdir) / "agent" / "edgetune_agent.py"
                    wait_zygote(agent)
            seen[name], opened[name] = got, tuner.client.sessions_opened
        finally:
            if tuner.client is not None:
                tuner.client.close()
            for pid in zygotes(Path(spec.options.get("workdir", "")) / "agent" / "edgetune_agent.py"):
                os.kill(pid, signal.SIGKILL)
    assert seen["kept"] == ["fork of the agent session"] * 3 and opened["kept"] == 1  # one session, kept
    assert seen["stdio"] == ["fresh process", "fork of the zygote", "fork of the zygote"]
    assert seen["plain"] == ["fresh process"] * 3
    assert opened["stdio"] == opened["plain"] == 0


def dataclasses_replace(spec, workdir: Path):
    import dataclasses

    return dataclasses.replace(spec, options={**spec.options, "workdir": str(workdir)})
