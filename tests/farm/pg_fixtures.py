"""Session-scoped PostgreSQL fixture: a real server (tools/farm/pg_farm.py) on 127.0.0.1, one fresh
database per test."""

from __future__ import annotations

import importlib.util
import shutil
import tempfile
import uuid
from pathlib import Path

import pytest

from tests.conftest import require, require_module

_TOOLS = Path(__file__).resolve().parents[2] / "tools" / "farm"


def _load_pg_farm():
    spec = importlib.util.spec_from_file_location("pg_farm", _TOOLS / "pg_farm.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="session")
def pg_server():
    farm = _load_pg_farm()
    require(farm.binary("initdb") is not None and farm.binary("pg_ctl") is not None,
            "PostgreSQL's server (apt-get install postgresql)")
    require_module("psycopg")
    # not under pytest's 0700 temp root: as root, the server runs as the postgres user, who must reach it
    base = Path(tempfile.mkdtemp(prefix="edgetune-pg-"))
    try:
        info = farm.start(base)
        try:
            yield info
        finally:
            farm.stop(base)
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def pg_url(pg_server):
    """A database of its own for one test: postgresql://edgetune@127.0.0.1:PORT/<name>."""
    import psycopg

    name = "t_" + uuid.uuid4().hex[:12]
    with psycopg.connect(pg_server["url"], autocommit=True) as c:
        c.execute(f"CREATE DATABASE {name}")
    return pg_server["url"].rsplit("/", 1)[0] + "/" + name
