"""The lab database (issue 13): a real PostgreSQL server on 127.0.0.1 (tools/farm/pg_farm.py).

The store's semantics on PostgreSQL (append-only records, run and device leases, schema created
once by many processes at once), ``db migrate`` from SQLite, ``devices ls --db`` showing who drives
a device, and several host processes tuning the farm's devices into one database, one of them
killed with ``kill -9`` mid-run: the survivor finishes, no job is measured twice, no record is lost,
and the killed host's device lease expires and is taken over by another host that resumes its run;
a host joining another's run on a second board of the same kind, killed too, its share resumed."""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from edgetune import db as dbmod
from edgetune.db import Record, Store
from edgetune.errors import StoreError
from tests.fixtures.leases import hold_device
from tests.fixtures.tiny import build_tiny

EDGETUNE = [sys.executable, "-m", "edgetune.cli.main"]


def run(args, home, env=None, timeout=300):
    e = {**os.environ, "EDGETUNE_HOME": str(home), "COLUMNS": "200", **(env or {})}
    e.pop("EDGETUNE_DB", None)
    return subprocess.run(EDGETUNE + [str(a) for a in args], capture_output=True, text=True, timeout=timeout, env=e)


def _rec(st, run_id, cand, round=0, samples=(5, 6, 7)):
    return st.add_record(Record(run_id=run_id, workload_key="w", shape={"batch": 1}, shape_key="x=1x16",
                                fingerprint_key="fk", candidate={"key": cand}, versions={}, round=round,
                                status="verified", reason="", verdict={}, samples_ns=list(samples), wall_ms=1.0,
                                agent_ms=1.0))


def test_store_semantics_on_postgresql(pg_url):
    st = Store(pg_url)
    try:
        assert st.pg and st.path == pg_url
        assert st.start_run("r1", "m.onnx", "sha", "phone", "fk", {"arch": "x86_64"}, {"agent": "x"}, {"seed": 0}) is False
        first = _rec(st, "r1", "c1")
        assert _rec(st, "r1", "c1") == first  # append-only: the same key keeps its first record
        _rec(st, "r1", "c2", samples=(5, -6, 7))  # an agent's negative timing: stored, read as failed
        _rec(st, "r1", "c3", samples=(1, 0))
        big = np.arange(1, 100_001, dtype=np.int64)
        _rec(st, "r1", "c4", samples=big)  # every sample kept, byte for byte
        recs = {r.candidate_key: r for r in st.records(run_id="r1")}
        assert recs["c1"].samples_ns.tolist() == [5, 6, 7] and recs["c1"].id == first
        assert recs["c2"].status == "failed" and "zero or negative" in recs["c2"].reason
        assert np.array_equal(recs["c4"].samples_ns, big)
        assert st.record_counts() == {"r1": (4, 2)}  # the database's own samples_ok agrees with Python's
        assert st.get_run("r1")["status"] == "running" and st.get_run("r1")["holder"]
        st.finish_run("r1", {"ok": True})
    finally:
        st.close()
    st = Store(pg_url, create=False)  # another process's view: the same rows
    try:
        (r,) = st.runs()
        assert r["status"] == "complete" and json.loads(r["summary"]) == {"ok": True} and r["holder"] is None
        assert json.loads(r["fingerprint"]) == {"arch": "x86_64"}
    finally:
        st.close()


def _open_and_close(url, q):
    try:
        Store(url).close()
        q.put("ok")
    except Exception as exc:  # noqa: BLE001 - reported to the test
        q.put(repr(exc))


def test_many_processes_create_the_schema_at_once(pg_url):
    ctx = multiprocessing.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=_open_and_close, args=(pg_url, q)) for _ in range(6)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert sorted(q.get(timeout=10) for _ in procs) == ["ok"] * 6
    st = Store(pg_url)
    try:
        assert st._schema_version() == str(dbmod.SCHEMA_VERSION)
    finally:
        st.close()


