"""A Record (one job's record as it is written) is checked once, when it is made, and stored as it
was given: the JSON fields with sorted keys, the samples byte for byte, even samples that are not
timings (the reader marks those failed)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from edgetune.db import STATUSES, Record, Store


def _fields(**over):
    base = dict(run_id="r", workload_key="w", shape={"batch": 2}, shape_key="batch=2", fingerprint_key="fp",
                candidate={"key": "k1", "backend": "ort", "params": {}}, versions={"ort": "1"}, round=0,
                status="verified", reason="", verdict={"ok": True}, samples_ns=[1000, 1200], wall_ms=2.0,
                agent_ms=1.5)
    return {**base, **over}


def test_a_record_is_normalised_and_frozen():
    shape = {"batch": 2}
    rec = Record(**_fields(shape=shape, round=np.int64(3), wall_ms=np.float32(2.5), agent_ms=1,
                           samples_ns=np.array([1.9, 3.0])))
    assert rec.round == 3 and type(rec.round) is int
    assert (rec.wall_ms, rec.agent_ms) == (2.5, 1.0) and type(rec.wall_ms) is float and type(rec.agent_ms) is float
    assert rec.samples_ns.dtype == np.dtype("<i8") and rec.samples_ns.tolist() == [1, 3]
    assert rec.candidate_key == "k1"
    shape["batch"] = 4  # the record keeps its own copy
    assert rec.shape == {"batch": 2}
    with pytest.raises(ValueError):
        rec.samples_ns[0] = 5  # read-only
    with pytest.raises(AttributeError):
        rec.status = "failed"  # type: ignore[misc]


@pytest.mark.parametrize("over, error", [
    ({"status": "ok"}, ValueError),
    ({"candidate": {"backend": "ort"}}, ValueError),
    ({"candidate": {"key": ""}}, ValueError),
    ({"round": -1}, ValueError),
    ({"round": True}, ValueError),
    ({"round": 1.0}, ValueError),
    ({"wall_ms": math.nan}, ValueError),
    ({"agent_ms": None}, ValueError),
    ({"samples_ns": [[1, 2]]}, ValueError),
    ({"samples_ns": 5}, ValueError),
    ({"shape": [("batch", 2)]}, TypeError),
    ({"verdict": None}, TypeError),
    ({"run_id": 7}, TypeError),
    ({"reason": None}, TypeError),
], ids=lambda x: repr(x) if isinstance(x, dict) else x.__name__)
def test_a_record_that_could_not_be_stored_is_refused_when_made(over, error):
    with pytest.raises(error, match="Record"):
        Record(**_fields(**over))


def test_every_status_is_accepted():
    for status in STATUSES:
        assert Record(**_fields(status=status)).status == status


def test_a_record_is_stored_as_given_and_read_back():
    st = Store(":memory:")
    try:
        st.start_run("r", "m.onnx", "0" * 64, "local", "fp", {}, {}, {})
        bad = Record(**_fields(candidate={"key": "k2"}, status="failed", reason="wrong", samples_ns=[-5, 0]))
        first = st.add_record(Record(**_fields()))
        assert st.add_record(bad) == first + 1
        assert st.add_record(Record(**_fields(samples_ns=[7]))) == first  # the key is written once
        with pytest.raises(TypeError, match="takes a Record"):
            st.add_record(_fields())  # type: ignore[arg-type]
        raw = st.conn.execute("SELECT shape, candidate, samples, wall_ms FROM records ORDER BY id").fetchall()
        assert raw[0][:2] == ('{"batch": 2}', '{"backend": "ort", "key": "k1", "params": {}}')
        assert raw[0][2] == np.array([1000, 1200], "<i8").tobytes() and raw[0][3] == 2.0
        assert raw[1][2] == np.array([-5, 0], "<i8").tobytes()  # stored as it came
        ok, failed = st.records()
        assert ok.candidate_key == "k1" and ok.samples_ns.tolist() == [1000, 1200] and ok.status == "verified"
        assert failed.status == "failed" and failed.reason.startswith("wrong; invalid stored samples")
    finally:
        st.close()
