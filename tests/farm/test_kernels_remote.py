"""Kernel tuning on remote devices through the real servers: the qemu aarch64 board over SSH
(cross-compiled kernels, native agent, timings labelled emulated) and the adb phone emulator
(x86-64 sandbox without Python: native agent). Every measured kernel is verified on the host."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from tests.conftest import require_module

from edgetune.db import Store
from edgetune.devices.inventory import Inventory
from tests.conftest import require

require_module("tvm")

from edgetune.build.tvm_kernel import elf_machine  # noqa: E402
from edgetune.kernels.session import KernelSessionConfig, tune_kernels  # noqa: E402

GEMM = "gemm:M=8,N=16,K=8"


@pytest.fixture(autouse=True)
def _home(tmp_path, monkeypatch):
    monkeypatch.setenv("EDGETUNE_HOME", str(tmp_path / "home"))


def _run(inv, device, tmp_path, trials, **kw):
    events = []
    cfg = KernelSessionConfig(device=device, ops=[GEMM], trials=trials, budget_ms=kw.pop("budget_ms", 10.0),
                              timeout_s=120.0, db=str(tmp_path / "r.db"), inventory=inv, **kw)
    return tune_kernels(cfg, events.append), events


def _records(tmp_path, run_id):
    st = Store(tmp_path / "r.db")
    try:
        return st.records(run_id=run_id), st.get_run(run_id)
    finally:
        st.close()


def test_tune_kernel_on_qemu_aarch64_board(qemu_board, tmp_path):
    require(shutil.which("aarch64-linux-gnu-gcc") is not None, "aarch64-linux-gnu-gcc (apt-get install gcc-aarch64-linux-gnu)")
    inv = Inventory(tmp_path / "devices.toml")
    inv.add("board", f"ssh://{qemu_board['user']}@{qemu_board['host']}:{qemu_board['port']}", key=qemu_board["key"],
            known_hosts=qemu_board["known_hosts"], workdir=f"{qemu_board['home']}/edgetune")
    out, events = _run(inv, "board", tmp_path, trials=5, rounds=1)
    assert out.fingerprint["arch"] == "aarch64"
    assert out.emulated, "the qemu board's timings must be labelled emulated"
    assert out.as_dict()["timings"] == "emulated" and out.peak_gflops is None
    assert out.target["mtriple"] == "aarch64-linux-gnu" and out.cross_cc == "aarch64-linux-gnu-gcc"
    (r,) = out.results
    print("board:", r.as_dict())
    trials = [e for e in events if e["event"] == "trial"]
    assert r.trials_measured == 5 and len(trials) == 5
    # every measured kernel ran on the board and was verified on the host: none wrong, crashed or hung
    assert r.failures == {}, r.failures
    assert r.verified and r.gflops and r.emulated and r.peak_pct is None
    assert elf_machine(r.artifact) == "aarch64"  # cross-compiled: the host could not have run it
    # onnxruntime's own aarch64 library (set-up takes it from the aarch64 wheel) runs on the board
    # under the native agent: both onnxruntime forms ran there and were verified; no Python, no numpy
    forms = {f["form"]: f for f in r.baseline["forms"]}  # every form is listed, with why it did not run
    assert forms["ort-constant"]["status"] == forms["ort-runtime"]["status"] == "verified", forms
    assert forms["numpy"]["status"] == "unavailable" and "Python" in forms["numpy"]["reason"]
    recs, run = _records(tmp_path, out.run_id)
    assert json.loads(run["fingerprint"])["emulated"] and json.loads(run["config"])["kind"] == "kernels"
    assert [x.status for x in recs] == ["verified"] * 3 and recs[0].samples_ns.size >= 3  # the kernel, 2 forms
    # the board's kernels ran in the kernel work dir, with the native agent (there is no Python there)
    assert (tmp_path / "home").exists()


def test_tune_kernel_on_adb_phone_with_native_agent(adb_farm, tmp_path):
    inv = Inventory(tmp_path / "devices.toml")
    phone = adb_farm.phone
    inv.add("phone", f"adb://{phone.serial}@{adb_farm.adb_host}:{adb_farm.adb_port}")
    out, events = _run(inv, "phone", tmp_path, trials=4, rounds=2)
    (r,) = out.results
    print("phone:", r.as_dict())
    assert r.verified and r.failures == {} and r.trials_measured == 4, (r.reason, r.failures)
    assert not out.emulated and r.gflops > 0
    recs, run = _records(tmp_path, out.run_id)
    assert json.loads(run["versions"])["agent"].startswith("native")
    kernel = [x for x in recs if x.candidate["backend"] == "tvm-kernel"]
    assert sorted(x.round for x in kernel) == [1, 2] and all(x.status == "verified" for x in kernel)
    if r.baseline["speedup"] is not None:  # the phone got the host's libonnxruntime: both onnxruntime forms
        for weights in ("constant", "runtime"):  # (constant and runtime weights), each once per round
            assert sorted(x.round for x in recs if x.candidate["backend"] == "ort"
                          and x.candidate["params"] == {"weights": weights}) == [1, 2]
        assert r.baseline["form"] in ("ort-constant", "ort-runtime")
    forms = {f["form"]: f for f in r.baseline["forms"]}
    assert forms["numpy"]["status"] == "unavailable"  # no Python on the phone: numpy/LiteRT not run
    assert os.path.exists(phone.host_path("/data/local/tmp/edgetune-kernels/agent/edgetune-agent"))
    # a second run on the same phone reuses the tuning records
    again, _ = _run(inv, "phone", tmp_path, trials=4, rounds=1, baseline=False)
    assert again.results[0].reused_records == 4 and again.results[0].trials_measured == 0
    assert again.fingerprint_key == out.fingerprint_key and again.results[0].verified
