#!/usr/bin/env python3
"""edgetune device agent (Python), protocol 1 — see device_agents/PROTOCOL.md.

Runs ON the device. Standard library + numpy + whichever runtime the job names (onnxruntime,
ai_edge_litert / tflite_runtime, tvm). It never sees a reference output: it runs, times and returns
raw outputs; the host decides whether they are right.
"""

import hashlib
import json
import math
import os
import platform
import sys
import time

PROTOCOL = 1
AGENT = "python"
AGENT_VERSION = "1.0.0"


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
    return {
        "cpu_model": model or platform.processor() or platform.machine(),
        "soc": hardware,
        "cores": cores,
        "max_freq_khz": freqs,
        "kernel": platform.release(),
        "os": os_name or platform.platform(),
        "governor": _read("/sys/devices/system/cpu/cpu0/cpufreq/scaling_governor"),
        "emulated": os.environ.get("EDGETUNE_EMULATED") or None,
    }


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
    return {"freq_khz": freqs or None, "temp_mc": temp}


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
    try:  # importing tvm takes ~1 s: look it up instead
        import importlib.metadata
        import importlib.util

        if importlib.util.find_spec("tvm") is not None:
            try:
                out["tvm"] = importlib.metadata.version("apache-tvm")
            except importlib.metadata.PackageNotFoundError:
                out["tvm"] = "unknown"
    except Exception:
        pass
    return out


def backend_versions(backend):
    """Versions of what this job uses only (importing every runtime would cost seconds per job)."""
    import numpy

    out = {"numpy": numpy.__version__}
    mods = {"ort": ("onnxruntime",), "tflite": ("ai_edge_litert", "tflite_runtime"), "tvm-relax": ("tvm",)}
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
class OrtBackend:
    """onnxruntime with the candidate's session options; outputs bound to NaN-poisoned buffers."""

    def __init__(self, model_path, params, input_names, outputs):
        import numpy as np
        import onnxruntime as ort

        so = ort.SessionOptions()
        so.log_severity_level = 3
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
        provider = params.get("execution_provider", "CPUExecutionProvider")
        self.sess = ort.InferenceSession(model_path, so, providers=[provider])
        self.np = np
        self.input_names = input_names
        self.outputs = outputs
        self.binding = self.sess.io_binding()
        self.out_bufs = [np.empty(o["shape"], dtype=o["dtype"]) for o in outputs]
        self._bound_inputs = None

    def bind(self, inputs):
        if self._bound_inputs is not inputs:
            self.binding.clear_binding_inputs()
            for name, arr in zip(self.input_names, inputs):
                self.binding.bind_cpu_input(name, arr)
            self.binding.clear_binding_outputs()
            for o, buf in zip(self.outputs, self.out_bufs):
                self.binding.bind_output(o["name"], "cpu", 0, buf.dtype, list(buf.shape), buf.ctypes.data)
            self._bound_inputs = inputs

    def poison(self):
        for buf in self.out_bufs:
            if buf.dtype.kind == "f":
                buf.fill(self.np.nan)

    def run(self, inputs):
        self.bind(inputs)
        self.sess.run_with_iobinding(self.binding)

    def results(self):
        return [b.copy() for b in self.out_bufs]


class TfliteBackend:
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

    def _prepare(self, inputs):
        shapes = tuple(a.shape for a in inputs)
        if self._allocated_for != shapes:
            for d, a in zip(self.in_details, inputs):
                if tuple(d["shape"]) != a.shape:
                    self.interp.resize_tensor_input(d["index"], a.shape)
            self.interp.allocate_tensors()
            self._allocated_for = shapes
            self._current = None
        if self._current is not inputs:
            for d, a in zip(self.in_details, inputs):
                self.interp.set_tensor(d["index"], a)
            self._current = inputs

    def poison(self):
        if self._allocated_for is None:
            return
        for d in self.out_details:
            view = self.interp.tensor(d["index"])()
            if view.dtype.kind == "f":
                view.fill(self.np.nan)
            del view

    def run(self, inputs):
        self._prepare(inputs)
        self.interp.invoke()

    def results(self):
        return [self.np.array(self.interp.get_tensor(d["index"])) for d in self.out_details]


class TvmRelaxBackend:
    """A Relax module exported by edgetune.build.tvm_relax, run in the TVM runtime's VM."""

    def __init__(self, model_path, params, input_names, outputs):
        import numpy as np
        import tvm
        from tvm import relax

        if "num_threads" in params:
            os.environ["TVM_NUM_THREADS"] = str(params["num_threads"])
        self.np = np
        self.tvm = tvm
        dev = tvm.cpu(0)
        self.dev = dev
        lib = tvm.runtime.load_module(model_path)
        self.vm = relax.VirtualMachine(lib, dev)
        self.fn = self.vm["main"]
        self._cache_key = None
        self._args = None
        self._last = None

    def _tensor(self, a):
        tvm = self.tvm
        if hasattr(tvm.runtime, "tensor"):
            return tvm.runtime.tensor(a, self.dev)
        return tvm.nd.array(a, self.dev)

    def poison(self):
        pass  # the VM allocates outputs itself

    def run(self, inputs):
        if self._cache_key is not inputs:
            self._args = [self._tensor(a) for a in inputs]
            self._cache_key = inputs
        self._last = self.fn(*self._args)

    def results(self):
        out = self._last
        items = list(out) if isinstance(out, (list, tuple)) or type(out).__name__ in ("Array", "ArrayObj") else [out]
        return [self.np.array(o.numpy()) for o in items]


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

    def poison(self):
        pass

    def run(self, inputs):
        self._last = self.fn(inputs)

    def results(self):
        import numpy as np

        return [np.array(o) for o in self._last]


