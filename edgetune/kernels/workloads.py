"""Operator workloads for kernel tuning.

A workload is a frozen value: its ``key()`` is stable across runs and machines, it builds its
TVM PrimFunc on demand, lists its input and output tensors (name, shape, dtype) in argument
order (inputs first, then outputs, as the kernel's calling convention has them), counts its
flops, and computes a float64 numpy reference the host keeps to itself.

Two kinds:

* ``OpWorkload`` subclasses (gemm, conv2d_nchw, conv2d_nhwc, depthwise_conv2d_nchw,
  batch_matmul, softmax, layernorm, attention), parsed from a spec string such as
  ``"gemm:M=197,N=3072,K=768"``.
* ``TirWorkload``: a fused PrimFunc extracted from an ONNX model through Relax
  (``extract_onnx_tasks``). Its reference is the *unscheduled* PrimFunc INTERPRETED in numpy
  float64 (``tir_reference``: no TVM compilation or execution, so independent of the schedules,
  lowering and code generation under test); a task using a construct the interpreter does not
  cover falls back to the unscheduled PrimFunc compiled by TVM (fp32), and says so:
  ``reference_kind`` is then "tvm-unscheduled (not independent): <why>".
"""

from __future__ import annotations

import contextlib
import hashlib
import sys
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Mapping, Sequence

import numpy as np

from edgetune.errors import MissingExtra, ModelError, UserInputError

if TYPE_CHECKING:  # pragma: no cover
    import tvm


@dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: tuple[int, ...]
    dtype: str = "float32"

    def as_json(self) -> dict[str, Any]:
        return {"name": self.name, "shape": list(self.shape), "dtype": self.dtype}


def random_inputs(specs: Sequence[TensorSpec], seed: int) -> list[np.ndarray]:
    """Seeded inputs with negatives and large values: not zeros, not ones (DESIGN.md §5).

    Normal(0, 1) scaled per tensor, with ~1% of entries blown up by 100x so that a kernel which
    drops, duplicates or mis-orders terms cannot hide inside the tolerance.
    """
    rng = np.random.default_rng(seed)
    out = []
    for spec in specs:
        if not spec.dtype.startswith("float"):
            out.append(rng.integers(-8, 8, size=spec.shape).astype(spec.dtype))
            continue
        x = rng.standard_normal(spec.shape)
        big = rng.random(spec.shape) < 0.01
        x = np.where(big, x * 100.0, x)
        out.append(np.ascontiguousarray(x.astype(spec.dtype)))
    return out


def _conv_out(size: int, kernel: int, stride: int, pad: int) -> int:
    return (size + 2 * pad - kernel) // stride + 1


class KernelWorkload:
    """What search.py needs from any workload (duck-typed base for both kinds)."""

    def key(self) -> str:  # pragma: no cover - interface
        raise NotImplementedError

    @property
    def inputs(self) -> tuple[TensorSpec, ...]:  # pragma: no cover - interface
        raise NotImplementedError

    @property
    def outputs(self) -> tuple[TensorSpec, ...]:  # pragma: no cover - interface
        raise NotImplementedError

    def flops(self) -> int:  # pragma: no cover - interface
        raise NotImplementedError

    def prim_func(self) -> "tvm.tirx.PrimFunc":  # pragma: no cover - interface
        raise NotImplementedError

    def reference(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:  # pragma: no cover
        raise NotImplementedError

    def random_inputs(self, seed: int) -> list[np.ndarray]:
        return random_inputs(self.inputs, seed)

    def ir_module(self) -> "tvm.IRModule":
        """{"main": prim_func} normalized exactly as MetaSchedule does, so database keys match."""
        from tvm.s_tir.meta_schedule.tune_context import _normalize_mod

        return _normalize_mod(self.prim_func())


# ---------------------------------------------------------------------------------------------
# Operator workloads (TE)
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class OpWorkload(KernelWorkload):
    """Base of the spec-string operators. Subclasses declare ``op`` and int fields."""

    op: ClassVar[str] = ""
    reference_kind: ClassVar[str] = "numpy float64 formula (independent of TVM)"
    zero_ok: ClassVar[frozenset[str]] = frozenset({"pad", "TB"})  # int fields that may be 0
    # dtypes of the operands besides float32: "float16" is the mixed-precision form (float16
    # operands, float32 accumulation and output: what tensor cores compute), for the matmuls
    dtypes: ClassVar[tuple[str, ...]] = ("float32",)
    dtype: str = field(default="float32", kw_only=True)

    def __post_init__(self) -> None:
        for f in fields(self):
            if f.name == "dtype":
                continue
            value = getattr(self, f.name)
            if not isinstance(value, int) or isinstance(value, bool):
                raise UserInputError(f"{self.op}: {f.name} must be an integer, got {value!r}")
            lowest = 0 if f.name in self.zero_ok else 1
            if value < lowest:
                raise UserInputError(f"{self.op}: {f.name}={value} must be >= {lowest}")
        if self.dtype not in self.dtypes:
            why = ("; TVM 0.27's MetaSchedule has no bfloat16 tensor-core intrinsics (float16, int8 and "
                   "float8 only), so a bfloat16 search could not use tensor cores") if self.dtype in ("bfloat16", "bf16") else ""
            raise UserInputError(f"{self.op}: dtype {self.dtype!r} not supported ({', '.join(self.dtypes)}){why}")
        for spec in self.outputs:
            if any(d < 1 for d in spec.shape):
                raise UserInputError(f"{self.spec()}: output shape {spec.shape} is empty")

    def params(self) -> dict[str, int]:
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "dtype"}

    def spec(self) -> str:
        """The spec string this workload parses back from."""
        body = ",".join(f"{k}={v}" for k, v in self.params().items())
        return f"{self.op}:{body}" + (f",dtype={self.dtype}" if self.dtype != "float32" else "")

    @property
    def acc_dtype(self) -> str:
        """What the op accumulates and outputs in: float32 (for float16 operands too)."""
        return "float32"

    def _mac(self, x, y):
        """x * y in the accumulation dtype (float16 operands widened first)."""
        if self.dtype == self.acc_dtype:
            return x * y
        return x.astype(self.acc_dtype) * y.astype(self.acc_dtype)

    def key(self) -> str:
        return self.spec() if self.dtype != "float32" else f"{self.spec()},dtype={self.dtype}"

    def __str__(self) -> str:
        return self.spec()


@dataclass(frozen=True)
class Gemm(OpWorkload):
    """C[M,N] = A[M,K] @ B[K,N]."""

    op: ClassVar[str] = "gemm"
    dtypes: ClassVar[tuple[str, ...]] = ("float32", "float16")
    M: int
    N: int
    K: int

    @property
    def inputs(self) -> tuple[TensorSpec, ...]:
        return (TensorSpec("A", (self.M, self.K), self.dtype), TensorSpec("B", (self.K, self.N), self.dtype))

    @property
    def outputs(self) -> tuple[TensorSpec, ...]:
        return (TensorSpec("C", (self.M, self.N), self.acc_dtype),)

    def flops(self) -> int:
        return 2 * self.M * self.N * self.K

    def prim_func(self):
        from tvm import te

        a = te.placeholder((self.M, self.K), self.dtype, name="A")
        b = te.placeholder((self.K, self.N), self.dtype, name="B")
        k = te.reduce_axis((0, self.K), name="k")
        c = te.compute((self.M, self.N), lambda i, j: te.sum(self._mac(a[i, k], b[k, j]), axis=k), name="C")
        return te.create_prim_func([a, b, c])

    def reference(self, inputs):
        a, b = (np.asarray(x, np.float64) for x in inputs)
        return [a @ b]


