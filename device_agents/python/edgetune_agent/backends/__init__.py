"""The backends a request may name (``"backend"``), one module each. Each is a class built from
(model path, params, input names, outputs) with ``poison()``, ``run(inputs)``, ``results()`` and,
where it has them, ``stage(inputs)`` (uploads outside the timed run), ``live()`` (the late-write
check), ``input_check``, ``info`` and ``placement``; its runtime is imported when a job loads it."""

from .adapter import AdapterBackend
from .openvino import OpenvinoBackend
from .ort import OrtBackend
from .tflite import TfliteBackend
from .torch import TorchBackend
from .tvm import TvmKernelBackend, TvmRelaxBackend


BACKENDS = {"ort": OrtBackend, "tflite": TfliteBackend, "tvm-relax": TvmRelaxBackend, "tvm-kernel": TvmKernelBackend,
            "adapter": AdapterBackend, "torch": TorchBackend, "openvino": OpenvinoBackend}
