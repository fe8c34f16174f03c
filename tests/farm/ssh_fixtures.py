"""Session-scoped SSH farm fixtures: a real sshd and the qemu aarch64 board, both on 127.0.0.1.

* ``ssh_farm`` / ``qemu_board``: the info dict from ``tools/farm/ssh_farm.py start``
  (host, port, user, key, known_hosts, pid, state, home, log; the board adds arch/emulated).
* ``ssh_transport`` / ``board_transport``: an ``SshTransport`` connected to each.
* ``ssh_farm_module``: the tools/farm/ssh_farm.py module itself (tools/ is not a package).

Missing sshd / qemu-user / cross gcc: skip on a developer machine, fail in CI (``require``).
Every process started here is stopped by PID at teardown.
"""

from __future__ import annotations

import pytest

from edgetune.devices.ssh import SshTransport
from tests.conftest import require
from tests.farm import load_farm_tool


def _load_farm_module():
    return load_farm_tool("ssh_farm")


def transport_for(info: dict, **overrides) -> SshTransport:
    """An SshTransport for a farm device; keyword overrides replace its defaults."""
    kwargs = dict(
        host=info["host"], port=info["port"], user=info["user"], key_filename=info["key"],
        known_hosts=info["known_hosts"], connect_timeout=10,
    )
    kwargs.update(overrides)
    return SshTransport(**kwargs)


@pytest.fixture(scope="session")
def ssh_farm_module():
    return _load_farm_module()


def _start(farm, tmp_path_factory, board: bool):
    missing = farm.missing_parts(board=board)
    require(not missing, "; ".join(missing))
    state = tmp_path_factory.mktemp("ssh-board" if board else "ssh-farm")
    try:
        info = farm.start(state, board=board)
    except Exception:
        farm.stop(state)
        raise
    return state, info


@pytest.fixture(scope="session")
def ssh_farm(ssh_farm_module, tmp_path_factory):
    state, info = _start(ssh_farm_module, tmp_path_factory, board=False)
    try:
        yield info
    finally:
        ssh_farm_module.stop(state)


@pytest.fixture(scope="session")
def ssh_transport(ssh_farm):
    t = transport_for(ssh_farm)
    t.connect()
    try:
        yield t
    finally:
        t.close()


@pytest.fixture(scope="session")
def qemu_board(ssh_farm_module, tmp_path_factory):
    state, info = _start(ssh_farm_module, tmp_path_factory, board=True)
    try:
        yield info
    finally:
        ssh_farm_module.stop(state)


@pytest.fixture(scope="session")
def board_transport(qemu_board):
    t = transport_for(qemu_board)
    t.connect()
    try:
        yield t
    finally:
        t.close()