@dataclass(frozen=True)
class BatchMatmul(OpWorkload):
    """C[b,M,N] = A[b,M,K] @ B[b,K,N]; with TB=1, B is [b,N,K] (attention's Q @ K^T)."""

    op: ClassVar[str] = "batch_matmul"
    dtypes: ClassVar[tuple[str, ...]] = ("float32", "float16")
    B: int
    M: int
    N: int
    K: int
    TB: int = 0

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.TB not in (0, 1):
            raise UserInputError(f"batch_matmul: TB must be 0 or 1, got {self.TB!r}")

    @property
    def inputs(self):
        bshape = (self.B, self.N, self.K) if self.TB else (self.B, self.K, self.N)
        return (TensorSpec("A", (self.B, self.M, self.K), self.dtype), TensorSpec("B", bshape, self.dtype))

    @property
    def outputs(self):
        return (TensorSpec("C", (self.B, self.M, self.N), self.acc_dtype),)

    def flops(self) -> int:
        return 2 * self.B * self.M * self.N * self.K

    def prim_func(self):
        from tvm import te

        a = te.placeholder(self.inputs[0].shape, self.dtype, name="A")
        b = te.placeholder(self.inputs[1].shape, self.dtype, name="B")
        k = te.reduce_axis((0, self.K), name="k")
        if self.TB:
            body = lambda n, i, j: te.sum(self._mac(a[n, i, k], b[n, j, k]), axis=k)  # noqa: E731
        else:
            body = lambda n, i, j: te.sum(self._mac(a[n, i, k], b[n, k, j]), axis=k)  # noqa: E731
        c = te.compute((self.B, self.M, self.N), body, name="C")
        return te.create_prim_func([a, b, c])

    def reference(self, inputs):
        a, b = (np.asarray(x, np.float64) for x in inputs)
        if self.TB:
            b = np.transpose(b, (0, 2, 1))
        return [np.matmul(a, b)]


def _pad_nchw(x: np.ndarray, pad: int) -> np.ndarray:
    return np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad))) if pad else x


def _windows_nchw(x: np.ndarray, r: int, s: int, stride: int) -> np.ndarray:
    """[N, C, P, Q, R, S] view of the sliding windows (float64 reference only)."""
    from numpy.lib.stride_tricks import sliding_window_view

    win = sliding_window_view(x, (r, s), axis=(2, 3))
    return win[:, :, ::stride, ::stride]


@dataclass(frozen=True)
class _Conv2d(OpWorkload):
    """Shape fields, output size and flops shared by the NCHW and NHWC convolutions."""

    N: int
    C: int
    H: int
    W: int
    K: int
    R: int
    S: int
    stride: int = 1
    pad: int = 0

    @property
    def P(self) -> int:
        return _conv_out(self.H, self.R, self.stride, self.pad)

    @property
    def Q(self) -> int:
        return _conv_out(self.W, self.S, self.stride, self.pad)

    def flops(self) -> int:
        return 2 * self.N * self.K * self.P * self.Q * self.C * self.R * self.S


@dataclass(frozen=True)
class Conv2dNCHW(_Conv2d):
    """Y[N,K,P,Q] = conv(X[N,C,H,W], W[K,C,R,S]) with square stride and zero padding."""

    op: ClassVar[str] = "conv2d_nchw"

    @property
    def inputs(self):
        return (
            TensorSpec("X", (self.N, self.C, self.H, self.W), self.dtype),
            TensorSpec("Wt", (self.K, self.C, self.R, self.S), self.dtype),
        )

    @property
    def outputs(self):
        return (TensorSpec("Y", (self.N, self.K, self.P, self.Q), self.dtype),)

    def prim_func(self):
        from tvm import te, topi

        x = te.placeholder(self.inputs[0].shape, self.dtype, name="X")
        w = te.placeholder(self.inputs[1].shape, self.dtype, name="Wt")
        xp = topi.nn.pad(x, (0, 0, self.pad, self.pad), name="Xpad") if self.pad else x
        c = te.reduce_axis((0, self.C), name="c")
        r = te.reduce_axis((0, self.R), name="r")
        s = te.reduce_axis((0, self.S), name="s")
        st = self.stride
        y = te.compute(
            self.outputs[0].shape,
            lambda n, k, p, q: te.sum(xp[n, c, p * st + r, q * st + s] * w[k, c, r, s], axis=[c, r, s]),
            name="Y",
        )
        return te.create_prim_func([x, w, y])

    def reference(self, inputs):
        x, w = (np.asarray(v, np.float64) for v in inputs)
        win = _windows_nchw(_pad_nchw(x, self.pad), self.R, self.S, self.stride)
        return [np.einsum("ncpqrs,kcrs->nkpq", win, w, optimize=True)]


@dataclass(frozen=True)
class Conv2dNHWC(_Conv2d):
    """Y[N,P,Q,K] = conv(X[N,H,W,C], W[R,S,C,K]) (HWIO filter, as TFLite-style graphs have)."""

    op: ClassVar[str] = "conv2d_nhwc"

    @property
    def inputs(self):
        return (
            TensorSpec("X", (self.N, self.H, self.W, self.C), self.dtype),
            TensorSpec("Wt", (self.R, self.S, self.C, self.K), self.dtype),
        )

    @property
    def outputs(self):
        return (TensorSpec("Y", (self.N, self.P, self.Q, self.K), self.dtype),)

    def prim_func(self):
        from tvm import te, topi

        x = te.placeholder(self.inputs[0].shape, self.dtype, name="X")
        w = te.placeholder(self.inputs[1].shape, self.dtype, name="Wt")
        xp = topi.nn.pad(x, (0, self.pad, self.pad, 0), name="Xpad") if self.pad else x
        c = te.reduce_axis((0, self.C), name="c")
        r = te.reduce_axis((0, self.R), name="r")
        s = te.reduce_axis((0, self.S), name="s")
        st = self.stride
        y = te.compute(
            self.outputs[0].shape,
            lambda n, p, q, k: te.sum(xp[n, p * st + r, q * st + s, c] * w[r, s, c, k], axis=[r, s, c]),
            name="Y",
        )
        return te.create_prim_func([x, w, y])

    def reference(self, inputs):
        x, w = (np.asarray(v, np.float64) for v in inputs)
        xn = _pad_nchw(np.transpose(x, (0, 3, 1, 2)), self.pad)
        win = _windows_nchw(xn, self.R, self.S, self.stride)
        return [np.einsum("ncpqrs,rsck->npqk", win, w, optimize=True)]


@dataclass(frozen=True)
class DepthwiseConv2dNCHW(OpWorkload):
    """Y[N,C,P,Q] = depthwise conv(X[N,C,H,W], W[C,1,R,S]) (channel multiplier 1)."""

    op: ClassVar[str] = "depthwise_conv2d_nchw"
    N: int
    C: int
    H: int
    W: int
    R: int
    S: int
    stride: int = 1
    pad: int = 0

    @property
    def P(self) -> int:
        return _conv_out(self.H, self.R, self.stride, self.pad)

    @property
    def Q(self) -> int:
        return _conv_out(self.W, self.S, self.stride, self.pad)

    @property
    def inputs(self):
        return (
            TensorSpec("X", (self.N, self.C, self.H, self.W), self.dtype),
            TensorSpec("Wt", (self.C, 1, self.R, self.S), self.dtype),
        )

    @property
    def outputs(self):
        return (TensorSpec("Y", (self.N, self.C, self.P, self.Q), self.dtype),)

    def flops(self) -> int:
        return 2 * self.N * self.C * self.P * self.Q * self.R * self.S

    def prim_func(self):
        from tvm import te

        x = te.placeholder(self.inputs[0].shape, self.dtype, name="X")
        w = te.placeholder(self.inputs[1].shape, self.dtype, name="Wt")
        y = _depthwise_te(x, w, (self.pad,) * 4, (self.stride, self.stride), self.outputs[0].shape, "Y")
        return te.create_prim_func([x, w, y])

    def reference(self, inputs):
        x, w = (np.asarray(v, np.float64) for v in inputs)
        return [_depthwise64(x, w, (self.pad,) * 4, (self.stride, self.stride), self.outputs[0].shape)]


