"""Any number of edgetune processes share one database: schema creation and migration are atomic,
a run is held by one process at a time (lease), a holder that is gone is taken over, and however a
device's worker ends its run is given back with a status that says so.

Processes synchronise through pipes (ready/go lines), never through sleeps.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from edgetune import db as dbmod
from edgetune.db import leases as leasemod
from edgetune.candidate import Candidate
from edgetune.db import SCHEMA_VERSION, Owner, Record, Store
from tests.fixtures.leases import hold_device
from tests.fixtures.tiny import build_tiny
from edgetune.devices.inventory import Inventory
from edgetune.errors import DeviceUnreachable, StoreError
from edgetune.results import summarize_run
from edgetune.tune import DeviceTuner, tune
from edgetune.tune_config import TuneConfig

ROOT = Path(__file__).resolve().parents[2]
EDGETUNE = [sys.executable, "-m", "edgetune.cli.main"]


def _env(home: Path) -> dict[str, str]:
    return {**os.environ, "EDGETUNE_HOME": str(home), "PYTHONPATH": str(ROOT), "COLUMNS": "200"}


def _python(code: str, *args: str, home: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", code, *args], cwd=ROOT, env=_env(home), text=True,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _start(store: Store, run_id: str, **kw) -> bool:
    return store.start_run(run_id, "m.onnx", "0" * 64, "local", "fp", {"cores": 1}, {}, {}, **kw)


def _record(store: Store, run_id: str, cand: Candidate, rnd: int, samples, status: str = "verified") -> int:
    return store.add_record(Record(run_id=run_id, workload_key="w", shape={"batch": 1}, shape_key="batch=1",
                                   fingerprint_key="fp", candidate=cand.as_dict(), versions={}, round=rnd,
                                   status=status, reason="" if status == "verified" else "wrong",
                                   verdict={"max_rel_err": 0.0}, samples_ns=samples, wall_ms=1.0, agent_ms=1.0))


# ---- schema: created and migrated atomically ------------------------------------------------------

CREATOR = r"""
import sys
from edgetune.candidate import Candidate
from edgetune.db import Record, Store
print("ready", flush=True)
sys.stdin.readline()  # go: every process opens the fresh database at once
s = Store(sys.argv[1])
run = "r" + sys.argv[2]
s.start_run(run, "m.onnx", "0" * 64, "local", "fp", {}, {}, {})
s.add_record(Record(run_id=run, workload_key="w", shape={}, shape_key="s", fingerprint_key="fp",
                    candidate=Candidate.make("ort", {}, baseline=True).as_dict(), versions={}, round=0,
                    status="verified", reason="", verdict={}, samples_ns=[1000, 1100], wall_ms=1.0, agent_ms=1.0))
s.finish_run(run, {})
s.close()
print("ok", flush=True)
"""


def test_many_processes_create_one_fresh_database_at_once(tmp_path):
    db = tmp_path / "fresh.db"
    procs = [_python(CREATOR, str(db), str(i), home=tmp_path / "home") for i in range(8)]
    try:
        for p in procs:
            assert p.stdout.readline().strip() == "ready", p.stderr.read()
        for p in procs:
            p.stdin.write("go\n")
            p.stdin.flush()
        outs = [p.communicate(timeout=120) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0 and out.strip() == "ok", err
    con = sqlite3.connect(db)
    assert con.execute("SELECT key, value FROM meta").fetchall() == [("schema_version", str(SCHEMA_VERSION))]
    assert con.execute("SELECT COUNT(*), SUM(status='complete') FROM runs").fetchone() == (8, 8)
    assert con.execute("SELECT COUNT(*) FROM records").fetchone()[0] == 8
    assert con.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    con.close()


V1_SCHEMA = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE runs (id TEXT PRIMARY KEY, created REAL NOT NULL, finished REAL, status TEXT NOT NULL,
    model_path TEXT NOT NULL, model_sha256 TEXT NOT NULL, device TEXT NOT NULL, fingerprint_key TEXT NOT NULL,
    fingerprint TEXT NOT NULL, versions TEXT NOT NULL, config TEXT NOT NULL, summary TEXT);
CREATE TABLE records (id INTEGER PRIMARY KEY AUTOINCREMENT, run_id TEXT NOT NULL REFERENCES runs(id),
    workload_key TEXT NOT NULL, shape TEXT NOT NULL, shape_key TEXT NOT NULL, fingerprint_key TEXT NOT NULL,
    candidate_key TEXT NOT NULL, candidate TEXT NOT NULL, versions TEXT NOT NULL, round INTEGER NOT NULL,
    status TEXT NOT NULL, reason TEXT NOT NULL, verdict TEXT NOT NULL, samples BLOB NOT NULL, wall_ms REAL NOT NULL,
    agent_ms REAL NOT NULL, created REAL NOT NULL, UNIQUE (run_id, shape_key, candidate_key, round));
CREATE INDEX records_lookup ON records (workload_key, fingerprint_key, candidate_key);
"""


