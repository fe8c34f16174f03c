from __future__ import annotations

from pathlib import Path

import pytest

from tests.fixtures.tiny import build_tiny

from tests.conformance.suite import ADAPTERS  # one set of adapter fixtures: the conformance suite's


@pytest.fixture(autouse=True)
def _isolated_home(tmp_path, monkeypatch):
    """Each test gets its own ~/.edgetune (inventory, db, artifacts)."""
    monkeypatch.setenv("EDGETUNE_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("EDGETUNE_DB", raising=False)


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    return build_tiny(tmp_path_factory.mktemp("models") / "tiny.onnx")


@pytest.fixture
def adapters() -> Path:
    return ADAPTERS
