"""Backend ``tflite``: LiteRT (``ai_edge_litert``, else ``tflite_runtime``), XNNPACK on or off, and
the layout mapping of a model converted from ONNX."""


class TfliteBackend:
    # the interpreter copies inputs into its own arena (set_tensor, every run): what it reads is that copy
    input_check = "agent copy (the interpreter copies inputs)"

    def __init__(self, model_path, params, input_names, outputs):
        import numpy as np

        try:
            from ai_edge_litert.interpreter import Interpreter, OpResolverType
        except ImportError:
            from tflite_runtime.interpreter import Interpreter, OpResolverType
        kwargs = {"model_path": model_path}
        if "num_threads" in params:
            kwargs["num_threads"] = int(params["num_threads"])
        if params.get("xnnpack") is False or params.get("xnnpack") == 0:
            kwargs["experimental_op_resolver_type"] = OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES
        self.interp = Interpreter(**kwargs)
        self.np = np
        self.in_details = self.interp.get_input_details()
        self.out_details = self.interp.get_output_details()
        self._allocated_for = None
        self._current = None
        # a converted model's layout mapping (PROTOCOL.md, tflite): request input k goes to tensor
        # inputs[k].index as x.transpose(perm); request output k is tensor outputs[k].index transposed
        # by its perm. Without one (a user's own .tflite): the model's tensors in its own order.
        self.in_map = self.out_map = None
        if "inputs" in params or "outputs" in params:
            self.in_map = [(int(m["index"]), tuple(int(x) for x in m["perm"])) for m in params["inputs"]]
            self.out_map = [(int(m["index"]), tuple(int(x) for x in m["perm"])) for m in params["outputs"]]
            if len(self.in_map) != len(input_names) or len(self.out_map) != len(outputs):
                raise ValueError("layout mapping has %d inputs and %d outputs, the request %d and %d"
                                 % (len(self.in_map), len(self.out_map), len(input_names), len(outputs)))
            self.interp.allocate_tensors()  # a converted model has static shapes
            self._allocated_for = "mapped"
            self._in_tensors = [self.interp.tensor(index) for index, _ in self.in_map]
            self._out_moved = [(k, self.interp.tensor(index), perm) for k, (index, perm) in enumerate(self.out_map)
                               if perm != tuple(range(len(perm)))]
            self._outs = {}

    def _prepare(self, inputs):
        shapes = tuple(a.shape for a in inputs)
        if self._allocated_for != shapes:
            for d, a in zip(self.in_details, inputs):
                if tuple(d["shape"]) != a.shape:
                    self.interp.resize_tensor_input(d["index"], a.shape)
            self.interp.allocate_tensors()
            self._allocated_for = shapes
            self._current = None
        for d, a in zip(self.in_details, inputs):  # every run: the agent changes inputs in place
            self.interp.set_tensor(d["index"], a)

    def poison(self):
        if self._allocated_for is None:
            return
        for d in self.out_details:
            view = self.interp.tensor(d["index"])()
            if view.dtype.kind == "f":
                view.fill(self.np.nan)
            del view

    def run(self, inputs):
        if self.in_map is None:
            self._prepare(inputs)
            self.interp.invoke()
            return
        # a converted model's layout conversion is its own cost, so it is inside the timed call
        # (PROTOCOL.md, tflite): each input transposed straight into the interpreter's tensor (one
        # pass; a view must not outlive the call, invoke refuses while one exists), and each output
        # whose layout differs transposed back to the ONNX layout after it
        for tensor, (_, perm), a in zip(self._in_tensors, self.in_map, inputs):
            view, src = tensor(), a.transpose(perm)
            if view.shape != src.shape:  # copyto would broadcast where set_tensor refuses
                shape = list(view.shape)
                del view
                raise ValueError("input of shape %s for a tensor of shape %s" % (list(src.shape), shape))
            self.np.copyto(view, src, casting="no")
            del view
        self.interp.invoke()
        for k, tensor, perm in self._out_moved:
            # a copy each run, always (ascontiguousarray would return the interpreter's own memory
            # where the transpose only moves dimensions of size 1)
            self._outs[k] = self.np.array(tensor().transpose(perm), order="C")

    def results(self):
        if self.out_map is not None:
            return [self._outs[k] if k in self._outs else self.np.array(self.interp.get_tensor(index))
                    for k, (index, _) in enumerate(self.out_map)]
        return [self.np.array(self.interp.get_tensor(d["index"])) for d in self.out_details]
