"""What every operator shares: tensor specs, seeded inputs, the workload bases, the ``Op`` record
(one operator's host-side forms, looked up by name in ``edgetune.ops.OPS``) and ``FormView`` (an
operator as one baseline form sees it).

A workload is a frozen value: its ``key()`` is stable across runs and machines, it builds its
TVM PrimFunc on demand, lists its input and output tensors (name, shape, dtype) in argument
order (inputs first, then outputs, as the kernel's calling convention has them), counts its
flops, and computes a float64 numpy reference the host keeps to itself.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Mapping, Sequence

import numpy as np

from edgetune.errors import UserInputError
from edgetune.seeded import KERNEL, seeded_array

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
    """Seeded inputs of a kernel (``seeded.KERNEL``: negatives, and ~1% of entries x100, so a
    kernel which drops, duplicates or mis-orders terms cannot hide inside the tolerance)."""
    rng = np.random.default_rng(seed)
    return [seeded_array(spec.dtype, spec.shape, rng, KERNEL) for spec in specs]


def conv_out(size: int, kernel: int, stride: int, pad: int) -> int:
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


def no_weights(w) -> tuple[int, ...]:
    return ()


@dataclass(frozen=True)
class Op:
    """One operator kind and every host-side form of it, so that callers look the operator up
    (``OPS[w.op]``) instead of switching on its name. The PyTorch form is not here: the Python
    agent holds it (device_agents/python/edgetune_agent/backends/torch.py, ``torch_program``), so a
    torch job brings no code; ``torch`` says the agent has it.

    * ``workload``: the OpWorkload subclass (TE PrimFunc, float64 reference, spec-string fields);
    * ``weights(w)``: indices of ``w``'s weight operands (constant in a real model): the baseline's
      constant-weight forms hold them, and they keep one value over the final rounds. batch_matmul,
      softmax and attention have none (Q, K, V and attention's matmul operands are activations, so
      a constant-operand form would not be honest); layernorm's gamma and beta are weights;
    * ``onnx(w, a, b, y)``: the ONNX nodes computing ``w`` from operand names ``a``, ``b`` (the
      first two inputs, already widened for a mixed-precision matmul) into ``y``, and the
      initializers the graph itself needs: ``(nodes, extra)`` (``edgetune.ops.forms.op_onnx_model``);
    * ``tflite(w, constants, graph, schema)``: the one-op .tflite and its FormView;
    * ``numpy``: the numpy adapter's body (source), building ``run(inputs) -> [y]`` from ``P``,
      ``out_shape`` and the preallocated output ``y`` (``edgetune.ops.forms.numpy_adapter_source``);
    * ``form_params``: what the generated forms (numpy, PyTorch) need besides ``w.params()``;
    * ``half``: float16 operands are a mixed-precision matmul (float32 accumulation and output);
    * ``inductor_cpu``: torch.compile generates its own code for it on the CPU (for one matmul or
      convolution it calls the same oneDNN/BLAS routine as eager PyTorch, which is raced).
    """

    workload: type[OpWorkload]
    weights: Callable[[Any], tuple[int, ...]] = no_weights
    onnx: Callable[..., tuple[list, list]] | None = None
    tflite: Callable[..., tuple[bytes, "FormView"]] | None = None
    numpy: str | None = None
    torch: bool = False
    form_params: Mapping[str, Any] = field(default_factory=dict)
    half: bool = False
    inductor_cpu: bool = False

    @property
    def name(self) -> str:
        return self.workload.op


class FormView:
    """An operator as one baseline form sees it: the inputs it is sent (weights it holds as
    constants left out, layouts it prefers applied on the host, outside the timed region) and the
    outputs it returns. ``reference(form inputs)`` maps back to the operator's float64 reference,
    so the form is verified in its own terms exactly like the kernel (same verifier, same tolerance)."""

    def __init__(self, w, constants: Mapping[int, np.ndarray] | None = None,
                 in_perm: Mapping[int, Sequence[int]] | None = None,
                 out_perm: Mapping[int, Sequence[int]] | None = None, tag: str = "",
                 out_dtype: str | None = None):
        self.w = w
        # a form whose outputs come back in another dtype than the operator's (the float16-output
        # matmul forms): verified at that dtype's tolerance, against the same float64 reference
        self.out_dtype = out_dtype
        self.constants = {int(k): np.asarray(v) for k, v in (constants or {}).items()}
        self.in_perm = {int(k): tuple(v) for k, v in (in_perm or {}).items()}
        self.out_perm = {int(k): tuple(v) for k, v in (out_perm or {}).items()}
        self.tag = tag
        self.sent = [k for k in range(len(w.inputs)) if k not in self.constants]

    # -- what the verifier and the agent see
    @property
    def inputs(self) -> tuple[TensorSpec, ...]:
        return tuple(self._spec(self.w.inputs[k], self.in_perm.get(k)) for k in self.sent)

    @property
    def outputs(self) -> tuple[TensorSpec, ...]:
        specs = tuple(self._spec(s, self.out_perm.get(k)) for k, s in enumerate(self.w.outputs))
        return tuple(TensorSpec(s.name, s.shape, self.out_dtype) for s in specs) if self.out_dtype else specs

    @staticmethod
    def _spec(s: TensorSpec, perm) -> TensorSpec:
        return TensorSpec(s.name, tuple(s.shape[a] for a in perm), s.dtype) if perm else s

    def key(self) -> str:
        return f"{self.w.key()}|{self.tag}"

    def flops(self) -> int:
        return int(self.w.flops())

    def __getattr__(self, name):  # anything else (name, spec, op, ...) is the operator's
        return getattr(self.w, name)

    # -- mappings
    def to_form(self, kernel_inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        """The kernel's input set -> what this form is sent (its constants must be these values)."""
        for k, v in self.constants.items():
            if not np.array_equal(np.asarray(kernel_inputs[k]), v):
                raise ValueError(f"input {k} differs from the weights the {self.tag} form was built with")
        out = []
        for k in self.sent:
            x = np.asarray(kernel_inputs[k])
            out.append(np.ascontiguousarray(x.transpose(self.in_perm[k])) if k in self.in_perm else x.copy())
        return out

    def to_kernel(self, form_inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        it = iter(form_inputs)
        xs = []
        for k in range(len(self.w.inputs)):
            if k in self.constants:
                xs.append(self.constants[k])
            else:
                x = np.asarray(next(it))
                xs.append(x.transpose(np.argsort(self.in_perm[k])) if k in self.in_perm else x)
        return xs

    def outputs_to_form(self, kernel_outputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        return [np.ascontiguousarray(np.asarray(o).transpose(self.out_perm[k])) if k in self.out_perm else o
                for k, o in enumerate(kernel_outputs)]

    def reference(self, form_inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        return self.outputs_to_form(self.w.reference(self.to_kernel(form_inputs)))

    def random_inputs(self, seed: int) -> list[np.ndarray]:
        xs = self.w.random_inputs(seed)
        for k, v in self.constants.items():
            xs[k] = v
        return self.to_form(xs)

