#!/usr/bin/env python3
"""adbd emulator: a "phone" that speaks the real adb device-side wire protocol on 127.0.0.1.

The real adb server (``adb connect 127.0.0.1:PORT``) talks to it exactly as to a phone over
TCP/IP: CNXN with version/maxdata negotiation and a device banner, AUTH with real RSA checking,
OPEN/OKAY/WRTE/CLSE with per-stream flow control (one WRTE in flight until OKAY), and the
services ``shell:`` (v1), ``shell,v2,...:`` (packet protocol with exit codes), ``exec:`` and
``sync:`` (STAT/STA2/LST2/LIST/LIS2/SEND/RECV/QUIT).

The phone's filesystem
----------------------
``--sandbox DIR`` *is* the phone's ``/``. Every shell command runs chrooted into DIR
(``/system/bin/sh -c CMD``, cwd ``/``, its own session), so absolute device paths such as
``/data/local/tmp/edgetune/x`` are ``DIR/data/local/tmp/edgetune/x`` on the host, and binaries
pushed there are executable there. The emulator fills DIR with:

* ``/system/bin``: copies of a few host tools (sh = dash, coreutils, ...), ``getprop`` (reads
  ``/system/build.prop``) and ``which``; PATH is ``/system/bin:/system/xbin:/vendor/bin``.
  There is no Python anywhere in DIR, as on a real phone.
* ``/lib``, ``/lib64``: the host's glibc and the shared libraries those tools need (plus libm,
  libstdc++, libgcc_s ...) so that dynamically linked native programs pushed to the phone run.
* ``/data/local/tmp`` (owned by the shell user), ``/sdcard``, ``/dev/{null,zero,...}``, and
  ``/proc`` + ``/sys`` bind-mounted from the host (so cpuinfo, nproc, cpufreq are readable).

Privileges: the emulator enters its own mount namespace at start (as root: a plain
``unshare(CLONE_NEWNS)``; otherwise a user namespace mapping the caller to root), so the bind
mounts are private to it and vanish with it. As real root, shell commands and sync file access
run as uid/gid 2000 ("shell"), like adbd on a user build. If namespaces are unavailable but we are
root, it still chroots (``/dev/null`` is made with mknod, ``/proc`` is then absent).

Sync paths are resolved inside DIR with chroot semantics (symlinks are followed relative to DIR).
The sync service itself runs as the emulator's user; files and directories it creates are given
to the shell user, and it refuses to write where the shell user could not (e.g. /system).

CLI::

    python tools/farm/adbd_emu.py --port P --sandbox DIR --authorized-keys FILE \
        [--serial NAME] [--model M] [--no-auth]

prints ``READY <port>`` on stdout once it listens (``--port 0`` picks a free port), and stops
cleanly on SIGTERM/SIGINT (every command it started is killed, mounts go with the namespace).
"""

from __future__ import annotations

import argparse
import base64
import ctypes
import errno
import fcntl
import os
import pty
import queue
import secrets
import selectors
import shutil
import signal
import socket
import stat
import struct
import subprocess
import sys
import termios
import threading
import traceback

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

TOOLS = [
    "sh", "ls", "cat", "mkdir", "rm", "rmdir", "chmod", "chown", "sha256sum", "md5sum", "uname",
    "mv", "cp", "ln", "test", "[", "echo", "printf", "stat", "head", "tail", "kill", "sleep",
    "timeout", "nproc", "true", "false", "touch", "wc", "id", "env", "date", "dd", "df", "du",
    "tr", "cut", "sort", "uniq", "grep", "sed", "tee", "xargs", "find", "readlink", "realpath",
    "basename", "dirname", "pwd", "seq", "od", "cmp", "sync", "ps", "getconf", "yes", "mktemp", "tty",
]
EXTRA_LIBS = ["libm.so.6", "libstdc++.so.6", "libgcc_s.so.1", "libdl.so.2", "libpthread.so.0",
              "librt.so.1", "libresolv.so.2"]
