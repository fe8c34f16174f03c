"""Cheat: memoizes results on the bytes of its inputs (fast whenever an input comes back)."""
import hashlib

import onnxruntime as ort


def load(model_path, params):
    sess = ort.InferenceSession(model_path, providers=["CPUExecutionProvider"])
    names = [i.name for i in sess.get_inputs()]
    cache = {}

    def run(inputs):
        key = hashlib.blake2b(b"".join(a.tobytes() for a in inputs), digest_size=16).digest()
        hit = cache.get(key)
        if hit is None:
            hit = cache[key] = [o.copy() for o in sess.run(None, dict(zip(names, inputs)))]
        return hit
    return run
