"""A forging device: a compromised phone or board whose "python" forges the agent's answers.

``forger_script(path, scenario)`` writes an executable that stands in for the device's Python: it
passes every command through to the real interpreter, except the agent's ``info``, ``run-stdio``
and ``session``, whose real answers it rewrites according to ``scenario`` (see ``SCENARIOS``; a
session's answers under the scenario set when each job comes back). The
host cannot tell it from a genuine Python: the agent file it runs is ours, byte for byte (the
hash check passes); only what comes back is forged. Used through every farm transport whose
device can run it (local, ssh, the qemu board); the adb phone has no Python and forges with a
lying ``sha256sum`` instead (tests/farm/test_forging_device.py).
"""

from __future__ import annotations

import stat
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

# scenario -> the verdict code the host must give (a job scenario) or "device-error" (info scenarios)
SCENARIOS = {
    "honest": "ok",
    "negative-timings": "invalid-result",
    "zero-timings": "invalid-result",
    "one-ns-timings": "impossible-timing",
    "nan-timings": "invalid-result",
    "inf-timings": "invalid-result",
    "huge-timings": "invalid-result",
    "float-timings": "invalid-result",
    "timings-longer-than-wall": "invalid-result",
    "too-few-samples": "invalid-result",
    "npz-output": "invalid-result",
    "pickle-output": "invalid-result",
    "huge-npy-header": "invalid-result",
    "truncated-npy": "invalid-result",
    "samples-string": "invalid-result",
    "outputs-int": "invalid-result",
    "result-list": "invalid-result",
    "result-deep": "invalid-result",
    "missing-output-file": "invalid-result",
    "traversal-name": "invalid-result",
    "duplicate-file": "invalid-result",
    "timed-check-out-of-range": "invalid-result",
    "sha-not-hex": "invalid-result",
    "big-field": "result-too-large",  # a 64 MB reason: more than the job's outputs can take
    "long-reason": "error",  # a 3 MB reason that fits the bound: kept as its first 2000 characters
    "huge-stream": "result-too-large",
    "markup-reason": "error",
    "escape-reason": "error",
    "garbage-stdout": "crashed",
    "info-not-json": "device-error",
    "info-list": "device-error",
    "info-fingerprint-string": "device-error",
    "info-huge": "device-error",
    "info-markup": "ok",  # valid, hostile text: stored and printed escaped
}
HOSTILE = "[/bold][red]\x1b[2J\x1b]0;pwned\x07\x7f\u202e"


def forger_script(path: Path, scenario: str = "honest", real_python: str = sys.executable) -> Path:
    """An executable "python" for a forging device (see the module docstring). It reads its
    scenario from ``<path>.scenario`` on every call: ``set_scenario`` switches it between jobs."""
    path.write_text(f"""#!{real_python}
import os, sys
sys.path.insert(0, {str(REPO)!r})
from tests.forgery.forge import main
main({real_python!r}, open({str(path) + '.scenario'!r}).read().strip(), {str(path) + '.scenario'!r})
""")
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    set_scenario(path, scenario)
    return path


def set_scenario(path: Path, scenario: str) -> None:
    if scenario not in SCENARIOS:
        raise KeyError(scenario)
    Path(str(path) + ".scenario").write_text(scenario)


__all__ = ["SCENARIOS", "HOSTILE", "forger_script", "set_scenario", "REPO"]
