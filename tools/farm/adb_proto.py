"""adb's device-side wire protocol for the emulator (tools/farm/adbd_emu.py): the message and
service constants, Android RSA public keys and AUTH token checks, and one connection with its
streams (CNXN/AUTH/OPEN/OKAY/WRTE/CLSE, flow control: one WRTE in flight until OKAY)."""

from __future__ import annotations

import base64
import os
import queue
import secrets
import socket
import struct
import sys
import threading
import traceback
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from adbd_emu import Emulator

# ---------------------------------------------------------------------------------------------
# wire protocol constants (system/core/adb/adb.h)

A_SYNC = 0x434E5953
A_CNXN = 0x4E584E43
A_OPEN = 0x4E45504F
A_OKAY = 0x59414B4F
A_CLSE = 0x45534C43
A_WRTE = 0x45545257
A_AUTH = 0x48545541
A_STLS = 0x534C5453

A_VERSION_MIN = 0x01000000
A_VERSION_SKIP_CHECKSUM = 0x01000001
A_VERSION = 0x01000001
MAX_PAYLOAD = 1024 * 1024

ADB_AUTH_TOKEN = 1
ADB_AUTH_SIGNATURE = 2
ADB_AUTH_RSAPUBLICKEY = 3
TOKEN_SIZE = 20

# shell protocol v2 packet ids
ID_STDIN, ID_STDOUT, ID_STDERR, ID_EXIT, ID_CLOSE_STDIN, ID_WINSIZE = 0, 1, 2, 3, 4, 5

SYNC_DATA_MAX = 64 * 1024
SHELL_UID = 2000

# only what we implement: no sendrecv_v2 (SND2/RCV2), no delayed_ack (different flow control)
FEATURES = "shell_v2,cmd,stat_v2,ls_v2,fixed_push_mkdir"


def log(msg: str) -> None:
    sys.stderr.write(f"adbd_emu[{os.getpid()}]: {msg}\n")
    sys.stderr.flush()

# ---------------------------------------------------------------------------------------------
# Android RSA public keys (adbkey.pub): base64 of struct RSAPublicKey + " user@host"


def android_pubkey_decode(text: str | bytes):
    """-> (n, e) from an adbkey.pub line (or its base64 blob)."""
    if isinstance(text, bytes):
        text = text.decode("ascii", "replace")
    blob = base64.b64decode(text.strip().split()[0])
    words, _n0inv = struct.unpack_from("<II", blob, 0)
    if words <= 0 or len(blob) < 8 + words * 8 + 4:
        raise ValueError("bad android public key")
    n = int.from_bytes(blob[8:8 + words * 4], "little")
    (e,) = struct.unpack_from("<I", blob, 8 + words * 8)
    return n, e


def android_pubkey_encode(n: int, e: int, comment: str = "edgetune@farm") -> str:
    """(n, e) -> one adbkey.pub line (what adb writes next to ~/.android/adbkey)."""
    nbytes = (n.bit_length() + 7) // 8
    words = (nbytes + 3) // 4
    n0inv = (-pow(n, -1, 1 << 32)) % (1 << 32)
    rr = pow(1 << (words * 32), 2, n)
    blob = struct.pack("<II", words, n0inv) + n.to_bytes(words * 4, "little")
    blob += rr.to_bytes(words * 4, "little") + struct.pack("<I", e)
    return base64.b64encode(blob).decode() + " " + comment


def verify_token(n: int, e: int, token: bytes, sig: bytes) -> bool:
    """adb signs the 20-byte token as if it were a SHA-1 digest (RSA_sign(NID_sha1, ...))."""
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import padding, rsa, utils

    key = rsa.RSAPublicNumbers(e, n).public_key()
    try:
        key.verify(sig, token, padding.PKCS1v15(), utils.Prehashed(hashes.SHA1()))
        return True
    except (InvalidSignature, ValueError):
        return False


def load_authorized(path: str | None) -> list[tuple[int, int]]:
    keys = []
    if not path or not os.path.exists(path):
        return keys
    with open(path, "r", encoding="ascii", errors="replace") as f:
        for line in f:
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            try:
                keys.append(android_pubkey_decode(line))
            except (ValueError, struct.error, base64.binascii.Error) as exc:
                log(f"ignoring bad key line in {path}: {exc}")
    return keys

# ---------------------------------------------------------------------------------------------
# connection + streams


class StreamClosed(Exception):
    pass


class Stream:
    """One adb stream. ``write`` honours flow control: one WRTE in flight until the host's OKAY."""

    def __init__(self, conn: "Connection", local_id: int, remote_id: int):
        self.conn = conn
        self.local_id = local_id
        self.remote_id = remote_id
        self.inq: "queue.Queue[bytes | None]" = queue.Queue()
        self._can_send = threading.Event()
        self._can_send.set()
        self._send_lock = threading.Lock()
        self.closed = False
        self.on_close = None  # callback, e.g. kill the process

    def write(self, data: bytes) -> None:
        step = self.conn.maxdata
        mv = memoryview(data)
        with self._send_lock:
            for off in range(0, len(data), step):
                self._can_send.wait()
                if self.closed:
                    raise StreamClosed()
                self._can_send.clear()
                self.conn.send(A_WRTE, self.local_id, self.remote_id, bytes(mv[off:off + step]))

    def ack(self) -> None:
        if not self.closed:
            self.conn.send(A_OKAY, self.local_id, self.remote_id)

    def got_okay(self) -> None:
        self._can_send.set()

    def close(self) -> None:
        """We close: tell the host."""
        if self._mark_closed():
            self.conn.send(A_CLSE, self.local_id, self.remote_id)

    def remote_closed(self) -> None:
        self._mark_closed()

    def _mark_closed(self) -> bool:
        with self.conn.lock:
            if self.closed:
                return False
            self.closed = True
            self.conn.streams.pop(self.local_id, None)
        self._can_send.set()
        self.inq.put(None)
        cb = self.on_close
        if cb:
            try:
                cb()
            except Exception:  # noqa: BLE001 - never let a cleanup kill the connection
                log(traceback.format_exc())
        return True


