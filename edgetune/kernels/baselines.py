"""The baseline forms of an operator on the device (DESIGN.md §4.5: the strongest baseline, never
a handicapped one): which forms the device can run (``BaselineDevice``: onnxruntime on the native
agent, numpy, PyTorch and LiteRT on the Python agent), each built here from the operator's
``Op`` record (``baseline_forms``, through edgetune.ops.forms) and run on its agent
(``run_baseline_form``). The final rounds that race them against the kernel are
edgetune.kernels.session's."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from edgetune.agent.host import AgentClient, Job, default_workdir
from edgetune.candidate import Candidate
from edgetune.devices.inventory import DeviceSpec
from edgetune.errors import DeviceError
from edgetune.kernels import device_measure
from edgetune.kernels.search import KernelRun
from edgetune.ops import op_of
from edgetune.ops.base import FormView
from edgetune.ops.forms import half_matmul, numpy_adapter_source, op_onnx_model, op_tflite_model, torch_op_artifact

COMPILE_ALLOWANCE_S = 600.0  # what a torch.compile form's job may take beyond --timeout, to compile


@dataclass
class BaselineForm:
    """One honest form of the operator on the device: how it is run and how it is verified."""

    key: str  # ort-constant | ort-runtime | ort-cuda-constant | ort-cuda-runtime | ort-fp16-runtime |
    #            ort-cuda-fp16-runtime | numpy | torch | torch-compile | torch-cuda | torch-cuda-compile | tflite
    label: str
    candidate: Candidate
    agent: str  # "native" (the kernel's agent) | "python"
    backend: str  # the agent backend: ort | adapter | torch | tflite
    artifact: Path
    view: FormView
    params: dict[str, Any] = field(default_factory=dict)


@dataclass
class BaselineDevice:
    """What the device offers the baseline forms: onnxruntime on the native agent, and the Python
    agent (numpy, LiteRT) when the device has Python; ``*_reason`` say why a runtime is missing."""

    native_ort: bool = False
    native_ort_reason: str = ""
    python: Any = None  # an AgentClient on the Python agent, or None
    python_info: Any = None
    python_reason: str = ""
    num_threads: int = 1

    @property
    def tflite(self) -> bool:
        return self.python_info is not None and bool(self.python_info.runtimes.get("tflite"))

    @property
    def gpus(self) -> list:
        """The device's NVIDIA GPUs (its Python agent's fingerprint)."""
        fp = getattr(self.python_info, "fingerprint", None)
        g = fp.get("gpus") if isinstance(fp, dict) else None
        return g if isinstance(g, list) else []

    @property
    def torch(self) -> str | None:
        """The device's PyTorch version (Python agent), or None."""
        return self.python_info.runtimes.get("torch") if self.python_info is not None else None

    @property
    def torch_cuda(self) -> bool:
        """The device's PyTorch reaches its GPU (a CUDA build, a driver)."""
        return bool(self.torch) and bool(self.python_info.runtimes.get("torch_cuda"))

    @property
    def ort_cuda(self) -> bool:
        """The device's onnxruntime (Python agent) has the CUDA execution provider."""
        have = self.python_info.runtimes.get("onnxruntime_providers") if self.python_info is not None else None
        return isinstance(have, list) and "CUDAExecutionProvider" in have


