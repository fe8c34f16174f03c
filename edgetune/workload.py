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
import mmap
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

import models  # the bundled models' generators (a package of this project; they import onnxscript lazily)
from edgetune.errors import MissingExtra, ModelError, UserInputError
from edgetune.hashing import sha256_file
from edgetune.private import edgetune_home

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


def _plain_name(name: str) -> bool:
    """A file name with no directory part: a file in the model's own directory."""
    return bool(name) and Path(name).name == name and name not in (".", "..")


def external_data_files(path: Path) -> list[str]:
    """The files an ONNX model refers to, relative to the model's directory, so that whoever moves
    the model moves them too: its external data (``location`` entries) and the companion files of
    a hybrid model (the custom-op library and the kernels it names in its ``edgetune:companions``
    metadata, edgetune/space/ort_tvm.py); [] for a self-contained model or any other file. A name
    that is not a plain file in the model's own directory (absolute, or with a directory part) is
    refused: a model must not make edgetune read or write other files."""
    if path.suffix != ".onnx":
        return []
    import onnx
    from onnx.external_data_helper import uses_external_data

    try:
        m = onnx.load(str(path), load_external_data=False)
    except Exception:
        return []  # not loadable: the job fails with the runtime's own error
    out: list[str] = []
    tensors = list(m.graph.initializer)
    for node in m.graph.node:  # Constant nodes may hold external tensors too
        tensors += [a.t for a in node.attribute if a.HasField("t")]
    for t in tensors:
        if not uses_external_data(t):
            continue
        loc = next((e.value for e in t.external_data if e.key == "location"), "")
        if not _plain_name(loc):
            raise UserInputError(f"{path.name}: external data location {loc!r} is not a file next to the model")
        if loc not in out:
            out.append(loc)
    for prop in m.metadata_props:
        if prop.key != "edgetune:companions":
            continue
        try:
            names = json.loads(prop.value)
        except ValueError:
            names = None
        if not isinstance(names, list) or not all(isinstance(x, str) for x in names):
            raise UserInputError(f"{path.name}: edgetune:companions metadata is not a list of file names")
        for loc in names:
            if not _plain_name(loc):
                raise UserInputError(f"{path.name}: companion file {loc!r} is not a file next to the model")
            if not (path.parent / loc).is_file():
                raise UserInputError(f"{path.name}: companion file {loc} is missing")
            if loc not in out:
                out.append(loc)
    return out


@dataclass(frozen=True)
class Deadline:
    """When host-side work on a model must stop: a ``time.monotonic()`` instant and the budget it
    came from (for the message). Steps that scale with the model check it between their parts; one
    onnxruntime call cannot be interrupted, so a step may end past it by the length of one call
    (a few seconds at the node limit, see ``ModelLimits``)."""

    at: float
    budget_s: float

    @classmethod
    def after(cls, budget_s: float) -> "Deadline":
        """The budget from now, with the host's model libraries imported first: their import (a
        second or more from a cold disk, and nothing to do with the model) is not charged to it."""
        import_host_libraries()
        return cls(time.monotonic() + budget_s, budget_s)

    def check(self, step: str) -> None:
        if time.monotonic() > self.at:
            raise UserInputError(f"host-side work on the model ({step}) exceeded the tuning budget of "
                                 f"{self.budget_s:g}s")


def import_host_libraries() -> None:
    """Import onnx and onnxruntime, which loading a model and computing its references use; one
    that is missing is reported where it is needed, not here."""
    for name in ("onnx", "onnxruntime"):
        try:
            __import__(name)
        except ImportError:
            pass


def _check(deadline: Deadline | None, step: str) -> None:
    if deadline is not None:
        deadline.check(step)


