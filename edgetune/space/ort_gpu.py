"""onnxruntime on a GPU: the CUDA and TensorRT execution providers, when the DEVICE's onnxruntime
build has them (``onnxruntime-gpu``); nothing on a device without them.

The dimensions that matter there, not the CPU's threads and spinning:

* CUDA: graph optimization level × where inputs and outputs live (``io_binding``: "host", bound
  by pointer like every CPU candidate and copied by onnxruntime each run, or "device": buffers in
  GPU memory at fixed addresses, uploaded before each timed run) × CUDA graphs (device binding
  only: the whole run captured once and replayed) × cuDNN's convolution algorithm search;
* TensorRT: its engine in fp32 (with its cache on the device), device or host binding.

fp16 (``ort-gpu-fp16``, an approximate space: selectable only under an accuracy budget): the model
converted to float16 inside, float32 at its inputs and outputs (onnxruntime's transformers
converter, ``keep_io_types``), on CUDA; and TensorRT's own fp16 mode.

Baselines: the ``ort`` space's onnxruntime defaults (the agent names the CPU provider: onnxruntime-gpu
has no default provider) and, here, each GPU provider at its defaults: the strongest baseline a GPU
candidate's speedup is confirmed against is a GPU one.
"""

from __future__ import annotations

from pathlib import Path

from edgetune.agent.host import AgentInfo
from edgetune.candidate import Candidate
from edgetune.space import BuildFailed, Prepared
from edgetune.modelfile import Model
from edgetune.workload import Workload

GPU_PROVIDERS = ("CUDAExecutionProvider", "TensorrtExecutionProvider")


def gpu_providers(info: AgentInfo) -> list[str]:
    """The GPU execution providers of the device's onnxruntime build, in its order."""
    have = info.runtimes.get("onnxruntime_providers") or []
    return [p for p in have if p in GPU_PROVIDERS] if isinstance(have, list) else []


def cuda_candidates() -> list[dict]:
    out = []
    for opt in ("basic", "all"):
        for algo in ("EXHAUSTIVE", "HEURISTIC"):
            for binding, graph in (("host", False), ("device", False), ("device", True)):
                opts = {"cudnn_conv_algo_search": algo}
                if graph:
                    opts["enable_cuda_graph"] = "1"
                out.append({"execution_provider": "CUDAExecutionProvider", "graph_optimization_level": opt,
                            "io_binding": binding, "provider_options": opts})
    return out


def tensorrt_candidates(fp16: bool) -> list[dict]:
    opts = {"trt_engine_cache_enable": "1", "trt_engine_cache_path": "trt-cache"}
    if fp16:
        opts["trt_fp16_enable"] = "1"
    return [{"execution_provider": "TensorrtExecutionProvider", "io_binding": b, "provider_options": dict(opts),
             **({"precision": "fp16"} if fp16 else {})} for b in ("host", "device")]


class OrtGpuSpace:
    name = "ort-gpu"

    def __init__(self, fp16: bool = False):
        self.fp16 = fp16
        if fp16:
            self.name = "ort-gpu-fp16"

    def candidates(self, model: Model, info: AgentInfo) -> list[Candidate]:
        if model.format != "onnx" or "onnxruntime" not in info.runtimes:
            return []
        eps = gpu_providers(info)
        # each GPU provider's own defaults are baselines: a GPU configuration is judged against the GPU
        # at onnxruntime's defaults, not only against the CPU (onnxruntime-gpu makes no provider the default)
        base = [] if self.fp16 else [Candidate.make("ort", {"execution_provider": ep}, baseline=True) for ep in eps]
        params: list[dict] = []
        if "CUDAExecutionProvider" in eps:
            if self.fp16:
                params += [{**p, "precision": "fp16"} for p in cuda_candidates()
                           if p["graph_optimization_level"] == "all"]
            else:
                params += cuda_candidates()
        if "TensorrtExecutionProvider" in eps:
            params += tensorrt_candidates(self.fp16)
        return base + [Candidate.make("ort", p) for p in params]

    def prepare(self, cand: Candidate, workload: Workload, info: AgentInfo, cache_dir: Path) -> Prepared:
        params = dict(cand.param_dict)
        model = workload.model.path
        if params.get("precision") == "fp16" and params["execution_provider"] == "CUDAExecutionProvider":
            model = fp16_model(workload.model.path, workload.model.sha256, cache_dir)
        params.pop("precision", None)  # (the model says it; the agent runs the model it is given)
        return Prepared("ort", model, params)


def fp16_model(path: Path, sha256: str, cache_dir: Path) -> Path:
    """The model in float16 inside, float32 at its inputs and outputs (cached by content)."""
    out = cache_dir / f"fp16-keepio-{sha256[:16]}.onnx"
    if out.exists():
        return out
    try:
        import onnx
        from onnxruntime.transformers.float16 import convert_float_to_float16

        m = convert_float_to_float16(onnx.load(str(path)), keep_io_types=True)
        cache_dir.mkdir(parents=True, exist_ok=True)
        tmp = out.with_name(out.name + ".tmp")
        onnx.save(m, str(tmp))
        tmp.replace(out)
    except Exception as exc:  # the converter's own failure, as this candidate's
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise BuildFailed(f"fp16 conversion failed: {first[:300]}") from exc
    return out


SPACE = OrtGpuSpace()
FP16 = OrtGpuSpace(fp16=True)
