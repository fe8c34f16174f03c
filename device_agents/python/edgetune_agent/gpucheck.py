"""``gpu-check`` and ``tvm-device``: each of edgetune's GPU paths tried for real in this Python."""

import json
import os
import sys

from .backends.ort import open_ort_session
from .backends.tvm import _tvm_device


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
