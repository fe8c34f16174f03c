"""LiteRT (TFLite / XNNPACK) candidates for an ONNX model, through the onnx2tf converter stage
(edgetune/convert/onnx2tflite.py: content-addressed, the layouts mapped explicitly, verified against
the float64 reference on the host before the model is ever a candidate).

Candidates (the agent's ``tflite`` backend runs them, given the layout mapping):

* baseline: the fp32 conversion at the interpreter's defaults (XNNPACK on, its thread count):
  ``litert default (fp32)``;
* ``precision=fp32`` × threads × XNNPACK on/off (exact: verified within the float32 tolerance);
* ``precision=fp16`` (weights float16) × threads, XNNPACK on (without it the interpreter widens the
  weights to float32 at load: the fp32 candidate again);
* ``precision=int8`` with ``quant=dynamic`` (int8 weights) or ``quant=full`` (weights and
  activations, calibrated on seeded inputs of their own) × threads × XNNPACK on/off.

fp16 and int8 are approximate (``Candidate.approximate``): judged by their accuracy against the
fp32 reference, selectable only within the user's ``--accuracy`` budget.

No candidates when the model is not ONNX, the device's agent reports no ``tflite`` runtime, or the
converter environment is missing (``unavailable_reason`` / ``LitertSpace.unavailable`` say which:
tune records it among the families not run).
"""

from __future__ import annotations

import time
from pathlib import Path

from edgetune.agent.host import AgentInfo
from edgetune.candidate import Candidate
from edgetune.convert import onnx2tflite
from edgetune.space import Prepared
from edgetune.space.ort import thread_counts
from edgetune.modelfile import Model
from edgetune.workload import Workload

# (precision, quant) -> the converter's precision, and whether XNNPACK off is a candidate of its own
VARIANTS = {("fp32", None): ("fp32", True), ("fp16", None): ("fp16", False),
            ("int8", "dynamic"): ("int8-dynamic", True), ("int8", "full"): ("int8-full", True)}
RUNTIME_KEYS = ("num_threads", "xnnpack")


def unavailable_reason(info: AgentInfo | None = None) -> str | None:
    """Why the ``litert`` space has no candidates for an ONNX model (on the device ``info``
    describes, when given); None when it has."""
    if info is not None and not info.runtimes.get("tflite"):  # (the native agent lists it as null)
        return (f"the {info.agent} agent reports no tflite runtime (ai-edge-litert or tflite-runtime on the "
                f"device's Python)")
    return onnx2tflite.unavailable_reason()


# a conversion gets the shape's budget left, but at least this long: onnx2tf on a full-size model
# takes minutes, and a conversion that timed out is not cached (a later run tries again)
MIN_CONVERT_S = 180.0


class LitertSpace:
    name = "litert"
    wants_deadline = True  # tune passes the shape's deadline (time.monotonic) to prepare

    def unavailable(self, model: Model, info: AgentInfo) -> str | None:
        """Why this device gets no LiteRT candidates for the model, or None (tune shows it)."""
        if model.format != "onnx":
            return None  # (a .tflite model: the tflite space's, nothing to say)
        return unavailable_reason(info)

    def candidates(self, model: Model, info: AgentInfo) -> list[Candidate]:
        if model.format != "onnx" or unavailable_reason(info):
            return []
        cores = int(info.fingerprint.get("cores") or 1)
        out = [Candidate.make("litert", {"config": "default", "precision": "fp32"}, baseline=True)]
        for (precision, quant), (_, xnn_off) in VARIANTS.items():
            for threads in thread_counts(cores):
                for xnn in (True, False) if xnn_off else (True,):
                    params = {"precision": precision, "num_threads": threads, "xnnpack": xnn}
                    if quant:
                        params["quant"] = quant
                    out.append(Candidate.make("litert", params))
        return out

    def prepare(self, cand: Candidate, workload: Workload, info: AgentInfo, cache_dir: Path,
                deadline: float | None = None) -> Prepared:
        p = cand.param_dict
        precision = VARIANTS[(str(p.get("precision", "fp32")), p.get("quant"))][0]
        timeout = onnx2tflite.CONVERT_TIMEOUT_S
        if deadline is not None:  # the user's --budget bounds the conversion too (with a floor)
            timeout = min(timeout, max(MIN_CONVERT_S, deadline - time.monotonic()))
        conv = onnx2tflite.convert(workload, precision, cache_dir, timeout_s=timeout)
        params = {k: p[k] for k in RUNTIME_KEYS if k in p}
        return Prepared("tflite", conv.path, {**params, **conv.layout_params()})


SPACE = LitertSpace()
