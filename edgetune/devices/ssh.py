"""The SSH transport: one persistent, strictly host-key-checked paramiko connection per device.

* Host keys are checked against ``known_hosts`` (default ``~/.ssh/known_hosts``): a mismatch is
  refused (``HostKeyMismatch``, never retried); an unknown host is refused too unless
  ``trust_on_first_use`` is set, in which case its key is appended to ``known_hosts``.
* Public-key auth only. Key material and passphrases never appear in messages, logs or repr:
  messages name the key *file* and its public fingerprint.
* One connection, many channels; it is re-opened lazily when it has dropped. ``TCP_NODELAY`` is set
  (with Nagle a command round trip on loopback costs ~48 ms instead of ~2.5 ms).
* Commands: ``argv`` is quoted by ``shell_join`` (the one quoting site) and run as
  ``printf 'edgetune-pid:%s\\n' "$$" && exec ARGV`` by the login shell. sshd makes that shell a
  session leader, so ``$$`` is the command's pid *and* process group; on timeout a second channel
  runs ``kill -9 -- -PGID``, which takes the command and everything it spawned down with it
  (closing the channel alone leaves the remote process running). The pid line is stripped.
* A command killed by a signal gets ``returncode = -signum`` (as ``subprocess`` does); sshd reports
  that as an ``exit-signal`` request, which paramiko ignores, so our Transport subclass reads it.
* ``push``/``pull`` go over SFTP and are atomic: written to ``<dst>.part…`` then renamed. ``push``
  keeps the local file's permission bits (an executable stays executable, as with ``adb push``).
"""

from __future__ import annotations

import getpass
import logging
import os
import secrets
import signal
import socket
import threading
import time
from pathlib import Path
from typing import Sequence

import paramiko
from paramiko.common import cMSG_CHANNEL_REQUEST

from edgetune.devices.base import (DEFAULT_MAX_OUTPUT, MAX_STDERR, Completed, Stream, StreamTimeout, keep_tail,
                                   shell_join)
from edgetune.devices.ssh_keys import encrypted_key_error, key_file_is_encrypted, pkcs8_key
from edgetune.errors import (
    AuthError,
    DeviceError,
    DeviceUnreachable,
    HostKeyMismatch,
)

log = logging.getLogger(__name__)

_PID_TAG = b"edgetune-pid:"
_KILL_GRACE_S = 5.0  # how long the kill command and the killed command's channel may take
_DEFAULT_KEYS = ("id_ed25519", "id_ecdsa", "id_rsa")


class _Transport(paramiko.Transport):
    """paramiko's Transport, plus the ``exit-signal`` channel request (RFC 4254 §6.10).

    paramiko drops it, which leaves a command killed by a signal without any status; we record
    the signal name on the channel as ``edgetune_signal`` and then let paramiko handle the rest.
    """

    _channel_handler_table = dict(paramiko.Transport._channel_handler_table)

    def _handle_channel_request(chan, m):  # noqa: N805 (called as an unbound handler)
        start = m.packet.tell()
        if m.get_text() == "exit-signal":
            m.get_boolean()  # want_reply
            chan.edgetune_signal = m.get_text()
            m.get_boolean()  # core dumped
        m.packet.seek(start)
        paramiko.Channel._handle_request(chan, m)

    _channel_handler_table[ord(cMSG_CHANNEL_REQUEST)] = _handle_channel_request