@dataclass(frozen=True)
class ModelLimits:
    """What the host agrees to load: the node count and the size of the model file itself.

    Host cost grows with the node count, not with the work per node. Measured on a chain of trivial
    nodes (onnx.helper: Add with a constant / Relu, alternating, on a 1x4 float tensor), each step
    in a fresh process, peak RSS above the ~62 MB of imports, onnx 1.23, onnxruntime 1.32, a
    shared 2-core x86-64 VM (times vary by about 1.5x with its load):

    =========  =======  ===============  ==================  ===============  =================
    nodes      file     onnx.load        onnxruntime         shape inference  whole host side
                                         session             (FLOP count)     (edgetune, now)
    =========  =======  ===============  ==================  ===============  =================
    10,000     0.2 MB   0.00 s, +3 MB    0.26 s, +40 MB      0.14 s           0.5-0.8 s, 0.12 GB
    100,000    2.5 MB   0.03 s, +36 MB   4.6-6 s, +300 MB    1.4-2 s          7.5-12 s, 0.5 GB
    1,000,000  27 MB    0.3 s, +370 MB   269 s, +3,000 MB    4.8 s, +1.4 GB   refused: 0.6 s, 95 MB
    =========  =======  ===============  ==================  ===============  =================

    ("whole host side": load_model, three reference outputs and the FLOP count.) Session creation
    is superlinear in time and ~3 KB per node in memory, so the default limit is 100,000 nodes, and
    a model above it is refused from a byte scan of the file, before onnx or onnxruntime build
    anything (nodes in If/Loop/Scan bodies are counted after the parse of a graph within the limit).

    The file cap bounds what a single-file model costs: onnxruntime holds the file and its tensors
    (a 512 MB model: 2.4 s, 1.1 GB peak; onnx itself reads only the graph, never the weights), so
    the default 1024 MB keeps the host near 2 GB. Weights kept as external data are not counted.
    """

    max_nodes: int = 100_000
    max_file_mb: int = 1024

    @classmethod
    def from_env(cls) -> "ModelLimits":
        return cls(_env_limit("EDGETUNE_MAX_NODES", cls.max_nodes),
                   _env_limit("EDGETUNE_MAX_MODEL_MB", cls.max_file_mb))

    def check_nodes(self, p: Path, n: int) -> None:
        if n > self.max_nodes:
            raise self.too_many_nodes(p, f"{n:,}")

    def too_many_nodes(self, p: Path, count: str) -> ModelError:
        return ModelError(f"{p}: model has {count} nodes; edgetune's limit is {self.max_nodes:,} "
                          f"(EDGETUNE_MAX_NODES={self.max_nodes}; host-side load, references and FLOP count "
                          f"grow with the node count: about 3 KB of host memory per node)")

    def check_file(self, p: Path, size: int, onnx_hint: bool) -> None:
        if size > self.max_file_mb * 2**20:
            how = ("; keep the weights as external data (onnx.save_model(model, path, "
                   "save_as_external_data=True)): they are not counted") if onnx_hint else ""
            raise ModelError(f"{p}: model file is {size / 2**20:,.1f} MB; edgetune's limit is {self.max_file_mb:,} MB "
                             f"(EDGETUNE_MAX_MODEL_MB={self.max_file_mb}){how}")


def _env_limit(name: str, default: int) -> int:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value <= 0:
        raise UserInputError(f"{name}={raw!r} must be a positive integer")
    return value


def load_model(path: str | os.PathLike, limits: ModelLimits | None = None, deadline: Deadline | None = None) -> Model:
    """The model's inputs and outputs, read on the host within ``limits`` (default: from the
    environment) and, when given, before ``deadline``."""
    p = Path(path)
    if not p.exists():
        raise ModelError(f"model not found: {p}")
    if not p.is_file():
        raise ModelError(f"model is not a file: {p}")
    try:
        with open(p, "rb") as f:
            head = f.read(8)
            size = os.fstat(f.fileno()).st_size
    except OSError as exc:
        raise ModelError(f"cannot read model {p}: {exc.strerror}") from exc
    limits = limits or ModelLimits.from_env()
    _check(deadline, "load")
    if p.suffix == ".tflite" or head[4:8] == b"TFL3":
        limits.check_file(p, size, onnx_hint=False)
        return _load_tflite(p)
    limits.check_file(p, size, onnx_hint=True)
    return _load_onnx(p, limits, deadline)


