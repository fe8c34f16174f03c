"""Farm fixtures: real sshd, qemu aarch64 board, adb server + adbd emulator, all on 127.0.0.1."""

from tests.farm.ssh_fixtures import *  # noqa: F401,F403
from tests.farm.adb_fixtures import *  # noqa: F401,F403