def test_run_and_device_leases_across_hosts(pg_url, monkeypatch):
    a, b = Store(pg_url), Store(pg_url)
    ctx = multiprocessing.get_context("spawn")
    ready, done = ctx.Event(), ctx.Event()
    other = ctx.Process(target=hold_device, args=(pg_url, "adb://SER@lab-a:5037", ready, done))
    other.start()
    try:
        a.start_run("r1", "m", "sha", "phone", "fk", {}, {}, {})
        with pytest.raises(StoreError, match="run r1 is held by pid"):
            b.start_run("r1", "m", "sha", "phone", "fk", {}, {}, {}, wait_s=0.5)
        assert ready.wait(60)
        with pytest.raises(StoreError, match="device adb://SER@lab-a:5037 is driven by pid .*gave up waiting"):
            b.acquire_device("adb://SER@lab-a:5037", "r2", wait_s=0.5)
        holders = b.device_holders()
        assert holders["adb://SER@lab-a:5037"]["run_id"] == "r-other"
        done.set()
        other.join(60)  # that process ends: its Store gives the device back
        b.acquire_device("adb://SER@lab-a:5037", "r2")
        assert b.device_holders()["adb://SER@lab-a:5037"]["run_id"] == "r2"
    finally:
        done.set()
        other.join(60)
        a.close()
        b.close()
    # a host that died: its leases are rows with an owner elsewhere whose lease ran out
    c = Store(pg_url)
    try:
        with c.tx() as x:
            x.execute("UPDATE device_leases SET owner=?, lease_until=? WHERE device=?",
                      ("4242@lab-b#0.0.dead", time.time() - 1, "adb://SER@lab-a:5037"))
            x.execute("UPDATE runs SET status='running', owner=?, lease_until=? WHERE id='r1'",
                      ("4242@lab-b#0.0.dead", time.time() + 3600))
        assert c.device_holders() == {}
        c.acquire_device("adb://SER@lab-a:5037", "r3", wait_s=0.1)  # expired: taken over at once
        with pytest.raises(StoreError, match="held by pid 4242 on lab-b"):  # not expired: another host's, alive
            c.start_run("r1", "m", "sha", "phone", "fk", {}, {}, {}, wait_s=0.3)
    finally:
        c.close()


def test_migrate_copies_an_sqlite_database_and_runs_again_safely(pg_url, tmp_path):
    src = tmp_path / "ws.db"
    st = Store(src)
    st.start_run("r1", "m.onnx", "sha", "local", "fk", {"arch": "x86_64"}, {}, {"seed": 1})
    for i in range(3):
        _rec(st, "r1", f"c{i}", samples=range(1, 10 + i))
    st.finish_run("r1", {"n": 3})
    st.close()
    home = tmp_path / "home"
    p = run(["db", "migrate", src, "--to", pg_url, "--format", "json"], home)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["runs"] == 1 and json.loads(p.stdout)["records"] == 3
    p = run(["db", "migrate", src, "--to", pg_url, "--format", "json"], home)
    out = json.loads(p.stdout)
    assert (out["runs"], out["records"], out["runs_present"], out["records_present"]) == (0, 0, 1, 3)
    pg = Store(pg_url)
    try:
        recs = pg.records(run_id="r1")
        assert [r.samples_ns.tolist() for r in recs] == [list(range(1, 10 + i)) for i in range(3)]
        assert pg.get_run("r1")["status"] == "complete"
    finally:
        pg.close()
    p = run(["db", "ls", "--db", pg_url, "--format", "json"], home)
    assert p.returncode == 0 and json.loads(p.stdout)[0]["records"] == 3
    # a migration target it cannot reach: one line, nothing half-copied anywhere
    p = run(["db", "migrate", src, "--to", "postgresql://edgetune:pw@127.0.0.1:1/x"], home)
    assert p.returncode == 4 and p.stderr.count("\n") == 1 and "cannot reach database" in p.stderr
    assert "pw" not in p.stderr


