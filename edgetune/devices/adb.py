"""The adb transport: a phone behind a (real) adb server.

Server-level questions (is the device there, its state, its features) go through adbutils'
``AdbClient``. The per-command path speaks the adb server's smart-socket protocol directly on a
plain socket: ``host:transport:SERIAL`` then ``shell,v2,raw:CMD`` (shell protocol v2, so exit
codes and stderr come back separately), and ``sync:`` for push/pull. adbutils' own connections
cost ~20 ms per command (``AdbConnection.close`` sleeps 10 ms, and ``open_transport`` asks the
server its version first, on another connection that sleeps too), and on a refused connection
adbutils silently starts an adb server on the default port; here a command costs one short
connection and a refused one is a ``DeviceUnreachable``.

Each command is ``echo $$ >&2; exec ARGV`` where ARGV comes from ``shell_join`` (the only quoting
site). The first stderr line (the remote pid, also its process group: adbd setsid()s the shell) is
stripped; on timeout the transport kills that group on the device and closes the stream (which
makes adbd kill it too).
"""

from __future__ import annotations

import os
import signal
import socket
import stat
import struct
import threading
import time
from typing import Sequence

from edgetune.devices.base import (DEFAULT_MAX_OUTPUT, MAX_STDERR, Completed, Stream, StreamTimeout, keep_tail,
                                   shell_join)
from edgetune.errors import AuthError, DeviceError, DeviceUnreachable, MissingExtra

DEFAULT_WORKDIR = "/data/local/tmp/edgetune"
_SYNC_DATA_MAX = 64 * 1024
_ID_STDIN, _ID_STDOUT, _ID_STDERR, _ID_EXIT, _ID_CLOSE_STDIN = 0, 1, 2, 3, 4


class _Overflow(Exception):
    """stdout passed the caller's max_output."""


