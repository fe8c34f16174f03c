"""Small helper around ``onnx.helper`` for building the bundled graphs deterministically."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
# IR 8 is the lowest IR that carries opset 17; every onnxruntime since 1.13 (and TVM's Relax
# importer) reads it, so it is the most portable choice for on-device runtimes.
IR_VERSION = 8
PRODUCER_NAME = "edgetune-models"


def producer_version() -> str:
    from models import __version__

    return __version__


class OnnxGraph:
    """Collects nodes and initializers; names are made unique with a per-op-type counter."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self._counts: dict[str, int] = {}
        self._init_names: set[str] = set()

    def _fresh(self, prefix: str) -> str:
        n = self._counts.get(prefix, 0)
        self._counts[prefix] = n + 1
        return f"{prefix}_{n}"

    def const(self, name: str, value: np.ndarray | float | int | list) -> str:
        arr = np.asarray(value)
        if arr.dtype == np.float64:
            arr = arr.astype(np.float32)
        if name in self._init_names:
            raise ValueError(f"duplicate initializer {name!r}")
        self._init_names.add(name)
        self.initializers.append(numpy_helper.from_array(np.ascontiguousarray(arr), name))
        return name

    def op(self, op_type: str, inputs: list[str], out: str | None = None, **attrs: Any) -> str:
        name = self._fresh(op_type)
        out = out or f"{name}_out"
        self.nodes.append(helper.make_node(op_type, inputs, [out], name=name, **attrs))
        return out

    def model(
        self,
        inputs: list[onnx.ValueInfoProto],
        outputs: list[onnx.ValueInfoProto],
        doc: str,
    ) -> onnx.ModelProto:
        graph = helper.make_graph(
            self.nodes, self.name, inputs, outputs, initializer=self.initializers, doc_string=doc
        )
        model = helper.make_model(
            graph,
            opset_imports=[helper.make_opsetid("", OPSET)],
            producer_name=PRODUCER_NAME,
            producer_version=producer_version(),
            ir_version=IR_VERSION,
            doc_string=doc,
        )
        onnx.checker.check_model(model, full_check=True)
        return model


def float_input(name: str, shape: list[int | str]) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)
