"""Leaves a detached helper behind: at load it starts a grandchild (double fork + setsid, so it is
in no process group or session of the agent's) that sleeps 600 s holding the stdout and stderr it
inherited; then it runs the model correctly. The job is right (``ok``); the supervisor must kill
the helper when the job ends and the job must come back at once, not after 600 s."""
import os
import time

import onnxruntime as ort


def load(model_path, params):
    child = os.fork()
    if child == 0:  # the child: a new session, then the grandchild, then gone
        try:
            os.setsid()
            if os.fork() == 0:
                time.sleep(600)
        finally:
            os._exit(0)
    os.waitpid(child, 0)
    sess = ort.InferenceSession(model_path, providers=["CPUExecutionProvider"])
    names = [i.name for i in sess.get_inputs()]
    return lambda inputs: sess.run(None, dict(zip(names, inputs)))
