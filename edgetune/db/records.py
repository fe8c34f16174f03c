"""The store's records: append-only, one per job, keyed by workload (model hash + input shapes +
inputs), device fingerprint, candidate key and versions. ``Record`` is a record as it is written,
``RecordRow`` one as it is read back (with its id and time, its samples checked).

Each record is committed on its own, so an interrupted tune (Ctrl-C, kill -9) loses at most the job
in flight, and a resumed run skips what is already recorded. Only the holder of a run (or of the
shape point a record belongs to) writes its records; the (run, shape, candidate, round) key is never
written twice (a second write returns the first one's id). ``edgetune db migrate`` copies a store's
runs and records into another (``copy_from``).
"""

from __future__ import annotations

import json
import math
import numbers
import operator
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Mapping

import numpy as np

from edgetune.db.leases import Leases
from edgetune.db.samples import SAMPLE_DTYPE, decode, encode, samples_problem
from edgetune.errors import StoreError

# what a job's record says of it: verified or failed (a timed job), checked or unchecked (a check
# that times nothing, e.g. a judge's compute-sanitizer run, where the tool could not say)
STATUSES = ("verified", "failed", "checked", "unchecked")

_INSERT = ("INSERT INTO records (run_id, workload_key, shape, shape_key, fingerprint_key, candidate_key,"
           " candidate, versions, round, status, reason, verdict, samples, wall_ms, agent_ms, created)"
           " VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)"
           " ON CONFLICT (run_id, shape_key, candidate_key, round) DO NOTHING")


@dataclass(frozen=True, eq=False)  # eq=False: its samples are an array (compare fields, not records)
class Record:
    """One job's record as it is written (``Store.add_record``): everything a record row stores but
    its id and the time it is written. The candidate is ``Candidate.as_dict()`` (or a judge's form of
    it); its ``key`` is the record's candidate_key. Checked once, here: the names and keys are
    strings, shape/candidate/versions/verdict mappings (kept as plain dicts, stored as JSON with
    sorted keys), the round a whole number from 0, the status one of STATUSES, the times numbers
    (wall_ms: the host's view of the whole job, agent_ms: the agent command's alone), and the samples
    a one-dimensional sequence of whole nanoseconds, kept as a read-only int64 array. Whether those
    are usable timings is for the reader (``RecordRow``, ``samples_problem``): a failed job's samples
    are stored as they came."""

    run_id: str
    workload_key: str
    shape: Mapping[str, Any]  # the bound dims, e.g. {"batch": 4}; an operator's {"op": spec}
    shape_key: str
    fingerprint_key: str
    candidate: Mapping[str, Any]
    versions: Mapping[str, Any]
    round: int
    status: str
    reason: str
    verdict: Mapping[str, Any]
    samples_ns: np.ndarray
    wall_ms: float
    agent_ms: float

    def __post_init__(self) -> None:
        for name in ("run_id", "workload_key", "shape_key", "fingerprint_key", "reason"):
            if not isinstance(getattr(self, name), str):
                raise TypeError(f"Record.{name} is a str, not {type(getattr(self, name)).__name__}")
        for name in ("shape", "candidate", "versions", "verdict"):
            value = getattr(self, name)
            if not isinstance(value, Mapping):
                raise TypeError(f"Record.{name} is a mapping, not {type(value).__name__}")
            object.__setattr__(self, name, dict(value))
        key = self.candidate.get("key")
        if not isinstance(key, str) or not key:
            raise ValueError("Record.candidate has no key (a Candidate.as_dict() has one)")
        if isinstance(self.round, bool) or not isinstance(self.round, numbers.Integral) or self.round < 0:
            raise ValueError(f"Record.round is a whole number from 0, not {self.round!r}")
        object.__setattr__(self, "round", operator.index(self.round))
        if self.status not in STATUSES:
            raise ValueError(f"Record.status is one of {', '.join(STATUSES)}, not {self.status!r}")
        for name in ("wall_ms", "agent_ms"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, numbers.Real) or math.isnan(value):
                raise ValueError(f"Record.{name} is a number of milliseconds, not {value!r}")
            object.__setattr__(self, name, float(value))
        samples = np.array(self.samples_ns, dtype=SAMPLE_DTYPE)
        if samples.ndim != 1:
            raise ValueError(f"Record.samples_ns is a sequence of nanoseconds, not an array of shape {samples.shape}")
        samples.setflags(write=False)
        object.__setattr__(self, "samples_ns", samples)

    @property
    def candidate_key(self) -> str:
        return self.candidate["key"]


