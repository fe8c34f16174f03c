"""A float64 reference for zoo models: the same graph with double weights and I/O, run by
``onnx.reference.ReferenceEvaluator`` (the ONNX spec's own Python implementation).

Runtimes compute in float32; comparing their outputs to this reference (norm-relative error)
checks both the runtime and that the model keeps its activations at a sane scale.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper

# (op_type, input index) whose float tensors the spec fixes to float32 whatever T is
_KEEP_FLOAT32 = {("Resize", 2)}


def float64_copy(model: onnx.ModelProto) -> onnx.ModelProto:
    """Copy of ``model`` with float32 initializers, Constant values, inputs and outputs as double."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    g = m.graph
    keep = {n.input[i] for n in g.node for (op, i) in _KEEP_FLOAT32
            if n.op_type == op and len(n.input) > i and n.input[i]}
    for idx, t in enumerate(g.initializer):
        if t.data_type == TensorProto.FLOAT and t.name not in keep:
            arr = numpy_helper.to_array(t).astype(np.float64)
            g.initializer[idx].CopyFrom(numpy_helper.from_array(arr, t.name))
    for n in g.node:
        if n.op_type == "Constant":
            for a in n.attribute:
                if a.name == "value" and a.t.data_type == TensorProto.FLOAT and n.output[0] not in keep:
                    a.t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(a.t).astype(np.float64), a.t.name))
        if n.op_type == "Cast":
            for a in n.attribute:
                if a.name == "to" and a.i == TensorProto.FLOAT:
                    a.i = TensorProto.DOUBLE
    for vi in list(g.input) + list(g.output):
        if vi.type.tensor_type.elem_type == TensorProto.FLOAT:
            vi.type.tensor_type.elem_type = TensorProto.DOUBLE
    del g.value_info[:]
    return m


def reference_outputs(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
    """Outputs of ``model`` in float64 via ``onnx.reference`` (float inputs are cast to double)."""
    from onnx.reference import ReferenceEvaluator

    sess = ReferenceEvaluator(float64_copy(model))
    f = {k: (np.asarray(v, np.float64) if np.asarray(v).dtype.kind == "f" else np.asarray(v))
         for k, v in feeds.items()}
    return [np.asarray(o) for o in sess.run(None, f)]
