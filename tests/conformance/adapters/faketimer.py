"""Cheat: computes honestly but patches the clock the agent times it with, so every call seems to
take a nanosecond (in-process code can do that; the roofline check cannot be patched from here)."""
import itertools
import sys
import time

import onnxruntime as ort


def load(model_path, params):
    sess = ort.InferenceSession(model_path, providers=["CPUExecutionProvider"])
    names = [i.name for i in sess.get_inputs()]
    ticks = itertools.count(time.perf_counter_ns())
    fake = lambda: next(ticks)  # noqa: E731
    time.perf_counter_ns = fake
    agent = sys.modules.get("__main__")
    for name in dir(agent):
        if getattr(agent, name) is not None and getattr(getattr(agent, name), "__name__", "") == "perf_counter_ns":
            setattr(agent, name, fake)
    return lambda inputs: sess.run(None, dict(zip(names, inputs)))
