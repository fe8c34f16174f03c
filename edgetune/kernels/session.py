"""Tune kernels on one device: operators (``--op``) or the tasks of a model, measured on the
device's native agent, every kernel verified, results stored in edgetune's SQLite database.

``tune_kernels(KernelSessionConfig(...))`` is the whole flow behind ``edgetune tune-kernels``:

1. parse the workloads (bad specs fail before any device work);
2. provision the native agent, read the device's cpuinfo → its TVM target and cross compiler;
3. per workload, MetaSchedule search with ``DeviceMeasure`` (tuning database under
   ``EDGETUNE_HOME/kernels/<device fingerprint>/<target>/``, so a rerun reuses its records);
4. the selected kernel is measured again in ``rounds`` fresh rounds against the STRONGEST BASELINE
   (DESIGN.md §4.5): every honest form of the same operator the device can run —
   onnxruntime with constant weights (initializers) and with runtime weights (graph inputs), on the
   native agent; numpy/BLAS and LiteRT/XNNPACK (a .tflite written here) on the Python agent where
   the device has Python. Kernel and forms are interleaved with a rotating order (K A B C, A B C K,
   …) so drift hits all; each round has new activations, while a weight operand keeps the same
   values in every round and every form (the constant-weight forms are built from exactly the
   values the kernel receives). Every run is verified; a form that fails is recorded as failed and
   not used. The form with the lowest median over the rounds is the verdict's baseline; the
   speedup and verdict come from ``measure.round_ratio`` (t interval on per-round log ratios, no
   verdict below 3 rounds);
5. one record per workload, round and participant (tuned kernel, each baseline form) in a run of
   config kind "kernels", so ``edgetune db``/``report`` read it like any other run.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np

import edgetune
from edgetune.agent.host import AgentClient, Job, default_workdir
from edgetune.build.tvm_kernel import resolve_cross_cc
from edgetune.candidate import Candidate
from edgetune.db import Record, Store
from edgetune.devices.inventory import DeviceSpec, Inventory, device_identity, edgetune_home
from edgetune.errors import DeviceError, UserInputError
from edgetune.kernels import device_measure
from edgetune.kernels.device_measure import DeviceMeasure, PythonTvmMeasure, device_kernel_target
from edgetune.kernels.measurement import verify_run
from edgetune.kernels.search import KernelRun, tune_workload
from edgetune.kernels.targets import TARGETS_DIR, cuda_target_name, device_sm, gpu_peak_gflops, load_target
from edgetune.kernels.workloads import LAYERNORM_EPS, TensorSpec, extract_onnx_tasks, parse_workload
from edgetune.measure import round_ratio, summarize
from edgetune.workload import load_model, parse_dims, resolve_model, shape_points

KernelEvent = Callable[[dict[str, Any]], None]

DEFAULT_ROUNDS = 5  # final interleaved rounds; a verdict needs measure.MIN_VERDICT_ROUNDS (3)
FINAL_WEIGHT_SEED = 2  # the weight operands of the final rounds (the same in every round and form)
FINAL_SEED_BASE = 100  # round r's activations: random_inputs(FINAL_SEED_BASE + r)


@dataclass
class KernelSessionConfig:
    device: str = "local"
    ops: Sequence[str] = ()
    model: str | None = None
    dims: Sequence[str] = ()
    trials: int = 64
    rounds: int = DEFAULT_ROUNDS  # final interleaved rounds (kernel vs every baseline form)
    baseline: bool = True
    budget_ms: float = 100.0
    timeout_s: float = 60.0
    num_threads: int | None = None
    max_tasks: int | None = None
    db: str | None = None  # edgetune SQLite store
    tuning_dir: str | None = None  # MetaSchedule databases (default EDGETUNE_HOME/kernels)
    command: str = ""
    inventory: Any = None  # an Inventory (tests); default: the user's
    gpu: bool = False  # CUDA kernels for the device's GPU (this machine's), not its CPU


@dataclass
class KernelResult:
    """One workload's outcome on the device (what the table / JSON shows)."""

    name: str
    spec: str
    workload_key: str
    flops: int
    weight: int
    verified: bool
    reason: str
    gflops: float | None
    median_ns: float | None
    p10_ns: float | None
    p90_ns: float | None
    peak_pct: float | None
    trials_measured: int
    trials_failed: int
    reused_records: int
    tuning_s: float
    emulated: bool
    failures: dict[str, int] = field(default_factory=dict)
    # the verdict against the strongest baseline form: {"backend" (its label), "form", "median_ns",
    # "gflops", "speedup", "ci95", "verdict", "rounds", "method", "reason", "forms": [every form:
    # {"form","label","status","reason","median_ns","gflops","rounds","speedup","ci95","verdict","strongest"}]}
    baseline: dict[str, Any] | None = None
    artifact: str | None = None
    reference: str = ""  # how the host's reference was computed (independent or not)

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class KernelSessionOutcome:
    run_id: str
    device: str
    fingerprint_key: str
    fingerprint: dict[str, Any]
    emulated: str | None
    target: dict[str, Any]
    cross_cc: str | None
    peak_gflops: float | None
    results: list[KernelResult]
    db_path: str
    tuning_dir: str
    peak_is_bound: bool = False  # the peak is at a bound clock (no cpufreq on an x86 guest), not the device's

    def as_dict(self) -> dict[str, Any]:
        return {"schema": "edgetune.kernels/1", "run_id": self.run_id, "device": self.device,
                "fingerprint_key": self.fingerprint_key, "fingerprint": self.fingerprint,
                "emulated": self.emulated, "timings": "emulated" if self.emulated else "device",
                "target": self.target, "cross_cc": self.cross_cc, "fp32_peak_gflops": self.peak_gflops,
                "fp32_peak_is_bound": self.peak_is_bound,
                "db": self.db_path, "tuning_dir": self.tuning_dir,
                "workloads": [r.as_dict() for r in self.results]}


# ---------------------------------------------------------------------------------------------
# Workloads
# ---------------------------------------------------------------------------------------------


def parse_ops(specs: Sequence[str]):
    out, seen = [], set()
    for s in specs:
        w = parse_workload(s)
        if w.key() not in seen:
            seen.add(w.key())
            out.append(w)
    return out


def model_input_shapes(model_path: str, dims: Sequence[str]) -> tuple[Any, dict[str, tuple[int, ...]]]:
    """(Model, {input name: static shape}) with --dim bindings (well-known dims defaulted, like tune)."""
    model = load_model(model_path)
    if model.format != "onnx":
        raise UserInputError(f"{model.path.name}: kernel tuning takes ONNX models (TVM Relax import)")
    point = shape_points(model, parse_dims(dims, model), {})[0]
    return model, {s.name: s.resolve(point) for s in model.inputs}


# ---------------------------------------------------------------------------------------------
# Baseline forms of an operator (DESIGN.md §4.5: the strongest baseline, never a handicapped one)
# ---------------------------------------------------------------------------------------------

# Which inputs of an operator are weights (constant in a real model). batch_matmul, softmax and
# attention have none (Q, K, V and attention's matmul operands are activations, so a
# constant-operand form would not be honest); layernorm's gamma and beta are weights.
WEIGHT_INPUTS: dict[str, tuple[int, ...]] = {"gemm": (1,), "conv2d_nchw": (1,), "conv2d_nhwc": (1,),
                                             "depthwise_conv2d_nchw": (1,), "layernorm": (1, 2)}


def weight_inputs(w) -> tuple[int, ...]:
    """Indices of ``w``'s weight operands (() for fused tasks, batch_matmul, softmax, attention)."""
    op = getattr(w, "op", None) or ""
    if op == "dwconv2d_fused":  # a model's depthwise Conv: weights and bias are initializers
        return (1, 2) if w.bias else (1,)
    return WEIGHT_INPUTS.get(op, ())


