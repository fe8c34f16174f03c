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
    * ``open_stream(argv) -> Stream`` (all three have it; optional for others): a command that
      keeps its stdin and stdout open, for the agent's session (``Stream`` below).
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


class StreamTimeout(Exception):
    """A stream's far end did not answer by the deadline."""


class Stream:
    """A long-running command on the device with its stdin and stdout open: the agent's session
    (device_agents/PROTOCOL.md "The session"), which serves many jobs over one channel. A transport
    that has them returns one from ``open_stream(argv)``; subclasses give ``_recv``, ``_send``,
    ``_kill`` and ``_end``. Reads are buffered and bounded by a deadline (``StreamTimeout``);
    ``None`` from a read is EOF. ``stderr_tail`` is what the command itself printed on stderr."""

    def __init__(self) -> None:
        self._buf = bytearray()
        self._eof = False
        self.stderr_tail = bytearray()
        self.dead = False

    # -- what a transport gives
    def _recv(self, timeout: float) -> bytes:  # b"" at EOF; StreamTimeout when nothing came in time
        raise NotImplementedError

    def _send(self, data: bytes) -> None:
        raise NotImplementedError

    def _kill(self) -> None:
        raise NotImplementedError

    def _end(self) -> None:  # EOF on its stdin, then release the channel
        raise NotImplementedError

    # -- the reader
    def _fill(self, deadline: float) -> bool:
        import time

        if self._eof:
            return False
        left = deadline - time.monotonic()
        if left <= 0:
            raise StreamTimeout()
        chunk = self._recv(left)
        if not chunk:
            self._eof = True
            return False
        self._buf += chunk
        return True

    def read_line(self, deadline: float, limit: int = 256) -> bytes | None:
        """One line without its newline; None at EOF, or past ``limit`` bytes (not a line of ours)."""
        while True:
            nl = self._buf.find(b"\n")
            if nl >= 0:
                line = bytes(self._buf[:nl])
                del self._buf[:nl + 1]
                return line if nl <= limit else None
            if len(self._buf) > limit or not self._fill(deadline):
                return None

    def read_exact(self, n: int, deadline: float) -> bytes | None:
        while len(self._buf) < n:
            if not self._fill(deadline):
                return None
        data = bytes(self._buf[:n])
        del self._buf[:n]
        return data

    def send(self, data: bytes) -> None:
        self._send(data)

    def kill(self) -> None:
        """End the command at once (its job, if one runs, is stopped and swept on the device)."""
        self.dead = True
        try:
            self._kill()
        except Exception:  # noqa: BLE001 - the device may be gone already: nothing left to kill
            pass

    def close(self) -> None:
        if self.dead:
            return
        self.dead = True
        try:
            self._end()
        except Exception:  # noqa: BLE001 - as kill
            self.kill()