@dataclass(frozen=True)
class RecordRow:
    """A stored record as every summary reads it (``Store.records``, ``Store.iter_all``)."""

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


class Records(Leases):
    """Writing and reading the store's records (under the leases: only a holder writes)."""

    def add_record(self, record: Record) -> int:
        """Store one job's record; returns its id. A record already stored under the same (run,
        shape, candidate, round) is kept and its id returned (records are append-only). Refused
        (LeaseLost) when another process holds the run now."""
        if not isinstance(record, Record):
            raise TypeError(f"add_record takes a Record, not {type(record).__name__}")
        r = record
        blob = encode(r.samples_ns)
        with self._write() as c:
            self._check_writer(c, r.run_id, r.shape_key)
            cur = c.execute(
                _INSERT + " RETURNING id",
                (r.run_id, r.workload_key, json.dumps(r.shape, sort_keys=True), r.shape_key, r.fingerprint_key,
                 r.candidate_key, json.dumps(r.candidate, sort_keys=True), json.dumps(r.versions, sort_keys=True),
                 r.round, r.status, r.reason, json.dumps(r.verdict, sort_keys=True), blob, r.wall_ms, r.agent_ms,
                 time.time()))
            new = cur.fetchone()
            if new is not None:
                return int(new[0])
            return int(c.execute("SELECT id FROM records WHERE run_id=? AND shape_key=? AND candidate_key=?"
                                 " AND round=?", (r.run_id, r.shape_key, r.candidate_key, r.round)).fetchone()[0])

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
        return [_row(dict(zip(cols, r))) for r in rows]

    def record_counts(self) -> dict[str, tuple[int, int]]:
        """run id -> (records, verified records with valid samples), in one query."""
        _, rows = self._query("SELECT run_id, COUNT(*), SUM(CASE WHEN status='verified' AND samples_ok(samples)=1"
                              " THEN 1 ELSE 0 END) FROM records GROUP BY run_id")
        return {run_id: (n, verified or 0) for run_id, n, verified in rows}

    def copy_from(self, src: "Records", progress: Callable[[int, int], None] | None = None) -> dict[str, int]:
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
        with self._write() as c:
            for r in runs:
                status = "interrupted" if r["status"] == "running" else r["status"]
                cur = c.execute(f"INSERT INTO runs ({', '.join(names)}) VALUES ({', '.join('?' * len(names))})"
                                " ON CONFLICT (id) DO NOTHING", tuple(status if k == "status" else r[k] for k in names))
                out["runs" if cur.rowcount else "runs_present"] += 1
        batch: list[RecordRow] = []

        def flush() -> None:
            with self._write() as c:
                for x in batch:
                    cur = c.execute(_INSERT, (
                        x.run_id, x.workload_key, json.dumps(x.shape, sort_keys=True), x.shape_key,
                        x.fingerprint_key, x.candidate_key, json.dumps(x.candidate, sort_keys=True),
                        json.dumps(x.versions, sort_keys=True), x.round, x.status, x.reason,
                        json.dumps(x.verdict, sort_keys=True), encode(x.samples_ns), x.wall_ms, x.agent_ms,
                        x.created))
                    out["records" if cur.rowcount else "records_present"] += 1
            batch.clear()
            if progress is not None:
                progress(out["records"], out["records_present"])

        for rec in src.iter_all(checked=False):
            batch.append(rec)
            if len(batch) >= 500:
                flush()
        flush()
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
                yield _row(d, checked)


def _row(d: dict[str, Any], checked: bool = True) -> RecordRow:
    blob, status, reason = d["samples"], d["status"], d["reason"]
    problem = samples_problem(blob)
    samples = decode(blob)
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
