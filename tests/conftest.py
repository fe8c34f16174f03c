"""Shared test helpers.

``require(ok, reason)``: a test that needs a real part (sshd, adb, qemu, a compiler, an optional
runtime) skips with the reason on a developer's machine but FAILS in CI (CI=true), so a green CI
means the part really ran (docs/design.md §6).
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
# the Python agents the tests start keep their zygotes (PROTOCOL.md) for seconds, not minutes:
# hundreds of test agents would otherwise leave hundreds of idle processes behind for a while
os.environ.setdefault("EDGETUNE_AGENT_ZYGOTE_IDLE_S", "10")


def require(ok: bool, reason: str) -> None:
    if ok:
        return
    if IN_CI:
        pytest.fail(f"required test part missing in CI: {reason}", pytrace=False)
    pytest.skip(reason)


def require_module(name: str):
    """Import an optional dependency: skip without it on a developer's machine, fail in CI."""
    import importlib

    try:
        return importlib.import_module(name)
    except ImportError as exc:
        if IN_CI:
            pytest.fail(f"required module {name} missing in CI: {exc}", pytrace=False)
        pytest.skip(f"{name} not installed: {exc}", allow_module_level=True)


_TOOLS = Path(__file__).resolve().parents[1] / "tools"


def load_tool(group: str, name: str):
    """Import tools/GROUP/NAME.py once (tools/ is not a package)."""
    key = f"edgetune_tools_{group}_{name}"
    if key in sys.modules:
        return sys.modules[key]
    spec = importlib.util.spec_from_file_location(key, _TOOLS / group / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[key] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def conversions(tmp_path_factory) -> Path:
    """One onnx2tf conversion cache for the whole run, shared by every xdist worker (their base
    temp directories have one parent): a conversion costs tens of seconds of CPU and the tests that
    need one need the same few. ``onnx2tflite._build`` locks each key, so workers that meet at one
    convert it once. A test about conversion itself (its failures, timeouts, a fresh home's
    rebuild) keeps a cache of its own."""
    base = tmp_path_factory.getbasetemp()
    root = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    cache = root / "onnx2tf-shared"
    cache.mkdir(exist_ok=True)
    return cache


def share_conversions(home: Path, cache: Path) -> Path:
    """``home``'s onnx2tf cache (HOME/artifacts/onnx2tf) as a link to the shared ``cache``."""
    (home / "artifacts").mkdir(parents=True, exist_ok=True)
    link = home / "artifacts" / "onnx2tf"
    if not link.is_symlink():
        link.symlink_to(cache, target_is_directory=True)
    return home
