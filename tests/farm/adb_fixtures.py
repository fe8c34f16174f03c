"""Session-scoped adb farm fixtures: a real adb server talking to adbd emulators on 127.0.0.1.

* ``adb_farm``: an ``AdbFarm`` (tools/farm/adb_farm.py) running the system ``adb`` binary, with
  one authorized phone; ``adb_farm.phone`` is that phone (serial, port, sandbox = the host
  directory that is the phone's ``/``), ``adb_farm.adb_port`` the private server's port.
* ``adb_farm_bundled``: the same with the adb binary bundled in the adbutils wheel (newer adb).
* ``adb_transport``: an ``AdbTransport`` to ``adb_farm.phone``.
* ``adb_farm_module``: the tools/farm/adb_farm.py module (tools/ is not a package).

The adb server gets a private HOME holding a freshly generated adbkey, which is the only key the
phone trusts. Missing adb: skip on a developer machine, fail in CI (``require``). Every process
started here is stopped by PID at teardown.
"""

from __future__ import annotations

import shutil

import pytest

from edgetune.devices.adb import AdbTransport
from tests.conftest import require
from tests.farm import load_farm_tool


def _load_farm_module():
    return load_farm_tool("adb_farm")


def adb_transport_for(farm, phone=None, **overrides) -> AdbTransport:
    phone = phone or farm.phone
    kwargs = dict(serial=phone.serial, adb_host=farm.adb_host, adb_port=farm.adb_port)
    kwargs.update(overrides)
    return AdbTransport(**kwargs)


def _start_farm(tmp_path_factory, adb_bin: str, label: str):
    farm_mod = _load_farm_module()
    farm = farm_mod.AdbFarm(str(tmp_path_factory.mktemp(label)), adb_bin)
    try:
        farm.start()
        farm.add_phone(name=f"{label}-phone")
    except Exception:
        farm.stop()
        raise
    return farm


@pytest.fixture(scope="session")
def adb_farm_module():
    return _load_farm_module()


@pytest.fixture(scope="session")
def adb_farm(tmp_path_factory):
    adb = shutil.which("adb")
    require(adb is not None, "adb not installed (apt-get install adb)")
    farm = _start_farm(tmp_path_factory, adb, "adb-system")
    yield farm
    farm.stop()


@pytest.fixture(scope="session")
def adb_farm_bundled(tmp_path_factory):
    bundled = _load_farm_module().bundled_adb()
    require(bundled is not None, "adbutils' bundled adb binary not found")
    farm = _start_farm(tmp_path_factory, bundled, "adb-bundled")
    yield farm
    farm.stop()


@pytest.fixture(scope="session")
def adb_transport(adb_farm):
    t = adb_transport_for(adb_farm)
    yield t
    t.close()