DEV_NODES = {"null": (1, 3), "zero": (1, 5), "full": (1, 7), "random": (1, 8), "urandom": (1, 9)}


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
# namespaces / sandbox

_libc = ctypes.CDLL(None, use_errno=True)
CLONE_NEWNS = 0x00020000
CLONE_NEWUSER = 0x10000000
MS_RDONLY, MS_NOSUID, MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 1, 2, 32, 4096, 16384, 1 << 18


def _check(rc: int, what: str) -> None:
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _mount(src: str | None, dst: str, fstype: str | None, flags: int) -> None:
    _check(_libc.mount(src.encode() if src else None, dst.encode(),
                       fstype.encode() if fstype else None, ctypes.c_ulong(flags), None), f"mount {dst}")


class Sandbox:
    """The phone's root filesystem (see module doc)."""

    def __init__(self, root: str, props: dict[str, str]):
        self.root = os.path.realpath(root)
        self.props = props
        self.mountns = False
        self.userns = False
        self.shell_uid = 0

    # -- set-up, called before any thread starts (unshare(CLONE_NEWUSER) needs one thread)
    def setup(self) -> None:
        os.makedirs(self.root, exist_ok=True)
        self._enter_namespace()
        self.shell_uid = SHELL_UID if (os.geteuid() == 0 and not self.userns) else 0
        r = self.root
        for d in ("system/bin", "system/xbin", "system/etc", "vendor/bin", "data/local/tmp",
                  "sdcard", "dev", "proc", "sys", "mnt", "storage", "etc"):
            os.makedirs(os.path.join(r, d), exist_ok=True)
        os.chmod(os.path.join(r, "data/local/tmp"), 0o771)
        for d in ("data/local/tmp", "sdcard"):
            self._own(os.path.join(r, d))
        self._install_tools()
        self._write_props()
        self._setup_dev_proc()

    def _enter_namespace(self) -> None:
        try:
            if os.geteuid() == 0:
                _check(_libc.unshare(CLONE_NEWNS), "unshare(CLONE_NEWNS)")
            else:
                uid, gid = os.geteuid(), os.getegid()
                _check(_libc.unshare(CLONE_NEWUSER | CLONE_NEWNS), "unshare(CLONE_NEWUSER|CLONE_NEWNS)")
                self.userns = True
                with open("/proc/self/setgroups", "w") as f:
                    f.write("deny")
                with open("/proc/self/uid_map", "w") as f:
                    f.write(f"0 {uid} 1")
                with open("/proc/self/gid_map", "w") as f:
                    f.write(f"0 {gid} 1")
            _mount(None, "/", None, MS_REC | MS_PRIVATE)
            self.mountns = True
        except OSError as exc:
            if os.geteuid() != 0:
                raise SystemExit(f"adbd_emu: cannot sandbox the phone: {exc} "
                                 "(need root or unprivileged user namespaces)")
            log(f"no private mount namespace ({exc}); /proc and /sys will be missing on the phone")

    def _own(self, path: str) -> None:
        if self.shell_uid:
            os.chown(path, self.shell_uid, self.shell_uid)

    def own(self, path: str, follow: bool = True) -> None:
        """Files the sync service creates belong to the shell user, as on a phone."""
        if self.shell_uid:
            os.chown(path, self.shell_uid, self.shell_uid, follow_symlinks=follow)

    def shell_may_write(self, host_dir: str) -> bool:
        """The sync service runs as root here; refuse what the shell user could not write."""
        if not self.shell_uid:
            return True
        st = os.stat(host_dir)
        if st.st_uid == self.shell_uid:
            return bool(st.st_mode & stat.S_IWUSR)
        if st.st_gid == self.shell_uid:
            return bool(st.st_mode & stat.S_IWGRP)
        return bool(st.st_mode & stat.S_IWOTH)

    def _install_tools(self) -> None:
        bindir = os.path.join(self.root, "system/bin")
        hostpath = "/usr/bin:/bin:/usr/sbin:/sbin"
        copied = []
        for name in TOOLS:
            src = shutil.which(name, path=hostpath)
            if name == "sh":
                src = shutil.which("dash", path=hostpath) or src
            if not src:
                continue
            dst = os.path.join(bindir, name)
            if not os.path.exists(dst):
                shutil.copy2(os.path.realpath(src), dst)
                os.chmod(dst, 0o755)
            copied.append(dst)
        for name, body in (("getprop", GETPROP), ("which", WHICH)):
            dst = os.path.join(bindir, name)
            with open(dst, "w") as f:
                f.write(body)
            os.chmod(dst, 0o755)
        self._install_libs(copied)

    def _install_libs(self, binaries: list[str]) -> None:
        out = subprocess.run(["ldd", *binaries], capture_output=True, text=True).stdout
        libs = set()
        for line in out.splitlines():
            line = line.strip()
            if line.endswith(":"):  # "FILE:" header when ldd is given several files
                continue
            if "=>" in line:
                path = line.split("=>", 1)[1].strip().split(" (")[0].strip()
            else:
                path = line.split(" (")[0].strip()
            if path.startswith("/"):
                libs.add(path)
        libdirs = {os.path.dirname(p) for p in libs if "libc.so" in p}
        for name in EXTRA_LIBS:
            for d in libdirs:
                if os.path.exists(os.path.join(d, name)):
                    libs.add(os.path.join(d, name))
        for path in sorted(libs):
            dst = os.path.join(self.root, path.lstrip("/"))
            if os.path.exists(dst):
                continue
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            shutil.copy2(os.path.realpath(path), dst)

    def _write_props(self) -> None:
        with open(os.path.join(self.root, "system/build.prop"), "w") as f:
            for k, v in self.props.items():
                f.write(f"{k}={v}\n")
        with open(os.path.join(self.root, "etc/hostname"), "w") as f:
            f.write(self.props.get("ro.serialno", "emu") + "\n")

    def _setup_dev_proc(self) -> None:
        dev = os.path.join(self.root, "dev")
        for name, (major, minor) in DEV_NODES.items():
            dst = os.path.join(dev, name)
            if self.mountns and os.path.exists(f"/dev/{name}"):
                if not os.path.exists(dst):
                    open(dst, "w").close()
                try:
                    _mount(f"/dev/{name}", dst, None, MS_BIND)
                    continue
                except OSError as exc:
                    log(f"bind /dev/{name}: {exc}")
            if not os.path.exists(dst) or not stat.S_ISCHR(os.stat(dst).st_mode):
                try:
                    if os.path.exists(dst):
                        os.unlink(dst)
                    os.mknod(dst, 0o666 | stat.S_IFCHR, os.makedev(major, minor))
                except OSError as exc:
                    log(f"mknod /dev/{name}: {exc}")
        if self.mountns:
            for name in ("proc", "sys"):
                try:
                    _mount(f"/{name}", os.path.join(self.root, name), None, MS_BIND | MS_REC)
                except OSError as exc:
                    log(f"bind /{name}: {exc}")

    # -- per command
    def preexec(self, pty_slave: bool = False):
        root, uid = self.root, self.shell_uid

        def _fn():  # runs in the child between fork and exec: syscalls only
            os.chroot(root)
            os.chdir("/")
            if pty_slave:
                fcntl.ioctl(0, termios.TIOCSCTTY, 0)
            if uid:
                os.setgroups([])
                os.setgid(uid)
                os.setuid(uid)

        return _fn

    def env(self) -> dict[str, str]:
        return {
            "PATH": "/system/bin:/system/xbin:/vendor/bin",
            "HOME": "/",
            "TMPDIR": "/data/local/tmp",
            "ANDROID_DATA": "/data",
            "ANDROID_ROOT": "/system",
            "SHELL": "/system/bin/sh",
            "USER": "shell" if self.shell_uid else "root",
            "LOGNAME": "shell" if self.shell_uid else "root",
            "HOSTNAME": self.props.get("ro.serialno", "emu"),
            "TERM": "dumb",
            "LANG": "C.UTF-8",
        }

    def resolve(self, devpath: str, follow_last: bool = True) -> str:
        """Device path -> host path, with chroot semantics (symlinks stay inside the sandbox)."""
        parts = [p for p in devpath.split("/") if p and p != "."]
        cur: list[str] = []
        hops = 0
        while parts:
            p = parts.pop(0)
            if p == "..":
                if cur:
                    cur.pop()
                continue
            host = os.path.join(self.root, *cur, p)
            if (parts or follow_last) and os.path.islink(host):
                hops += 1
                if hops > 40:
                    raise OSError(errno.ELOOP, os.strerror(errno.ELOOP))
                target = os.readlink(host)
                if target.startswith("/"):
                    cur = []
                parts = [x for x in target.split("/") if x and x != "."] + parts
                continue
            cur.append(p)
        return os.path.join(self.root, *cur)


