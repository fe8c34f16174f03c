"""Tuning on remote devices through the real servers: sshd (Python agent), the adb phone emulator
(no Python: native agent + the device's libonnxruntime), several devices in parallel, and a phone
that dies mid-run."""

from __future__ import annotations

import signal
import sys
import threading
import time

import pytest

from edgetune.db import Store
from edgetune.devices.inventory import Inventory
from edgetune.report import markdown, report_dict
from edgetune.tune import tune
from edgetune.tune_config import TuneConfig
from tests.fixtures.tiny import build_tiny


@pytest.fixture(autouse=True)
def _home(tmp_path, monkeypatch):
    monkeypatch.setenv("EDGETUNE_HOME", str(tmp_path / "home"))


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return build_tiny(tmp_path_factory.mktemp("m") / "tiny.onnx")


def _cfg(**kw):
    base = dict(budget_s=1.5, rounds=1, finalists=1, timeout_s=20, spaces=("ort",), max_candidates=2, retries=1)
    base.update(kw)
    return TuneConfig(**base)


def _inventory(tmp_path, ssh_farm=None, adb_farm=None, phone=None, workdir_suffix=""):
    inv = Inventory(tmp_path / "devices.toml")
    if ssh_farm is not None:
        # a board with Python: the interpreter that has numpy and onnxruntime
        inv.add("board", f"ssh://{ssh_farm['user']}@{ssh_farm['host']}:{ssh_farm['port']}", key=ssh_farm["key"],
                known_hosts=ssh_farm["known_hosts"], python=sys.executable,
                workdir=str(tmp_path / f"remote work dir 'q' $x{workdir_suffix}"))
    if adb_farm is not None:
        phone = phone or adb_farm.phone
        inv.add("phone", f"adb://{phone.serial}@{adb_farm.adb_host}:{adb_farm.adb_port}")
    return inv


def test_tune_over_ssh_uses_python_agent(ssh_farm, tiny, tmp_path):
    inv = _inventory(tmp_path, ssh_farm=ssh_farm)
    out = tune(tiny, ["board"], db=tmp_path / "t.db", config=_cfg(), inventory=inv)
    dev = out.devices[0]
    assert dev.status == "complete", dev.error
    s = dev.summary.shapes[0]
    assert s.best is not None and s.best.status == "verified"
    assert dev.summary.versions["agent"].startswith("python")
    assert all(c.status == "verified" for c in s.candidates), [c.reason for c in s.candidates]


def test_tune_on_phone_without_python_uses_native_agent(adb_farm, tiny, tmp_path):
    inv = _inventory(tmp_path, adb_farm=adb_farm)
    out = tune(tiny, ["phone"], db=tmp_path / "t.db", config=_cfg(), inventory=inv)
    dev = out.devices[0]
    assert dev.status == "complete", dev.error
    assert dev.summary.versions["agent"].startswith("native")
    s = dev.summary.shapes[0]
    assert s.best is not None, [(c.candidate.label(), c.reason) for c in s.candidates]
    assert all(c.status == "verified" for c in s.candidates), [c.reason for c in s.candidates]
    # the agent lives in the phone's work dir, not anywhere else
    assert (adb_farm.phone.host_path("/data/local/tmp/edgetune/agent/edgetune-agent"))


def test_farm_tunes_devices_in_parallel_and_compares_them(ssh_farm, adb_farm, tiny, tmp_path):
    inv = _inventory(tmp_path, ssh_farm=ssh_farm, adb_farm=adb_farm)
    t0 = time.monotonic()
    out = tune(tiny, ["local", "board", "phone"], db=tmp_path / "t.db", config=_cfg(), inventory=inv)
    assert [d.status for d in out.devices] == ["complete"] * 3, [d.error for d in out.devices]
    rep = report_dict(out)
    assert {row["device"] for row in rep["comparison"]} == {"local", "board", "phone"}
    assert all(row["best"] for row in rep["comparison"])
    assert "Devices side by side" in markdown(rep)
    assert time.monotonic() - t0 < 120