def _depthwise_te(x, w, pads, strides, out_shape, name):
    """TE depthwise conv of X[N,C,H,W] by W[C,1,R,S]; pads (top, left, bottom, right)."""
    from tvm import te, topi

    pt, pl, pb, pr = pads
    if any(pads):
        xp = topi.nn.pad(x, (0, 0, pt, pl), (0, 0, pb, pr), name="Xpad")
    else:
        xp = x
    r = te.reduce_axis((0, int(w.shape[2])), name="r")
    s = te.reduce_axis((0, int(w.shape[3])), name="s")
    sh, sw = strides
    return te.compute(out_shape, lambda n, c, p, q: te.sum(xp[n, c, p * sh + r, q * sw + s] * w[c, 0, r, s],
                                                           axis=[r, s]), name=name)


def _depthwise64(x: np.ndarray, w: np.ndarray, pads, strides, out_shape) -> np.ndarray:
    """The float64 reference of _depthwise_te (numpy windows, independent of TVM)."""
    from numpy.lib.stride_tricks import sliding_window_view

    pt, pl, pb, pr = pads
    xp = np.pad(x, ((0, 0), (0, 0), (pt, pb), (pl, pr)))
    win = sliding_window_view(xp, w.shape[2:], axis=(2, 3))[:, :, ::strides[0], ::strides[1]]
    return np.einsum("ncpqrs,crs->ncpq", win[:, :, :out_shape[2], :out_shape[3]], w[:, 0], optimize=True)


# Activations a fused depthwise kernel can apply (ONNX semantics); the int is the spec's ``act``.
DW_ACTIVATIONS = {0: "none", 1: "relu", 2: "relu6", 3: "hardswish"}


def _activation64(y: np.ndarray, act: int) -> np.ndarray:
    if act == 1:
        return np.maximum(y, 0.0)
    if act == 2:
        return np.clip(y, 0.0, 6.0)
    if act == 3:  # ONNX HardSwish: x * max(0, min(1, x / 6 + 0.5))
        return y * np.clip(y / 6.0 + 0.5, 0.0, 1.0)
    return y


@dataclass(frozen=True)
class DepthwiseConvFused(OpWorkload):
    """An ONNX depthwise Conv node as it stands in a model, with what follows it fused:
    Y = act(depthwise conv(X[N,C,H,W], Wt[C,1,R,S]) + B[C]), strides SH/SW, pads PT/PL/PB/PR
    (ONNX's begin/end pads, which may differ: TF-style SAME), ``bias`` 0/1 (B is an input only
    with 1), ``act`` 0 none, 1 Relu, 2 Clip(0, 6), 3 HardSwish. The hybrid onnxruntime + TVM
    candidates splice such kernels into the onnxruntime graph (edgetune/space/ort_tvm.py)."""

    op: ClassVar[str] = "dwconv2d_fused"
    zero_ok: ClassVar[frozenset[str]] = frozenset({"PT", "PL", "PB", "PR", "bias", "act"})
    N: int
    C: int
    H: int
    W: int
    R: int
    S: int
    SH: int = 1
    SW: int = 1
    PT: int = 0
    PL: int = 0
    PB: int = 0
    PR: int = 0
    bias: int = 1
    act: int = 0

    def __post_init__(self) -> None:
        if self.bias not in (0, 1):
            raise UserInputError(f"{self.op}: bias must be 0 or 1, got {self.bias!r}")
        if self.act not in DW_ACTIVATIONS:
            raise UserInputError(f"{self.op}: act must be one of {DW_ACTIVATIONS} (as the int), got {self.act!r}")
        super().__post_init__()

    @property
    def P(self) -> int:
        return (self.H + self.PT + self.PB - self.R) // self.SH + 1

    @property
    def Q(self) -> int:
        return (self.W + self.PL + self.PR - self.S) // self.SW + 1

    @property
    def inputs(self):
        specs = [TensorSpec("X", (self.N, self.C, self.H, self.W), self.dtype),
                 TensorSpec("Wt", (self.C, 1, self.R, self.S), self.dtype)]
        if self.bias:
            specs.append(TensorSpec("B", (self.C,), self.dtype))
        return tuple(specs)

    @property
    def outputs(self):
        return (TensorSpec("Y", (self.N, self.C, self.P, self.Q), self.dtype),)

    def flops(self) -> int:
        return 2 * self.N * self.C * self.P * self.Q * self.R * self.S

    def prim_func(self):
        from tvm import te, tirx

        x = te.placeholder(self.inputs[0].shape, self.dtype, name="X")
        w = te.placeholder(self.inputs[1].shape, self.dtype, name="Wt")
        args = [x, w]
        conv = _depthwise_te(x, w, (self.PT, self.PL, self.PB, self.PR), (self.SH, self.SW), self.outputs[0].shape,
                             "conv")
        b = None
        if self.bias:
            b = te.placeholder((self.C,), self.dtype, name="B")
            args.append(b)
        zero, six = tirx.const(0.0, self.dtype), tirx.const(6.0, self.dtype)

        def epilogue(n, c, p, q):
            v = conv[n, c, p, q] + b[c] if b is not None else conv[n, c, p, q]
            if self.act == 1:
                return te.max(v, zero)
            if self.act == 2:
                return te.min(te.max(v, zero), six)
            if self.act == 3:
                gate = te.min(te.max(v * tirx.const(1.0 / 6.0, self.dtype) + tirx.const(0.5, self.dtype), zero),
                              tirx.const(1.0, self.dtype))
                return v * gate
            return v

        y = te.compute(self.outputs[0].shape, epilogue, name="Y") if (self.bias or self.act) else conv
        return te.create_prim_func([*args, y])

    def reference(self, inputs):
        x, w = (np.asarray(v, np.float64) for v in inputs[:2])
        y = _depthwise64(x, w, (self.PT, self.PL, self.PB, self.PR), (self.SH, self.SW), self.outputs[0].shape)
        if self.bias:
            y = y + np.asarray(inputs[2], np.float64)[None, :, None, None]
        return [_activation64(y, self.act)]


# ---------------------------------------------------------------------------------------------
# Transformer operators: softmax, layernorm, attention (last-axis reductions, row-major float32)
# ---------------------------------------------------------------------------------------------

LAYERNORM_EPS = 1e-5  # as ONNX LayerNormalization's default


def _softmax64(x: np.ndarray, mask: np.ndarray | None = None) -> np.ndarray:
    """Numerically stable float64 softmax over the last axis (masked entries are exactly 0)."""
    if mask is not None:
        x = np.where(mask, -np.inf, x)
    m = np.max(x, axis=-1, keepdims=True)
    e = np.exp(x - m)
    return e / np.sum(e, axis=-1, keepdims=True)


