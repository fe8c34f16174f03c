"""The validation layer (edgetune/agent/validate.py) against random corruption of a genuine answer.

A genuine bundle is produced once by the real Python agent; then thousands of seeded mutations of
it (bit flips, truncations, spliced bytes, JSON values swapped for other types) go through the
host's collector. Every one must come back as a JobResult — verified only if its content is still
a genuine answer — and never raise, allocate beyond the bundle, or carry raw control characters."""

from __future__ import annotations

import copy
import os
import json
import random
import re
import time

import numpy as np
import pytest

from edgetune.agent import validate
from edgetune.agent.host import AgentClient, Job, JobResult, TimedCheck
from edgetune.devices.base import Completed
from edgetune.devices.inventory import DeviceSpec
from edgetune.verify import verify_job
from tests.conformance import suite
from tests.forgery.forge import emit, npy_bytes, parse

RAW_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


@pytest.fixture(scope="module")
def genuine(tmp_path_factory):
    """(client, job, case, stdout, agent_ms) of one real job on the local Python agent."""
    tmp = tmp_path_factory.mktemp("genuine")
    mlp = suite.build_mlp(tmp / "mlp.onnx")
    case = suite.mlp_case(mlp)
    client = AgentClient(DeviceSpec("dev", "local", {"workdir": str(tmp / "wd")}))
    job = Job(backend="adapter", artifact=suite.ADAPTERS / "correct.py", params={}, input_names=case.input_names,
              input_sets=case.input_sets, output_specs=case.output_specs, model=mlp, budget_ms=10.0, warmup_ms=2.0,
              min_iters=5, timeout_s=60.0)
    captured = {}
    real_run = client.transport.run

    def spy(argv, timeout, stdin=None, max_output=None):
        c = real_run(argv, timeout, stdin=stdin, max_output=max_output)
        if "run-stdio" in argv:
            captured["c"] = c
        return c

    client.transport.run = spy
    t0 = time.perf_counter()
    res = client.run_job(job)
    agent_ms = (time.perf_counter() - t0) * 1e3
    assert res.ok, res.reason
    yield client, job, case, captured["c"].stdout, agent_ms
    client.close()


def _collect(client, job, stdout: bytes, agent_ms: float) -> JobResult:
    return client._collect(Completed(0, stdout, b""), job, agent_ms)  # noqa: SLF001 - the collector itself


def _verdict(case, res):
    return verify_job(res, case.input_sets, case.references, case.reference_fn, case.output_names,
                      flops=None, peak_gflops=None)


def test_the_genuine_answer_is_verified(genuine):
    client, job, case, out, agent_ms = genuine
    v = _verdict(case, _collect(client, job, out, agent_ms))
    assert v.ok, v.reason


def test_random_byte_corruption_never_raises(genuine):
    client, job, case, out, agent_ms = genuine
    rng = random.Random(20261130)
    verified = 0
    for i in range(int(os.environ.get("EDGETUNE_FUZZ_CASES", "1500"))):
        b = bytearray(out)
        kind = i % 5
        if kind == 0:  # flip bits
            for _ in range(rng.randint(1, 8)):
                p = rng.randrange(len(b))
                b[p] ^= 1 << rng.randrange(8)
        elif kind == 1:  # truncate
            del b[rng.randrange(len(b)):]
        elif kind == 2:  # splice random bytes in
            p = rng.randrange(len(b))
            b[p:p] = rng.randbytes(rng.randint(1, 64))
        elif kind == 3:  # overwrite a run of bytes with digits (sizes, numbers)
            p = rng.randrange(len(b))
            b[p:p + 4] = str(rng.randint(0, 10**9)).encode()[:4]
        else:  # cut out a chunk
            p = rng.randrange(len(b))
            del b[p:p + rng.randint(1, 256)]
        res = _collect(client, job, bytes(b), agent_ms)
        assert isinstance(res, JobResult)
        assert not RAW_CONTROL.search(res.reason), res.reason
        if res.ok:
            v = _verdict(case, res)
            verified += v.ok
    # corruption that only touched what verification does not depend on may still verify;
    # most corruption must not
    assert verified < (i + 1) * 0.6


def _mutated(out: bytes, mutate) -> bytes:
    files = parse(out)
    res = json.loads(files["result.json"])
    mutate(res, files)
    files["result.json"] = json.dumps(res).encode()
    return emit(list(files.items()))


HOSTILE_VALUES = [None, True, -1, 0, 2**63, 1.5, float("1e30"), "x", "", [], [None], {}, {"a": [1]}, [[[]]],
                  "\x1b[2J", ["0" * 64], [-1] * 3]


def test_every_field_swapped_for_every_type_is_handled(genuine):
    client, job, case, out, agent_ms = genuine
    res0 = json.loads(parse(out)["result.json"])
    verified = []
    for key in sorted(res0):
        for value in HOSTILE_VALUES:
            def mutate(res, files, key=key, value=value):
                res[key] = copy.deepcopy(value)
            r = _collect(client, job, _mutated(out, mutate), agent_ms)
            assert isinstance(r, JobResult)
            if r.ok and _verdict(case, r).ok:
                verified.append((key, value))
    # only fields the host does not rely on may take any value and still verify; the agent-side
    # detectors (probe, late-write) are as honest as the device (README: threat model)
    harmless = {"agent", "agent_version", "clock", "device_state", "device_state_after", "runtime_versions",
                "warmup_iters", "protocol", "load_ms", "input_check", "reason", "late_change", "guard_violation",
                "limits_enforced", "leftover_processes", "usage", "input_sha256_before", "probe", "phases_ms"}
    assert {k for k, _ in verified} <= harmless, sorted({k for k, _ in verified} - harmless)
    # a limit the agent reports is never a verified result
    assert not [v for k, v in verified if k == "limit" and v not in (None, "")]


