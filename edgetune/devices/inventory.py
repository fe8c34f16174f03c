"""Device inventory: named devices in a TOML file, and opening their transports.

URLs: ``local``, ``ssh://user@host[:port]``, ``adb://SERIAL[@adbhost:port]``.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edgetune.devices.adb import AdbTransport
from edgetune.devices.local import LocalTransport
from edgetune.errors import DeviceError, MissingExtra, UserInputError

DEFAULT_WORKDIRS = {"local": None, "ssh": "/tmp/edgetune", "adb": "/data/local/tmp/edgetune"}
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
_SSH_RE = re.compile(r"^ssh://(?:(?P<user>[^@/:]+)@)?(?P<host>\[[^\]]+\]|[^:/@]+)(?::(?P<port>\d+))?/?$")
_ADB_RE = re.compile(r"^adb://(?P<serial>[^@]+)(?:@(?P<host>[^:]+):(?P<port>\d+))?$")


def edgetune_home() -> Path:
    return Path(os.environ.get("EDGETUNE_HOME") or Path.home() / ".edgetune")


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
        self.path = Path(path) if path else edgetune_home() / "devices.toml"

    def load(self) -> dict[str, DeviceSpec]:
        devices = {"local": DeviceSpec("local", "local", {})}
        if not self.path.exists():
            return devices
        try:
            data = tomllib.loads(self.path.read_text())
        except (OSError, tomllib.TOMLDecodeError) as exc:
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
        devices = self.load()
        if name in devices:
            raise UserInputError(f"device '{name}' already exists; remove it first with 'edgetune devices rm {name}'")
        devices[name] = DeviceSpec(name, url, {k: v for k, v in options.items() if v is not None})
        self._save(devices)
        return devices[name]

    def remove(self, name: str) -> None:
        devices = self.load()
        if name not in devices or name == "local":
            raise UserInputError(f"unknown device '{name}'")
        del devices[name]
        self._save(devices)

    def _save(self, devices: dict[str, DeviceSpec]) -> None:
        lines = ["# edgetune device inventory", ""]
        for name, spec in sorted(devices.items()):
            if name == "local":
                continue
            lines.append(f"[devices.{_toml_str(name)}]")
            lines.append(f"url = {_toml_str(spec.url)}")
            for k, v in sorted(spec.options.items()):
                lines.append(f"{k} = {_toml_value(v)}")
            lines.append("")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_name(self.path.name + ".tmp")
            tmp.write_text("\n".join(lines))
            os.replace(tmp, self.path)
        except OSError as exc:
            raise UserInputError(f"cannot write device inventory {self.path}: {exc.strerror}") from exc


def _toml_str(s: str) -> str:
    return json.dumps(str(s), ensure_ascii=False)


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    return _toml_str(v)


__all__ = ["DeviceSpec", "Inventory", "open_transport", "parse_url", "fingerprint_key", "DeviceError"]
