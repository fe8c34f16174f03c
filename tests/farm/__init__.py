"""Farm tests: real sshd, qemu board, adb server + phone emulator on 127.0.0.1."""

from __future__ import annotations

from tests.conftest import load_tool


def load_farm_tool(name: str):
    """Import tools/farm/NAME.py once (tools/ is not a package)."""
    return load_tool("farm", name)
