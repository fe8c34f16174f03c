"""Farm tests: real sshd, qemu board, adb server + phone emulator on 127.0.0.1."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

_TOOLS = Path(__file__).resolve().parents[2] / "tools" / "farm"


def load_farm_tool(name: str):
    """Import tools/farm/NAME.py once (tools/ is not a package)."""
    key = f"edgetune_tools_{name}"
    if key in sys.modules:
        return sys.modules[key]
    spec = importlib.util.spec_from_file_location(key, _TOOLS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[key] = module
    spec.loader.exec_module(module)
    return module
