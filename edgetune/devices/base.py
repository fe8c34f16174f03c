"""The Transport interface every device is reached through (local, ssh, adb).

argv lists only, never shell strings: the one place that turns argv into a shell command line
(for transports whose far end is a shell) is ``shell_join``.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from typing import Protocol, Sequence, runtime_checkable


MAX_STDERR = 64 * 1024  # bytes of a command's stderr kept (its tail: where the error is)
DEFAULT_MAX_OUTPUT = 64 * 1024 * 1024  # stdout bytes held of a command when the caller gives no bound


def keep_tail(buf: bytearray, limit: int = MAX_STDERR) -> None:
    """Trim ``buf`` in place to its last ``limit`` bytes."""
    if len(buf) > limit:
        del buf[: len(buf) - limit]


@dataclass(frozen=True)
class Completed:
    """What a remote command returned. ``timed_out`` means it was killed at its timeout."""

    returncode: int
    stdout: bytes
    stderr: bytes
    timed_out: bool = False
    overflow: bool = False  # stdout passed ``max_output``: the command was killed, stdout cut there

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out

    def text(self) -> str:
        return self.stdout.decode("utf-8", "replace")


@runtime_checkable
class Transport(Protocol):
    """How the host reaches a device.

    * ``run`` never raises for a non-zero exit or a timeout: those come back in ``Completed``.
      It raises ``DeviceError`` subclasses only when the device itself cannot be reached.
      ``max_output`` bounds what the host holds of the command's stdout: past it the command is
      killed and ``Completed.overflow`` is set (a device cannot make the host hold more);
      stderr is always bounded to its last ``MAX_STDERR`` bytes.
    * ``push``/``pull`` copy one file; remote parent directories must exist (use ``run(["mkdir","-p",...])``).
    * ``kind`` is "local", "ssh" or "adb"; ``address`` is a display string without secrets.
    """

    kind: str
    address: str

    def run(self, argv: Sequence[str], timeout: float, stdin: bytes | None = None,
            max_output: int | None = None) -> Completed: ...

    def push(self, local: str, remote: str) -> None: ...

    def pull(self, remote: str, local: str) -> None: ...

    def close(self) -> None: ...


def shell_join(argv: Sequence[str]) -> str:
    """Quote an argv list for a POSIX sh (also Android's mksh/toybox sh). The ONLY quoting site."""
    if not argv:
        raise ValueError("empty argv")
    return " ".join(shlex.quote(str(a)) for a in argv)
