"""The local transport: the host itself, through the same interface as ssh and adb.

A command runs in its own session (process group) so a timed-out command and everything it
spawned in that group die together. Output is read with a bound (``max_output``) and stderr keeps
its tail only. A grandchild that left the group (``setsid``) and still holds our pipes cannot keep
us waiting: once the command itself has exited, its pipes get a short grace period and are then
closed — the agent's supervisor (device_agents/PROTOCOL.md) kills such orphans on the device side.
"""

from __future__ import annotations

import os
import selectors
import shutil
import signal
import subprocess
import threading
import time
from typing import Sequence

from edgetune.devices.base import DEFAULT_MAX_OUTPUT, MAX_STDERR, Completed, Stream, StreamTimeout, keep_tail
from edgetune.errors import DeviceError

_PIPE_GRACE_S = 1.0  # how long pipes may stay open after the command exited


class LocalTransport:
    kind = "local"
    address = "local"

    def __init__(self, env: dict[str, str] | None = None):
        self._env = env

    def run(self, argv: Sequence[str], timeout: float, stdin: bytes | None = None,
            max_output: int | None = None) -> Completed:
        argv = [str(a) for a in argv]
        limit = DEFAULT_MAX_OUTPUT if max_output is None else int(max_output)
        try:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=self._env,
                start_new_session=True,
            )
        except FileNotFoundError as exc:
            return Completed(127, b"", f"{argv[0]}: not found ({exc.strerror})".encode())
        except PermissionError as exc:
            return Completed(126, b"", f"{argv[0]}: {exc.strerror}".encode())
        try:
            return _collect(proc, stdin, time.monotonic() + timeout, limit)
        except BaseException:
            _kill_group(proc)
            proc.wait()
            raise

    def open_stream(self, argv: Sequence[str]) -> Stream:
        return _LocalStream([str(a) for a in argv], self._env)

    def push(self, local: str, remote: str) -> None:
        _copy(local, remote)

    def pull(self, remote: str, local: str) -> None:
        _copy(remote, local)

    def close(self) -> None:
        pass


class _LocalStream(Stream):
    """A local command with its stdin and stdout as pipes, in a session (process group) of its own;
    its stderr goes to an unlinked file whose tail is read when it ends."""

    def __init__(self, argv: list[str], env: dict[str, str] | None):
        super().__init__()
        import tempfile

        self._err = tempfile.TemporaryFile()
        try:
            self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._err,
                                         env=env, start_new_session=True)
        except OSError as exc:
            self._err.close()
            raise DeviceError(f"{argv[0]}: cannot start ({exc.strerror or exc})") from None
        self._fd = self.proc.stdout.fileno()

    def _recv(self, timeout: float) -> bytes:
        import select

        r, _, _ = select.select([self._fd], [], [], timeout)
        if not r:
            raise StreamTimeout()
        return os.read(self._fd, 1 << 16)

    def _send(self, data: bytes) -> None:
        try:
            self.proc.stdin.write(data)
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError, ValueError):
            self._eof = True  # it is gone: the next read says so

    def _tail(self) -> None:
        try:
            self._err.seek(0, os.SEEK_END)
            size = self._err.tell()
            self._err.seek(max(0, size - MAX_STDERR))
            self.stderr_tail = bytearray(self._err.read())
        except (OSError, ValueError):
            pass

    def _kill(self) -> None:
        _kill_group(self.proc)
        self.proc.wait()
        self._release()

    def _end(self) -> None:
        try:
            self.proc.stdin.close()
        except (BrokenPipeError, OSError, ValueError):
            pass
        try:
            self.proc.wait(timeout=5.0)
        except subprocess.TimeoutExpired:
            _kill_group(self.proc)
            self.proc.wait()
        self._release()

    def _release(self) -> None:
        self._tail()
        for f in (self.proc.stdin, self.proc.stdout, self._err):
            try:
                f.close()
            except (OSError, ValueError):
                pass


def _feed(proc: subprocess.Popen, data: bytes) -> None:
    try:
        proc.stdin.write(data)
    except (BrokenPipeError, OSError, ValueError):
        pass  # the command did not read all of it (or died): its exit status says why
    finally:
        try:
            proc.stdin.close()
        except (BrokenPipeError, OSError, ValueError):
            pass


def _collect(proc: subprocess.Popen, stdin: bytes | None, deadline: float, limit: int) -> Completed:
    if stdin is not None:
        threading.Thread(target=_feed, args=(proc, stdin), daemon=True).start()
    out, err = bytearray(), bytearray()
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ, out)
    sel.register(proc.stderr, selectors.EVENT_READ, err)
    timed_out = overflow = False
    exited_at: float | None = None
    try:
        while sel.get_map():
            now = time.monotonic()
            if exited_at is None and proc.poll() is not None:
                exited_at = now
            if exited_at is not None and now - exited_at > _PIPE_GRACE_S:
                break  # an escaped grandchild holds the pipes: the command's answer is complete
            if now >= deadline:
                timed_out = True
                break
            wait = min(deadline - now, 0.1 if exited_at is None else _PIPE_GRACE_S)
            for key, _ in sel.select(wait):
                chunk = os.read(key.fileobj.fileno(), 1 << 16)
                if not chunk:
                    sel.unregister(key.fileobj)
                    continue
                buf = key.data
                buf += chunk
                if buf is err:
                    keep_tail(err, MAX_STDERR)
                elif len(out) > limit:
                    del out[limit:]
                    overflow = True
            if overflow:
                break
    finally:
        sel.close()
        for f in (proc.stdout, proc.stderr):
            f.close()
    if timed_out or overflow:
        _kill_group(proc)
    try:
        rc = proc.wait(timeout=max(0.0, deadline - time.monotonic()) + _PIPE_GRACE_S)
    except subprocess.TimeoutExpired:  # it closed its pipes and goes on: the deadline applies
        _kill_group(proc)
        rc, timed_out = proc.wait(), True
    if timed_out:
        return Completed(-signal.SIGKILL, bytes(out), bytes(err), timed_out=True)
    return Completed(rc, bytes(out), bytes(err), overflow=overflow)


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _copy(src: str, dst: str) -> None:
    try:
        if os.path.abspath(src) == os.path.abspath(dst):
            return
        tmp = f"{dst}.part{os.getpid()}"
        shutil.copyfile(src, tmp)
        os.replace(tmp, dst)
    except OSError as exc:
        raise DeviceError(f"local copy {src} -> {dst} failed: {exc.strerror or exc}") from exc
