"""Everything a device sends is validated here before the host uses it.

A device may be compromised, rooted or simply buggy: its agent's ``info`` reply, its result bundle
and every file in it are untrusted bytes. This module turns them into ``AgentInfo``/``JobResult``
values or into a *named failure* of that candidate (``invalid result: ...``) or that device
(``DeviceError``) — never a traceback, never unbounded memory:

* sizes are capped before anything is parsed (the transport already stopped reading at the job's
  ``max_output``; here the bundle's file count, each file's size and result.json's size);
* JSON is parsed strictly (no NaN/Infinity, no absurd nesting) and every field is type- and
  range-checked: timings are positive integers, at least ``MIN_SAMPLE_NS`` (below any device
  clock's resolution is not a measurement), as many as the iteration bounds allow, and together
  no longer than the wall time the host saw the agent command take;
* output files are parsed only as the ``.npy`` format (version 1-3, C order, a plain numeric dtype,
  a data length that matches the header exactly) — an ``.npz``, a pickle or a header claiming
  40 GB is refused without allocating;
* device text (reasons, versions, fingerprint fields) is escaped and capped (``edgetune.text``).
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

import numpy as np

from edgetune.agent.messages import AgentInfo, Job, JobResult, TimedCheck
from edgetune.errors import DeviceError
from edgetune.text import device_text

BUNDLE_MAGIC = b"EDGETUNE-BUNDLE 1\n"
MAX_BUNDLE_FILES = 4096
MAX_RESULT_JSON = 4 << 20  # bytes of result.json
MAX_INFO_JSON = 256 << 10  # bytes of an info reply
MAX_MAP_JSON = 16 << 10  # bytes of one free-form map (runtime versions, device state) kept
MAX_JSON_DEPTH = 16
MIN_SAMPLE_NS = 10  # no clock read pair on any device takes less: a shorter sample was not measured
CLOCK_SLACK = 1.02  # device time may exceed the host's wall time of the command by this factor ...
CLOCK_SLACK_NS = 5_000_000  # ... plus this (clock granularity, start-up of both clocks)
_NAME_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
_HEX64_RE = re.compile(r"^[0-9a-f]{64}$")
NPY_MAGIC = b"\x93NUMPY"
_NPY_KINDS = set("biuf")  # bool, signed, unsigned, float: what outputs of inference are
# what the judge backend names a kernel's failure (device_agents/PROTOCOL.md, "judge backend")
FAULT_CODES = frozenset({"forbidden-exec", "forbidden-process", "forbidden-network", "forbidden-file",
                         "forbidden-syscall", "input-mutated", "out-of-bounds-access", "out-of-bounds-write", "crashed",
                         "interposed-symbol", "wrong-architecture", "bad-artifact", "kernel-error"})
LIMITS = {"memory": "out of memory", "processes": "too many processes", "time": "hung",
          "output": "result too large"}


class Invalid(Exception):
    """One thing in a device's answer is not what the protocol allows."""

    code = "invalid-result"


class ImpossibleTiming(Invalid):
    """A timing no device clock can measure (shorter than MIN_SAMPLE_NS)."""

    code = "impossible-timing"


def _sample(v: Any, what: str, top: int) -> int:
    x = _int(v, what, 1, top)
    if x < MIN_SAMPLE_NS:
        raise ImpossibleTiming(f"{what} of {x} ns is shorter than any device clock can measure "
                               f"(under {MIN_SAMPLE_NS} ns)")
    return x


# --------------------------------------------------------------------------------------- bundle
def parse_bundle(out: bytes) -> dict[str, bytes] | None:
    """Parse an agent's run-stdio bundle. None when it is missing or truncated (the agent died);
    ``Invalid`` when it is malformed (bad names, duplicates, too many files)."""
    start = out.find(BUNDLE_MAGIC)
    if start < 0:
        return None
    pos = start + len(BUNDLE_MAGIC)
    files: dict[str, bytes] = {}
    while True:
        nl = out.find(b"\n", pos, pos + 256)
        if nl < 0:
            if len(out) - pos > 256:
                raise Invalid("bundle: a file header line is longer than 256 bytes")
            return None
        line = out[pos:nl].decode("ascii", "replace")
        if line == "END":
            return files
        name, _, size = line.rpartition(" ")
        if not _NAME_RE.match(name) or not size.isdigit() or len(size) > 12:
            raise Invalid(f"bundle: malformed file header {device_text(line, 80)!r}")
        if name in files:
            raise Invalid(f"bundle: file {name} appears twice")
        if len(files) >= MAX_BUNDLE_FILES:
            raise Invalid(f"bundle: more than {MAX_BUNDLE_FILES} files")
        n = int(size)
        if nl + 1 + n > len(out):
            return None
        files[name] = out[nl + 1 : nl + 1 + n]
        pos = nl + 1 + n


