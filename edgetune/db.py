"""The results store: SQLite (one file, WAL; the embedded default) or PostgreSQL (a lab's shared
database, ``--db postgresql://user@host/db``), one schema, schema-versioned, append-only records,
shared by any number of edgetune processes on any number of hosts.

Every record is keyed by workload (model hash + input shapes + inputs), device fingerprint,
candidate key and versions. Each record is committed on its own, so an interrupted tune (Ctrl-C,
kill -9) loses at most the job in flight, and a resumed run skips what is already recorded.

Sharing. Schema creation and migration run in one write transaction (BEGIN IMMEDIATE) behind a
busy timeout, so processes opening a fresh database at once all succeed. A run is *held* by one
process at a time through a lease in its row (``owner``, ``lease_until``): ``start_run`` takes a
free run, or one whose holder is gone, and otherwise waits for it (two processes measuring one
device at once would spoil each other's timings, so an identical run waits, then resumes and skips
what the first recorded). The Store's heartbeat thread renews its leases every HEARTBEAT_S for
LEASE_S; ``finish_run`` / ``release_run`` give a run back with its final status. A holder on this
host whose process is gone is taken over at once; a holder elsewhere once its lease has expired.
Only the holder writes a run's records; the (run, shape, candidate, round) key is never written
twice (a second write returns the first one's id).

Devices. A device is driven by one process at a time, on whatever host: ``acquire_device`` takes its
lease (``device_leases``), waiting while a live holder has it; the heartbeat renews it; a crashed
host's leases expire after LEASE_S and are taken over.

PostgreSQL. The same tables (times as double precision, samples as bytea); a transaction locks the
rows it decides on (``FOR UPDATE``) where SQLite takes its one write lock (``BEGIN IMMEDIATE``);
schema creation runs under an advisory lock. ``edgetune db migrate`` copies an SQLite database in.

Files. The database (and SQLite's -wal/-shm, which take its mode) is created 0600 and must be
ours; the default one lives in the private edgetune home (devices/inventory.private_home).
"""

from __future__ import annotations

import json
import os
import re
import sqlite3
import sys
import threading
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np

from edgetune.devices.inventory import edgetune_home, private_home, this_host
from edgetune.errors import StoreError
from edgetune.private import FILE_MODE, create_private_file

SCHEMA_VERSION = 4  # 2: runs.owner, runs.lease_until (run leases); 3: device_leases; 4: run_shapes