def final_weights(w) -> dict[int, np.ndarray]:
    """The weight operands of the final rounds: one seeded draw, used in every round and every form."""
    idx = weight_inputs(w)
    if not idx:
        return {}
    xs = w.random_inputs(FINAL_WEIGHT_SEED)
    return {k: xs[k] for k in idx}


def final_inputs(w, rnd: int, weights: Mapping[int, np.ndarray]) -> list[np.ndarray]:
    """Round ``rnd``'s input set: fresh activations, the fixed weights (exactly these values)."""
    xs = w.random_inputs(FINAL_SEED_BASE + rnd)
    for k, v in weights.items():
        xs[k] = v
    return xs


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


@dataclass
class BaselineForm:
    """One honest form of the operator on the device: how it is run and how it is verified."""

    key: str  # ort-constant | ort-runtime | ort-cuda-constant | ort-cuda-runtime | ort-fp16-runtime |
    #            ort-cuda-fp16-runtime | numpy | torch | torch-compile | torch-cuda | torch-cuda-compile | tflite
    label: str
    candidate: Candidate
    agent: str  # "native" (the kernel's agent) | "python"
    backend: str  # the agent backend: ort | adapter | torch | tflite
    artifact: Path
    view: FormView
    params: dict[str, Any] = field(default_factory=dict)


def _half_matmul(w) -> bool:
    """A mixed-precision matmul: float16 operands, float32 accumulation and output."""
    return getattr(w, "op", None) in ("gemm", "batch_matmul") and getattr(w, "dtype", "float32") == "float16"


def op_onnx_model(w, constants: Mapping[int, np.ndarray] | None = None, half_output: bool = False):
    """A one-node ONNX model computing operator workload ``w``, or None for ops without an ONNX form.

    ``constants`` {input index: array}: those inputs are initializers holding exactly these values
    (the constant-weight form, onnxruntime's path in a real model: prepacked weights); the others
    are graph inputs. Layout adaptations a real model would have are nodes of the graph (a
    transposed batch_matmul operand, NHWC convolution through NCHW Conv), so onnxruntime's own
    optimizer may fuse them, as it would in a model. Attention is the graph an exported model has
    (MatMul(Q, Transpose(K)) · 1/sqrt(D) [+ causal mask] → Softmax → MatMul(V)), its scale and mask
    initializers of the graph.

    ``half_output`` (float16 matmuls only): the float16 MatMul as ONNX has it, float16 output, no
    widening: on a GPU cuBLAS's tensor-core GEMM (float32 accumulation in onnxruntime's default)."""
    from onnx import TensorProto, helper, numpy_helper

    op = getattr(w, "op", None)
    constants = dict(constants or {})
    ins, outs = w.inputs, w.outputs
    a, y = ins[0].name, outs[0].name
    b = ins[1].name if len(ins) > 1 else None
    nodes = []
    extra = []  # initializers the graph itself needs (never operands of the kernel)
    half = _half_matmul(w)
    if half_output and not half:
        return None
    if half and not half_output:
        # float16 operands, float32 accumulation and output: ONNX's MatMul of float16 returns float16,
        # so the operands are widened first (onnxruntime then runs a float32 MatMul)
        for name in (a, b):
            nodes.append(helper.make_node("Cast", [name], [name + "_f32"], to=TensorProto.FLOAT))
        a, b = a + "_f32", b + "_f32"
    if op == "gemm":
        nodes.append(helper.make_node("MatMul", [a, b], [y]))
    elif op == "batch_matmul":
        if w.TB:
            nodes.append(helper.make_node("Transpose", [b], [b + "_t"], perm=[0, 2, 1]))
            b = b + "_t"
        nodes.append(helper.make_node("MatMul", [a, b], [y]))
    elif op in ("conv2d_nchw", "depthwise_conv2d_nchw", "conv2d_nhwc"):
        attrs = dict(strides=[w.stride, w.stride], pads=[w.pad] * 4, kernel_shape=[w.R, w.S])
        if op == "depthwise_conv2d_nchw":
            attrs["group"] = w.C
        if op == "conv2d_nhwc":  # ONNX Conv is NCHW: the transposes a converted NHWC model carries
            nodes.append(helper.make_node("Transpose", [a], [a + "_nchw"], perm=[0, 3, 1, 2]))
            nodes.append(helper.make_node("Transpose", [b], [b + "_oihw"], perm=[3, 2, 0, 1]))
            nodes.append(helper.make_node("Conv", [a + "_nchw", b + "_oihw"], [y + "_nchw"], **attrs))
            nodes.append(helper.make_node("Transpose", [y + "_nchw"], [y], perm=[0, 2, 3, 1]))
        else:
            nodes.append(helper.make_node("Conv", [a, b], [y], **attrs))
    elif op == "dwconv2d_fused":  # the nodes as they stand in the model: Conv(+bias) then the activation
        conv_out = y if not w.act else y + "_conv"
        nodes.append(helper.make_node("Conv", [s.name for s in ins], [conv_out], group=w.C,
                                      kernel_shape=[w.R, w.S], strides=[w.SH, w.SW],
                                      pads=[w.PT, w.PL, w.PB, w.PR]))
        if w.act == 1:
            nodes.append(helper.make_node("Relu", [conv_out], [y]))
        elif w.act == 2:
            extra.append(numpy_helper.from_array(np.array(0.0, np.float32), "clip_lo"))
            extra.append(numpy_helper.from_array(np.array(6.0, np.float32), "clip_hi"))
            nodes.append(helper.make_node("Clip", [conv_out, "clip_lo", "clip_hi"], [y]))
        elif w.act == 3:
            nodes.append(helper.make_node("HardSwish", [conv_out], [y]))
    elif op == "softmax":
        nodes.append(helper.make_node("Softmax", [a], [y], axis=-1))
    elif op == "layernorm":
        nodes.append(helper.make_node("LayerNormalization", [s.name for s in ins], [y], axis=-1,
                                      epsilon=LAYERNORM_EPS))
    elif op == "attention":
        q, k, v = (s.name for s in ins)
        extra.append(numpy_helper.from_array(np.array(1.0 / np.sqrt(w.D), np.float32), "scale"))
        nodes.append(helper.make_node("Transpose", [k], ["K_t"], perm=[0, 1, 3, 2]))
        nodes.append(helper.make_node("MatMul", [q, "K_t"], ["qk"]))
        nodes.append(helper.make_node("Mul", ["qk", "scale"], ["scores"]))
        scores = "scores"
        if w.causal:  # -inf where key j > i + (L - S): exp gives exactly 0 there
            mask = np.where(w.mask(), np.float32(-np.inf), np.float32(0.0)).astype(np.float32)
            extra.append(numpy_helper.from_array(mask, "causal_mask"))
            nodes.append(helper.make_node("Add", ["scores", "causal_mask"], ["scores_masked"]))
            scores = "scores_masked"
        nodes.append(helper.make_node("Softmax", [scores], ["probs"], axis=-1))
        nodes.append(helper.make_node("MatMul", ["probs", v], [y]))
    else:
        return None

    onnx_dtype = {"float32": TensorProto.FLOAT, "float16": TensorProto.FLOAT16}

    def vi(s):
        return helper.make_tensor_value_info(s.name, onnx_dtype[s.dtype], list(s.shape))

    inits = []
    for k, v in sorted(constants.items()):
        v = np.ascontiguousarray(v, dtype=ins[k].dtype)
        if tuple(v.shape) != tuple(ins[k].shape):
            raise ValueError(f"constant {ins[k].name}: shape {v.shape}, expected {ins[k].shape}")
        inits.append(numpy_helper.from_array(v, ins[k].name))
    out_specs = [TensorSpec(s.name, s.shape, "float16") for s in outs] if half_output else outs
    graph = helper.make_graph(nodes, op, [vi(s) for k, s in enumerate(ins) if k not in constants],
                              [vi(s) for s in out_specs], initializer=inits + extra)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


_NHWC = (0, 2, 3, 1)  # NCHW array -> NHWC