def baseline_forms(w, weights: Mapping[int, np.ndarray], workdir: Path,
                   dev: BaselineDevice) -> tuple[list[BaselineForm], list[dict[str, Any]]]:
    """Every honest form of operator ``w`` the device can run, built here into ``workdir``, and the
    forms that cannot run (``{"form","label","status":"unavailable","reason"}``). The constant-weight
    forms hold exactly ``weights`` (the values the kernel receives in every final round)."""
    forms: list[BaselineForm] = []
    skipped: list[dict[str, Any]] = []
    op = getattr(w, "op", None)
    tag = hashlib.sha256(w.key().encode()).hexdigest()[:12]

    def skip(key, label, reason):
        skipped.append({"form": key, "label": label, "status": "unavailable", "reason": reason})

    if op is None:
        reason = "no one-node form (fused task)"
        for key, label in (("ort-constant", "onnxruntime, constant weights"),
                           ("ort-runtime", "onnxruntime, runtime weights"), ("numpy", "numpy"),
                           ("torch", "PyTorch"), ("tflite", "LiteRT/XNNPACK")):
            skip(key, label, reason)
        return forms, skipped

    # onnxruntime, on the native agent (the kernel's own agent: same process model); on a GPU device
    # also onnxruntime's CUDA provider (cuBLAS / cuDNN underneath) on the Python agent: inputs and
    # outputs in GPU memory (io_binding "device": inputs uploaded before the timed run, the run
    # synchronized), TF32 off (an fp32 operator is held to fp32 and so is its baseline)
    cuda = {"execution_provider": "CUDAExecutionProvider", "io_binding": "device", "provider_options": {"use_tf32": "0"}}
    ort_forms = [("ort-constant", "onnxruntime, constant weights", dict(weights), "constant", "native", {}),
                 ("ort-runtime", "onnxruntime, runtime weights", {}, "runtime", "native", {})]
    # float16 operands: the forms above widen them (a float32 GEMM, as the op's float32 output asks);
    # the float16 MatMul with float16 output is raced too. On a GPU that is cuBLAS's tensor-core GEMM,
    # the one a float16 kernel must beat (a widened float32 GEMM with TF32 off is no baseline for
    # tensor cores). Its output is rounded to float16: verified at float16's tolerance, and it
    # writes half the bytes the kernel writes, so it can only make the comparison harder.
    half = half_matmul(w)
    half_forms = [("ort-fp16-runtime", "onnxruntime float16 MatMul (float16 output), runtime weights", {}, "runtime",
                   "native", {})] if half else []
    if dev.gpus:  # (a CPU device: no GPU forms, and nothing to say about them)
        ort_forms += [("ort-cuda-constant", "onnxruntime CUDA (cuBLAS/cuDNN), constant weights", dict(weights),
                       "constant", "python", cuda),
                      ("ort-cuda-runtime", "onnxruntime CUDA (cuBLAS/cuDNN), runtime weights", {}, "runtime",
                       "python", cuda)]
        if half:
            half_forms.append(("ort-cuda-fp16-runtime", "onnxruntime CUDA float16 MatMul (cuBLAS tensor cores, "
                               "float16 output), runtime weights", {}, "runtime", "python", cuda))
    for (key, label, consts, kind, agent, params), fp16_out in ([(f, False) for f in ort_forms]
                                                                 + [(f, True) for f in half_forms]):
        if kind == "constant" and not weights:
            skip(key, label, f"{op} has no weight operand (every input is an activation)")
            continue
        if agent == "native" and not dev.native_ort:
            skip(key, label, dev.native_ort_reason or "no onnxruntime on the device")
            continue
        if agent == "python" and not dev.ort_cuda:
            skip(key, label, "the device's onnxruntime has no CUDAExecutionProvider (onnxruntime-gpu)")
            continue
        model = op_onnx_model(w, consts, half_output=fp16_out)
        if model is None:
            skip(key, label, f"no ONNX form of {op}")
            continue
        path = workdir / f"{tag}-{key}.onnx"
        path.write_bytes(model.SerializeToString())
        cand = {"weights": kind, **params, **({"output": "float16"} if fp16_out else {})}
        forms.append(BaselineForm(key, label, Candidate.make("ort", cand, baseline=True), agent, "ort", path,
                                  FormView(w, consts, tag=key, out_dtype="float16" if fp16_out else None),
                                  dict(params)))

    # numpy/BLAS, as a generated adapter on the Python agent
    src = numpy_adapter_source(w)
    if dev.python is None:
        skip("numpy", "numpy", dev.python_reason or "no Python agent on the device")
    elif src is None:
        skip("numpy", "numpy", f"no numpy form of {op}")
    else:
        path = workdir / f"{tag}-numpy.py"
        path.write_text(src)
        forms.append(BaselineForm("numpy", "numpy (float32, BLAS)",
                                  Candidate.make("numpy", {"weights": "runtime", "via": "adapter"}, baseline=True),
                                  "python", "adapter", path, FormView(w, {}, tag="numpy")))

    # PyTorch (where the device has it): eager ATen (oneDNN/BLAS on the CPU, cuBLAS/cuDNN on a GPU,
    # preallocated outputs where the op has an out= form) and torch.compile (inductor). A float16
    # matmul returns float16, like the float16 ONNX forms (verified at float16's tolerance).
    # On the CPU, torch.compile of one matmul or convolution calls the same oneDNN/BLAS routine as
    # eager PyTorch, which is raced: that form is said, not raced (a cold compile costs seconds).
    torch_forms = [("torch", "PyTorch eager (ATen: oneDNN/BLAS)", "cpu", ""),
                   ("torch-compile", "PyTorch torch.compile (inductor)", "cpu",
                    "default" if op_of(w).inductor_cpu else None)]
    if dev.gpus:
        torch_forms += [("torch-cuda", "PyTorch eager CUDA (cuBLAS/cuDNN)", "cuda", ""),
                        ("torch-cuda-compile", "PyTorch torch.compile CUDA (inductor max-autotune: Triton "
                         "templates and cuBLAS, the fastest it measured)", "cuda", "max-autotune-no-cudagraphs")]
    src = torch_op_artifact(w)
    for key, label, device, mode in torch_forms:
        if half:
            label += ", float16 output"
        if dev.python is None:
            skip(key, label, dev.python_reason or "no Python agent on the device")
        elif not dev.torch:
            skip(key, label, "no PyTorch on the device")
        elif device == "cuda" and not dev.torch_cuda:
            skip(key, label, f"the device's PyTorch {dev.torch} has no CUDA (a CPU build, or no driver)")
        elif src is None:
            skip(key, label, f"no PyTorch form of {op}")
        elif mode is None:
            skip(key, label, f"on the CPU, torch.compile of one {op} calls the same oneDNN/BLAS routine as "
                             "eager PyTorch, which is raced")
        else:
            path = workdir / f"{tag}-torch.json"
            path.write_text(src)
            params = {"device": device, "compile": mode, **({"num_threads": dev.num_threads} if device == "cpu" else {})}
            cand = {"weights": "runtime", **params, **({"output": "float16"} if half else {})}
            forms.append(BaselineForm(key, label, Candidate.make("torch", cand, baseline=True), "python", "torch",
                                      path, FormView(w, {}, tag=key, out_dtype="float16" if half else None), params))

    # LiteRT with its default XNNPACK delegate, from a .tflite written here
    label = "LiteRT/XNNPACK"
    if dev.python is None:
        skip("tflite", label, dev.python_reason or "no Python agent on the device")
    elif not dev.tflite:
        skip("tflite", label, "no LiteRT (ai_edge_litert / tflite_runtime) on the device")
    else:
        try:
            built = op_tflite_model(w, weights)
        except ImportError as exc:
            built, why = None, f"cannot write .tflite here ({exc})"
        else:
            why = f"no TFLite form of {op}" + (f" with {w.dtype} operands" if getattr(w, "dtype", "float32") != "float32"
                                                 else "")
        if built is None:
            skip("tflite", label, why)
        else:
            data, view = built
            path = workdir / f"{tag}-tflite.tflite"
            path.write_bytes(data)
            kind = "constant" if weights else "runtime"
            layout = "NHWC" if view.in_perm else "as kernel"
            forms.append(BaselineForm("tflite", f"LiteRT/XNNPACK, {kind} weights" + (", NHWC" if view.in_perm else ""),
                                      Candidate.make("tflite", {"weights": kind, "layout": layout,
                                                                "num_threads": dev.num_threads}, baseline=True),
                                      "python", "tflite", path, view, {"num_threads": dev.num_threads}))
    return forms, skipped