class AdbTransport:
    """``Transport`` over adb. ``serial`` as ``adb devices`` lists it (e.g. ``127.0.0.1:40123``)."""

    kind = "adb"

    def __init__(self, serial: str, adb_host: str = "127.0.0.1", adb_port: int = 5037,
                 workdir: str = DEFAULT_WORKDIR, connect_timeout: float = 5.0):
        self.serial = serial
        self.adb_host = adb_host
        self.adb_port = int(adb_port)
        self.workdir = workdir
        self.connect_timeout = connect_timeout
        default = (adb_host, self.adb_port) in (("127.0.0.1", 5037), ("localhost", 5037))
        self.address = f"adb://{serial}" + ("" if default else f"@{adb_host}:{self.adb_port}")
        self._checked = False
        self._lock = threading.Lock()
        self._closed = False

    # -- device state ---------------------------------------------------------------------
    def check(self) -> None:
        """Raise ``DeviceUnreachable``/``AuthError`` unless the device is online and speaks shell v2."""
        self._server_socket(timeout=self.connect_timeout).close()  # up? (adbutils would start one)
        try:
            import adbutils
        except ImportError:
            raise MissingExtra("the adb transport", "remote") from None

        client = adbutils.AdbClient(host=self.adb_host, port=self.adb_port, socket_timeout=self.connect_timeout)
        try:
            state = client.device(self.serial).get_state()
        except adbutils.AdbError as exc:
            raise self._map_fail(str(exc)) from None
        if state != "device":
            raise self._map_fail(f"device {state}")
        try:
            features = client.device(self.serial).get_features().split(",")
        except adbutils.AdbError as exc:
            raise self._map_fail(str(exc)) from None
        if "shell_v2" not in features:
            raise DeviceError(f"{self.address}: device lacks the shell_v2 feature (Android < 7 is not supported)")
        self._checked = True

    def _ensure(self) -> None:
        if self._closed:
            raise DeviceError(f"{self.address}: transport is closed")
        if not self._checked:
            with self._lock:
                if not self._checked:
                    self.check()

    # -- raw smart-socket connection to the adb server --------------------------------------
    def _server_socket(self, timeout: float) -> socket.socket:
        try:
            s = socket.create_connection((self.adb_host, self.adb_port), timeout=timeout)
        except OSError as exc:
            raise DeviceUnreachable(
                f"adb server {self.adb_host}:{self.adb_port} unreachable ({exc.strerror or exc}); "
                f"start it with: adb -P {self.adb_port} start-server") from None
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return s

    def _map_fail(self, msg: str) -> DeviceError:
        line = " ".join(msg.strip().splitlines()[:1]) or "unknown error"
        low = msg.lower()
        if "unauthorized" in low:
            return AuthError(f"{self.address}: device unauthorized: accept this host's adb key "
                             "(~/.android/adbkey.pub) on the device")
        if "not found" in low or "offline" in low or "no devices" in low or "closed" in low:
            return DeviceUnreachable(f"{self.address}: {line}")
        return DeviceError(f"{self.address}: {line}")

    def _open(self, service: str, timeout: float) -> socket.socket:
        """A socket connected to ``service`` on the device (after both OKAYs)."""
        s = self._server_socket(timeout=min(timeout, self.connect_timeout))
        try:
            s.settimeout(max(timeout, 0.001))
            for req in (f"host:transport:{self.serial}", service):
                data = req.encode("utf-8", "surrogateescape")
                s.sendall(b"%04x" % len(data) + data)
                status = _recv_exact(s, 4)
                if status != b"OKAY":
                    if status == b"FAIL":
                        n = int(_recv_exact(s, 4), 16)
                        raise self._map_fail(_recv_exact(s, n).decode("utf-8", "replace"))
                    raise DeviceError(f"{self.address}: unexpected adb server reply {status!r}")
            return s
        except BaseException as exc:
            s.close()
            if isinstance(exc, socket.timeout):
                raise DeviceUnreachable(f"{self.address}: adb server did not answer in {timeout:.1f} s") from None
            if isinstance(exc, (OSError, EOFError)):
                raise DeviceUnreachable(f"{self.address}: connection to adb server lost ({exc})") from None
            raise

    # -- Transport --------------------------------------------------------------------------
    def run(self, argv: Sequence[str], timeout: float, stdin: bytes | None = None,
            max_output: int | None = None) -> Completed:
        self._ensure()
        limit = DEFAULT_MAX_OUTPUT if max_output is None else int(max_output)
        argv = [str(a) for a in argv]
        # $$ is the pid (and process group) of the command after exec: reported for the timeout kill
        cmd = "echo $$ >&2; exec " + shell_join(argv)
        deadline = time.monotonic() + timeout
        s = self._open("shell,v2,raw:" + cmd, timeout)
        out, err = bytearray(), bytearray()
        pid: int | None = None
        writer = None
        try:
            if stdin is None:
                s.sendall(_packet(_ID_CLOSE_STDIN, b""))
            elif len(stdin) <= _SYNC_DATA_MAX:
                s.sendall(_packet(_ID_STDIN, stdin) + _packet(_ID_CLOSE_STDIN, b""))
            else:  # big stdin: write concurrently, the command may produce output before reading it
                writer = threading.Thread(target=_feed, args=(s, stdin), daemon=True)
                writer.start()
            buf = bytearray()
            errline = bytearray()
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise socket.timeout()
                s.settimeout(left)
                chunk = s.recv(262144)
                if not chunk:
                    raise DeviceUnreachable(f"{self.address}: device closed the shell stream without an exit status")
                buf += chunk
                while len(buf) >= 5:
                    pkt_id, n = struct.unpack_from("<BI", buf, 0)
                    if n > limit + (1 << 20):  # a packet bigger than all we would keep: refuse it
                        raise _Overflow()
                    if len(buf) < 5 + n:
                        break
                    data = bytes(buf[5:5 + n])
                    del buf[:5 + n]
                    if pkt_id == _ID_STDOUT:
                        out += data
                        if len(out) > limit:  # a device cannot make the host hold more
                            del out[limit:]
                            raise _Overflow()
                    elif pkt_id == _ID_STDERR:
                        if pid is None:  # the first line is the pid; 0: none came (not ours)
                            errline += data
                            nl = errline.find(b"\n")
                            if nl >= 0:
                                pid = _int_or_none(errline[:nl])
                                err += errline[nl + 1:] if pid is not None else errline
                                pid = pid or 0
                            elif len(errline) > 64:  # no pid line: a shell error, keep it all
                                err += errline
                                pid = 0
                        else:
                            err += data
                        keep_tail(err, MAX_STDERR)
                    elif pkt_id == _ID_EXIT:
                        return Completed(data[0] if data else 255, bytes(out), bytes(err))
        except (socket.timeout, _Overflow) as exc:
            if pid is None and errline:
                pid = _int_or_none(errline.split(b"\n")[0])
            self._kill_remote(pid)
            over = isinstance(exc, _Overflow)
            return Completed(-signal.SIGKILL, bytes(out), bytes(err), timed_out=not over, overflow=over)
        except OSError as exc:
            raise DeviceUnreachable(f"{self.address}: shell stream lost ({exc.strerror or exc})") from None
        finally:
            s.close()

    def open_stream(self, argv: Sequence[str]) -> Stream:
        self._ensure()
        # $$ is the pid (and process group: adbd setsid()s the shell) of the command after exec
        s = self._open("shell,v2,raw:echo $$ >&2; exec " + shell_join([str(a) for a in argv]), self.connect_timeout)
        return _AdbStream(self, s)

    def _kill_remote(self, pid: int | None) -> None:
        if not pid or pid <= 1:
            return
        try:
            s = self._open("shell,v2,raw:" + shell_join(["kill", "-9", f"-{pid}", str(pid)]) + " 2>/dev/null",
                           self.connect_timeout)
        except DeviceError:
            return
        try:
            s.sendall(_packet(_ID_CLOSE_STDIN, b""))
            s.settimeout(self.connect_timeout)
            while s.recv(4096):
                pass
        except OSError:
            pass
        finally:
            s.close()

    def push(self, local: str, remote: str) -> None:
        self._ensure()
        try:
            st = os.stat(local)
            f = open(local, "rb")
        except OSError as exc:
            raise DeviceError(f"adb push {local}: {exc.strerror or exc}") from None
        mode = stat.S_IFREG | (st.st_mode & 0o777)
        with f, self._sync() as s:
            try:
                _send_req(s, b"SEND", f"{remote},{mode}".encode("utf-8", "surrogateescape"))
                while True:
                    data = f.read(_SYNC_DATA_MAX)
                    if not data:
                        break
                    s.sendall(b"DATA" + struct.pack("<I", len(data)) + data)
                s.sendall(b"DONE" + struct.pack("<I", int(st.st_mtime)))
                reply = _recv_exact(s, 8)
                if reply[:4] == b"FAIL":
                    msg = _recv_exact(s, struct.unpack("<I", reply[4:])[0]).decode("utf-8", "replace")
                    raise DeviceError(f"{self.address}: push {local} -> {remote} failed: {msg}")
                if reply[:4] != b"OKAY":
                    raise DeviceError(f"{self.address}: push {remote}: unexpected reply {reply[:4]!r}")
                s.sendall(b"QUIT" + bytes(4))
            except (OSError, EOFError) as exc:
                raise DeviceUnreachable(f"{self.address}: push {remote}: connection lost ({exc})") from None

    def pull(self, remote: str, local: str) -> None:
        self._ensure()
        tmp = f"{local}.part{os.getpid()}"
        try:
            with self._sync() as s, open(tmp, "wb") as f:
                try:
                    _send_req(s, b"RECV", remote.encode("utf-8", "surrogateescape"))
                    while True:
                        hdr = _recv_exact(s, 8)
                        cid, n = hdr[:4], struct.unpack("<I", hdr[4:])[0]
                        if cid == b"DATA":
                            f.write(_recv_exact(s, n))
                        elif cid == b"DONE":
                            break
                        elif cid == b"FAIL":
                            msg = _recv_exact(s, n).decode("utf-8", "replace")
                            raise DeviceError(f"{self.address}: pull {remote} failed: {msg}")
                        else:
                            raise DeviceError(f"{self.address}: pull {remote}: unexpected reply {cid!r}")
                    s.sendall(b"QUIT" + bytes(4))
                except (OSError, EOFError) as exc:
                    raise DeviceUnreachable(f"{self.address}: pull {remote}: connection lost ({exc})") from None
            os.replace(tmp, local)
        except OSError as exc:
            raise DeviceError(f"adb pull -> {local}: {exc.strerror or exc}") from None
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)

    def close(self) -> None:
        self._closed = True  # nothing is held open between calls

    def __repr__(self) -> str:
        return f"AdbTransport({self.address})"

    # -- helpers ------------------------------------------------------------------------------
    def _sync(self):
        transport = self

        class _Ctx:
            def __enter__(self_inner):
                self_inner.s = transport._open("sync:", transport.connect_timeout)
                self_inner.s.settimeout(max(60.0, transport.connect_timeout))
                return self_inner.s

            def __exit__(self_inner, *exc):
                self_inner.s.close()

        return _Ctx()