def test_phone_dying_mid_run_is_marked_down_and_run_resumes(adb_farm, tiny, tmp_path):
    phone = adb_farm.add_phone(name="doomed")
    inv = _inventory(tmp_path, adb_farm=adb_farm, phone=phone)
    db = tmp_path / "t.db"
    killed = threading.Event()

    def killer():
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                st = Store(db)
                ids = [r["id"] for r in st.runs() if r["device"] == "phone"]
                n = len(st.records(run_id=ids[0])) if ids else 0
                st.close()
            except Exception:
                n = 0
            if n >= 2:
                phone.proc.send_signal(signal.SIGKILL)
                killed.set()
                return
            time.sleep(0.05)

    th = threading.Thread(target=killer, daemon=True)
    th.start()
    cfg = _cfg(budget_s=6, max_candidates=4, rounds=2, finalists=3)
    out = tune(tiny, ["local", "phone"], db=db, config=cfg, inventory=inv)
    th.join()
    assert killed.is_set()
    by = {d.device: d for d in out.devices}
    assert by["local"].status == "complete"
    assert by["phone"].status == "down" and by["phone"].error
    st = Store(db)
    phone_records = [r for r in st.records(run_id=by["phone"].run_id)]
    st.close()
    assert len(phone_records) >= 1  # what was measured before the phone died is kept

    # the phone comes back (on a new port): the same run resumes without re-measuring
    phone2 = adb_farm.add_phone(name="doomed-again")
    inv.remove("phone")
    inv.add("phone", f"adb://{phone2.serial}@{adb_farm.adb_host}:{adb_farm.adb_port}")
    again = tune(tiny, ["phone"], db=db, config=cfg, inventory=inv)
    d = again.devices[0]
    assert d.status == "complete", d.error
    assert d.run_id == by["phone"].run_id and d.resumed
    assert d.jobs_skipped == len(phone_records)


def test_tvm_tuned_over_ssh_measures_kernels_on_the_device(ssh_farm, tiny, tmp_path):
    import importlib.util

    from tests.conftest import require

    require(importlib.util.find_spec("tvm") is not None, "apache-tvm not installed")
    inv = _inventory(tmp_path, ssh_farm=ssh_farm)
    out = tune(tiny, ["board"], db=tmp_path / "t.db", inventory=inv,
               config=_cfg(spaces=("ort", "tvm-tuned"), max_candidates=1, tvm_trials=3, timeout_s=60))
    dev = out.devices[0]
    assert dev.status == "complete", dev.error
    tuned = [c for c in dev.summary.shapes[0].candidates if c.candidate.backend == "tvm-tuned"]
    assert tuned and all(c.status == "verified" for c in tuned), [c.reason for c in tuned]
    # the tuning records are keyed by THIS device's fingerprint
    dbs = list((tmp_path / "home" / "artifacts" / "tuning-db").glob("*"))
    assert dbs, "no tuning database written"


def test_runtime_families_over_ssh_and_what_a_phone_cannot_run(ssh_farm, adb_farm, tiny, tmp_path):
    """OpenVINO and LiteRT (a verified onnx2tf conversion) go through the whole protocol on the ssh
    board; the phone's native agent cannot run either, and the run says so instead of leaving them out."""
    from edgetune.accuracy import AccuracyBudget
    from tests.conftest import require
    from edgetune.convert import onnx2tflite

    require(onnx2tflite.unavailable_reason() is None, f"the onnx2tf converter: {onnx2tflite.unavailable_reason()}")
    inv = _inventory(tmp_path, ssh_farm=ssh_farm, adb_farm=adb_farm)
    cfg = _cfg(spaces=("ort", "openvino", "litert"), budget_s=4, accuracy=AccuracyBudget(cosine=0.99),
               confirm_rounds=3)
    out = tune(tiny, ["board", "phone"], dims=["batch=4"], db=tmp_path / "t.db", config=cfg, inventory=inv)
    by = {d.device: d for d in out.devices}
    board, phone = by["board"], by["phone"]
    assert board.status == "complete", board.error
    assert board.families_not_run == {}
    labels = {c.candidate.label(): c for c in board.summary.shapes[0].candidates}
    for name in ("openvino default (fp32)", "litert default (fp32)"):
        assert labels[name].status == "verified" and labels[name].max_rel_err <= 1e-4, (name, labels[name].reason)
    for c in labels.values():  # every other form ran the whole protocol: verified, or judged by its accuracy
        if c.candidate.backend in ("openvino", "litert") and c.status != "verified":
            assert c.candidate.approximate and "accuracy budget" in c.reason, (c.candidate.label(), c.reason)
    assert phone.status == "complete", phone.error
    assert set(phone.families_not_run) == {"openvino", "litert"}, phone.families_not_run
    assert "native agent" in phone.families_not_run["openvino"]
    assert all(c.candidate.backend == "ort" for c in phone.summary.shapes[0].candidates)
