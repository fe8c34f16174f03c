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

The wire protocol is in adb_proto.py, the phone's filesystem in adb_sandbox.py.

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
import errno
import os
import pty
import selectors
import signal
import socket
import stat
import struct
import subprocess
import sys
import threading
import traceback

from adb_proto import (A_OKAY, FEATURES, ID_CLOSE_STDIN, ID_EXIT, ID_STDERR, ID_STDIN, ID_STDOUT, SYNC_DATA_MAX,
                       Connection, InReader, Stream, StreamClosed, load_authorized, log)
from adb_sandbox import Sandbox


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