def _v1_database(path: Path, with_meta: bool = True) -> Candidate:
    cand = Candidate.make("ort", {}, baseline=True)
    con = sqlite3.connect(path)
    con.executescript(V1_SCHEMA)
    if with_meta:
        con.execute("INSERT INTO meta VALUES ('schema_version', '1')")
    for run_id, status in (("done", "complete"), ("left", "running")):  # 'left': killed under version 1
        con.execute("INSERT INTO runs VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
                    (run_id, 1.0, None, status, "m.onnx", "0" * 64, "local", "fp", "{}", "{}", "{}", None))
        for rnd in (0, 1):
            con.execute("INSERT INTO records (run_id, workload_key, shape, shape_key, fingerprint_key, candidate_key,"
                        " candidate, versions, round, status, reason, verdict, samples, wall_ms, agent_ms, created)"
                        " VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                        (run_id, "w", "{}", "s", "fp", cand.key(), json.dumps(cand.as_dict()), "{}", rnd, "verified",
                         "", "{}", np.array([1000, 1200], "<i8").tobytes(), 1.0, 1.0, 2.0))
    con.commit()
    con.close()
    return cand


@pytest.mark.parametrize("with_meta", [True, False], ids=["v1", "v1-without-schema-row"])
def test_version_1_database_migrates_in_place_keeping_every_record(tmp_path, with_meta):
    path = tmp_path / "old.db"
    _v1_database(path, with_meta)
    before = sqlite3.connect(path).execute("SELECT * FROM records ORDER BY id").fetchall()
    store = Store(path)
    con = sqlite3.connect(path)
    assert con.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()[0] == str(SCHEMA_VERSION)
    assert {"owner", "lease_until"} <= {r[1] for r in con.execute("PRAGMA table_info(runs)")}
    assert con.execute("SELECT * FROM records ORDER BY id").fetchall() == before
    con.close()
    runs = {r["id"]: r for r in store.runs()}
    assert runs["done"]["status"] == "complete"
    assert runs["left"]["status"] == "interrupted"  # 'running' with nobody running it: said as it is
    waits: list[str] = []
    assert _start(store, "left", on_wait=waits.append) is True and waits == []  # no holder: taken at once
    assert [r.round for r in store.records(run_id="left")] == [0, 1]
    store.close()


def test_newer_schema_is_refused(tmp_path):
    path = tmp_path / "new.db"
    Store(path).close()
    con = sqlite3.connect(path)
    con.execute("UPDATE meta SET value='99' WHERE key='schema_version'")
    con.commit()
    con.close()
    with pytest.raises(StoreError, match="schema version 99"):
        Store(path)


def test_a_record_stored_twice_keeps_the_first(tmp_path):
    store = Store(tmp_path / "t.db")
    _start(store, "r")
    cand = Candidate.make("ort", {}, baseline=True)
    first = _record(store, "r", cand, 0, [1000, 1001])
    again = _record(store, "r", cand, 0, [5, 6])
    assert again == first
    rows = store.records(run_id="r")
    assert len(rows) == 1 and rows[0].samples_ns.tolist() == [1000, 1001]
    store.close()