class SshTransport:
    kind = "ssh"

    def __init__(
        self,
        host: str,
        port: int = 22,
        user: str | None = None,
        key_filename: str | os.PathLike | None = None,
        known_hosts: str | os.PathLike | None = None,
        trust_on_first_use: bool = False,
        connect_timeout: float = 10.0,
    ):
        self.host = host
        self.port = int(port)
        self.user = user or getpass.getuser()
        self.key_filename = str(key_filename) if key_filename is not None else None
        self.known_hosts = str(
            known_hosts if known_hosts is not None else Path("~/.ssh/known_hosts").expanduser()
        )
        self.trust_on_first_use = trust_on_first_use
        self.connect_timeout = float(connect_timeout)
        self.address = f"ssh://{self.user}@{host}:{self.port}"
        # the name known_hosts files use for this host (OpenSSH's convention)
        self._known_name = host if self.port == 22 else f"[{host}]:{self.port}"
        self._lock = threading.Lock()
        self._t: paramiko.Transport | None = None
        self._sftp: paramiko.SFTPClient | None = None
        self.connects = 0  # how many connections were opened (1 + reconnects); for tests/benches

    def __repr__(self) -> str:
        return f"SshTransport({self.address})"

    # -- connection ------------------------------------------------------------------------

    def connect(self) -> None:
        """Open the connection now (otherwise the first run/push/pull does)."""
        self._transport()

    def _transport(self) -> paramiko.Transport:
        with self._lock:
            if self._t is not None and self._t.is_active():
                return self._t
            if self._t is not None:
                log.info("%s: connection dropped, reconnecting", self.address)
                self._drop_locked()
            self._t = self._open()
            self.connects += 1
            return self._t

    def _drop(self) -> None:
        with self._lock:
            self._drop_locked()

    def _drop_locked(self) -> None:
        sftp, t = self._sftp, self._t
        self._sftp = self._t = None
        for thing in (sftp, t):
            if thing is not None:
                try:
                    thing.close()
                except Exception:  # noqa: BLE001 - closing a dead connection may fail any way
                    pass

    def _open(self) -> paramiko.Transport:
        pkey = self._load_key()
        sock = self._tcp_connect()
        t = _Transport(sock)
        try:
            t.banner_timeout = t.handshake_timeout = t.auth_timeout = self.connect_timeout
            self._prefer_known_key_types(t)
            try:
                t.start_client(timeout=self.connect_timeout)
            except (paramiko.SSHException, EOFError, OSError) as exc:
                raise DeviceUnreachable(f"{self.address}: SSH handshake failed: {exc}") from None
            # start_client returns quietly when its timeout passes
            if not (t.is_active() and t.initial_kex_done):
                raise DeviceUnreachable(
                    f"{self.address}: SSH handshake timed out after {self.connect_timeout:g} s"
                )
            self._check_host_key(t.get_remote_server_key())
            try:
                t.auth_publickey(self.user, pkey)
            except paramiko.AuthenticationException:
                raise AuthError(
                    f"{self.address}: public key refused for user {self.user!r} "
                    f"(key file {self._key_path()}, {pkey.get_name()} {pkey.fingerprint})"
                ) from None
            except (paramiko.SSHException, EOFError, OSError) as exc:
                raise DeviceUnreachable(f"{self.address}: connection lost during auth: {exc}") from None
            if not t.is_authenticated():
                raise AuthError(f"{self.address}: authentication did not complete")
        except BaseException:
            t.close()
            raise
        log.debug("%s: connected", self.address)
        return t

    def _tcp_connect(self) -> socket.socket:
        try:
            sock = socket.create_connection((self.host, self.port), timeout=self.connect_timeout)
        except ConnectionRefusedError:
            raise DeviceUnreachable(f"{self.address}: connection refused") from None
        except socket.timeout:
            raise DeviceUnreachable(
                f"{self.address}: connection timed out after {self.connect_timeout:g} s"
            ) from None
        except OSError as exc:
            raise DeviceUnreachable(f"{self.address}: {exc.strerror or exc}") from None
        # without it every small request waits for the previous ACK (Nagle + delayed ACK)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        return sock

    def _key_path(self) -> str:
        if self.key_filename is not None:
            return self.key_filename
        for name in _DEFAULT_KEYS:
            path = Path("~/.ssh", name).expanduser()
            if path.exists():
                return str(path)
        raise AuthError(
            f"{self.address}: no private key given and none of ~/.ssh/{{{','.join(_DEFAULT_KEYS)}}} exists"
        )

    def _load_key(self) -> paramiko.PKey:
        path = self._key_path()
        # messages say what is wrong with the *file*, never echo what is in it
        try:
            return paramiko.PKey.from_path(path)
        except paramiko.PasswordRequiredException:
            raise encrypted_key_error(path) from None
        except FileNotFoundError:
            raise AuthError(f"private key file {path} does not exist") from None
        except PermissionError:
            raise AuthError(f"private key file {path} is not readable") from None
        except Exception:  # noqa: BLE001 - parsers raise anything; their text may quote the file
            # paramiko 3+/cryptography raise TypeError (or ValueError) for an encrypted key, with a
            # wording per format: ask the file itself
            if key_file_is_encrypted(path):
                raise encrypted_key_error(path) from None
            key = pkcs8_key(path)
            if key is None:
                raise AuthError(f"private key file {path} is not a usable private key") from None
            return key

    # -- host keys ---------------------------------------------------------------------------

    def _load_known_hosts(self) -> paramiko.HostKeys:
        keys = paramiko.HostKeys()
        if os.path.exists(self.known_hosts):
            try:
                keys.load(self.known_hosts)
            except (OSError, paramiko.SSHException) as exc:
                raise DeviceError(f"cannot read known_hosts {self.known_hosts}: {exc}") from None
        return keys

    def _known_keys(self) -> list[paramiko.PKey]:
        entry = self._load_known_hosts().lookup(self._known_name)
        return list(entry.values()) if entry else []

    def _prefer_known_key_types(self, t: paramiko.Transport) -> None:
        """Ask the server first for a host key type we already know (as OpenSSH does)."""
        known = {k.get_name() for k in self._known_keys()}
        if not known:
            return
        opts = t.get_security_options()
        types = list(opts.key_types)

        def is_known(algo: str) -> bool:
            name = "ssh-rsa" if algo.startswith("rsa-sha2-") else algo
            return name in known

        opts.key_types = [a for a in types if is_known(a)] + [a for a in types if not is_known(a)]

    def _check_host_key(self, key: paramiko.PKey) -> None:
        known = self._known_keys()
        offered = f"{key.get_name()} {key.fingerprint}"
        if any(k.get_name() == key.get_name() and k.asbytes() == key.asbytes() for k in known):
            return
        if known:
            have = ", ".join(f"{k.get_name()} {k.fingerprint}" for k in known)
            raise HostKeyMismatch(
                f"HOST KEY MISMATCH for {self._known_name}: the device offered {offered}, but "
                f"known_hosts {self.known_hosts} has {have}. Refusing to connect (the device may "
                f"have been reinstalled, or someone is intercepting). If you know why it changed: "
                f"ssh-keygen -R '{self._known_name}' -f {self.known_hosts}"
            )
        if not self.trust_on_first_use:
            raise HostKeyMismatch(
                f"host key for {self._known_name} ({offered}) is not in known_hosts "
                f"{self.known_hosts}; add it (ssh-keyscan -p {self.port} {self.host} >> "
                f"{self.known_hosts}) or pass --trust-on-first-use"
            )
        self._append_known_host(key)
        log.warning("%s: trusted on first use: %s, added to %s", self.address, offered, self.known_hosts)

    def _append_known_host(self, key: paramiko.PKey) -> None:
        path = Path(self.known_hosts)
        try:
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            prefix = ""
            if path.exists() and path.stat().st_size:
                with open(path, "rb") as f:
                    f.seek(-1, os.SEEK_END)
                    prefix = "" if f.read(1) == b"\n" else "\n"
            with open(path, "a") as f:
                f.write(f"{prefix}{self._known_name} {key.get_name()} {key.get_base64()}\n")
        except OSError as exc:
            raise DeviceError(f"cannot add the host key to {self.known_hosts}: {exc.strerror or exc}") from None

    # -- commands ----------------------------------------------------------------------------

    def _open_channel(self) -> paramiko.Channel:
        """A session channel; reconnects once if the connection turns out to be dead (nothing
        has been started yet, so that is safe)."""
        for attempt in (0, 1):
            t = self._transport()
            try:
                return t.open_session(timeout=self.connect_timeout)
            except (paramiko.SSHException, EOFError, OSError) as exc:
                if t.is_active() and attempt == 0 and isinstance(exc, paramiko.ChannelException):
                    raise DeviceError(f"{self.address}: server refused a session: {exc}") from None
                self._drop()
                if attempt == 1:
                    raise DeviceUnreachable(f"{self.address}: cannot open a session: {exc}") from None
        raise AssertionError("unreachable")

    def run(self, argv: Sequence[str], timeout: float, stdin: bytes | None = None,
            max_output: int | None = None) -> Completed:
        limit = DEFAULT_MAX_OUTPUT if max_output is None else int(max_output)
        command = "printf 'edgetune-pid:%s\\n' \"$$\" && exec " + shell_join(argv)
        deadline = time.monotonic() + timeout
        chan = self._open_channel()
        try:
            return self._run_on(chan, command, deadline, stdin, limit)
        except (paramiko.SSHException, EOFError, OSError) as exc:
            self._drop()
            raise DeviceUnreachable(f"{self.address}: connection lost during command: {exc}") from None
        finally:
            chan.close()

    def open_stream(self, argv: Sequence[str]) -> Stream:
        chan = self._open_channel()
        try:
            chan.fileno()  # the channel's data and its closing wake select()
            chan.exec_command("printf 'edgetune-pid:%s\\n' \"$$\" && exec " + shell_join(argv))
        except (paramiko.SSHException, EOFError, OSError) as exc:
            chan.close()
            self._drop()
            raise DeviceUnreachable(f"{self.address}: cannot start a command: {exc}") from None
        return _SshStream(self, chan)

    def _run_on(self, chan: paramiko.Channel, command: str, deadline: float,
                stdin: bytes | None, limit: int) -> Completed:
        chan.fileno()  # from now on the channel's data and its closing wake select()
        chan.exec_command(command)
        if stdin:
            # a thread, so a command that writes much before it reads cannot deadlock us
            threading.Thread(target=_feed_stdin, args=(chan, stdin), daemon=True).start()
        else:
            chan.shutdown_write()
        t = chan.get_transport()
        out, err = bytearray(), bytearray()
        pid: int | None = None
        timed_out = overflow = False
        # until stdout/stderr end (EOF) or the deadline
        while True:
            _drain(chan, out, err, limit + 64)  # + the pid line
            if pid is None:
                pid, out = _take_pid(out)
            if pid is not None and len(out) > limit:  # a device cannot make us hold more
                del out[limit:]
                overflow = True
                break
            if chan.eof_received or chan.closed:
                break
            if not t.is_active():
                raise EOFError("transport closed")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                timed_out = True
                break
            _wait_readable(chan, remaining)
        # a command may close its output and keep running: its exit status is due by the deadline
        if not (timed_out or overflow) and not chan.status_event.wait(max(0.0, deadline - time.monotonic())):
            timed_out = True
        if timed_out or overflow:
            self._kill(chan, pid, out, err, limit)
            return Completed(-signal.SIGKILL, bytes(out[:limit]), bytes(err), timed_out=timed_out, overflow=overflow)
        _drain(chan, out, err, limit + 64)
        if chan.exit_status == -1 and getattr(chan, "edgetune_signal", None) is None:
            if not t.is_active():
                raise EOFError("transport closed")
        if pid is None:  # the shell failed before printing it (e.g. it could not even start)
            pid, out = _take_pid(out, final=True)
        if len(out) > limit:
            return Completed(_returncode(chan), bytes(out[:limit]), bytes(err), overflow=True)
        return Completed(_returncode(chan), bytes(out), bytes(err))

    def _kill(self, chan: paramiko.Channel, pid: int | None, out: bytearray, err: bytearray,
              limit: int) -> int | None:
        """Kill the timed-out command's process group through a second channel."""
        grace = time.monotonic() + _KILL_GRACE_S
        while pid is None and time.monotonic() < grace and not (chan.eof_received or chan.closed):
            _wait_readable(chan, grace - time.monotonic())
            _drain(chan, out, err, limit)
            pid, out[:] = _take_pid(out)
        if not pid or pid <= 1:  # never `kill -1`: that is every process we may signal
            log.warning("%s: command timed out before reporting its pid; closing its channel only",
                        self.address)
            return None
        self._kill_group(pid)
        # collect what the command wrote before it died
        while not (chan.eof_received or chan.closed) and time.monotonic() < grace:
            _wait_readable(chan, grace - time.monotonic())
            _drain(chan, out, err, limit)
        _drain(chan, out, err, limit)
        return pid

    def _kill_group(self, pid: int) -> None:
        """SIGKILL to the process group ``pid`` leads (sshd setsid()s each command), through a
        channel of its own; the login shell runs the line (dash's kill has no ``--``: run() would
        hand it to sh)."""
        if pid <= 1:  # never `kill -1`: that is every process we may signal
            return
        kill = f"{shell_join(['kill', '-9', '--', f'-{pid}'])} 2>/dev/null || {shell_join(['kill', '-9', str(pid)])}"
        kchan = self._open_channel()
        try:
            kchan.exec_command(kill)
            kchan.shutdown_write()
            kchan.status_event.wait(_KILL_GRACE_S)
        finally:
            kchan.close()

    # -- files -------------------------------------------------------------------------------

    def _sftp_client(self) -> paramiko.SFTPClient:
        t = self._transport()
        with self._lock:
            if self._sftp is None or self._t is not t:
                self._sftp = paramiko.SFTPClient.from_transport(t)
            return self._sftp

    def _file_op(self, what: str, op):
        """Run an idempotent SFTP operation; retried once on a fresh connection if it dropped."""
        for attempt in (0, 1):
            try:
                return op(self._sftp_client())
            except (EOFError, socket.error, paramiko.SSHException) as exc:
                if isinstance(exc, OSError) and exc.errno is not None and self._t and self._t.is_active():
                    raise DeviceError(f"{what} failed: {exc.strerror or exc}") from None
                self._drop()
                if attempt == 1:
                    raise DeviceUnreachable(f"{what} failed: connection lost: {exc}") from None
        raise AssertionError("unreachable")

    def push(self, local: str, remote: str) -> None:
        local, remote = str(local), str(remote)
        what = f"push {local} -> {self.address}:{remote}"
        try:
            mode = os.stat(local).st_mode & 0o777
        except OSError as exc:
            raise DeviceError(f"{what} failed: {exc.strerror}") from None

        def op(sftp: paramiko.SFTPClient) -> None:
            tmp = f"{remote}.part{secrets.token_hex(4)}"
            try:
                sftp.put(local, tmp, confirm=True)
                sftp.chmod(tmp, mode)
                sftp.posix_rename(tmp, remote)
            except BaseException:
                try:
                    sftp.remove(tmp)
                except Exception:  # noqa: BLE001 - best-effort cleanup
                    pass
                raise

        self._file_op(what, op)

    def pull(self, remote: str, local: str) -> None:
        local, remote = str(local), str(remote)
        what = f"pull {self.address}:{remote} -> {local}"
        tmp = f"{local}.part{os.getpid()}-{secrets.token_hex(4)}"

        def op(sftp: paramiko.SFTPClient) -> None:
            try:
                sftp.get(remote, tmp)
                os.replace(tmp, local)
            finally:
                if os.path.exists(tmp):
                    os.unlink(tmp)

        self._file_op(what, op)

    def close(self) -> None:
        self._drop()


