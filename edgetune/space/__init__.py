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
from edgetune.modelfile import Model
from edgetune.workload import Workload

SPACES = {"ort": "edgetune.space.ort", "tflite": "edgetune.space.tflite", "tvm-relax": "edgetune.space.tvm_relax",
          "tvm-tuned": "edgetune.space.tvm_relax:TUNED", "adapter": "edgetune.space.adapter",
          "ort-int8": "edgetune.space.ort_rewrite:INT8", "ort-fused": "edgetune.space.ort_rewrite:FUSED",
          "ort-tvm": "edgetune.space.ort_tvm", "ort-gpu-fp16": "edgetune.space.ort_gpu:FP16",
          "openvino": "edgetune.space.openvino", "litert": "edgetune.space.litert"}
# added to the spaces when the user sets an accuracy budget (ort-gpu-fp16: nothing without a GPU provider)
APPROXIMATE_SPACES = ("ort-int8", "ort-gpu-fp16")


def with_approximate(spaces: tuple[str, ...], budget_set: bool) -> tuple[str, ...]:
    """``spaces`` plus the approximate ones when an accuracy budget is set (the user asked for them)."""
    return spaces + tuple(s for s in APPROXIMATE_SPACES if s not in spaces) if budget_set else spaces


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
    module, _, attr = SPACES[name].partition(":")
    return getattr(importlib.import_module(module), attr or "SPACE")


def space_of(cand: Candidate) -> Space:
    """The space that prepares a stored candidate: its backend's, or for a rewritten model (int8,
    fused, hybrid) the space that rewrites it, so a re-run measures the same artifact the tune did."""
    params = cand.param_dict
    if cand.backend != "ort":  # only onnxruntime's candidates are rewritten by another space
        return load_space(cand.backend)
    if "hybrid" in params:
        return load_space("ort-tvm")
    if params.get("precision") == "fp16" and "execution_provider" in params:  # a GPU's fp16
        return load_space("ort-gpu-fp16")
    if "precision" in params or "rewrite" in params:
        return load_space("ort-int8" if "precision" in params else "ort-fused")
    return load_space(cand.backend)