# ---- run leases ----------------------------------------------------------------------------------

HOLDER = r"""
import sys
from edgetune.db import Store
s = Store(sys.argv[1])
s.start_run(sys.argv[2], "m.onnx", "0" * 64, "local", "fp", {}, {}, {})
print("held", flush=True)
if sys.stdin.readline().strip() == "finish":
    s.finish_run(sys.argv[2], {})
s.close()
print("done", flush=True)
"""


def _holder(tmp_path, db: Path, run_id: str) -> subprocess.Popen:
    p = _python(HOLDER, str(db), run_id, home=tmp_path / "home")
    assert p.stdout.readline().strip() == "held", p.stderr.read()
    return p


def test_a_held_run_is_waited_for_then_resumed(tmp_path):
    db = tmp_path / "t.db"
    holder = _holder(tmp_path, db, "r")
    store = Store(db)
    run = store.get_run("r")
    assert run["status"] == "running" and run["holder"] == f"pid {holder.pid} on {leasemod._HOST}"
    waits: list[str] = []

    def on_wait(who: str) -> None:  # called once the wait has begun: now let the holder finish
        waits.append(who)
        holder.stdin.write("finish\n")
        holder.stdin.flush()

    assert _start(store, "r", on_wait=on_wait) is True  # resumed, after the holder gave it back
    assert waits == [f"pid {holder.pid} on {leasemod._HOST}"]
    assert holder.wait(timeout=60) == 0
    assert store.get_run("r")["status"] == "running" and store.get_run("r")["holder"]
    store.finish_run("r", {})
    assert store.get_run("r")["status"] == "complete"
    store.close()


@pytest.mark.parametrize("reap", [True, False], ids=["reaped", "zombie"])
def test_a_killed_holder_on_this_host_is_taken_over_at_once(tmp_path, reap):
    db = tmp_path / "t.db"
    holder = _holder(tmp_path, db, "r")
    holder.send_signal(signal.SIGKILL)
    if reap:
        holder.wait(timeout=60)
    else:  # killed but not yet reaped by its parent: a zombie still has its pid
        deadline = time.monotonic() + 60
        while leasemod._proc_stat(holder.pid) is not None and leasemod._proc_stat(holder.pid)[0] != "Z":
            assert time.monotonic() < deadline
            time.sleep(0.01)
    try:
        store = Store(db)
        assert store.get_run("r")["status"] == "interrupted"
        waits: list[str] = []
        assert _start(store, "r", on_wait=waits.append) is True
        assert waits == []  # the lease had 30 s to run: a gone holder is not waited for
        store.close()
    finally:
        holder.wait(timeout=60)


def _forge_holder(db: Path, run_id: str, owner: str, lease_in_s: float) -> None:
    con = sqlite3.connect(db)
    con.execute("UPDATE runs SET status='running', owner=?, lease_until=? WHERE id=?",
                (owner, time.time() + lease_in_s, run_id))
    con.commit()
    con.close()


def test_a_holder_on_another_host_holds_until_its_lease_expires(tmp_path):
    db = tmp_path / "t.db"
    store = Store(db)
    _start(store, "r")
    store.release_run("r", "down")
    elsewhere = str(Owner(os.getpid() + 1_000_000, "another-host", "b", "1", "t"))
    _forge_holder(db, "r", elsewhere, 600)
    assert store.get_run("r")["holder"] == "pid " + str(os.getpid() + 1_000_000) + " on another-host"
    waits: list[str] = []
    with pytest.raises(StoreError, match="held by pid .* on another-host"):
        _start(store, "r", on_wait=waits.append, wait_s=0)
    assert len(waits) == 1
    with pytest.raises(dbmod.LeaseLost):  # only the holder writes a run's records
        _record(store, "r", Candidate.make("ort", {}, baseline=True), 0, [1000])
    _forge_holder(db, "r", elsewhere, -1)  # its lease ran out
    assert store.get_run("r")["status"] == "interrupted"
    assert _start(store, "r", on_wait=waits.append) is True and len(waits) == 1
    store.close()