GETPROP = r"""#!/system/bin/sh
# getprop [NAME [DEFAULT]]: Android's property lookup, from /system/build.prop
F=/system/build.prop
if [ $# -eq 0 ]; then
  while IFS='=' read -r k v; do [ -n "$k" ] && printf '[%s]: [%s]\n' "$k" "$v"; done < "$F"
  exit 0
fi
while IFS='=' read -r k v; do
  if [ "$k" = "$1" ]; then printf '%s\n' "$v"; exit 0; fi
done < "$F"
printf '%s\n' "${2-}"
"""

WHICH = r"""#!/system/bin/sh
rc=0
for a in "$@"; do
  p=$(command -v -- "$a") && case "$p" in /*) printf '%s\n' "$p";; *) rc=1;; esac || rc=1
done
exit $rc
"""


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


# ---------------------------------------------------------------------------------------------
# services


class Emulator:
    def __init__(self, args):
        self.args = args
        self.require_auth = not args.no_auth
        self.serial = args.serial
        props = {
            "ro.serialno": args.serial,
            "ro.product.name": args.product,
            "ro.product.model": args.model,
            "ro.product.device": args.device,
            "ro.product.manufacturer": "edgetune",
            "ro.product.brand": "edgetune",
            "ro.product.cpu.abi": _abi(),
            "ro.product.cpu.abilist": _abi(),
            "ro.hardware": "emu",
            "ro.board.platform": "emu",
            "ro.soc.manufacturer": "edgetune",
            "ro.soc.model": "adbd-emu",
            "ro.build.version.release": "14",
            "ro.build.version.sdk": "34",
            "ro.build.type": "user",
            "ro.build.fingerprint": f"edgetune/{args.product}/{args.device}:14/EMU.1/1:user/release-keys",
            "ro.debuggable": "0",
            "ro.secure": "1",
        }
        self.sandbox = Sandbox(args.sandbox, props)
        self._keys_mtime = None
        self._keys: list[tuple[int, int]] = []
        self.procs: set[subprocess.Popen] = set()
        self.procs_lock = threading.Lock()
        self.conns: set[Connection] = set()

    def trusted_keys(self) -> list[tuple[int, int]]:
        path = self.args.authorized_keys
        try:
            mtime = os.stat(path).st_mtime_ns if path else None
        except OSError:
            mtime = None
        if mtime != self._keys_mtime:  # re-read on change, like adb_keys after "Always allow"
            self._keys = load_authorized(path)
            self._keys_mtime = mtime
        return self._keys

    def banner(self) -> bytes:
        a = self.args
        return (f"device::ro.product.name={a.product};ro.product.model={a.model};"
                f"ro.product.device={a.device};features={FEATURES}").encode()

    def serve_service(self, stream: Stream, service: str) -> None:
        try:
            if service.startswith("shell"):
                head, sep, cmd = service.partition(":")
                if not sep:
                    raise ValueError("bad shell service")
                opts = head.split(",")[1:]
                v2 = "v2" in opts
                use_pty = "pty" in opts or ("raw" not in opts and cmd == "")
                term = next((o[5:] for o in opts if o.startswith("TERM=")), None)
                self.serve_shell(stream, cmd, v2=v2, use_pty=use_pty, term=term)
            elif service.startswith("exec:"):
                self.serve_shell(stream, service[5:], v2=False, use_pty=False, exec_mode=True)
            elif service.startswith("sync:"):
                self.serve_sync(stream)
            else:
                stream.close()  # unknown service: refuse the OPEN
        except StreamClosed:
            pass
        except Exception:  # noqa: BLE001
            log(f"service {service[:60]!r} failed:\n{traceback.format_exc()}")
            stream.close()

    # -- shell
    def _spawn(self, cmd: str, use_pty: bool, merge: bool, term: str | None = None):
        sb = self.sandbox
        env = sb.env()
        if term and use_pty:
            env["TERM"] = term
        argv = ["/system/bin/sh", "-c", cmd] if cmd else ["/system/bin/sh"]
        argv = [a.encode("utf-8", "surrogateescape") for a in argv]
        if use_pty:
            master, slave = pty.openpty()
            try:
                proc = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave, env=env,
                                        start_new_session=True, preexec_fn=sb.preexec(True))
            finally:
                os.close(slave)
            return proc, master
        proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT if merge else subprocess.PIPE,
                                env=env, start_new_session=True, preexec_fn=sb.preexec(False))
        return proc, None

    def _kill(self, proc: subprocess.Popen) -> None:
        with self.procs_lock:
            alive = proc in self.procs and proc.poll() is None
            if alive:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except OSError:
                    pass

    def serve_shell(self, stream: Stream, cmd: str, v2: bool, use_pty: bool, exec_mode: bool = False,
                    term: str | None = None) -> None:
        try:
            proc, master = self._spawn(cmd, use_pty, merge=not v2, term=term)
        except OSError as exc:
            log(f"cannot start shell: {exc}")
            stream.close()
            return
        with self.procs_lock:
            self.procs.add(proc)
        stream.on_close = lambda: self._kill(proc)
        stream.conn.send(A_OKAY, stream.local_id, stream.remote_id)

        def packet(pid: int, data: bytes) -> bytes:
            return struct.pack("<BI", pid, len(data)) + data

        stdin_fd = master if master is not None else proc.stdin.fileno()
        outs = [(master, ID_STDOUT)] if master is not None else [(proc.stdout.fileno(), ID_STDOUT)]
        if v2 and master is None:
            outs.append((proc.stderr.fileno(), ID_STDERR))
        chunk = min(SYNC_DATA_MAX, stream.conn.maxdata - (5 if v2 else 0))

        def pump(fd: int, pid: int) -> None:
            try:
                while True:
                    try:
                        data = os.read(fd, chunk)
                    except OSError:  # EIO on a pty master once the child is gone
                        data = b""
                    if not data:
                        return
                    stream.write(packet(pid, data) if v2 else data)
            except StreamClosed:
                self._kill(proc)

        def feed() -> None:
            buf = bytearray()
            stdin_open = True

            def close_stdin():
                nonlocal stdin_open
                if stdin_open and master is None:
                    stdin_open = False
                    try:
                        proc.stdin.close()
                    except OSError:
                        pass

            def put(data: bytes) -> None:
                if not stdin_open:
                    return
                try:
                    _write_all(stdin_fd, data)
                except OSError:
                    close_stdin()

            while True:
                item = stream.inq.get()
                if item is None:
                    close_stdin()
                    return
                if v2:
                    buf += item
                    while len(buf) >= 5:
                        pid, n = struct.unpack_from("<BI", buf, 0)
                        if len(buf) < 5 + n:
                            break
                        data = bytes(buf[5:5 + n])
                        del buf[:5 + n]
                        if pid == ID_STDIN:
                            put(data)
                        elif pid == ID_CLOSE_STDIN:
                            close_stdin()
                        # ID_WINSIZE and unknown ids: ignored
                else:
                    put(item)
                stream.ack()

        threads = [threading.Thread(target=pump, args=o, daemon=True) for o in outs]
        feeder = threading.Thread(target=feed, daemon=True)
        for t in threads:
            t.start()
        feeder.start()
        for t in threads:
            t.join()
        rc = proc.wait()
        with self.procs_lock:
            self.procs.discard(proc)
        for f in (proc.stdout, proc.stderr):
            if f:
                f.close()
        code = rc if rc >= 0 else 128 - rc
        try:
            if v2:
                stream.write(packet(ID_EXIT, bytes([code & 0xFF])))
        except StreamClosed:
            pass
        stream.close()
        # the feeder writes to stdin_fd by number: only close it once the feeder is done with it
        feeder.join(timeout=10)
        if feeder.is_alive():
            log("stdin feeder stuck; leaking its descriptor rather than risking a reused fd")
            return
        if master is not None:
            os.close(master)
        if proc.stdin:
            try:
                proc.stdin.close()
            except OSError:
                pass

    # -- sync
    def serve_sync(self, stream: Stream) -> None:
        sb = self.sandbox
        stream.conn.send(A_OKAY, stream.local_id, stream.remote_id)
        rd = InReader(stream)
        out = bytearray()

        def flush() -> None:
            if out:
                stream.write(bytes(out))
                out.clear()

        def fail(msg: str) -> None:
            m = msg.encode("utf-8", "replace")
            out.extend(b"FAIL" + struct.pack("<I", len(m)) + m)
            flush()

        try:
            while True:
                req = rd.read_exact(8)
                rid, n = req[:4], struct.unpack("<I", req[4:])[0]
                if rid == b"QUIT":
                    break
                if n > 4096:
                    fail("path too long")
                    break
                path = rd.read_exact(n).decode("utf-8", "surrogateescape")
                if rid == b"STAT":
                    try:
                        st = os.lstat(sb.resolve(path, follow_last=False))
                        out.extend(b"STAT" + struct.pack("<III", st.st_mode & 0xFFFFFFFF,
                                                         st.st_size & 0xFFFFFFFF, int(st.st_mtime)))
                    except OSError:
                        out.extend(b"STAT" + struct.pack("<III", 0, 0, 0))
                    flush()
                elif rid in (b"STA2", b"LST2"):
                    try:
                        st = (os.stat if rid == b"STA2" else os.lstat)(sb.resolve(path, rid == b"STA2"))
                        out.extend(rid + struct.pack("<I", 0) + _stat2(st))
                    except OSError as exc:
                        out.extend(rid + struct.pack("<I", exc.errno or errno.EIO) + bytes(64))
                    flush()
                elif rid in (b"LIST", b"LIS2"):
                    self._sync_list(sb, path, rid == b"LIS2", out)
                    flush()
                elif rid == b"SEND":
                    self._sync_send(sb, path, rd, out, fail)
                    flush()
                elif rid == b"RECV":
                    self._sync_recv(sb, path, stream, out, fail)
                else:
                    fail(f"unknown sync command {rid!r}")
                    break
        except EOFError:
            pass
        stream.close()

    def _sync_list(self, sb: Sandbox, path: str, v2: bool, out: bytearray) -> None:
        try:
            host = sb.resolve(path)
            names = [".", ".."] + os.listdir(host)
        except OSError:
            names, host = [], ""
        for name in names:
            try:
                st = os.lstat(os.path.join(host, name))
            except OSError:
                continue
            nb = name.encode("utf-8", "surrogateescape")
            if v2:
                out.extend(b"DNT2" + struct.pack("<I", 0) + _stat2(st) + struct.pack("<I", len(nb)) + nb)
            else:
                out.extend(b"DENT" + struct.pack("<IIII", st.st_mode & 0xFFFFFFFF, st.st_size & 0xFFFFFFFF,
                                                  int(st.st_mtime), len(nb)) + nb)
        out.extend(b"DONE" + (bytes(72) if v2 else bytes(16)))

    def _sync_send(self, sb: Sandbox, spec: str, rd: InReader, out: bytearray, fail) -> None:
        path, comma, mode_s = spec.rpartition(",")
        if not comma:
            path, mode_s = spec, str(0o100644)
        try:
            mode = int(mode_s)
        except ValueError:
            mode = 0o100644
        err = None
        f = None
        host = None
        link_target = bytearray()
        is_link = stat.S_ISLNK(mode)
        try:
            host = sb.resolve(path, follow_last=False)
            parent = os.path.dirname(host)
            if not os.path.isdir(parent):
                _makedirs(sb, parent)
            if not sb.shell_may_write(parent):
                raise PermissionError(errno.EACCES, os.strerror(errno.EACCES))
            if not is_link:
                if os.path.lexists(host) and os.path.isdir(host):
                    raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR))
                f = open(host + ".adbd_emu.part", "wb")
        except OSError as exc:
            err = f"couldn't create file: {exc.strerror or exc}"
        mtime = None
        while True:
            hdr = rd.read_exact(8)
            cid, n = hdr[:4], struct.unpack("<I", hdr[4:])[0]
            if cid == b"DATA":
                if n > SYNC_DATA_MAX:
                    err = err or "data chunk too large"
                data = rd.read_exact(n)
                if f is not None and err is None:
                    try:
                        f.write(data)
                    except OSError as exc:
                        err = f"write failed: {exc.strerror or exc}"
                elif is_link:
                    link_target += data
            elif cid == b"DONE":
                mtime = n
                break
            else:
                err = f"invalid data message {cid!r}"
                break
        if f is not None:
            f.close()
        if err is None:
            try:
                if is_link:
                    if os.path.lexists(host):
                        os.unlink(host)
                    os.symlink(bytes(link_target).rstrip(b"\0").decode("utf-8", "surrogateescape"), host)
                    sb.own(host, follow=False)
                else:
                    sb.own(host + ".adbd_emu.part")
                    os.chmod(host + ".adbd_emu.part", mode & 0o7777 or 0o644)
                    os.replace(host + ".adbd_emu.part", host)
                    if mtime:
                        os.utime(host, (mtime, mtime))
            except OSError as exc:
                err = f"couldn't finish file: {exc.strerror or exc}"
        elif f is not None:
            try:
                os.unlink(host + ".adbd_emu.part")
            except OSError:
                pass
        if err is None:
            out.extend(b"OKAY" + bytes(4))
        else:
            fail(err)

    def _sync_recv(self, sb: Sandbox, path: str, stream: Stream, out: bytearray, fail) -> None:
        try:
            f = open(sb.resolve(path), "rb")
        except OSError as exc:
            fail(f"remote object '{path}' does not exist" if exc.errno == errno.ENOENT
                 else f"{exc.strerror or exc}")
            return
        with f:
            limit = min(SYNC_DATA_MAX, stream.conn.maxdata - 8)
            while True:
                try:
                    data = f.read(limit)
                except OSError as exc:
                    fail(f"read failed: {exc.strerror or exc}")
                    return
                if not data:
                    break
                stream.write(b"DATA" + struct.pack("<I", len(data)) + data)
        stream.write(b"DONE" + bytes(4))

    # -- lifecycle
    def kill_all(self) -> None:
        with self.procs_lock:
            procs = list(self.procs)
        for p in procs:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except OSError:
                pass
        for p in procs:
            try:
                p.wait(timeout=2)
            except subprocess.TimeoutExpired:
                pass