BACKENDS = {"ort": OrtBackend, "tflite": TfliteBackend, "tvm-relax": TvmRelaxBackend, "adapter": AdapterBackend}


# --------------------------------------------------------------------------------------------- run
def _path(jobdir, p):
    return p if os.path.isabs(p) else os.path.normpath(os.path.join(jobdir, p))


def _write_json_atomic(path, obj):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def run_job(jobdir, req):
    import numpy as np

    result = {"protocol": PROTOCOL, "status": "error", "reason": "", "agent": AGENT,
              "agent_version": AGENT_VERSION, "clock": "perf_counter_ns",
              "runtime_versions": {}, "device_state": device_state()}
    if req.get("protocol") != PROTOCOL:
        result["reason"] = "unsupported protocol %r (agent speaks %d)" % (req.get("protocol"), PROTOCOL)
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

    input_sets = [[np.load(_path(jobdir, f), allow_pickle=False) for f in files] for f_i, files in
                  enumerate(req["inputs"])]
    result["input_sha256_before"] = [sha256_array(a) for s in input_sets for a in s]
    params = req.get("params", {})
    result["runtime_versions"] = backend_versions(backend_name)

    t0 = time.perf_counter_ns()
    try:
        backend = BACKENDS[backend_name](model_path, params, req["input_names"], req["outputs"], **extra)
    except Exception as exc:
        result["reason"] = "load failed: %s: %s" % (type(exc).__name__, str(exc).strip().splitlines()[0][:300]
                                                      if str(exc).strip() else "")
        return result
    result["load_ms"] = (time.perf_counter_ns() - t0) / 1e6

    out_files = []
    try:
        for i, inputs in enumerate(input_sets):
            backend.poison()
            backend.run(inputs)
            names = []
            for k, arr in enumerate(backend.results()):
                name = "out_%d_%d.npy" % (i, k)
                np.save(os.path.join(jobdir, name), arr, allow_pickle=False)
                names.append(name)
            out_files.append(names)
        result["outputs"] = out_files

        ts = int(req.get("timing_set", 0))
        timed = input_sets[ts]
        backend.poison()
        backend.run(timed)
        reps = []
        for k, arr in enumerate(backend.results()):
            name = "rep_%d.npy" % k
            np.save(os.path.join(jobdir, name), arr, allow_pickle=False)
            reps.append(name)
        result["repeat_outputs"] = reps

        # warm-up (discarded), then an iteration count from the estimate
        warmup_ns = float(req.get("warmup_ms", 20.0)) * 1e6
        clock = time.perf_counter_ns
        w_iters = 0
        w_start = clock()
        while True:
            backend.run(timed)
            w_iters += 1
            if clock() - w_start >= warmup_ns:
                break
        est = (clock() - w_start) / w_iters
        budget_ns = float(req.get("budget_ms", 200.0)) * 1e6
        n = int(budget_ns // est) if est > 0 else 1
        n = max(int(req.get("min_iters", 3)), min(int(req.get("max_iters", 100000)), n))
        samples = [0] * n
        run = backend.run
        for i in range(n):
            s = clock()
            run(timed)
            samples[i] = clock() - s
        result["warmup_iters"] = w_iters
        result["samples_ns"] = samples
    except Exception as exc:
        msg = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else ""
        result["reason"] = "run failed: %s: %s" % (type(exc).__name__, msg)
        return result
    result["input_sha256_after"] = [sha256_array(a) for s in input_sets for a in s]
    result["device_state_after"] = device_state()
    result["status"] = "ok"
    return result


def cmd_run(jobdir):
    with open(os.path.join(jobdir, "request.json")) as f:
        req = json.load(f)
    result = run_job(jobdir, req)
    _write_json_atomic(os.path.join(jobdir, "result.json"), result)
    return 0


def cmd_run_stdio(jobdir):
    """One round trip per job: request on stdin, result + outputs back as one bundle on stdout
    ("EDGETUNE-BUNDLE 1\n" {"NAME SIZE\n" bytes}* "END\n"); the job dir is removed afterwards."""
    data = sys.stdin.buffer.read()
    os.makedirs(jobdir, exist_ok=True)
    with open(os.path.join(jobdir, "request.json"), "wb") as f:
        f.write(data)
    req = json.loads(data.decode("utf-8"))
    real_stdout = os.dup(1)
    os.dup2(2, 1)  # anything a runtime prints must not corrupt the bundle
    try:
        result = run_job(jobdir, req)
        _write_json_atomic(os.path.join(jobdir, "result.json"), result)
    finally:
        sys.stdout.flush()
        os.dup2(real_stdout, 1)
        os.close(real_stdout)
    out = sys.stdout.buffer
    out.write(b"EDGETUNE-BUNDLE 1\n")
    names = ["result.json"] + sorted(n for n in os.listdir(jobdir) if n.endswith(".npy"))
    for name in names:
        with open(os.path.join(jobdir, name), "rb") as f:
            blob = f.read()
        out.write(("%s %d\n" % (name, len(blob))).encode())
        out.write(blob)
    out.write(b"END\n")
    out.flush()
    for name in os.listdir(jobdir):
        os.unlink(os.path.join(jobdir, name))
    os.rmdir(jobdir)
    return 0


def main(argv):
    if len(argv) >= 2 and argv[1] == "info":
        return cmd_info()
    if len(argv) == 3 and argv[1] == "run":
        return cmd_run(argv[2])
    if len(argv) == 3 and argv[1] == "run-stdio":
        return cmd_run_stdio(argv[2])
    if len(argv) >= 2 and argv[1] == "version":
        sys.stdout.write("%d %s %s\n" % (PROTOCOL, AGENT, AGENT_VERSION))
        return 0
    sys.stderr.write("usage: edgetune_agent.py info | run JOBDIR | run-stdio JOBDIR | version\n")
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
