"""User-supplied Python adapters (e.g. a vendor NPU runtime behind a Python binding).

An adapter is a .py file defining ``load(model_path, params) -> callable(list[np.ndarray]) ->
list[np.ndarray]``. It is pushed to the device like any artifact and runs inside the Python agent,
so it gets the same isolation, timing and verification as every built-in runtime.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from edgetune.agent.host import AgentInfo
from edgetune.candidate import Candidate
from edgetune.errors import UserInputError
from edgetune.space import BuildFailed, Prepared
from edgetune.modelfile import Model
from edgetune.workload import Workload


def adapter_candidate(path: str) -> tuple[Candidate, "AdapterSpace"]:
    p = Path(path)
    if not p.is_file() or p.suffix != ".py":
        raise UserInputError(f"adapter {p} is not a .py file")
    digest = hashlib.sha256(p.read_bytes()).hexdigest()[:16]
    return Candidate.make("adapter", {"adapter": str(p.resolve()), "name": p.stem, "sha256": digest}), SPACE


class AdapterSpace:
    name = "adapter"

    def candidates(self, model: Model, info: AgentInfo) -> list[Candidate]:
        return []

    def prepare(self, cand: Candidate, workload: Workload, info: AgentInfo, cache_dir: Path) -> Prepared:
        if info.python is None:
            raise BuildFailed("adapters need the Python agent; the device has no Python")
        p = Path(cand.param_dict["adapter"])
        if not p.is_file():
            raise BuildFailed(f"adapter file {p} is gone")
        return Prepared("adapter", p, {}, model=workload.model.path)


SPACE = AdapterSpace()