@dataclass(frozen=True)
class Softmax(OpWorkload):
    """Y[M,N] = softmax(X[M,N]) over the last axis.

    flops 5·M·N: per element one max comparison, one subtraction, one exp (counted as 1), one
    addition to the row sum and one division."""

    op: ClassVar[str] = "softmax"
    M: int
    N: int

    @property
    def inputs(self):
        return (TensorSpec("X", (self.M, self.N), self.dtype),)

    @property
    def outputs(self):
        return (TensorSpec("Y", (self.M, self.N), self.dtype),)

    def flops(self) -> int:
        return 5 * self.M * self.N

    def prim_func(self):
        from tvm import te

        m, n = self.M, self.N
        x = te.placeholder((m, n), self.dtype, name="X")
        j = te.reduce_axis((0, n), name="j")
        mx = te.compute((m,), lambda i: te.max(x[i, j], axis=j), name="row_max")
        e = te.compute((m, n), lambda i, k: te.exp(x[i, k] - mx[i]), name="exp")
        j2 = te.reduce_axis((0, n), name="j2")
        sm = te.compute((m,), lambda i: te.sum(e[i, j2], axis=j2), name="row_sum")
        y = te.compute((m, n), lambda i, k: e[i, k] / sm[i], name="Y")
        return te.create_prim_func([x, y])

    def reference(self, inputs):
        (x,) = (np.asarray(v, np.float64) for v in inputs)
        return [_softmax64(x)]


@dataclass(frozen=True)
class LayerNorm(OpWorkload):
    """Y[M,N] = (X - mean) / sqrt(var + 1e-5) * gamma[N] + beta[N] over the last axis, with the
    population variance (ONNX LayerNormalization, axis=-1). gamma and beta are weight operands.

    flops 7·M·N: per element one addition to the mean's sum, one subtraction, one square and one
    addition to the variance's sum, one multiplication by 1/sqrt(var + eps), one by gamma, one
    addition of beta (the per-row divisions and square roots are not counted)."""

    op: ClassVar[str] = "layernorm"
    M: int
    N: int

    @property
    def inputs(self):
        return (TensorSpec("X", (self.M, self.N), self.dtype), TensorSpec("gamma", (self.N,), self.dtype),
                TensorSpec("beta", (self.N,), self.dtype))

    @property
    def outputs(self):
        return (TensorSpec("Y", (self.M, self.N), self.dtype),)

    def flops(self) -> int:
        return 7 * self.M * self.N

    def prim_func(self):
        from tvm import te

        m, n = self.M, self.N
        x = te.placeholder((m, n), self.dtype, name="X")
        gamma = te.placeholder((n,), self.dtype, name="gamma")
        beta = te.placeholder((n,), self.dtype, name="beta")
        j = te.reduce_axis((0, n), name="j")
        s = te.compute((m,), lambda i: te.sum(x[i, j], axis=j), name="row_sum")
        mean = te.compute((m,), lambda i: s[i] / te.const(float(n), self.dtype), name="mean")
        j2 = te.reduce_axis((0, n), name="j2")
        sq = te.compute((m,), lambda i: te.sum((x[i, j2] - mean[i]) * (x[i, j2] - mean[i]), axis=j2),
                        name="row_sqsum")
        rstd = te.compute((m,), lambda i: te.rsqrt(sq[i] / te.const(float(n), self.dtype)
                                                   + te.const(LAYERNORM_EPS, self.dtype)), name="rstd")
        y = te.compute((m, n), lambda i, k: (x[i, k] - mean[i]) * rstd[i] * gamma[k] + beta[k], name="Y")
        return te.create_prim_func([x, gamma, beta, y])

    def reference(self, inputs):
        x, gamma, beta = (np.asarray(v, np.float64) for v in inputs)
        mean = x.mean(axis=-1, keepdims=True)
        var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
        return [(x - mean) / np.sqrt(var + LAYERNORM_EPS) * gamma + beta]


@dataclass(frozen=True)
class Attention(OpWorkload):
    """O[B,H,S,D] = softmax(Q[B,H,S,D] · K[B,H,L,D]ᵀ / sqrt(D) + mask) · V[B,H,L,D].

    ``L`` (the key/value length) defaults to S (``L=0`` in a spec means "same as S"; the value is
    stored resolved, so the spec round-trips). ``causal=1`` masks key j > i + (L - S): query i sees
    the L - S past keys and itself (the decoder convention); it needs L >= S (else a query row
    would see no key).

    flops: 4·D per visible (query, key) pair (Q·Kᵀ and P·V, 2 each) plus 6 per visible pair for
    the scaling and the softmax (Softmax's 5 + the 1/sqrt(D) multiplication) — 4·B·H·S·L·D +
    6·B·H·S·L without a mask. With causal=1 only the visible pairs count (S·(L-S) + S·(S+1)/2 per
    head, the FlashAttention convention): a kernel that skips the masked blocks does not exceed
    the roofline on paper."""

    op: ClassVar[str] = "attention"
    zero_ok: ClassVar[frozenset[str]] = frozenset({"L", "causal"})
    B: int
    H: int
    S: int
    D: int
    L: int = 0
    causal: int = 0

    def __post_init__(self) -> None:
        if isinstance(self.L, int) and not isinstance(self.L, bool) and self.L == 0:
            object.__setattr__(self, "L", self.S)  # canonical: "same as S" is stored as S
        if isinstance(self.causal, int) and not isinstance(self.causal, bool) and self.causal not in (0, 1):
            raise UserInputError(f"attention: causal must be 0 or 1, got {self.causal!r}")
        super().__post_init__()
        if self.causal and self.L < self.S:
            raise UserInputError(f"attention: causal=1 needs L >= S (query i sees keys j <= i + L - S), "
                                 f"got S={self.S}, L={self.L}")

    @property
    def inputs(self):
        return (TensorSpec("Q", (self.B, self.H, self.S, self.D), self.dtype),
                TensorSpec("K", (self.B, self.H, self.L, self.D), self.dtype),
                TensorSpec("V", (self.B, self.H, self.L, self.D), self.dtype))

    @property
    def outputs(self):
        return (TensorSpec("O", (self.B, self.H, self.S, self.D), self.dtype),)

    def visible_pairs(self) -> int:
        """(query, key) pairs per head the mask leaves visible."""
        if not self.causal:
            return self.S * self.L
        return self.S * (self.L - self.S) + self.S * (self.S + 1) // 2

    def mask(self) -> np.ndarray | None:
        """[S, L] bool, True where the key is masked (None without causal)."""
        if not self.causal:
            return None
        i = np.arange(self.S)[:, None]
        j = np.arange(self.L)[None, :]
        return j > i + (self.L - self.S)

    def flops(self) -> int:
        return self.B * self.H * self.visible_pairs() * (4 * self.D + 6)

    def prim_func(self):
        import math

        from tvm import te

        bb, hh, ss, ll, dd = self.B, self.H, self.S, self.L, self.D
        dt = self.dtype
        q = te.placeholder((bb, hh, ss, dd), dt, name="Q")
        k = te.placeholder((bb, hh, ll, dd), dt, name="K")
        v = te.placeholder((bb, hh, ll, dd), dt, name="V")
        scale = te.const(1.0 / math.sqrt(dd), dt)
        d = te.reduce_axis((0, dd), name="d")
        # raw Q·Kᵀ; the 1/sqrt(D) scale (> 0) is applied inside exp: exp(scale·(s - max s))
        sc = te.compute((bb, hh, ss, ll), lambda b, h, i, j: te.sum(q[b, h, i, d] * k[b, h, j, d], axis=d),
                        name="scores")
        past = ll - ss

        def masked(i, j):
            return j > i + past

        j1 = te.reduce_axis((0, ll), name="j1")
        j2 = te.reduce_axis((0, ll), name="j2")
        if self.causal:
            low, zero = te.min_value(dt), te.const(0.0, dt)
            mx = te.compute((bb, hh, ss), lambda b, h, i: te.max(
                te.if_then_else(masked(i, j1), low, sc[b, h, i, j1]), axis=j1), name="row_max")

            def ex(b, h, i, j):
                return te.if_then_else(masked(i, j), zero, te.exp((sc[b, h, i, j] - mx[b, h, i]) * scale))
        else:
            mx = te.compute((bb, hh, ss), lambda b, h, i: te.max(sc[b, h, i, j1], axis=j1), name="row_max")

            def ex(b, h, i, j):
                return te.exp((sc[b, h, i, j] - mx[b, h, i]) * scale)
        # exp is evaluated in the row sum and again in the probabilities (no separate exp tensor):
        # with P an elementwise block MetaSchedule inlines it into P·V and then places the row sum
        # inside P·V's reduction loops, where TVM 0.27 decomposes its init outside them (wrong
        # sums); a block holding exp is never inlined on CPU, so P stays a block of its own.
        sm = te.compute((bb, hh, ss), lambda b, h, i: te.sum(ex(b, h, i, j2), axis=j2), name="row_sum")
        p = te.compute((bb, hh, ss, ll), lambda b, h, i, j: ex(b, h, i, j) / sm[b, h, i], name="probs")
        # O is the last reduction with no epilogue: normalising after P·V gives O's block two
        # producers, which MetaSchedule's tiling cannot place (a ScheduleError aborts the search)
        j3 = te.reduce_axis((0, ll), name="j3")
        o = te.compute((bb, hh, ss, dd), lambda b, h, i, c: te.sum(p[b, h, i, j3] * v[b, h, j3, c], axis=j3),
                       name="O")
        return te.create_prim_func([q, k, v, o])

    def reference(self, inputs):
        q, k, v = (np.asarray(x, np.float64) for x in inputs)
        s = np.matmul(q, np.swapaxes(k, -1, -2)) / np.sqrt(self.D)
        return [np.matmul(_softmax64(s, self.mask()), v)]