class _AdbStream(Stream):
    """A command on a shell-protocol-v2 stream with stdin and stdout open: stdin as packets, stdout
    packets to the reader, stderr kept (its first line, the pid, taken for the kill), the exit
    packet as EOF."""

    def __init__(self, transport: AdbTransport, s: socket.socket):
        super().__init__()
        self._t, self._s, self._pid = transport, s, None
        self._raw = bytearray()
        self._errline = bytearray()

    def _recv(self, timeout: float) -> bytes:
        deadline = time.monotonic() + timeout
        while True:
            while len(self._raw) >= 5:
                pkt_id, n = struct.unpack_from("<BI", self._raw, 0)
                if n > (64 << 20):  # no packet of an answer is that big: not a shell stream of ours
                    return b""
                if len(self._raw) < 5 + n:
                    break
                data = bytes(self._raw[5:5 + n])
                del self._raw[:5 + n]
                if pkt_id == _ID_STDOUT and data:
                    return data
                if pkt_id == _ID_STDERR:
                    if self._pid is None:
                        self._errline += data
                        nl = self._errline.find(b"\n")
                        if nl >= 0 or len(self._errline) > 64:
                            self._pid = _int_or_none(self._errline[:max(nl, 0)]) or 0
                            self.stderr_tail += self._errline[nl + 1:] if self._pid else self._errline
                    else:
                        self.stderr_tail += data
                    keep_tail(self.stderr_tail, MAX_STDERR)
                elif pkt_id == _ID_EXIT:
                    return b""
            left = deadline - time.monotonic()
            if left <= 0:
                raise StreamTimeout()
            self._s.settimeout(left)
            try:
                chunk = self._s.recv(262144)
            except socket.timeout:
                raise StreamTimeout() from None
            except OSError as exc:
                raise DeviceUnreachable(f"{self._t.address}: shell stream lost ({exc.strerror or exc})") from None
            if not chunk:
                return b""
            self._raw += chunk

    def _send(self, data: bytes) -> None:
        try:
            mv = memoryview(data)
            for off in range(0, len(data), _SYNC_DATA_MAX):
                self._s.sendall(_packet(_ID_STDIN, bytes(mv[off:off + _SYNC_DATA_MAX])))
        except OSError:
            self._eof = True  # it is gone: the next read says so

    def _kill(self) -> None:
        try:
            self._t._kill_remote(self._pid)
        finally:
            self._s.close()

    def _end(self) -> None:
        try:
            self._s.sendall(_packet(_ID_CLOSE_STDIN, b""))
            end = time.monotonic() + 5.0
            while self._recv(max(0.0, end - time.monotonic())):
                pass  # until its exit packet
        except StreamTimeout:
            self._kill()
        finally:
            self._s.close()


def _packet(pkt_id: int, data: bytes) -> bytes:
    return struct.pack("<BI", pkt_id, len(data)) + data


def _feed(s: socket.socket, data: bytes) -> None:
    try:
        mv = memoryview(data)
        for off in range(0, len(data), _SYNC_DATA_MAX):
            s.sendall(_packet(_ID_STDIN, bytes(mv[off:off + _SYNC_DATA_MAX])))
        s.sendall(_packet(_ID_CLOSE_STDIN, b""))
    except OSError:
        pass  # the command exited or timed out first; run() reports that


def _send_req(s: socket.socket, cid: bytes, payload: bytes) -> None:
    s.sendall(cid + struct.pack("<I", len(payload)) + payload)


def _recv_exact(s: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = s.recv(n - len(buf))
        if not chunk:
            raise EOFError("connection closed")
        buf += chunk
    return bytes(buf)


def _int_or_none(b: bytes) -> int | None:
    try:
        return int(b.strip())
    except ValueError:
        return None
