"""Backend ``openvino``: OpenVINO on an ONNX model, compiled with only the properties a candidate sets."""

import sys


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
