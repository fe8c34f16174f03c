"""Candidate spaces, one module per backend, loaded lazily by name.

A space says which candidates exist for a model on a device (from what the device's agent
reports), and prepares each candidate's artifact for one workload (the model itself, or a build).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from edgetune.agent.host import AgentInfo
from edgetune.candidate import Candidate
from edgetune.workload import Model, Workload

SPACES = {"ort": "edgetune.space.ort", "tflite": "edgetune.space.tflite", "tvm-relax": "edgetune.space.tvm_relax",
          "tvm-tuned": "edgetune.space.tvm_relax", "adapter": "edgetune.space.adapter"}


@dataclass(frozen=True)
class Prepared:
    """What the agent runs for a candidate: a backend, an artifact file, params for the agent."""

    backend: str
    artifact: Path
    params: dict[str, Any]
    model: Path | None = None


class BuildFailed(Exception):
    """A candidate's artifact could not be built: recorded as the candidate's failure."""


class Space(Protocol):
    name: str

    def candidates(self, model: Model, info: AgentInfo) -> list[Candidate]: ...

    def prepare(self, cand: Candidate, workload: Workload, info: AgentInfo, cache_dir: Path) -> Prepared: ...


def load_space(name: str) -> Space:
    if name not in SPACES:
        raise KeyError(name)
    mod = importlib.import_module(SPACES[name])
    return mod.TUNED if name == "tvm-tuned" else mod.SPACE
