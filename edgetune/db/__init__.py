"""The results store: SQLite (one file, WAL; the embedded default) or PostgreSQL (a lab's shared
database, ``--db postgresql://user@host/db``), one schema, schema-versioned, append-only records,
shared by any number of edgetune processes on any number of hosts.

Every record is keyed by workload (model hash + input shapes + inputs), device fingerprint,
candidate key and versions. Each record is committed on its own, so an interrupted tune (Ctrl-C,
kill -9) loses at most the job in flight, and a resumed run skips what is already recorded.

The parts, each importing only those before it:

- ``samples``: how timing samples are stored (int64 little-endian nanoseconds) and checked;
- ``dialect``: the connection, what differs between SQLite and PostgreSQL, the schema and its
  version, created or migrated atomically, the database file's privacy;
- ``leases``: who holds a run, a shape point or a device (``Owner``), waiting for a holder, the
  heartbeat that renews a Store's leases;
- ``records``: ``Record`` (one job's record as written), ``RecordRow`` (as read back), writing,
  reading and copying records (``edgetune db migrate``);
- ``store``: ``Store``, made of those parts, and ``device_lease``.
"""

from edgetune.db.dialect import SCHEMA_VERSION, default_db_path, redact
from edgetune.db.leases import HEARTBEAT_S, LEASE_S, WAIT_POLL_S, DeviceBusy, LeaseLost, Owner
from edgetune.db.records import STATUSES, Record, RecordRow
from edgetune.db.samples import samples_problem
from edgetune.db.store import Store, device_lease

__all__ = ["SCHEMA_VERSION", "LEASE_S", "HEARTBEAT_S", "WAIT_POLL_S", "STATUSES", "DeviceBusy", "LeaseLost", "Owner",
           "Record", "RecordRow", "Store", "default_db_path", "device_lease", "redact", "samples_problem"]
