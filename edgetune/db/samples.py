"""How a record's timing samples are stored: every sample, as little-endian int64 nanoseconds
(``records.samples``: BLOB in SQLite, bytea in PostgreSQL), and what makes a stored array unusable."""

from __future__ import annotations

from typing import Any

import numpy as np

SAMPLE_DTYPE = "<i8"


def encode(samples_ns: Any) -> bytes:
    """The stored form of a sequence of nanosecond timings."""
    return np.asarray(samples_ns, dtype=SAMPLE_DTYPE).tobytes()


def decode(blob: Any) -> np.ndarray:
    """The samples of a stored array (a torn tail loses only its torn bytes; not an array: none)."""
    if isinstance(blob, (bytes, bytearray, memoryview)):
        return np.frombuffer(bytes(blob)[: len(blob) // 8 * 8], dtype=SAMPLE_DTYPE).copy()
    return np.array([], dtype=np.int64)


def samples_problem(blob: Any) -> str:
    """What makes a stored sample array unusable as timings ("" when nothing). Older versions
    stored whatever an agent sent; a timing is a positive whole number of nanoseconds."""
    if not isinstance(blob, (bytes, bytearray, memoryview)):
        return "not a sample array"
    if len(blob) % 8:
        return f"{len(blob)} bytes is not a whole number of int64 samples"
    arr = np.frombuffer(blob, dtype=SAMPLE_DTYPE)
    bad = int(np.count_nonzero(arr <= 0))
    return f"{bad} of {arr.size} samples are zero or negative" if bad else ""


def samples_ok(blob: Any) -> int:
    """SQLite's ``samples_ok(samples)`` for counts: 1 for a non-empty, valid sample array (PostgreSQL
    has the same function in SQL: dialect.PG_TABLES)."""
    return int(isinstance(blob, (bytes, bytearray, memoryview)) and len(blob) > 0 and not samples_problem(blob))
