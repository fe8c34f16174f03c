"""Workload: a model plus concrete input shapes, seeded inputs and host-side references.

A model's dynamic dimensions (ONNX dim_params such as "batch" and "seq") are bound to numbers per
shape point; a sweep tunes each point on its own. References are computed on the host only, with
optimizations off (onnxruntime ORT_DISABLE_ALL, one thread; TFLite reference kernels), and never
leave the host.
"""

from __future__ import annotations

import hashlib
import json
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

import models  # the bundled models' generators (a package of this project; they import onnxscript lazily)
from edgetune.errors import MissingExtra, UserInputError
from edgetune.modelfile import Deadline, Model, check_deadline, onnx_skeleton, reference_session, tflite_interpreter
from edgetune.private import edgetune_home
from edgetune.seeded import MODEL, seeded_array

N_SEEDED_INPUTS = 3


def parse_assignments(items: Sequence[str], what: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items:
        if "=" not in item:
            raise UserInputError(f"{what} '{item}' must look like NAME=VALUE")
        k, v = item.split("=", 1)
        k, v = k.strip(), v.strip()
        if not k or not v:
            raise UserInputError(f"{what} '{item}' must look like NAME=VALUE")
        out[k] = v
    return out


def parse_sweeps(items: Sequence[str], model: Model) -> dict[str, list[int]]:
    sweeps: dict[str, list[int]] = {}
    for name, vals in parse_assignments(items, "sweep").items():
        if name not in model.dynamic_dims:
            dyn = ", ".join(model.dynamic_dims) or "none"
            raise UserInputError(f"sweep dimension '{name}' is not a dynamic dimension of {model.path.name} "
                                 f"(dynamic: {dyn})")
        try:
            values = [int(v) for v in vals.split(",") if v.strip()]
        except ValueError:
            raise UserInputError(f"sweep {name}={vals}: values must be positive integers") from None
        if not values or any(v <= 0 for v in values):
            raise UserInputError(f"sweep {name}={vals}: values must be positive integers")
        sweeps[name] = list(dict.fromkeys(values))
    return sweeps


def parse_dims(items: Sequence[str], model: Model) -> dict[str, int]:
    dims: dict[str, int] = {}
    for name, val in parse_assignments(items, "dim").items():
        if name not in model.dynamic_dims:
            dyn = ", ".join(model.dynamic_dims) or "none"
            raise UserInputError(f"dimension '{name}' is not a dynamic dimension of {model.path.name} (dynamic: {dyn})")
        try:
            dims[name] = int(val)
        except ValueError:
            raise UserInputError(f"dim {name}={val}: value must be a positive integer") from None
        if dims[name] <= 0:
            raise UserInputError(f"dim {name}={val}: value must be a positive integer")
    return dims


DEFAULT_DIM_VALUES = {"batch": 1, "batch_size": 1, "n": 1, "N": 1, "seq": 128, "sequence": 128,
                      "sequence_length": 128, "seq_len": 128}


def shape_points(model: Model, dims: Mapping[str, int], sweeps: Mapping[str, Sequence[int]]) -> list[dict[str, int]]:
    """The cartesian product of sweeps over the fixed dims (defaults for well-known names)."""
    base: dict[str, int] = {}
    for d in model.dynamic_dims:
        if d in dims:
            base[d] = dims[d]
        elif d in DEFAULT_DIM_VALUES and d not in sweeps:
            base[d] = DEFAULT_DIM_VALUES[d]
    points = [dict(base)]
    for name, values in sweeps.items():
        points = [{**p, name: v} for p in points for v in values]
    return points


@dataclass
class Workload:
    """A model at one shape point, with its input sets and (host-only) references."""

    model: Model
    bindings: dict[str, int]
    input_shapes: dict[str, tuple[int, ...]]
    input_sets: list[list[np.ndarray]]
    user_input_sets: int = 0
    seed: int = 0
    _references: list[list[np.ndarray]] | None = field(default=None, repr=False)

    @property
    def input_names(self) -> list[str]:
        return [s.name for s in self.model.inputs]

    @property
    def output_names(self) -> list[str]:
        return [s.name for s in self.model.outputs]

    @property
    def shape_key(self) -> str:
        return ",".join(f"{n}={'x'.join(map(str, s))}" for n, s in self.input_shapes.items())

    @property
    def shape_label(self) -> str:
        if self.bindings:
            return " ".join(f"{k}={v}" for k, v in self.bindings.items())
        return self.shape_key

    def key(self) -> str:
        payload = {"model": self.model.sha256, "shapes": {k: list(v) for k, v in self.input_shapes.items()},
                   "dtypes": [s.dtype for s in self.model.inputs], "seed": self.seed,
                   "inputs": [[hashlib.sha256(a.tobytes()).hexdigest()[:16] for a in s] for s in self.input_sets]}
        return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:20]

    def references(self, deadline: Deadline | None = None) -> list[list[np.ndarray]]:
        """Reference outputs of every input set (computed once). With ``deadline``, raises
        UserInputError when it passes before they are all computed."""
        if self._references is None:
            refs = []
            for s in self.input_sets:
                check_deadline(deadline, "references")
                refs.append(compute_reference(self.model, s))
            check_deadline(deadline, "references")
            self._references = refs
        return self._references

    def flops(self, deadline: Deadline | None = None) -> float | None:
        """FLOPs of one inference at this shape point (MatMul/Gemm/Conv multiply-adds x 2), for the
        roofline check; None when they cannot be counted (TFLite models, unknown shapes)."""
        if self.model.format != "onnx":
            return None
        return model_flops(str(self.model.path), self.model.sha256,
                           tuple((n, tuple(s)) for n, s in self.input_shapes.items()), deadline=deadline)

    def reference_for(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        """Reference outputs of any inputs of this shape point (e.g. a replayed timed iteration's)."""
        return compute_reference(self.model, inputs)


def resolve_model(name_or_path: str) -> str:
    """A path, or the name of a bundled model (generated reproducibly on first use)."""
    p = Path(name_or_path)
    if p.exists() or name_or_path not in models.BUNDLED:
        return name_or_path
    out = edgetune_home() / "models" / f"{name_or_path}.onnx"
    if not out.exists():
        models.build_onnx(name_or_path, out)
    return str(out)


def build_workload(model: Model, bindings: Mapping[str, int], user_inputs: Mapping[str, np.ndarray] | None = None,
                   n_seeded: int = N_SEEDED_INPUTS, seed: int = 0, deadline: Deadline | None = None) -> Workload:
    """The workload at one shape point. With ``deadline``, its references are computed here too
    (the step that scales with the model), and UserInputError is raised once the deadline passes."""
    check_deadline(deadline, "inputs")
    user_inputs = dict(user_inputs or {})
    shapes: dict[str, tuple[int, ...]] = {}
    for spec in model.inputs:
        if spec.name in user_inputs and not all(isinstance(d, int) or d in bindings for d in spec.dims):
            shape = tuple(user_inputs[spec.name].shape)  # user data binds unnamed/unbound dims
            if len(shape) != len(spec.dims):
                raise UserInputError(f"input {spec.name}: file has rank {len(shape)}, model expects {len(spec.dims)}")
        else:
            shape = spec.resolve(bindings)
        shapes[spec.name] = shape
    unknown = set(user_inputs) - set(shapes)
    if unknown:
        raise UserInputError(f"--input names {', '.join(sorted(unknown))} not among the model's inputs "
                             f"({', '.join(shapes)})")
    for name, arr in user_inputs.items():
        if tuple(arr.shape) != shapes[name]:
            raise UserInputError(f"input {name}: file has shape {tuple(arr.shape)}, model expects {shapes[name]} "
                                 f"at {dict(bindings) or 'its static shape'}")
        want = next(s.dtype for s in model.inputs if s.name == name)
        if arr.dtype != np.dtype(want):
            raise UserInputError(f"input {name}: file has dtype {arr.dtype}, model expects {want}")
    sets: list[list[np.ndarray]] = []
    for i in range(n_seeded):
        rng = np.random.default_rng([seed, i])
        sets.append([seeded_array(s.dtype, shapes[s.name], rng, MODEL) for s in model.inputs])
    n_user = 0
    if user_inputs:
        rng = np.random.default_rng([seed, 999])
        sets.append([np.ascontiguousarray(user_inputs[s.name]) if s.name in user_inputs
                     else seeded_array(s.dtype, shapes[s.name], rng, MODEL) for s in model.inputs])
        n_user = 1
    wl = Workload(model, dict(bindings), shapes, sets, n_user, seed)
    if deadline is not None:
        wl.references(deadline)
    return wl


def load_user_inputs(items: Sequence[str]) -> dict[str, np.ndarray]:
    out = {}
    for name, path in parse_assignments(items, "input").items():
        p = Path(path)
        if not p.is_file():
            raise UserInputError(f"input {name}: file not found: {p}")
        try:
            arr = np.load(p, allow_pickle=False)
        except Exception as exc:
            raise UserInputError(f"input {name}: {p} is not a valid .npy file ({type(exc).__name__})") from exc
        if not isinstance(arr, np.ndarray):
            raise UserInputError(f"input {name}: {p} must hold one array (.npy), not an archive")
        out[name] = np.ascontiguousarray(arr)
    return out


_flops_cache: dict[tuple, float | None] = {}
_flops_lock = threading.Lock()


def model_flops(path: str, sha256: str, input_shapes: tuple[tuple[str, tuple[int, ...]], ...],
                deadline: Deadline | None = None) -> float | None:
    """2 x the multiply-adds of the model's MatMul, Gemm and Conv nodes at the given input shapes
    (onnx shape inference); other ops are not counted, so this is a floor of the real work.
    Remembered per (model, shapes); with ``deadline``, UserInputError once it passes."""
    key = (path, sha256, input_shapes)
    with _flops_lock:
        if key in _flops_cache:
            return _flops_cache[key]
    flops = _count_flops(path, input_shapes, deadline)
    with _flops_lock:
        if len(_flops_cache) >= 32:
            _flops_cache.pop(next(iter(_flops_cache)))
        _flops_cache[key] = flops
    return flops


def _shapes_only(m) -> None:
    """Replace the initializers without values (large ones, left out by ``onnx_skeleton``, and
    external ones) by graph inputs of the same type and shape: shape inference reads the values of
    small constants only (shape tensors of Reshape, Expand, ...). With the weights in, counting the
    FLOPs of a 512 MB model took 3.1 GB of host memory (shape inference copies the model twice)."""
    from onnx import TensorProto, helper

    names = {vi.name for vi in m.graph.input}
    keep = []
    for init in m.graph.initializer:
        has_values = init.data_location != TensorProto.EXTERNAL and any(
            init.HasField("raw_data") if f == "raw_data" else len(getattr(init, f))
            for f in ("raw_data", "float_data", "int32_data", "string_data", "int64_data", "double_data",
                      "uint64_data"))
        if has_values or not init.dims:
            keep.append(init)
        elif init.name not in names:
            m.graph.input.append(helper.make_tensor_value_info(init.name, init.data_type, list(init.dims)))
    del m.graph.initializer[:]
    m.graph.initializer.extend(keep)


def known_shapes(m, input_shapes: Mapping[str, Sequence[int]]) -> dict[str, tuple[int, ...]]:
    """Every value's static shape that onnx shape inference finds with the graph inputs' dims bound
    to ``input_shapes`` (bound in ``m`` itself); what onnx raises passes through."""
    import onnx

    for vi in m.graph.input:
        if vi.name in input_shapes:
            dims = vi.type.tensor_type.shape.dim
            for d, n in zip(dims, input_shapes[vi.name]):
                d.ClearField("dim_param")
                d.dim_value = int(n)
    inferred = onnx.shape_inference.infer_shapes(m)
    known: dict[str, tuple[int, ...]] = {}
    for vi in list(inferred.graph.input) + list(inferred.graph.value_info) + list(inferred.graph.output):
        dims = vi.type.tensor_type.shape.dim
        if dims and all(d.HasField("dim_value") for d in dims):
            known[vi.name] = tuple(int(d.dim_value) for d in dims)
    return known


def _count_flops(path: str, input_shapes: tuple[tuple[str, tuple[int, ...]], ...],
                 deadline: Deadline | None) -> float | None:
    check_deadline(deadline, "FLOP count")
    try:
        m = onnx_skeleton(Path(path))  # shapes only: initializer dims are in the graph
        weights = {init.name: tuple(int(d) for d in init.dims) for init in m.graph.initializer}
        _shapes_only(m)
        known = known_shapes(m, dict(input_shapes))
    except Exception:  # noqa: BLE001 - no count is a skipped roofline check, not an error
        return None
    check_deadline(deadline, "FLOP count")
    known.update(weights)
    macs = 0
    constant = set(weights)
    for n_seen, node in enumerate(m.graph.node):
        if n_seen % 4096 == 0:
            check_deadline(deadline, "FLOP count")
        if all(i in constant for i in node.input if i):  # folded at session creation: no work per inference
            constant.update(node.output)
            continue
        try:
            if node.op_type in ("MatMul", "Gemm"):
                a, b = known[node.input[0]], known[node.input[1]]
                trans_a = any(at.name == "transA" and at.i for at in node.attribute)
                k = a[-2] if trans_a else a[-1]
                out = known[node.output[0]]
                macs += int(np.prod(out, dtype=np.int64)) * int(k)
            elif node.op_type == "Conv":
                w, out = known[node.input[1]], known[node.output[0]]
                macs += int(np.prod(out, dtype=np.int64)) * int(np.prod(w[1:], dtype=np.int64))
        except KeyError:
            continue
    return 2.0 * macs if macs else None


def compute_reference(model: Model, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
    try:
        if model.format == "onnx":
            sess = reference_session(str(model.path), model.sha256)
            feeds = {s.name: a for s, a in zip(model.inputs, inputs)}
            return [np.ascontiguousarray(o) for o in sess.run(None, feeds)]
        interp = tflite_interpreter(model.path, reference=True)
        for d, a in zip(interp.get_input_details(), inputs):
            if tuple(d["shape"]) != a.shape:
                interp.resize_tensor_input(d["index"], a.shape)
        interp.allocate_tensors()
        for d, a in zip(interp.get_input_details(), inputs):
            interp.set_tensor(d["index"], a)
        interp.invoke()
        return [np.array(interp.get_tensor(d["index"])) for d in interp.get_output_details()]
    except (UserInputError, MissingExtra):
        raise
    except Exception as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UserInputError(f"{model.path.name}: reference run failed at shapes "
                             f"{[tuple(a.shape) for a in inputs]}: {first[:300]}") from exc
