"""A model file as the host reads it: its inputs and outputs (``Model``, ``TensorSpec``), its
companion files, and the limits and deadline that bound reading it.

Reading is bounded before anything large is parsed: the node count is taken from a skeleton of the
protobuf (initializer payloads skipped, ``onnx_skeleton``), and every step that scales with the
model checks the tuning budget's ``Deadline``. A model that is missing, corrupt, too large or uses
a dtype the tuner does not handle is one ``ModelError`` line.
"""

from __future__ import annotations

import functools
import json
import mmap
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

import numpy as np

from edgetune.errors import MissingExtra, ModelError, UserInputError
from edgetune.hashing import sha256_file

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


def check_deadline(deadline: Deadline | None, step: str) -> None:
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
    check_deadline(deadline, "load")
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


def onnx_skeleton(p: Path, max_nodes: int | None = None):
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


@functools.lru_cache(maxsize=8)
def reference_session(path: str, sha256: str):
    """One unoptimised single-thread onnxruntime session per model (keyed by content), reused for
    the many references a tune computes (every job's checked timed iterations)."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    so.log_severity_level = 4
    return ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])


def _load_onnx(p: Path, limits: ModelLimits, deadline: Deadline | None = None) -> Model:
    # refused from the byte scan, before the parse (the parse of a 1,000,000-node graph takes 370 MB);
    # nodes in subgraphs are counted after the parse of a graph below the limit
    try:
        proto = onnx_skeleton(p, limits.max_nodes)
    except TooManyNodes as many:
        raise limits.too_many_nodes(p, many.count) from None
    except Exception as exc:  # protobuf raises DecodeError and friends; the scanner ValueError/IndexError
        raise ModelError(f"{p} is not a valid ONNX model ({type(exc).__name__})") from None
    if not proto.graph.node and not proto.graph.output:
        raise ModelError(f"{p} is not a valid ONNX model (empty graph)")
    limits.check_nodes(p, count_nodes(proto))
    del proto
    check_deadline(deadline, "load")
    sha = sha256_file(p)
    try:
        # the session references are computed with, built once (the slowest host step on a big graph)
        sess = reference_session(str(p.resolve()), sha)
    except Exception as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ModelError(f"{p}: onnxruntime cannot load this model: {first[:300]}") from exc
    check_deadline(deadline, "load")

    def spec(a) -> TensorSpec:
        dtype = _ONNX_DTYPES.get(a.type)
        if dtype is None:
            raise ModelError(f"{p}: tensor {a.name} has unsupported type {a.type}")
        dims = tuple(d if isinstance(d, int) else (d if isinstance(d, str) and d else None) for d in a.shape)
        return TensorSpec(a.name, dtype, dims)

    return Model(p.resolve(), "onnx", sha, tuple(spec(a) for a in sess.get_inputs()),
                 tuple(spec(a) for a in sess.get_outputs()))


def tflite_interpreter(path: Path, reference: bool = False, threads: int | None = None):
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
        interp = tflite_interpreter(p, reference=True)
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