# ------------------------------------------------------------------------------------------ npy
# The header is a dict literal of three keys; it is read by this grammar rather than ast.literal_eval:
# CPython 3.11's ast keeps its recursion depth per interpreter, not per thread, and a tune over several
# devices validates in threads while another parses (the agent bundle, a converter): the parse then
# fails with "SystemError: AST constructor recursion depth mismatch". A grammar also parses no more.
_NPY_ITEM = re.compile(r"""\s*'(descr|fortran_order|shape)'\s*:\s*(?:'([^'\\]{1,64})'|(True|False)|\(([0-9,\s]{0,400})\))\s*""")


def _npy_header(text: str) -> dict[str, Any] | None:
    """The header's {descr, fortran_order, shape}, or None where it is not exactly that literal."""
    body = text.strip()
    if not (body.startswith("{") and body.endswith("}")):
        return None
    body, header, pos = body[1:-1], {}, 0
    while pos < len(body) and body[pos:].strip():
        m = _NPY_ITEM.match(body, pos)
        if m is None or m.group(1) in header:
            return None
        key, descr, flag, dims = m.groups()
        if key == "descr" and descr is not None:
            header[key] = descr
        elif key == "fortran_order" and flag is not None:
            header[key] = flag == "True"
        elif key == "shape" and dims is not None:
            parts = [d.strip() for d in dims.split(",")]
            if parts and parts[-1] == "":
                parts.pop()
            if not all(d.isdigit() for d in parts) or (len(parts) == 1 and "," not in dims):
                return None  # "(3)" is an int, not a 1-tuple
            header[key] = tuple(int(d) for d in parts)
        else:
            return None
        pos = m.end()
        if pos < len(body):
            if body[pos] != ",":
                return None
            pos += 1
    return header


def read_npy(blob: bytes, what: str) -> np.ndarray:
    """A ``.npy`` file's array, or ``Invalid``: nothing but the npy format is parsed, and the
    header's shape must match the bytes that are actually there before anything is allocated."""
    if not blob.startswith(NPY_MAGIC) or len(blob) < 10:
        kind = "an npz/zip archive" if blob[:2] == b"PK" else "not an .npy file"
        raise Invalid(f"{what}: {kind}")
    major = blob[6]
    if major == 1:
        hlen, start = int.from_bytes(blob[8:10], "little"), 10
    elif major in (2, 3):
        if len(blob) < 12:
            raise Invalid(f"{what}: truncated .npy header")
        hlen, start = int.from_bytes(blob[8:12], "little"), 12
    else:
        raise Invalid(f"{what}: .npy format version {major} unknown")
    if hlen > 65536 or start + hlen > len(blob):
        raise Invalid(f"{what}: .npy header of {hlen} bytes does not fit the file")
    try:
        header = _npy_header(blob[start:start + hlen].decode("latin1" if major < 3 else "utf-8"))
    except UnicodeDecodeError:
        header = None
    if header is None:
        raise Invalid(f"{what}: .npy header unreadable")
    if set(header) != {"descr", "fortran_order", "shape"}:
        raise Invalid(f"{what}: .npy header has the wrong keys")
    descr, fortran, shape = header["descr"], header["fortran_order"], header["shape"]
    if not isinstance(descr, str) or fortran is not False:
        raise Invalid(f"{what}: .npy array is not a plain C-order array")
    if not isinstance(shape, tuple) or len(shape) > 32 or not all(type(d) is int and 0 <= d for d in shape):
        raise Invalid(f"{what}: .npy shape {device_text(shape, 80)} is not a shape")
    try:
        dtype = np.dtype(descr)
    except Exception:  # noqa: BLE001 - numpy parses a descr string with ast: any error is possible
        raise Invalid(f"{what}: .npy dtype {device_text(descr, 40)!r} unknown") from None
    if dtype.kind not in _NPY_KINDS or dtype.itemsize > 8 or dtype.fields is not None or dtype.subdtype:
        raise Invalid(f"{what}: .npy dtype {dtype} is not a numeric output type")
    count = math.prod(shape)
    data = memoryview(blob)[start + hlen:]
    if count * dtype.itemsize != len(data):
        raise Invalid(f"{what}: .npy header claims {count * dtype.itemsize} data bytes, the file has {len(data)}")
    return np.frombuffer(data, dtype=dtype).reshape(shape).copy()


