"""SQLite store: one file, WAL, schema-versioned, append-only records.

Every record is keyed by workload (model hash + input shapes + inputs), device fingerprint,
candidate key and versions. Each record is committed on its own, so an interrupted tune (Ctrl-C,
kill -9) loses at most the job in flight, and a resumed run skips what is already recorded.
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from edgetune.devices.inventory import edgetune_home
from edgetune.errors import StoreError

SCHEMA_VERSION = 1

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS runs (
    id TEXT PRIMARY KEY,
    created REAL NOT NULL,
    finished REAL,
    status TEXT NOT NULL,             -- running | complete
    model_path TEXT NOT NULL,
    model_sha256 TEXT NOT NULL,
    device TEXT NOT NULL,
    fingerprint_key TEXT NOT NULL,
    fingerprint TEXT NOT NULL,        -- JSON
    versions TEXT NOT NULL,           -- JSON
    config TEXT NOT NULL,             -- JSON: budget, sweeps, spaces, command
    summary TEXT                      -- JSON, written when complete
);
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
);
CREATE INDEX IF NOT EXISTS records_lookup ON records (workload_key, fingerprint_key, candidate_key);
"""


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


class Store:
    def __init__(self, path: str | os.PathLike | None = None, create: bool = True):
        self.path = Path(path) if path else default_db_path()
        if not create and not self.path.exists():
            raise StoreError(f"database not found: {self.path}")
        try:
            if create:
                self.path.parent.mkdir(parents=True, exist_ok=True)
            self.conn = sqlite3.connect(str(self.path), timeout=30, isolation_level=None,
                                        check_same_thread=False)
            self.conn.execute("PRAGMA journal_mode=WAL")
            self.conn.execute("PRAGMA synchronous=NORMAL")
            self.conn.execute("PRAGMA foreign_keys=ON")
            self._init_schema()
        except sqlite3.DatabaseError as exc:
            raise StoreError(f"cannot use database {self.path}: {exc}") from exc
        except OSError as exc:
            raise StoreError(f"cannot create database {self.path}: {exc.strerror}") from exc

    def _init_schema(self) -> None:
        # executescript commits implicitly; run it outside our transaction helper
        self.conn.executescript(_SCHEMA)
        row = self.conn.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
        if row is None:
            self.conn.execute("INSERT INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))
        elif int(row[0]) != SCHEMA_VERSION:
            raise StoreError(f"database {self.path} has schema version {row[0]}, this edgetune reads {SCHEMA_VERSION}")

    class _Tx:
        def __init__(self, conn):
            self.conn = conn

        def __enter__(self):
            self.conn.execute("BEGIN IMMEDIATE")
            return self.conn

        def __exit__(self, et, ev, tb):
            self.conn.execute("ROLLBACK" if et else "COMMIT")
            return False

    def tx(self):
        return Store._Tx(self.conn)

    def close(self) -> None:
        self.conn.close()

    # ------------------------------------------------------------------------------- runs
    def get_run(self, run_id: str) -> dict[str, Any] | None:
        cur = self.conn.execute("SELECT * FROM runs WHERE id=?", (run_id,))
        row = cur.fetchone()
        if row is None:
            return None
        return _row_dict(cur, row)

    def start_run(self, run_id: str, model_path: str, model_sha: str, device: str, fp_key: str,
                  fingerprint: dict, versions: dict, config: dict) -> bool:
        """Create the run, or reopen it for resuming. Returns True when it already existed."""
        try:
            with self.tx() as c:
                if c.execute("SELECT 1 FROM runs WHERE id=?", (run_id,)).fetchone():
                    c.execute("UPDATE runs SET status='running', finished=NULL WHERE id=?", (run_id,))
                    return True
                c.execute("INSERT INTO runs (id, created, status, model_path, model_sha256, device, fingerprint_key,"
                          " fingerprint, versions, config) VALUES (?,?,?,?,?,?,?,?,?,?)",
                          (run_id, time.time(), "running", model_path, model_sha, device, fp_key,
                           json.dumps(fingerprint, sort_keys=True), json.dumps(versions, sort_keys=True),
                           json.dumps(config, sort_keys=True)))
                return False
        except sqlite3.DatabaseError as exc:
            raise StoreError(f"cannot write database {self.path}: {exc}") from exc

    def finish_run(self, run_id: str, summary: dict) -> None:
        with self.tx() as c:
            c.execute("UPDATE runs SET status='complete', finished=?, summary=? WHERE id=?",
                      (time.time(), json.dumps(summary, sort_keys=True), run_id))

    def runs(self, limit: int = 50) -> list[dict[str, Any]]:
        cur = self.conn.execute("SELECT * FROM runs ORDER BY created DESC LIMIT ?", (limit,))
        return [_row_dict(cur, r) for r in cur.fetchall()]

    def record_counts(self) -> dict[str, tuple[int, int]]:
        """run id -> (records, verified records), in one query."""
        cur = self.conn.execute("SELECT run_id, COUNT(*), SUM(status='verified') FROM records GROUP BY run_id")
        return {run_id: (n, verified or 0) for run_id, n, verified in cur.fetchall()}

    # ---------------------------------------------------------------------------- records
    def add_record(self, *, run_id: str, workload_key: str, shape: dict, shape_key: str, fingerprint_key: str,
                   candidate: dict, versions: dict, round: int, status: str, reason: str, verdict: dict,
                   samples_ns, wall_ms: float, agent_ms: float) -> int:
        blob = np.asarray(samples_ns, dtype="<i8").tobytes()
        try:
            with self.tx() as c:
                cur = c.execute(
                    "INSERT INTO records (run_id, workload_key, shape, shape_key, fingerprint_key, candidate_key,"
                    " candidate, versions, round, status, reason, verdict, samples, wall_ms, agent_ms, created)"
                    " VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                    (run_id, workload_key, json.dumps(shape, sort_keys=True), shape_key, fingerprint_key,
                     candidate["key"], json.dumps(candidate, sort_keys=True), json.dumps(versions, sort_keys=True),
                     round, status, reason, json.dumps(verdict, sort_keys=True), blob, wall_ms, agent_ms, time.time()))
                return int(cur.lastrowid)
        except sqlite3.DatabaseError as exc:
            raise StoreError(f"cannot write database {self.path}: {exc}") from exc

    def records(self, run_id: str | None = None, workload_key: str | None = None,
                fingerprint_key: str | None = None, candidate_key: str | None = None) -> list[RecordRow]:
        where, args = [], []
        for col, val in (("run_id", run_id), ("workload_key", workload_key), ("fingerprint_key", fingerprint_key)):
            if val is not None:
                where.append(f"{col}=?")
                args.append(val)
        if candidate_key is not None:
            where.append("candidate_key LIKE ?")
            args.append(candidate_key + "%")
        sql = "SELECT * FROM records" + (" WHERE " + " AND ".join(where) if where else "") + " ORDER BY id"
        cur = self.conn.execute(sql, args)
        return [_record(_row_dict(cur, r)) for r in cur.fetchall()]

    def iter_all(self) -> Iterator[RecordRow]:
        cur = self.conn.execute("SELECT * FROM records ORDER BY id")
        for r in cur:
            yield _record(_row_dict(cur, r))


def _row_dict(cur: sqlite3.Cursor, row: tuple) -> dict[str, Any]:
    return {d[0]: v for d, v in zip(cur.description, row)}


def _record(d: dict[str, Any]) -> RecordRow:
    return RecordRow(
        id=d["id"], run_id=d["run_id"], workload_key=d["workload_key"], shape=json.loads(d["shape"]),
        shape_key=d["shape_key"], fingerprint_key=d["fingerprint_key"], candidate_key=d["candidate_key"],
        candidate=json.loads(d["candidate"]), versions=json.loads(d["versions"]), round=d["round"],
        status=d["status"], reason=d["reason"], verdict=json.loads(d["verdict"]),
        samples_ns=np.frombuffer(d["samples"], dtype="<i8").copy(), wall_ms=d["wall_ms"], agent_ms=d["agent_ms"],
        created=d["created"])