class _SshStream(Stream):
    """A command on its own channel with stdin and stdout open; killed, like a timed-out command,
    through its process group from a second channel (its pid is the wrapper's first line)."""

    def __init__(self, transport: SshTransport, chan: paramiko.Channel):
        super().__init__()
        self._t, self._chan, self._pid = transport, chan, None
        self._head = bytearray()

    def _recv(self, timeout: float) -> bytes:
        deadline = time.monotonic() + timeout
        while True:
            while self._chan.recv_stderr_ready():
                self.stderr_tail += self._chan.recv_stderr(1 << 16)
                keep_tail(self.stderr_tail, MAX_STDERR)
            if self._chan.recv_ready():
                chunk = self._chan.recv(1 << 16)
            elif self._chan.eof_received or self._chan.closed:
                return b""
            else:
                if not self._chan.get_transport().is_active():
                    self._t._drop()
                    raise DeviceUnreachable(f"{self._t.address}: connection lost during a session")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise StreamTimeout()
                _wait_readable(self._chan, left)
                continue
            if self._pid is None:  # the wrapper's pid line comes first
                self._head += chunk
                pid, rest = _take_pid(self._head)
                if pid is None:
                    continue
                self._pid, self._head = pid, bytearray()
                if not rest:
                    continue
                chunk = bytes(rest)
            return chunk

    def _send(self, data: bytes) -> None:
        try:
            self._chan.sendall(data)
        except (OSError, EOFError, paramiko.SSHException):
            self._eof = True  # it is gone: the next read says so

    def _kill(self) -> None:
        try:
            if self._pid:
                self._t._kill_group(self._pid)
        finally:
            self._chan.close()

    def _end(self) -> None:
        try:
            self._chan.shutdown_write()
            self._chan.status_event.wait(5.0)
        finally:
            if not self._chan.status_event.is_set():
                self._kill()
            self._chan.close()


