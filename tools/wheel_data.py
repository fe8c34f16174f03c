"""The build step that puts the device agents and the target files into edgetune's wheel.

pyproject.toml names it (``[tool.setuptools] cmdclass``). The repository keeps them at its top
(``device_agents/``, ``targets/``), outside the package; the wheel carries copies inside it, where
``edgetune.shipped`` finds them (its SHIPPED says which directory goes where). An editable install
copies nothing: it reads the checkout's own. MANIFEST.in puts the same directories in an sdist.
"""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parents[1]
# what may sit beside the sources and is never shipped: build outputs, caches (.gitignore), dotfiles
NOT_SHIPPED = shutil.ignore_patterns("__pycache__", "*.py[co]", "build", "cache", "*.o", "*.so", "*.a", ".*")


def _shipped() -> dict[str, str]:
    # by path: building the wheel must not import the edgetune package (nor need its dependencies)
    spec = importlib.util.spec_from_file_location("_edgetune_shipped", ROOT / "edgetune" / "shipped.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.SHIPPED


class BuildPy(build_py):
    """setuptools' build_py, then the shipped directories copied into the built package."""

    def run(self) -> None:
        super().run()
        if self.editable_mode:
            return
        for repo_dir, inside in _shipped().items():
            dest = Path(self.build_lib) / "edgetune" / inside
            shutil.rmtree(dest, ignore_errors=True)  # nothing an earlier build left (a file since deleted)
            shutil.copytree(ROOT / repo_dir, dest, ignore=NOT_SHIPPED)
