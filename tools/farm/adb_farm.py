#!/usr/bin/env python3
"""Start/stop an adb "phone farm" on 127.0.0.1: adbd emulators + a private real adb server.

Used by tests/farm/adb_fixtures.py and by hand::

    python tools/farm/adb_farm.py up --dir .farm/adb [--adb /usr/bin/adb] [--phones 2]
    # prints the adb port and serials, runs until Ctrl-C / SIGTERM, then stops everything

Every process is started by us and stopped by PID. The adb server gets its own HOME (with a
freshly generated ~/.android/adbkey), its own port and TMPDIR (its log), so it never touches a
system adb server or the user's keys. The phones trust exactly that key (their
``authorized_keys`` file holds its adbkey.pub line) unless asked otherwise.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field

HERE = os.path.dirname(os.path.abspath(__file__))
EMULATOR = os.path.join(HERE, "adbd_emu.py")
if HERE not in sys.path:
    sys.path.insert(0, HERE)
import adb_proto  # noqa: E402,F401  (re-exported: tests use adb_farm.adb_proto's key helpers)
from adb_proto import android_pubkey_encode  # noqa: E402

# the adb server probes localhost:5555..5585 for emulators at start: never give a phone those
_ADB_EMULATOR_PORTS = range(5554, 5587)


def bundled_adb() -> str | None:
    """The adb binary shipped inside the adbutils wheel, if any."""
    try:
        import adbutils
    except ImportError:
        return None
    path = os.path.join(os.path.dirname(adbutils.__file__), "binaries", "adb")
    return path if os.access(path, os.X_OK) else None


def free_port() -> int:
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in _ADB_EMULATOR_PORTS:
            return port


def gen_adb_key(android_dir: str, comment: str = "edgetune@farm") -> tuple[str, str]:
    """Write ANDROID_DIR/adbkey (PKCS#8 PEM, like adb keygen) + adbkey.pub; -> (key path, pub line)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    os.makedirs(android_dir, exist_ok=True)
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption())
    path = os.path.join(android_dir, "adbkey")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(pem)
    nums = key.public_key().public_numbers()
    pub = android_pubkey_encode(nums.n, nums.e, comment)
    with open(path + ".pub", "w") as f:
        f.write(pub + "\n")
    return path, pub


def _stop(proc: subprocess.Popen | None, grace: float = 5.0) -> None:
    if proc is None or proc.poll() is not None:
        return
    try:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=grace)
    except ProcessLookupError:
        pass


@dataclass
class Phone:
    serial: str          # what adb calls it: 127.0.0.1:PORT
    name: str            # ro.serialno
    port: int
    sandbox: str         # host directory that is the phone's "/"
    proc: subprocess.Popen
    log: str

    def host_path(self, device_path: str) -> str:
        """Host path of an absolute device path (no symlink resolution)."""
        return os.path.join(self.sandbox, device_path.lstrip("/"))


