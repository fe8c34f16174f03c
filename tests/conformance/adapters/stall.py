"""Cheat: slow on purpose in its first warm-up call (a 30 ms stall, as a busy machine gives), then
right until its 12th call, then its last outputs without computing. An agent that planned the timed
run from the warm-up's mean time would time a few calls only, all among the honest dozen."""
import time

import onnxruntime as ort


def load(model_path, params):
    sess = ort.InferenceSession(model_path, providers=["CPUExecutionProvider"])
    names = [i.name for i in sess.get_inputs()]
    state = {"calls": 0, "last": None}

    def run(inputs):
        state["calls"] += 1
        if state["calls"] == 5:  # 3 input sets and the repeat are checked first: the first warm-up call
            time.sleep(0.030)
        if state["calls"] <= 12 or state["last"] is None:
            state["last"] = sess.run(None, dict(zip(names, inputs)))
        return state["last"]
    return run