OPS: dict[str, type[OpWorkload]] = {
    cls.op: cls for cls in (Gemm, BatchMatmul, Conv2dNCHW, Conv2dNHWC, DepthwiseConv2dNCHW, DepthwiseConvFused,
                            Softmax, LayerNorm, Attention)
}
_ALIASES = {"matmul": "gemm", "conv2d": "conv2d_nchw", "depthwise_conv2d": "depthwise_conv2d_nchw",
            "dwconv2d": "depthwise_conv2d_nchw", "bmm": "batch_matmul", "layer_norm": "layernorm",
            "layernormalization": "layernorm", "sdpa": "attention"}


def parse_workload(spec: str) -> OpWorkload:
    """``"gemm:M=197,N=3072,K=768"`` -> ``Gemm(M=197, N=3072, K=768)``.

    Raises ``UserInputError`` naming the unknown op, the unknown or missing parameter, or the
    value that is not an integer.
    """
    if not isinstance(spec, str) or ":" not in spec:
        raise UserInputError(
            f"bad kernel spec {spec!r}: expected OP:KEY=VALUE,... e.g. gemm:M=512,N=512,K=512"
        )
    op, _, body = spec.partition(":")
    op = _ALIASES.get(op.strip().lower(), op.strip().lower())
    cls = OPS.get(op)
    if cls is None:
        raise UserInputError(f"unknown kernel op {op!r} in {spec!r}; known: {', '.join(sorted(OPS))}")
    allowed = {f.name: f for f in fields(cls)}
    lower = {name.lower(): name for name in allowed}
    kwargs: dict[str, Any] = {}
    for item in filter(None, (p.strip() for p in body.split(","))):
        key, eq, value = item.partition("=")
        key = key.strip()
        if not eq:
            raise UserInputError(f"bad parameter {item!r} in {spec!r}: expected KEY=VALUE")
        name = key if key in allowed else lower.get(key.lower())
        if name is None:
            raise UserInputError(
                f"unknown parameter {key!r} for {op} in {spec!r}; allowed: {', '.join(allowed)}"
            )
        if name in kwargs:
            raise UserInputError(f"parameter {name!r} given twice in {spec!r}")
        value = value.strip()
        if name == "dtype":
            kwargs[name] = value
            continue
        try:
            kwargs[name] = int(value)
        except ValueError:
            raise UserInputError(f"parameter {name!r} in {spec!r} must be an integer, got {value!r}") from None
    missing = [f.name for f in fields(cls) if f.name not in kwargs and _is_required(cls, f.name)]
    if missing:
        raise UserInputError(f"missing parameter(s) {', '.join(missing)} for {op} in {spec!r}")
    return cls(**kwargs)


def _is_required(cls: type, name: str) -> bool:
    from dataclasses import MISSING

    for f in fields(cls):
        if f.name == name:
            return f.default is MISSING and f.default_factory is MISSING
    return False


# ---------------------------------------------------------------------------------------------
# TIR workloads extracted from ONNX through Relax
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class TirWorkload(KernelWorkload):
    """One fused PrimFunc (a MetaSchedule task) extracted from a model.

    ``module`` is the task's IRModule exactly as MetaSchedule extracted it (database records are
    keyed by its structure); ``weight`` is how many times the model calls it. The reference is
    the unscheduled PrimFunc interpreted in numpy float64 (``tir_reference``), or, where the
    interpreter does not cover the task, the unscheduled PrimFunc compiled by TVM for the host
    (fp32, not independent of the compiler under test): ``reference_kind`` says which.
    """

    name: str
    module: Any  # tvm.IRModule {"main": PrimFunc}
    input_specs: tuple[TensorSpec, ...]
    output_specs: tuple[TensorSpec, ...]
    weight: int = 1
    model_key: str = ""

    def key(self) -> str:
        import tvm_ffi

        h = tvm_ffi.structural_hash(self.module) & 0xFFFFFFFFFFFF
        return f"tir:{self.name}:{h:012x}"

    @property
    def inputs(self):
        return self.input_specs

    @property
    def outputs(self):
        return self.output_specs

    def ir_module(self):
        return self.module

    def prim_func(self):
        return _single_func(self.module)

    def flops(self) -> int:
        from tvm.s_tir.analysis import estimate_tir_flops

        return int(estimate_tir_flops(self.module))

    @property
    def reference_kind(self) -> str:
        """How ``reference`` is computed: TIR_REFERENCE_KIND, or "tvm-unscheduled (not independent): why"."""
        known = _REFERENCE_KIND.get(id(self))
        if known is None or known[0] is not self:
            self.reference(self.random_inputs(0))
            known = _REFERENCE_KIND[id(self)]
        return known[1]

    def reference(self, inputs):
        known = _REFERENCE_KIND.get(id(self))
        if known is None or known[0] is not self or not known[1].startswith(TVM_REFERENCE_KIND):
            try:
                out = tir_reference(self.prim_func(), inputs, self.inputs, self.outputs)
                _REFERENCE_KIND[id(self)] = (self, TIR_REFERENCE_KIND)
                return out
            except TirNotInterpretable as exc:  # from now on, for this task: TVM's unscheduled build
                _REFERENCE_KIND[id(self)] = (self, f"{TVM_REFERENCE_KIND}: {exc}")
        return self.tvm_reference(inputs)

    def tvm_reference(self, inputs):
        """The unscheduled PrimFunc compiled by TVM for this host, run in fp32 (not independent)."""
        import tvm

        rt = _host_reference_module(self)
        dev = tvm.cpu()
        args = [tvm.runtime.tensor(np.ascontiguousarray(x), dev) for x in inputs]
        outs = [tvm.runtime.tensor(np.full(s.shape, np.nan, s.dtype), dev) for s in self.outputs]
        rt["main"](*args, *outs)
        return [o.numpy().astype(np.float64) for o in outs]


