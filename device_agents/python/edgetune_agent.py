#!/usr/bin/env python3
"""edgetune device agent (Python), protocol 3 — see device_agents/PROTOCOL.md.

Runs ON the device. Standard library + numpy + whichever runtime the job names (onnxruntime,
ai_edge_litert / tflite_runtime, tvm). It never sees a reference output: it runs, times and returns
raw outputs; the host decides whether they are right. ``run-stdio`` runs the job in a worker
process under a supervisor that bounds its memory, processes, time and output (PROTOCOL.md
"The supervisor").
"""

import errno
import hashlib
import json
import os
import platform
import re
import signal
import stat
import sys
import time

PROTOCOL = 3
AGENT = "python"
AGENT_VERSION = "2.6.0"
M64 = (1 << 64) - 1
_WORKER_PID = None  # the process running the job: a candidate's forked child never writes its files


# ---------------------------------------------------------------------------------------- helpers
def _read(path, default=None):
    try:
        with open(path, "r", errors="replace") as f:
            return f.read().strip()
    except OSError:
        return default


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def sha256_array(arr):
    import numpy as np

    return hashlib.sha256(np.ascontiguousarray(arr).tobytes()).hexdigest()


def _num(text):
    """A number nvidia-smi printed (nounits), or None for [N/A], [Not Supported], ..."""
    try:
        v = float(text)
    except ValueError:
        return None
    return int(v) if v.is_integer() else v


NVIDIA_SMI_QUERY = "name,compute_cap,driver_version,memory.total,clocks.max.sm,clocks.max.mem,pci.bus_id"


def parse_nvidia_smi(text, cuda_driver=None):
    """The GPUs of ``nvidia-smi --query-gpu=NVIDIA_SMI_QUERY --format=csv,noheader,nounits``:
    name, SM version (compute capability 9.0 -> sm_90), driver, memory (MiB), max SM and memory
    clocks (MHz), PCI bus; ``cuda_driver``: the CUDA version the driver supports (libcuda)."""
    out = []
    for line in text.splitlines():
        f = [x.strip() for x in line.split(",")]
        if len(f) != 7 or not f[0]:
            continue
        cap = f[1].split(".")
        sm = "sm_%s%s" % (cap[0], cap[1]) if len(cap) == 2 and cap[0].isdigit() and cap[1].isdigit() else None
        out.append({"name": f[0], "sm": sm, "driver": f[2], "memory_mib": _num(f[3]), "max_sm_clock_mhz": _num(f[4]),
                    "max_mem_clock_mhz": _num(f[5]), "pci_bus": f[6], "cuda_driver": cuda_driver})
    return out


