"""Kernel workloads: what search.py tunes.

Two kinds (both ``KernelWorkload``s, edgetune/ops/base.py):

* operators (``OpWorkload`` subclasses, one module each under edgetune/ops/: gemm, conv2d_nchw,
  conv2d_nhwc, depthwise_conv2d_nchw, dwconv2d_fused, batch_matmul, softmax, layernorm,
  attention), parsed here from a spec string such as ``"gemm:M=197,N=3072,K=768"``;
* ``TirWorkload``: a fused PrimFunc extracted from an ONNX model through Relax
  (``extract_onnx_tasks``). Its reference is the *unscheduled* PrimFunc INTERPRETED in numpy
  float64 (``tir_reference``, edgetune/kernels/tir_interp.py: no TVM compilation or execution, so
  independent of the schedules, lowering and code generation under test); a task using a
  construct the interpreter does not cover falls back to the unscheduled PrimFunc compiled by TVM
  (fp32), and says so: ``reference_kind`` is then "tvm-unscheduled (not independent): <why>".
"""

from __future__ import annotations

import contextlib
import hashlib
import sys
from dataclasses import MISSING, dataclass, fields
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from edgetune.errors import MissingExtra, ModelError, UserInputError
from edgetune.kernels.tir_interp import TIR_REFERENCE_KIND, TVM_REFERENCE_KIND, TirNotInterpretable, tir_reference
from edgetune.ops import ALIASES, OPS
from edgetune.ops.base import KernelWorkload, OpWorkload, TensorSpec


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
    op = ALIASES.get(op.strip().lower(), op.strip().lower())
    cls = OPS[op].workload if op in OPS else None
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


# The Relax passes that legalize a model and fuse it into its TIR kernels, by name (TVM is imported
# only when they run). Task extraction (relax_fuse) and the build (edgetune/build/tvm_relax.py) run
# this one list: MetaSchedule's records are keyed by the fused PrimFuncs' structure, so a build
# that fused otherwise would find none of the tuned kernels.
RELAX_FUSE_PASSES = ("LegalizeOps", "AnnotateTIROpPattern", "FoldConstant", "FuseOps", "FuseTIR")


def relax_fuse_passes() -> list:
    """RELAX_FUSE_PASSES as tvm.relax.transform pass objects, in order."""
    from tvm import relax

    return [getattr(relax.transform, name)() for name in RELAX_FUSE_PASSES]


def relax_fuse(mod):
    import tvm

    return tvm.transform.Sequential(relax_fuse_passes())(mod)


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