def _python_agent(spec, transport, num_threads: int) -> tuple[Any, Any, str]:
    """(client, info, "") on the device's Python agent (own work dir, sharing the kernel agent's
    connection), or (None, None, why not)."""
    if spec.options.get("native"):
        return None, None, "the device is configured native-only (no Python agent)"
    base = default_workdir(spec)
    pspec = DeviceSpec(spec.name, spec.url, {**spec.options, "workdir": base.rstrip("/") + "-kbase"})
    client = AgentClient(pspec, transport=transport)
    try:
        probe = transport.run([client._python(), "-c", "import numpy, sys; print(sys.version_info[0])"],  # noqa: SLF001
                              timeout=60)
        if not (probe.ok and probe.text().strip() == "3"):
            return None, None, "no Python with numpy on the device"
        info = client.provision()
    except DeviceError as exc:
        return None, None, f"Python agent unavailable: {exc}"
    if info.agent != "python":
        return None, None, "no Python agent on the device"
    return client, info, ""


def baseline_device(cfg, spec, measure, info, workloads) -> BaselineDevice:
    """What the device offers the baseline forms (the Python agent is provisioned only when an
    operator workload could use it)."""
    n = measure.num_threads
    if not cfg.baseline:
        return BaselineDevice(False, "--no-baseline", None, None, "--no-baseline", n)
    ort = bool(info.runtimes.get("onnxruntime"))
    dev = BaselineDevice(ort, "" if ort else "no onnxruntime on the device", num_threads=n)
    if not any(getattr(w, "op", None) for w in workloads):
        dev.python_reason = "no one-node form (fused task)"
        return dev
    dev.python, dev.python_info, dev.python_reason = _python_agent(measure.device_spec, measure.client.transport, n)
    return dev


