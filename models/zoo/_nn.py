"""Shared pieces for the zoo's transformer graphs (ViT, BERT, GPT-2, LLaMA, Whisper encoder).

A :class:`Net` is an :class:`models._onnx.OnnxGraph` with its own seeded generator: every weight is
drawn from ``numpy.random.default_rng(seed)`` in graph order (float32 draws), so a build is
byte-for-byte reproducible. Weights are ``raw_data`` initializers (``numpy_helper.from_array``),
which is what ``models.zoo.build`` needs to move them to external data past 2 GiB.

Scaling keeps activations O(1): projections ``N(0, 1) * gain / sqrt(n_in)``, biases ``N(0, 0.02)``,
norm gains 1 (+ N(0, 0.02)), embeddings ``N(0, 0.02)`` (GPT-2's init) unless a model says otherwise.
"""

from __future__ import annotations

import math

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from models._onnx import IR_VERSION, OPSET, PRODUCER_NAME, OnnxGraph, producer_version

NO_TFLITE = "no ONNX→TFLite converter in this environment (ai_edge_litert runs .tflite files, it does not convert)"
NEG = -1e9  # additive mask value for masked attention scores (exp underflows to exactly 0)
_TWO_GIB = 1 << 31


class Net(OnnxGraph):
    def __init__(self, name: str, seed: int) -> None:
        super().__init__(name)
        self.rng = np.random.default_rng(seed)
        self._anon = 0

    def const(self, name: str, value) -> str:
        # OnnxGraph.const goes through np.ascontiguousarray, which turns 0-d scalars into [1]
        arr = np.asarray(value)
        if arr.dtype == np.float64:
            arr = arr.astype(np.float32)
        if name in self._init_names:
            raise ValueError(f"duplicate initializer {name!r}")
        self._init_names.add(name)
        self.initializers.append(numpy_helper.from_array(np.array(arr, order="C"), name))
        return name

    # -- weights ---------------------------------------------------------------------------
    def normal(self, shape: tuple[int, ...], std: float) -> np.ndarray:
        a = self.rng.standard_normal(shape, dtype=np.float32)
        a *= np.float32(std)
        return a

    def c(self, value, dtype=np.float32) -> str:
        """An anonymous constant (scalars, shapes, axes)."""
        self._anon += 1
        return self.const(f"const_{self._anon}", np.asarray(value, dtype))

    def c64(self, value) -> str:
        return self.c(value, np.int64)

    def linear(self, x: str, name: str, n_in: int, n_out: int, bias: bool = True,
               gain: float = 1.0) -> str:
        w = self.const(f"{name}.weight", self.normal((n_in, n_out), gain / math.sqrt(n_in)))
        y = self.op("MatMul", [x, w])
        if bias:
            y = self.op("Add", [y, self.const(f"{name}.bias", self.normal((n_out,), 0.02))])
        return y

    def layernorm(self, x: str, name: str, d: int, eps: float = 1e-5) -> str:
        g = self.const(f"{name}.weight", 1.0 + self.normal((d,), 0.02))
        b = self.const(f"{name}.bias", self.normal((d,), 0.02))
        return self.op("LayerNormalization", [x, g, b], axis=-1, epsilon=eps)

    def rmsnorm(self, x: str, name: str, d: int, eps: float = 1e-5) -> str:
        """x / sqrt(mean(x^2) + eps) * g, from standard ops (Pow/ReduceMean/Sqrt/Div)."""
        g = self.const(f"{name}.weight", 1.0 + self.normal((d,), 0.02))
        ms = self.op("ReduceMean", [self.op("Pow", [x, self.c(2.0)])], axes=[-1], keepdims=1)
        r = self.op("Sqrt", [self.op("Add", [ms, self.c(eps)])])
        return self.op("Mul", [self.op("Div", [x, r]), g])

    # -- activations -------------------------------------------------------------------------
    def gelu(self, x: str) -> str:
        """Exact (erf) GELU: 0.5 * x * (1 + erf(x / sqrt(2)))."""
        e = self.op("Erf", [self.op("Mul", [x, self.c(1.0 / math.sqrt(2.0))])])
        e = self.op("Add", [e, self.c(1.0)])
        return self.op("Mul", [self.op("Mul", [x, e]), self.c(0.5)])

    def silu(self, x: str) -> str:
        return self.op("Mul", [x, self.op("Sigmoid", [x])])

    # -- attention ---------------------------------------------------------------------------
    def split_heads(self, x: str, heads: int, head_dim: int) -> str:
        """[B, S, H*Dh] -> [B, H, S, Dh]."""
        r = self.op("Reshape", [x, self.c64([0, 0, heads, head_dim])])
        return self.op("Transpose", [r], perm=[0, 2, 1, 3])

    def merge_heads(self, x: str, heads: int, head_dim: int) -> str:
        """[B, H, S, Dh] -> [B, S, H*Dh]."""
        t = self.op("Transpose", [x], perm=[0, 2, 1, 3])
        return self.op("Reshape", [t, self.c64([0, 0, heads * head_dim])])

    def sdpa(self, q: str, k: str, v: str, head_dim: int, bias: str | None = None) -> str:
        """softmax(q k^T / sqrt(Dh) + bias) v on [B, H, S, Dh] x [B, H, T, Dh]."""
        s = self.op("MatMul", [q, self.op("Transpose", [k], perm=[0, 1, 3, 2])])
        s = self.op("Mul", [s, self.c(1.0 / math.sqrt(head_dim))])
        if bias is not None:
            s = self.op("Add", [s, bias])
        return self.op("MatMul", [self.op("Softmax", [s], axis=-1), v])

    def mha(self, x: str, name: str, d: int, heads: int, bias: str | None = None,
            out_gain: float = 0.5) -> str:
        """Self-attention with separate q/k/v projections (biased), output projection."""
        hd = d // heads
        q = self.split_heads(self.linear(x, f"{name}.q", d, d), heads, hd)
        k = self.split_heads(self.linear(x, f"{name}.k", d, d), heads, hd)
        v = self.split_heads(self.linear(x, f"{name}.v", d, d), heads, hd)
        o = self.merge_heads(self.sdpa(q, k, v, hd, bias), heads, hd)
        return self.linear(o, f"{name}.out", d, d, gain=out_gain)

    def gelu_mlp(self, x: str, name: str, d: int, d_ff: int) -> str:
        h = self.gelu(self.linear(x, f"{name}.fc1", d, d_ff, gain=math.sqrt(2.0)))
        return self.linear(h, f"{name}.fc2", d_ff, d, gain=0.5)

    # -- scalars from shapes -----------------------------------------------------------------
    def dim(self, x: str, axis: int) -> str:
        """Scalar int64: x.shape[axis]."""
        return self.op("Gather", [self.op("Shape", [x]), self.c64(axis)], axis=0)

    # -- model -------------------------------------------------------------------------------
    def model(self, inputs, outputs, doc: str) -> onnx.ModelProto:  # type: ignore[override]
        graph = helper.make_graph(self.nodes, self.name, inputs, outputs,
                                  initializer=self.initializers, doc_string=doc)
        m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                              producer_name=PRODUCER_NAME, producer_version=producer_version(),
                              ir_version=IR_VERSION, doc_string=doc)
        if param_bytes(m) < _TWO_GIB - (64 << 20):
            onnx.checker.check_model(m, full_check=True)
        # past 2 GiB the checker cannot serialize the proto; the same code path is checked at
        # the small size, and models.zoo.build writes such a model with external data.
        return m


def param_bytes(m: onnx.ModelProto) -> int:
    return sum(len(t.raw_data) for t in m.graph.initializer)


def count_params(m: onnx.ModelProto, skip: tuple[str, ...] = ("const_",)) -> int:
    """Float parameters in the initializers (anonymous constants and the given prefixes skipped)."""
    n = 0
    for t in m.graph.initializer:
        if t.data_type != TensorProto.FLOAT or t.name.startswith(skip):
            continue
        n += int(np.prod(t.dims)) if len(t.dims) else 1
    return n


def tensor(name: str, elem: int, shape: list[int | str]) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem, shape)
