"""Where the files edgetune ships beside its Python code are: the device agents and the target files.

The repository keeps one copy of each, at its top (``device_agents/``, ``targets/``): a git checkout
and an editable install read those. A wheel carries them inside the package, as ``edgetune/_agents``
and ``edgetune/_targets`` (the build step ``tools/wheel_data.py`` copies them there, as SHIPPED
says), so an installed edgetune provisions devices with no checkout anywhere.
"""

from __future__ import annotations

import os
from pathlib import Path

# the repository's directory -> its place inside the package of a wheel (tools/wheel_data.py reads this)
SHIPPED = {"device_agents": "_agents", "targets": "_targets"}

_PACKAGE = Path(__file__).resolve().parent


def shipped_dir(repo_dir: str) -> Path:
    """``repo_dir`` (a key of SHIPPED): the wheel's copy inside the package where there is one, else
    the checkout's own (a checkout has no copy: the build step writes it into the wheel only)."""
    packaged = _PACKAGE / SHIPPED[repo_dir]
    return packaged if packaged.is_dir() else _PACKAGE.parent / repo_dir


def agents_dir() -> Path:
    """The device agents: ``python/edgetune_agent/`` (the Python agent's modules, which
    edgetune/agent/bundle.py makes the one file a device runs), ``native/`` (C sources), ``PROTOCOL.md``."""
    return shipped_dir("device_agents")


def targets_dir() -> Path:
    """The target files, one TOML per target kind."""
    return shipped_dir("targets")


def cache_root() -> Path:
    """Where edgetune keeps what it builds from these files (the native agent's binaries, the Python
    agent's bundled file): ``$EDGETUNE_CACHE``, else ``$XDG_CACHE_HOME/edgetune`` (~/.cache/edgetune).
    Outside the package: a wheel's site-packages may not be writable."""
    base = os.environ.get("EDGETUNE_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "edgetune")
    return Path(base)
