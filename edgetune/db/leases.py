"""Who holds what in the store: runs, their shape points and devices, each held by one process
at a time through a lease in its row (``owner``, ``lease_until``), on any number of hosts.

Runs. ``start_run`` takes a free run, or one whose holder is gone, and otherwise waits for it (two
processes measuring one device at once would spoil each other's timings, so an identical run
waits, then resumes and skips what the first recorded). The Store's heartbeat thread renews its
leases every HEARTBEAT_S for LEASE_S; ``finish_run`` / ``release_run`` give a run back with its
final status. A holder on this host whose process is gone is taken over at once; a holder
elsewhere once its lease has expired. Only the holder writes a run's records (``_check_writer``).

Shape points. A run's shape points are claimable units of work (``plan_shapes``/``claim_shape``),
so hosts that join a run each measure one point at a time.

Devices. A device is driven by one process at a time, on whatever host: ``acquire_device`` takes its
lease (``device_leases``), waiting while a live holder has it; the heartbeat renews it; a crashed
host's leases expire after LEASE_S and are taken over.
"""

from __future__ import annotations

import json
import os
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from edgetune.db.dialect import Database
from edgetune.devices.inventory import this_host
from edgetune.errors import StoreError

# a holder that has not renewed its lease for this long is presumed gone (EDGETUNE_LEASE_S: tests)
LEASE_S = float(os.environ.get("EDGETUNE_LEASE_S") or 30.0)
HEARTBEAT_S = min(5.0, LEASE_S / 3)  # how often a Store renews the leases it holds
WAIT_POLL_S = 0.5  # how often a waiting start_run looks again

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


class Leases(Database):
    """The store's leases (runs, shape points, devices) and the heartbeat that renews them."""

    def __init__(self, path: str | os.PathLike | None = None, create: bool = True):
        self.owner = Owner.mine()
        self._held: set[str] = set()
        self._devices: set[str] = set()
        self._shapes: set[tuple[str, str]] = set()  # (run, shape point) claimed
        self._stop = threading.Event()
        self._beat: threading.Thread | None = None
        self._closed = False
        super().__init__(path, create)

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
            super().close()

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

    def runs(self, limit: int = 50) -> list[dict[str, Any]]:
        cols, rows = self._query("SELECT * FROM runs ORDER BY created DESC LIMIT ?", (limit,))
        return [self._run_dict(cols, r) for r in rows]

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

    # ---------------------------------------------------------------------------- writers
    def _check_writer(self, c: Any, run_id: str, shape_key: str) -> None:
        """Inside a write transaction: refuse (LeaseLost) a record of ``run_id`` at ``shape_key``
        unless this Store holds that shape point (a run's planned points), else the run."""
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


def _describe(owner: str | None) -> str:
    who = Owner.parse(owner) if owner else None
    return who.describe() if who else (owner or "nobody")
