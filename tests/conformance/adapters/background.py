"""Cheat: once warm, returns an output buffer at once and fills it from a background thread a few
milliseconds later, so the timed call measures almost nothing."""
import threading
import time

import numpy as np
import onnxruntime as ort


def load(model_path, params):
    sess = ort.InferenceSession(model_path, providers=["CPUExecutionProvider"])
    names = [i.name for i in sess.get_inputs()]
    state = {"calls": 0}

    def run(inputs):
        state["calls"] += 1
        if state["calls"] <= 12:
            return sess.run(None, dict(zip(names, inputs)))
        feeds = dict(zip(names, [a.copy() for a in inputs]))
        outs = [np.full(o.shape, np.nan, np.float32) for o in sess.get_outputs() for o in [_shape(o, inputs)]]

        def later():
            time.sleep(0.002)
            for buf, val in zip(outs, sess.run(None, feeds)):
                buf[...] = val
        threading.Thread(target=later, daemon=True).start()
        return outs
    return run


class _S:
    def __init__(self, shape):
        self.shape = shape


def _shape(o, inputs):
    # output shape with the batch taken from the first input (the conformance model is [batch, n] -> [batch, m])
    return _S([inputs[0].shape[0]] + [int(d) for d in o.shape[1:]])
