"""Cheat: once warm, skips the work on a random half of its calls (returning its last outputs), so
that a few randomly checked iterations would often all look right."""
import random

import onnxruntime as ort


def load(model_path, params):
    sess = ort.InferenceSession(model_path, providers=["CPUExecutionProvider"])
    names = [i.name for i in sess.get_inputs()]
    state = {"calls": 0, "last": None}
    rng = random.Random()

    def run(inputs):
        state["calls"] += 1
        if state["calls"] <= 12 or state["last"] is None or rng.random() < 0.5:
            state["last"] = sess.run(None, dict(zip(names, inputs)))
        return state["last"]
    return run
