"""Right outputs, but it scribbles on its inputs afterwards."""
import onnxruntime as ort


def load(model_path, params):
    sess = ort.InferenceSession(model_path, providers=["CPUExecutionProvider"])
    names = [i.name for i in sess.get_inputs()]

    def run(inputs):
        outs = sess.run(None, dict(zip(names, inputs)))
        inputs[0][...] = 0
        return outs
    return run
