"""The local transport under hostile commands: bounded output, bounded time."""

from __future__ import annotations

import os
import signal
import time

from edgetune.devices.base import MAX_STDERR
from edgetune.devices.local import LocalTransport


def test_a_setsid_grandchild_holding_the_pipes_does_not_keep_us_waiting(tmp_path):
    marker = tmp_path / "pid"
    t0 = time.monotonic()
    # the grandchild leaves the process group and keeps stdout/stderr open for 30 s
    c = LocalTransport().run(["sh", "-c", f"setsid sh -c 'echo $$ > {marker}; exec sleep 30' & echo done"],
                             timeout=10)
    took = time.monotonic() - t0
    try:
        assert c.ok and c.text().strip() == "done"
        assert took < 5, f"waited {took:.1f} s on an escaped grandchild's pipes"
    finally:
        for _ in range(50):
            if marker.exists() and marker.read_text().strip():
                break
            time.sleep(0.05)
        try:
            os.kill(int(marker.read_text()), signal.SIGKILL)
        except (OSError, ValueError):
            pass


def test_a_command_that_keeps_running_after_closing_its_pipes_is_killed_at_the_timeout():
    t0 = time.monotonic()
    c = LocalTransport().run(["sh", "-c", "exec >/dev/null 2>&1; sleep 30"], timeout=2)
    assert c.timed_out and time.monotonic() - t0 < 6


def test_stdout_is_cut_at_max_output_and_the_command_killed():
    t0 = time.monotonic()
    c = LocalTransport().run(["sh", "-c", "yes edgetune"], timeout=30, max_output=1 << 20)
    assert c.overflow and not c.timed_out and len(c.stdout) == 1 << 20
    assert time.monotonic() - t0 < 10


def test_stderr_keeps_its_tail_only():
    c = LocalTransport().run(["sh", "-c", "head -c 1000000 /dev/zero | tr '\\0' x >&2; echo END >&2"], timeout=30)
    assert c.ok and len(c.stderr) <= MAX_STDERR and c.stderr.endswith(b"END\n")


def test_stdin_is_fed_while_output_is_read():
    data = os.urandom(4 << 20)
    c = LocalTransport().run(["cat"], timeout=30, stdin=data)
    assert c.ok and c.stdout == data