# a holder that has not renewed its lease for this long is presumed gone (EDGETUNE_LEASE_S: tests)
LEASE_S = float(os.environ.get("EDGETUNE_LEASE_S") or 30.0)
HEARTBEAT_S = min(5.0, LEASE_S / 3)  # how often a Store renews the leases it holds
WAIT_POLL_S = 0.5  # how often a waiting start_run looks again

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
  -- a non-empty array of little-endian int64 that are all positive (db.samples_problem): in hex, every
  -- 16-digit sample has its sign bit clear (its last byte's first digit < 8) and none is all zeros;
  -- two regular expressions, linear in the array (a loop in plpgsql took minutes for 100,000 samples)
  SELECT CASE WHEN b IS NULL OR length(b) = 0 OR length(b) % 8 <> 0 THEN 0
              WHEN encode(b, 'hex') ~ '^([0-9a-f]{14}[0-7][0-9a-f])+$'
                   AND encode(b, 'hex') !~ '^([0-9a-f]{16})*0{16}' THEN 1
              ELSE 0 END
$$""",)
_PG_SCHEMA_LOCK = 7_231_904_113  # pg_advisory_xact_lock key: one schema creator at a time
_LEASE_COLUMNS = (("owner", "TEXT"), ("lease_until", "REAL"))


@dataclass(frozen=True)
class RecordRow:
    id: int
    run_id: str
    workload_key: str
    shape: dict[str, int]
    shape_key: str
    fingerprint_key: str
    candidate_key: str
    candidate: dict[str, Any]
    versions: dict[str, Any]
    round: int
    status: str
    reason: str
    verdict: dict[str, Any]
    samples_ns: np.ndarray
    wall_ms: float
    agent_ms: float
    created: float


def default_db_path() -> Path:
    return Path(os.environ.get("EDGETUNE_DB") or edgetune_home() / "edgetune.db")


# ---- run holders ---------------------------------------------------------------------------

_HOST = this_host()


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip().replace("-", "")[:12]
    except OSError:
        return ""


def _proc_stat(pid: int) -> tuple[str, str] | None:
    """(state, start time) of a process from /proc, or None where /proc cannot tell."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return fields[0], fields[19]
    except (OSError, IndexError):
        return None


@dataclass(frozen=True)
class Owner:
    """Who holds a run: a process on a host. Stored as ``pid@host#boot.start.token``; boot id and
    process start time tell a pid reused later (or after a reboot) from the holder, the token one
    Store from another in the same process."""

    pid: int
    host: str
    boot: str
    start: str
    token: str

    @classmethod
    def mine(cls) -> "Owner":
        st = _proc_stat(os.getpid())
        return cls(os.getpid(), _HOST, _boot_id(), st[1] if st else "", uuid.uuid4().hex[:8])

    @classmethod
    def parse(cls, text: str) -> "Owner | None":
        try:
            pid, rest = text.split("@", 1)
            host, tag = rest.rsplit("#", 1)
            boot, start, token = tag.split(".")
            return cls(int(pid), host, boot, start, token)
        except ValueError:
            return None

    def __str__(self) -> str:
        return f"{self.pid}@{self.host}#{self.boot}.{self.start}.{self.token}"

    def describe(self) -> str:
        return f"pid {self.pid} on {self.host}"

    def same_process(self, other: "Owner") -> bool:
        """The same process (another Store of it: the token differs)."""
        return (self.pid, self.host, self.boot, self.start) == (other.pid, other.host, other.boot, other.start)

    def gone(self) -> bool:
        """True when this holder is known to have ended: a process on this host that no longer
        runs (or is a zombie, or is another process under a reused pid). A holder on another host
        cannot be seen from here: only its lease tells."""
        if self.host != _HOST:
            return False
        boot = _boot_id()
        if self.boot and boot and self.boot != boot:
            return True
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            pass  # alive, another user's
        st = _proc_stat(self.pid)
        if st is not None and (st[0] in ("Z", "X") or (self.start and st[1] != self.start)):
            return True
        return False


class LeaseLost(StoreError):
    """Another process took over a run this one held (its lease had expired)."""


class DeviceBusy(StoreError):
    """Another process drives the device, and the caller would not wait (longer)."""


# ---- stored samples ------------------------------------------------------------------------

def samples_problem(blob: Any) -> str:
    """What makes a stored sample array unusable as timings ("" when nothing). Older versions
    stored whatever an agent sent; a timing is a positive whole number of nanoseconds."""
    if not isinstance(blob, (bytes, bytearray, memoryview)):
        return "not a sample array"
    if len(blob) % 8:
        return f"{len(blob)} bytes is not a whole number of int64 samples"
    arr = np.frombuffer(blob, dtype="<i8")
    bad = int(np.count_nonzero(arr <= 0))
    return f"{bad} of {arr.size} samples are zero or negative" if bad else ""


def _samples_ok(blob: Any) -> int:  # SQL function for counts: a non-empty, valid sample array
    return int(isinstance(blob, (bytes, bytearray, memoryview)) and len(blob) > 0 and not samples_problem(blob))


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


class Store:
    def __init__(self, path: str | os.PathLike | None = None, create: bool = True):
        raw = os.fspath(path) if path else os.environ.get("EDGETUNE_DB") or ""
        self.memory = raw == ":memory:"
        self.owner = Owner.mine()
        self._lock = threading.RLock()  # one connection, shared by a tune's device threads and the heartbeat
        self._held: set[str] = set()
        self._devices: set[str] = set()
        self._shapes: set[tuple[str, str]] = set()  # (run, shape point) claimed
        self._stop = threading.Event()
        self._beat: threading.Thread | None = None
        self._closed = False
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
            self.conn.create_function("samples_ok", 1, _samples_ok, deterministic=True)
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
        def __init__(self, store: "Store"):
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
        return Store._Tx(self)

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
        """Stop the heartbeat, give back the runs still held (status 'interrupted': whoever held
        them did not finish or release them), close the connection. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        if self._beat is not None and self._beat is not threading.current_thread():
            self._beat.join(timeout=60)
        with self._lock:
            if self._held or self._devices or self._shapes:
                try:
                    with self.tx() as c:
                        c.execute("UPDATE runs SET status='interrupted', finished=?, owner=NULL, lease_until=NULL"
                                  " WHERE owner=?", (time.time(), str(self.owner)))
                        c.execute("UPDATE device_leases SET owner=NULL, lease_until=NULL, run_id=NULL WHERE owner=?",
                                  (str(self.owner),))
                        c.execute("UPDATE run_shapes SET owner=NULL, lease_until=NULL WHERE owner=?", (str(self.owner),))
                except self._errors:
                    pass  # the lease runs out by itself; this host takes over at once anyway
                self._held.clear()
                self._devices.clear()
                self._shapes.clear()
            self.conn.close()

    # ------------------------------------------------------------------------------- runs
    def _holder(self, owner: str | None, lease_until: float | None) -> Owner | str | None:
        """Who holds a run now (None: nobody, it may be taken). This Store counts as a holder."""
        if not owner:
            return None
        if owner == str(self.owner):
            return self.owner
        if lease_until is None or lease_until < time.time():
            return None
        who = Owner.parse(owner)
        if who is None:
            return owner  # not ours to read: its lease says how long it holds
        return None if who.gone() else who

    def _run_dict(self, cols: list[str], row: tuple) -> dict[str, Any]:
        """A run row, its status as it stands: a 'running' run whose holder is gone is 'interrupted'
        (killed, or left by a version before leases); ``holder``: who runs it now, or None."""
        d = dict(zip(cols, row))
        holder = self._holder(d.get("owner"), d.get("lease_until")) if d["status"] == "running" else None
        if d["status"] == "running" and holder is None:
            d["status"] = "interrupted"
        d["holder"] = holder.describe() if isinstance(holder, Owner) else holder
        return d

    def get_run(self, run_id: str) -> dict[str, Any] | None:
        cols, rows = self._query("SELECT * FROM runs WHERE id=?", (run_id,))
        return self._run_dict(cols, rows[0]) if rows else None

    def start_run(self, run_id: str, model_path: str, model_sha: str, device: str, fp_key: str,
                  fingerprint: dict, versions: dict, config: dict,
                  on_wait: Callable[[str], None] | None = None, wait_s: float | None = None) -> bool:
        """Create the run, or take it up again to resume it; either way this Store holds it until
        ``finish_run``/``release_run``/``close``. Returns True when it already existed.

        A run held by a live process is waited for (``on_wait(holder)`` is called once when the wait
        begins; ``wait_s``: give up after that many seconds with StoreError, None: wait as long as
        the holder lives)."""
        waited_since: float | None = None
        while True:
            with self._write() as c:
                row = c.execute("SELECT owner, lease_until FROM runs WHERE id=?" + self._for_update,
                                (run_id,)).fetchone()
                holder = self._holder(*row) if row else None
                lease = time.time() + LEASE_S
                if row is None:
                    cur = c.execute("INSERT INTO runs (id, created, status, model_path, model_sha256, device,"
                                    " fingerprint_key, fingerprint, versions, config, owner, lease_until)"
                                    " VALUES (?,?,?,?,?,?,?,?,?,?,?,?) ON CONFLICT (id) DO NOTHING",
                                    (run_id, time.time(), "running", model_path, model_sha, device, fp_key,
                                     json.dumps(fingerprint, sort_keys=True), json.dumps(versions, sort_keys=True),
                                     json.dumps(config, sort_keys=True), str(self.owner), lease))
                    if cur.rowcount == 0:  # another host created it a moment ago: look again
                        continue
                elif holder is None or holder is self.owner:
                    c.execute("UPDATE runs SET status='running', finished=NULL, owner=?, lease_until=?"
                              " WHERE id=?", (str(self.owner), lease, run_id))
            if holder is None or holder is self.owner:
                self._held.add(run_id)
                self._start_heartbeat()
                return row is not None
            waited_since = _wait(holder, waited_since, on_wait, wait_s, StoreError, f"run {run_id} is held by")

    def _start_heartbeat(self) -> None:
        with self._lock:
            if self._beat is None and not self._closed:
                self._beat = threading.Thread(target=self._heartbeat, name="edgetune-store-lease", daemon=True)
                self._beat.start()

    def _heartbeat(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            try:
                with self.tx() as c:
                    until = time.time() + LEASE_S
                    c.execute("UPDATE runs SET lease_until=? WHERE owner=?", (until, str(self.owner)))
                    c.execute("UPDATE device_leases SET lease_until=? WHERE owner=?", (until, str(self.owner)))
                    c.execute("UPDATE run_shapes SET lease_until=? WHERE owner=?", (until, str(self.owner)))
            except Exception:
                pass  # the next beat tries again; a lease lost meanwhile shows at the next write

    def finish_run(self, run_id: str, summary: dict) -> None:
        self.release_run(run_id, "complete", summary)

    def release_run(self, run_id: str, status: str, summary: dict | None = None) -> None:
        """Give a held run back with its final status: complete, down (the device went away),
        failed: <error> (the tune ended on an error), interrupted. Raises LeaseLost when another
        process took it over meanwhile (its status is then theirs to set)."""
        with self._write() as c:  # on a database error it stays held: close() gives it back, or its lease runs out
            cur = c.execute("UPDATE runs SET status=?, finished=?, summary=?, owner=NULL, lease_until=NULL"
                            " WHERE id=? AND owner=?",
                            (status, time.time(), json.dumps(summary, sort_keys=True) if summary is not None
                             else None, run_id, str(self.owner)))
            if cur.rowcount == 0:
                row = c.execute("SELECT owner FROM runs WHERE id=?", (run_id,)).fetchone()
                if row is None:
                    raise StoreError(f"no run '{run_id}' in {self.path}")
                if run_id in self._held:
                    self._held.discard(run_id)
                    raise LeaseLost(f"run {run_id} was taken over by {_describe(row[0])} while this process "
                                    f"held it (its lease ran out)")
                raise StoreError(f"run {run_id} is not held by this process; it cannot end it")
        self._held.discard(run_id)

    def take_run(self, run_id: str) -> bool:
        """Take a run up if nobody holds it now (its holder released it, died, or let its lease run
        out); False when a live process (or this Store already) holds it, or it is complete. For
        joining a run: a joiner that finds the run free resumes it and ends it."""
        with self._write() as c:
            row = c.execute("SELECT owner, lease_until, status FROM runs WHERE id=?" + self._for_update,
                            (run_id,)).fetchone()
            if row is None:
                raise StoreError(f"no run '{run_id}' in {self.path}")
            holder = self._holder(row[0], row[1])
            if row[2] == "complete" or (holder is not None and (holder is not self.owner or run_id in self._held)):
                return False  # ended, held elsewhere, or by another device's thread of this Store
            c.execute("UPDATE runs SET status='running', finished=NULL, owner=?, lease_until=? WHERE id=?",
                      (str(self.owner), time.time() + LEASE_S, run_id))
        self._held.add(run_id)
        self._start_heartbeat()
        return True

    # ------------------------------------------------------------------ shape points (jobs)
    def plan_shapes(self, run_id: str, shape_keys: list[str]) -> None:
        """Lay out a run's shape points as claimable units of work (what is already there stays):
        the hosts that run or join the run each claim one at a time (``claim_shape``)."""
        with self._write() as c:
            for i, key in enumerate(shape_keys):
                c.execute("INSERT INTO run_shapes (run_id, shape_key, idx, status) VALUES (?,?,?,'pending')"
                          " ON CONFLICT (run_id, shape_key) DO NOTHING", (run_id, key, i))

    def claim_shape(self, run_id: str, device: str) -> tuple[str | None, int]:
        """Claim the run's next pending shape point for this Store, to be measured on ``device``:
        one nobody measures now, or one whose measurer is gone (it is resumed: what it recorded is
        skipped). Returns (its shape key, or None and how many pending points are being measured,
        by other processes or other devices of this Store). PostgreSQL passes over the rows another
        host is claiming at this instant (SKIP LOCKED); SQLite's write lock serializes claims. A
        point is measured by one process on one device, its baselines included, so the comparisons
        within it are fair."""
        with self._write() as c:
            rows = c.execute("SELECT shape_key, owner, lease_until, device FROM run_shapes WHERE run_id=? AND"
                             " status='pending' ORDER BY idx" + self._skip_locked, (run_id,)).fetchall()
            busy = 0
            for key, owner, until, was in rows:
                holder = self._holder(owner, until)
                # this Store's own claim stays with the device measuring it (a tune's devices share a Store)
                if holder is None or (holder is self.owner and (run_id, key) not in self._shapes):
                    # a point resumed on another device than the one that began it says so: "a,b"
                    on = device if not was or was.split(",")[-1] == device else f"{was},{device}"
                    c.execute("UPDATE run_shapes SET owner=?, lease_until=?, device=? WHERE run_id=? AND"
                              " shape_key=?", (str(self.owner), time.time() + LEASE_S, on, run_id, key))
                    break
                busy += 1
            else:
                key = None
                if self.pg:  # rows being claimed this instant were passed over: count them as busy
                    busy = c.execute("SELECT COUNT(*) FROM run_shapes WHERE run_id=? AND status='pending'",
                                     (run_id,)).fetchone()[0]
        if key is not None:
            self._shapes.add((run_id, key))
            self._start_heartbeat()
        return key, busy

    def finish_shape(self, run_id: str, shape_key: str) -> None:
        """Mark a claimed shape point measured. LeaseLost when another process took it over."""
        with self._write() as c:
            cur = c.execute("UPDATE run_shapes SET status='done', owner=NULL, lease_until=NULL WHERE run_id=?"
                            " AND shape_key=? AND owner=?", (run_id, shape_key, str(self.owner)))
            if cur.rowcount == 0:
                self._shapes.discard((run_id, shape_key))
                raise LeaseLost(f"run {run_id}: shape point {shape_key} was taken over while this process "
                                f"measured it (its lease ran out)")
        self._shapes.discard((run_id, shape_key))

    def release_shape(self, run_id: str, shape_key: str) -> None:
        """Give a claimed shape point back unmeasured (it stays pending for whoever claims it next)."""
        with self._write() as c:
            c.execute("UPDATE run_shapes SET owner=NULL, lease_until=NULL WHERE run_id=? AND shape_key=?"
                      " AND owner=?", (run_id, shape_key, str(self.owner)))
        self._shapes.discard((run_id, shape_key))

    def shapes(self, run_id: str) -> list[dict[str, Any]]:
        """A run's shape points in order: shape_key, status (pending | measuring | done), device (the
        devices that measured it, in order, comma-separated: more than one when it was resumed on
        another device of the kind), holder."""
        cols, rows = self._query("SELECT * FROM run_shapes WHERE run_id=? ORDER BY idx", (run_id,))
        out = []
        for r in rows:
            d = dict(zip(cols, r))
            holder = self._holder(d["owner"], d["lease_until"]) if d["status"] == "pending" else None
            out.append({"shape_key": d["shape_key"], "device": d["device"],
                        "status": d["status"] if d["status"] == "done" else "measuring" if holder else "pending",
                        "holder": holder.describe() if isinstance(holder, Owner) else holder})
        return out

    # ---------------------------------------------------------------------------- devices
    def acquire_device(self, device: str, run_id: str | None = None,
                       on_wait: Callable[[str], None] | None = None, wait_s: float | None = None) -> None:
        """Take the lease of ``device`` (an inventory.device_identity) for this Store until
        ``release_device``/``close``: one process drives a device at a time, on any host, so no two
        runs spoil each other's timings (the Stores of one process share what it drives). A live
        holder is waited for (``on_wait(holder)`` once; ``wait_s``: give up then with DeviceBusy, 0:
        do not wait); a crashed holder's lease expires after LEASE_S, one on this host whose process
        is gone is taken over at once."""
        waited_since: float | None = None
        while True:
            with self._write() as c:
                row = c.execute("SELECT owner, lease_until FROM device_leases WHERE device=?" + self._for_update,
                                (device,)).fetchone()
                holder = self._holder(*row) if row else None
                if isinstance(holder, Owner) and holder is not self.owner and holder.same_process(self.owner):
                    # this process drives it already, through another Store (a tune's hybrid tunes its
                    # kernels in a session of its own): the device is ours; its lease stays with that Store
                    return
                if holder is None or holder is self.owner:
                    c.execute("INSERT INTO device_leases (device, owner, lease_until, since, run_id)"
                              " VALUES (?,?,?,?,?) ON CONFLICT (device) DO UPDATE SET owner=excluded.owner,"
                              " lease_until=excluded.lease_until, since=excluded.since, run_id=excluded.run_id",
                              (device, str(self.owner), time.time() + LEASE_S, time.time(), run_id))
            if holder is None or holder is self.owner:
                self._devices.add(device)
                self._start_heartbeat()
                return
            waited_since = _wait(holder, waited_since, on_wait, wait_s, DeviceBusy, f"device {device} is driven by")

    def release_device(self, device: str) -> None:
        """Give a device's lease back (a no-op when this Store does not hold it)."""
        with self._write() as c:
            c.execute("UPDATE device_leases SET owner=NULL, lease_until=NULL, run_id=NULL WHERE device=? AND owner=?",
                      (device, str(self.owner)))
        self._devices.discard(device)

    def device_holders(self) -> dict[str, dict[str, Any]]:
        """device identity -> {"holder", "since", "run_id", "lease_until"} of every device driven now."""
        cols, rows = self._query("SELECT * FROM device_leases WHERE owner IS NOT NULL")
        out = {}
        for r in rows:
            d = dict(zip(cols, r))
            holder = self._holder(d["owner"], d["lease_until"])
            if holder is not None:
                out[d["device"]] = {"holder": holder.describe() if isinstance(holder, Owner) else str(holder),
                                    "since": d["since"], "run_id": d["run_id"], "lease_until": d["lease_until"]}
        return out

    def runs(self, limit: int = 50) -> list[dict[str, Any]]:
        cols, rows = self._query("SELECT * FROM runs ORDER BY created DESC LIMIT ?", (limit,))
        return [self._run_dict(cols, r) for r in rows]

    def record_counts(self) -> dict[str, tuple[int, int]]:
        """run id -> (records, verified records with valid samples), in one query."""
        _, rows = self._query("SELECT run_id, COUNT(*), SUM(CASE WHEN status='verified' AND samples_ok(samples)=1"
                              " THEN 1 ELSE 0 END) FROM records GROUP BY run_id")
        return {run_id: (n, verified or 0) for run_id, n, verified in rows}

    # ---------------------------------------------------------------------------- records
    def add_record(self, *, run_id: str, workload_key: str, shape: dict, shape_key: str, fingerprint_key: str,
                   candidate: dict, versions: dict, round: int, status: str, reason: str, verdict: dict,
                   samples_ns, wall_ms: float, agent_ms: float) -> int:
        """Store one job's record; returns its id. A record already stored under the same (run,
        shape, candidate, round) is kept and its id returned (records are append-only). Refused
        (LeaseLost) when another process holds the run now."""
        blob = np.asarray(samples_ns, dtype="<i8").tobytes()
        with self._write() as c:
            # the writer must hold the shape point it measures (a run's planned points), else the run
            row = c.execute("SELECT owner FROM run_shapes WHERE run_id=? AND shape_key=?" + self._for_share,
                            (run_id, shape_key)).fetchone()
            if row is not None:
                if row[0] != str(self.owner):
                    raise LeaseLost(f"run {run_id}: shape point {shape_key} is "
                                    f"{'held by ' + _describe(row[0]) if row[0] else 'not held by this process'}"
                                    f" now; this process lost its lease and stops writing to it")
            else:
                row = c.execute("SELECT owner FROM runs WHERE id=?" + self._for_share, (run_id,)).fetchone()
                if row is not None and row[0] is not None and row[0] != str(self.owner):
                    raise LeaseLost(f"run {run_id} is held by {_describe(row[0])} now; this process lost its "
                                    f"lease and stops writing to it")
            cur = c.execute(
                "INSERT INTO records (run_id, workload_key, shape, shape_key, fingerprint_key, candidate_key,"
                " candidate, versions, round, status, reason, verdict, samples, wall_ms, agent_ms, created)"
                " VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)"
                " ON CONFLICT (run_id, shape_key, candidate_key, round) DO NOTHING RETURNING id",
                (run_id, workload_key, json.dumps(shape, sort_keys=True), shape_key, fingerprint_key,
                 candidate["key"], json.dumps(candidate, sort_keys=True), json.dumps(versions, sort_keys=True),
                 round, status, reason, json.dumps(verdict, sort_keys=True), blob, wall_ms, agent_ms, time.time()))
            new = cur.fetchone()
            if new is not None:
                return int(new[0])
            return int(c.execute("SELECT id FROM records WHERE run_id=? AND shape_key=? AND candidate_key=?"
                                 " AND round=?", (run_id, shape_key, candidate["key"], round)).fetchone()[0])

    def records(self, run_id: str | None = None, workload_key: str | None = None,
                fingerprint_key: str | None = None, candidate_key: str | None = None) -> list[RecordRow]:
        """Records in storing order, as every summary must read them: one whose stored samples
        cannot be timings reads as failed ('invalid stored samples: ...', no samples)."""
        where, args = [], []
        for col, val in (("run_id", run_id), ("workload_key", workload_key), ("fingerprint_key", fingerprint_key)):
            if val is not None:
                where.append(f"{col}=?")
                args.append(val)
        if candidate_key is not None:
            where.append("candidate_key LIKE ?")
            args.append(candidate_key + "%")
        sql = "SELECT * FROM records" + (" WHERE " + " AND ".join(where) if where else "") + " ORDER BY id"
        cols, rows = self._query(sql, args)
        return [_record(dict(zip(cols, r))) for r in rows]

    def copy_from(self, src: "Store", progress: Callable[[int, int], None] | None = None) -> dict[str, int]:
        """Copy every run and record of ``src`` into this store (``edgetune db migrate``), as they
        are: samples byte for byte, ids of runs kept, records keyed by (run, shape, candidate,
        round). What is already here is left alone, so a migration can be run again (after new
        runs, or after an interruption) and copies only what is missing. A run still held in
        ``src`` is refused: migrate once its tune has ended."""
        cols, rows = src._query("SELECT * FROM runs ORDER BY created")
        runs = [dict(zip(cols, r)) for r in rows]
        busy = [r["id"] for r in runs if r["status"] == "running" and src._holder(r["owner"], r["lease_until"])]
        if busy:
            raise StoreError(f"run {busy[0]} is still running in {src.path}; migrate once it has ended")
        out = {"runs": 0, "runs_present": 0, "records": 0, "records_present": 0}
        names = ("id", "created", "finished", "status", "model_path", "model_sha256", "device", "fingerprint_key",
                 "fingerprint", "versions", "config", "summary")
        try:
            with self.tx() as c:
                for r in runs:
                    status = "interrupted" if r["status"] == "running" else r["status"]
                    cur = c.execute(f"INSERT INTO runs ({', '.join(names)}) VALUES ({', '.join('?' * len(names))})"
                                    " ON CONFLICT (id) DO NOTHING", tuple(status if k == "status" else r[k] for k in names))
                    out["runs" if cur.rowcount else "runs_present"] += 1
            batch: list[RecordRow] = []

            def flush() -> None:
                with self.tx() as c:
                    for x in batch:
                        cur = c.execute(
                            "INSERT INTO records (run_id, workload_key, shape, shape_key, fingerprint_key, candidate_key,"
                            " candidate, versions, round, status, reason, verdict, samples, wall_ms, agent_ms, created)"
                            " VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)"
                            " ON CONFLICT (run_id, shape_key, candidate_key, round) DO NOTHING",
                            (x.run_id, x.workload_key, json.dumps(x.shape, sort_keys=True), x.shape_key,
                             x.fingerprint_key, x.candidate_key, json.dumps(x.candidate, sort_keys=True),
                             json.dumps(x.versions, sort_keys=True), x.round, x.status, x.reason,
                             json.dumps(x.verdict, sort_keys=True), x.samples_ns.astype("<i8").tobytes(),
                             x.wall_ms, x.agent_ms, x.created))
                        out["records" if cur.rowcount else "records_present"] += 1
                batch.clear()
                if progress is not None:
                    progress(out["records"], out["records_present"])

            for rec in src.iter_all(checked=False):
                batch.append(rec)
                if len(batch) >= 500:
                    flush()
            flush()
        except self._errors as exc:
            raise StoreError(f"cannot write database {self.path}: {_pg_reason(exc)}") from None
        return out

    def iter_all(self, checked: bool = True) -> Iterator[RecordRow]:
        """Every record, in batches. ``checked=False``: as stored (an export keeps what is there;
        a sample array with a torn tail loses only the torn bytes)."""
        last = 0
        while True:
            cols, rows = self._query("SELECT * FROM records WHERE id > ? ORDER BY id LIMIT 500", (last,))
            if not rows:
                return
            for r in rows:
                d = dict(zip(cols, r))
                last = d["id"]
                yield _record(d, checked)


