"""Farm fixtures: real sshd, qemu aarch64 board, adb server + adbd emulator, all on 127.0.0.1."""

import pytest

from tests.conformance import suite
from tests.farm.ssh_fixtures import *  # noqa: F401,F403
from tests.farm.adb_fixtures import *  # noqa: F401,F403
from tests.farm.pg_fixtures import *  # noqa: F401,F403


@pytest.fixture
def private_edgetune_home(tmp_path, monkeypatch):
    """EDGETUNE_HOME in the test's own directory (work dirs, artifacts, database never shared)."""
    monkeypatch.setenv("EDGETUNE_HOME", str(tmp_path / "home"))


@pytest.fixture(scope="module")
def mlp(tmp_path_factory):
    """The conformance suite's small MLP, built once per module."""
    return suite.build_mlp(tmp_path_factory.mktemp("mlp") / "mlp.onnx")