@pytest.fixture
def lab(tmp_path, adb_farm, ssh_farm, pg_url):
    """Two hosts' inventories (their own homes) naming the farm's phone and board, as a lab would."""
    model = build_tiny(tmp_path / "tiny.onnx")
    homes = {}
    for host in ("host-a", "host-b", "host-c"):
        home = tmp_path / host
        phone = adb_farm.phone
        p = run(["devices", "add", "phone", f"adb://{phone.serial}@{adb_farm.adb_host}:{adb_farm.adb_port}",
                 "--identity", "lab-phone-1"], home)
        assert p.returncode == 0, p.stderr
        p = run(["devices", "add", "board", f"ssh://{ssh_farm['user']}@{ssh_farm['host']}:{ssh_farm['port']}",
                 "--key", ssh_farm["key"], "--known-hosts", ssh_farm["known_hosts"], "--python", sys.executable,
                 "--identity", "lab-board-1", "--workdir", str(tmp_path / f"board-{host}")], home)
        assert p.returncode == 0, p.stderr
        homes[host] = home
    return {"model": model, "homes": homes, "url": pg_url}


TUNE = ["--budget", "8", "--rounds", "2", "--finalists", "2", "--max-candidates", "4", "--space", "ort",
        "--format", "json"]


def _env(host):
    # each process a host of its own (a process elsewhere is seen only through its lease), with short leases
    return {"EDGETUNE_HOST": host, "EDGETUNE_LEASE_S": "10"}


