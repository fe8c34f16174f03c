"""Device inventory: named devices in a TOML file, and opening their transports.

URLs: ``local``, ``ssh://user@host[:port]``, ``adb://SERIAL[@adbhost:port]``.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import socket
import re
import stat
import tomllib
import unicodedata
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edgetune.devices.adb import AdbTransport
from edgetune.devices.local import LocalTransport
from edgetune.errors import DeviceError, MissingExtra, UserInputError
from edgetune.private import (DIR_MODE, FILE_MODE, NotPrivate, check_private_dir, edgetune_home, private_dir,
                              write_private)

# work dirs are private to the user (0700, owner checked before use): never a predictable shared
# /tmp path. "~/" is the device user's home; local's default is EDGETUNE_HOME/work (agent/host.py)
DEFAULT_WORKDIRS = {"local": None, "ssh": "~/.cache/edgetune", "adb": "/data/local/tmp/edgetune"}
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
_SSH_RE = re.compile(r"^ssh://(?:(?P<user>[^@/:]+)@)?(?P<host>\[[^\]]+\]|[^:/@]+)(?::(?P<port>\d+))?/?$")
_ADB_RE = re.compile(r"^adb://(?P<serial>[^@]+)(?:@(?P<host>[^:]+):(?P<port>\d+))?$")


HOME_SUBDIRS = ("artifacts", "kernels", "models")


def _tighten(path: Path, mode: int) -> None:
    """Take group/other bits off a file or directory of ours (one made by an older edgetune with
    the umask's 0755/0644). Anything not ours, or a link, is left for the owner check to refuse."""
    try:
        st = os.lstat(path)
    except OSError:
        return
    if stat.S_ISLNK(st.st_mode) or st.st_uid != os.getuid() or not st.st_mode & 0o077:
        return
    try:
        os.chmod(path, mode)
    except OSError:
        pass  # a read-only file system: the check that follows says what is wrong


def private_home() -> Path:
    """The edgetune home, created 0700 when absent. Results, inventory and artifacts live there,
    so it is ours and closed to others: one of ours left open (0755) is tightened, one owned by
    another user is refused (NotPrivate, one line). Subdirectories that exist are tightened too;
    ``home_subdir`` creates one."""
    home = edgetune_home()
    if os.path.lexists(home):
        _tighten(home, DIR_MODE)
        check_private_dir(home, "edgetune home")
    else:
        private_dir(home, "edgetune home")
    for name in HOME_SUBDIRS:
        sub = home / name
        if os.path.lexists(sub):
            _tighten(sub, DIR_MODE)
            check_private_dir(sub, "edgetune directory")
    return home


def home_subdir(name: str) -> Path:
    """``private_home() / name``, created 0700 when absent (artifacts, kernels, models)."""
    return private_dir(private_home() / name, "edgetune directory")


def private_file(path: Path, what: str) -> None:
    """Refuse a state file owned by another user; tighten one of ours that others can read."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise UserInputError(f"{what} {path} cannot be checked: {exc.strerror or exc}") from None
    if st.st_uid != os.getuid():
        raise NotPrivate(f"{what} {path} is owned by uid {st.st_uid}, not by you (uid {os.getuid()}); "
                         f"refusing to use it")
    _tighten(path, FILE_MODE)


@dataclass(frozen=True)
class DeviceSpec:
    name: str
    url: str
    options: dict[str, Any] = field(default_factory=dict, hash=False, compare=False)

    @property
    def kind(self) -> str:
        return self.url.split("://", 1)[0] if "://" in self.url else self.url

    @property
    def workdir(self) -> str | None:
        return self.options.get("workdir") or DEFAULT_WORKDIRS.get(self.kind)


def parse_url(url: str) -> dict[str, Any]:
    if url == "local":
        return {"kind": "local"}
    m = _SSH_RE.match(url)
    if m:
        return {"kind": "ssh", "user": m.group("user") or os.environ.get("USER", "root"),
                "host": m.group("host").strip("[]"), "port": int(m.group("port") or 22)}
    m = _ADB_RE.match(url)
    if m:
        return {"kind": "adb", "serial": m.group("serial"), "adb_host": m.group("host") or "127.0.0.1",
                "adb_port": int(m.group("port") or 5037)}
    raise UserInputError(f"device URL '{url}' not understood; use local, ssh://user@host[:port] "
                         f"or adb://SERIAL[@adbhost:port]")


def this_host() -> str:
    """This host's name in a lab's database: EDGETUNE_HOST, else the hostname (hosts that share a
    hostname, e.g. containers, each set their own)."""
    return os.environ.get("EDGETUNE_HOST") or socket.gethostname()


_LOOPBACK = ("127.0.0.1", "localhost", "::1")


def device_identity(spec: DeviceSpec) -> str:
    """The physical device behind an inventory entry, the same from every host of a lab (the key of
    its lease): this host's own CPU for ``local``, an adb serial on its adb server, an ssh address.
    A loopback address names this host."""
    if spec.options.get("identity"):  # the lab's own name for it (a device reached by other addresses)
        return str(spec.options["identity"])
    info = parse_url(spec.url)
    if info["kind"] == "local":
        return f"local@{this_host()}"
    if info["kind"] == "ssh":
        host = this_host() if info["host"] in _LOOPBACK else info["host"]
        return f"ssh://{info['user']}@{host}:{info['port']}"
    host = this_host() if info["adb_host"] in _LOOPBACK else info["adb_host"]
    return f"adb://{info['serial']}@{host}:{info['adb_port']}"


def open_transport(spec: DeviceSpec):
    info = parse_url(spec.url)
    opts = spec.options
    if info["kind"] == "local":
        return LocalTransport()
    if info["kind"] == "ssh":
        try:
            from edgetune.devices.ssh import SshTransport  # lazy: optional extra "remote" (imports paramiko)
        except ImportError as exc:
            raise MissingExtra("ssh devices", "remote") from exc
        return SshTransport(info["host"], port=info["port"], user=info["user"], key_filename=opts.get("key"),
                            known_hosts=opts.get("known_hosts"),
                            trust_on_first_use=bool(opts.get("trust_on_first_use", False)))
    return AdbTransport(info["serial"], adb_host=info["adb_host"], adb_port=info["adb_port"])


def fingerprint_key(fp: dict) -> str:
    """Stable key of a device fingerprint: results are never mixed across keys."""
    return hashlib.sha256(json.dumps(fp, sort_keys=True).encode()).hexdigest()[:16]


class Inventory:
    """The devices.toml file. ``local`` always exists."""

    def __init__(self, path: str | os.PathLike | None = None):
        self.in_home = not path
        self.path = Path(path) if path else edgetune_home() / "devices.toml"

    def load(self) -> dict[str, DeviceSpec]:
        """The devices; reading creates nothing (no inventory file: ``local`` only). The file names
        hosts, keys and work dirs we will trust, so one owned by another user is refused."""
        devices = {"local": DeviceSpec("local", "local", {})}
        if not self.path.exists():
            return devices
        if self.in_home:
            private_home()
        private_file(self.path, "device inventory")
        try:
            data = tomllib.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
            raise UserInputError(f"device inventory {self.path} is unreadable: {exc}") from exc
        for name, entry in data.get("devices", {}).items():
            if not isinstance(entry, dict) or "url" not in entry:
                raise UserInputError(f"device inventory {self.path}: device '{name}' has no url")
            opts = {k: v for k, v in entry.items() if k != "url"}
            devices[name] = DeviceSpec(name, entry["url"], opts)
        return devices

    def get(self, name: str) -> DeviceSpec:
        devices = self.load()
        if name not in devices:
            known = ", ".join(sorted(devices))
            raise UserInputError(f"unknown device '{name}' (known: {known}; add one with 'edgetune devices add')")
        return devices[name]

    def add(self, name: str, url: str, **options: Any) -> DeviceSpec:
        if not _NAME_RE.match(name) or name == "local":
            raise UserInputError(f"device name '{name}' is invalid (letters, digits, _ . -; not 'local')")
        parse_url(url)
        opts = {k: v for k, v in options.items() if v is not None}
        _toml_text({name: DeviceSpec(name, url, opts)})  # refuses what TOML cannot hold, before any change
        with self._locked():
            devices = self.load()
            if name in devices:
                raise UserInputError(f"device '{name}' already exists; remove it first with 'edgetune devices rm {name}'")
            devices[name] = DeviceSpec(name, url, opts)
            self._save(devices)
        return devices[name]

    def remove(self, name: str) -> None:
        with self._locked():
            devices = self.load()
            if name not in devices or name == "local":
                raise UserInputError(f"unknown device '{name}'")
            del devices[name]
            self._save(devices)

    def _parent(self) -> Path:
        if self.in_home:
            return private_home()
        parent = self.path.parent
        try:
            parent.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
        except OSError as exc:
            raise UserInputError(f"cannot write device inventory {self.path}: {exc.strerror or exc}") from None
        return parent

    @contextmanager
    def _locked(self):
        """Serialize read-modify-write of the inventory between processes (two 'devices add' at once
        would otherwise lose one of the devices)."""
        self._parent()
        lock = self.path.with_name(f".{self.path.name}.lock")
        try:
            fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, FILE_MODE)
        except OSError as exc:
            raise UserInputError(f"cannot lock device inventory {self.path}: {exc.strerror or exc}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def _save(self, devices: dict[str, DeviceSpec]) -> None:
        text = _toml_text(devices)
        self._parent()
        try:
            write_private(self.path, text)  # atomic, 0600
        except OSError as exc:
            raise UserInputError(f"cannot write device inventory {self.path}: {exc.strerror or exc}") from exc


def _toml_text(devices: dict[str, DeviceSpec]) -> str:
    lines = ["# edgetune device inventory", ""]
    for name, spec in sorted(devices.items()):
        if name == "local":
            continue
        lines.append(f"[devices.{_toml_str(name)}]")
        lines.append(f"url = {_toml_str(spec.url)}")
        for k, v in sorted(spec.options.items()):
            lines.append(f"{_toml_key(k)} = {_toml_value(v)}")
        lines.append("")
    return "\n".join(lines)


_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")


def _toml_key(k: str) -> str:
    return k if _BARE_KEY.match(k) else _toml_str(k)


def _toml_str(s: str) -> str:
    """A TOML basic string. TOML forbids raw control characters (DEL included) and has no escape
    for a UTF-16 surrogate (what json.dumps writes for emoji with ensure_ascii): control characters
    become \\uXXXX, quote and backslash are escaped, every other character is written as it is."""
    out = []
    for ch in str(s):
        code = ord(ch)
        if ch in '"\\':
            out.append("\\" + ch)
        elif unicodedata.category(ch) == "Cc":
            out.append(f"\\u{code:04X}")
        elif 0xD800 <= code <= 0xDFFF:
            raise UserInputError(f"{s!r} is not valid text (it holds a lone UTF-16 surrogate); "
                                 f"a device inventory cannot store it")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)  # TOML spells inf and nan as Python does
    return _toml_str(v)


__all__ = ["DeviceSpec", "Inventory", "open_transport", "parse_url", "fingerprint_key", "DeviceError"]