# -- helpers -------------------------------------------------------------------------------


def _feed_stdin(chan: paramiko.Channel, data: bytes) -> None:
    try:
        chan.sendall(data)
        chan.shutdown_write()
    except (OSError, EOFError, paramiko.SSHException):
        pass  # the command exited without reading all of it, or the connection went: run() sees it


def _drain(chan: paramiko.Channel, out: bytearray, err: bytearray, limit: int | None = None) -> None:
    """Move what has arrived into out/err: stderr keeps its tail; past ``limit`` stdout is read
    and dropped (so the channel window keeps moving while a killed command's output drains)."""
    while chan.recv_ready():
        chunk = chan.recv(1 << 16)
        if limit is None or len(out) <= limit:
            out += chunk
        if limit is not None and len(out) > limit:
            del out[limit + 1:]  # one byte past the bound marks the overflow
            break  # the caller kills the command; never read on while a device floods us
    while chan.recv_stderr_ready():
        err += chan.recv_stderr(1 << 16)
        keep_tail(err, MAX_STDERR)


def _wait_readable(chan: paramiko.Channel, timeout: float) -> None:
    import select

    select.select([chan], [], [], max(0.0, timeout))


def _take_pid(out: bytearray, final: bool = False) -> tuple[int | None, bytearray]:
    """Split the wrapper's ``edgetune-pid:N`` line off the front of stdout.

    Returns (None, out) while the line may still come, (0, out) when it will not."""
    nl = out.find(b"\n")
    if nl < 0:
        if final or (len(out) >= len(_PID_TAG) and not out.startswith(_PID_TAG)):
            return 0, out  # no pid line will come
        return None, out
    line = bytes(out[:nl])
    if line.startswith(_PID_TAG) and line[len(_PID_TAG):].isdigit():
        return int(line[len(_PID_TAG):]), out[nl + 1:]
    return 0, out


def _returncode(chan: paramiko.Channel) -> int:
    name = getattr(chan, "edgetune_signal", None)
    if name is not None:
        try:
            return -signal.Signals["SIG" + name].value
        except KeyError:
            return -255
    return chan.exit_status
