"""Non-deterministic: noise within the accuracy tolerance (2e-5 of scale) but different on every call."""
import numpy as np
import onnxruntime as ort


def load(model_path, params):
    sess = ort.InferenceSession(model_path, providers=["CPUExecutionProvider"])
    names = [i.name for i in sess.get_inputs()]
    rng = np.random.default_rng()

    def run(inputs):
        outs = sess.run(None, dict(zip(names, inputs)))
        return [o + (rng.uniform(-2e-5, 2e-5, o.shape) * np.abs(o).max()).astype(o.dtype) for o in outs]
    return run
