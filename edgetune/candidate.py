"""Candidates: a backend plus parameters, frozen, with a stable key (docs/design.md §3)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any, Mapping

# parameters that say how the MODEL is rewritten on the host (edgetune/space/ort_rewrite.py), not
# how the runtime is configured: the agent never sees them
REWRITE_KEYS = frozenset({"precision", "quant", "rewrite", "hybrid", "kernel_trials"})
APPROXIMATE_PRECISIONS = frozenset({"int8", "fp16", "bf16"})


@dataclass(frozen=True)
class Candidate:
    backend: str  # ort | tflite | tvm-relax | tvm-tuned | adapter
    params: tuple[tuple[str, Any], ...] = ()
    baseline: bool = False  # the runtime's own default configuration

    @classmethod
    def make(cls, backend: str, params: Mapping[str, Any] | None = None, baseline: bool = False) -> "Candidate":
        return cls(backend, tuple(sorted((params or {}).items())), baseline)

    @property
    def param_dict(self) -> dict[str, Any]:
        return dict(self.params)

    @property
    def approximate(self) -> bool:
        """Computes in a lower precision than the model: judged by accuracy, not tolerance."""
        return self.param_dict.get("precision") in APPROXIMATE_PRECISIONS

    def key(self) -> str:
        payload = json.dumps({"backend": self.backend, "params": self.param_dict}, sort_keys=True)
        return hashlib.sha256(payload.encode()).hexdigest()[:12]

    def label(self) -> str:
        if self.baseline and not self.params:
            return f"{self.backend} default"
        p = self.param_dict
        if self.baseline and p.get("config") == "default":  # a runtime's default, named by its precision
            return f"{self.backend} default ({p.get('precision')}{', approximate' if self.approximate else ''})"
        short = {
            "intra_op_num_threads": "threads", "inter_op_num_threads": "inter", "graph_optimization_level": "opt",
            "execution_mode": "mode", "session.intra_op.allow_spinning": "spin", "execution_provider": "ep",
            "num_threads": "threads", "xnnpack": "xnnpack",
        }
        parts = []
        for k, v in self.params:
            if k in ("target", "adapter", "db"):
                continue
            if k == "execution_provider":
                v = str(v).replace("ExecutionProvider", "")
            parts.append(f"{short.get(k, k)}={v}")
        tag = " (default)" if self.baseline else ""
        return f"{self.backend} " + " ".join(parts) + tag

    def as_dict(self) -> dict[str, Any]:
        return {"backend": self.backend, "params": self.param_dict, "baseline": self.baseline, "key": self.key()}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Candidate":
        return cls.make(d["backend"], d.get("params", {}), bool(d.get("baseline", False)))
