"""NVIDIA's compute-sanitizer around a judged CUDA kernel (``edgetune judge`` on a GPU device).

Where the device has ``compute-sanitizer`` (on PATH, or the CUDA toolkit's ``/usr/local/cuda/bin``),
each CUDA kernel that passed its first correctness check runs once more per tool, memcheck and
racecheck, as an ordinary agent job with the agent's whole command under the sanitizer
(``--target-processes all``: the judge backend's kernel child is a fork of the agent's worker, and
the sanitizer follows it). The kernel child still opens the GPU before its seccomp filter, so the
sanitizer's connection to its front end exists before the filter, which forbids making new ones.
The report goes to a log file in the agent's work dir, which the host reads and removes.

What a report names, as the judge names CPU failures: an invalid write (global, shared, local) is
``out-of-bounds-write``, any other invalid access ``out-of-bounds-access``, a racecheck hazard
reported as an error ``data-race``, a CUDA API error the kernel hit ``kernel-error``. A report
without its summary line (the sanitizer did not run to the end) is said as such, never a pass.
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass
from typing import Any

TOOLS = ("memcheck", "racecheck")
_FIND = ("command -v compute-sanitizer 2>/dev/null || "
         "{ test -x /usr/local/cuda/bin/compute-sanitizer && echo /usr/local/cuda/bin/compute-sanitizer; }")
_PREFIX = re.compile(r"^=+ ?")
_SUMMARY = {"memcheck": re.compile(r"ERROR SUMMARY: (\d+) errors?"),
            "racecheck": re.compile(r"RACECHECK SUMMARY: \d+ hazards? displayed \((\d+) errors?, \d+ warnings?\)")}


@dataclass(frozen=True)
class Finding:
    ok: bool | None  # None: the report is incomplete (no summary line): no verdict
    code: str | None
    detail: str
    errors: int | None


def find(transport) -> str | None:
    """The device's compute-sanitizer (an absolute path), or None."""
    try:
        c = transport.run(["sh", "-c", _FIND], timeout=30)
    except Exception:  # noqa: BLE001 - a device without a shell or the tool: no sanitizer
        return None
    path = c.text().strip().splitlines()[0] if c.ok and c.text().strip() else ""
    return path if path.startswith("/") and "compute-sanitizer" in path else None


def log_path(workdir: str, tool: str) -> str:
    return f"{workdir}/sanitizer-{tool}-{uuid.uuid4().hex[:12]}.log"


def wrap(exe: str, tool: str, log: str) -> list[str]:
    """The argv prefix that runs the agent's job under ``tool``."""
    if tool not in TOOLS:
        raise ValueError(f"unknown compute-sanitizer tool {tool!r}")
    return [exe, "--tool", tool, "--target-processes", "all", "--print-limit", "20", "--log-file", log]


def parse(text: str, tool: str) -> Finding:
    """A compute-sanitizer report (its log file) as a named finding."""
    lines = [_PREFIX.sub("", ln).rstrip() for ln in text.splitlines()]
    m = next(filter(None, map(_SUMMARY[tool].search, lines)), None)
    if m is None:
        last = next((ln for ln in reversed(lines) if ln.strip()), "an empty report")
        return Finding(None, None, f"compute-sanitizer {tool} did not finish its report (last line: {last[:160]})",
                       None)
    n = int(m.group(1))
    if n == 0:
        return Finding(True, None, f"compute-sanitizer {tool}: no errors", 0)
    first, where = "", ""
    for i, ln in enumerate(lines):
        s = ln.strip()
        if s.startswith("Invalid ") or s.startswith("Error: Race") or s.startswith("Program hit") \
                or s.startswith("Race reported"):
            first = s
            where = next((x.strip() for x in lines[i + 1:i + 3] if x.strip().startswith("at ")), "")
            break
    if tool == "racecheck":
        code = "data-race"
    elif first.startswith("Invalid") and " write " in f" {first} ":
        code = "out-of-bounds-write"
    elif first.startswith("Invalid"):
        code = "out-of-bounds-access"
    else:
        code = "kernel-error"
    detail = f"compute-sanitizer {tool}: {first or 'errors reported'}" + (f" ({where})" if where else "")
    return Finding(False, code, f"{detail}; {n} error{'s' if n != 1 else ''} in all", n)


def as_check(f: Finding, tool: str, spec: str) -> dict[str, Any]:
    """The judge's record of one sanitizer run (``Judged.checks``)."""
    return {"spec": spec, "round": 0, "check": f"compute-sanitizer {tool}", "ok": f.ok, "code": f.code,
            "reason": f.detail, "errors": f.errors}