def test_the_heartbeat_renews_and_close_gives_back(tmp_path, monkeypatch):
    monkeypatch.setattr(leasemod, "HEARTBEAT_S", 0.02)
    db = tmp_path / "t.db"
    store = Store(db)
    _start(store, "r")
    con = sqlite3.connect(db)
    first = con.execute("SELECT lease_until FROM runs").fetchone()[0]
    deadline = time.monotonic() + 60
    while con.execute("SELECT lease_until FROM runs").fetchone()[0] <= first:
        assert time.monotonic() < deadline, "lease never renewed"
        time.sleep(0.01)
    store.close()  # still held at close: given back as interrupted, not left 'running'
    assert con.execute("SELECT status, owner, lease_until FROM runs").fetchone() == ("interrupted", None, None)
    con.close()


# ---- stored data from older versions -------------------------------------------------------------

def test_invalid_stored_samples_count_as_failed_everywhere(tmp_path):
    db = tmp_path / "t.db"
    store = Store(db)
    _start(store, "r", )
    base = Candidate.make("ort", {}, baseline=True)
    bad = {"negative": [-5, 1000], "zero": [0, 0], "nan": [np.iinfo(np.int64).min], "empty": []}
    cands = {name: Candidate.make("ort", {"intra_op_num_threads": i + 1}) for i, name in enumerate(bad)}
    for rnd in (0, 1):
        _record(store, "r", base, rnd, [2000, 2100, 1900])
        for name, samples in bad.items():
            _record(store, "r", cands[name], rnd, samples)
    store.finish_run("r", {})
    store.close()
    con = sqlite3.connect(db)  # a torn sample array, as a crashed older writer could leave
    con.execute("UPDATE records SET samples=? WHERE candidate_key=? AND round=1",
                (b"\x01" * 12, cands["empty"].key()))
    con.commit()
    con.close()
    store = Store(db)
    shape = summarize_run(store, "r").shapes[0]
    assert shape.get(base.key()).status == "verified"
    for name, cand in cands.items():
        c = shape.get(cand.key())
        assert c.status == "failed" and "invalid stored samples" in c.reason, (name, c.reason)
    assert shape.best_key == base.key()
    assert store.record_counts()["r"] == (10, 2)
    store.close()
    for args in (["db", "ls"], ["db", "best"], ["report"], ["report", "--format", "json"]):
        p = subprocess.run(EDGETUNE + args + ["--db", str(db)], cwd=ROOT, env=_env(tmp_path / "home"),
                           capture_output=True, text=True, timeout=120)
        assert p.returncode == 0 and "Traceback" not in p.stderr, (args, p.stderr)


# ---- tunes sharing a database ----------------------------------------------------------------------

QUICK = ["--budget", "1.5", "--rounds", "1", "--finalists", "1", "--max-candidates", "2", "--space", "ort"]


def _duplicates(db: Path) -> int:
    con = sqlite3.connect(db)
    n = con.execute("SELECT COUNT(*) FROM (SELECT run_id, shape_key, candidate_key, round, COUNT(*) c FROM records"
                    " GROUP BY 1,2,3,4 HAVING c > 1)").fetchone()[0]
    con.close()
    return n


