"""A compromised device, through the real transports: every forged answer is a named failure of
that candidate or that device — never a traceback, never stored as verified, never unescaped
device text, never unbounded host memory — and the other devices of a tune lose nothing.

The forging device's "python" runs our agent (byte for byte ours: the hash check passes) and then
rewrites what it answers (tests/forgery). On the adb phone, which has no Python, a rooted phone
lies through its ``sha256sum`` and runs a forger in place of the agent."""

from __future__ import annotations

import hashlib
import json
import os
import re
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from edgetune.agent.host import AgentClient
from edgetune.build.native import build_agent
from edgetune.devices.inventory import Inventory
from edgetune.errors import DeviceError
from tests.conformance import suite
from tests.forgery import HOSTILE, SCENARIOS, forger_script, set_scenario

JOB_SCENARIOS = {k: v for k, v in SCENARIOS.items() if not k.startswith("info-")}
INFO_SCENARIOS = {k: v for k, v in SCENARIOS.items() if k.startswith("info-")}
# the board emulates every tool call (~4 s a job here): one scenario of each kind of forgery
BOARD_SCENARIOS = ("honest", "negative-timings", "nan-timings", "timings-longer-than-wall", "npz-output",
                   "huge-npy-header", "result-list", "huge-stream", "markup-reason")
RAW_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f\x9b]")  # anything a terminal would act on


pytestmark = pytest.mark.usefixtures("private_edgetune_home")


def _inventory(request, tmp_path: Path, transport: str, python: str, name: str = "evil") -> Inventory:
    inv = Inventory(tmp_path / "devices.toml")
    if transport == "local":
        inv.add(name, "local", python=python, workdir=str(tmp_path / f"wd-{name}"))
    elif transport == "ssh":
        f = request.getfixturevalue("ssh_farm")
        inv.add(name, f"ssh://{f['user']}@{f['host']}:{f['port']}", key=f["key"], known_hosts=f["known_hosts"],
                python=python, workdir=str(tmp_path / f"wd-{name}"))
    elif transport == "qemu":
        b = request.getfixturevalue("qemu_board")
        inv.add(name, f"ssh://{b['user']}@{b['host']}:{b['port']}", key=b["key"], known_hosts=b["known_hosts"],
                python=python, workdir=f"{b['home']}/edgetune-forging-{tmp_path.name}")
    return inv


def _assert_clean(text: str, limit: int = 2100) -> None:
    assert not RAW_CONTROL.search(text), repr(text[:300])
    assert len(text) <= limit, len(text)


@pytest.mark.parametrize("transport", ["local", "ssh", "qemu"])
def test_every_forged_answer_is_a_named_failure(request, tmp_path, transport, mlp):
    forger = forger_script(tmp_path / "python")
    client = AgentClient(_inventory(request, tmp_path, transport, str(forger)).get("evil"))
    case = suite.mlp_case(mlp)
    got = {}
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    try:
        assert client.provision().agent == "python"
        for scenario in BOARD_SCENARIOS if transport == "qemu" else JOB_SCENARIOS:
            set_scenario(forger, scenario)
            v, res = suite.run_case(client, case, "adapter", suite.ADAPTERS / "correct.py", model=mlp,
                                    timeout_s=60.0, budget_ms=20.0)
            got[scenario] = (v.code, v.reason)
            _assert_clean(v.reason)
            assert v.ok == (scenario == "honest"), (scenario, v.reason)
    finally:
        client.close()
    wrong = {s: g for s, g in got.items() if g[0] != JOB_SCENARIOS[s]}
    assert not wrong, wrong
    # a gigabyte sent, the host held no more than the job's bound (a few MB here)
    grown_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0) / 1024
    assert grown_mb < 200, f"host peak memory grew by {grown_mb:.0f} MB"
    assert "result too large" in got["huge-stream"][1]
    assert "samples" in got["negative-timings"][1] or "timing" in got["negative-timings"][1]