# ----------------------------------------------------------------------------------------- json
def _reject_constant(name: str) -> Any:
    raise Invalid(f"JSON constant {name} is not allowed")


def _depth(obj: Any, level: int = 0) -> int:
    if level > MAX_JSON_DEPTH:
        raise Invalid(f"JSON nested deeper than {MAX_JSON_DEPTH}")
    if isinstance(obj, dict):
        return max((_depth(v, level + 1) for v in obj.values()), default=level)
    if isinstance(obj, list):
        return max((_depth(v, level + 1) for v in obj), default=level)
    return level


def load_json(blob: bytes, limit: int, what: str) -> Any:
    if len(blob) > limit:
        raise Invalid(f"{what} is {len(blob)} bytes (limit {limit})")
    try:
        data = json.loads(blob.decode("utf-8"), parse_constant=_reject_constant)
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise Invalid(f"{what} is not valid JSON") from None
    _depth(data)
    return data


def _int(v: Any, what: str, lo: int | None = None, hi: int | None = None) -> int:
    if type(v) is not int:  # bool is not an int here; neither is 1.0 nor "1"
        raise Invalid(f"{what} must be an integer, got {type(v).__name__}")
    if (lo is not None and v < lo) or (hi is not None and v > hi):
        raise Invalid(f"{what} = {v} is out of range [{lo}, {hi}]")
    return v


def _list(v: Any, what: str, max_len: int, min_len: int = 0) -> list:
    if not isinstance(v, list):
        raise Invalid(f"{what} must be a list, got {type(v).__name__}")
    if not min_len <= len(v) <= max_len:
        raise Invalid(f"{what} has {len(v)} entries, expected {min_len}..{max_len}")
    return v


def _str(v: Any, what: str, limit: int = 2000) -> str:
    if not isinstance(v, str):
        raise Invalid(f"{what} must be a string, got {type(v).__name__}")
    return device_text(v, limit)


def _hexes(v: Any, what: str, n: int) -> list[str]:
    out = _list(v, what, n, n)
    for h in out:
        if not isinstance(h, str) or not _HEX64_RE.match(h):
            raise Invalid(f"{what} holds something that is not a sha256")
    return out


def clean_map(v: Any, what: str, limit: int = MAX_MAP_JSON) -> dict[str, Any]:
    """A free-form map from the device (versions, device state, fingerprint): keys and strings
    escaped and capped, numbers finite, at most ``limit`` bytes as JSON (else ``Invalid``)."""
    if v is None:
        return {}
    if not isinstance(v, dict):
        raise Invalid(f"{what} must be an object, got {type(v).__name__}")

    def clean(x: Any, level: int) -> Any:
        if level > 4:
            raise Invalid(f"{what} nested too deep")
        if isinstance(x, dict):
            return {device_text(k, 64): clean(y, level + 1) for k, y in list(x.items())[:256]}
        if isinstance(x, list):
            return [clean(y, level + 1) for y in x[:256]]
        if isinstance(x, str):
            return device_text(x, 256)
        if isinstance(x, float) and not math.isfinite(x):
            raise Invalid(f"{what} holds a non-finite number")
        if x is None or isinstance(x, (bool, int, float)):
            return x
        raise Invalid(f"{what} holds a {type(x).__name__}")

    out = clean(v, 0)
    if len(json.dumps(out)) > limit:
        raise Invalid(f"{what} is larger than {limit} bytes")
    return out


