"""TFLite / LiteRT interpreter configurations: threads × XNNPACK delegate on/off.

The interpreter's defaults (XNNPACK on, default thread count) are the baseline.
"""

from __future__ import annotations

from pathlib import Path

from edgetune.agent.host import AgentInfo
from edgetune.candidate import Candidate
from edgetune.space import Prepared
from edgetune.space.ort import thread_counts
from edgetune.modelfile import Model
from edgetune.workload import Workload


class TfliteSpace:
    name = "tflite"

    def available(self, model: Model, info: AgentInfo) -> bool:
        return model.format == "tflite" and bool(info.runtimes.get("tflite"))  # (the native agent: null)

    def candidates(self, model: Model, info: AgentInfo) -> list[Candidate]:
        if not self.available(model, info):
            return []
        cores = int(info.fingerprint.get("cores") or 1)
        out = [Candidate.make("tflite", {}, baseline=True)]
        for threads in thread_counts(cores):
            for xnn in (True, False):
                out.append(Candidate.make("tflite", {"num_threads": threads, "xnnpack": xnn}))
        return out

    def prepare(self, cand: Candidate, workload: Workload, info: AgentInfo, cache_dir: Path) -> Prepared:
        return Prepared("tflite", workload.model.path, cand.param_dict)


SPACE = TfliteSpace()