@dataclass
class AdbFarm:
    """A private adb server + its phones, all on 127.0.0.1, under ``base`` (a fresh directory)."""

    base: str
    adb_bin: str
    adb_host: str = "127.0.0.1"
    adb_port: int = 0
    phones: list[Phone] = field(default_factory=list)
    server: subprocess.Popen | None = None
    key_path: str = ""
    pub_line: str = ""

    @property
    def phone(self) -> Phone:
        """The first phone."""
        return self.phones[0]

    @property
    def home(self) -> str:
        return os.path.join(self.base, "home")

    def env(self) -> dict[str, str]:
        # nothing of the caller's adb set-up leaks in (keys, server address, user home)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("ANDROID_", "ADB_"))}
        env.update(HOME=self.home, TMPDIR=os.path.join(self.base, "tmp"), ADB_VENDOR_KEYS=self.key_path,
                   ANDROID_ADB_SERVER_PORT=str(self.adb_port), ADB_MDNS="0", ADB_MDNS_OPENSCREEN="0",
                   ADB_LIBUSB="0")
        return env

    def adb(self, *args: str, timeout: float = 30.0, check: bool = False) -> subprocess.CompletedProcess:
        """Run the adb CLI against this farm's server."""
        return subprocess.run([self.adb_bin, "-H", self.adb_host, "-P", str(self.adb_port), *args],
                              env=self.env(), capture_output=True, timeout=timeout, check=check,
                              stdin=subprocess.DEVNULL)

    # -- lifecycle
    def start(self) -> "AdbFarm":
        os.makedirs(os.path.join(self.base, "tmp"), exist_ok=True)
        self.key_path, self.pub_line = gen_adb_key(os.path.join(self.home, ".android"))
        self.adb_port = self.adb_port or free_port()
        log = open(os.path.join(self.base, "adb-server.log"), "ab")
        self.server = subprocess.Popen(
            [self.adb_bin, "-P", str(self.adb_port), "nodaemon", "server"],
            env=self.env(), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
        log.close()
        deadline = time.monotonic() + 20
        while True:
            if self.server.poll() is not None:
                raise RuntimeError(f"adb server exited ({self.server.returncode}); see {self.base}/adb-server.log")
            try:
                socket.create_connection((self.adb_host, self.adb_port), timeout=0.5).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError("adb server did not start listening in 20 s")
                time.sleep(0.05)
        return self

    def add_phone(self, name: str | None = None, trust_server_key: bool = True,
                  extra_keys: list[str] = (), wait_state: str | None = "device",
                  no_auth: bool = False) -> Phone:
        """Start one emulator, ``adb connect`` it, wait for ``wait_state`` (None: don't wait)."""
        idx = len(self.phones)
        name = name or f"emu{idx}"
        pdir = os.path.join(self.base, f"phone-{name}")
        os.makedirs(pdir, exist_ok=True)
        keys = os.path.join(pdir, "authorized_keys")
        with open(keys, "w") as f:
            for line in ([self.pub_line] if trust_server_key else []) + list(extra_keys):
                f.write(line + "\n")
        log_path = os.path.join(pdir, "emu.log")
        log = open(log_path, "ab")
        cmd = [sys.executable, EMULATOR, "--port", "0", "--sandbox", os.path.join(pdir, "root"),
               "--authorized-keys", keys, "--serial", name]
        if no_auth:
            cmd.append("--no-auth")
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, stdin=subprocess.DEVNULL)
        log.close()
        line = _readline_timeout(proc, 30.0)
        if not line.startswith("READY "):
            _stop(proc)
            raise RuntimeError(f"adbd emulator did not start: {line!r}; see {log_path}")
        port = int(line.split()[1])
        phone = Phone(serial=f"127.0.0.1:{port}", name=name, port=port, sandbox=os.path.join(pdir, "root"),
                      proc=proc, log=log_path)
        self.phones.append(phone)
        out = self.adb("connect", phone.serial)
        text = (out.stdout + out.stderr).decode(errors="replace").strip()
        if "connected to" not in text and "authenticate" not in text:
            raise RuntimeError(f"adb connect {phone.serial}: {text}")
        if wait_state:
            self.wait_state(phone.serial, wait_state)
        return phone

    def state(self, serial: str) -> str | None:
        out = self.adb("devices").stdout.decode(errors="replace")
        for line in out.splitlines():
            parts = line.split("\t")
            if len(parts) == 2 and parts[0] == serial:
                return parts[1].strip()
        return None

    def wait_state(self, serial: str, want: str, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        st = None
        while time.monotonic() < deadline:
            st = self.state(serial)
            if st == want:
                return
            time.sleep(0.05)
        raise RuntimeError(f"{serial} is {st!r}, not {want!r} after {timeout:.0f} s")

    def stop(self) -> None:
        for p in self.phones:
            _stop(p.proc)
            if p.proc.stdout:
                p.proc.stdout.close()
        _stop(self.server)

    def __enter__(self) -> "AdbFarm":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def _readline_timeout(proc: subprocess.Popen, timeout: float) -> str:
    import selectors

    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    try:
        if not sel.select(timeout):
            return ""
        return proc.stdout.readline().decode(errors="replace").strip()
    finally:
        sel.close()


def main(argv=None) -> int:
    import argparse
    import tempfile

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    up = sub.add_parser("up", help="start a server and phones; run until Ctrl-C/SIGTERM")
    up.add_argument("--dir", default=None, help="state directory (default: a new temp dir)")
    up.add_argument("--adb", default=shutil.which("adb") or bundled_adb())
    up.add_argument("--phones", type=int, default=1)
    a = ap.parse_args(argv)
    base = a.dir or tempfile.mkdtemp(prefix="adbfarm-")
    os.makedirs(base, exist_ok=True)
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    with AdbFarm(os.path.abspath(base), a.adb) as farm:
        for i in range(a.phones):
            farm.add_phone()
        print(f"ADB_SERVER_PORT={farm.adb_port}")
        print(f"HOME_FOR_ADB={farm.home}")
        for p in farm.phones:
            print(f"PHONE {p.serial} sandbox={p.sandbox}")
        print(f"try: {a.adb} -P {farm.adb_port} -s {farm.phones[0].serial} shell getprop ro.product.model",
              flush=True)
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