# ----------------------------------------------------------------------------------------- info
def info_dict(raw: bytes, device: str) -> dict[str, Any]:
    """The agent's ``info`` reply (its last stdout line) as a JSON object, or DeviceError."""
    try:
        lines = raw[-MAX_INFO_JSON:].strip().splitlines()
        if not lines:
            raise Invalid("no output")
        data = load_json(lines[-1], MAX_INFO_JSON, "info reply")
        if not isinstance(data, dict):
            raise Invalid(f"info reply is a {type(data).__name__}, not an object")
        return data
    except Invalid as exc:
        raise DeviceError(f"{device}: the agent's info reply is invalid: {exc}") from None


def agent_info(data: dict[str, Any], device: str) -> AgentInfo:
    """A validated AgentInfo from an info reply, or DeviceError."""
    try:
        agent = _str(data.get("agent"), "agent", 32)
        if agent not in ("python", "native"):
            raise Invalid(f"unknown agent kind {agent!r}")
        python = data.get("python")
        return AgentInfo(agent, _str(data.get("agent_version"), "agent_version", 64),
                        _str(data.get("arch"), "arch", 64),
                        None if python is None else _str(python, "python", 64),
                        clean_map(data.get("runtimes"), "runtimes"),
                        clean_map(data.get("fingerprint"), "fingerprint"))
    except Invalid as exc:
        raise DeviceError(f"{device}: the agent's info reply is invalid: {exc}") from None