@pytest.mark.parametrize("transport", ["local", "ssh", "qemu"])
def test_forged_info_is_a_device_error_with_a_clean_message(request, tmp_path, transport):
    forger = forger_script(tmp_path / "python")
    inv = _inventory(request, tmp_path, transport, str(forger))
    for scenario, expect in INFO_SCENARIOS.items():
        set_scenario(forger, scenario)
        client = AgentClient(inv.get("evil"))
        try:
            if expect == "device-error":
                with pytest.raises(DeviceError) as exc:
                    client.provision()
                _assert_clean(str(exc.value), 600)
                assert "info reply is invalid" in str(exc.value), (scenario, str(exc.value))
            else:
                info = client.provision()
                for text in (info.agent_version, json.dumps(info.fingerprint, ensure_ascii=False)):
                    _assert_clean(text)
                assert "\\x1b" in info.fingerprint["cpu_model"]  # kept, as escaped data
        finally:
            client.close()


def _edgetune(*args: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "edgetune.cli.main", *args], capture_output=True, text=True, env=env,
                          timeout=600)


def test_cli_survives_forging_devices_next_to_a_healthy_one(tmp_path):
    """devices ls and a two-device tune, a forging device next to a genuine one: the genuine one is
    listed, tuned and reported as if alone; nothing the forger sends reaches the terminal raw."""
    from tests.fixtures.tiny import build_tiny

    model = build_tiny(tmp_path / "tiny.onnx")
    env = {**os.environ, "EDGETUNE_HOME": str(tmp_path / "home")}
    bad_info = forger_script(tmp_path / "py-info", "info-list")
    hostile = forger_script(tmp_path / "py-hostile", "info-markup")
    forged = forger_script(tmp_path / "py-forged", "negative-timings")
    for name, py in (("badinfo", bad_info), ("hostile", hostile), ("forged", forged), ("good", Path(sys.executable))):
        r = _edgetune("devices", "add", name, "local", "--python", str(py), "--workdir", str(tmp_path / f"wd-{name}"),
                      env=env)
        assert r.returncode == 0, r.stderr
    ls = _edgetune("devices", "ls", env=env)
    assert "Traceback" not in ls.stderr, ls.stderr
    rows = {line.split("|")[1].strip(): line for line in ls.stdout.splitlines() if line.startswith("| ")}
    assert "ok" in rows["good"] and "ok" in rows["hostile"] and "down" in rows["badinfo"], ls.stdout
    _assert_clean(ls.stdout + ls.stderr, 10**6)
    assert "[/bold]" in rows["hostile"]  # printed as text, not taken as markup

    db = tmp_path / "t.db"
    tune = _edgetune("tune", str(model), "--device", "good", "--device", "forged", "--device", "badinfo",
                     "--db", str(db), "--budget", "3", "--rounds", "1",
                     "--space", "ort", "--max-candidates", "2", "--timeout", "20", "--dim", "batch=2",
                     "--format", "json", env=env)
    assert "Traceback" not in tune.stderr, tune.stderr
    _assert_clean(tune.stdout + tune.stderr, 10**6)
    out = json.loads(tune.stdout)
    status = {d["device"]: d["status"] for d in out["devices"]}
    assert status == {"good": "complete", "forged": "complete", "badinfo": "down"}, out["devices"]
    runs = {r["device"]: r for r in out["runs"]}
    assert runs["good"]["shapes"][0]["best"] is not None
    for shape in runs["forged"]["shapes"]:  # every candidate of the forging device failed, none verified
        assert shape["candidates"] and all(c["status"] == "failed" for c in shape["candidates"])
        assert all("invalid result" in c["reason"] for c in shape["candidates"]), shape["candidates"]
    rep = _edgetune("report", "--db", str(db), env=env)
    assert rep.returncode == 0 and "Traceback" not in rep.stderr, rep.stderr
    from edgetune.db import Store

    store = Store(db, create=False)
    try:
        assert all(r.samples_ns.size == 0 or int(r.samples_ns.min()) > 0 for r in store.records())
        assert not [r for r in store.runs() if r["status"] == "running"]
    finally:
        store.close()


