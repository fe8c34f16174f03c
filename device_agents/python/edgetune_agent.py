#!/usr/bin/env python3
"""edgetune device agent (Python), protocol 2 — see device_agents/PROTOCOL.md.

Runs ON the device. Standard library + numpy + whichever runtime the job names (onnxruntime,
ai_edge_litert / tflite_runtime, tvm). It never sees a reference output: it runs, times and returns
raw outputs; the host decides whether they are right.
"""

import hashlib
import json
import os
import platform
import sys
import time

PROTOCOL = 2
AGENT = "python"
AGENT_VERSION = "2.0.0"
M64 = (1 << 64) - 1


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

    input_check = "runtime buffers"  # onnxruntime reads the agent's buffers, bound by pointer

    def bind(self, inputs):
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

    def run(self, inputs):
        self.bind(inputs)
        self.sess.run_with_iobinding(self.binding)

    def results(self):
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

    input_check = "agent copy (the VM's tensors are copied from the agent's buffers)"

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
        else:  # every run: the agent changes inputs in place
            for t, a in zip(self._args, inputs):
                t.copyfrom(a)
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

    np.save(os.path.join(jobdir, name), arr, allow_pickle=False)
    return name


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

    # the host's input sets stay with the agent; the candidate only ever sees the work buffers
    input_sets = [[np.load(_path(jobdir, f), allow_pickle=False) for f in files] for files in req["inputs"]]
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
        result["reason"] = "load failed: %s: %s" % (type(exc).__name__, str(exc).strip().splitlines()[0][:300]
                                                      if str(exc).strip() else "")
        return result
    result["load_ms"] = (time.perf_counter_ns() - t0) / 1e6
    result["input_check"] = getattr(backend, "input_check", "agent copy")

    def work_sha():
        return [sha256_array(a) for a in work]

    clock = time.perf_counter_ns
    try:
        # 1. every input set once into poisoned outputs, then set 0 again (determinism)
        out_files, after = [], []
        for i, base in enumerate(input_sets):
            fill_set(work, base)
            backend.poison()
            backend.run(work)
            out_files.append([_save(jobdir, "out_%d_%d.npy" % (i, k), a) for k, a in enumerate(backend.results())])
            after.append(work_sha())
        result["outputs"] = out_files
        result["input_sha256_after_sets"] = after
        fill_set(work, input_sets[0])
        backend.poison()
        backend.run(work)
        result["repeat_outputs"] = [_save(jobdir, "rep_%d.npy" % k, a) for k, a in enumerate(backend.results())]

        # 2. warm-up on fresh inputs (iterations 0..W-1), then an iteration count from the estimate
        warmup_ns = float(req.get("warmup_ms", 20.0)) * 1e6
        max_iters = int(req.get("max_iters", 100000))
        t = 0
        spent = 0
        while True:
            fill_fresh(work, input_sets, seed, t)
            backend.poison()
            s0 = clock()
            backend.run(work)
            spent += clock() - s0
            t += 1
            if spent >= warmup_ns or t >= max_iters:  # bounded even if the clock is not to be trusted
                break
        result["warmup_iters"] = t
        result["first_timed_iter"] = t
        est = spent / t
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
        # no more time than the timed loop's budget (the host judges TEST04 only from 8 pairs up)
        probe_pairs = min(probe_pairs, int(budget_ns // (2 * est)) if est > 0 else probe_pairs)
        if probe_pairs:  # the repeated input once untimed first: a cache would hold it from here on
            fill_fresh(work, input_sets, seed, rep_t)
            run(work)
        for i in range(probe_pairs):
            # the order alternates within pairs, so an effect of running first or second cancels out
            for repeat in ((True, False) if i % 2 == 0 else (False, True)):
                if repeat:
                    fill_fresh(work, input_sets, seed, rep_t)
                else:
                    fill_fresh(work, input_sets, seed, t)
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

    except Exception as exc:
        msg = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else ""
        result["reason"] = "run failed: %s: %s" % (type(exc).__name__, msg)
        return result
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