# --------------------------------------------------------------------------------------- result
def job_result(files: dict[str, bytes], job: Job, agent_ns: float) -> JobResult:
    """A validated JobResult from a parsed bundle; ``Invalid`` names the first violation."""
    data = load_json(files["result.json"], MAX_RESULT_JSON, "result.json")
    if not isinstance(data, dict):
        raise Invalid(f"result.json is a {type(data).__name__}, not an object")
    status = data.get("status")
    if status not in ("ok", "error", "crashed", "timeout"):
        raise Invalid(f"status {device_text(status, 40)!r} unknown")
    limit = data.get("limit")
    if limit is not None and limit not in LIMITS:
        raise Invalid(f"limit {device_text(limit, 40)!r} unknown")
    res = JobResult(status=status, reason=_str(data.get("reason", ""), "reason"))
    res.limit = limit or ""
    res.fresh_seed = job.fresh_seed
    res.runtime_versions = clean_map(data.get("runtime_versions"), "runtime_versions")
    res.device_state = clean_map(data.get("device_state"), "device_state")
    res.limits_enforced = clean_map(data.get("limits_enforced"), "limits_enforced", 2048)
    res.guard_violation = _str(data.get("guard_violation") or "", "guard_violation")
    res.backend_info = clean_map(data.get("backend_info"), "backend_info", 4096)
    fault = data.get("fault")
    if fault is not None:
        if not isinstance(fault, dict) or fault.get("code") not in FAULT_CODES or status == "ok":
            raise Invalid(f"fault {device_text(fault, 80)!r} is not a known failure of a failed job")
        res.fault = {"code": fault["code"], "detail": _str(fault.get("detail", ""), "fault detail", 500)}
    load = data.get("load_ms")
    if load is not None:
        if not isinstance(load, (int, float)) or isinstance(load, bool) or not 0 <= load <= agent_ns / 1e6 * 2 + 1e3:
            raise Invalid(f"load_ms {device_text(load, 40)} is not a duration")
        res.load_ms = float(load)
    phases = clean_map(data.get("phases_ms"), "phases_ms", 1024)
    if any(isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0 for v in phases.values()):
        raise Invalid("phases_ms holds something that is not a duration")
    res.phases_ms = {k: float(v) for k, v in phases.items()}
    if limit:  # a bound the agent's supervisor enforced: a failure with its own name
        res.status = "timeout" if limit == "time" else "error"
        prefix = LIMITS[limit]
        if not res.reason.startswith(prefix):
            res.reason = f"{prefix}: {res.reason}" if res.reason else prefix
        return res
    if status != "ok":
        if status not in ("crashed", "timeout"):
            res.status = "error"
        return res

    n_sets, n_in, n_out = len(job.input_sets), len(job.input_names), len(job.output_specs)
    n_sha = sum(len(s) for s in job.input_sets)

    def npy(name: Any, what: str) -> np.ndarray | None:
        if name is None:
            return None
        if not isinstance(name, str) or name not in files:
            raise Invalid(f"{what} names a file that is not in the bundle")
        return read_npy(files[name], f"{what} ({device_text(name, 64)})")

    # timings: positive integers within the iteration bounds, no longer in total than the host saw
    samples = _list(data.get("samples_ns"), "samples_ns", job.max_iters, max(1, job.min_iters))
    top = int(job.timeout_s * 1e9)
    res.samples_ns = [_sample(x, "a timing sample", top) for x in samples]
    first = _int(data.get("first_timed_iter"), "first_timed_iter", 1, job.max_iters)
    probe = data.get("probe") or {}
    if not isinstance(probe, dict):
        raise Invalid("probe must be an object")
    rep = _list(probe.get("repeat_ns", []), "probe repeat_ns", job.probe_pairs)
    dist = _list(probe.get("distinct_ns", []), "probe distinct_ns", job.probe_pairs)
    if len(rep) != len(dist):
        raise Invalid("probe: repeat and distinct timings differ in number")
    res.probe_repeat_ns = [_sample(x, "a probe sample", top) for x in rep]
    res.probe_distinct_ns = [_sample(x, "a probe sample", top) for x in dist]
    timed = sum(res.samples_ns) + sum(res.probe_repeat_ns) + sum(res.probe_distinct_ns)
    if timed > agent_ns * CLOCK_SLACK + CLOCK_SLACK_NS:
        raise Invalid(f"the timings add up to {timed / 1e6:.1f} ms but the whole agent command took "
                      f"{agent_ns / 1e6:.1f} ms on the host's clock")
    res.first_timed_iter = first

    # outputs: one row per input set, one array per output, each a strictly parsed .npy
    rows = _list(data.get("outputs"), "outputs", n_sets, n_sets)
    res.outputs = [[npy(n, f"output {k} of input set {i}") for k, n in enumerate(_list(row, "an outputs row", n_out, n_out))]
                   for i, row in enumerate(rows)]
    res.repeat_outputs = [npy(n, f"repeat output {k}")
                          for k, n in enumerate(_list(data.get("repeat_outputs"), "repeat_outputs", n_out, n_out))]
    if data.get("input_sha256_before") is not None:
        res.input_sha256_before = _hexes(data["input_sha256_before"], "input_sha256_before", n_sha)
    if data.get("input_sha256_after_sets") is not None:
        res.input_sha256_after_sets = [_hexes(s, "input_sha256_after_sets", n_in)
                                       for s in _list(data["input_sha256_after_sets"], "input_sha256_after_sets",
                                                      n_sets, n_sets)]
    checks = _list(data.get("timed_checks", []), "timed_checks", job.check_iters + job.check_fastest)
    for c in checks:
        if not isinstance(c, dict):
            raise Invalid("a timed check is not an object")
        it = _int(c.get("iter"), "a timed check's iteration", first, first + len(res.samples_ns) - 1)
        outs = [npy(n, f"timed check {it} output {k}")
                for k, n in enumerate(_list(c.get("outputs"), "a timed check's outputs", n_out, n_out))]
        after = c.get("input_sha256_after")
        res.timed_checks.append(TimedCheck(it, outs, None if after is None else _hexes(after, "a timed check's input hashes", n_in)))
    late = data.get("late_change")
    if late is not None:
        if not isinstance(late, dict):
            raise Invalid("late_change must be an object")
        res.late_change = clean_map(late, "late_change", 4096)
    res.input_check = _str(data.get("input_check", ""), "input_check", 200)
    if job.placement and data.get("placement") is not None:
        res.placement = _placement(data["placement"])
    return res


def _placement(p: Any) -> dict[str, Any]:
    """``{"intended": provider, "nodes": {provider: count}}`` or ``{"error": text}``, bounded."""
    if not isinstance(p, dict):
        raise Invalid("placement must be an object")
    if "error" in p:
        return {"error": _str(p["error"], "placement error", 300)}
    nodes = p.get("nodes")
    if not isinstance(nodes, dict) or len(nodes) > 64:
        raise Invalid("placement nodes must be an object of at most 64 providers")
    return {"intended": _str(p.get("intended"), "placement intended", 100),
            "nodes": {_str(k, "a provider name", 100): _int(v, "a node count", 0, 10_000_000) for k, v in nodes.items()}}