def test_npy_parser_refuses_everything_but_a_plain_array():
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    assert np.array_equal(validate.read_npy(npy_bytes(a), "x"), a)
    assert validate.read_npy(npy_bytes(np.zeros((0, 3), np.int64)), "x").shape == (0, 3)
    bad = {
        "npz": b"PK\x03\x04" + b"\0" * 40,
        "object": npy_bytes(np.zeros(2, np.float32)).replace(b"<f4", b"|O8"),
        "fortran": npy_bytes(np.asfortranarray(a)).replace(b"False", b"True "),
        "truncated": npy_bytes(a)[:-1],
        "extra": npy_bytes(a) + b"\0",
        "40GB": npy_bytes(np.zeros(1, np.float32)).replace(b"(1,)", b"(10000000000,)"),
        "negative": npy_bytes(np.zeros(1, np.float32)).replace(b"(1,)", b"(-1,)"),
        "code": npy_bytes(np.zeros(1, np.float32)).replace(b"'<f4'", b"__import__('os')"),
        "empty": b"",
    }
    for name, blob in bad.items():
        with pytest.raises(validate.Invalid):
            validate.read_npy(blob, name)


def test_npy_header_is_read_without_ast_so_threads_cannot_break_it(monkeypatch):
    """CPython 3.11's ast counts its recursion depth per interpreter: a tune validating in one device's
    thread while another thread parses failed "AST constructor recursion depth mismatch" (a loaded CI
    run). The header grammar does not touch ast, and reads every header numpy writes."""
    import ast

    def no_ast(*a, **k):
        raise AssertionError("read_npy used ast")

    monkeypatch.setattr(ast, "literal_eval", no_ast)
    monkeypatch.setattr(ast, "parse", no_ast)
    for a in (np.float32(3.5), np.zeros(7, np.int8), np.ones((2, 3, 4), np.float64), np.zeros((0,), np.uint16),
              np.arange(6, dtype=np.int32).reshape(1, 6)):
        a = np.asarray(a)
        assert np.array_equal(validate.read_npy(npy_bytes(a), "x"), a) and validate.read_npy(npy_bytes(a), "x").shape == a.shape
    hand = b"{'shape':(2,),'fortran_order':False,'descr':'<i4'}"  # any key order and spacing
    blob = b"\x93NUMPY\x01\x00" + len(hand).to_bytes(2, "little") + hand + np.arange(2, dtype="<i4").tobytes()
    assert validate.read_npy(blob, "x").tolist() == [0, 1]
    for header in (b"{'descr': '<f4', 'fortran_order': False, 'shape': (1), }",  # an int, not a 1-tuple
                   b"{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (1,), }",
                   b"{'descr': '<f4', 'fortran_order': False, 'shape': (1,), 'x': 1}",
                   b"{'descr': '<f4' 'fortran_order': False, 'shape': (1,)}",
                   b"['descr', '<f4']"):
        blob = b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header + b"\0\0\0\0"
        with pytest.raises(validate.Invalid):
            validate.read_npy(blob, "x")


def test_bundle_parser_rejects_names_and_counts():
    good = emit([("result.json", b"{}"), ("a.npy", b"x")])
    assert set(validate.parse_bundle(good)) == {"result.json", "a.npy"}
    for blob in (emit([("../x", b"1")]), emit([("a b", b"1")]), emit([("a", b"1"), ("a", b"2")]),
                 validate.BUNDLE_MAGIC + b"x" * 300):
        with pytest.raises(validate.Invalid):
            validate.parse_bundle(blob)
    assert validate.parse_bundle(good[:-3]) is None  # truncated: the agent died
    many = emit([(f"f{i}", b"") for i in range(validate.MAX_BUNDLE_FILES + 1)])
    with pytest.raises(validate.Invalid):
        validate.parse_bundle(many)


def test_timings_are_bounded_by_the_hosts_wall_clock(genuine):
    client, job, case, out, agent_ms = genuine
    assert _collect(client, job, out, agent_ms).ok
    # the same answer with samples that add up to 10% + 50 ms more than the whole command took on the host
    # (measured: a loaded machine can stretch the command, so the excess is relative to it)
    def slower(res, files):
        extra = int((agent_ms * 1.1e6 + 50e6) / len(res["samples_ns"])) + 1
        res["samples_ns"] = [x + extra for x in res["samples_ns"]]
    r = _collect(client, job, _mutated(out, slower), agent_ms)
    assert r.invalid and "host's clock" in r.reason, r.reason


def test_json_constants_and_depth_are_refused():
    for blob in (b'{"a": NaN}', b'{"a": Infinity}', b"[" * 5000 + b"]" * 5000):
        with pytest.raises(validate.Invalid):
            validate.load_json(blob, 1 << 20, "x")


def test_a_timed_check_is_kept_as_data_only(genuine):
    client, job, case, out, agent_ms = genuine
    res = _collect(client, job, out, agent_ms)
    assert res.timed_checks and all(isinstance(c, TimedCheck) for c in res.timed_checks)