def test_rooted_phone_that_lies_about_hashes_gets_nothing_verified(adb_farm, tmp_path):
    """A rooted phone whose sha256sum lies (so the host believes its agent is in place) and whose
    "agent" answers forged bundles: every forged answer is still a named failure."""
    phone = adb_farm.add_phone("rooted")
    wd = "/data/local/tmp/edgetune-rooted"
    agent_local = Path(build_agent(None))
    digest = hashlib.sha256(agent_local.read_bytes()).hexdigest()
    real_info = subprocess.run([str(agent_local), "info"], capture_output=True, check=True).stdout
    bundles = {}
    for scenario, blob in _static_forgeries().items():
        bundles[scenario] = blob
    host = lambda p: Path(phone.host_path(p))  # noqa: E731
    host(f"{wd}/agent").mkdir(parents=True, exist_ok=True)
    for p in (host(wd), host(f"{wd}/agent")):
        os.chown(p, 2000, 2000)
        p.chmod(0o700)
    (host("/data/local/tmp") / "info.json").write_bytes(real_info)
    lying = host("/system/bin/sha256sum")
    real_sha = host("/system/bin/sha256sum.real")
    os.replace(lying, real_sha)
    lying.write_text(f"""#!/system/bin/sh
for f in "$@"; do
  case $f in --) ;; */agent/edgetune-agent) echo "{digest}  $f";; *) /system/bin/sha256sum.real "$f";; esac
done
""")
    lying.chmod(0o755)
    inv = Inventory(tmp_path / "devices.toml")
    inv.add("rooted", f"adb://{phone.serial}@{adb_farm.adb_host}:{adb_farm.adb_port}", workdir=wd, native=True)
    case = suite.gemm_case()
    got = {}
    for scenario, blob in bundles.items():
        (host("/data/local/tmp") / "forged.bundle").write_bytes(blob)
        forger = host(f"{wd}/agent/edgetune-agent")
        forger.write_text("#!/system/bin/sh\ncase $1 in info) cat /data/local/tmp/info.json;; "
                          "*) cat >/dev/null; cat /data/local/tmp/forged.bundle;; esac\n")
        forger.chmod(0o755)
        os.chown(forger, 2000, 2000)
        client = AgentClient(inv.get("rooted"))
        try:
            v, res = suite.run_case(client, case, "tvm-kernel", agent_local, timeout_s=30.0)
        finally:
            client.close()
        got[scenario] = (v.code, v.reason)
        _assert_clean(v.reason)
    wrong = {s: g for s, g in got.items() if g[0] != _STATIC_EXPECT[s]}
    assert not wrong, wrong


_STATIC_EXPECT = {"negative-timings": "invalid-result", "result-list": "invalid-result",
                  "npz-output": "invalid-result", "huge-npy-header": "invalid-result",
                  "markup-reason": "error", "no-outputs": "invalid-result"}


def _static_forgeries() -> dict[str, bytes]:
    """Bundles a lying phone answers with whatever it was asked (no real run behind them)."""
    import io

    import numpy as np

    from tests.forgery.forge import emit

    def npy(a):
        b = io.BytesIO()
        np.save(b, a, allow_pickle=False)
        return b.getvalue()

    zeros = npy(np.zeros((suite.GEMM_M, suite.GEMM_N), np.float32))
    base = {"protocol": 3, "status": "ok", "samples_ns": [-5] * 30, "first_timed_iter": 3,
            "outputs": [["o.npy"]] * 3, "repeat_outputs": ["o.npy"]}
    npz = io.BytesIO()
    np.savez(npz, x=np.zeros(3))
    head = "{'descr': '<f4', 'fortran_order': False, 'shape': (10000000000,), }"
    head += " " * (63 - (len(head) + 10) % 64) + "\n"
    huge = b"\x93NUMPY\x01\x00" + len(head).to_bytes(2, "little") + head.encode()
    ok_timings = {**base, "samples_ns": [1000] * 30}
    return {
        "negative-timings": emit([("result.json", json.dumps(base).encode()), ("o.npy", zeros)]),
        "result-list": emit([("result.json", b"[]")]),
        "npz-output": emit([("result.json", json.dumps(ok_timings).encode()), ("o.npy", npz.getvalue())]),
        "huge-npy-header": emit([("result.json", json.dumps(ok_timings).encode()), ("o.npy", huge)]),
        "markup-reason": emit([("result.json", json.dumps({"status": "error", "reason": HOSTILE}).encode())]),
        "no-outputs": emit([("result.json", json.dumps({**ok_timings, "outputs": []}).encode())]),
    }
