"""onnxruntime session configurations.

Execution providers the DEVICE's build offers × intra-op threads × graph optimization level ×
execution mode × thread spinning. The default SessionOptions are always the baseline.
"""

from __future__ import annotations

from pathlib import Path

from edgetune.agent.host import AgentInfo
from edgetune.candidate import Candidate
from edgetune.space import Prepared
from edgetune.space.ort_gpu import GPU_PROVIDERS
from edgetune.space.ort_gpu import SPACE as GPU_SPACE
from edgetune.modelfile import Model
from edgetune.workload import Workload

NOT_FOR_INFERENCE = {"AzureExecutionProvider"}  # remote-call EP, not an on-device runtime
OPT_LEVELS = ("disable", "basic", "extended", "all")


def thread_counts(cores: int) -> list[int]:
    counts = {1, cores}
    c = 2
    while c < cores:
        counts.add(c)
        c *= 2
    return sorted(counts)


class OrtSpace:
    name = "ort"

    def available(self, model: Model, info: AgentInfo) -> bool:
        return model.format == "onnx" and "onnxruntime" in info.runtimes

    def candidates(self, model: Model, info: AgentInfo) -> list[Candidate]:
        if not self.available(model, info):
            return []
        # GPU providers get a grid of their own (space/ort_gpu.py), not the CPU's threads and spinning
        providers = [p for p in info.runtimes.get("onnxruntime_providers", ["CPUExecutionProvider"])
                     if p not in NOT_FOR_INFERENCE and p not in GPU_PROVIDERS] or ["CPUExecutionProvider"]
        cores = int(info.fingerprint.get("cores") or 1)
        # the native agent (C API) sets no session config entries: no spinning dimension there
        spins = (1, 0) if info.agent == "python" else (None,)
        out = [Candidate.make("ort", {}, baseline=True)]
        for ep in providers:
            for threads in thread_counts(cores):
                for opt in OPT_LEVELS:
                    for mode in ("sequential", "parallel"):
                        for spin in spins:
                            params = {"execution_provider": ep, "intra_op_num_threads": threads,
                                      "graph_optimization_level": opt, "execution_mode": mode}
                            if spin is not None:
                                params["session.intra_op.allow_spinning"] = spin
                            if mode == "parallel":
                                params["inter_op_num_threads"] = min(2, cores)
                            out.append(Candidate.make("ort", params))
        return out + GPU_SPACE.candidates(model, info)

    def prepare(self, cand: Candidate, workload: Workload, info: AgentInfo, cache_dir: Path) -> Prepared:
        return Prepared("ort", workload.model.path, cand.param_dict)


SPACE = OrtSpace()
