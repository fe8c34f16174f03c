"""Bug: NaN outputs."""
import numpy as np
import onnxruntime as ort


def load(model_path, params):
    sess = ort.InferenceSession(model_path, providers=["CPUExecutionProvider"])
    names = [i.name for i in sess.get_inputs()]

    def run(inputs):
        outs = sess.run(None, dict(zip(names, inputs)))
        for o in outs:
            o.reshape(-1)[::3] = np.nan
        return outs
    return run