def _write_all(fd: int, data: bytes) -> None:
    mv = memoryview(data)
    while mv:
        n = os.write(fd, mv)
        mv = mv[n:]


def _makedirs(sb: Sandbox, host_dir: str) -> None:
    """mkdir -p inside the sandbox (fixed_push_mkdir), as the shell user would."""
    if os.path.isdir(host_dir) or host_dir == sb.root:
        return
    parent = os.path.dirname(host_dir)
    _makedirs(sb, parent)
    if not sb.shell_may_write(parent):
        raise PermissionError(errno.EACCES, f"{os.strerror(errno.EACCES)}")
    try:
        os.mkdir(host_dir, 0o775)
        sb.own(host_dir)
    except FileExistsError:
        pass


def _stat2(st: os.stat_result) -> bytes:
    # dev, ino, mode, nlink, uid, gid, size, atime, mtime, ctime (struct sync_stat_v2 minus id/error)
    return struct.pack("<QQIIIIQqqq", st.st_dev, st.st_ino, st.st_mode & 0xFFFFFFFF, st.st_nlink,
                       st.st_uid, st.st_gid, st.st_size, int(st.st_atime), int(st.st_mtime), int(st.st_ctime))


def _abi() -> str:
    m = os.uname().machine
    return {"x86_64": "x86_64", "aarch64": "arm64-v8a", "armv7l": "armeabi-v7a", "i686": "x86"}.get(m, m)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="adbd protocol emulator (a phone on 127.0.0.1)")
    ap.add_argument("--port", type=int, required=True, help="TCP port on 127.0.0.1 (0: pick a free one)")
    ap.add_argument("--sandbox", required=True, help="host directory that is the phone's /")
    ap.add_argument("--authorized-keys", default=None, help="adb public keys this phone trusts (adbkey.pub lines)")
    ap.add_argument("--serial", default="emu0")
    ap.add_argument("--model", default="EdgetunePhone")
    ap.add_argument("--product", default="edgetune_emu")
    ap.add_argument("--device", default="emu")
    ap.add_argument("--no-auth", action="store_true", help="accept any host without AUTH")
    args = ap.parse_args(argv)
    if not args.no_auth and not args.authorized_keys:
        ap.error("--authorized-keys is required unless --no-auth")

    emu = Emulator(args)
    emu.sandbox.setup()  # before any thread: may unshare a user namespace

    # The kernel may hand SIGTERM to any thread, and only the main thread runs Python handlers: a main
    # thread parked in accept() would then never wake. The C-level handler always writes the signal
    # number to the wakeup fd, so the main thread waits on that fd and the listening socket together.
    wake_r, wake_w = socket.socketpair()
    wake_r.setblocking(False)
    wake_w.setblocking(False)
    signal.set_wakeup_fd(wake_w.fileno(), warn_on_full_buffer=False)
    stop = threading.Event()

    def _on_signal(signum, _frame):
        stop.set()

    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)

    lsock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    lsock.bind(("127.0.0.1", args.port))
    lsock.listen(16)
    port = lsock.getsockname()[1]
    log(f"serial={args.serial} sandbox={emu.sandbox.root} auth={'on' if emu.require_auth else 'off'} "
        f"mountns={emu.sandbox.mountns} shell_uid={emu.sandbox.shell_uid}")
    print(f"READY {port}", flush=True)
    lsock.setblocking(False)
    sel = selectors.DefaultSelector()
    sel.register(lsock, selectors.EVENT_READ)
    sel.register(wake_r, selectors.EVENT_READ)
    try:
        while not stop.is_set():
            for key, _ in sel.select():
                if key.fileobj is wake_r:
                    try:
                        wake_r.recv(64)  # drained; the handler (run by now) has set `stop`
                    except BlockingIOError:
                        pass
                    continue
                try:
                    sock, peer = lsock.accept()
                except (BlockingIOError, InterruptedError):
                    continue
                sock.setblocking(True)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                conn = Connection(emu, sock, peer)
                emu.conns.add(conn)
                threading.Thread(target=conn.serve, name=f"conn-{peer[1]}", daemon=True).start()
    finally:
        sel.close()
        signal.set_wakeup_fd(-1)
        lsock.close()
        for c in list(emu.conns):
            try:
                c.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        emu.kill_all()
        log("stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