def _cuda_version(lib, fn):
    """A CUDA library's version call (cuDriverGetVersion, cudaRuntimeGetVersion) as "13.0", or None."""
    import ctypes

    try:
        v = ctypes.c_int(0)
        if getattr(ctypes.CDLL(lib), fn)(ctypes.byref(v)) != 0 or v.value <= 0:
            return None
        return "%d.%d" % (v.value // 1000, (v.value % 1000) // 10)
    except (OSError, AttributeError):
        return None


def gpus():
    """This device's NVIDIA GPUs (nvidia-smi), [] when it has none or no driver."""
    import shutil
    import subprocess

    exe = shutil.which("nvidia-smi")
    if exe is None:
        return []
    try:
        text = subprocess.run([exe, "--query-gpu=" + NVIDIA_SMI_QUERY, "--format=csv,noheader,nounits"],
                              capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    import ctypes.util

    found = parse_nvidia_smi(text, _cuda_version("libcuda.so.1", "cuDriverGetVersion"))
    cudart = ctypes.util.find_library("cudart")  # the CUDA runtime on the library path, if any
    for g in found:
        g["cuda_runtime"] = _cuda_version(cudart, "cudaRuntimeGetVersion") if cudart else None
    return found


def fingerprint():
    cpuinfo = _read("/proc/cpuinfo", "") or ""
    model = None
    hardware = None
    parts = set()
    for line in cpuinfo.splitlines():
        key, _, val = line.partition(":")
        key, val = key.strip().lower(), val.strip()
        if key in ("model name", "cpu model", "processor") and model is None and val and not val.isdigit():
            model = val
        elif key == "hardware":
            hardware = val
        elif key == "cpu part":
            parts.add(val)
    if model is None and parts:
        model = "ARM CPU part " + "/".join(sorted(parts))
    cores = os.cpu_count() or 1
    freqs = []
    for i in range(cores):
        f = _read("/sys/devices/system/cpu/cpu%d/cpufreq/cpuinfo_max_freq" % i)
        if f and f.isdigit():
            freqs.append(int(f))
    os_name = None
    rel = _read("/etc/os-release")
    if rel:
        for line in rel.splitlines():
            if line.startswith("PRETTY_NAME="):
                os_name = line.split("=", 1)[1].strip('"')
    fp = {
        "cpu_model": model or platform.processor() or platform.machine(),
        "soc": hardware,
        "cores": cores,
        "max_freq_khz": freqs,
        "kernel": platform.release(),
        "os": os_name or platform.platform(),
        "governor": _read("/sys/devices/system/cpu/cpu0/cpufreq/scaling_governor"),
        "emulated": os.environ.get("EDGETUNE_EMULATED") or None,
    }
    found = gpus()
    if found:  # only a device with GPUs has the key: a CPU device's fingerprint stays what it was
        fp["gpus"] = found
    return fp


def device_state():
    freqs = []
    for i in range(os.cpu_count() or 1):
        f = _read("/sys/devices/system/cpu/cpu%d/cpufreq/scaling_cur_freq" % i)
        if f and f.isdigit():
            freqs.append(int(f))
    temp = None
    t = _read("/sys/class/thermal/thermal_zone0/temp")
    if t and t.lstrip("-").isdigit():
        temp = int(t)
    try:  # the host scales job time limits by the load the device is under
        load1 = round(os.getloadavg()[0], 2)
    except OSError:
        load1 = None
    return {"freq_khz": freqs or None, "temp_mc": temp, "load1": load1, "cpus": os.cpu_count() or 1}


# CPU feature flags (x86 "flags", ARM "Features" in /proc/cpuinfo) -> the arithmetic they give natively
CPU_PRECISION_FLAGS = (
    ("bf16", ("avx512_bf16", "amx_bf16", "bf16")),  # x86 AVX512-BF16/AMX, ARMv8.6 BF16
    ("fp16", ("avx512_fp16", "amx_fp16", "asimdhp")),  # x86 AVX512-FP16, ARMv8.2 half-precision SIMD
    ("int8-dot", ("avx512_vnni", "avx_vnni", "asimddp")),  # VNNI, ARM dot-product
    ("int8-matmul", ("amx_int8", "i8mm")),  # AMX tiles, ARM int8 matrix multiply
)


def cpu_precisions():
    """What this CPU computes natively besides fp32, from its feature flags."""
    flags = set()
    for line in (_read("/proc/cpuinfo", "") or "").splitlines():
        key, _, val = line.partition(":")
        if key.strip().lower() in ("flags", "features"):
            flags.update(val.split())
    return ["fp32"] + [name for name, any_of in CPU_PRECISION_FLAGS if flags & set(any_of)]


def runtimes():
    out = {}
    try:
        import numpy

        out["numpy"] = numpy.__version__
    except Exception:
        pass
    try:
        import onnxruntime

        out["onnxruntime"] = onnxruntime.__version__
        out["onnxruntime_providers"] = onnxruntime.get_available_providers()
    except Exception:
        pass
    for mod, name in (("ai_edge_litert", "tflite"), ("tflite_runtime", "tflite")):
        if name in out:
            break
        try:
            m = __import__(mod)
            out[name] = getattr(m, "__version__", "unknown")
            out["tflite_module"] = mod
        except Exception:
            pass
    try:
        openvino = import_openvino()
        core = openvino.Core()
        out["openvino"] = openvino.__version__.split("-")[0]
        out["openvino_devices"] = list(core.available_devices)
        if "CPU" in core.available_devices:
            out["openvino_cpu_capabilities"] = list(core.get_property("CPU", "OPTIMIZATION_CAPABILITIES"))
            # the precision OpenVINO computes in when a user sets nothing (bf16 on CPUs with bf16 units)
            out["openvino_cpu_default_precision"] = [ov_precision_name(core.get_property("CPU", "INFERENCE_PRECISION_HINT"))]
    except Exception:
        pass
    out["cpu_precisions"] = cpu_precisions()
    try:  # importing tvm takes ~1 s: look it up instead
        import importlib.metadata
        import importlib.util

        if importlib.util.find_spec("tvm") is not None:
            try:
                out["tvm"] = importlib.metadata.version("apache-tvm")
            except importlib.metadata.PackageNotFoundError:
                out["tvm"] = "unknown"
        if importlib.util.find_spec("torch") is not None:  # (importing torch takes ~1 s: looked up too)
            try:
                out["torch"] = importlib.metadata.version("torch")
            except importlib.metadata.PackageNotFoundError:
                out["torch"] = "unknown"
            import shutil

            if shutil.which("nvidia-smi"):  # a GPU device only: can this torch reach it (CUDA build)?
                try:
                    import torch

                    out["torch_cuda"] = torch.version.cuda if torch.cuda.is_available() else None
                except Exception:
                    out["torch_cuda"] = None
    except Exception:
        pass
    return out


def backend_versions(backend):
    """Versions of what this job uses only (importing every runtime would cost seconds per job)."""
    import numpy

    out = {"numpy": numpy.__version__}
    mods = {"ort": ("onnxruntime",), "tflite": ("ai_edge_litert", "tflite_runtime"), "tvm-relax": ("tvm",),
            "tvm-kernel": ("tvm",), "torch": ("torch",), "openvino": ("openvino",)}
    sys.modules.setdefault("openvino_telemetry", None)  # (see import_openvino)
    for mod in mods.get(backend, ()):
        try:
            out[mod] = getattr(__import__(mod), "__version__", "unknown")
            break
        except Exception:
            continue
    return out


def cmd_info():
    info = {
        "protocol": PROTOCOL,
        "agent": AGENT,
        "agent_version": AGENT_VERSION,
        "arch": platform.machine(),
        "python": platform.python_version(),
        "runtimes": runtimes(),
        "fingerprint": fingerprint(),
    }
    sys.stdout.write(json.dumps(info) + "\n")
    return 0


# --------------------------------------------------------------------------------------- backends
# the memory an execution provider's inputs and outputs live in, for io_binding "device"
DEVICE_MEMORY = {"CUDAExecutionProvider": "cuda", "TensorrtExecutionProvider": "cuda"}


# the shared library onnxruntime loads for a provider it does not build in
PROVIDER_LIBS = {"CUDAExecutionProvider": "libonnxruntime_providers_cuda.so",
                 "TensorrtExecutionProvider": "libonnxruntime_providers_tensorrt.so",
                 "OpenVINOExecutionProvider": "libonnxruntime_providers_openvino.so"}


_PRELOADED = []


def preload_provider_libraries(ort):
    """onnxruntime-gpu's provider library finds CUDA and cuDNN on the loader's path only; installed as
    its extras (`pip install 'onnxruntime-gpu[cuda,cudnn]'`: NVIDIA's wheels) they are loaded first by
    onnxruntime.preload_dlls(), as onnxruntime's own instructions have a program do. Once per process;
    what it prints (on stdout, the agent's protocol channel) is kept out of the answer."""
    if _PRELOADED or not hasattr(ort, "preload_dlls"):
        return
    _PRELOADED.append(True)
    import contextlib
    import io

    with contextlib.redirect_stdout(io.StringIO()):
        try:
            ort.preload_dlls()
        except Exception:  # nothing to preload: the provider's own load says what is missing
            pass


def provider_load_error(ort, provider):
    """Why onnxruntime could not use PROVIDER, in one line: what the dynamic loader says of the
    provider's library (onnxruntime only logs it), or that this build does not have it."""
    if provider not in ort.get_available_providers():
        return "this build has no %s; it has %s" % (provider, ", ".join(ort.get_available_providers()))
    lib = PROVIDER_LIBS.get(provider)
    if lib is None:
        return "the provider is built in, and it refused this model or its options"
    path = os.path.join(os.path.dirname(os.path.abspath(ort.__file__)), "capi", lib)
    if not os.path.exists(path):
        return "%s is not installed" % lib
    import ctypes

    try:
        ctypes.CDLL(path)
    except OSError as exc:
        return str(exc)[:300]
    return "%s loads; the provider refused the session (its log has why)" % lib


def open_ort_session(ort, model, so, provider, providers):
    """(session, None), or (None, why) when the session came up without PROVIDER: onnxruntime falls
    back to the CPU without a word when the provider cannot load (the libraries it needs missing),
    and timing it would time the CPU under the provider's name. NVIDIA's wheels are preloaded first."""
    if provider in PROVIDER_LIBS:
        preload_provider_libraries(ort)
    sess = ort.InferenceSession(model, so, providers=providers)
    if provider not in sess.get_providers():
        return None, provider_load_error(ort, provider)
    return sess, None


class OrtBackend:
    """onnxruntime with the candidate's session options; outputs bound to NaN-poisoned buffers."""

    def __init__(self, model_path, params, input_names, outputs):
        import numpy as np
        import onnxruntime as ort

        so = self._options(ort, params, model_path)
        provider = params.get("execution_provider", "CPUExecutionProvider")
        popts = params.get("provider_options")  # e.g. CUDA: cudnn_conv_algo_search, enable_cuda_graph
        if popts is not None and (not isinstance(popts, dict) or not all(isinstance(v, str) for v in popts.values())):
            raise ValueError("provider_options must map names to strings")
        popts = dict(popts or {})
        cache = popts.get("trt_engine_cache_path")
        if cache is not None:  # TensorRT's engines: kept in the agent's work dir, across jobs (minutes to build)
            if os.path.isabs(cache) or ".." in cache.split("/"):
                raise ValueError("trt_engine_cache_path must be a relative path inside the agent's work dir")
            popts["trt_engine_cache_path"] = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                                          cache)
        self._providers = [(provider, popts)] if popts else [provider]
        self.sess, why = open_ort_session(ort, model_path, so, provider, self._providers)
        if why is not None:
            raise RuntimeError("%s did not load in this onnxruntime %s (%s)" % (provider, ort.__version__, why))
        self.np = np
        self.ort = ort
        self.input_names = input_names
        self.outputs = outputs
        self.binding = self.sess.io_binding()
        self.out_bufs = [np.empty(o["shape"], dtype=o["dtype"]) for o in outputs]
        self._bound_inputs = None
        self._model_path, self._params, self._provider = model_path, params, provider
        # io_binding "device": inputs and outputs stay in the accelerator's memory at fixed addresses
        # (what CUDA graphs need); inputs are uploaded before each run (stage), outputs read back after
        self.device = params.get("io_binding") == "device"
        if self.device:
            kind = DEVICE_MEMORY.get(provider)
            if kind is None:
                raise ValueError("io_binding 'device' needs a CUDA or TensorRT execution provider")
            self._kind = kind
            # (from copies: buffers of their own in any memory, never a view of the agent's arrays)
            self.out_vals = [ort.OrtValue.ortvalue_from_numpy(b.copy(), kind, 0) for b in self.out_bufs]
            self.in_vals = None
            self.input_check = "agent copy (uploaded to the device before each run)"

    @staticmethod
    def _options(ort, params, model_path):
        so = ort.SessionOptions()
        so.log_severity_level = 3
        lib = params.get("custom_ops_library")
        if lib is not None:
            # a hybrid model's custom-op library: a file next to the model (sha256-checked by the host)
            if not isinstance(lib, str) or os.path.basename(lib) != lib or lib in ("", ".", ".."):
                raise ValueError("custom_ops_library must be a file name next to the model")
            so.register_custom_ops_library(os.path.join(os.path.dirname(os.path.abspath(model_path)), lib))
        levels = {
            "disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
            "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
            "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
            "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
        }
        if "graph_optimization_level" in params:
            so.graph_optimization_level = levels[params["graph_optimization_level"]]
        if "intra_op_num_threads" in params:
            so.intra_op_num_threads = int(params["intra_op_num_threads"])
        if "inter_op_num_threads" in params:
            so.inter_op_num_threads = int(params["inter_op_num_threads"])
        if "execution_mode" in params:
            so.execution_mode = (ort.ExecutionMode.ORT_PARALLEL if params["execution_mode"] == "parallel"
                                 else ort.ExecutionMode.ORT_SEQUENTIAL)
        if "enable_cpu_mem_arena" in params:
            so.enable_cpu_mem_arena = bool(params["enable_cpu_mem_arena"])
        if "enable_mem_pattern" in params:
            so.enable_mem_pattern = bool(params["enable_mem_pattern"])
        for k, v in params.items():
            if k.startswith("session."):  # session config entries, e.g. session.intra_op.allow_spinning
                so.add_session_config_entry(k, str(v))
        return so

    def placement(self, inputs, jobdir):
        """Which execution provider ran each node of the optimized graph: one profiled run in a
        second session with the same options (the measured session is never profiled). onnxruntime
        places what the intended provider cannot run on the CPU provider without a word."""
        import onnxruntime as ort

        so = self._options(ort, self._params, self._model_path)
        so.enable_profiling = True
        so.profile_file_prefix = os.path.join(jobdir, "placement")
        sess = ort.InferenceSession(self._model_path, so, providers=self._providers)
        sess.run(None, dict(zip(self.input_names, inputs)))
        path = sess.end_profiling()
        try:
            with open(path, "rb") as f:
                events = json.loads(f.read().decode("utf-8"))
        finally:
            os.unlink(path)
        nodes = {}
        for ev in events if isinstance(events, list) else []:
            args = ev.get("args") if isinstance(ev, dict) else None
            if ev.get("cat") == "Node" and isinstance(args, dict) and args.get("provider"):
                name = str(ev.get("name", ""))
                for suffix in ("_kernel_time", "_fence_before", "_fence_after"):
                    if name.endswith(suffix):
                        name = name[: -len(suffix)]
                nodes[name] = str(args["provider"])
        counts = {}
        for prov in nodes.values():
            counts[prov] = counts.get(prov, 0) + 1
        return {"intended": self._provider, "nodes": counts}

    input_check = "runtime buffers"  # onnxruntime reads the agent's buffers, bound by pointer

    def stage(self, inputs):
        """io_binding "device": copy the agent's new inputs into the device buffers (same addresses)."""
        if not self.device:
            return
        if self.in_vals is None:
            self.in_vals = [self.ort.OrtValue.ortvalue_from_numpy(a.copy(), self._kind, 0) for a in inputs]
            self.binding.clear_binding_inputs()
            for name, v in zip(self.input_names, self.in_vals):
                self.binding.bind_ortvalue_input(name, v)
            self.binding.clear_binding_outputs()
            for o, v in zip(self.outputs, self.out_vals):
                self.binding.bind_ortvalue_output(o["name"], v)
        else:
            for v, a in zip(self.in_vals, inputs):
                v.update_inplace(a)

    def bind(self, inputs):
        if self.device:
            if self.in_vals is None:
                self.stage(inputs)
            return
        if self._bound_inputs is not inputs:
            self.binding.clear_binding_inputs()
            for name, arr in zip(self.input_names, inputs):
                # by pointer, no copy: the agent rewrites these buffers with fresh inputs in place
                self.binding.bind_input(name, "cpu", 0, arr.dtype, list(arr.shape), arr.ctypes.data)
            self.binding.clear_binding_outputs()
            for o, buf in zip(self.outputs, self.out_bufs):
                self.binding.bind_output(o["name"], "cpu", 0, buf.dtype, list(buf.shape), buf.ctypes.data)
            self._bound_inputs = inputs

    def poison(self):
        for buf in self.out_bufs:
            if buf.dtype.kind == "f":
                buf.fill(self.np.nan)
        if self.device:  # the device's output buffers too: a run that writes nothing shows NaN
            for v, buf in zip(self.out_vals, self.out_bufs):
                if buf.dtype.kind == "f":
                    v.update_inplace(buf)

    def run(self, inputs):
        self.bind(inputs)
        self.sess.run_with_iobinding(self.binding)
        if self.device:
            self.binding.synchronize_outputs()  # the device's work is done when the run's time ends

    def results(self):
        if self.device:
            return [v.numpy() for v in self.out_vals]
        return [b.copy() for b in self.out_bufs]

    def live(self):
        return self.out_bufs


class TfliteBackend:
    # the interpreter copies inputs into its own arena (set_tensor, every run): what it reads is that copy
    input_check = "agent copy (the interpreter copies inputs)"

    def __init__(self, model_path, params, input_names, outputs):
        import numpy as np

        try:
            from ai_edge_litert.interpreter import Interpreter, OpResolverType
        except ImportError:
            from tflite_runtime.interpreter import Interpreter, OpResolverType
        kwargs = {"model_path": model_path}
        if "num_threads" in params:
            kwargs["num_threads"] = int(params["num_threads"])
        if params.get("xnnpack") is False or params.get("xnnpack") == 0:
            kwargs["experimental_op_resolver_type"] = OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES
        self.interp = Interpreter(**kwargs)
        self.np = np
        self.in_details = self.interp.get_input_details()
        self.out_details = self.interp.get_output_details()
        self._allocated_for = None
        self._current = None
        # a converted model's layout mapping (PROTOCOL.md, tflite): request input k goes to tensor
        # inputs[k].index as x.transpose(perm); request output k is tensor outputs[k].index transposed
        # by its perm. Without one (a user's own .tflite): the model's tensors in its own order.
        self.in_map = self.out_map = None
        if "inputs" in params or "outputs" in params:
            self.in_map = [(int(m["index"]), tuple(int(x) for x in m["perm"])) for m in params["inputs"]]
            self.out_map = [(int(m["index"]), tuple(int(x) for x in m["perm"])) for m in params["outputs"]]
            if len(self.in_map) != len(input_names) or len(self.out_map) != len(outputs):
                raise ValueError("layout mapping has %d inputs and %d outputs, the request %d and %d"
                                 % (len(self.in_map), len(self.out_map), len(input_names), len(outputs)))
            self.interp.allocate_tensors()  # a converted model has static shapes
            self._allocated_for = "mapped"

    def _prepare(self, inputs):
        shapes = tuple(a.shape for a in inputs)
        if self._allocated_for != shapes:
            for d, a in zip(self.in_details, inputs):
                if tuple(d["shape"]) != a.shape:
                    self.interp.resize_tensor_input(d["index"], a.shape)
            self.interp.allocate_tensors()
            self._allocated_for = shapes
            self._current = None
        for d, a in zip(self.in_details, inputs):  # every run: the agent changes inputs in place
            self.interp.set_tensor(d["index"], a)

    def stage(self, inputs):
        """Mapped inputs are copied (transposed) into the interpreter's tensors here, outside the timed run."""
        if self.in_map is None:
            return
        for (index, perm), a in zip(self.in_map, inputs):
            self.interp.set_tensor(index, self.np.ascontiguousarray(a.transpose(perm)))

    def poison(self):
        if self._allocated_for is None:
            return
        for d in self.out_details:
            view = self.interp.tensor(d["index"])()
            if view.dtype.kind == "f":
                view.fill(self.np.nan)
            del view

    def run(self, inputs):
        if self.in_map is None:
            self._prepare(inputs)
        self.interp.invoke()

    def results(self):
        if self.out_map is not None:
            return [self.np.ascontiguousarray(self.interp.get_tensor(index).transpose(perm))
                    for index, perm in self.out_map]
        return [self.np.array(self.interp.get_tensor(d["index"])) for d in self.out_details]


def _tvm_device(tvm, params):
    """(name, TVM device) of ``params.device`` ("cpu" default, or "cuda"); raises when the device's
    TVM runtime cannot reach it."""
    device = params.get("device", "cpu")
    if device not in ("cpu", "cuda"):
        raise ValueError("params.device must be cpu or cuda")
    dev = tvm.runtime.device(device, 0)
    if not dev.exist and device == "cuda":
        why = _tvm_cuda_runtime(tvm)
        dev = tvm.runtime.device(device, 0)
        if not dev.exist:
            raise RuntimeError("this device's TVM runtime has no cuda device: %s" % why)
    if not dev.exist:
        raise RuntimeError("this device's TVM runtime has no %s device" % device)
    return device, dev


def _nvidia_wheel_libs(name):
    """NAME (a CUDA library's soname) where NVIDIA's wheels put it: site-packages/nvidia/cu13/lib
    (CUDA 13's wheels), nvidia/*/lib (CUDA 12's), on the interpreter's path."""
    import glob

    found = []
    for d in sys.path:
        if d and os.path.isdir(os.path.join(d, "nvidia")):
            found += sorted(glob.glob(os.path.join(d, "nvidia", "*", "lib", name)))
    return found


def _tvm_cuda_runtime(tvm):
    """Load TVM's CUDA runtime (tvm/lib/libtvm_runtime_cuda.so), which `import tvm` skips without a
    word when libcudart.so.13 is not on the loader's path (NVIDIA's wheels keep it in site-packages):
    libcudart from there first. Returns what the loader said when it still cannot load."""
    import ctypes

    for path in _nvidia_wheel_libs("libcudart.so.13")[:1]:
        try:
            ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
        except OSError:
            pass
    lib = os.path.join(os.path.dirname(os.path.abspath(tvm.__file__)), "lib", "libtvm_runtime_cuda.so")
    if not os.path.exists(lib):
        return "this TVM has no CUDA runtime (%s is not installed)" % os.path.basename(lib)
    try:
        ctypes.CDLL(lib, mode=ctypes.RTLD_GLOBAL)
    except OSError as exc:
        return "its CUDA runtime did not load (%s)" % str(exc)[:300]
    return "its CUDA runtime loaded and found no GPU"


def _tvm_tensor(tvm, a, dev):
    if hasattr(tvm.runtime, "tensor"):
        return tvm.runtime.tensor(a, dev)
    return tvm.nd.array(a, dev)


def _tvm_upload(tvm, tensors, arrays, dev):
    """``arrays`` in the runtime's tensors at fixed addresses: new ones the first time (tensors None),
    copied into the same ones after; returns them."""
    if tensors is None:
        return [_tvm_tensor(tvm, a, dev) for a in arrays]
    for t, a in zip(tensors, arrays):
        t.copyfrom(a)
    return tensors


class TvmRelaxBackend:
    """A Relax module exported by edgetune.build.tvm_relax, run in the TVM runtime's VM;
    ``params.device`` "cuda": the model built for the GPU, its inputs uploaded before each timed run
    (stage), the timed run ending with the device synchronized, outputs read back after it."""

    def __init__(self, model_path, params, input_names, outputs):
        import numpy as np
        import tvm
        from tvm import relax

        if "num_threads" in params:
            os.environ["TVM_NUM_THREADS"] = str(params["num_threads"])
        self.np = np
        self.tvm = tvm
        device, dev = _tvm_device(tvm, params)
        self.gpu = device == "cuda"
        if self.gpu:
            self.input_check = "agent copy (uploaded to the cuda before each run)"
        self.dev = dev
        lib = tvm.runtime.load_module(model_path)
        self.vm = relax.VirtualMachine(lib, dev)
        self.fn = self.vm["main"]
        self._cache_key = None
        self._args = None
        self._last = None

    input_check = "agent copy (the VM's tensors are copied from the agent's buffers)"

    def poison(self):
        pass  # the VM allocates outputs itself

    def stage(self, inputs):
        if not self.gpu:
            return  # (the CPU: copied in the timed run, as the VM's own inputs would be)
        self._args = _tvm_upload(self.tvm, self._args, inputs, self.dev)
        self.dev.sync()

    def run(self, inputs):
        if self.gpu:
            self._last = self.fn(*self._args)
            self.dev.sync()  # the device's work is done when the run's time ends
            return
        # every run: the agent changes inputs in place
        self._args = _tvm_upload(self.tvm, self._args if self._cache_key is inputs else None, inputs, self.dev)
        self._cache_key = inputs
        self._last = self.fn(*self._args)

    def results(self):
        out = self._last
        items = list(out) if isinstance(out, (list, tuple)) or type(out).__name__ in ("Array", "ArrayObj") else [out]
        return [self.np.array(o.numpy()) for o in items]


class TvmKernelBackend:
    """A TVM-exported kernel (edgetune tune-kernels' artifacts: entry ``main``, inputs then outputs)
    through the device's TVM runtime, on ``params.device`` "cpu" or "cuda" (edgetune tune-kernels
    --gpu). Its tensors are the runtime's own at fixed addresses: each new input is copied in before
    the timed run (stage), outputs are poisoned where they live and read back after it; on a GPU,
    2 x 128 MiB are copied on the device before each run (no run finds its data in L2) and the
    timed run ends with the device synchronized."""

    FLUSH_BYTES = 128 << 20

    def __init__(self, model_path, params, input_names, outputs):
        import numpy as np
        import tvm

        if "num_threads" in params:
            os.environ["TVM_NUM_THREADS"] = str(params["num_threads"])
        self.np, self.tvm = np, tvm
        device, self.dev = _tvm_device(tvm, params)
        lib = tvm.runtime.load_module(model_path)
        self.fn = lib[params.get("entry", "main")]
        self._lib = lib
        self.outputs = outputs
        self.outs = [_tvm_tensor(tvm, np.full(o["shape"], np.nan, o["dtype"]), self.dev) for o in outputs]
        self.ins = None
        self._flush = None
        if device == "cuda":
            half = np.zeros(self.FLUSH_BYTES // 4, np.float32)
            self._flush = (_tvm_tensor(tvm, half, self.dev), _tvm_tensor(tvm, half, self.dev))
        self.input_check = ("agent copy (uploaded to the %s before each run)" % device)

    def stage(self, inputs):
        self.ins = _tvm_upload(self.tvm, self.ins, inputs, self.dev)
        if self._flush is not None:
            self._flush[0].copyto(self._flush[1])
        self.dev.sync()

    def poison(self):
        for t, o in zip(self.outs, self.outputs):
            if self.np.dtype(o["dtype"]).kind == "f":
                t.copyfrom(self.np.full(o["shape"], self.np.nan, o["dtype"]))
        self.dev.sync()

    def run(self, inputs):
        self.fn(*self.ins, *self.outs)
        self.dev.sync()  # the device's work is done when the run's time ends

    def results(self):
        return [self.np.array(t.numpy()) for t in self.outs]

    def live(self):
        return self.results()


OV_PRECISIONS = {"fp32": "f32", "bf16": "bf16", "fp16": "f16"}  # candidate name -> INFERENCE_PRECISION_HINT
OV_HINTS = {"latency": "LATENCY", "throughput": "THROUGHPUT"}


def import_openvino():
    """OpenVINO without its telemetry: ``import openvino`` sends a usage event to an analytics
    service unless a consent file says no; with openvino_telemetry unimportable it uses its stub."""
    sys.modules.setdefault("openvino_telemetry", None)
    import openvino

    return openvino


def ov_precision_name(value):
    """OpenVINO's element type (e.g. <Type: 'bfloat16'>) as a candidate's precision name."""
    name = getattr(value, "get_type_name", lambda: str(value))()
    return {"f32": "fp32", "bf16": "bf16", "f16": "fp16"}.get(name, name)


class OpenvinoBackend:
    """OpenVINO on an ONNX model (or an int8 QDQ one), reshaped to the job's static shapes and
    compiled with only the properties the candidate sets (none: the runtime's own default). Inputs
    and outputs are tensors over the agent's buffers, bound by pointer; ``info`` says the precision
    and streams the compiled model actually uses, which the host checks against the candidate."""

    input_check = "runtime buffers"  # the input tensors share the agent's arrays (shared_memory)

    def __init__(self, model_path, params, input_names, outputs):
        import numpy as np

        ov = import_openvino()
        core = ov.Core()
        model = core.read_model(model_path)
        shapes = params.get("shapes") or {}
        if shapes:  # static shapes compile to faster code than dynamic ones: what a deployment does
            model.reshape({name: ov.PartialShape([int(d) for d in dims]) for name, dims in shapes.items()})
        config = {}
        if "precision" in params:
            config["INFERENCE_PRECISION_HINT"] = OV_PRECISIONS[params["precision"]]
        if "hint" in params:
            config["PERFORMANCE_HINT"] = OV_HINTS[params["hint"]]
        if "threads" in params:
            config["INFERENCE_NUM_THREADS"] = int(params["threads"])
        if "streams" in params:
            config["NUM_STREAMS"] = int(params["streams"])
        if "pinning" in params:
            config["ENABLE_CPU_PINNING"] = bool(params["pinning"])
        device = params.get("device", "CPU")
        if device not in core.available_devices:
            raise RuntimeError("OpenVINO %s has no %s device (it has: %s)"
                               % (ov.__version__, device, ", ".join(core.available_devices)))
        self.compiled = core.compile_model(model, device, config)
        self.request = self.compiled.create_infer_request()
        self.ov, self.np = ov, np
        self.input_names = list(input_names)
        ports = {p.get_any_name(): i for i, p in enumerate(self.compiled.inputs)}
        missing = [n for n in self.input_names if n not in ports]
        if missing:
            raise ValueError("the model has no input %s" % ", ".join(missing))
        self._in_ports = [ports[n] for n in self.input_names]
        self.out_bufs = [np.empty(o["shape"], dtype=o["dtype"]) for o in outputs]
        for o, buf in zip(self.compiled.outputs, self.out_bufs):
            if tuple(o.get_partial_shape().to_shape()) != buf.shape:
                raise ValueError("output %s has shape %s, the reference %s"
                                 % (o.get_any_name(), list(o.get_partial_shape().to_shape()), list(buf.shape)))
        for i, buf in enumerate(self.out_bufs):  # results land in the agent's (poisoned) buffers
            self.request.set_output_tensor(i, ov.Tensor(buf, shared_memory=True))
        self._bound_inputs = None
        self.info = {"inference_precision": ov_precision_name(self.compiled.get_property("INFERENCE_PRECISION_HINT")),
                     "performance_hint": str(self.compiled.get_property("PERFORMANCE_HINT")),
                     "streams": int(self.compiled.get_property("NUM_STREAMS")),
                     "threads": int(self.compiled.get_property("INFERENCE_NUM_THREADS")),
                     "device": device}

    def run(self, inputs):
        if self._bound_inputs is not inputs:  # by pointer: the agent rewrites these arrays in place
            for port, arr in zip(self._in_ports, inputs):
                self.request.set_input_tensor(port, self.ov.Tensor(arr, shared_memory=True))
            self._bound_inputs = inputs
        self.request.infer()

    def poison(self):
        for buf in self.out_bufs:
            if buf.dtype.kind == "f":
                buf.fill(self.np.nan)

    def results(self):
        return [b.copy() for b in self.out_bufs]

    def live(self):
        return self.out_bufs


class AdapterBackend:
    """A user-supplied Python adapter (e.g. a vendor NPU runtime): the artifact is a .py file
    defining load(model_path, params) -> callable(list[np.ndarray]) -> list[np.ndarray]."""

    def __init__(self, model_path, params, input_names, outputs, adapter_path=None):
        import importlib.util

        spec = importlib.util.spec_from_file_location("edgetune_adapter", adapter_path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        self.fn = mod.load(model_path, params)
        self._last = None
        import numpy as np

        self.np = np

    input_check = "runtime buffers"  # the adapter gets the agent's arrays themselves

    def poison(self):
        pass

    def run(self, inputs):
        # materialised inside the timed region: a lazily computed result pays for itself here
        self._last = [self.np.asarray(o) for o in self.fn(inputs)]

    def results(self):
        return [self.np.array(o) for o in self._last]

    def live(self):
        return self._last


def _keep_freed_memory():
    """glibc only: freed memory stays with the process (no trimming of the heap's top, no mmap for
    big blocks). PyTorch's CPU operators allocate and free their temporaries on every call; with
    glibc's defaults each call can take them back from the OS page by page, depending on the heap's
    state: a 3x3 depthwise convolution (C=144, 56x56) ran at 1.77 ms with 1,290 page faults per call,
    173 us with none once this was set (measured). A deployment tunes its allocator so; the baseline
    is not held to the default."""
    import ctypes

    if platform.libc_ver()[0] != "glibc":
        return
    try:
        libc = ctypes.CDLL(None)
        libc.mallopt(-1, 1 << 30)  # M_TRIM_THRESHOLD
        libc.mallopt(-3, 32 << 20)  # M_MMAP_THRESHOLD (glibc's largest on 64-bit)
    except (OSError, AttributeError):
        pass


TORCH_OPS = ("gemm", "batch_matmul", "conv2d_nchw", "depthwise_conv2d_nchw", "conv2d_nhwc", "softmax", "layernorm",
             "attention")


def torch_program(torch, device, op, P):
    """PyTorch's form of operator ``op`` (edgetune's operator kinds, parameters ``P``):
    forward(xs, outs) -> [tensor], writing into the preallocated ``outs`` where ATen has an out=
    form (``outs`` None under torch.compile: its own buffers). Layouts are the operator's own."""
    F = torch.nn.functional
    if op == "gemm":
        def forward(xs, outs):
            return [torch.mm(xs[0], xs[1], out=outs[0]) if outs is not None else torch.mm(xs[0], xs[1])]
    elif op == "batch_matmul":
        def forward(xs, outs):
            b = xs[1].transpose(1, 2) if P["TB"] else xs[1]
            return [torch.bmm(xs[0], b, out=outs[0]) if outs is not None else torch.bmm(xs[0], b)]
    elif op in ("conv2d_nchw", "depthwise_conv2d_nchw"):
        groups = int(P["C"]) if op == "depthwise_conv2d_nchw" else 1

        def forward(xs, outs):
            return [F.conv2d(xs[0], xs[1], stride=int(P["stride"]), padding=int(P["pad"]), groups=groups)]
    elif op == "conv2d_nhwc":
        def forward(xs, outs):
            # NHWC activations are NCHW in channels_last, HWIO weights OIHW; the output NHWC again
            x = xs[0].permute(0, 3, 1, 2)
            w = xs[1].permute(3, 2, 0, 1).contiguous(memory_format=torch.channels_last)
            return [F.conv2d(x, w, stride=int(P["stride"]), padding=int(P["pad"])).permute(0, 2, 3, 1)]
    elif op == "softmax":
        def forward(xs, outs):
            return [torch.softmax(xs[0], dim=-1)]
    elif op == "layernorm":
        def forward(xs, outs):
            return [F.layer_norm(xs[0], (xs[0].shape[-1],), xs[1], xs[2], eps=float(P["eps"]))]
    elif op == "attention":
        s, l_ = int(P["S"]), int(P["L"])
        # causal: query i sees key j <= i + (L - S) (SDPA's own is_causal is that when S == L)
        keep = (torch.arange(l_, device=device)[None, :] <= torch.arange(s, device=device)[:, None] + (l_ - s)) \
            if P["causal"] and s != l_ else None

        def forward(xs, outs):
            q, k, v = xs
            if keep is not None:
                return [F.scaled_dot_product_attention(q, k, v, attn_mask=keep)]
            return [F.scaled_dot_product_attention(q, k, v, is_causal=bool(P["causal"]))]
    else:
        raise ValueError("no torch form of operator %r" % (op,))
    return forward


class TorchBackend:
    """PyTorch on the device (the host's baseline forms: eager ATen — cuBLAS/cuDNN on a GPU,
    oneDNN/BLAS on a CPU — and torch.compile). The artifact is JSON naming the operator and its
    parameters (``torch_program``: the job brings no code). ``params``: ``device`` "cpu" | "cuda",
    ``compile`` "" | "default" | a torch.compile mode, ``num_threads``. A float32 operator is held
    to float32 (TF32 off); float16 matmuls return float16 with float32 accumulation.

    On the CPU the inputs are the agent's own buffers (shared memory, no copy); on a GPU they are
    tensors at fixed addresses, each new input copied in before the timed run (stage) with 2 x 128
    MiB copied on the device after it (no run finds its data in L2), and the timed run ends with
    the device synchronized. Outputs are poisoned where they live, read back after the run."""

    FLUSH_BYTES = 128 << 20

    def __init__(self, model_path, params, input_names, outputs):
        import numpy as np
        import torch

        self.np, self.torch = np, torch
        device = params.get("device", "cpu")
        if device not in ("cpu", "cuda"):
            raise ValueError("params.device must be cpu or cuda")
        if device == "cuda" and not torch.cuda.is_available():
            raise RuntimeError("this device's PyTorch %s has no CUDA device" % torch.__version__)
        self.gpu = device == "cuda"
        if "num_threads" in params:
            torch.set_num_threads(int(params["num_threads"]))
        if not self.gpu:
            _keep_freed_memory()
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = False
        with open(model_path, "rb") as f:
            spec = json.loads(f.read().decode("utf-8"))
        if not isinstance(spec, dict) or spec.get("op") not in TORCH_OPS or not isinstance(spec.get("params"), dict):
            raise ValueError("the torch artifact must name an operator (%s) and its params" % ", ".join(TORCH_OPS))
        self.dev = torch.device(device)
        forward = torch_program(torch, self.dev, spec["op"], spec["params"])
        mode = params.get("compile") or ""
        if mode:
            import torch._inductor.config as inductor_config

            # compiled in this process (no pool of compile workers against the job's process bound);
            # inductor's and Triton's caches live in the agent's work dir, across jobs (a cold
            # compile takes seconds)
            inductor_config.compile_threads = 1
            w = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(w, "cache", "torchinductor")
            os.environ["TRITON_CACHE_DIR"] = os.path.join(w, "cache", "triton")
            compiled = torch.compile(lambda *xs: forward(xs, None), mode=None if mode == "default" else mode,
                                     dynamic=False, fullgraph=True)
            self.fn = lambda xs, outs: compiled(*xs)
        else:
            self.fn = forward
        dt = {"float32": torch.float32, "float16": torch.float16}
        # (compiled: inductor's own output buffers, no preallocated ones)
        self.outs = [] if mode else [torch.full(o["shape"], float("nan"), dtype=dt[o["dtype"]], device=self.dev)
                                     for o in outputs]
        self.ins = None
        self._key = None
        self._last = None
        self._flush = None
        if self.gpu:
            self._flush = (torch.zeros(self.FLUSH_BYTES // 4, device=self.dev),
                           torch.zeros(self.FLUSH_BYTES // 4, device=self.dev))
            self.input_check = "agent copy (uploaded to the cuda before each run)"

    input_check = "runtime buffers"  # on the CPU, torch reads the agent's arrays themselves (from_numpy)

    def stage(self, inputs):
        torch = self.torch
        if not self.gpu:
            if self._key is not inputs:  # the agent rewrites these buffers in place
                self.ins = [torch.from_numpy(a) for a in inputs]
                self._key = inputs
            return
        if self.ins is None:
            self.ins = [torch.empty_like(torch.from_numpy(a), device=self.dev) for a in inputs]
        for t, a in zip(self.ins, inputs):
            t.copy_(torch.from_numpy(a))
        self._flush[1].copy_(self._flush[0])
        torch.cuda.synchronize()

    def poison(self):
        # the preallocated outputs, and whatever the last run returned (a form that hands back the
        # same buffer without computing shows NaN)
        for t in self.outs + list(self._last or ()):
            if t.is_floating_point():
                t.fill_(float("nan"))
        if self.gpu:
            self.torch.cuda.synchronize()

    def run(self, inputs):  # (the agent stages every run's inputs first)
        # the last run's own output tensors go first (an op without an out= form allocates anew):
        # held across the call, each call would take fresh pages from the OS (4.9 ms instead of
        # 1.8 ms for a 1.8 MB output, measured); the preallocated outputs stay where they are
        self._last = None
        out = self.fn(self.ins, self.outs)
        self._last = list(out) if isinstance(out, (list, tuple)) else [out]
        if self.gpu:
            self.torch.cuda.synchronize()  # the device's work is done when the run's time ends

    def results(self):
        return [t.detach().cpu().numpy().copy() for t in self._last]

    def live(self):
        if self.gpu:
            return self.results()
        return [t.detach().numpy() for t in self._last]


BACKENDS = {"ort": OrtBackend, "tflite": TfliteBackend, "tvm-relax": TvmRelaxBackend, "tvm-kernel": TvmKernelBackend,
            "adapter": AdapterBackend, "torch": TorchBackend, "openvino": OpenvinoBackend}


# --------------------------------------------------------------------------------------------- run
def _path(jobdir, p):
    return p if os.path.isabs(p) else os.path.normpath(os.path.join(jobdir, p))


def _only_the_worker():
    """A process a candidate forked that unwinds or returns into the agent's code stops here,
    before it can write a file of the job (the job's own process goes on)."""
    if _WORKER_PID is not None and os.getpid() != _WORKER_PID:
        os._exit(0)


def _write_json_atomic(path, obj):
    _only_the_worker()
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def splitmix64(x):
    x = (x + 0x9E3779B97F4A7C15) & M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & M64
    return x ^ (x >> 31)


def fresh_params(seed, t, k, n, n_sets):
    """PROTOCOL.md "Fresh inputs": (set a, shift o1, set b, shift o2, cut) of input k at iteration t."""
    h1 = splitmix64((seed + (t << 16) + k) & M64)
    h2 = splitmix64(h1)
    h3 = splitmix64(h2)
    a = t % n_sets
    b = (a + 1 + (h3 >> 32) % (n_sets - 1)) % n_sets if n_sets > 1 else a
    return a, h1 % n if n else 0, b, h2 % n if n else 0, h3 % (n + 1)


def _copy_rolled(dst, src, o, lo, hi):
    """dst[i] = src[(i - o) mod n] for lo <= i < hi (np.roll(src, o)[lo:hi]), as at most two copies."""
    n = src.size
    if lo >= hi:
        return
    s0 = (lo - o) % n
    first = min(hi - lo, n - s0)
    dst[lo:lo + first] = src[s0:s0 + first]
    if first < hi - lo:
        dst[lo + first:hi] = src[:hi - lo - first]


def fill_fresh(work, sets, seed, t):
    """Inputs of iteration t, written in place into the work buffers the backend reads."""
    for k, w in enumerate(work):
        wf = w.reshape(-1)
        n = wf.size
        a, o1, b, o2, cut = fresh_params(seed, t, k, n, len(sets))
        _copy_rolled(wf, sets[a][k].reshape(-1), o1, 0, cut)
        _copy_rolled(wf, sets[b][k].reshape(-1), o2, cut, n)


def fill_set(work, base):
    for w, b in zip(work, base):
        w[...] = b


class Reservoir:
    """Keeps `size` timed iterations chosen uniformly at random, each decided AFTER the iteration
    returned, from the OS's randomness: a candidate cannot know which of its results are checked."""

    def __init__(self, size):
        import random

        self.size = size
        self.seen = 0
        self.rng = random.SystemRandom()
        self.kept = []  # (iteration, outputs, input sha256s)

    def offer(self, t, snapshot):
        self.seen += 1
        if len(self.kept) < self.size:
            self.kept.append((t,) + snapshot())
            return
        j = self.rng.randrange(self.seen)
        if j < self.size:
            self.kept[j] = (t,) + snapshot()


WARMUP_MIN_ITERS = 5  # warm-up iterations at least (2 for a model slower than the warm-up)
WARMUP_KEEP = 4096  # the timed run is planned from the median of the first this many


class Fastest:
    """Keeps the `size` fastest timed iterations: work a candidate skipped makes an iteration fast,
    so the iterations a speedup would rest on are the ones checked, whatever the candidate does."""

    def __init__(self, size):
        self.size = size
        self.kept = []  # (ns, iteration, outputs, input sha256s)

    def offer(self, ns, t, snapshot):
        if len(self.kept) < self.size:
            self.kept.append((ns, t) + snapshot())
            return
        slowest = max(range(len(self.kept)), key=lambda i: self.kept[i][0])
        if ns < self.kept[slowest][0]:
            self.kept[slowest] = (ns, t) + snapshot()


def _save(jobdir, name, arr):
    import numpy as np

    _only_the_worker()
    np.save(os.path.join(jobdir, name), arr, allow_pickle=False)
    return name


# -------------------------------------------------------------------------------------- limits
def request_limits(req):
    """The bounds of a request (PROTOCOL.md "limits"): memory_mb, max_procs, timeout_s and
    max_bundle_bytes, None where absent or null (no bound of that kind); ValueError when malformed."""
    lim = req.get("limits")
    if lim is None:
        lim = {}
    if not isinstance(lim, dict):
        raise ValueError("limits must be an object")

    def bound(value, what, integer):
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0 or value == float("inf") \
                or (integer and value != int(value)):
            raise ValueError("%s must be a positive %s or null" % (what, "integer" if integer else "number"))
        return int(value) if integer else float(value)

    return {"memory_mb": bound(lim.get("memory_mb"), "limits.memory_mb", True),
            "max_procs": bound(lim.get("max_procs"), "limits.max_procs", True),
            "timeout_s": bound(lim.get("timeout_s"), "limits.timeout_s", False),
            "max_bundle_bytes": bound(req.get("max_bundle_bytes"), "max_bundle_bytes", True)}


# what allocators and runtimes say when an allocation was refused (numpy, onnxruntime, C++, libc)
_ALLOCATION_REFUSED = ("memoryerror", "bad_alloc", "bad allocation", "failed to allocate", "unable to allocate",
                       "cannot allocate", "out of memory")


def _resident_mb(pid="self"):
    raw = _read_bytes("/proc/%s/statm" % pid, 256)
    try:
        return int(raw.split()[1]) * PAGE / 2**20
    except (AttributeError, IndexError, ValueError):
        return None


def limit_hit(exc, what, limits):
    """(limit, reason) when a failure is the job running into one of its bounds — an allocation
    refused under RLIMIT_DATA or the memory cgroup, a fork refused under the pids cgroup — else None."""
    if limits.get("memory_mb") and (isinstance(exc, MemoryError) or getattr(exc, "errno", None) == errno.ENOMEM
                                    or any(w in what.lower() for w in _ALLOCATION_REFUSED)):
        rss = _resident_mb()
        return "memory", "out of memory: %s (limit %d MB; this process %s MB resident)" % (
            what, limits["memory_mb"], "?" if rss is None else "%.1f" % rss)
    if limits.get("max_procs") and isinstance(exc, OSError) and exc.errno == errno.EAGAIN:
        return "processes", "too many processes: %s (limit %d processes)" % (what, limits["max_procs"])
    return None


def failed(result, stage, exc, limits):
    """The job's result after an exception: a bound it ran into is named as such (``limit``)."""
    msg = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else ""
    what = "%s: %s" % (type(exc).__name__, msg)
    hit = limit_hit(exc, what, limits)
    if hit:
        result["limit"], result["reason"] = hit
    else:
        result["reason"] = "%s: %s" % (stage, what)
    return result


def run_job(jobdir, req):
    import numpy as np

    result = {"protocol": PROTOCOL, "status": "error", "reason": "", "agent": AGENT,
              "agent_version": AGENT_VERSION, "clock": "perf_counter_ns",
              "runtime_versions": {}, "device_state": device_state()}
    if req.get("protocol") != PROTOCOL:
        result["reason"] = "unsupported protocol %r (agent speaks %d)" % (req.get("protocol"), PROTOCOL)
        return result
    try:
        limits = request_limits(req)
    except ValueError as exc:
        result["reason"] = "bad request: %s" % exc
        return result
    backend_name = req["backend"]
    if backend_name not in BACKENDS:
        result["reason"] = "backend %s not supported by the python agent" % backend_name
        return result
    artifact = _path(jobdir, req["artifact"])
    if not os.path.isfile(artifact):
        result["reason"] = "artifact missing on device: %s" % req["artifact"]
        return result
    if sha256_file(artifact) != req["artifact_sha256"]:
        result["reason"] = "artifact sha256 mismatch"
        return result
    model_path = artifact
    extra = {}
    if req.get("model"):
        model_path = _path(jobdir, req["model"]["path"])
        if not os.path.isfile(model_path) or sha256_file(model_path) != req["model"]["sha256"]:
            result["reason"] = "model sha256 mismatch"
            return result
        if backend_name == "adapter":
            extra["adapter_path"] = artifact
    elif backend_name == "adapter":
        extra["adapter_path"] = artifact

    # the host's input sets stay with the agent; the candidate only ever sees the work buffers
    try:
        input_sets = [[np.load(_path(jobdir, f), allow_pickle=False) for f in files] for files in req["inputs"]]
    except Exception as exc:  # unreadable, or more than the memory bound allows
        return failed(result, "cannot load the inputs", exc, limits)
    result["input_sha256_before"] = [sha256_array(a) for s in input_sets for a in s]
    work = [np.empty_like(a) for a in input_sets[0]]
    params = req.get("params", {})
    result["runtime_versions"] = backend_versions(backend_name)
    seed = int(req.get("fresh_seed", 0)) & M64
    n_checks = max(1, int(req.get("check_iters", 4)))
    n_fastest = max(0, int(req.get("check_fastest", 2)))
    probe_pairs = max(0, int(req.get("probe_pairs", 16)))

    t0 = time.perf_counter_ns()
    try:
        backend = BACKENDS[backend_name](model_path, params, req["input_names"], req["outputs"], **extra)
    except Exception as exc:
        return failed(result, "load failed", exc, limits)
    result["load_ms"] = (time.perf_counter_ns() - t0) / 1e6
    result["input_check"] = getattr(backend, "input_check", "agent copy")
    if getattr(backend, "info", None):  # how the runtime runs it (e.g. the precision it compiled for)
        result["backend_info"] = backend.info
    # a backend whose inputs live on an accelerator uploads each new input here, outside the timed run
    stage = getattr(backend, "stage", None) or (lambda w: None)

    def work_sha():
        return [sha256_array(a) for a in work]

    clock = time.perf_counter_ns
    try:
        # 1. every input set once into poisoned outputs, then set 0 again (determinism)
        out_files, after = [], []
        for i, base in enumerate(input_sets):
            fill_set(work, base)
            stage(work)
            backend.poison()
            backend.run(work)
            out_files.append([_save(jobdir, "out_%d_%d.npy" % (i, k), a) for k, a in enumerate(backend.results())])
            after.append(work_sha())
        result["outputs"] = out_files
        result["input_sha256_after_sets"] = after
        fill_set(work, input_sets[0])
        stage(work)
        backend.poison()
        backend.run(work)
        result["repeat_outputs"] = [_save(jobdir, "rep_%d.npy" % k, a) for k, a in enumerate(backend.results())]

        # 2. warm-up on fresh inputs (iterations 0..W-1), then an iteration count from the estimate:
        #    at least WARMUP_MIN_ITERS iterations, or 2 when even the fastest is longer than the whole
        #    warm-up (a slow model), and the estimate is their median: one stall (a busy machine, a
        #    first call slow on purpose) must not shrink the timed run to a few calls a candidate
        #    computes honestly
        warmup_ns = float(req.get("warmup_ms", 20.0)) * 1e6
        max_iters = int(req.get("max_iters", 100000))
        t = 0
        spent = 0
        times = []
        while True:
            fill_fresh(work, input_sets, seed, t)
            stage(work)
            backend.poison()
            s0 = clock()
            backend.run(work)
            took = clock() - s0
            spent += took
            if len(times) < WARMUP_KEEP:
                times.append(took)
            t += 1
            if t >= max_iters:  # bounded even if the clock is not to be trusted
                break
            if spent >= warmup_ns and t >= 2 and (t >= WARMUP_MIN_ITERS or min(times) >= warmup_ns):
                break
        result["warmup_iters"] = t
        result["first_timed_iter"] = t
        est = sorted(times)[(len(times) - 1) // 2]
        budget_ns = float(req.get("budget_ms", 200.0)) * 1e6
        n = int(budget_ns // est) if est > 0 else 1
        n = max(int(req.get("min_iters", 3)), min(int(req.get("max_iters", 100000)), n))

        # 3. timed iterations: every one on inputs the candidate has not seen, outputs poisoned
        #    before it; a random few (decided after they return) go back to the host to be verified
        samples = [0] * n
        keep = Reservoir(n_checks)
        fastest = Fastest(n_fastest)
        run = backend.run
        for j in range(n):
            fill_fresh(work, input_sets, seed, t)
            stage(work)
            backend.poison()
            s0 = clock()
            run(work)
            samples[j] = clock() - s0
            snap = lambda: (backend.results(), work_sha())  # noqa: E731 - taken only if kept
            keep.offer(t, snap)
            fastest.offer(samples[j], t, snap)
            t += 1
        result["samples_ns"] = samples
        checks = []
        chosen = {k[0]: k for k in keep.kept}
        for f in fastest.kept:
            chosen.setdefault(f[1], f[1:])
        for c, (it, outs, shas) in enumerate(sorted(chosen.values(), key=lambda x: x[0])):
            names = [_save(jobdir, "tim_%d_%d.npy" % (c, k), a) for k, a in enumerate(outs)]
            checks.append({"iter": it, "outputs": names, "input_sha256_after": shas})
        result["timed_checks"] = checks

        # 4. MLPerf TEST04-style probe: one input repeated vs distinct inputs, interleaved
        rep_ns, dist_ns = [], []
        rep_t = t
        t += 1
        # no more time than the timed loop's budget (the host judges TEST04 only from 8 pairs up); a
        # run's cost is the timed runs' median, not the warm-up's mean: one slow first run (cold
        # caches, a busy machine) must not shrink the probe below what the host can judge
        per = sorted(samples)[len(samples) // 2] if samples else est
        probe_pairs = min(probe_pairs, int(budget_ns // (2 * per)) if per > 0 else probe_pairs)
        if probe_pairs:  # the repeated input once untimed first: a cache would hold it from here on
            fill_fresh(work, input_sets, seed, rep_t)
            stage(work)
            run(work)
        for i in range(probe_pairs):
            # the order alternates within pairs, so an effect of running first or second cancels out
            for repeat in ((True, False) if i % 2 == 0 else (False, True)):
                if repeat:
                    fill_fresh(work, input_sets, seed, rep_t)
                    stage(work)
                else:
                    fill_fresh(work, input_sets, seed, t)
                    stage(work)
                    t += 1
                s0 = clock()
                run(work)
                (rep_ns if repeat else dist_ns).append(clock() - s0)
        result["probe"] = {"repeat_ns": rep_ns, "distinct_ns": dist_ns}
        # 5. the last call's outputs must not change after it returned (work left to a thread); last, so
        #    nothing a candidate left running can still write into buffers the agent frees
        live = getattr(backend, "live", None)
        if live is not None:
            snap = [np.array(a, copy=True) for a in live()]
            time.sleep(max(0.05, 3 * float(sorted(samples)[n // 2]) / 1e9))
            changed = [k for k, (a, b) in enumerate(zip(snap, live()))
                       if a.shape != np.shape(b) or not np.array_equal(a, np.asarray(b), equal_nan=True)]
            result["late_change"] = {"iter": t - 1, "outputs": changed} if changed else None
        else:
            result["late_change"] = None
        # 6. asked for: where the nodes ran (an accelerator may have taken only part of the graph)
        if req.get("placement") and hasattr(backend, "placement"):
            try:
                result["placement"] = backend.placement(work, jobdir)
            except Exception as exc:  # the measurement stands; the placement is unknown, and says why
                result["placement"] = {"error": ("%s: %s" % (type(exc).__name__, exc))[:300]}

    except Exception as exc:
        return failed(result, "run failed", exc, limits)
    result["device_state_after"] = device_state()
    result["status"] = "ok"
    return result


def cmd_run(jobdir):
    """Run JOBDIR/request.json, write the outputs and JOBDIR/result.json (no supervisor)."""
    global _WORKER_PID
    _WORKER_PID = os.getpid()
    result = {"protocol": PROTOCOL, "status": "error", "reason": "", "agent": AGENT, "agent_version": AGENT_VERSION}
    try:
        with open(os.path.join(jobdir, "request.json"), "rb") as f:
            req = json.loads(f.read().decode("utf-8"))
        if not isinstance(req, dict):
            raise ValueError("not an object")
    except (OSError, ValueError) as exc:
        result["reason"] = "bad request.json: %s" % exc
    else:
        result = run_job(jobdir, req)
    _write_json_atomic(os.path.join(jobdir, "result.json"), result)
    return 0


# ---------------------------------------------------------------------------------- supervisor
# run-stdio runs the job in a worker process and watches it from here (PROTOCOL.md "The supervisor").
# Every POLL_S the supervisor reaps, checks the deadline and looks at the job's processes: from
# its cgroups when it has them (cgroup.procs and the OOM counter: two small reads), else from
# /proc (a directory listing; only processes new since the last look are read, by their ppid)
# and the statm of each of the job's processes. 10 ms bounds how far past a bound a job gets (a
# deadline by 10 ms, a hog by what it can fault in in 10 ms, ~20-40 MB) while the supervisor
# sleeps nearly all the time: a timed call is interrupted at most once per 10 ms, for tens of
# microseconds, and only where supervisor and candidate share a core. When a look costs more (a
# large tree, a slow board) the supervisor sleeps 50 times as long as it worked, up to
# POLL_MAX_S: it never takes more than ~2% of one core from the candidate.
POLL_S = 0.010
POLL_MAX_S = 0.1
WORK_FACTOR = 50
RESCAN_S = 1.0  # every process in /proc is read again this often (a pid reused since the last look)
PSS_EVERY_S = 0.2  # the costlier PSS confirmation of a tree over its memory bound, at most this often
SWEEP_GIVE_UP_S = 10.0  # a process that survives SIGKILL this long is in the kernel (D state): reported
LOG_NAME = "agent.log"  # the worker's stdout and stderr (relayed, its tail only, to the agent's stderr)
LOG_TAIL = 8192
PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
BUNDLE_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,123}\.npy$")  # the host's file-name rule, .npy only


def data_limit_bytes(memory_mb):
    """RLIMIT_DATA of the worker: a per-process backstop, not the bound itself. It counts writable
    memory reserved but never touched (8 MB per thread stack, allocator arenas, BLAS buffers: numpy
    alone reserves ~115 MB for ~47 MB resident, onnxruntime with 8 threads 179 MB for 78 MB), so at
    memory_mb it would refuse honest runtimes; the bound on resident memory is the cgroup or the poll.
    RLIMIT_AS (every mapping, even PROT_NONE reservations: 740 MB for that onnxruntime) is worse."""
    return (2 * memory_mb + 256) << 20


def pids_cgroup_max(max_procs):
    """pids.max counts threads too: room for every process's runtime threads above max_procs, which
    the poll enforces on processes alone. The cgroup is the backstop that stops a fork bomb between polls."""
    return max_procs + 64 + 16 * (os.cpu_count() or 1)


def _read_bytes(path, limit=65536):
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        return os.read(fd, limit)
    except OSError:
        return None
    finally:
        os.close(fd)


def _write_text(path, text):
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def proc_table():
    """pid -> (ppid, state) of every process in /proc."""
    out = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        raw = _read_bytes("/proc/%s/stat" % name, 1024)
        if not raw:
            continue
        rest = raw[raw.rfind(b")") + 2:].split(None, 2)  # the name may hold ") "
        if len(rest) >= 2:
            out[int(name)] = (int(rest[1]), rest[0])
    return out


class Tree:
    """The job's processes (the supervisor's descendants) by ppid links in /proc, kept up to date
    cheaply: a process that is not the job's when first seen never becomes the job's (orphans go
    to the supervisor, a subreaper), so only processes new since the last look are read."""

    def __init__(self, root):
        self.root = root
        self.members = set()
        self.foreign = set()
        self.next_rescan = 0.0

    def refresh(self, now, stop=None):
        """The job's processes; past ``stop`` of them it stops reading and returns at once (a fork
        bomb is stopped at its first step past the bound, not after the supervisor read the
        thousands of processes it made meanwhile): then the set is incomplete."""
        if now >= self.next_rescan:
            self.foreign = set()
            self.next_rescan = now + RESCAN_S
        current = set(int(n) for n in os.listdir("/proc") if n.isdigit())
        self.members &= current
        self.foreign &= current
        pending = {}
        for pid in sorted(current - self.members - self.foreign - {self.root}):  # a parent mostly first
            raw = _read_bytes("/proc/%d/stat" % pid, 1024)
            if raw:
                ppid = int(raw[raw.rfind(b")") + 2:].split(None, 2)[1])
                if ppid == self.root or ppid in self.members:
                    self.members.add(pid)
                    if stop is not None and len(self.members) > stop:
                        return self.members
                else:
                    pending[pid] = ppid
        grew = True
        while grew:  # a new process may be the child of another new one
            grew = False
            for pid, ppid in list(pending.items()):
                if ppid == self.root or ppid in self.members:
                    self.members.add(pid)
                    del pending[pid]
                    grew = True
        self.foreign.update(pending)
        return self.members


def descendants(root, table):
    """Live (not zombie) descendants of root, by ppid links."""
    children = {}
    for pid, (ppid, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    out, todo = [], [root]
    while todo:
        for c in children.get(todo.pop(), ()):
            todo.append(c)
            if table[c][1] != b"Z":
                out.append(c)
    return out


def runs_this_job(pid, jobdir):
    """Whether a process (of this user) runs this very job although it is not in the supervisor's
    tree: without a subreaper (qemu-user refuses PR_SET_CHILD_SUBREAPER) an orphan of the job goes
    to init, but a fork of the agent still shows its command line, which ends in "run-stdio" and the
    job dir (unique per job). A process that execs or rewrites its argv escapes this."""
    try:
        if os.stat("/proc/%d" % pid).st_uid != os.getuid():
            return False
    except OSError:
        return False
    raw = _read_bytes("/proc/%d/cmdline" % pid, 8192) or b""
    return raw.endswith(b"\0run-stdio\0" + os.fsencode(jobdir) + b"\0")


def _pss_bytes(pid):
    raw = _read_bytes("/proc/%d/smaps_rollup" % pid, 4096)
    if raw is None:
        return None
    m = re.search(rb"\nPss:\s+(\d+) kB", b"\n" + raw)
    return int(m.group(1)) << 10 if m else None


def _prctl(option, arg):
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True).prctl(option, arg, 0, 0, 0) == 0
    except (ImportError, OSError, AttributeError):
        return False


def signal_name(sig):
    try:
        return signal.Signals(sig).name
    except ValueError:
        return "signal %d" % sig


class Cgroups:
    """The job's own cgroups for memory and pids, where the device lets the agent make them: a
    child of the agent's cgroup in a cgroup v2 hierarchy that has the controller (a delegated
    subtree), else in a writable cgroup v1 hierarchy of that controller. Any step that fails
    leaves that controller to the rlimit and the poll: a job never fails for want of a cgroup."""

    def __init__(self, tag, memory_mb, max_procs):
        self.dirs = {}  # controller -> (dir, version)
        self._made = []
        if os.environ.get("EDGETUNE_AGENT_CGROUP", "1") == "0":  # tests: the path phones without cgroups take
            return
        mounts, own = self._mounts(), self._own()
        for ctl, value, files in (("memory", memory_mb, self._memory_files), ("pids", max_procs, self._pids_files)):
            if value is None:
                continue
            try:
                made = self._make(ctl, tag, mounts, own)
                if made:
                    for name, text, needed in files(*made, value=value):
                        try:
                            _write_text(os.path.join(made[0], name), text)
                        except OSError:
                            if needed:
                                raise
                    self.dirs[ctl] = made
            except OSError:
                pass
        for d in list(self._made):
            if not any(d == v[0] for v in self.dirs.values()):
                self._rmdir(d)

    @staticmethod
    def _mounts():
        out = []  # (fstype, mount point, root in the hierarchy, super options)
        for line in (_read_bytes("/proc/self/mountinfo", 1 << 20) or b"").decode("utf-8", "replace").splitlines():
            left, _, right = line.partition(" - ")
            f, r = left.split(), right.split()
            if len(f) >= 5 and len(r) >= 3 and r[0] in ("cgroup", "cgroup2"):
                out.append((r[0], f[4], f[3], r[2].split(",")))
        return out

    @staticmethod
    def _own():
        out = {}  # controller ("" for v2) -> this process's cgroup path
        for line in (_read_bytes("/proc/self/cgroup", 65536) or b"").decode("utf-8", "replace").splitlines():
            parts = line.split(":", 2)
            if len(parts) == 3:
                for c in (parts[1].split(",") if parts[1] else [""]):
                    out[c] = parts[2]
        return out

    def _make(self, ctl, tag, mounts, own):
        for fstype, mnt, root, opts in mounts:
            path = own.get("" if fstype == "cgroup2" else ctl)
            if path is None or (fstype == "cgroup" and ctl not in opts):
                continue
            rel = path[len(root):] if root != "/" and path.startswith(root) else path
            base = os.path.join(mnt, rel.lstrip("/"))
            if fstype == "cgroup2":
                if ctl not in (_read_bytes(os.path.join(base, "cgroup.controllers")) or b"").decode().split():
                    continue
                if ctl not in (_read_bytes(os.path.join(base, "cgroup.subtree_control")) or b"").decode().split():
                    _write_text(os.path.join(base, "cgroup.subtree_control"), "+" + ctl)
            self._clean_stale(base)
            d = os.path.join(base, "edgetune-" + tag)
            if d not in self._made:
                os.mkdir(d, 0o700)
                self._made.append(d)
            if os.path.exists(os.path.join(d, ctl + ".max" if fstype == "cgroup2" else ctl + (
                    ".limit_in_bytes" if ctl == "memory" else ".max"))):
                return d, 2 if fstype == "cgroup2" else 1
        return None

    @staticmethod
    def _memory_files(d, version, value):
        limit = str(value << 20)
        if version == 2:  # swap off, and an OOM takes the whole job at once
            return [("memory.max", limit, True), ("memory.swap.max", "0", False), ("memory.oom.group", "1", False)]
        return [("memory.limit_in_bytes", limit, True), ("memory.memsw.limit_in_bytes", limit, False),
                ("memory.swappiness", "0", False)]

    @staticmethod
    def _pids_files(d, version, value):
        return [("pids.max", str(pids_cgroup_max(value)), True)]

    def _clean_stale(self, base):
        """Cgroups a killed supervisor left behind (its pid gone): their processes die here."""
        try:
            names = os.listdir(base)
        except OSError:
            return
        for name in names:
            if name.startswith("edgetune-") and name[9:].isdigit() and not os.path.exists("/proc/" + name[9:]):
                d = os.path.join(base, name)
                for _ in range(100):
                    pids = _pids_in(d)
                    if not pids:
                        break
                    for p in pids:
                        _kill(p)
                    time.sleep(0.001)
                self._rmdir(d)

    def add(self, pid):
        for ctl, (d, _) in list(self.dirs.items()):
            try:
                _write_text(os.path.join(d, "cgroup.procs"), str(pid))
            except OSError:
                del self.dirs[ctl]

    def has(self, ctl):
        return ctl in self.dirs

    def procs(self):
        """The job's processes (two v1 hierarchies hold the same ones: one is read)."""
        if not self.dirs:
            return set()
        return set(_pids_in(self.dirs["pids" if "pids" in self.dirs else "memory"][0]))

    def _memory_file(self, v1, v2):
        d, version = self.dirs["memory"]
        return _read_bytes(os.path.join(d, v2 if version == 2 else v1), 4096) or b""

    def oom_kills(self):
        """Processes of the job the kernel's OOM killer stopped in its memory cgroup (v1 kernels
        before 4.13 have no counter: then the times the limit was hit)."""
        if "memory" not in self.dirs:
            return 0
        m = re.search(rb"oom_kill (\d+)", self._memory_file("memory.oom_control", "memory.events"))
        if m:
            return int(m.group(1))
        if self.dirs["memory"][1] == 1:
            raw = self._memory_file("memory.failcnt", "")
            return int(raw) if raw.strip().isdigit() else 0
        return 0

    def memory_bytes(self, peak=False):
        if "memory" not in self.dirs:
            return None
        raw = self._memory_file("memory.max_usage_in_bytes" if peak else "memory.usage_in_bytes",
                                "memory.peak" if peak else "memory.current")
        return int(raw) if raw.strip().isdigit() else None

    def kill_all(self):
        for d, version in self.dirs.values():
            if version == 2 and os.path.exists(os.path.join(d, "cgroup.kill")):
                try:
                    _write_text(os.path.join(d, "cgroup.kill"), "1")
                except OSError:
                    pass
        for p in self.procs():
            _kill(p)

    def remove(self):
        for d in self._made:
            self._rmdir(d)
        self._made = []

    @staticmethod
    def _rmdir(d):
        for _ in range(200):  # a killed task leaves its cgroup a moment after it was reaped
            try:
                os.rmdir(d)
                return
            except FileNotFoundError:
                return
            except OSError:
                time.sleep(0.001)


def _pids_in(d):
    raw = _read_bytes(os.path.join(d, "cgroup.procs"), 1 << 20) or b""
    return [int(x) for x in raw.split() if x.isdigit()]


def _kill(pid):
    try:
        os.kill(pid, signal.SIGKILL)
    except OSError:
        pass


def _rlimit_data_takes():
    """Whether RLIMIT_DATA binds here: qemu-user accepts it for a guest and ignores it."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_DATA)
    probe = (1 << 60) if hard == resource.RLIM_INFINITY else hard - PAGE
    try:
        resource.setrlimit(resource.RLIMIT_DATA, (probe, hard))
        took = resource.getrlimit(resource.RLIMIT_DATA)[0] == probe
        resource.setrlimit(resource.RLIMIT_DATA, (soft, hard))
        return took
    except (ValueError, OSError):
        return False


def _user_tasks():
    """Tasks (threads) the real user has now: what RLIMIT_NPROC counts, across the whole device."""
    me, n = os.getuid(), 0
    for name in os.listdir("/proc"):
        try:
            if not name.isdigit() or os.stat("/proc/" + name).st_uid != me:
                continue
        except OSError:
            continue
        m = re.search(rb"\nThreads:\s+(\d+)", _read_bytes("/proc/%s/status" % name, 4096) or b"")
        n += int(m.group(1)) if m else 1
    return n


def _lower_rlimit(which, value):
    import resource

    _, hard = resource.getrlimit(which)
    if hard != resource.RLIM_INFINITY:
        value = min(value, hard)
    resource.setrlimit(which, (value, value))


class Supervisor:
    """One run-stdio job: the worker that runs it, the bounds it runs under, and what came of it."""

    def __init__(self, jobdir, started, limits):
        self.jobdir = jobdir
        self.started = started
        self.limits = limits
        self.me = os.getpid()
        self.worker = None
        self.worker_status = None  # (wait status, max resident KiB) once reaped
        self.members = []  # the job's live processes, as last seen
        self.tree = Tree(self.me)
        self.next_pss = 0.0
        self.rss = 0
        self.peak_bytes = 0
        self.peak_procs = 0
        self.leftover = 0
        self.unkillable = 0
        self.stop_signal = None
        self.cg = None
        self.nproc = None  # RLIMIT_NPROC of the worker, where set
        self.subreaper = False  # orphans of the job come to the supervisor
        self.enforced = {}
        self.client = None  # zygote-served job: the connection of the client that brought it

    # -- set-up
    def start(self):
        import resource

        lim = self.limits
        self.subreaper = _prctl(PR_SET_CHILD_SUBREAPER, 1)  # orphans of the job, even after setsid + double fork
        self.cg = Cgroups(str(self.me), lim["memory_mb"], lim["max_procs"])
        rlimit = _rlimit_data_takes()
        # no pids cgroup: RLIMIT_NPROC stops a fork bomb in the kernel instead, between polls; it
        # counts every task of the user on the device (so: what it has now plus the job's
        # allowance) and binds no one running as root
        if lim["max_procs"] is not None and not self.cg.has("pids") and os.getuid() != 0:
            self.nproc = _user_tasks() + pids_cgroup_max(lim["max_procs"])
        self.enforced = {
            "memory": None if lim["memory_mb"] is None else
            "cgroup" if self.cg.has("memory") else "rlimit+poll" if rlimit else "poll",
            "processes": None if lim["max_procs"] is None else
            "cgroup+poll" if self.cg.has("pids") else "rlimit+poll" if self.nproc else "poll",
            "time": None if lim["timeout_s"] is None else "supervisor",
            "output": None if lim["max_bundle_bytes"] is None else "supervisor",
            "leftovers": "subreaper" if self.subreaper else "process group+cmdline",
            "isolation": "fork of the zygote" if self.client is not None else "fresh process",
        }
        for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
            signal.signal(sig, self._on_signal)
        go_r, go_w = os.pipe()
        pid = os.fork()
        if pid == 0:
            try:
                os.close(go_w)
                self._become_worker(go_r, resource)
            finally:
                os._exit(70)
        os.close(go_r)
        self.worker = pid
        try:
            os.setpgid(pid, pid)  # also done by the worker: whichever runs first
        except OSError:
            pass
        try:  # a job that saturates every core (a fork bomb) must not starve the one process that can
            # stop it: where it may (root, CAP_SYS_NICE) the supervisor, asleep nearly all the time,
            # takes the highest priority of the fair scheduler; the worker keeps the one it started with
            os.setpriority(os.PRIO_PROCESS, 0, -20)
        except (OSError, AttributeError):
            pass
        self.cg.add(pid)
        self.members = [pid]
        os.write(go_w, b"g")  # the worker starts once it is in its cgroups
        os.close(go_w)

    def _on_signal(self, signum, frame):
        self.stop_signal = signum

    def _become_worker(self, go_r, resource):
        for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT, signal.SIGXFSZ):
            signal.signal(sig, signal.SIG_DFL)
        if self.client is not None:  # the zygote's connection to the client is the supervisor's
            self.client.close()
        os.setpgid(0, 0)  # its own process group: killed as one
        _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != self.me:  # the supervisor died before the line above
            os._exit(70)
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        if self.limits["memory_mb"] is not None:
            _lower_rlimit(resource.RLIMIT_DATA, data_limit_bytes(self.limits["memory_mb"]))
        if self.limits["max_bundle_bytes"] is not None:  # no file of the job may outgrow the whole bundle
            _lower_rlimit(resource.RLIMIT_FSIZE, self.limits["max_bundle_bytes"])
        if self.nproc is not None:
            _lower_rlimit(resource.RLIMIT_NPROC, self.nproc)
        # nothing the candidate prints reaches the result stream, and it holds none of the transport's pipes
        log = os.open(os.path.join(self.jobdir, LOG_NAME), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.read(go_r, 1)
        for fd in [int(x) for x in os.listdir("/proc/self/fd")]:  # the transport's pipes and sockets
            try:
                if fd > 2 and (stat.S_ISFIFO(os.fstat(fd).st_mode) or stat.S_ISSOCK(os.fstat(fd).st_mode)):
                    os.close(fd)
            except OSError:
                pass
        import faulthandler

        faulthandler.enable()  # a fatal signal writes where it struck to the log: the crash names it
        rc = cmd_run(self.jobdir)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(rc)

    # -- watching
    def _reap(self):
        while True:
            try:
                pid, status, ru = os.wait4(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if pid == self.worker:
                self.worker_status = (status, ru.ru_maxrss)

    def watch(self):
        """Until the worker exits or breaks a bound: (limit, reason) of the violation, or None."""
        while True:
            t0 = time.perf_counter()
            violation = self._poll()
            if violation is not False:
                return violation
            time.sleep(min(POLL_MAX_S, max(POLL_S, WORK_FACTOR * (time.perf_counter() - t0))))

    def _poll(self):
        lim = self.limits
        self._reap()
        if self.worker_status is not None:
            return None
        if self.stop_signal is None and self.client is not None and _hung_up(self.client):
            self.stop_signal = signal.SIGHUP  # the host gave up on the job: its client is gone
        if self.stop_signal is not None:
            return "signal", "stopped by %s" % signal_name(self.stop_signal)
        now = time.monotonic()
        if lim["timeout_s"] is not None and now - self.started > lim["timeout_s"]:
            return "time", "hung: still running after %.2f s (limit %g s)" % (now - self.started, lim["timeout_s"])
        self.members = sorted(self.cg.procs() if self.cg.dirs else self.tree.refresh(now, lim["max_procs"]))
        if lim["memory_mb"] is not None and not self.cg.has("memory"):
            self.members = self._resident()  # drops zombies: they hold no memory and are no process any more
        n = len(self.members)
        self.peak_procs = max(self.peak_procs, n)
        if lim["max_procs"] is not None and n > lim["max_procs"]:
            self.leftover = n - 1
            return "processes", "too many processes: %s%d processes (limit %d)" % (
                "" if self.cg.dirs else "at least ", n, lim["max_procs"])
        if lim["memory_mb"] is not None:
            over = self._memory_over(now, lim["memory_mb"])
            if over:
                return "memory", over
        return False

    def _resident(self):
        self.rss = 0
        alive = []
        for p in self.members:
            raw = _read_bytes("/proc/%d/statm" % p, 256)
            fields = raw.split() if raw else ()
            if len(fields) > 1 and fields[0] != b"0":
                self.rss += int(fields[1]) * PAGE
                alive.append(p)
        return alive

    def _memory_over(self, now, memory_mb):
        limit = memory_mb << 20
        if self.cg.has("memory"):  # the kernel enforces it; the peak is read once, at the end
            kills = self.cg.oom_kills()
            if kills:
                peak = self.cg.memory_bytes(peak=True) or self.cg.memory_bytes() or 0
                return "out of memory: the kernel's OOM killer stopped %d process(es) of the job in its memory " \
                       "cgroup (peak %.1f MB; limit %d MB)" % (kills, peak / 2**20, memory_mb)
            return None
        rss, alive = self.rss, self.members
        self.peak_bytes = max(self.peak_bytes, rss)
        if rss <= limit or now < self.next_pss:
            return None
        # resident pages shared between forked processes count once in each: the proportional set
        # size (costlier: the kernel walks the page tables) confirms before the job is stopped
        t0 = time.perf_counter()
        pss = [_pss_bytes(p) for p in alive]
        self.next_pss = now + max(PSS_EVERY_S, WORK_FACTOR * (time.perf_counter() - t0))
        if None in pss:
            return "out of memory: %.1f MB resident in %d processes (limit %d MB)" % (rss / 2**20, len(alive), memory_mb)
        if sum(pss) > limit:
            return "out of memory: %.1f MB in %d processes (proportional set size; limit %d MB)" % (
                sum(pss) / 2**20, len(alive), memory_mb)
        return None

    # -- ending
    def sweep(self):
        """Kill every process of the job and reap until none is left. A fork bomb ends too: each
        pass kills all it finds, their children come to the supervisor (the subreaper), the next
        pass kills those; it is over when the supervisor has no child left at all."""
        give_up = time.monotonic() + SWEEP_GIVE_UP_S
        count = self.worker_status is not None  # a job that ended by itself: what it left running is counted
        while True:
            # the worker's whole group at once, first (a fork bomb that keeps its group cannot outrun
            # one kill); not reaped yet, the group id is still the job's
            if self.worker_status is None:
                try:
                    os.killpg(self.worker, signal.SIGKILL)
                except OSError:
                    pass
            table = proc_table()
            tree = set(descendants(self.me, table))
            if not self.subreaper:
                tree |= set(p for p, (_, state) in table.items() if p not in tree and p != self.me and state != b"Z"
                            and runs_this_job(p, self.jobdir))
            if count:
                self.leftover = len(tree - {self.worker})
                count = False
            live = (tree | self.cg.procs()) - {self.me}
            self.cg.kill_all()
            for p in live:
                _kill(p)
            self._reap()
            if not live and self._no_children():
                break
            if time.monotonic() > give_up:
                self.unkillable = len(live)
                break
            time.sleep(0.001)

    @staticmethod
    def _no_children():
        try:  # WNOWAIT: looks without reaping
            os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return True
        return False

    def outcome(self, violation):
        """(result to synthesise or None to relay the worker's, limit or None)."""
        lim = self.limits
        status, maxrss_kb = self.worker_status or (0, 0)
        self.peak_bytes = max(self.peak_bytes, maxrss_kb << 10, self.cg.memory_bytes(peak=True) or 0)
        if violation:
            limit, reason = violation
            return {"status": "error", "reason": reason, "limit": limit}
        if os.WIFSIGNALED(status):
            sig = os.WTERMSIG(status)
            name = signal_name(sig)
            # an allocation refused under RLIMIT_DATA or the memory cgroup often ends as a NULL
            # dereference, an abort or the OOM killer's SIGKILL: past the bound, that is what it was
            if lim["memory_mb"] is not None and (self.cg.oom_kills() or (maxrss_kb << 10) > lim["memory_mb"] << 20):
                return {"status": "error", "limit": "memory",
                        "reason": "out of memory: the worker was killed by %s at %.1f MB resident (limit %d MB)"
                                  % (name, (maxrss_kb << 10) / 2**20, lim["memory_mb"])}
            if sig == signal.SIGXFSZ and lim["max_bundle_bytes"] is not None:
                return {"status": "error", "limit": "output",
                        "reason": "result too large: a file of the job grew past %d bytes (limit %d bytes)"
                                  % (lim["max_bundle_bytes"], lim["max_bundle_bytes"])}
            site = crash_site(self.jobdir)
            return {"status": "crashed", "signal": name,
                    "reason": "crashed: the worker was killed by %s%s" % (name, " in " + site if site else "")}
        if not os.path.isfile(os.path.join(self.jobdir, "result.json")):
            return {"status": "crashed", "reason": "crashed: the worker exited with status %d and no result"
                                                   % os.WEXITSTATUS(status)}
        return None

    def supervisor_fields(self):
        return {"limits_enforced": self.enforced, "leftover_processes": self.leftover,
                "usage": {"wall_s": round(time.monotonic() - self.started, 3),
                          "peak_memory_mb": round(self.peak_bytes / 2**20, 1), "peak_procs": self.peak_procs},
                **({"unkillable_processes": self.unkillable} if self.unkillable else {})}


def _bundle_files(jobdir, max_bytes):
    """The worker's result.json with the supervisor's fields appended (its last '}' found by
    scanning back over whitespace: nothing else of it is read) and its outputs: [(name, path,
    size)], or (None, why) when the result is unusable."""
    path = os.path.join(jobdir, "result.json")
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError as exc:
        return None, "crashed: cannot open the worker's result.json: %s" % exc.strerror
    try:
        size = os.fstat(fd).st_size
        if max_bytes is not None and size > max_bytes:
            return None, size
        tail = os.pread(fd, 4096, max(0, size - 4096))
    finally:
        os.close(fd)
    body = tail.rstrip()
    if not body.endswith(b"}"):
        return None, "crashed: the worker's result.json is not a JSON object"
    keep = size - (len(tail) - len(body)) - 1  # bytes before the closing brace
    empty = body[:-1].rstrip().endswith(b"{")
    files = [("result.json", path, keep, empty)]
    for name in sorted(os.listdir(jobdir)):
        if BUNDLE_NAME.match(name):
            p = os.path.join(jobdir, name)
            try:
                st = os.lstat(p)
            except OSError:
                continue
            if (st.st_mode & 0o170000) == 0o100000:  # regular files only, never a link
                files.append((name, p, st.st_size, None))
    return files, None


def _emit(out, entries):
    """Write a bundle: entries are (name, bytes) or (name, path, size[, suffix])."""
    out.write(b"EDGETUNE-BUNDLE 1\n")
    for name, data in entries:
        if isinstance(data, bytes):
            out.write(("%s %d\n" % (name, len(data))).encode() + data)
            continue
        path, size, suffix = data
        out.write(("%s %d\n" % (name, size + len(suffix))).encode())
        with open(path, "rb") as f:
            left = size
            while left > 0:
                chunk = f.read(min(left, 1 << 20))
                if not chunk:  # cannot happen: every process of the job is dead
                    chunk = b"\0" * left
                out.write(chunk)
                left -= len(chunk)
        out.write(suffix)
    out.write(b"END\n")
    out.flush()


def cmd_run_stdio(jobdir, data=None, client=None, started=None):
    """One round trip per job: request on stdin, result + outputs back as one bundle on stdout
    ("EDGETUNE-BUNDLE 1\n" {"NAME SIZE\n" bytes}* "END\n"); the job dir is removed afterwards.
    The job runs in a worker process under this one, the supervisor (PROTOCOL.md). A job the
    zygote serves comes with its request read already and the client's connection."""
    started = time.monotonic() if started is None else started
    if data is None:
        data = sys.stdin.buffer.read()
    os.makedirs(jobdir, exist_ok=True)
    with open(os.path.join(jobdir, "request.json"), "wb") as f:
        f.write(data)
    base = {"protocol": PROTOCOL, "agent": AGENT, "agent_version": AGENT_VERSION}
    try:
        req = json.loads(data.decode("utf-8"))
    except ValueError:
        req = None  # unreadable: the worker says so in its result
    try:
        limits = request_limits(req if isinstance(req, dict) else {})
    except ValueError as exc:
        _emit(sys.stdout.buffer, [("result.json", json.dumps(
            dict(base, status="error", reason="bad request: %s" % exc)).encode())])
        _remove_jobdir(jobdir)
        return 0
    sup = Supervisor(jobdir, started, limits)
    sup.client = client
    try:
        sup.start()
    except OSError as exc:  # no worker (fork refused): an answer all the same
        _emit(sys.stdout.buffer, [("result.json", json.dumps(
            dict(base, status="error", reason="cannot start the job's worker: %s" % exc)).encode())])
        _remove_jobdir(jobdir)
        return 0
    violation = sup.watch()
    sup.sweep()
    synth = sup.outcome(violation)
    sup.cg.remove()
    if violation and violation[0] == "signal":  # the host gave up on this job: nobody reads a bundle
        _relay_log(jobdir)
        _remove_jobdir(jobdir)
        return 128 + sup.stop_signal
    entries = None
    if synth is None:
        files, why = _bundle_files(jobdir, limits["max_bundle_bytes"])
        if files is not None:
            suffix = json.dumps(sup.supervisor_fields())[1:].encode()  # '"k": v, ...}' after the worker's fields
            name, path, keep, empty = files[0]
            entries = [(name, (path, keep, (b"" if empty else b",") + suffix))]
            entries += [(n, (p, size, b"")) for n, p, size, _ in files[1:]]
            total = len(b"EDGETUNE-BUNDLE 1\n") + len(b"END\n") + sum(
                len(n) + 2 + len(str(d[1] + len(d[2]))) + d[1] + len(d[2]) for n, d in entries)
            if limits["max_bundle_bytes"] is not None and total > limits["max_bundle_bytes"]:
                why, entries = total, None
        if entries is None:
            if isinstance(why, int):
                synth = {"status": "error", "limit": "output", "reason": "result too large: the bundle is %d bytes "
                         "(limit %d bytes)" % (why, limits["max_bundle_bytes"])}
            else:
                synth = {"status": "crashed", "reason": why}
    if entries is None:
        result = dict(base, **synth)
        result.update(sup.supervisor_fields())
        entries = [("result.json", json.dumps(result).encode())]
    _relay_log(jobdir)
    try:
        _emit(sys.stdout.buffer, entries)
    except BrokenPipeError:
        pass
    _remove_jobdir(jobdir)
    return 0


_FAULT_FRAME = re.compile(r'^\s*File "([^"\n]{1,400})", line (\d+) in ([A-Za-z0-9_<>.]{1,80})\s*$')


def crash_site(jobdir):
    """Where a fatal signal struck the worker, from faulthandler's dump in its log (the innermost
    Python frame of the crashing thread: "run (edgetune_agent.py:410)"), or None. The log is the
    candidate's output: only a line of faulthandler's own form is taken, and only its file's name."""
    try:
        with open(os.path.join(jobdir, LOG_NAME), "rb") as f:
            f.seek(0, 2)
            f.seek(max(0, f.tell() - LOG_TAIL))
            lines = f.read(LOG_TAIL).decode("utf-8", "replace").splitlines()
    except OSError:
        return None
    for i in range(len(lines) - 1, -1, -1):
        if lines[i].startswith("Current thread") and "most recent call first" in lines[i]:
            m = _FAULT_FRAME.match(lines[i + 1]) if i + 1 < len(lines) else None
            if m:
                return "%s (%s:%s)" % (m.group(3), os.path.basename(m.group(1)), m.group(2))
            return None
    return None


def _relay_log(jobdir):
    """The tail of what the worker printed, on the agent's stderr (diagnostics only)."""
    try:
        with open(os.path.join(jobdir, LOG_NAME), "rb") as f:
            f.seek(0, 2)
            f.seek(max(0, f.tell() - LOG_TAIL))
            tail = f.read(LOG_TAIL)
    except OSError:
        return
    if tail:
        try:
            sys.stderr.buffer.write(tail if tail.endswith(b"\n") else tail + b"\n")
            sys.stderr.flush()
        except OSError:
            pass


def _remove_jobdir(jobdir):
    import shutil

    shutil.rmtree(jobdir, ignore_errors=True)


# ------------------------------------------------------------------------------------- the zygote
# A job costs a process start plus the imports of numpy and its runtime (~0.35 s of ~0.46 s on the
# reference host). The zygote is a process per agent install with onnxruntime and LiteRT imported
# that forks the supervisor of each job it is given: the job still runs in a process of its own
# (a fork, under the same supervisor and bounds), without the imports. Only runtime configurations
# of those runtimes go there; code a candidate brings (adapters, custom-op libraries, TVM builds)
# starts in a fresh process, as does every job where the zygote is not running (it is started
# after such a job, for the next one) or cannot keep orphans (no subreaper: qemu-user).
# The client (``run-stdio``) reaches it on an abstract Unix socket named after the agent's path,
# checked to be the same user (SO_PEERCRED); a zygote whose agent file changed answers "stale"
# and exits, as it does when a variable the runtimes read at import differs from the client's
# (the job otherwise runs with its client's environment). It exits after ZYGOTE_IDLE_S without a
# job, or when its agent file is gone.
ZYGOTE_BACKENDS = ("ort", "tflite", "torch")
ZYGOTE_IDLE_S = float(os.environ.get("EDGETUNE_AGENT_ZYGOTE_IDLE_S") or 120.0)
# variables the runtimes read when imported: a client whose values differ gets a fresh process
ZYGOTE_ENV_AT_IMPORT = ("OMP_", "OPENBLAS_", "MKL_", "GOTO", "LD_", "PYTHON", "ORT_", "TF_", "TORCH", "CUDA_",
                        "EDGETUNE_AGENT_ZYGOTE")


def zygote_eligible(req):
    if not isinstance(req, dict) or req.get("fresh_process") or req.get("backend") not in ZYGOTE_BACKENDS:
        return False
    params = req.get("params")
    if not isinstance(params, dict):
        return False
    if req.get("backend") == "torch" and params.get("device", "cpu") != "cpu":
        return False  # CUDA and fork: a GPU job of PyTorch starts fresh, whatever its imports touched
    return "custom_ops_library" not in params and "adapter" not in params


def _loads(data):
    try:
        return json.loads(data.decode("utf-8"))
    except ValueError:
        return None


def _agent_file():
    return os.path.realpath(os.path.abspath(__file__))


def _zygote_name():
    key = hashlib.sha256(("%d:%s" % (os.getuid(), _agent_file())).encode()).hexdigest()[:32]
    return "\0edgetune-zygote-" + key


def _is_zygote(pid):
    """Whether the process is this agent's zygote as start_zygote starts it: this interpreter
    running this agent file with "serve" (a job's process never outlives its supervisor's sweep)."""
    raw = _read_bytes("/proc/%d/cmdline" % pid, 8192) or b""
    want = b"\0".join(os.fsencode(x) for x in (sys.executable, _agent_file(), "serve")) + b"\0"
    try:
        same_exe = os.path.realpath("/proc/%d/exe" % pid) == os.path.realpath(sys.executable)
    except OSError:
        return False
    return raw == want and same_exe


def _hung_up(sock):
    """Whether the peer of a stream socket closed it (the zygote's client was killed)."""
    import select

    try:
        r, _, _ = select.select([sock], [], [], 0)
        return bool(r) and sock.recv(1, 0x40 | 0x2) == b""  # MSG_DONTWAIT | MSG_PEEK
    except (OSError, ValueError):
        return True


def _recv_line(sock, limit=256):
    buf = b""
    while not buf.endswith(b"\n") and len(buf) < limit:
        chunk = sock.recv(1)
        if not chunk:
            break
        buf += chunk
    return buf.decode("ascii", "replace").strip()


def via_zygote(jobdir, data, req):
    """Run the job (``data``, parsed: ``req``) on the zygote: its exit code, or None to run it here
    (no zygote, not eligible, stale). Once the zygote has taken the job ("go"), this process only
    waits and relays signals."""
    if os.environ.get("EDGETUNE_AGENT_ZYGOTE", "1") == "0":
        return None
    if not zygote_eligible(req) or not _prctl(PR_SET_CHILD_SUBREAPER, 1):
        return None  # without a subreaper a job's process could outlive it, and pose as the zygote
    import array
    import socket
    import struct

    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(_zygote_name())
        cred = s.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        pid, uid, _ = struct.unpack("3i", cred)
        if uid != os.getuid() or not _is_zygote(pid):
            s.close()
            return None
    except OSError:
        s.close()
        return None
    try:
        head = json.dumps({"jobdir": os.path.abspath(jobdir), "agent_sha256": sha256_file(_agent_file()),
                           "size": len(data), "env": dict(os.environ)}).encode() + b"\n"
        s.sendmsg([head], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [1, 2]))])
        s.sendall(data)
        answer = _recv_line(s)
    except OSError:
        s.close()
        return None
    if not answer.startswith("go "):
        s.close()
        return None  # stale or refused: run it here
    pid = int(answer.split()[1])

    def relay(signum, frame):
        try:
            os.kill(pid, signum)
        except OSError:
            pass

    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(sig, relay)
    try:
        end = _recv_line(s)
    except OSError:
        end = ""
    s.close()
    return int(end.split()[1]) if end.startswith("rc ") else 70


def start_zygote():
    """Start this agent's zygote in the background (detached; it exits by itself when idle)."""
    if os.environ.get("EDGETUNE_AGENT_ZYGOTE", "1") == "0":
        return
    try:
        pid = os.fork()
    except OSError:
        return
    if pid:
        try:
            os.waitpid(pid, 0)
        except OSError:
            pass
        return
    try:
        os.setsid()
        if os.fork():
            os._exit(0)
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        os.closerange(3, 65536)
        os.execv(sys.executable, [sys.executable, _agent_file(), "serve"])
    finally:
        os._exit(0)


def cmd_serve():
    import socket
    import struct

    me = _agent_file()
    my_sha = sha256_file(me)  # first: the bytes this process runs are the ones it vouches for
    if not _prctl(PR_SET_CHILD_SUBREAPER, 1):
        return 0  # no subreaper here: orphans of a forked job could escape the supervisor
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        srv.bind(_zygote_name())
    except OSError:
        return 0  # another zygote serves this agent
    srv.listen(16)
    # (PyTorch where installed: its import and torch.compile's take ~1.6 s of a torch job; importing
    # them starts no thread and touches no GPU, so a forked job is as a fresh one)
    env = dict(os.environ)
    for mod in ("numpy", "onnxruntime", "ai_edge_litert.interpreter", "tflite_runtime.interpreter", "torch",
                "torch._dynamo"):
        try:
            __import__(mod)
        except Exception:
            pass
    os.environ.clear()  # what an import set for itself (torch._dynamo: TORCHINDUCTOR_CACHE_DIR) is not the
    os.environ.update(env)  # zygote's environment, which a client's must match
    stop = []
    signal.signal(signal.SIGTERM, lambda *a: stop.append(1))
    srv.settimeout(1.0)
    last, children = time.monotonic(), set()
    while not stop:
        while True:  # the jobs, and their orphans (this is their subreaper)
            try:
                pid = os.waitpid(-1, os.WNOHANG)[0]
            except ChildProcessError:
                pid = 0
            if not pid:
                break
            children.discard(pid)
        if not os.path.exists(me) or (not children and time.monotonic() - last > ZYGOTE_IDLE_S):
            break
        try:
            conn, _ = srv.accept()
        except socket.timeout:
            continue
        except OSError:
            break
        cred = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        if struct.unpack("3i", cred)[1] != os.getuid():
            conn.close()
            continue
        last = time.monotonic()
        try:
            pid = os.fork()
        except OSError:
            conn.close()
            continue
        if pid == 0:
            rc = 70
            try:
                srv.close()
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
                rc = _zygote_job(conn, my_sha)
            finally:
                os._exit(rc)
        conn.close()
        children.add(pid)
    srv.close()
    return 0


def _zygote_job(conn, my_sha):
    """One job in a child of the zygote: the client's stdout and stderr become ours, then the job
    runs exactly as run-stdio runs it."""
    import socket

    started = time.monotonic()
    msg, anc, _, _ = conn.recvmsg(1 << 20, socket.CMSG_SPACE(2 * 4))
    fds = []
    for level, kind, payload in anc:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds += list(memoryview(payload).cast("i")[: len(payload) // 4])
    line, _, rest = msg.partition(b"\n")
    head = json.loads(line.decode("utf-8"))
    env = head.get("env") if isinstance(head.get("env"), dict) else {}
    imported = [k for k in set(env) | set(os.environ) if k.startswith(ZYGOTE_ENV_AT_IMPORT)
                and env.get(k) != os.environ.get(k)]
    if head.get("agent_sha256") != my_sha or len(fds) != 2 or imported:
        conn.sendall(b"stale\n")
        os.kill(os.getppid(), signal.SIGTERM)  # this zygote runs old code: let it go
        return 0
    data = rest
    while len(data) < head["size"]:
        chunk = conn.recv(min(1 << 20, head["size"] - len(data)))
        if not chunk:
            return 0
        data += chunk
    os.environ.clear()  # the job's environment is its client's (what the runtimes read at import agrees)
    os.environ.update({str(k): str(v) for k, v in env.items()})
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(fds[0], 1)
    os.dup2(fds[1], 2)
    for fd in (null, *fds):
        os.close(fd)
    conn.sendall(("go %d\n" % os.getpid()).encode())
    rc = cmd_run_stdio(head["jobdir"], data, client=conn, started=started)
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except OSError:
        pass
    try:
        conn.sendall(("rc %d\n" % rc).encode())
    except OSError:
        pass
    return 0


_SITE_DONE = []


def _site():
    """The site-packages a ``python -S`` start skipped (the host starts the agent so)."""
    if sys.flags.no_site and not _SITE_DONE:
        import site

        site.main()
        _SITE_DONE.append(1)


# a one-node ONNX model (y = x + x, float32[2], opset 13): what gpu-check has each provider run
_PROBE_MODEL = "CAg6NQoOCgF4CgF4EgF5IgNBZGQSAWdaDwoBeBIKCggIARIECgIIAmIPCgF5EgoKCAgBEgQKAggCQgQKABAN"


def _check_ort_provider(provider):
    import base64

    import numpy as np
    import onnxruntime as ort

    if provider not in ort.get_available_providers():
        return False, "onnxruntime %s has no %s (onnxruntime-gpu)" % (ort.__version__, provider)
    so = ort.SessionOptions()
    so.log_severity_level = 3
    sess, why = open_ort_session(ort, base64.b64decode(_PROBE_MODEL), so, provider, [provider])
    if why is not None:
        return False, "it did not load: %s" % why
    y = sess.run(None, {"x": np.array([1.5, -2.0], np.float32)})[0]
    if y.tolist() != [3.0, -4.0]:
        return False, "it ran a one-node model and returned %r, not [3.0, -4.0]" % (y.tolist(),)
    return True, "onnxruntime %s ran a model on it" % ort.__version__


def _check_torch_cuda():
    import torch

    if not torch.cuda.is_available():
        if torch.version.cuda is None:
            return False, "PyTorch %s is a CPU build" % torch.__version__
        return False, "PyTorch %s (CUDA %s) sees no GPU" % (torch.__version__, torch.version.cuda)
    x = torch.arange(4.0, device="cuda")
    if (x + x).cpu().tolist() != [0.0, 2.0, 4.0, 6.0]:
        return False, "a sum on the GPU came back wrong"
    return True, "PyTorch %s (CUDA %s) ran on %s" % (torch.__version__, torch.version.cuda,
                                                     torch.cuda.get_device_name(0))


def _check_tvm_cuda():
    import tvm

    _tvm_device(tvm, {"device": "cuda"})
    return True, "TVM %s opened the GPU" % tvm.__version__


def _check_sanitizer():
    import shutil

    exe = shutil.which("compute-sanitizer")
    if exe is None and os.access("/usr/local/cuda/bin/compute-sanitizer", os.X_OK):
        exe = "/usr/local/cuda/bin/compute-sanitizer"
    return (True, exe) if exe else (False, "not on PATH nor in /usr/local/cuda/bin")


# (feature, what uses it, check, the module it needs or None)
GPU_FEATURES = (
    ("onnxruntime CUDA", "tune: CUDA candidates; judge, tune-kernels: ort-cuda baselines",
     lambda: _check_ort_provider("CUDAExecutionProvider"), "onnxruntime"),
    ("onnxruntime TensorRT", "tune: TensorRT candidates",
     lambda: _check_ort_provider("TensorrtExecutionProvider"), "onnxruntime"),
    ("PyTorch CUDA", "judge, tune-kernels: torch-cuda baselines", _check_torch_cuda, "torch"),
    ("TVM CUDA", "tune-kernels --gpu; tune: the tvm-relax CUDA build", _check_tvm_cuda, "tvm"),
    ("compute-sanitizer", "judge: memcheck, racecheck", _check_sanitizer, None),
)


def cmd_gpu_check():
    """What of edgetune's GPU paths this Python can take, each tried for real (a one-node model on
    each onnxruntime provider, a sum in PyTorch, TVM opening the GPU): one JSON line,
    {"features": [{"feature", "used_by", "ok", "detail"}]}. What the libraries print is kept off
    stdout (the answer's)."""
    import contextlib
    import importlib.util
    import io

    features = []
    for name, used_by, check, module in GPU_FEATURES:
        with contextlib.redirect_stdout(io.StringIO()):
            try:
                if module is not None and importlib.util.find_spec(module) is None:
                    ok, detail = False, "%s is not installed in %s" % (module, sys.executable)
                else:
                    ok, detail = check()
            except Exception as exc:
                ok, detail = False, "%s: %s" % (type(exc).__name__, exc)
        features.append({"feature": name, "used_by": used_by, "ok": bool(ok), "detail": str(detail)[:400]})
    sys.stdout.write(json.dumps({"features": features}) + "\n")
    return 0


def cmd_tvm_device(device):
    """Can this Python's TVM run kernels on DEVICE, the way the tvm backends open it? One JSON line:
    {"ok": true} or {"ok": false, "why": ...} (the loader's reason where there is one)."""
    try:
        import tvm

        _tvm_device(tvm, {"device": device})
        out = {"ok": True}
    except Exception as exc:
        out = {"ok": False, "why": ("%s: %s" % (type(exc).__name__, exc))[:400]}
    sys.stdout.write(json.dumps(out) + "\n")
    return 0


def main(argv):
    if not (len(argv) == 3 and argv[1] == "run-stdio"):
        _site()
    if len(argv) >= 2 and argv[1] == "info":
        return cmd_info()
    if len(argv) == 3 and argv[1] == "run":
        return cmd_run(argv[2])
    if len(argv) == 3 and argv[1] == "run-stdio":
        data = sys.stdin.buffer.read()
        req = _loads(data)
        rc = via_zygote(argv[2], data, req)
        if rc is not None:
            return rc
        _site()
        rc = cmd_run_stdio(argv[2], data)
        try:
            sys.stdout.flush()
        except OSError:
            pass
        if zygote_eligible(req):
            start_zygote()  # for the next job, after this one: never beside a timed run
        return rc
    if len(argv) == 2 and argv[1] == "serve":
        return cmd_serve()
    if len(argv) >= 2 and argv[1] == "version":
        sys.stdout.write("%d %s %s\n" % (PROTOCOL, AGENT, AGENT_VERSION))
        return 0
    if len(argv) == 3 and argv[1] == "tvm-device":
        return cmd_tvm_device(argv[2])
    if len(argv) == 2 and argv[1] == "gpu-check":
        return cmd_gpu_check()
    sys.stderr.write("usage: edgetune_agent.py info | run JOBDIR | run-stdio JOBDIR | serve | version"
                     " | tvm-device cpu|cuda | gpu-check\n")
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