def _pb_varint(buf, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise ValueError("varint too long")


def _pb_fields(buf, pos: int, end: int):
    """(field number, wire type, field start, value start, field end) of each field in
    ``buf[pos:end]`` (protobuf wire format)."""
    while pos < end:
        start = pos
        tag, pos = _pb_varint(buf, pos)
        wire, value = tag & 7, pos
        if wire == 2:
            n, value = _pb_varint(buf, pos)
            pos = value + n
        elif wire == 0:
            pos = _pb_varint(buf, pos)[1]
        elif wire in (1, 5):
            pos += 8 if wire == 1 else 4
        else:
            raise ValueError(f"wire type {wire}")
        if pos > end:
            raise ValueError("truncated field")
        yield tag >> 3, wire, start, value, pos


def _pb_message(field_no: int, payload: bytes) -> bytes:
    out, n = bytearray(), len(payload)
    for v in (field_no << 3 | 2, n):
        while v >= 0x80:
            out.append(v & 0x7F | 0x80)
            v >>= 7
        out.append(v)
    return bytes(out) + payload


# onnx.proto field numbers
_MODEL_GRAPH, _MODEL_FUNCTIONS, _GRAPH_NODE, _GRAPH_INITIALIZER, _FUNCTION_NODE = 7, 25, 1, 5, 7
_TENSOR_VALUES = {4, 5, 6, 7, 9, 10, 11}  # float/int32/string/int64 data, raw_data, double/uint64 data
_SMALL_TENSOR = 4096  # bytes: shape tensors and scalars keep their values (shape inference reads them)


class TooManyNodes(Exception):
    def __init__(self, count: str):
        super().__init__(count)
        self.count = count  # "1,000,000" or "more than 1,000,000"


def _onnx_skeleton(p: Path, max_nodes: int | None = None):
    """The model without the values of its large initializers (their names, types and dims kept),
    parsed. Built from the memory-mapped file, so host memory is the graph's, not the weights'
    (onnx.load of a 512 MB model holds the file twice). Counts the main graph's and the functions'
    nodes on the way: past ``max_nodes``, raises TooManyNodes before anything is parsed (counting on
    up to 10x the limit, for the message)."""
    import onnx

    stop = None if max_nodes is None else 10 * max_nodes + 1
    with open(p, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        out, nodes = bytearray(), 0
        for field_no, wire, start, value, end in _pb_fields(buf, 0, len(buf)):
            if wire == 2 and field_no == _MODEL_FUNCTIONS:
                nodes += sum(1 for g in _pb_fields(buf, value, end) if g[0] == _FUNCTION_NODE and g[1] == 2)
            if wire != 2 or field_no != _MODEL_GRAPH:
                out += buf[start:end]
                continue
            graph = bytearray()
            for g_no, g_wire, g_start, g_value, g_end in _pb_fields(buf, value, end):
                if g_wire == 2 and g_no == _GRAPH_NODE:
                    nodes += 1
                    if nodes == stop:
                        break
                if max_nodes is not None and nodes > max_nodes:
                    continue  # refused below: only counting now
                if g_wire == 2 and g_no == _GRAPH_INITIALIZER and g_end - g_value > _SMALL_TENSOR:
                    graph += _pb_message(_GRAPH_INITIALIZER, b"".join(
                        buf[t_start:t_end] for t_no, _, t_start, _, t_end in _pb_fields(buf, g_value, g_end)
                        if t_no not in _TENSOR_VALUES))
                else:
                    graph += buf[g_start:g_end]
            out += _pb_message(_MODEL_GRAPH, bytes(graph))
            if nodes == stop:
                break
    if max_nodes is not None and nodes > max_nodes:
        raise TooManyNodes(f"more than {stop - 1:,}" if nodes == stop else f"{nodes:,}")
    return onnx.ModelProto.FromString(bytes(out))


def count_nodes(proto) -> int:
    """Every node of an ONNX model: main graph, subgraphs (If/Loop/Scan bodies) and functions."""
    from onnx import AttributeProto

    def graph_nodes(nodes) -> int:
        n = 0
        for node in nodes:
            n += 1
            for a in node.attribute:
                if a.type == AttributeProto.GRAPH:
                    n += graph_nodes(a.g.node)
                elif a.type == AttributeProto.GRAPHS:
                    n += sum(graph_nodes(g.node) for g in a.graphs)
        return n

    return graph_nodes(proto.graph.node) + sum(graph_nodes(f.node) for f in proto.functions)


def _load_onnx(p: Path, limits: ModelLimits, deadline: Deadline | None = None) -> Model:
    # refused from the byte scan, before the parse (the parse of a 1,000,000-node graph takes 370 MB);
    # nodes in subgraphs are counted after the parse of a graph below the limit
    try:
        proto = _onnx_skeleton(p, limits.max_nodes)
    except TooManyNodes as many:
        raise limits.too_many_nodes(p, many.count) from None
    except Exception as exc:  # protobuf raises DecodeError and friends; the scanner ValueError/IndexError
        raise ModelError(f"{p} is not a valid ONNX model ({type(exc).__name__})") from None
    if not proto.graph.node and not proto.graph.output:
        raise ModelError(f"{p} is not a valid ONNX model (empty graph)")
    limits.check_nodes(p, count_nodes(proto))
    del proto
    _check(deadline, "load")
    sha = sha256_file(p)
    try:
        # the session references are computed with, built once (the slowest host step on a big graph)
        sess = _reference_session(str(p.resolve()), sha)
    except Exception as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ModelError(f"{p}: onnxruntime cannot load this model: {first[:300]}") from exc
    _check(deadline, "load")

    def spec(a) -> TensorSpec:
        dtype = _ONNX_DTYPES.get(a.type)
        if dtype is None:
            raise ModelError(f"{p}: tensor {a.name} has unsupported type {a.type}")
        dims = tuple(d if isinstance(d, int) else (d if isinstance(d, str) and d else None) for d in a.shape)
        return TensorSpec(a.name, dtype, dims)

    return Model(p.resolve(), "onnx", sha, tuple(spec(a) for a in sess.get_inputs()),
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

    def references(self, deadline: Deadline | None = None) -> list[list[np.ndarray]]:
        """Reference outputs of every input set (computed once). With ``deadline``, raises
        UserInputError when it passes before they are all computed."""
        if self._references is None:
            refs = []
            for s in self.input_sets:
                _check(deadline, "references")
                refs.append(compute_reference(self.model, s))
            _check(deadline, "references")
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
    _check(deadline, "inputs")
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
    """Replace the initializers without values (large ones, left out by ``_onnx_skeleton``, and
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
    _check(deadline, "FLOP count")
    try:
        m = _onnx_skeleton(Path(path))  # shapes only: initializer dims are in the graph
        weights = {init.name: tuple(int(d) for d in init.dims) for init in m.graph.initializer}
        _shapes_only(m)
        known = known_shapes(m, dict(input_shapes))
    except Exception:  # noqa: BLE001 - no count is a skipped roofline check, not an error
        return None
    _check(deadline, "FLOP count")
    known.update(weights)
    macs = 0
    constant = set(weights)
    for n_seen, node in enumerate(m.graph.node):
        if n_seen % 4096 == 0:
            _check(deadline, "FLOP count")
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
