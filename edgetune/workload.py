"""Workload: a model plus concrete input shapes, seeded inputs and host-side references.

A model's dynamic dimensions (ONNX dim_params such as "batch" and "seq") are bound to numbers per
shape point; a sweep tunes each point on its own. References are computed on the host only, with
optimizations off (onnxruntime ORT_DISABLE_ALL, one thread; TFLite reference kernels), and never
leave the host.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

from edgetune.errors import MissingExtra, ModelError, UserInputError
from edgetune.hashing import sha256_file

N_SEEDED_INPUTS = 3
_ONNX_DTYPES = {
    "tensor(float)": "float32",
    "tensor(float16)": "float16",
    "tensor(double)": "float64",
    "tensor(int8)": "int8",
    "tensor(uint8)": "uint8",
    "tensor(int32)": "int32",
    "tensor(int64)": "int64",
    "tensor(bool)": "bool",
}


@dataclass(frozen=True)
class TensorSpec:
    name: str
    dtype: str
    dims: tuple[int | str | None, ...]  # int: fixed; str: named dynamic dim; None: unnamed dynamic

    def resolve(self, bindings: Mapping[str, int]) -> tuple[int, ...]:
        shape = []
        for i, d in enumerate(self.dims):
            if isinstance(d, int):
                shape.append(d)
            elif isinstance(d, str) and d in bindings:
                shape.append(int(bindings[d]))
            else:
                what = f"'{d}'" if d else f"#{i} (unnamed)"
                raise UserInputError(
                    f"input {self.name}: dynamic dimension {what} has no value; pass --dim {d or 'NAME'}=N")
        return tuple(shape)


@dataclass(frozen=True)
class Model:
    path: Path
    format: str  # "onnx" | "tflite"
    sha256: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]

    @property
    def dynamic_dims(self) -> tuple[str, ...]:
        seen: list[str] = []
        for spec in self.inputs:
            for d in spec.dims:
                if isinstance(d, str) and d not in seen:
                    seen.append(d)
        return tuple(seen)

    @property
    def name(self) -> str:
        return self.path.stem


def load_model(path: str | os.PathLike) -> Model:
    p = Path(path)
    if not p.exists():
        raise ModelError(f"model not found: {p}")
    if not p.is_file():
        raise ModelError(f"model is not a file: {p}")
    try:
        with open(p, "rb") as f:
            head = f.read(8)
    except OSError as exc:
        raise ModelError(f"cannot read model {p}: {exc.strerror}") from exc
    if p.suffix == ".tflite" or head[4:8] == b"TFL3":
        return _load_tflite(p)
    return _load_onnx(p)


def _load_onnx(p: Path) -> Model:
    import onnx
    import onnxruntime as ort

    try:
        proto = onnx.load(str(p), load_external_data=False)
    except Exception as exc:  # protobuf raises DecodeError and friends
        raise ModelError(f"{p} is not a valid ONNX model ({type(exc).__name__})") from exc
    if not proto.graph.node and not proto.graph.output:
        raise ModelError(f"{p} is not a valid ONNX model (empty graph)")
    try:
        so = ort.SessionOptions()
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        so.log_severity_level = 4
        sess = ort.InferenceSession(str(p), so, providers=["CPUExecutionProvider"])
    except Exception as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ModelError(f"{p}: onnxruntime cannot load this model: {first[:300]}") from exc

    def spec(a) -> TensorSpec:
        dtype = _ONNX_DTYPES.get(a.type)
        if dtype is None:
            raise ModelError(f"{p}: tensor {a.name} has unsupported type {a.type}")
        dims = tuple(d if isinstance(d, int) else (d if isinstance(d, str) and d else None) for d in a.shape)
        return TensorSpec(a.name, dtype, dims)

    return Model(p.resolve(), "onnx", sha256_file(p), tuple(spec(a) for a in sess.get_inputs()),
                 tuple(spec(a) for a in sess.get_outputs()))


def _tflite_interpreter(path: Path, reference: bool = False, threads: int | None = None):
    try:
        from ai_edge_litert.interpreter import Interpreter, OpResolverType
    except ImportError:
        try:
            from tflite_runtime.interpreter import Interpreter, OpResolverType  # type: ignore
        except ImportError as exc:
            raise MissingExtra("a .tflite model", "tflite") from exc
    kwargs = {"model_path": str(path)}
    if reference:
        kwargs["experimental_op_resolver_type"] = OpResolverType.BUILTIN_REF
        kwargs["num_threads"] = 1
    elif threads is not None:
        kwargs["num_threads"] = threads
    return Interpreter(**kwargs)


def _load_tflite(p: Path) -> Model:
    try:
        interp = _tflite_interpreter(p, reference=True)
    except MissingExtra:
        raise
    except Exception as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ModelError(f"{p} is not a valid TFLite model: {first[:300]}") from exc

    def spec(d) -> TensorSpec:
        sig = d.get("shape_signature", d["shape"])
        dims = tuple(int(x) if x >= 0 else None for x in sig)
        return TensorSpec(d["name"], np.dtype(d["dtype"]).name, dims)

    return Model(p.resolve(), "tflite", sha256_file(p), tuple(spec(d) for d in interp.get_input_details()),
                 tuple(spec(d) for d in interp.get_output_details()))


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


def _seeded_input(spec_dtype: str, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    dt = np.dtype(spec_dtype)
    if dt.kind == "f":
        # negatives and large values, not zeros and ones: N(0,1) with 2% of entries scaled by 16
        x = rng.standard_normal(shape)
        big = rng.random(shape) < 0.02
        x = np.where(big, x * 16.0, x)
        return x.astype(dt)
    if dt.kind == "b":
        return rng.random(shape) < 0.5
    if dt.kind in "iu":
        lo = 0 if dt.kind == "u" else -8
        if dt.itemsize >= 4:
            lo = 0  # int32/int64 inputs are usually indices (token ids); keep them small and valid
        return rng.integers(lo, 16, size=shape).astype(dt)
    raise UserInputError(f"cannot generate inputs of dtype {spec_dtype}")


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

    def references(self) -> list[list[np.ndarray]]:
        if self._references is None:
            self._references = [compute_reference(self.model, s) for s in self.input_sets]
        return self._references

    def flops(self) -> float | None:
        """FLOPs of one inference at this shape point (MatMul/Gemm/Conv multiply-adds x 2), for the
        roofline check; None when they cannot be counted (TFLite models, unknown shapes)."""
        if self.model.format != "onnx":
            return None
        return model_flops(str(self.model.path), self.model.sha256,
                           tuple((n, tuple(s)) for n, s in self.input_shapes.items()))

    def reference_for(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        """Reference outputs of any inputs of this shape point (e.g. a replayed timed iteration's)."""
        return compute_reference(self.model, inputs)


def build_workload(model: Model, bindings: Mapping[str, int], user_inputs: Mapping[str, np.ndarray] | None = None,
                   n_seeded: int = N_SEEDED_INPUTS, seed: int = 0) -> Workload:
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
        sets.append([np.ascontiguousarray(_seeded_input(s.dtype, shapes[s.name], rng)) for s in model.inputs])
    n_user = 0
    if user_inputs:
        rng = np.random.default_rng([seed, 999])
        sets.append([np.ascontiguousarray(user_inputs[s.name]) if s.name in user_inputs
                     else _seeded_input(s.dtype, shapes[s.name], rng) for s in model.inputs])
        n_user = 1
    wl = Workload(model, dict(bindings), shapes, sets, n_user, seed)
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


@functools.lru_cache(maxsize=32)
def model_flops(path: str, sha256: str, input_shapes: tuple[tuple[str, tuple[int, ...]], ...]) -> float | None:
    """2 x the multiply-adds of the model's MatMul, Gemm and Conv nodes at the given input shapes
    (onnx shape inference); other ops are not counted, so this is a floor of the real work."""
    import onnx

    try:
        m = onnx.load(path)
        shapes = dict(input_shapes)
        for vi in m.graph.input:
            if vi.name in shapes:
                dims = vi.type.tensor_type.shape.dim
                for d, n in zip(dims, shapes[vi.name]):
                    d.ClearField("dim_param")
                    d.dim_value = int(n)
        m = onnx.shape_inference.infer_shapes(m)
    except Exception:  # noqa: BLE001 - no count is a skipped roofline check, not an error
        return None
    known: dict[str, tuple[int, ...]] = {}
    for vi in list(m.graph.input) + list(m.graph.value_info) + list(m.graph.output):
        dims = vi.type.tensor_type.shape.dim
        if dims and all(d.HasField("dim_value") for d in dims):
            known[vi.name] = tuple(int(d.dim_value) for d in dims)
    for init in m.graph.initializer:
        known[init.name] = tuple(int(d) for d in init.dims)
    macs = 0
    constant = {init.name for init in m.graph.initializer}
    for node in m.graph.node:
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


@functools.lru_cache(maxsize=8)
def _reference_session(path: str, sha256: str):
    """One unoptimised single-thread onnxruntime session per model (keyed by content), reused for
    the many references a tune computes (every job's checked timed iterations)."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    so.log_severity_level = 4
    return ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])


def compute_reference(model: Model, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
    try:
        if model.format == "onnx":
            sess = _reference_session(str(model.path), model.sha256)
            feeds = {s.name: a for s, a in zip(model.inputs, inputs)}
            return [np.ascontiguousarray(o) for o in sess.run(None, feeds)]
        interp = _tflite_interpreter(model.path, reference=True)
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
