"""What holds results or inventory is private (files 0600, directories 0700) and ours; what cannot
be a database path is refused before anything is created; the inventory holds any text."""

from __future__ import annotations

import json
import os
import sqlite3
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from edgetune.db import Record, Store
from edgetune.devices.inventory import HOME_SUBDIRS, Inventory, home_subdir, private_home
from edgetune.errors import StoreError, UserInputError
from edgetune.private import NotPrivate
from tests.conftest import require

ROOT = Path(__file__).resolve().parents[2]
EDGETUNE = [sys.executable, "-m", "edgetune.cli.main"]
NOBODY = 65534


def mode(p: Path) -> int:
    return stat.S_IMODE(os.lstat(p).st_mode)


def run(args, home: Path, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    env = {**os.environ, "EDGETUNE_HOME": str(home), "PYTHONPATH": str(ROOT), "COLUMNS": "200"}
    env.pop("EDGETUNE_DB", None)
    return subprocess.run(EDGETUNE + list(args), cwd=cwd, env=env, capture_output=True, text=True, timeout=180)


def assert_one_line_error(p: subprocess.CompletedProcess, needle: str) -> str:
    assert p.returncode != 0, p.stdout
    assert "Traceback" not in p.stderr + p.stdout
    lines = [line for line in p.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), p.stderr
    assert needle in lines[0], lines[0]
    return lines[0]


def _add_record(store: Store) -> None:
    store.start_run("r", "m.onnx", "0" * 64, "local", "fp", {}, {}, {})
    store.add_record(Record(run_id="r", workload_key="w", shape={}, shape_key="s", fingerprint_key="fp",
                            candidate={"key": "k", "backend": "ort", "params": {}}, versions={}, round=0,
                            status="verified", reason="", verdict={}, samples_ns=[1000], wall_ms=1.0, agent_ms=1.0))


def test_database_inventory_and_home_are_private(tmp_path):
    home = Path(os.environ["EDGETUNE_HOME"])
    old = os.umask(0o022)  # what a user typically has: files 0644, directories 0755 unless we say otherwise
    try:
        store = Store()  # the default database: in the home, which is created for it
        _add_record(store)
        db = home / "edgetune.db"
        assert mode(home) == 0o700
        for f in (db, Path(f"{db}-wal"), Path(f"{db}-shm")):
            assert f.exists() and mode(f) == 0o600, f
        store.close()
        other = Store(tmp_path / "given.db")  # a --db path: the file is private too
        _add_record(other)
        assert mode(tmp_path / "given.db") == 0o600 and mode(tmp_path / "given.db-wal") == 0o600
        other.close()
        Inventory().add("pi", "ssh://pi@127.0.0.1:1", workdir="/tmp/w")
        assert mode(home / "devices.toml") == 0o600
        assert not [p.name for p in home.iterdir() if p.name.endswith(".tmp")]  # written atomically
        for name in HOME_SUBDIRS:
            assert mode(home_subdir(name)) == 0o700
    finally:
        os.umask(old)


def test_an_open_home_of_ours_is_tightened_without_fuss(tmp_path):
    home = Path(os.environ["EDGETUNE_HOME"])
    for d in (home, *(home / n for n in HOME_SUBDIRS)):  # as an older edgetune left them
        d.mkdir(parents=True, exist_ok=True)
        os.chmod(d, 0o755)
    Inventory().add("pi", "ssh://pi@127.0.0.1:1")
    os.chmod(home / "devices.toml", 0o644)
    store = Store()
    _add_record(store)
    store.close()
    os.chmod(home, 0o755)
    os.chmod(home / "edgetune.db", 0o644)
    Store().close()
    assert mode(home) == 0o700 and mode(home / "edgetune.db") == 0o600
    assert all(mode(home / n) == 0o700 for n in HOME_SUBDIRS)
    os.chmod(home, 0o755)
    assert "pi" in Inventory().load()
    assert mode(home) == 0o700 and mode(home / "devices.toml") == 0o600


def test_another_users_home_and_database_are_refused_in_process(tmp_path, monkeypatch):
    home = Path(os.environ["EDGETUNE_HOME"])
    Inventory().add("pi", "ssh://pi@127.0.0.1:1")
    Store().close()
    Store(tmp_path / "given.db").close()
    monkeypatch.setattr(os, "getuid", lambda: os.geteuid() + 4242)  # now everything there is someone else's
    with pytest.raises(NotPrivate, match="owned by uid"):
        private_home()
    with pytest.raises(NotPrivate, match="owned by uid"):
        Store()
    with pytest.raises(NotPrivate, match="owned by uid"):
        Inventory().load()
    with pytest.raises(StoreError, match="owned by uid"):
        Store(tmp_path / "given.db")
    assert mode(home) == 0o700  # refused, not re-moded


def test_another_users_home_and_database_are_refused_by_the_cli(tiny_model, tmp_path):
    # chown to another user needs root (CI runs as root: there a non-root run fails instead)
    require(os.geteuid() == 0, "root (to chown a planted home to another user)")
    home = tmp_path / "planted"
    home.mkdir(mode=0o755)
    os.chown(home, NOBODY, NOBODY)
    for args in (["db", "ls"], ["devices", "add", "pi", "ssh://pi@127.0.0.1:1"], ["tune", str(tiny_model)]):
        assert_one_line_error(run(args, home), f"owned by uid {NOBODY}")
    assert list(home.iterdir()) == []
    db = tmp_path / "theirs.db"
    Store(db).close()
    os.chown(db, NOBODY, NOBODY)
    assert_one_line_error(run(["db", "ls", "--db", str(db)], tmp_path / "home"), f"owned by uid {NOBODY}")


def test_database_urls_and_missing_directories_are_refused_creating_nothing(tiny_model, tmp_path):
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    home = tmp_path / "home"
    for url in ("sqlite:///x.db", "mysql://user:secret@127.0.0.1:1/edgetune"):
        for args in (["tune", str(tiny_model), "--db", url], ["db", "ls", "--db", url], ["report", "--db", url]):
            line = assert_one_line_error(run(args, home, cwd), "--db takes an SQLite file path or a postgresql:// URL")
            assert "secret" not in line
    # a PostgreSQL server that cannot be reached (nothing listens on port 1): one line, no password
    for url in ("postgresql://127.0.0.1:1/x", "postgresql://user:secret@127.0.0.1:1/edgetune"):
        for args in (["tune", str(tiny_model), "--db", url], ["db", "ls", "--db", url], ["report", "--db", url]):
            line = assert_one_line_error(run(args, home, cwd), "cannot reach database postgresql://")
            assert "secret" not in line and ("user:***@" in line or "user" not in url)
    for args in (["tune", str(tiny_model), "--db", "/nonexistent/dir/x.db"],
                 ["tune", str(tiny_model), "--db", str(tmp_path / "missing" / "x.db")]):
        assert_one_line_error(run(args, home, cwd), "does not exist")
    assert list(cwd.iterdir()) == [] and not (tmp_path / "missing").exists() and not home.exists()
    assert not Path("/nonexistent").exists()


HOSTILE = ["del\x7fete", "esc\x1b[31mred\x1b[0m", 'quote " and \'single\'', "back\\slash \\u0041 \\n", "new\nline\r",
           "tab\tnul\x00bell\x07", "c1\x85\x9b", "emoji 🎉 and 𝔘𝔫𝔦", "[/bold] [red]markup[/red]", "ünïcödé ★", ""]


def test_inventory_round_trips_hostile_strings(tmp_path):
    inv = Inventory(tmp_path / "devices.toml")
    for i, text in enumerate(HOSTILE):
        inv.add(f"d{i}", "ssh://u@127.0.0.1:1", workdir=text, key=text, python=text)
    loaded = Inventory(tmp_path / "devices.toml").load()
    for i, text in enumerate(HOSTILE):
        opts = loaded[f"d{i}"].options
        assert opts["workdir"] == opts["key"] == opts["python"] == text, repr(text)
    raw = (tmp_path / "devices.toml").read_text(encoding="utf-8")
    assert "\x7f" not in raw and "\x1b" not in raw and "\\ud83c" not in raw.lower() and "🎉" in raw
    before = raw
    with pytest.raises(UserInputError, match="surrogate"):
        inv.add("bad", "ssh://u@127.0.0.1:1", workdir="lone \udc80 surrogate")
    assert (tmp_path / "devices.toml").read_text(encoding="utf-8") == before


def test_a_control_character_added_through_the_cli_keeps_the_inventory_readable(tmp_path):
    home = tmp_path / "home"
    p = run(["devices", "add", "pi", "ssh://pi@127.0.0.1:1", "--workdir", "/tmp/w\x7f\x1b[0m🎉"], home)
    assert p.returncode == 0, p.stderr
    p = run(["devices", "ls", "--no-probe", "--format", "json"], home)
    assert p.returncode == 0, p.stderr
    assert {r["name"] for r in json.loads(p.stdout)} == {"local", "pi"}
    assert Inventory(home / "devices.toml").load()["pi"].options["workdir"] == "/tmp/w\x7f\x1b[0m🎉"


def test_a_database_file_mode_is_its_wal_files_mode(tmp_path):
    """SQLite creates -wal/-shm with the database file's mode: a 0600 database keeps them 0600
    whatever the umask."""
    old = os.umask(0)
    try:
        store = Store(tmp_path / "t.db")
        _add_record(store)
        con = sqlite3.connect(tmp_path / "t.db")  # a second connection, as another process would open it
        con.execute("SELECT COUNT(*) FROM records").fetchone()
        assert {mode(p) for p in tmp_path.glob("t.db*")} == {0o600}
        con.close()
        store.close()
    finally:
        os.umask(old)


def test_an_atomic_write_is_whole_or_absent_and_leaves_no_temporary(tmp_path):
    import threading

    from edgetune.private import write_atomic_file

    p = tmp_path / "r.json"
    write_atomic_file(p, "old")
    assert p.read_text() == "old" and mode(p) == 0o600
    write_atomic_file(p, b"x" * 10, 0o644)
    assert p.read_bytes() == b"x" * 10 and mode(p) == 0o644
    # the rename fails (a directory is in the way): nothing half-written, no temporary left
    (tmp_path / "d").mkdir()
    with pytest.raises(OSError):
        write_atomic_file(tmp_path / "d", "new")
    with pytest.raises(OSError):  # a missing directory: refused, nothing created
        write_atomic_file(tmp_path / "missing" / "r.json", "new")
    assert sorted(q.name for q in tmp_path.iterdir()) == ["d", "r.json"]
    # threads of one process (one pid) writing one path each get a temporary of their own
    blobs = [bytes([65 + i]) * 200_000 for i in range(8)]
    ts = [threading.Thread(target=write_atomic_file, args=(p, b)) for b in blobs]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert p.read_bytes() in blobs
    assert sorted(q.name for q in tmp_path.iterdir()) == ["d", "r.json"]