@contextmanager
def device_lease(spec: Any, db: str | os.PathLike | None = None,
                 on_wait: Callable[[str], None] | None = None) -> Iterator["Store"]:
    """Drive ``spec``'s device (an inventory DeviceSpec) under its lease for the ``with`` block, in
    ``db`` (default: $EDGETUNE_DB, else this host's database): the one-shot checks (verify, zoo
    check, repro check, export check) measure as tune does, never while another process, on any
    host of the lab, drives the device. ``on_wait(holder)``: once, if they must wait."""
    from edgetune.devices.inventory import device_identity

    ident = device_identity(spec)
    if on_wait is None:  # one line on stderr, the way tune says it
        def on_wait(holder: str) -> None:
            print(f"{spec.name}: waiting for device {ident}, driven by {holder}", file=sys.stderr, flush=True)
    store = Store(db)
    try:
        store.acquire_device(ident, None, on_wait=on_wait)
        yield store
    finally:
        store.close()  # gives the lease back


def _wait(holder: Owner | str, since: float | None, on_wait: Callable[[str], None] | None, wait_s: float | None,
          give_up: type[StoreError], what: str) -> float:
    """One poll of waiting for a lease ``holder`` (runs and devices alike): ``on_wait(holder)`` when
    the wait begins, ``give_up`` once ``wait_s`` has passed (0: at once), else a pause; returns
    when the wait began."""
    who = holder.describe() if isinstance(holder, Owner) else str(holder)
    now = time.monotonic()
    if since is None:
        since = now
        if on_wait is not None:
            on_wait(who)
    if wait_s is not None and now - since >= wait_s:
        raise give_up(f"{what} {who}; gave up waiting after {wait_s:g} s")
    time.sleep(WAIT_POLL_S)
    return since


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


