"""OpenVINO on an ONNX model: inference precision × performance hint × threads, and int8 by NNCF.

OpenVINO reads the ONNX file itself (no conversion to verify), reshaped to the shape point's static
shapes as a deployment compiles it. Its default is a baseline like onnxruntime's, and it is not
always exact: on a CPU with bf16 units (AVX512-BF16, AMX) OpenVINO computes in bf16 unless told
otherwise. So the space has two baselines, each labelled with the precision it computes in:

  - ``openvino default (bf16)``: nothing set, what a user who switches runtime gets; approximate
    where the device's default precision is, and then judged by accuracy like any approximate one;
  - ``openvino default (fp32)``: only ``INFERENCE_PRECISION_HINT=f32`` set, the exact form (the only
    default when the device's default already is fp32).

The agent reports the precision the compiled model actually uses (``backend_info``); a candidate
whose label says otherwise fails as ``precision-mismatch`` (``check_precision``), so no table shows
an approximate run under an exact name. Approximate precisions (bf16, fp16, int8) are candidates
only when the device's CPU has them (OpenVINO's OPTIMIZATION_CAPABILITIES); int8 is NNCF's
post-training quantization of the ONNX model (QDQ), calibrated on seeded sets of its own, never the
verification inputs (``ort_rewrite.calibration_feeds``), built in a child process and cached.

NNCF has more than one recipe, and which keeps accuracy depends on the graph (measured on the zoo:
docs/results/zoo-runtimes.md), so the space races the ones that fit it (``NNCF_RECIPES``):

  - ``nncf``: the default preset (symmetric activations), every graph;
  - ``nncf-mixed``: asymmetric activations and full bias correction, the recipe for CNNs whose
    activations go negative (hard-swish, SiLU): EfficientNet-B0's cosine 0.969 -> 0.994;
  - ``nncf-transformer``: NNCF's transformer model type (it leaves the attention's sensitive ops in
    float, SmoothQuant), graphs with attention: BERT-base 0.9989 -> 0.9996, ViT-B/16 0.899 -> 0.9945.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
from pathlib import Path
from typing import Any

from edgetune.agent.host import AgentInfo
from edgetune.candidate import Candidate
from edgetune.space import BuildFailed, Prepared
from edgetune.space.ort import thread_counts
from edgetune.space.ort_rewrite import cached_build, calibration_feeds, fusion_types
from edgetune.modelfile import Model
from edgetune.workload import Workload

# OpenVINO's OPTIMIZATION_CAPABILITIES -> the precision a candidate names
CAPABILITY = {"BF16": "bf16", "FP16": "fp16", "INT8": "int8"}
HINTS = ("latency", "throughput")
AGENT_KEYS = ("precision", "hint", "threads", "streams", "pinning")  # what the agent's backend takes
NNCF_RECIPES = ("nncf", "nncf-mixed", "nncf-transformer")


def nncf_recipes(model: Model) -> list[str]:
    """The NNCF recipes raced on this graph: the default, and the one for its kind (attention or not)."""
    return ["nncf", "nncf-transformer" if fusion_types(model) else "nncf-mixed"]


def default_precision(info: AgentInfo) -> str:
    """The precision OpenVINO's CPU plugin computes in on this device when nothing is set."""
    got = info.runtimes.get("openvino_cpu_default_precision") or ["fp32"]
    return str(got[0]) if isinstance(got, list) and got else "fp32"


def precisions(info: AgentInfo) -> list[str]:
    caps = info.runtimes.get("openvino_cpu_capabilities") or []
    return ["fp32"] + [CAPABILITY[c] for c in ("BF16", "FP16", "INT8") if c in caps]


def check_precision(cand: Candidate, backend_info: dict[str, Any]) -> str | None:
    """Why the job ran in another precision than the candidate's label says, or None. int8 models
    keep a float precision for what is not quantized: their label is the model's, not checked here."""
    want = cand.param_dict.get("precision")
    if cand.backend != "openvino" or want in (None, "int8"):
        return None
    got = backend_info.get("inference_precision")
    if got != want:
        return f"labelled {want} but OpenVINO compiled it for {got or 'an unreported precision'}"
    return None


class OpenvinoSpace:
    name = "openvino"

    def unavailable(self, model: Model, info: AgentInfo) -> str | None:
        """Why this device cannot run the model on OpenVINO, or None."""
        if model.format != "onnx":
            return None  # (a .tflite model: not this family's, nothing to say)
        if info.agent != "python":
            return (f"the {info.agent} agent does not run OpenVINO (it runs onnxruntime and TVM kernels); "
                    f"a device with Python and OpenVINO does")
        if "CPU" not in (info.runtimes.get("openvino_devices") or []):
            return "OpenVINO is not installed for the device's Python (pip install openvino)"
        return None

    def candidates(self, model: Model, info: AgentInfo) -> list[Candidate]:
        if model.format != "onnx" or self.unavailable(model, info):
            return []
        native = default_precision(info)
        out = [Candidate.make("openvino", {"config": "default", "precision": native}, baseline=True)]
        if native != "fp32":
            out.append(Candidate.make("openvino", {"config": "default", "precision": "fp32"}, baseline=True))
        cores = int(info.fingerprint.get("cores") or 1)
        for prec in precisions(info):
            if prec == "int8":
                out.extend(Candidate.make("openvino", {"precision": "int8", "quant": r}) for r in nncf_recipes(model))
                continue
            for hint in HINTS:
                for threads in thread_counts(cores):
                    out.append(Candidate.make("openvino", {"precision": prec, "hint": hint, "threads": threads}))
        return out

    def prepare(self, cand: Candidate, workload: Workload, info: AgentInfo, cache_dir: Path) -> Prepared:
        p = cand.param_dict
        params: dict[str, Any] = {"shapes": {n: list(a.shape) for n, a in zip(workload.input_names,
                                                                              workload.input_sets[0])}}
        if p.get("config") == "default":  # the runtime's own default: only an exact form forces fp32
            if p.get("precision") != default_precision(info):
                params["precision"] = p["precision"]
        else:
            params.update({k: v for k, v in p.items() if k in AGENT_KEYS and not (k == "precision" and v == "int8")})
        art = workload.model.path
        if p.get("quant") in NNCF_RECIPES:
            art = quantized(workload, cache_dir, str(p["quant"]))
        return Prepared("openvino", art, params)


def quantized(wl: Workload, cache_dir: Path, recipe: str = "nncf") -> Path:
    """NNCF's post-training int8 quantization of the model (QDQ ONNX) by ``recipe``, calibrated on
    seeded sets."""
    if importlib.util.find_spec("nncf") is None:  # (the build's child process imports it)
        raise BuildFailed("int8 by NNCF needs the openvino extra: pip install 'edgetune[openvino]'")
    feeds = calibration_feeds(wl)
    payload = {"model": wl.model.sha256, "quant": recipe, "nncf": _nncf_version(),
               "calibration": [hashlib.sha256(b"".join(a.tobytes() for a in f.values())).hexdigest()[:16]
                               for f in feeds]}
    return cached_build(cache_dir, "openvino-int8", payload, {"op": "nncf", "recipe": recipe, "src": str(wl.model.path)}, feeds)


def _nncf_version() -> str:
    return importlib.metadata.version("nncf")


SPACE = OpenvinoSpace()
