"""``Store``: the results store as its callers see it, one object made of its three parts (the
database and its dialect, the leases, the records), and ``device_lease`` for the one-shot checks."""

from __future__ import annotations

import os
import sys
from contextlib import contextmanager
from typing import Any, Callable, Iterator

from edgetune.db.records import Records
from edgetune.devices.inventory import device_identity


class Store(Records):
    """The results store: ``Store(path)`` opens an SQLite file (default: $EDGETUNE_DB, else the
    edgetune home's ``edgetune.db``; ``:memory:`` for none), ``Store("postgresql://…")`` a lab's
    database. Its methods come from its parts: dialect.Database (connection, schema,
    transactions), leases.Leases (runs, shape points, devices, heartbeat) and records.Records
    (``add_record``, ``records``, ``iter_all``, ``copy_from``). One connection, shared by a tune's
    device threads and the heartbeat; ``close()`` gives back what it still holds."""


@contextmanager
def device_lease(spec: Any, db: str | os.PathLike | None = None,
                 on_wait: Callable[[str], None] | None = None) -> Iterator[Store]:
    """Drive ``spec``'s device (an inventory DeviceSpec) under its lease for the ``with`` block, in
    ``db`` (default: $EDGETUNE_DB, else this host's database): the one-shot checks (verify, zoo
    check, repro check, export check) measure as tune does, never while another process, on any
    host of the lab, drives the device. ``on_wait(holder)``: once, if they must wait."""
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