def close_baseline_agent(dev: BaselineDevice) -> None:
    """Remove the baseline artifacts and job dirs from the device (its connection is the kernel
    agent's, closed with it)."""
    c = dev.python
    if c is None:
        return
    try:
        w = c.workdir
        c.transport.run(["rm", "-rf", f"{w}/artifacts", f"{w}/jobs"], timeout=60)
        c.transport.run(["mkdir", "-p", f"{w}/artifacts", f"{w}/jobs"], timeout=60)
    except Exception:  # noqa: BLE001 - best effort on the way out
        pass


def run_baseline_form(form: BaselineForm, form_inputs: list[np.ndarray], measure, dev: BaselineDevice, cfg):
    """Run one baseline form on its agent: (JobResult or None, KernelRun in the form's terms)."""
    view = form.view
    # a torch.compile form compiles when its job loads (max-autotune on a GPU: minutes for a big
    # GEMM the first time, then from the agent's cache); that is not a hang, and never timed
    timeout = cfg.timeout_s + (COMPILE_ALLOWANCE_S if form.params.get("compile") else 0.0)
    job = Job(backend=form.backend, artifact=form.artifact, params=dict(form.params),
              input_names=[s.name for s in view.inputs], input_sets=[[x.copy() for x in form_inputs]],
              output_specs=[s.as_json() for s in view.outputs], budget_ms=cfg.budget_ms,
              warmup_ms=min(50.0, max(5.0, cfg.budget_ms / 5)), max_iters=20_000, timeout_s=timeout)
    if form.agent == "native":
        jr = measure.run_job(job)  # DeviceError propagates: the kernel's own device is gone
    else:
        try:
            jr = dev.python.run_job(job)
        except DeviceError as exc:
            return None, KernelRun("error", f"Python agent: {exc}")
    # device_measure.job_to_kernel_run looked up per call (the baseline tests substitute it)
    return jr, device_measure.job_to_kernel_run(jr, form_inputs, view.outputs)

