"""The store's database: one connection to SQLite (one file, WAL; the embedded default) or
PostgreSQL (a lab's shared database, ``--db postgresql://user@host/db``), what differs between
the two, and the one schema, created or migrated atomically and versioned.

Schema creation and migration run in one write transaction (BEGIN IMMEDIATE) behind a busy
timeout, so processes opening a fresh database at once all succeed.

PostgreSQL. The same tables (times as double precision, samples as bytea); a transaction locks the
rows it decides on (``FOR UPDATE``) where SQLite takes its one write lock (``BEGIN IMMEDIATE``);
schema creation runs under an advisory lock.

Files. The database (and SQLite's -wal/-shm, which take its mode) is created 0600 and must be
ours; the default one lives in the private edgetune home (devices/inventory.private_home).
"""

from __future__ import annotations

import os
import re
import sqlite3
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

from edgetune.db.samples import samples_ok
from edgetune.devices.inventory import edgetune_home, private_home
from edgetune.errors import StoreError
from edgetune.private import FILE_MODE, create_private_file

SCHEMA_VERSION = 4  # 2: runs.owner, runs.lease_until (run leases); 3: device_leases; 4: run_shapes

_URL_RE = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")

_TABLES = ("""
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)""", """
CREATE TABLE IF NOT EXISTS runs (
    id TEXT PRIMARY KEY,
    created REAL NOT NULL,
    finished REAL,
    status TEXT NOT NULL,             -- running | complete | down | failed: <error> | interrupted
    model_path TEXT NOT NULL,
    model_sha256 TEXT NOT NULL,
    device TEXT NOT NULL,
    fingerprint_key TEXT NOT NULL,
    fingerprint TEXT NOT NULL,        -- JSON
    versions TEXT NOT NULL,           -- JSON
    config TEXT NOT NULL,             -- JSON: budget, sweeps, spaces, command
    summary TEXT,                     -- JSON, written when complete
    owner TEXT,                       -- holder of the run while running (Owner), NULL once released
    lease_until REAL                  -- unix time the holder's lease ends unless renewed
)""", """
CREATE TABLE IF NOT EXISTS records (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    run_id TEXT NOT NULL REFERENCES runs(id),
    workload_key TEXT NOT NULL,
    shape TEXT NOT NULL,              -- JSON of the bound dims, e.g. {"batch": 4}
    shape_key TEXT NOT NULL,
    fingerprint_key TEXT NOT NULL,
    candidate_key TEXT NOT NULL,
    candidate TEXT NOT NULL,          -- JSON
    versions TEXT NOT NULL,           -- JSON
    round INTEGER NOT NULL,
    status TEXT NOT NULL,             -- verified | failed
    reason TEXT NOT NULL,
    verdict TEXT NOT NULL,            -- JSON
    samples BLOB NOT NULL,            -- int64 little-endian nanoseconds, every sample
    wall_ms REAL NOT NULL,
    agent_ms REAL NOT NULL,
    created REAL NOT NULL,
    UNIQUE (run_id, shape_key, candidate_key, round)
)""", """
CREATE INDEX IF NOT EXISTS records_lookup ON records (workload_key, fingerprint_key, candidate_key)""", """
CREATE TABLE IF NOT EXISTS device_leases (
    device TEXT PRIMARY KEY,          -- the device's identity (inventory.device_identity)
    owner TEXT,                       -- the process driving it (Owner), NULL when free
    lease_until REAL,
    since REAL,
    run_id TEXT                       -- the run it is measuring
)""", """
CREATE TABLE IF NOT EXISTS run_shapes (
    run_id TEXT NOT NULL REFERENCES runs(id),
    shape_key TEXT NOT NULL,
    idx INTEGER NOT NULL,             -- its place in the run's order
    status TEXT NOT NULL,             -- pending | done
    owner TEXT,                       -- the process measuring it now (Owner), NULL when nobody is
    lease_until REAL,
    device TEXT,                      -- the device (identity) that measures or measured it
    PRIMARY KEY (run_id, shape_key)
)""")
# the same schema in PostgreSQL's types: times in double precision (real is 4 bytes there)
_PG_TABLES = tuple(t.replace(" REAL", " DOUBLE PRECISION").replace("INTEGER PRIMARY KEY AUTOINCREMENT",
                                                                     "BIGSERIAL PRIMARY KEY").replace(" BLOB", " BYTEA")
                   for t in _TABLES) + ("""
CREATE OR REPLACE FUNCTION samples_ok(b bytea) RETURNS integer LANGUAGE sql IMMUTABLE AS $$
  -- a non-empty array of little-endian int64 that are all positive (samples.samples_problem): in hex, every
  -- 16-digit sample has its sign bit clear (its last byte's first digit < 8) and none is all zeros;
  -- two regular expressions, linear in the array (a loop in plpgsql took minutes for 100,000 samples)
  SELECT CASE WHEN b IS NULL OR length(b) = 0 OR length(b) % 8 <> 0 THEN 0
              WHEN encode(b, 'hex') ~ '^([0-9a-f]{14}[0-7][0-9a-f])+$'
                   AND encode(b, 'hex') !~ '^([0-9a-f]{16})*0{16}' THEN 1
              ELSE 0 END
$$""",)
_PG_SCHEMA_LOCK = 7_231_904_113  # pg_advisory_xact_lock key: one schema creator at a time
_LEASE_COLUMNS = (("owner", "TEXT"), ("lease_until", "REAL"))