def test_two_identical_tunes_at_once_both_succeed(tiny_model, tmp_path):
    db = tmp_path / "t.db"
    args = EDGETUNE + ["tune", str(tiny_model), *QUICK, "--db", str(db), "--format", "json"]
    procs = [subprocess.Popen(args, cwd=ROOT, env=_env(tmp_path / "home"), text=True, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE) for _ in range(2)]
    outs = [p.communicate(timeout=300) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err
        assert "Traceback" not in err
    devs = [json.loads(out)["devices"][0] for out, _ in outs]
    assert devs[0]["run_id"] == devs[1]["run_id"]
    first, second = sorted(devs, key=lambda d: d["resumed"])
    assert not first["resumed"] and second["resumed"]  # one ran it, the other waited for it and resumed
    assert second["jobs_run"] == 0 and second["jobs_skipped"] == first["jobs_run"] > 0
    assert _duplicates(db) == 0
    con = sqlite3.connect(db)
    assert con.execute("SELECT status, owner FROM runs").fetchall() == [("complete", None)]
    con.close()


def _cfg(**kw):
    base = dict(budget_s=1.0, rounds=1, finalists=1, timeout_s=8, spaces=("ort",), max_candidates=1, confirm_rounds=2)
    base.update(kw)
    return TuneConfig(**base)


KILLED_TUNE = r"""
import sys, threading
from edgetune.tune import tune
from edgetune.tune_config import TuneConfig
cfg = TuneConfig(budget_s=1.0, rounds=1, finalists=1, timeout_s=8, spaces=("ort",), max_candidates=1,
                 confirm_rounds=2)
def progress(ev):
    if ev["event"] == "job":  # one job recorded: say so, then hang here until killed
        print("recorded", flush=True)
        threading.Event().wait()
tune(sys.argv[1], ["local"], db=sys.argv[2], config=cfg, progress=progress)
"""


def test_a_tune_killed_mid_run_is_taken_over_at_once(tiny_model, tmp_path):
    db = tmp_path / "t.db"
    p = _python(KILLED_TUNE, str(tiny_model), str(db), home=tmp_path / "home")
    try:
        assert p.stdout.readline().strip() == "recorded", p.stderr.read()
    finally:
        p.send_signal(signal.SIGKILL)  # kill -9 while it holds the run
        p.wait(timeout=60)
    events: list[dict] = []
    out = tune(tiny_model, ["local"], db=db, config=_cfg(), progress=events.append)
    dev = out.devices[0]
    assert dev.status == "complete", dev.error
    assert not [e for e in events if e["event"] == "wait"]
    assert dev.resumed and dev.jobs_skipped >= 1
    assert _duplicates(db) == 0


def test_an_unexpected_error_on_one_device_is_that_devices_outcome(tiny_model, tmp_path, monkeypatch):
    inv = Inventory(tmp_path / "devices.toml")
    inv.add("twin", "local")
    real = DeviceTuner.tune_shape

    def tune_shape(self, *a, **kw):
        if self.spec.name == "twin":
            raise ZeroDivisionError("boom")
        return real(self, *a, **kw)

    monkeypatch.setattr(DeviceTuner, "tune_shape", tune_shape)
    events: list[dict] = []
    out = tune(tiny_model, ["local", "twin"], db=tmp_path / "t.db", config=_cfg(), inventory=inv,
               progress=events.append)
    by = {d.device: d for d in out.devices}
    assert by["local"].status == "complete", by["local"].error
    assert by["twin"].status == "down" and by["twin"].error == "internal error: ZeroDivisionError: boom"
    assert {"event": "down", "device": "twin", "error": "internal error: ZeroDivisionError: boom"} in events
    store = Store(tmp_path / "t.db")
    assert store.get_run(by["twin"].run_id)["status"] == "failed: internal error: ZeroDivisionError: boom"
    assert store.get_run(by["local"].run_id)["status"] == "complete"
    store.close()


@pytest.mark.parametrize("error, status", [(DeviceUnreachable("local: connection dropped"), "down"),
                                           (KeyboardInterrupt(), "interrupted")])
def test_a_device_run_ended_abnormally_is_released_with_its_status(tiny_model, tmp_path, monkeypatch, error, status):
    def tune_shape(self, *a, **kw):
        raise error

    monkeypatch.setattr(DeviceTuner, "tune_shape", tune_shape)
    db = tmp_path / "t.db"
    if isinstance(error, KeyboardInterrupt):
        with pytest.raises(KeyboardInterrupt):
            tune(tiny_model, ["local"], db=db, config=_cfg())
    else:
        dev = tune(tiny_model, ["local"], db=db, config=_cfg()).devices[0]
        assert dev.status == "down" and dev.error == "local: connection dropped"
    con = sqlite3.connect(db)
    assert con.execute("SELECT status, owner, lease_until FROM runs").fetchall() == [(status, None, None)]
    con.close()


def test_device_identity_is_the_same_physical_device_from_every_host(monkeypatch):
    from edgetune.devices.inventory import DeviceSpec, device_identity

    monkeypatch.setenv("EDGETUNE_HOST", "lab-a")
    assert device_identity(DeviceSpec("local", "local")) == "local@lab-a"
    # a loopback address names this host; another host's address is that host's
    assert device_identity(DeviceSpec("p", "adb://R58M@127.0.0.1:5037")) == "adb://R58M@lab-a:5037"
    assert device_identity(DeviceSpec("p", "adb://R58M@lab-a:5037")) == "adb://R58M@lab-a:5037"
    assert device_identity(DeviceSpec("b", "ssh://pi@localhost:2222")) == "ssh://pi@lab-a:2222"
    assert device_identity(DeviceSpec("b", "ssh://pi@192.168.1.20")) == "ssh://pi@192.168.1.20:22"
    assert device_identity(DeviceSpec("b", "ssh://pi@10.0.0.2", {"identity": "pi5-1"})) == "pi5-1"


def test_device_leases_on_sqlite(tmp_path):
    """One process drives a device at a time; the Stores of one process share what it drives (a
    tune's hybrid tunes its kernels through a Store of its own, on the same device)."""
    import multiprocessing

    from edgetune.db import DeviceBusy

    db = str(tmp_path / "t.db")
    ctx = multiprocessing.get_context("spawn")
    ready, done = ctx.Event(), ctx.Event()
    other = ctx.Process(target=hold_device, args=(db, "local@x", ready, done))
    other.start()
    b = Store(db)
    try:
        assert ready.wait(60)
        with pytest.raises(DeviceBusy, match="device local@x is driven by pid"):
            b.acquire_device("local@x", "r2", wait_s=0)
        assert b.device_holders()["local@x"]["run_id"] == "r-other"
        done.set()
        other.join(60)  # closing gives its devices back
        b.acquire_device("local@x", "r2", wait_s=0)
        nested = Store(db)
        try:
            nested.acquire_device("local@x", "r3", wait_s=0)  # the same process: shared, not taken over
            nested.release_device("local@x")
            assert b.device_holders()["local@x"]["run_id"] == "r2"
        finally:
            nested.close()
        assert b.device_holders()["local@x"]["run_id"] == "r2"
    finally:
        done.set()
        other.join(60)
        b.close()


def _shape_rec(st, run_id, shape_key, cand="c"):
    return st.add_record(Record(run_id=run_id, workload_key="w", shape={}, shape_key=shape_key, fingerprint_key="fk",
                                candidate={"key": cand}, versions={}, round=0, status="verified", reason="",
                                verdict={}, samples_ns=[5, 6], wall_ms=1.0, agent_ms=1.0))


def test_shape_points_are_claimed_once_and_a_gone_claimers_point_is_claimed_again(tmp_path, monkeypatch):
    """Joining a run: each shape point is claimed by one Store at a time; only its claimer writes
    its records; a claimer gone (its lease run out) leaves its point to the next claimer, which
    records that it resumed it on another device."""
    db = tmp_path / "r.db"
    a, b = Store(db), Store(db)
    try:
        a.start_run("r1", "m.onnx", "sha", "dev", "fk", {}, {}, {})
        a.plan_shapes("r1", ["p1", "p2", "p3"])
        b.plan_shapes("r1", ["p1", "p2", "p3"])  # planning twice changes nothing
        assert a.claim_shape("r1", "dev-a") == ("p1", 0)
        assert b.claim_shape("r1", "dev-b") == ("p2", 1)  # p1 is a's
        _shape_rec(a, "r1", "p1")
        with pytest.raises(dbmod.LeaseLost, match="shape point p1 is held by"):
            _shape_rec(b, "r1", "p1")  # b holds the run? no, and not the point either
        with pytest.raises(dbmod.LeaseLost):
            b.finish_shape("r1", "p1")
        a.finish_shape("r1", "p1")
        assert a.claim_shape("r1", "dev-a") == ("p3", 1)
        assert a.claim_shape("r1", "dev-a") == (None, 2)  # p2 is b's, still live; p3 is a's, being measured
        # b's lease runs out (a crashed host elsewhere): its point is claimed again, and the device change said
        with b.tx() as c:
            c.execute("UPDATE run_shapes SET owner=?, lease_until=? WHERE shape_key='p2'",
                      ("4242@elsewhere:boot:1", time.time() - 1))
        b._shapes.clear()
        assert a.claim_shape("r1", "dev-a")[0] == "p2"
        a.finish_shape("r1", "p2")
        a.release_shape("r1", "p3")  # given back unmeasured: pending, claimable
        assert b.claim_shape("r1", "dev-b")[0] == "p3"
        b.finish_shape("r1", "p3")
        assert a.claim_shape("r1", "dev-a") == (None, 0)
        on = {p["shape_key"]: (p["device"], p["status"]) for p in a.shapes("r1")}
        assert on == {"p1": ("dev-a", "done"), "p2": ("dev-b,dev-a", "done"), "p3": ("dev-a,dev-b", "done")}
    finally:
        a.close()
        b.close()


def test_verify_waits_for_a_device_another_process_drives(tmp_path, monkeypatch):
    """The one-shot checks take the device's lease like tune: `edgetune verify` on a device another
    process drives says so on stderr and waits; it measures once the lease is given back."""
    from edgetune.devices.inventory import DeviceSpec, device_identity

    home = tmp_path / "home"
    model = build_tiny(tmp_path / "tiny.onnx")
    p = subprocess.run(EDGETUNE + ["tune", str(model), "--budget", "3", "--rounds", "1", "--finalists", "1",
                                   "--max-candidates", "1", "--space", "ort", "--format", "json"],
                       env=_env(home), capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    key = json.loads(p.stdout)["runs"][0]["shapes"][0]["best"]
    ctx = multiprocessing.get_context("spawn")
    ready, done = ctx.Event(), ctx.Event()
    monkeypatch.setenv("EDGETUNE_HOME", str(home))  # (the spawned holder opens the same default database)
    try:
        other = ctx.Process(target=hold_device, args=(None, device_identity(DeviceSpec("local", "local")), ready,
                                                      done))
        other.start()
        assert ready.wait(60)
        v = subprocess.Popen(EDGETUNE + ["verify", str(model), "--config", key[:12], "--format", "json"], env=_env(home),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        # the lease is given back only once verify said it waits (however long its start takes on a
        # busy machine): a fixed sleep let a slow start find the device free and say nothing
        err_lines: list[str] = []
        waiting = threading.Event()

        def read_err() -> None:
            for line in v.stderr:
                err_lines.append(line)
                if "local: waiting for device local@" in line:
                    waiting.set()
            waiting.set()  # verify ended without waiting: the asserts below say how

        reader = threading.Thread(target=read_err, daemon=True)
        reader.start()
        assert waiting.wait(300)
        assert v.poll() is None, "".join(err_lines)  # waiting, not measuring beside the other process
        done.set()
        other.join(60)
        out = v.stdout.read()
        v.wait(120)
        reader.join(60)
        err = "".join(err_lines)
        assert v.returncode == 0, err
        assert "local: waiting for device local@" in err and ", driven by pid" in err
        assert json.loads(out)["ok"] is True
    finally:
        done.set()