def _single_func(mod):
    funcs = list(mod.functions.values())
    if len(funcs) != 1:
        raise ValueError(f"expected one PrimFunc in the task module, got {len(funcs)}")
    return funcs[0]


_REFERENCE_CACHE: dict[int, Any] = {}
_REFERENCE_KIND: dict[int, tuple[Any, str]] = {}


def _host_reference_module(wl: TirWorkload):
    import tvm

    cached = _REFERENCE_CACHE.get(id(wl))
    if cached is not None and cached[0] is wl:
        return cached[1]
    rt = tvm.compile(wl.ir_module(), target=tvm.target.Target({"kind": "llvm"}))
    _REFERENCE_CACHE[id(wl)] = (wl, rt)
    return rt


# ---------------------------------------------------------------------------------------------
# An independent float64 reference for fused tasks: the unscheduled TIR, interpreted in numpy
# ---------------------------------------------------------------------------------------------

TIR_REFERENCE_KIND = ("numpy float64 interpretation of the unscheduled TIR (independent of TVM's schedules, "
                      "lowering and code generation; shares its ONNX import and legalization)")
TVM_REFERENCE_KIND = "tvm-unscheduled (not independent)"


class TirNotInterpretable(Exception):
    """The PrimFunc uses a construct the float64 interpreter does not cover (or reads out of bounds)."""


_TIR_CHUNK = 1 << 22  # elements of one evaluated iteration-space chunk (bounds the interpreter's memory)

_UNARY = {
    "exp": np.exp, "exp2": np.exp2, "exp10": lambda x: np.power(10.0, x), "log": np.log, "log2": np.log2,
    "log10": np.log10, "log1p": np.log1p, "expm1": np.expm1, "sqrt": np.sqrt,
    "rsqrt": lambda x: 1.0 / np.sqrt(x), "tanh": np.tanh, "sigmoid": lambda x: 1.0 / (1.0 + np.exp(-x)),
    "fabs": np.abs, "floor": np.floor, "ceil": np.ceil, "trunc": np.trunc, "nearbyint": np.rint,
    "round": lambda x: np.where(np.asarray(x) >= 0, np.floor(np.asarray(x) + 0.5), np.ceil(np.asarray(x) - 0.5)),
    "sin": np.sin, "cos": np.cos, "tan": np.tan, "asin": np.arcsin, "acos": np.arccos, "atan": np.arctan,
    "sinh": np.sinh, "cosh": np.cosh, "asinh": np.arcsinh, "acosh": np.arccosh, "atanh": np.arctanh,
    "isnan": np.isnan, "isinf": np.isinf, "isfinite": np.isfinite,
}
_BINARY = {"pow": np.power, "fmod": np.fmod, "copysign": np.copysign, "atan2": np.arctan2, "hypot": np.hypot}


def _erf(x):
    try:
        from scipy.special import erf
    except ImportError:  # pragma: no cover - scipy is usually present with TVM
        import math

        return np.vectorize(math.erf, otypes=[np.float64])(x)
    return erf(x)


def _np_dtype(dtype: str):
    dtype = str(dtype)
    if dtype.startswith(("float", "bfloat")):
        return np.float64
    if dtype == "bool":
        return np.bool_
    if dtype.startswith(("int", "uint")):
        return np.int64
    raise TirNotInterpretable(f"dtype {dtype}")


def _key(obj) -> int:
    return hash(obj)  # TVM objects hash by identity


def _truncdiv(a, b):
    q = np.floor_divide(a, b)
    return q + ((np.mod(a, b) != 0) & ((np.asarray(a) < 0) ^ (np.asarray(b) < 0)))


