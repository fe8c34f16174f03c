"""Returns a cached output whatever the input (a 'fast' candidate that computes nothing)."""
import onnxruntime as ort


def load(model_path, params):
    sess = ort.InferenceSession(model_path, providers=["CPUExecutionProvider"])
    names = [i.name for i in sess.get_inputs()]
    cache = []

    def run(inputs):
        if not cache:
            cache.append(sess.run(None, dict(zip(names, inputs))))
        return cache[0]
    return run
