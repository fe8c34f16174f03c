"""A lazy result: returns objects that compute only when converted to arrays. Honest only if the
conversion is timed; it sleeps 20 ms in the conversion so a test can prove it was."""
import time

import numpy as np
import onnxruntime as ort


class Lazy:
    def __init__(self, fn, k):
        self.fn, self.k = fn, k

    def __array__(self, dtype=None, copy=None):
        time.sleep(0.02)
        out = self.fn()[self.k]
        return out if dtype is None else out.astype(dtype)


def load(model_path, params):
    sess = ort.InferenceSession(model_path, providers=["CPUExecutionProvider"])
    names = [i.name for i in sess.get_inputs()]
    n_out = len(sess.get_outputs())

    def run(inputs):
        feeds = dict(zip(names, [a.copy() for a in inputs]))
        memo = {}

        def compute():
            if "y" not in memo:
                memo["y"] = sess.run(None, feeds)
            return memo["y"]
        return [Lazy(compute, k) for k in range(n_out)]
    return run