def _tflite_padding(S, size: int, k: int, stride: int, pad: int, out: int):
    """TFLite padding equal to a symmetric zero pad: VALID (pad 0), SAME when it pads exactly the
    same, else None (an explicit PAD op then VALID)."""
    if pad == 0:
        return S.Padding.VALID
    same_out = -(-size // stride)
    total = max((same_out - 1) * stride + k - size, 0)
    if same_out == out and total // 2 == pad:
        return S.Padding.SAME
    return None


def op_tflite_model(w, constants: Mapping[int, np.ndarray]) -> tuple[bytes, FormView] | None:
    """A one-op .tflite computing ``w`` the way LiteRT runs it best (XNNPACK: NHWC activations,
    constant weights), with the FormView mapping the kernel's layout to it; None where there is no
    such form. The weights are ``constants`` (the kernel's values), transformed to TFLite's layout."""
    from models._tflite import S, TFLiteGraph  # needs ai-edge-litert's schema bindings on the host

    op = getattr(w, "op", None)
    if getattr(w, "dtype", "float32") != "float32":
        return None  # (float16 operands with float32 accumulation: no one-op TFLite form)
    t = TFLiteGraph()
    act = S.ActivationFunctionType.NONE
    if op == "gemm":
        view = FormView(w, constants, tag="tflite")
        a = t.activation(w.inputs[0].name, (w.M, w.K))
        wt = t.const("W", np.ascontiguousarray(constants[1].T))  # FULLY_CONNECTED wants [out, in]
        bias = t.const("bias", np.zeros(w.N, np.float32))
        y = t.activation(w.outputs[0].name, (w.M, w.N))
        o = S.FullyConnectedOptionsT()
        o.fusedActivationFunction = act
        t.op(S.BuiltinOperator.FULLY_CONNECTED, [a, wt, bias], [y], S.BuiltinOptions.FullyConnectedOptions, o)
        return t.serialize([a], [y], f"edgetune baseline {w.spec()}"), view
    if op == "batch_matmul":
        view = FormView(w, {}, tag="tflite")
        a = t.activation(w.inputs[0].name, w.inputs[0].shape)
        b = t.activation(w.inputs[1].name, w.inputs[1].shape)
        y = t.activation(w.outputs[0].name, w.outputs[0].shape)
        o = S.BatchMatMulOptionsT()
        o.adjX, o.adjY = False, bool(w.TB)
        t.op(S.BuiltinOperator.BATCH_MATMUL, [a, b], [y], S.BuiltinOptions.BatchMatMulOptions, o)
        return t.serialize([a, b], [y], f"edgetune baseline {w.spec()}"), view
    if op == "softmax":  # SOFTMAX over the last axis (beta 1); no TFLite form of layernorm, attention
        view = FormView(w, {}, tag="tflite")
        x = t.activation(w.inputs[0].name, w.inputs[0].shape)
        y = t.activation(w.outputs[0].name, w.outputs[0].shape)
        o = S.SoftmaxOptionsT()
        o.beta = 1.0
        t.op(S.BuiltinOperator.SOFTMAX, [x], [y], S.BuiltinOptions.SoftmaxOptions, o)
        return t.serialize([x], [y], f"edgetune baseline {w.spec()}"), view
    if op not in ("conv2d_nchw", "depthwise_conv2d_nchw", "conv2d_nhwc"):
        return None
    wv = np.asarray(constants[1], np.float32)
    if op == "conv2d_nhwc":
        view = FormView(w, constants, tag="tflite")
        filt = wv.transpose(3, 0, 1, 2)  # HWIO -> OHWI
        cin, cout = w.C, w.K
    else:
        view = FormView(w, constants, in_perm={0: _NHWC}, out_perm={0: _NHWC}, tag="tflite")
        if op == "conv2d_nchw":
            filt = wv.transpose(0, 2, 3, 1)  # OIHW -> OHWI
            cin, cout = w.C, w.K
        else:
            filt = wv[:, 0].transpose(1, 2, 0)[None]  # [C,1,R,S] -> [1,R,S,C]
            cin = cout = w.C
    x = t.activation(w.inputs[0].name, (w.N, w.H, w.W, cin))
    graph_in = x
    ph = _tflite_padding(S, w.H, w.R, w.stride, w.pad, w.P)
    pw = _tflite_padding(S, w.W, w.S, w.stride, w.pad, w.Q)
    padding = ph if ph is not None and ph == pw else None
    if padding is None:  # explicit symmetric zero pad, then VALID
        p = w.pad
        xp = t.activation("X_padded", (w.N, w.H + 2 * p, w.W + 2 * p, cin))
        pads = t.const("paddings", np.array([[0, 0], [p, p], [p, p], [0, 0]], np.int32))
        t.op(S.BuiltinOperator.PAD, [x, pads], [xp], S.BuiltinOptions.PadOptions, S.PadOptionsT())
        x, padding = xp, S.Padding.VALID
    f = t.const("W", np.ascontiguousarray(filt, np.float32))
    bias = t.const("bias", np.zeros(cout, np.float32))
    y = t.activation(w.outputs[0].name, (w.N, w.P, w.Q, cout))
    if op == "depthwise_conv2d_nchw":
        o = S.DepthwiseConv2DOptionsT()
        o.depthMultiplier = 1
        code, otype = S.BuiltinOperator.DEPTHWISE_CONV_2D, S.BuiltinOptions.DepthwiseConv2DOptions
    else:
        o = S.Conv2DOptionsT()
        code, otype = S.BuiltinOperator.CONV_2D, S.BuiltinOptions.Conv2DOptions
    o.padding = padding
    o.strideH = o.strideW = w.stride
    o.dilationHFactor = o.dilationWFactor = 1
    o.fusedActivationFunction = act
    t.op(code, [x, f, bias], [y], otype, o)
    return t.serialize([graph_in], [y], f"edgetune baseline {w.spec()}"), view


_NUMPY_ADAPTER = '''"""edgetune baseline: {spec} in numpy (float32, BLAS through numpy.matmul), generated by
edgetune.kernels.session. load(model_path, params) -> callable(inputs) -> outputs; outputs are
computed on every call into a preallocated buffer (the strongest honest numpy form)."""
import numpy as np

OP = {op!r}
P = {params!r}


def load(model_path, params):
    from numpy.lib.stride_tricks import sliding_window_view

    out_shape = tuple({out_shape!r})
    y = np.empty(out_shape, np.float32)
    if OP == "gemm":  # (float16 operands: widened, float32 loop, as the op accumulates)
        def run(inputs):
            np.matmul(inputs[0], inputs[1], out=y, dtype=np.float32)
            return [y]
    elif OP == "batch_matmul":
        def run(inputs):
            b = inputs[1].transpose(0, 2, 1) if P["TB"] else inputs[1]
            np.matmul(inputs[0], b, out=y, dtype=np.float32)
            return [y]
    elif OP == "depthwise_conv2d_nchw":
        n, c, h, w_, r, s, st, pad = (P[k] for k in ("N", "C", "H", "W", "R", "S", "stride", "pad"))
        pq = out_shape[2:]
        xp = np.zeros((n, c, h + 2 * pad, w_ + 2 * pad), np.float32)
        tmp = np.empty(out_shape, np.float32)

        def run(inputs):
            x, wt = inputs
            xp[:, :, pad:pad + h, pad:pad + w_] = x
            first = True
            for i in range(r):
                for j in range(s):
                    tap = xp[:, :, i:i + st * (pq[0] - 1) + 1:st, j:j + st * (pq[1] - 1) + 1:st]
                    k = wt[:, 0, i, j].reshape(1, c, 1, 1)
                    if first:
                        np.multiply(tap, k, out=y)
                        first = False
                    else:
                        np.multiply(tap, k, out=tmp)
                        np.add(y, tmp, out=y)
            return [y]
    elif OP == "conv2d_nchw":
        n, c, h, w_, kk, r, s, st, pad = (P[k] for k in ("N", "C", "H", "W", "K", "R", "S", "stride", "pad"))
        pq = out_shape[2] * out_shape[3]
        if r == s == 1 and st == 1 and pad == 0:
            def run(inputs):
                x, wt = inputs
                np.matmul(wt.reshape(kk, c), x.reshape(n, c, h * w_), out=y.reshape(n, kk, pq))
                return [y]
        else:
            xp = np.zeros((n, c, h + 2 * pad, w_ + 2 * pad), np.float32)

            def run(inputs):
                x, wt = inputs
                xp[:, :, pad:pad + h, pad:pad + w_] = x
                win = sliding_window_view(xp, (r, s), axis=(2, 3))[:, :, ::st, ::st]  # N C P Q R S
                w2 = wt.reshape(kk, c * r * s)
                for b in range(n):
                    cols = win[b].transpose(0, 3, 4, 1, 2).reshape(c * r * s, pq)  # im2col
                    np.matmul(w2, cols, out=y[b].reshape(kk, pq))
                return [y]
    elif OP == "conv2d_nhwc":
        n, c, h, w_, kk, r, s, st, pad = (P[k] for k in ("N", "C", "H", "W", "K", "R", "S", "stride", "pad"))
        pq = out_shape[1] * out_shape[2]
        if r == s == 1 and st == 1 and pad == 0:
            def run(inputs):
                x, wt = inputs
                np.matmul(x.reshape(n * h * w_, c), wt.reshape(c, kk), out=y.reshape(n * pq, kk))
                return [y]
        else:
            xp = np.zeros((n, h + 2 * pad, w_ + 2 * pad, c), np.float32)

            def run(inputs):
                x, wt = inputs
                xp[:, pad:pad + h, pad:pad + w_, :] = x
                win = sliding_window_view(xp, (r, s), axis=(1, 2))[:, ::st, ::st]  # N P Q C R S
                cols = win.transpose(0, 1, 2, 4, 5, 3).reshape(n * pq, r * s * c)
                np.matmul(cols, wt.reshape(r * s * c, kk), out=y.reshape(n * pq, kk))
                return [y]
    elif OP == "softmax":
        rows = out_shape[0]
        mx = np.empty((rows, 1), np.float32)
        sm = np.empty((rows, 1), np.float32)

        def run(inputs):
            x = inputs[0]
            np.max(x, axis=1, keepdims=True, out=mx)
            np.subtract(x, mx, out=y)
            np.exp(y, out=y)
            np.sum(y, axis=1, keepdims=True, out=sm)
            np.divide(y, sm, out=y)
            return [y]
    elif OP == "layernorm":
        rows = out_shape[0]
        mean = np.empty((rows, 1), np.float32)
        var = np.empty((rows, 1), np.float32)
        sq = np.empty(out_shape, np.float32)

        def run(inputs):
            x, gamma, beta = inputs
            np.mean(x, axis=1, keepdims=True, out=mean)
            np.subtract(x, mean, out=y)
            np.multiply(y, y, out=sq)
            np.mean(sq, axis=1, keepdims=True, out=var)  # population variance
            np.add(var, np.float32(P["eps"]), out=var)
            np.sqrt(var, out=var)
            np.divide(y, var, out=y)
            np.multiply(y, gamma, out=y)
            np.add(y, beta, out=y)
            return [y]
    elif OP == "attention":
        b_, h_, s_, d_, l_ = (P[k] for k in ("B", "H", "S", "D", "L"))
        scores = np.empty((b_, h_, s_, l_), np.float32)
        mx = np.empty((b_, h_, s_, 1), np.float32)
        sm = np.empty((b_, h_, s_, 1), np.float32)
        scale = np.float32(1.0 / np.sqrt(d_))
        masked = np.arange(l_)[None, :] > np.arange(s_)[:, None] + (l_ - s_) if P["causal"] else None

        def run(inputs):
            q, k, v = inputs
            np.matmul(q, k.transpose(0, 1, 3, 2), out=scores)
            np.multiply(scores, scale, out=scores)
            if masked is not None:
                np.copyto(scores, np.float32(-np.inf), where=masked)
            np.max(scores, axis=-1, keepdims=True, out=mx)
            np.subtract(scores, mx, out=scores)
            np.exp(scores, out=scores)
            np.sum(scores, axis=-1, keepdims=True, out=sm)
            np.matmul(scores, v, out=y)
            np.divide(y, sm, out=y)  # normalise the S x D output, not the S x L probabilities
            return [y]
    else:
        raise ValueError("no numpy form of " + OP)
    return run
'''


# the operator kinds the generated forms (numpy, PyTorch) compute
_FORM_OPS = ("gemm", "batch_matmul", "conv2d_nchw", "depthwise_conv2d_nchw", "conv2d_nhwc", "softmax", "layernorm",
             "attention")


def _form_params(w) -> dict[str, Any] | None:
    """``w``'s parameters as a generated form needs them (layernorm's epsilon added), or None for an
    operator no generated form computes."""
    op = getattr(w, "op", None)
    if op not in _FORM_OPS:
        return None
    params = w.params()
    if op == "layernorm":
        params["eps"] = LAYERNORM_EPS
    return params


def numpy_adapter_source(w) -> str | None:
    """A Python adapter (the Python agent's ``adapter`` backend) computing ``w`` in numpy, or None."""
    params = _form_params(w)
    if params is None:
        return None
    return _NUMPY_ADAPTER.format(spec=w.spec(), op=w.op, params=params, out_shape=list(w.outputs[0].shape))


COMPILE_ALLOWANCE_S = 600.0  # what a torch.compile form's job may take beyond --timeout, to compile


def torch_op_artifact(w) -> str | None:
    """The Python agent's ``torch`` artifact of ``w`` (JSON: the operator by name and its parameters;
    the agent holds PyTorch's form of each, so the job brings no code), or None."""
    params = _form_params(w)
    if params is None:
        return None
    return json.dumps({"op": w.op, "params": params, "dtype": getattr(w, "dtype", "float32")}, sort_keys=True)


@dataclass
class BaselineDevice:
    """What the device offers the baseline forms: onnxruntime on the native agent, and the Python
    agent (numpy, LiteRT) when the device has Python; ``*_reason`` say why a runtime is missing."""

    native_ort: bool = False
    native_ort_reason: str = ""
    python: Any = None  # an AgentClient on the Python agent, or None
    python_info: Any = None
    python_reason: str = ""
    num_threads: int = 1

    @property
    def tflite(self) -> bool:
        return self.python_info is not None and bool(self.python_info.runtimes.get("tflite"))

    @property
    def gpus(self) -> list:
        """The device's NVIDIA GPUs (its Python agent's fingerprint)."""
        fp = getattr(self.python_info, "fingerprint", None)
        g = fp.get("gpus") if isinstance(fp, dict) else None
        return g if isinstance(g, list) else []

    @property
    def torch(self) -> str | None:
        """The device's PyTorch version (Python agent), or None."""
        return self.python_info.runtimes.get("torch") if self.python_info is not None else None

    @property
    def torch_cuda(self) -> bool:
        """The device's PyTorch reaches its GPU (a CUDA build, a driver)."""
        return bool(self.torch) and bool(self.python_info.runtimes.get("torch_cuda"))

    @property
    def ort_cuda(self) -> bool:
        """The device's onnxruntime (Python agent) has the CUDA execution provider."""
        have = self.python_info.runtimes.get("onnxruntime_providers") if self.python_info is not None else None
        return isinstance(have, list) and "CUDAExecutionProvider" in have


def baseline_forms(w, weights: Mapping[int, np.ndarray], workdir: Path,
                   dev: BaselineDevice) -> tuple[list[BaselineForm], list[dict[str, Any]]]:
    """Every honest form of operator ``w`` the device can run, built here into ``workdir``, and the
    forms that cannot run (``{"form","label","status":"unavailable","reason"}``). The constant-weight
    forms hold exactly ``weights`` (the values the kernel receives in every final round)."""
    forms: list[BaselineForm] = []
    skipped: list[dict[str, Any]] = []
    op = getattr(w, "op", None)
    tag = hashlib.sha256(w.key().encode()).hexdigest()[:12]

    def skip(key, label, reason):
        skipped.append({"form": key, "label": label, "status": "unavailable", "reason": reason})

    if op is None:
        reason = "no one-node form (fused task)"
        for key, label in (("ort-constant", "onnxruntime, constant weights"),
                           ("ort-runtime", "onnxruntime, runtime weights"), ("numpy", "numpy"),
                           ("torch", "PyTorch"), ("tflite", "LiteRT/XNNPACK")):
            skip(key, label, reason)
        return forms, skipped

    # onnxruntime, on the native agent (the kernel's own agent: same process model); on a GPU device
    # also onnxruntime's CUDA provider (cuBLAS / cuDNN underneath) on the Python agent: inputs and
    # outputs in GPU memory (io_binding "device": inputs uploaded before the timed run, the run
    # synchronized), TF32 off (an fp32 operator is held to fp32 and so is its baseline)
    cuda = {"execution_provider": "CUDAExecutionProvider", "io_binding": "device", "provider_options": {"use_tf32": "0"}}
    ort_forms = [("ort-constant", "onnxruntime, constant weights", dict(weights), "constant", "native", {}),
                 ("ort-runtime", "onnxruntime, runtime weights", {}, "runtime", "native", {})]
    # float16 operands: the forms above widen them (a float32 GEMM, as the op's float32 output asks);
    # the float16 MatMul with float16 output is raced too. On a GPU that is cuBLAS's tensor-core GEMM,
    # the one a float16 kernel must beat (a widened float32 GEMM with TF32 off is no baseline for
    # tensor cores). Its output is rounded to float16: verified at float16's tolerance, and it
    # writes half the bytes the kernel writes, so it can only make the comparison harder.
    half = _half_matmul(w)
    half_forms = [("ort-fp16-runtime", "onnxruntime float16 MatMul (float16 output), runtime weights", {}, "runtime",
                   "native", {})] if half else []
    if dev.gpus:  # (a CPU device: no GPU forms, and nothing to say about them)
        ort_forms += [("ort-cuda-constant", "onnxruntime CUDA (cuBLAS/cuDNN), constant weights", dict(weights),
                       "constant", "python", cuda),
                      ("ort-cuda-runtime", "onnxruntime CUDA (cuBLAS/cuDNN), runtime weights", {}, "runtime",
                       "python", cuda)]
        if half:
            half_forms.append(("ort-cuda-fp16-runtime", "onnxruntime CUDA float16 MatMul (cuBLAS tensor cores, "
                               "float16 output), runtime weights", {}, "runtime", "python", cuda))
    for (key, label, consts, kind, agent, params), fp16_out in ([(f, False) for f in ort_forms]
                                                                 + [(f, True) for f in half_forms]):
        if kind == "constant" and not weights:
            skip(key, label, f"{op} has no weight operand (every input is an activation)")
            continue
        if agent == "native" and not dev.native_ort:
            skip(key, label, dev.native_ort_reason or "no onnxruntime on the device")
            continue
        if agent == "python" and not dev.ort_cuda:
            skip(key, label, "the device's onnxruntime has no CUDAExecutionProvider (onnxruntime-gpu)")
            continue
        model = op_onnx_model(w, consts, half_output=fp16_out)
        if model is None:
            skip(key, label, f"no ONNX form of {op}")
            continue
        path = workdir / f"{tag}-{key}.onnx"
        path.write_bytes(model.SerializeToString())
        cand = {"weights": kind, **params, **({"output": "float16"} if fp16_out else {})}
        forms.append(BaselineForm(key, label, Candidate.make("ort", cand, baseline=True), agent, "ort", path,
                                  FormView(w, consts, tag=key, out_dtype="float16" if fp16_out else None),
                                  dict(params)))

    # numpy/BLAS, as a generated adapter on the Python agent
    src = numpy_adapter_source(w)
    if dev.python is None:
        skip("numpy", "numpy", dev.python_reason or "no Python agent on the device")
    elif src is None:
        skip("numpy", "numpy", f"no numpy form of {op}")
    else:
        path = workdir / f"{tag}-numpy.py"
        path.write_text(src)
        forms.append(BaselineForm("numpy", "numpy (float32, BLAS)",
                                  Candidate.make("numpy", {"weights": "runtime", "via": "adapter"}, baseline=True),
                                  "python", "adapter", path, FormView(w, {}, tag="numpy")))

    # PyTorch (where the device has it): eager ATen (oneDNN/BLAS on the CPU, cuBLAS/cuDNN on a GPU,
    # preallocated outputs where the op has an out= form) and torch.compile (inductor). A float16
    # matmul returns float16, like the float16 ONNX forms (verified at float16's tolerance).
    # On the CPU, torch.compile of one matmul or convolution calls the same oneDNN/BLAS routine as
    # eager PyTorch, which is raced: that form is said, not raced (a cold compile costs seconds).
    torch_forms = [("torch", "PyTorch eager (ATen: oneDNN/BLAS)", "cpu", ""),
                   ("torch-compile", "PyTorch torch.compile (inductor)", "cpu",
                    "default" if op in ("softmax", "layernorm", "attention") else None)]
    if dev.gpus:
        torch_forms += [("torch-cuda", "PyTorch eager CUDA (cuBLAS/cuDNN)", "cuda", ""),
                        ("torch-cuda-compile", "PyTorch torch.compile CUDA (inductor max-autotune: Triton "
                         "templates and cuBLAS, the fastest it measured)", "cuda", "max-autotune-no-cudagraphs")]
    src = torch_op_artifact(w)
    for key, label, device, mode in torch_forms:
        if half:
            label += ", float16 output"
        if dev.python is None:
            skip(key, label, dev.python_reason or "no Python agent on the device")
        elif not dev.torch:
            skip(key, label, "no PyTorch on the device")
        elif device == "cuda" and not dev.torch_cuda:
            skip(key, label, f"the device's PyTorch {dev.torch} has no CUDA (a CPU build, or no driver)")
        elif src is None:
            skip(key, label, f"no PyTorch form of {op}")
        elif mode is None:
            skip(key, label, f"on the CPU, torch.compile of one {op} calls the same oneDNN/BLAS routine as "
                             "eager PyTorch, which is raced")
        else:
            path = workdir / f"{tag}-torch.json"
            path.write_text(src)
            params = {"device": device, "compile": mode, **({"num_threads": dev.num_threads} if device == "cpu" else {})}
            cand = {"weights": "runtime", **params, **({"output": "float16"} if half else {})}
            forms.append(BaselineForm(key, label, Candidate.make("torch", cand, baseline=True), "python", "torch",
                                      path, FormView(w, {}, tag=key, out_dtype="float16" if half else None), params))

    # LiteRT with its default XNNPACK delegate, from a .tflite written here
    label = "LiteRT/XNNPACK"
    if dev.python is None:
        skip("tflite", label, dev.python_reason or "no Python agent on the device")
    elif not dev.tflite:
        skip("tflite", label, "no LiteRT (ai_edge_litert / tflite_runtime) on the device")
    else:
        try:
            built = op_tflite_model(w, weights)
        except ImportError as exc:
            built, why = None, f"cannot write .tflite here ({exc})"
        else:
            why = f"no TFLite form of {op}" + (f" with {w.dtype} operands" if getattr(w, "dtype", "float32") != "float32"
                                                 else "")
        if built is None:
            skip("tflite", label, why)
        else:
            data, view = built
            path = workdir / f"{tag}-tflite.tflite"
            path.write_bytes(data)
            kind = "constant" if weights else "runtime"
            layout = "NHWC" if view.in_perm else "as kernel"
            forms.append(BaselineForm("tflite", f"LiteRT/XNNPACK, {kind} weights" + (", NHWC" if view.in_perm else ""),
                                      Candidate.make("tflite", {"weights": kind, "layout": layout,
                                                                "num_threads": dev.num_threads}, baseline=True),
                                      "python", "tflite", path, view, {"num_threads": dev.num_threads}))
    return forms, skipped


def _python_agent(spec, transport, num_threads: int) -> tuple[Any, Any, str]:
    """(client, info, "") on the device's Python agent (own work dir, sharing the kernel agent's
    connection), or (None, None, why not)."""
    if spec.options.get("native"):
        return None, None, "the device is configured native-only (no Python agent)"
    base = default_workdir(spec)
    pspec = DeviceSpec(spec.name, spec.url, {**spec.options, "workdir": base.rstrip("/") + "-kbase"})
    client = AgentClient(pspec, transport=transport)
    try:
        probe = transport.run([client._python(), "-c", "import numpy, sys; print(sys.version_info[0])"],  # noqa: SLF001
                              timeout=60)
        if not (probe.ok and probe.text().strip() == "3"):
            return None, None, "no Python with numpy on the device"
        info = client.provision()
    except DeviceError as exc:
        return None, None, f"Python agent unavailable: {exc}"
    if info.agent != "python":
        return None, None, "no Python agent on the device"
    return client, info, ""


# ---------------------------------------------------------------------------------------------
# The session
# ---------------------------------------------------------------------------------------------


def check_kernel_run(run, workload, inputs, reference, *, peak_gflops=None, timings_trusted=True):
    """(ok, reason, max_abs, max_rel) of a KernelRun: the one verifier (timed iterations on fresh
    inputs included), against the host's float64 reference; the reason starts with its code."""
    v = verify_run(run, workload, inputs, reference, peak_gflops=peak_gflops, timings_trusted=timings_trusted)
    if v.ok:
        return True, "", v.max_abs_err, v.max_rel_err
    reason = v.reason.removeprefix("error: ")
    return False, reason if reason.startswith(f"{v.code}:") else f"{v.code}: {reason}", v.max_abs_err, v.max_rel_err


def tune_kernels(cfg: KernelSessionConfig, progress: KernelEvent | None = None) -> KernelSessionOutcome:
    emit = progress or (lambda ev: None)
    if cfg.trials < 0:
        raise UserInputError(f"--trials must be >= 0, got {cfg.trials}")
    if cfg.rounds < 1:
        raise UserInputError(f"--rounds must be >= 1, got {cfg.rounds}")
    if bool(cfg.ops) == bool(cfg.model):
        raise UserInputError("give either a MODEL or one or more --op specs (e.g. --op gemm:M=64,N=64,K=64)")
    # everything the user typed is checked before any device work
    ops = parse_ops(cfg.ops) if cfg.ops else []
    model = shapes = None
    if cfg.model:
        model, shapes = model_input_shapes(resolve_model(cfg.model), cfg.dims)
    elif cfg.dims:
        raise UserInputError("--dim applies to a MODEL, not to --op workloads")
    spec = (cfg.inventory or Inventory()).get(cfg.device)
    store = Store(cfg.db)
    tuning_dir = Path(cfg.tuning_dir) if cfg.tuning_dir else edgetune_home() / "kernels"

    measure = DeviceMeasure(spec, cfg.num_threads, cfg.budget_ms, cfg.timeout_s, max_iters=20_000)
    kmeasure = measure  # what runs the kernels: the device's native agent, or (--gpu) the CUDA worker
    bdev = BaselineDevice()
    try:
        probe = measure.probe()
        info = probe.info
        peak_bound = False
        if cfg.gpu:
            target, peak, kmeasure = _gpu_target(cfg, spec, info)
            cross_cc = None
        else:
            kt = device_kernel_target(info, probe.cpuinfo)
            target = dict(kt.tvm_target)
            cross_cc = kt.cross_cc if kt.arch != "x86_64" else None
            if cross_cc:
                resolve_cross_cc(target, cross_cc)  # ToolchainError (one line) before any tuning
            peak = None if probe.emulated else kt.fp32_peak_gflops()
            peak_bound = kt.clock_is_bound
        if model is not None:
            workloads = extract_onnx_tasks(model.path, shapes, target)
            workloads.sort(key=lambda t: -t.flops() * t.weight)
            if cfg.max_tasks:
                workloads = workloads[: cfg.max_tasks]
            if not workloads:
                raise UserInputError(f"{model.path.name}: TVM found no tunable tasks")
            source, source_sha = str(model.path), model.sha256
        else:
            workloads = ops
            source = "kernels:" + ";".join(w.spec() for w in ops)
            source_sha = hashlib.sha256(source.encode()).hexdigest()
        fp, fp_key = probe.fingerprint, probe.fingerprint_key
        import tvm

        bdev = baseline_device(cfg, spec, measure, info, workloads)
        versions = {"edgetune": edgetune.__version__, "agent": f"{info.agent} {info.agent_version}",
                    "tvm": tvm.__version__,
                    "device_runtimes": {k: v for k, v in sorted(info.runtimes.items()) if not isinstance(v, list)}}
        if bdev.python_info is not None:
            versions["python_agent_runtimes"] = {k: v for k, v in sorted(bdev.python_info.runtimes.items())
                                                 if not isinstance(v, list)}
        run_id = "k" + uuid.uuid4().hex[:15]
        store.acquire_device(device_identity(spec), run_id)  # one process drives a device at a time
        store.start_run(run_id, source, source_sha, spec.name, fp_key, fp, versions,
                        {"kind": "kernels", "trials": cfg.trials, "rounds": cfg.rounds, "budget_ms": cfg.budget_ms,
                         "workloads": [_name(w) for w in workloads], "target": target, "cross_cc": cross_cc,
                         "baseline": cfg.baseline, "num_threads": measure.num_threads, "command": cfg.command,
                         "dims": list(cfg.dims), "timeout_s": cfg.timeout_s})
        emit({"event": "start", "run_id": run_id, "device": spec.name, "workloads": len(workloads),
              "emulated": probe.emulated, "target": target})
        results = []
        for i, w in enumerate(workloads):
            name = _name(w)
            emit({"event": "workload", "index": i, "name": name, "trials": cfg.trials})

            def cb(done, best, _name=name):
                emit({"event": "trial", "name": _name, "done": done, "best_gflops": best})

            out = tune_workload(w, target, cfg.trials, kmeasure, tuning_dir, cb, fingerprint=fp_key, cross_cc=cross_cc)
            if measure.device_error is not None:
                raise DeviceError(f"{spec.name}: device lost while tuning {name}: {measure.device_error}")
            emit({"event": "final", "name": name, "rounds": cfg.rounds})
            res = _finish_workload(store, run_id, w, name, out, measure, bdev, cfg, fp_key, versions, target,
                                   peak, probe.emulated, kmeasure=kmeasure)
            if measure.device_error is not None:
                raise DeviceError(f"{spec.name}: device lost while measuring {name}: {measure.device_error}")
            results.append(res)
            emit({"event": "done", "name": name, "result": res})
        outcome = KernelSessionOutcome(run_id, spec.name, fp_key, fp, probe.emulated, target, cross_cc, peak,
                                       results, str(store.path), str(tuning_dir), peak_is_bound=peak_bound)
        store.finish_run(run_id, {"kind": "kernels", **outcome.as_dict()})
        return outcome
    finally:
        close_baseline_agent(bdev)
        if kmeasure is not measure:
            kmeasure.close()
        measure.close()
        store.close()


def _gpu_target(cfg, spec, info):
    """(TVM target, roofline, kernel measurer) for ``--gpu``: the CUDA target of the SM the device's
    agent reports (nvidia-smi), its tensor-core peak, and the device's Python agent running the
    kernels through the device's TVM runtime (``PythonTvmMeasure``: the whole agent protocol). One
    line, before any tuning, for what cannot be served."""
    sm = device_sm(info.fingerprint)
    if sm is None:
        raise UserInputError(f"--gpu: {spec.name} reports no NVIDIA GPU (nvidia-smi)")
    name = cuda_target_name(sm)
    if name is None:
        known = sorted(p.stem for p in TARGETS_DIR.glob("cuda-sm*.toml"))
        raise UserInputError(f"--gpu: no kernel target for {sm} (targets: {', '.join(known)})")
    kmeasure = PythonTvmMeasure(spec, "cuda", cfg.budget_ms, cfg.timeout_s, max_iters=20_000)
    try:
        kmeasure.check()
    except BaseException:
        kmeasure.close()
        raise
    return dict(load_target(name).tvm_target), gpu_peak_gflops(sm), kmeasure


def baseline_device(cfg, spec, measure, info, workloads) -> BaselineDevice:
    """What the device offers the baseline forms (the Python agent is provisioned only when an
    operator workload could use it)."""
    n = measure.num_threads
    if not cfg.baseline:
        return BaselineDevice(False, "--no-baseline", None, None, "--no-baseline", n)
    ort = bool(info.runtimes.get("onnxruntime"))
    dev = BaselineDevice(ort, "" if ort else "no onnxruntime on the device", num_threads=n)
    if not any(getattr(w, "op", None) for w in workloads):
        dev.python_reason = "no one-node form (fused task)"
        return dev
    dev.python, dev.python_info, dev.python_reason = _python_agent(measure.device_spec, measure.client.transport, n)
    return dev


def close_baseline_agent(dev: BaselineDevice) -> None:
    """Remove the baseline artifacts and job dirs from the device (its connection is the kernel
    agent's, closed with it)."""
    c = dev.python
    if c is None:
        return
    try:
        w = c.workdir
        c.transport.run(["rm", "-rf", f"{w}/artifacts", f"{w}/jobs"], timeout=60)
        c.transport.run(["mkdir", "-p", f"{w}/artifacts", f"{w}/jobs"], timeout=60)
    except Exception:  # noqa: BLE001 - best effort on the way out
        pass


def _name(w) -> str:
    spec = getattr(w, "spec", None)
    return spec() if callable(spec) else f"{w.name} (x{w.weight})"


def run_baseline_form(form: BaselineForm, form_inputs: list[np.ndarray], measure, dev: BaselineDevice, cfg):
    """Run one baseline form on its agent: (JobResult or None, KernelRun in the form's terms)."""
    view = form.view
    # a torch.compile form compiles when its job loads (max-autotune on a GPU: minutes for a big
    # GEMM the first time, then from the agent's cache); that is not a hang, and never timed
    timeout = cfg.timeout_s + (COMPILE_ALLOWANCE_S if form.params.get("compile") else 0.0)
    job = Job(backend=form.backend, artifact=form.artifact, params=dict(form.params),
              input_names=[s.name for s in view.inputs], input_sets=[[x.copy() for x in form_inputs]],
              output_specs=[s.as_json() for s in view.outputs], budget_ms=cfg.budget_ms,
              warmup_ms=min(50.0, max(5.0, cfg.budget_ms / 5)), max_iters=20_000, timeout_s=timeout)
    if form.agent == "native":
        jr = measure.run_job(job)  # DeviceError propagates: the kernel's own device is gone
    else:
        try:
            jr = dev.python.run_job(job)
        except DeviceError as exc:
            return None, KernelRun("error", f"Python agent: {exc}")
    # device_measure.job_to_kernel_run looked up per call (the baseline tests substitute it)
    return jr, device_measure.job_to_kernel_run(jr, form_inputs, view.outputs)


def _finish_workload(store, run_id, w, name, out, measure, bdev: BaselineDevice, cfg, fp_key, versions, target,
                     peak, emulated, kmeasure=None):
    """The final rounds: the selected kernel and every baseline form, interleaved with a rotating
    order, fresh activations per round (fixed weights), every run verified and recorded; the verdict
    against the strongest verified form (lowest median over the rounds) by ``round_ratio``."""
    failures: dict[str, int] = {}
    for r in out.records:
        if r.status != "ok":
            failures[r.status] = failures.get(r.status, 0) + 1
    shape = {"op": name}
    shape_key = hashlib.sha256(w.key().encode()).hexdigest()[:16]
    common = dict(run_id=run_id, workload_key=w.key(), shape=shape, shape_key=shape_key, fingerprint_key=fp_key)
    flops = int(w.flops())
    res = KernelResult(name=name, spec=name, workload_key=w.key(), flops=flops, weight=int(getattr(w, "weight", 1)),
                       verified=False, reason=out.reason, gflops=None, median_ns=None, p10_ns=None, p90_ns=None,
                       peak_pct=None, trials_measured=out.trials_measured, trials_failed=sum(failures.values()),
                       reused_records=out.reused_records, tuning_s=round(out.tuning_seconds, 3),
                       emulated=bool(emulated), failures=failures,
                       artifact=str(out.artifact_path) if out.artifact_path else None,
                       reference=str(getattr(w, "reference_kind", "numpy float64 (independent of TVM)")))
    tuning_info = {"trials_measured": out.trials_measured, "reused_records": out.reused_records,
                   "tuning_s": out.tuning_seconds, "failures": failures, "target_key": out.target_key,
                   "emulated": emulated, "reference": res.reference}
    kernel_sha = hashlib.sha256(out.artifact_path.read_bytes()).hexdigest() if out.artifact_path else None
    kmeasure = kmeasure or measure  # the kernel's runner; baseline forms run on the device's agents
    kcand = Candidate.make("tvm-kernel", {"workload": name, "target": json.dumps(target, sort_keys=True),
                                          "kernel_sha256": kernel_sha, "num_threads": kmeasure.num_threads})
    if not out.verified:
        store.add_record(Record(**common, candidate=kcand.as_dict(), versions=versions, round=1, status="failed",
                                reason=out.reason or "no verified kernel",
                                verdict={"ok": False, "reason": out.reason, **tuning_info},
                                samples_ns=[], wall_ms=out.tuning_seconds * 1e3, agent_ms=0.0))
        return res

    weights = final_weights(w)
    workdir = Path(tempfile.mkdtemp(prefix="edgetune-kbase-"))
    kernel_info = {"weights_sha256": _weights_sha(weights), **tuning_info}

    def run_kernel(inputs):
        run = kmeasure(str(out.artifact_path), inputs, list(w.outputs))
        return None, run

    def record(who, rnd, ok, reason, mabs, mrel, run, jr, wall_ms):
        verdict = {"ok": ok, "reason": reason, "max_abs_err": mabs, "max_rel_err": mrel}
        if who.form is None:
            store.add_record(Record(**common, candidate=kcand.as_dict(), versions=versions, round=rnd,
                                    status="verified" if ok else "failed", reason=reason,
                                    verdict={**verdict, "load_ms": run.load_ms, **kernel_info},
                                    samples_ns=run.samples_ns, wall_ms=wall_ms, agent_ms=wall_ms))
            return
        record_form(store, common, versions, who.form, rnd, ok, reason, verdict, jr,
                    weights_sha256=_weights_sha(weights))

    try:
        forms, skipped = baseline_forms(w, weights, workdir, bdev)
        rounds = final_rounds(w, [Entrant("kernel", run_kernel, peak_gflops=peak if kmeasure is not measure else None)],
                              forms, cfg.rounds, weights,
                              lambda form, xs: run_baseline_form(form, xs, measure, bdev, cfg), record,
                              device_lost=lambda: measure.device_error is not None)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    if rounds is None:
        return res  # the caller raises: the device is gone
    k_groups = rounds.groups["kernel"]
    k_ok, k_reason = "kernel" not in rounds.failed, rounds.failed.get("kernel", "")
    groups, failed = rounds.groups, rounds.failed
    if not k_ok or not k_groups:
        res.reason = f"selected kernel failed the final check: {k_reason}"
        return res
    st = summarize(np.concatenate(k_groups), resamples=200)
    res.verified, res.reason = True, ""
    # the round is the unit: the median of per-round medians (a round with more, faster iterations
    # must not outweigh the others), the same statistic as every baseline form's
    res.median_ns, res.p10_ns, res.p90_ns = round_median(k_groups), st.p10_ns, st.p90_ns
    res.gflops = flops / res.median_ns
    res.peak_pct = 100.0 * res.gflops / peak if peak else None
    res.baseline = strongest_baseline(forms, skipped, groups, failed, k_groups, flops, round_ratio)
    return res


def record_form(store, common: Mapping[str, Any], versions: Mapping[str, Any], form: "BaselineForm", rnd: int,
                ok: bool, reason: str, verdict: Mapping[str, Any], jr, **extra: Any) -> None:
    """Store one baseline form's run of a final round (``jr``: its JobResult, or None)."""
    store.add_record(Record(**common, candidate=form.candidate.as_dict(),
                            versions={**versions, "job_runtime": jr.runtime_versions if jr else {}},
                            round=rnd, status="verified" if ok else "failed", reason=reason,
                            verdict={**verdict, "load_ms": jr.load_ms if jr else None, "form": form.key,
                                     "label": form.label, **extra},
                            samples_ns=jr.samples_ns if jr else [], wall_ms=jr.wall_ms if jr else 0.0,
                            agent_ms=jr.agent_ms if jr else 0.0))


@dataclass
class Entrant:
    """One contender of the final rounds besides the baseline forms: ``run(inputs)`` runs it on the
    round's input set (the operator's own layout) and returns ``(JobResult or None, KernelRun)``;
    ``form`` is set for baseline forms only (their view maps inputs and references)."""

    key: str
    run: Callable[[list[np.ndarray]], tuple[Any, Any]] | None = None
    form: "BaselineForm | None" = None
    peak_gflops: float | None = None
    timings_trusted: bool = True


@dataclass
class FinalRounds:
    groups: dict[str, list[np.ndarray]]  # every participant's samples, one array per verified round
    failed: dict[str, str]  # participant -> the reason of its first failed round (it ran no more)
    rounds: int


def final_rounds(w, entrants: Sequence[Entrant], forms: Sequence["BaselineForm"], rounds: int,
                 weights: Mapping[int, np.ndarray], run_form, record, *, device_lost=lambda: False,
                 on_round=None) -> FinalRounds | None:
    """The one final-round loop (DESIGN.md §4.4-4.6): every entrant and every baseline form, in a
    rotating order (A B C, B C A, ...), on fresh activations each round with the same weight
    values everywhere; every run verified against the host's float64 reference. A participant that
    fails a round is out (recorded once, never the baseline, never selected).
    ``record(participant, round, ok, reason, max_abs, max_rel, KernelRun, JobResult|None, wall_ms)``
    stores each run; ``run_form(form, form_inputs)`` runs a baseline form. None when the device was
    lost (``device_lost()`` after a DeviceError)."""
    participants = list(entrants) + [Entrant(f.key, form=f) for f in forms]
    groups: dict[str, list[np.ndarray]] = {p.key: [] for p in participants}
    failed: dict[str, str] = {}
    if not entrants:
        return FinalRounds(groups, failed, 0)  # nothing to race: no baseline is measured for nobody
    for rnd in range(1, rounds + 1):
        inputs = final_inputs(w, rnd, weights)
        reference = w.reference(inputs)
        if on_round:
            on_round(rnd)
        shift = (rnd - 1) % len(participants)
        for who in participants[shift:] + participants[:shift]:
            if who.key in failed:
                continue
            t0 = time.perf_counter()
            try:
                if who.form is None:
                    view, xs, ref = w, [x.copy() for x in inputs], reference
                    jr, run = who.run(xs)
                else:
                    view = who.form.view
                    xs, ref = view.to_form(inputs), view.outputs_to_form(reference)
                    jr, run = run_form(who.form, xs)
            except DeviceError:
                if device_lost():
                    return None
                raise
            wall = (time.perf_counter() - t0) * 1e3
            checks = {}  # an entrant's roofline and emulation flag (baseline forms: the defaults)
            if who.peak_gflops is not None:
                checks["peak_gflops"] = who.peak_gflops
            if not who.timings_trusted:
                checks["timings_trusted"] = False
            ok, reason, mabs, mrel = check_kernel_run(run, view, xs, ref, **checks)
            if ok:
                groups[who.key].append(np.asarray(run.samples_ns, np.int64))
            else:
                failed[who.key] = reason or "failed"
            record(who, rnd, ok, reason, mabs, mrel, run, jr, wall)
    return FinalRounds(groups, failed, rounds)


def _weights_sha(weights: Mapping[int, np.ndarray]) -> dict[str, str]:
    return {str(k): hashlib.sha256(np.ascontiguousarray(v).tobytes()).hexdigest()[:16] for k, v in weights.items()}


def round_median(groups: Sequence[np.ndarray]) -> float:
    """Median over rounds of each round's median (rounds are the independent units)."""
    return float(np.median([np.median(g) for g in groups]))


def strongest_baseline(forms: Sequence[BaselineForm], skipped: Sequence[dict[str, Any]],
                       groups: Mapping[str, Sequence[np.ndarray]], failed: Mapping[str, str],
                       k_groups: Sequence[np.ndarray], flops: int, round_ratio) -> dict[str, Any]:
    """The verdict's baseline: among the forms verified in every round, the one with the lowest
    median (over the rounds, of per-round medians: ``round_median``); speedup and verdict by
    ``round_ratio`` on per-round (form, kernel) pairs. Every form is listed (verified with its
    figures, failed or unavailable with its reason)."""
    rows: list[dict[str, Any]] = []
    candidates = []
    for f in forms:
        row: dict[str, Any] = {"form": f.key, "label": f.label, "candidate": f.candidate.as_dict(),
                               "status": "verified", "reason": "", "median_ns": None, "gflops": None, "rounds": 0,
                               "speedup": None, "ci95": None, "verdict": None, "strongest": False}
        g = list(groups.get(f.key, []))
        if f.key in failed:
            row.update(status="failed", reason=failed[f.key], rounds=len(g))
        elif len(g) != len(k_groups) or not g:
            row.update(status="failed", reason="not verified in every round", rounds=len(g))
        else:
            med = round_median(g)
            r = round_ratio(list(zip(g, k_groups)))
            row.update(median_ns=med, gflops=flops / med if med > 0 else None, rounds=len(g),
                       round_medians_ns=[float(np.median(x)) for x in g], speedup=r.value,
                       ci95=[r.ci_low, r.ci_high], verdict=r.verdict, method=r.method)
            candidates.append((med, f.key, row, r))
        rows.append(row)
    rows.extend(dict(s, median_ns=None, gflops=None, rounds=0, speedup=None, ci95=None, verdict=None,
                     strongest=False) for s in skipped)
    if not candidates:
        reasons = "; ".join(f"{r['label']}: {r['reason']}" for r in rows) or "no baseline form"
        return {"backend": None, "form": None, "median_ns": None, "gflops": None, "speedup": None, "ci95": None,
                "verdict": None, "rounds": 0, "method": None, "reason": f"no baseline form verified ({reasons})",
                "kernel_round_medians_ns": [float(np.median(x)) for x in k_groups], "forms": rows}
    med, key, row, r = min(candidates, key=lambda c: c[0])
    row["strongest"] = True
    return {"backend": row["label"], "form": key, "median_ns": med, "gflops": row["gflops"], "speedup": r.value,
            "ci95": [r.ci_low, r.ci_high], "verdict": r.verdict, "rounds": r.rounds, "method": r.method,
            "reason": "", "kernel_round_medians_ns": [float(np.median(x)) for x in k_groups], "forms": rows}
