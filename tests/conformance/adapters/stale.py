"""Cheat: correct for its first dozen calls, then returns its last outputs without computing."""
import onnxruntime as ort


def load(model_path, params):
    sess = ort.InferenceSession(model_path, providers=["CPUExecutionProvider"])
    names = [i.name for i in sess.get_inputs()]
    state = {"calls": 0, "last": None}

    def run(inputs):
        state["calls"] += 1
        if state["calls"] <= 12 or state["last"] is None:
            state["last"] = sess.run(None, dict(zip(names, inputs)))
        return state["last"]
    return run
