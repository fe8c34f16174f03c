"""Deliberately wrong numerics: the right computation, then 1% of the output scale added."""
import numpy as np
import onnxruntime as ort


def load(model_path, params):
    sess = ort.InferenceSession(model_path, providers=["CPUExecutionProvider"])
    names = [i.name for i in sess.get_inputs()]

    def run(inputs):
        outs = sess.run(None, dict(zip(names, inputs)))
        return [o + np.float32(0.01) * np.abs(o).max() for o in outs]
    return run
