"""Shared test helpers.

``require(ok, reason)``: a test that needs a real part (sshd, adb, qemu, a compiler, an optional
runtime) skips with the reason on a developer's machine but FAILS in CI (CI=true), so a green CI
means the part really ran (DESIGN.md §6).
"""

from __future__ import annotations

import os

import pytest

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


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
