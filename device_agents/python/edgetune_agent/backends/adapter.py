"""Backend ``adapter``: a user's Python file that loads a model and returns a callable."""


class AdapterBackend:
    """A user-supplied Python adapter (e.g. a vendor NPU runtime): the artifact is a .py file
    defining load(model_path, params) -> callable(list[np.ndarray]) -> list[np.ndarray]."""

    def __init__(self, model_path, params, input_names, outputs, adapter_path=None):
        import importlib.util

        spec = importlib.util.spec_from_file_location("edgetune_adapter", adapter_path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        self.fn = mod.load(model_path, params)
        self._last = None
        import numpy as np

        self.np = np

    input_check = "runtime buffers"  # the adapter gets the agent's arrays themselves

    def poison(self):
        pass

    def run(self, inputs):
        # materialised inside the timed region: a lazily computed result pays for itself here
        self._last = [self.np.asarray(o) for o in self.fn(inputs)]

    def results(self):
        return [self.np.array(o) for o in self._last]

    def live(self):
        return self._last