def _describe(owner: str | None) -> str:
    who = Owner.parse(owner) if owner else None
    return who.describe() if who else (owner or "nobody")


def _tighten_file(path: Path) -> None:
    try:
        st = os.lstat(path)
        if st.st_uid == os.getuid() and st.st_mode & 0o077 and not os.path.islink(path):
            os.chmod(path, FILE_MODE)
    except OSError:
        pass


def _record(d: dict[str, Any], checked: bool = True) -> RecordRow:
    blob, status, reason = d["samples"], d["status"], d["reason"]
    problem = samples_problem(blob)
    if isinstance(blob, (bytes, bytearray, memoryview)):
        samples = np.frombuffer(bytes(blob)[: len(blob) // 8 * 8], dtype="<i8").copy()
    else:
        samples = np.array([], dtype=np.int64)
    if checked and not problem and status == "verified" and samples.size == 0:
        problem = "no samples"
    if checked and problem:
        note = f"invalid stored samples: {problem}"
        status, reason, samples = "failed", (note if status == "verified" or not reason else f"{reason}; {note}"), \
            np.array([], dtype=np.int64)
    return RecordRow(
        id=d["id"], run_id=d["run_id"], workload_key=d["workload_key"], shape=json.loads(d["shape"]),
        shape_key=d["shape_key"], fingerprint_key=d["fingerprint_key"], candidate_key=d["candidate_key"],
        candidate=json.loads(d["candidate"]), versions=json.loads(d["versions"]), round=d["round"],
        status=status, reason=reason, verdict=json.loads(d["verdict"]),
        samples_ns=samples, wall_ms=d["wall_ms"], agent_ms=d["agent_ms"], created=d["created"])
