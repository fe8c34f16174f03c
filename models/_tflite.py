"""Minimal TFLite flatbuffer writer.

There is no TFLite *converter* in the environment (that would need TensorFlow); instead the
bundled models are written directly as TFLite flatbuffers from the same seeded weights the ONNX
models use. The generated schema bindings (object API: ``ModelT``, ``SubGraphT``, ...) come from
``ai_edge_litert.schema_py_generated``; serialisation uses the ``flatbuffers`` package. Both are
already dependencies of the LiteRT interpreter, so nothing heavy is needed.

Only float32 graphs with static shapes are supported, which is all the bundled models need.
"""

from __future__ import annotations

from typing import Any

import flatbuffers
import numpy as np

try:  # the generated TFLite schema ships with the LiteRT interpreter wheel
    from ai_edge_litert import schema_py_generated as S
except ImportError as exc:  # pragma: no cover - exercised only without ai-edge-litert
    raise ImportError(
        "writing .tflite models needs the 'ai-edge-litert' package "
        "(it provides the TFLite schema bindings) and 'flatbuffers'"
    ) from exc

__all__ = ["S", "TFLiteGraph"]

# TFLite requires buffers to be 16-byte aligned for some kernels/delegates (the official
# converter does the same), so every constant buffer is aligned explicitly.
_BUFFER_ALIGN = 16
# Operator codes above this value are stored in `builtin_code`; the deprecated int8 field then
# holds PLACEHOLDER_FOR_GREATER_OP_CODES (127).
_PLACEHOLDER_FOR_GREATER_OP_CODES = 127

_NP_TO_TFL = {
    np.dtype(np.float32): S.TensorType.FLOAT32,
    np.dtype(np.int32): S.TensorType.INT32,
    np.dtype(np.int64): S.TensorType.INT64,
}


class _AlignedBuffer(S.BufferT):
    """BufferT whose payload is aligned to ``_BUFFER_ALIGN`` bytes in the final file."""

    def Pack(self, builder: flatbuffers.Builder) -> int:
        data_off = None
        if self.data is not None:
            payload = bytes(self.data)
            builder.StartVector(1, len(payload), _BUFFER_ALIGN)
            builder.head = builder.head - len(payload)
            builder.Bytes[builder.head : builder.head + len(payload)] = payload
            data_off = builder.EndVector()
        S.BufferStart(builder)
        if data_off is not None:
            S.BufferAddData(builder, data_off)
        return S.BufferEnd(builder)


class TFLiteGraph:
    """Accumulates tensors and operators of a single-subgraph TFLite model."""

    def __init__(self) -> None:
        self.tensors: list[S.TensorT] = []
        # Buffer 0 is the conventional empty sentinel shared by all non-constant tensors.
        self.buffers: list[S.BufferT] = [S.BufferT()]
        self.operators: list[S.OperatorT] = []
        self.opcodes: list[S.OperatorCodeT] = []
        self._opcode_index: dict[tuple[int, int], int] = {}
        self._names: set[str] = set()

    # -- tensors ---------------------------------------------------------------------------
    def _tensor(self, name: str, shape: tuple[int, ...], ttype: int, buffer: int) -> int:
        if name in self._names:
            raise ValueError(f"duplicate tensor name {name!r}")
        self._names.add(name)
        t = S.TensorT()
        t.name = name
        t.shape = [int(d) for d in shape]
        t.type = ttype
        t.buffer = buffer
        self.tensors.append(t)
        return len(self.tensors) - 1

    def activation(self, name: str, shape: tuple[int, ...], dtype: Any = np.float32) -> int:
        """A non-constant tensor (graph input, output or intermediate)."""
        return self._tensor(name, shape, _NP_TO_TFL[np.dtype(dtype)], 0)

    def const(self, name: str, value: np.ndarray) -> int:
        """A constant tensor backed by its own buffer."""
        value = np.ascontiguousarray(value)
        ttype = _NP_TO_TFL[value.dtype]
        buf = _AlignedBuffer()
        buf.data = value.astype(value.dtype.newbyteorder("<"), copy=False).tobytes()
        self.buffers.append(buf)
        return self._tensor(name, value.shape, ttype, len(self.buffers) - 1)

    # -- operators -------------------------------------------------------------------------
    def _opcode(self, builtin: int, version: int) -> int:
        key = (builtin, version)
        if key not in self._opcode_index:
            code = S.OperatorCodeT()
            code.builtinCode = builtin
            code.deprecatedBuiltinCode = min(builtin, _PLACEHOLDER_FOR_GREATER_OP_CODES)
            code.version = version
            self.opcodes.append(code)
            self._opcode_index[key] = len(self.opcodes) - 1
        return self._opcode_index[key]

    def op(
        self,
        builtin: int,
        inputs: list[int],
        outputs: list[int],
        options_type: int = 0,
        options: Any = None,
        version: int = 1,
    ) -> None:
        """Append an operator. ``version`` is the op version the TFLite converter would record
        (the lowest runtime kernel version that implements the options used)."""
        o = S.OperatorT()
        o.opcodeIndex = self._opcode(builtin, version)
        o.inputs = list(inputs)
        o.outputs = list(outputs)
        if options is not None:
            o.builtinOptionsType = options_type
            o.builtinOptions = options
        self.operators.append(o)

    # -- serialisation ---------------------------------------------------------------------
    def serialize(self, inputs: list[int], outputs: list[int], description: str) -> bytes:
        sg = S.SubGraphT()
        sg.tensors = self.tensors
        sg.inputs = list(inputs)
        sg.outputs = list(outputs)
        sg.operators = self.operators
        sg.name = "main"

        sig = S.SignatureDefT()
        sig.signatureKey = "serving_default"
        sig.subgraphIndex = 0
        sig.inputs = [_tensor_map(self.tensors[i].name, i) for i in inputs]
        sig.outputs = [_tensor_map(self.tensors[i].name, i) for i in outputs]

        model = S.ModelT()
        model.version = 3
        model.description = description
        model.operatorCodes = self.opcodes
        model.subgraphs = [sg]
        model.buffers = self.buffers
        model.signatureDefs = [sig]

        builder = flatbuffers.Builder(1 << 20)
        builder.Finish(model.Pack(builder), file_identifier=b"TFL3")
        return bytes(builder.Output())


def _tensor_map(name: str, index: int) -> S.TensorMapT:
    m = S.TensorMapT()
    m.name = name
    m.tensorIndex = index
    return m