class _TirInterpreter:
    """Runs an unscheduled PrimFunc (blocks in perfect loop nests, as TE/legalization produce them)
    on numpy float64 arrays: each block is evaluated over its whole iteration space at once, in
    chunks; reductions (``init`` + ``C = C op expr``) become numpy reductions."""

    def __init__(self, func) -> None:
        self.func = func

    # ------------------------------------------------------------------ statements
    def run(self, inputs: Sequence[np.ndarray], in_specs, out_specs) -> list[np.ndarray]:
        params = list(self.func.params)
        if len(params) != len(in_specs) + len(out_specs) or len(inputs) != len(in_specs):
            raise TirNotInterpretable("parameters do not match the task's inputs and outputs")
        self.bufs: dict[int, np.ndarray] = {}
        for p, x, s in zip(params, inputs, in_specs):
            self.bufs[_key(p)] = np.asarray(x).astype(_np_dtype(s.dtype))
        outs = []
        for p, s in zip(params[len(in_specs):], out_specs):
            a = np.full(s.shape, np.nan) if _np_dtype(s.dtype) is np.float64 else np.zeros(s.shape, _np_dtype(s.dtype))
            self.bufs[_key(p)] = a
            outs.append(a)
        self.exec(self.func.body, [])
        return outs

    def alloc(self, buffers) -> None:
        for b in buffers:
            dt = _np_dtype(b.dtype)
            shape = tuple(int(d) for d in b.shape)
            self.bufs[_key(b)] = np.full(shape, np.nan) if dt is np.float64 else np.zeros(shape, dt)

    def exec(self, stmt, loops) -> None:
        kind = type(stmt).__name__
        if kind == "SeqStmt":
            for s in stmt.seq:
                self.exec(s, loops)
        elif kind == "For":
            step = getattr(stmt, "step", None)
            if step is not None and int(step) != 1:
                raise TirNotInterpretable("loop step != 1")
            self.exec(stmt.body, loops + [stmt])
        elif kind == "SBlockRealize":
            self.block(stmt, loops)
        else:
            raise TirNotInterpretable(f"statement {kind}")

    def block(self, realize, loops) -> None:
        blk = realize.block
        if list(blk.match_buffers):
            raise TirNotInterpretable("match_buffer")
        pred = realize.predicate
        if not (type(pred).__name__ == "IntImm" and int(pred.value) == 1):
            raise TirNotInterpretable("block predicate")
        self.alloc(blk.alloc_buffers)
        ivs = list(blk.iter_vars)
        if not ivs:  # the root block, or a scalar block: run its body once
            if type(blk.body).__name__ == "BufferStore" and blk.init is None:
                self.store_spatial(blk.body, [])
                return
            if loops or blk.init is not None:
                raise TirNotInterpretable("a block without iteration variables inside loops")
            self.exec(blk.body, [])
            return
        used = set()
        for iv, val in zip(ivs, realize.iter_values):
            match = [lp for lp in loops if lp.loop_var.same_as(val)]
            if not match:
                raise TirNotInterpretable("a block binding that is not a plain loop variable")
            lp = match[0]
            if int(lp.min) != int(iv.dom.min) or int(lp.extent) != int(iv.dom.extent):
                raise TirNotInterpretable("a block binding that does not cover its iteration domain")
            used.add(_key(lp.loop_var))
            if int(iv.iter_type) not in (0, 2):
                raise TirNotInterpretable(f"iteration type {int(iv.iter_type)}")
        if any(_key(lp.loop_var) not in used and int(lp.extent) != 1 for lp in loops):
            raise TirNotInterpretable("a loop around a block that is not one of its iteration variables")
        store = blk.body
        if type(store).__name__ != "BufferStore":
            raise TirNotInterpretable(f"block body {type(store).__name__}")
        reduce_axes = [i for i, iv in enumerate(ivs) if int(iv.iter_type) == 2]
        if not reduce_axes:
            if blk.init is not None:
                raise TirNotInterpretable("init in a block without reduction")
            self.store_spatial(store, ivs)
        else:
            self.store_reduction(blk, store, ivs, reduce_axes)

    # ------------------------------------------------------------------ iteration space
    @staticmethod
    def chunks(ivs):
        extents = [int(iv.dom.extent) for iv in ivs]
        mins = [int(iv.dom.min) for iv in ivs]
        sizes = [1] * len(ivs)
        budget = _TIR_CHUNK
        for i in reversed(range(len(ivs))):
            sizes[i] = max(1, min(extents[i], budget))
            budget = max(1, budget // sizes[i])
        import itertools

        ranges = [range(0, e, s) for e, s in zip(extents, sizes)]
        for starts in itertools.product(*ranges):
            env, shape = {}, []
            for i, (iv, st) in enumerate(zip(ivs, starts)):
                n = min(sizes[i], extents[i] - st)
                sh = [1] * len(ivs)
                sh[i] = n
                env[_key(iv.var)] = np.arange(mins[i] + st, mins[i] + st + n, dtype=np.int64).reshape(sh)
                shape.append(n)
            yield starts, env, tuple(shape)

    def store_spatial(self, store, ivs) -> None:
        buf = self.buffer(store.buffer)
        for _, env, shape in self.chunks(ivs) if ivs else [((), {}, ())]:
            value = np.broadcast_to(np.asarray(self.eval(store.value, env, None), np.float64
                                               if buf.dtype == np.float64 else buf.dtype), shape)
            idx = self.indices(store.indices, env, None, buf.shape, shape)
            buf[idx] = value

    def store_reduction(self, blk, store, ivs, reduce_axes) -> None:
        buf = self.buffer(store.buffer)
        spatial = [i for i in range(len(ivs)) if i not in reduce_axes]
        # the store indexes the output with the spatial iteration variables, each once
        order = []
        for ix in store.indices:
            hit = [i for i in spatial if ivs[i].var.same_as(ix)]
            if not hit or hit[0] in order:
                raise TirNotInterpretable("a reduction stored at other than its spatial iteration variables")
            order.append(hit[0])
        if sorted(order) != spatial:
            raise TirNotInterpretable("a reduction whose store does not use every spatial variable")
        ufunc, rhs = self.reducer(store)
        init = blk.init
        if init is None or type(init).__name__ != "BufferStore" or not init.buffer.same_as(store.buffer) or \
                len(init.indices) != len(store.indices) or \
                not all(a.same_as(b) for a, b in zip(init.indices, store.indices)):
            raise TirNotInterpretable("a reduction without a matching init")
        for starts, env, shape in self.chunks(ivs):
            sp_shape = tuple(shape[i] for i in spatial)
            # index arrays of the output, in the order the store uses the spatial variables
            idx = []
            for i in order:
                a = env[_key(ivs[i].var)].reshape(-1)
                sh = [1] * len(spatial)
                sh[spatial.index(i)] = a.size
                idx.append(a.reshape(sh))
            idx = tuple(np.broadcast_to(a, sp_shape) for a in idx)
            if all(starts[i] == 0 for i in reduce_axes):  # first visit of these outputs: init
                v0 = np.broadcast_to(np.asarray(self.eval(init.value, env, None), buf.dtype), shape)
                buf[idx] = v0[tuple(0 if i in reduce_axes else slice(None) for i in range(len(ivs)))]
            vals = np.broadcast_to(np.asarray(self.eval(rhs, env, None)), shape)
            part = ufunc.reduce(vals, axis=tuple(reduce_axes))
            buf[idx] = ufunc(buf[idx], part)

    def reducer(self, store):
        """(numpy ufunc, the combined expression) of ``C[i] = C[i] op expr``."""
        v = store.value
        ops = {"Add": np.add, "Mul": np.multiply, "Max": np.maximum, "Min": np.minimum}
        name = type(v).__name__
        if name not in ops:
            raise TirNotInterpretable(f"reduction combiner {name}")

        def is_self(e):
            return type(e).__name__ == "TensorLoad" and e.source.same_as(store.buffer) and \
                len(e.indices) == len(store.indices) and all(a.same_as(b) for a, b in zip(e.indices, store.indices))

        if is_self(v.a) and not self.reads(v.b, store.buffer):
            return ops[name], v.b
        if is_self(v.b) and not self.reads(v.a, store.buffer):
            return ops[name], v.a
        raise TirNotInterpretable("a reduction update that is not C = C op expr")

    def reads(self, e, buffer) -> bool:
        found = []

        def visit(x):
            if type(x).__name__ == "TensorLoad" and x.source.same_as(buffer):
                found.append(x)
            for attr in ("a", "b", "value", "condition", "true_value", "false_value", "body"):
                if hasattr(x, attr) and type(getattr(x, attr)).__module__.startswith("tvm"):
                    visit(getattr(x, attr))
            for attr in ("args", "indices"):
                for y in getattr(x, attr, ()) or ():
                    visit(y)

        visit(e)
        return bool(found)

    # ------------------------------------------------------------------ expressions
    def buffer(self, b) -> np.ndarray:
        try:
            return self.bufs[_key(b)]
        except KeyError:
            raise TirNotInterpretable(f"buffer {getattr(b, 'name', b)} not allocated") from None

    def indices(self, exprs, env, mask, bshape, shape=None):
        idx = []
        for d, e in enumerate(exprs):
            v = np.asarray(self.eval(e, env, mask))
            if v.dtype.kind not in "iub":
                raise TirNotInterpretable("a non-integer index")
            v = v.astype(np.int64)
            n = bshape[d]
            bad = (v < 0) | (v >= n)
            if np.any(bad if mask is None else (bad & mask)):
                raise TirNotInterpretable("an out-of-bounds read or write")
            idx.append(np.clip(v, 0, n - 1))
        if shape is not None:
            idx = [np.broadcast_to(i, shape) for i in idx]
        return tuple(idx)

    def eval(self, e, env, mask):
        name = type(e).__name__
        if name == "IntImm":
            return bool(e.value) if str(e.ty.dtype) == "bool" else int(e.value)
        if name == "FloatImm":
            return float(e.value)
        if name == "Var":
            try:
                return env[_key(e)]
            except KeyError:
                raise TirNotInterpretable(f"free variable {e}") from None
        if name == "TensorLoad":
            buf = self.buffer(e.source)
            return buf[self.indices(e.indices, env, mask, buf.shape)]
        if name in ("Add", "Sub", "Mul", "Div", "Mod", "FloorDiv", "FloorMod", "Min", "Max", "EQ", "NE", "LT",
                    "LE", "GT", "GE", "And", "Or"):
            a, b = self.eval(e.a, env, mask), self.eval(e.b, env, mask)
            return self.binary(name, a, b)
        if name == "Not":
            return np.logical_not(self.eval(e.a, env, mask))
        if name == "Select":
            return self.select(e.condition, e.true_value, e.false_value, env, mask)
        if name == "Cast":
            return self.cast(self.eval(e.value, env, mask), str(e.ty.dtype))
        if name == "Let":
            env2 = dict(env)
            env2[_key(e.var)] = self.eval(e.value, env, mask)
            return self.eval(e.body, env2, mask)
        if name == "Call":
            return self.call(e, env, mask)
        raise TirNotInterpretable(f"expression {name}")

    @staticmethod
    def binary(name, a, b):
        ints = np.asarray(a).dtype.kind in "iub" and np.asarray(b).dtype.kind in "iub"
        if name == "Add":
            return np.add(a, b)
        if name == "Sub":
            return np.subtract(a, b)
        if name == "Mul":
            return np.multiply(a, b)
        if name == "Div":
            return _truncdiv(a, b) if ints else np.divide(a, b)
        if name == "Mod":
            return np.subtract(a, np.multiply(b, _truncdiv(a, b))) if ints else np.fmod(a, b)
        if name == "FloorDiv":
            return np.floor_divide(a, b) if ints else np.floor(np.divide(a, b))
        if name == "FloorMod":
            return np.mod(a, b)
        if name == "Min":
            return np.minimum(a, b)
        if name == "Max":
            return np.maximum(a, b)
        return {"EQ": np.equal, "NE": np.not_equal, "LT": np.less, "LE": np.less_equal, "GT": np.greater,
                "GE": np.greater_equal, "And": np.logical_and, "Or": np.logical_or}[name](a, b)

    def select(self, cond, t, f, env, mask):
        c = np.asarray(self.eval(cond, env, mask), bool)
        m_t = c if mask is None else (mask & c)
        m_f = ~c if mask is None else (mask & ~c)
        return np.where(c, self.eval(t, env, m_t), self.eval(f, env, m_f))

    @staticmethod
    def cast(v, dtype: str):
        dt = _np_dtype(dtype)
        v = np.asarray(v)
        if dt is np.int64 and v.dtype.kind == "f":
            return np.trunc(v).astype(np.int64)
        return v.astype(dt)

    def call(self, e, env, mask):
        op = str(e.op.name) if hasattr(e.op, "name") else str(e.op)
        short = op.split(".", 1)[1] if "." in op else op
        args = list(e.args)
        if short == "if_then_else":
            return self.select(args[0], args[1], args[2], env, mask)
        if short == "erf":
            return _erf(np.asarray(self.eval(args[0], env, mask), np.float64))
        if short in _UNARY and len(args) == 1:
            return _UNARY[short](np.asarray(self.eval(args[0], env, mask), np.float64))
        if short in _BINARY and len(args) == 2:
            return _BINARY[short](np.asarray(self.eval(args[0], env, mask), np.float64),
                                  np.asarray(self.eval(args[1], env, mask), np.float64))
        if short in ("max_value", "min_value"):
            dt = str(e.ty.dtype)
            info = np.finfo(dt) if dt.startswith("float") else np.iinfo(dt)
            return float(info.max if short == "max_value" else info.min)
        raise TirNotInterpretable(f"intrinsic {op}")


def tir_reference(func, inputs: Sequence[np.ndarray], in_specs, out_specs) -> list[np.ndarray]:
    """Float64 outputs of the unscheduled PrimFunc ``func`` on ``inputs``, computed by numpy (no
    TVM compilation or execution). Raises TirNotInterpretable for constructs it does not cover."""
    return _TirInterpreter(func).run(inputs, in_specs, out_specs)


def prim_func_io(func) -> tuple[tuple[TensorSpec, ...], tuple[TensorSpec, ...]]:
    """Split a PrimFunc's tensor params into (inputs, outputs): outputs are those a block writes.

    (TVM 0.27's tirx params are buffer Vars carrying name, shape and dtype themselves.)
    """
    import tvm

    sch = tvm.s_tir.Schedule(tvm.IRModule({"main": func}))
    written: list = []
    stack = list(sch.get_child_blocks(sch.get_sblock("root")))
    while stack:
        block = stack.pop()
        written.extend(region.source for region in sch.get(block).writes)
        stack.extend(sch.get_child_blocks(block))
    ins, outs = [], []
    for param in func.params:
        spec = TensorSpec(str(param.name), tuple(int(d) for d in param.shape), str(param.dtype))
        (outs if any(param.same_as(w) for w in written) else ins).append(spec)
    order = [str(p.name) for p in func.params]
    if [s.name for s in ins + outs] != order:
        raise ValueError(f"PrimFunc arguments are not inputs-then-outputs: {order}")
    return tuple(ins), tuple(outs)


def relax_prepare(mod):
    """The pass pipeline MetaSchedule task extraction needs (raw from_onnx output yields none)."""
    import tvm
    from tvm import relax

    seq = tvm.transform.Sequential(
        [
            relax.transform.DecomposeOpsForInference(),
            relax.transform.CanonicalizeBindings(),
        ]
    )
    return seq(mod)


def relax_fuse(mod):
    import tvm
    from tvm import relax

    seq = tvm.transform.Sequential(
        [
            relax.transform.LegalizeOps(),
            relax.transform.AnnotateTIROpPattern(),
            relax.transform.FoldConstant(),
            relax.transform.FuseOps(),
            relax.transform.FuseTIR(),
        ]
    )
    return seq(mod)


def load_onnx_relax(onnx_path: str | Path, input_shapes: Mapping[str, Sequence[int]]):
    """ONNX file -> Relax IRModule with the given static input shapes, weights bound as constants."""
    try:
        import onnx
    except ImportError as exc:  # pragma: no cover
        raise MissingExtra("ONNX import", "tvm") from exc
    from tvm.relax.frontend.onnx import from_onnx

    path = Path(onnx_path)
    if not path.is_file():
        raise ModelError(f"model not found: {path}")
    try:
        model = onnx.load(str(path))
    except Exception as exc:  # noqa: BLE001 - any parse failure is the user's file
        raise ModelError(f"cannot read ONNX model {path}: {exc}") from exc
    graph_inputs = [i.name for i in model.graph.input if i.name not in {t.name for t in model.graph.initializer}]
    unknown = set(input_shapes) - set(graph_inputs)
    if unknown:
        raise UserInputError(f"{path.name}: no input named {sorted(unknown)}; inputs are {graph_inputs}")
    shape_dict = {k: [int(d) for d in v] for k, v in input_shapes.items()}
    try:
        # TVM's importer prints what it fails on to stdout: stderr's, never into --format json output
        with contextlib.redirect_stdout(sys.stderr):
            mod = from_onnx(model, shape_dict=shape_dict, keep_params_in_input=False)
    except Exception as exc:  # noqa: BLE001
        raise ModelError(f"TVM cannot import {path.name}: {exc}") from exc
    return mod


def extract_onnx_tasks(
    onnx_path: str | Path, input_shapes: Mapping[str, Sequence[int]], target: Mapping[str, Any] | Any
) -> list[TirWorkload]:
    """Tuning tasks of an ONNX model: one TirWorkload per distinct fused PrimFunc."""
    import tvm
    from tvm.s_tir import meta_schedule as ms

    tgt = target if isinstance(target, tvm.target.Target) else tvm.target.Target(dict(target))
    mod = relax_fuse(relax_prepare(load_onnx_relax(onnx_path, input_shapes)))
    model_key = hashlib.sha256(Path(onnx_path).read_bytes()).hexdigest()[:16]
    tasks = []
    for task in ms.relax_integration.extract_tasks(mod, tgt):
        module = task.dispatched[0]
        ins, outs = prim_func_io(_single_func(module))
        tasks.append(TirWorkload(task.task_name, module, ins, outs, int(task.weight), model_key))
    return tasks