def _popen(args, home, host):
    e = {**os.environ, "EDGETUNE_HOME": str(home), **_env(host)}
    e.pop("EDGETUNE_DB", None)
    return subprocess.Popen(EDGETUNE + [str(a) for a in args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=e)


def test_hosts_tune_into_one_database_and_a_killed_hosts_device_is_taken_over(lab):
    url, homes, model = lab["url"], lab["homes"], lab["model"]
    a = _popen(["tune", model, "-d", "phone", "--db", url, *TUNE], homes["host-a"], "host-a")
    b = _popen(["tune", model, "-d", "board", "--db", url, *TUNE], homes["host-b"], "host-b")
    st = Store(url)
    try:
        # host a is killed once it has recorded some jobs of its run
        deadline = time.monotonic() + 120
        killed_at = None
        while time.monotonic() < deadline and a.poll() is None:
            runs = [r for r in st.runs() if r["device"] == "phone"]
            n = len(st.records(run_id=runs[0]["id"])) if runs else 0
            if n >= 3:
                a.send_signal(signal.SIGKILL)
                a.wait(30)
                killed_at = {r.id: (r.candidate_key, r.round, r.samples_ns.tolist()) for r in st.records(run_id=runs[0]["id"])}
                run_id = runs[0]["id"]
                break
            time.sleep(0.05)
        assert killed_at is not None, "host a finished before it could be killed: " + (a.stderr.read() if a.stderr else "")
        # the killed host's lease on the phone is still there: nobody on another host can know it died
        holders = st.device_holders()
        assert holders["lab-phone-1"]["holder"].endswith("on host-a") and holders["lab-phone-1"]["run_id"] == run_id
        # devices ls --db: who drives what now, as every host sees it (the phone: the dead host, until its
        # lease runs out; the board: host b, while it tunes)
        p = run(["devices", "ls", "--no-probe", "--db", url, "--format", "json"], homes["host-c"], _env("host-c"))
        rows = {r["name"]: r for r in json.loads(p.stdout)}
        assert rows["phone"]["identity"] == "lab-phone-1" and rows["phone"]["driven_by"]["run_id"] == run_id
        assert "on host-a" in rows["phone"]["driven_by"]["holder"]
        out_b, err_b = b.communicate(timeout=300)
        assert b.returncode == 0, err_b
        assert json.loads(out_b)["runs"][0]["status"] == "complete"  # the survivor finished
        # host c runs host a's command: it waits for the phone's lease to expire, takes the run over and resumes it
        t0 = time.monotonic()
        p = run(["tune", model, "-d", "phone", "--db", url, *TUNE], homes["host-c"], _env("host-c"))
        assert p.returncode == 0, p.stderr
        doc = json.loads(p.stdout)
        (r,), (d,) = doc["runs"], doc["devices"]
        assert r["run_id"] == run_id and r["status"] == "complete" and d["resumed"]
        assert d["jobs_skipped"] >= len(killed_at)  # what host a measured is not measured again
        assert time.monotonic() - t0 < 200
    finally:
        st.close()
    st = Store(url)
    try:
        recs = st.records(run_id=run_id)
        keys = [(x.shape_key, x.candidate_key, x.round) for x in recs]
        assert len(keys) == len(set(keys))  # no job measured twice
        now = {x.id: (x.candidate_key, x.round, x.samples_ns.tolist()) for x in recs}
        assert all(now[i] == v for i, v in killed_at.items())  # no record lost or changed
        assert st.get_run(run_id)["status"] == "complete" and st.device_holders() == {}
    finally:
        st.close()


def test_a_host_joins_a_run_on_a_second_board_and_its_killed_share_is_resumed_by_the_holder(lab, ssh_farm, tmp_path):
    """Host a tunes six shape points on board 1; host b joins the run (--join) on board 2, a board of
    the same kind: each claims the points nobody measures yet. Host b is killed with kill -9 while it
    measures one; host a waits for that point's claim to expire, resumes it and ends the run. Every
    (shape, candidate, round) is measured once, what b recorded is kept, and the report says which
    board measured each point."""
    url, homes, model = lab["url"], lab["homes"], lab["model"]
    p = run(["devices", "add", "board2", f"ssh://{ssh_farm['user']}@{ssh_farm['host']}:{ssh_farm['port']}",
             "--key", ssh_farm["key"], "--known-hosts", ssh_farm["known_hosts"], "--python", sys.executable,
             "--identity", "lab-board-2", "--workdir", str(tmp_path / "board2")], homes["host-b"])
    assert p.returncode == 0, p.stderr
    args = ["--budget", "18", "--rounds", "1", "--finalists", "2", "--max-candidates", "3", "--space", "ort",
            "--sweep", "batch=1,2,3,4,5,6", "--db", url, "--format", "json"]
    a = _popen(["tune", model, "-d", "board", *args], homes["host-a"], "host-a")
    st = Store(url)
    b = None
    try:
        deadline = time.monotonic() + 120
        run_id = None
        while run_id is None and time.monotonic() < deadline and a.poll() is None:
            runs = [r for r in st.runs() if r["device"] == "board"]
            run_id = runs[0]["id"] if runs else None
            time.sleep(0.05)
        assert run_id is not None, a.stderr.read() if a.stderr else ""
        # host b: the run's id, the model and its own board; the run's settings and shapes come from the database
        b = _popen(["tune", model, "-d", "board2", "--join", run_id, "--db", url, "--format", "json"],
                   homes["host-b"], "host-b")
        killed = None
        while time.monotonic() < deadline and b.poll() is None:
            mine = [x for x in st.shapes(run_id) if x["device"] == "lab-board-2" and x["status"] == "measuring"]
            if mine and any(r.shape_key == mine[0]["shape_key"] for r in st.records(run_id=run_id)):
                b.send_signal(signal.SIGKILL)
                b.wait(30)
                killed = mine[0]["shape_key"]
                break
            time.sleep(0.05)
        assert killed is not None, "host b was not caught measuring: " + (b.stderr.read() if b.stderr else "")
        at_kill = {r.id: (r.shape_key, r.candidate_key, r.round, r.samples_ns.tolist())
                   for r in st.records(run_id=run_id)}
        b_points = {x["shape_key"] for x in st.shapes(run_id) if x["device"] == "lab-board-2"}
        by_b = sum(1 for v in at_kill.values() if v[0] in b_points)
        out_a, err_a = a.communicate(timeout=300)
        assert a.returncode == 0, err_a
        doc = json.loads(out_a)
        (d,), (r,) = doc["devices"], doc["runs"]
        assert r["run_id"] == run_id and r["status"] == "complete" and not d["joined"]
        assert "waiting for 1 shape point(s)" in err_a or killed in d["shapes_measured"]
        assert killed in d["shapes_measured"]  # the killed share was resumed by the holder
    finally:
        for proc in (a, b):
            if proc is not None and proc.poll() is None:
                proc.kill()
        st.close()
    st = Store(url)
    try:
        recs = st.records(run_id=run_id)
        keys = [(x.shape_key, x.candidate_key, x.round) for x in recs]
        assert len(keys) == len(set(keys))
        assert len(recs) == d["jobs_run"] + by_b  # no job measured twice: a measured all that b had not
        now = {x.id: (x.shape_key, x.candidate_key, x.round, x.samples_ns.tolist()) for x in recs}
        assert all(now[i] == v for i, v in at_kill.items())  # nothing b recorded was lost or changed
        points = st.shapes(run_id)
        assert len(points) == 6 and all(x["status"] == "done" for x in points)
        on = {x["shape_key"]: x["device"] for x in points}
        assert on[killed] == "lab-board-2,lab-board-1"  # begun on board 2, resumed on board 1, and said so
        assert all(v in ("lab-board-1", "lab-board-2") for k, v in on.items() if k != killed)
        for x in recs:  # every job names the board that measured it
            assert x.verdict["measured_on"] == ("lab-board-2" if x.id in at_kill and x.shape_key in b_points
                                                else "lab-board-1")
        assert st.device_holders() == {}
    finally:
        st.close()
    rep = run(["report", "--run", run_id, "--db", url], homes["host-c"], _env("host-c"))
    assert rep.returncode == 0, rep.stderr
    assert "(measured on `lab-board-2`, resumed on `lab-board-1`)" in rep.stdout
    assert "(measured on `lab-board-1`)" in rep.stdout


def test_joining_refuses_what_it_cannot_join(lab):
    url, homes, model = lab["url"], lab["homes"], lab["model"]
    p = run(["tune", model, "-d", "board", "--join", "0123456789abcdef", "--db", url], homes["host-b"], _env("host-b"))
    assert p.returncode == 2 and p.stderr.strip() == "error: no run '0123456789abcdef' to join in the database"
    p = run(["tune", model, "-d", "board", "--db", url, *TUNE], homes["host-a"], _env("host-a"))
    assert p.returncode == 0, p.stderr
    run_id = json.loads(p.stdout)["runs"][0]["run_id"]
    p = run(["tune", model, "-d", "board", "--join", run_id, "--db", url], homes["host-b"], _env("host-b"))
    assert p.returncode == 2 and p.stderr.strip() == f"error: run {run_id} is complete: there is nothing left to join"
    other = build_tiny(homes["host-b"] / "other.onnx", features=12)
    st = Store(url)
    try:  # unfinished runs (as a crash leaves them): one of the run above's settings, one without settings
        conf = json.loads(st.get_run(run_id)["config"])
        st.start_run("feedfacefeedface", str(model), "0" * 64, "board", "fk", {}, {}, conf)
        st.start_run("badc0ffeebadc0ff", str(model), "0" * 64, "board", "fk", {}, {}, {"budget_s": 1})
        real = st.get_run(run_id)  # the right model, recorded on hardware this board is not
        st.start_run("0ther0ther0ther0", str(model), real["model_sha256"], "board", "other-fp", {}, {}, conf)
    finally:
        st.close()
    p = run(["tune", other, "-d", "board", "--join", "feedfacefeedface", "--db", url], homes["host-b"], _env("host-b"))
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and "is not the model of run feedfacefeedface" in p.stderr
    p = run(["tune", model, "-d", "board", "--join", "badc0ffeebadc0ff", "--db", url], homes["host-b"], _env("host-b"))
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and "has no recorded settings a tune can join" in p.stderr
    p = run(["tune", model, "-d", "board", "--join", "0ther0ther0ther0", "--db", url, "--format", "json"],
            homes["host-b"], _env("host-b"))
    assert p.returncode == 3, p.stderr
    (d,) = json.loads(p.stdout)["devices"]
    assert d["status"] == "down" and "board cannot join run 0ther0ther0ther0: its fingerprint" in d["error"]


def test_a_database_url_it_cannot_serve_gets_one_line(pg_server, tmp_path):
    base = pg_server["url"].rsplit("/", 1)[0]
    home = tmp_path / "home"
    for url, why in ((base + "/no_such_db", 'database "no_such_db" does not exist'),
                     (base.replace("edgetune@", "nobody:hunter2@") + "/postgres", 'role "nobody" does not exist')):
        for args in (["db", "ls", "--db", url], ["devices", "ls", "--no-probe", "--db", url]):
            p = run(args, home)
            assert p.returncode == 4 and "Traceback" not in p.stderr, p.stderr
            lines = [x for x in p.stderr.splitlines() if x.strip()]
            assert len(lines) == 1 and "cannot reach database" in lines[0] and why in lines[0], p.stderr
            assert "hunter2" not in p.stderr
    assert not home.exists() or not any(home.rglob("*.db"))
