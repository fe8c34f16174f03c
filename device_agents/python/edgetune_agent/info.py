"""``info``: what the device is (fingerprint: CPU, cores, clocks, kernel, OS, NVIDIA GPUs), what it
can run (runtimes and their versions, the CPU's native precisions) and the state it is in now."""

import json
import os
import platform
import sys

from .backends.openvino import import_openvino, ov_precision_name
from .common import AGENT, AGENT_VERSION, PROTOCOL, _read


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