class InReader:
    """Byte-stream view of the host->device data of a stream; ACKs each packet as it is taken."""

    def __init__(self, stream: Stream):
        self.stream = stream
        self.buf = bytearray()

    def _fill(self) -> bool:
        chunk = self.stream.inq.get()
        if chunk is None:
            return False
        self.buf += chunk
        self.stream.ack()
        return True

    def read_exact(self, n: int) -> bytes:
        while len(self.buf) < n:
            if not self._fill():
                raise EOFError()
        out = bytes(self.buf[:n])
        del self.buf[:n]
        return out


class Connection:
    def __init__(self, emu: "Emulator", sock: socket.socket, peer):
        self.emu = emu
        self.sock = sock
        self.peer = peer
        self.wlock = threading.Lock()
        self.lock = threading.Lock()
        self.streams: dict[int, Stream] = {}
        self.next_id = 1
        self.version = A_VERSION
        self.maxdata = MAX_PAYLOAD
        self.authorized = not emu.require_auth
        self.online = False
        self.token: bytes | None = None
        self.dead = False

    def send(self, cmd: int, a0: int, a1: int, data: bytes = b"") -> None:
        check = 0 if self.version >= A_VERSION_SKIP_CHECKSUM else sum(data) & 0xFFFFFFFF
        hdr = struct.pack("<6I", cmd, a0, a1, len(data), check, cmd ^ 0xFFFFFFFF)
        with self.wlock:
            if self.dead:
                raise StreamClosed()
            try:
                self.sock.sendall(hdr + data)
            except OSError:
                self.dead = True
                raise StreamClosed()

    def _recv_exact(self, n: int) -> bytes:
        buf = bytearray()
        while len(buf) < n:
            chunk = self.sock.recv(n - len(buf))
            if not chunk:
                raise EOFError()
            buf += chunk
        return bytes(buf)

    def serve(self) -> None:
        try:
            while True:
                hdr = self._recv_exact(24)
                cmd, a0, a1, n, _check_sum, magic = struct.unpack("<6I", hdr)
                if magic != cmd ^ 0xFFFFFFFF:
                    log(f"bad magic from {self.peer}; dropping connection")
                    return
                if n > max(self.maxdata, MAX_PAYLOAD):
                    log(f"oversized packet ({n}) from {self.peer}; dropping connection")
                    return
                data = self._recv_exact(n) if n else b""
                self.dispatch(cmd, a0, a1, data)
        except (EOFError, OSError, StreamClosed):
            pass
        finally:
            self.shutdown()
            self.emu.conns.discard(self)

    def shutdown(self) -> None:
        with self.wlock:
            self.dead = True
        for s in list(self.streams.values()):
            s.remote_closed()
        try:
            self.sock.close()
        except OSError:
            pass

    # -- handshake
    def send_cnxn(self) -> None:
        self.online = True
        self.send(A_CNXN, self.version, self.maxdata, self.emu.banner())

    def send_token(self) -> None:
        self.token = secrets.token_bytes(TOKEN_SIZE)
        self.send(A_AUTH, ADB_AUTH_TOKEN, 0, self.token)

    def dispatch(self, cmd: int, a0: int, a1: int, data: bytes) -> None:
        if cmd == A_CNXN:
            if self.online:  # host restarted the session: drop everything
                for s in list(self.streams.values()):
                    s.remote_closed()
            self.version = max(A_VERSION_MIN, min(a0, A_VERSION))
            self.maxdata = max(4096, min(a1, MAX_PAYLOAD))
            if self.authorized:
                self.send_cnxn()
            else:
                self.send_token()
        elif cmd == A_AUTH:
            if self.authorized:
                return
            if a0 == ADB_AUTH_SIGNATURE and self.token:
                token, self.token = self.token, None
                if any(verify_token(n, e, token, data) for n, e in self.emu.trusted_keys()):
                    log(f"{self.peer}: signature verified, authorized")
                    self.authorized = True
                    self.send_cnxn()
                else:
                    self.send_token()  # let the host try its next key
            elif a0 == ADB_AUTH_RSAPUBLICKEY:
                try:
                    key = android_pubkey_decode(data.rstrip(b"\0"))
                except (ValueError, struct.error, base64.binascii.Error):
                    key = None
                if key is not None and key in self.emu.trusted_keys():
                    log(f"{self.peer}: public key is authorized")
                    self.authorized = True
                    self.send_cnxn()
                else:
                    # a real phone would pop up "Allow USB debugging?"; nobody says yes here
                    log(f"{self.peer}: unknown public key, staying unauthorized")
        elif not self.online:
            return
        elif cmd == A_OPEN:
            service = data.rstrip(b"\0").decode("utf-8", "surrogateescape")
            with self.lock:
                local_id = self.next_id
                self.next_id += 1
                stream = Stream(self, local_id, a0)
                self.streams[local_id] = stream
            threading.Thread(target=self.emu.serve_service, args=(stream, service),
                             name=f"svc-{local_id}", daemon=True).start()
        elif cmd == A_OKAY:
            s = self.streams.get(a1)
            if s:
                s.got_okay()
        elif cmd == A_WRTE:
            s = self.streams.get(a1)
            if s:
                s.inq.put(data)
            else:
                self.send(A_CLSE, 0, a0)
        elif cmd == A_CLSE:
            s = self.streams.get(a1)
            if s:
                s.remote_closed()
        # A_SYNC / A_STLS: ignored (no TLS)


