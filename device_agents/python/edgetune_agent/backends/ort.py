"""Backend ``ort``: onnxruntime, its execution providers (CUDA, TensorRT) and IO binding."""

import json
import os

from ..common import work_dir


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
            popts["trt_engine_cache_path"] = os.path.join(work_dir(), cache)
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