def default_db_path() -> Path:
    return Path(os.environ.get("EDGETUNE_DB") or edgetune_home() / "edgetune.db")


def redact(url: str) -> str:
    """A database URL without its password (error messages and reports never show one)."""
    return re.sub(r"^([A-Za-z][A-Za-z0-9+.-]*://[^/@:]*):[^/@]*@", r"\1:***@", url)


class _Conn:
    """The store's connection as its statements see it: SQLite's ``?`` placeholders, whichever database."""

    def __init__(self, conn: Any, pg: bool):
        self.conn, self.pg = conn, pg

    def execute(self, sql: str, args: tuple | list = ()) -> Any:
        if self.pg:  # no parameters: the text goes as it is (a '%' in it is not a placeholder)
            return self.conn.execute(sql.replace("?", "%s"), args) if args else self.conn.execute(sql)
        return self.conn.execute(sql, args)


class Database:
    """One connection to the store's database and the schema in it. The rest of the store (leases,
    records) talks to it through ``tx``/``_write`` (transactions) and ``_query`` (reads), in SQLite's
    dialect: ``?`` placeholders, and ``_for_update``/``_skip_locked``/``_for_share`` for the row
    locks PostgreSQL adds."""

    def __init__(self, path: str | os.PathLike | None = None, create: bool = True):
        raw = os.fspath(path) if path else os.environ.get("EDGETUNE_DB") or ""
        self.memory = raw == ":memory:"
        self._lock = threading.RLock()  # one connection, shared by a tune's device threads and the heartbeat
        self.pg = False
        if _URL_RE.match(str(raw)):  # before Path(): it would fold "postgresql://h" into a directory name
            scheme = str(raw).split(":", 1)[0].lower()
            if scheme not in ("postgresql", "postgres"):
                raise StoreError(f"--db takes an SQLite file path or a postgresql:// URL (got a {scheme}:// URL)")
            self._open_pg(str(raw))
            return
        self._errors: tuple = (sqlite3.DatabaseError,)
        if raw:
            self.path = Path(raw)
        else:
            home = edgetune_home()
            self.path = home / "edgetune.db"
            if create or home.exists():
                private_home()  # the default home is the one directory created for the user
        if not self.memory:
            self._check_file(create)
        try:
            self.conn = sqlite3.connect(str(self.path), timeout=30, isolation_level=None,
                                        check_same_thread=False)
        except sqlite3.DatabaseError as exc:
            raise StoreError(f"cannot use database {self.path}: {exc}") from exc
        self._c = _Conn(self.conn, False)
        try:
            self.conn.execute("PRAGMA busy_timeout=30000")
            self.conn.execute("PRAGMA synchronous=NORMAL")
            self.conn.execute("PRAGMA foreign_keys=ON")
            self.conn.create_function("samples_ok", 1, samples_ok, deterministic=True)
            # switching a fresh file to WAL and creating the schema need the write lock; SQLite does
            # not always call its busy handler there (a journal-mode change answers SQLITE_BUSY at
            # once while another process does the same), so those two steps wait here
            _while_busy(lambda: self.conn.execute("PRAGMA journal_mode=WAL"))
            _while_busy(self._init_schema)
        except sqlite3.DatabaseError as exc:
            self.conn.close()
            raise StoreError(f"cannot use database {self.path}: {exc}") from exc
        except BaseException:
            self.conn.close()
            raise
        if not self.memory:
            for f in (self.path, Path(f"{self.path}-wal"), Path(f"{self.path}-shm")):
                _tighten_file(f)  # one of ours made by an older edgetune with the umask's 0644

    def _open_pg(self, url: str) -> None:
        """Connect to a PostgreSQL database (psycopg 3) and create or check the schema there."""
        try:
            import psycopg
        except ImportError:
            raise StoreError("a postgresql:// database needs psycopg (pip install 'edgetune[lab]')") from None
        self.path = redact(url)  # what messages name; the password stays out of them
        self._errors = (psycopg.Error,)
        try:
            self.conn = psycopg.connect(url, autocommit=True, connect_timeout=10, application_name="edgetune")
        except psycopg.Error as exc:
            raise StoreError(f"cannot reach database {self.path}: {_pg_reason(exc)}") from None
        self.pg = True
        self._c = _Conn(self.conn, True)
        try:
            self._init_schema()
        except psycopg.Error as exc:
            self.conn.close()
            raise StoreError(f"cannot use database {self.path}: {_pg_reason(exc)}") from None
        except BaseException:
            self.conn.close()
            raise

    @property
    def _for_update(self) -> str:
        """Lock the rows a transaction decides on (PostgreSQL); SQLite's transaction holds its one write lock."""
        return " FOR UPDATE" if self.pg else ""

    @property
    def _skip_locked(self) -> str:
        """Lock the rows a claim takes, passing over those another transaction is claiming (PostgreSQL)."""
        return " FOR UPDATE SKIP LOCKED" if self.pg else ""

    @property
    def _for_share(self) -> str:
        return " FOR SHARE" if self.pg else ""

    def _check_file(self, create: bool) -> None:
        """The database file exists (created 0600 when allowed) and is ours; nothing is created
        in a directory that does not exist."""
        p = self.path
        if not os.path.lexists(p):
            if not create:
                raise StoreError(f"database not found: {p}")
            if not p.parent.is_dir():
                raise StoreError(f"cannot create database {p}: directory {p.parent} does not exist")
            try:
                create_private_file(p)
            except OSError as exc:
                raise StoreError(f"cannot create database {p}: {exc.strerror or exc}") from None
        try:
            st = os.stat(p)
        except OSError as exc:
            raise StoreError(f"cannot use database {p}: {exc.strerror or exc}") from None
        if st.st_uid != os.getuid():
            raise StoreError(f"database {p} is owned by uid {st.st_uid}, not by you (uid {os.getuid()}); "
                             f"refusing to use it")

    def _schema_version(self) -> str | None:
        if self.pg:
            if self._c.execute("SELECT to_regclass('meta')").fetchone()[0] is None:
                return None
            row = self._c.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
            return row[0] if row else None
        try:
            row = self.conn.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
        except sqlite3.OperationalError as exc:
            if "no such table" in str(exc):
                return None
            raise
        return row[0] if row else None

    def _init_schema(self) -> None:
        """Create or migrate the schema in one write transaction: of processes opening a fresh or
        older database at once, one does it and the others find it done."""
        if self._schema_version() == str(SCHEMA_VERSION):
            return
        with self.tx() as c:
            if self.pg:  # SQLite's write lock serializes this; PostgreSQL needs a lock of its own
                c.execute("SELECT pg_advisory_xact_lock(?)", (_PG_SCHEMA_LOCK,))
            version = self._schema_version()
            if version == str(SCHEMA_VERSION):
                return
            if version not in (None, "1", "2", "3"):
                raise StoreError(f"database {self.path} has schema version {version}, "
                                 f"this edgetune reads {SCHEMA_VERSION}")
            for stmt in _PG_TABLES if self.pg else _TABLES:  # (older versions: what they lack; every row kept)
                c.execute(stmt)
            if not self.pg:
                have = {r[1] for r in c.execute("PRAGMA table_info(runs)")}
                for col, kind in _LEASE_COLUMNS:  # 1 -> 2: every run and record kept as it is
                    if col not in have:
                        c.execute(f"ALTER TABLE runs ADD COLUMN {col} {kind}")
            c.execute("INSERT INTO meta VALUES ('schema_version', ?) ON CONFLICT (key) DO NOTHING", (str(SCHEMA_VERSION),))
            c.execute("UPDATE meta SET value=? WHERE key='schema_version'", (str(SCHEMA_VERSION),))

    class _Tx:
        def __init__(self, store: "Database"):
            self.store = store

        def __enter__(self):
            self.store._lock.acquire()
            try:
                self.store.conn.execute("BEGIN" if self.store.pg else "BEGIN IMMEDIATE")
            except BaseException:
                self.store._lock.release()
                raise
            return self.store._c

        def __exit__(self, et, ev, tb):
            try:
                if et is None:
                    try:
                        self.store.conn.execute("COMMIT")
                    except BaseException:
                        self.store.conn.execute("ROLLBACK")
                        raise
                else:
                    self.store.conn.execute("ROLLBACK")
            finally:
                self.store._lock.release()
            return False

    def tx(self):
        return Database._Tx(self)

    @contextmanager
    def _write(self) -> Iterator[_Conn]:
        """A write transaction whose database errors are one StoreError line (edgetune's own
        errors raised inside, LeaseLost among them, pass as they are)."""
        try:
            with self.tx() as c:
                yield c
        except self._errors as exc:
            raise StoreError(f"cannot write database {self.path}: {_pg_reason(exc)}") from None

    def _query(self, sql: str, args: tuple | list = ()) -> tuple[list[str], list[tuple]]:
        with self._lock:
            try:
                cur = self._c.execute(sql, args)
                return [d[0] for d in cur.description], cur.fetchall()
            except self._errors as exc:
                raise StoreError(f"cannot read database {self.path}: {_pg_reason(exc)}") from None

    def close(self) -> None:
        """Close the connection (closing twice is harmless). ``Store.close`` gives its leases back first."""
        with self._lock:
            self.conn.close()


def _pg_reason(exc: BaseException) -> str:
    """One line of a database error, without a password the server may echo back."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    return re.sub(r"password=\S+", "password=***", text)[:300]


def _while_busy(step: Callable[[], Any], wait_s: float = 30.0) -> Any:
    """Run ``step``, again while the database is locked by another process, up to ``wait_s``."""
    deadline = time.monotonic() + wait_s
    delay = 0.01
    while True:
        try:
            return step()
        except sqlite3.OperationalError as exc:
            msg = str(exc)
            if ("locked" not in msg and "busy" not in msg) or time.monotonic() > deadline:
                raise
        time.sleep(delay)
        delay = min(0.2, delay * 2)


def _tighten_file(path: Path) -> None:
    try:
        st = os.lstat(path)
        if st.st_uid == os.getuid() and st.st_mode & 0o077 and not os.path.islink(path):
            os.chmod(path, FILE_MODE)
    except OSError:
        pass

