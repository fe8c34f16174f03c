"""Bundled models, generated reproducibly from code (fixed seeds, no downloads).

Every call produces byte-identical files: weights come from ``numpy.random.default_rng(SEED)``
and graphs are assembled in a fixed order, so the sha256 of an artifact is a stable identity.

Models
------
``mobilenet``
    MobileNetV2-style CNN. ONNX input ``input`` float32 [batch, 3, 96, 96] (NCHW), output
    ``logits`` [batch, 1000]. The TFLite file takes NHWC: ``x.transpose(0, 2, 3, 1)``.
``transformer``
    One pre-LN transformer encoder block (d=128, 4 heads, MLP 512, exact GELU). ONNX input
    ``tokens_embed`` float32 [batch, seq, 128], output ``hidden`` [batch, seq, 128]. Same layout
    in TFLite (no transposition needed), but with static batch/seq.

ONNX files use opset 17 / IR 8 with named dynamic dims (dim_param); TFLite files have static
shapes fixed by ``dims`` (default :func:`default_shapes`).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

__version__ = "1"

BUNDLED: tuple[str, ...] = ("mobilenet", "transformer")

__all__ = [
    "BUNDLED",
    "InputSpec",
    "build_onnx",
    "build_tflite",
    "default_shapes",
    "input_specs",
    "onnx_bytes",
    "output_names",
    "tflite_bytes",
    "tflite_filename",
]


@dataclass(frozen=True)
class InputSpec:
    """One model input: ``shape`` holds ints (static) and dim names (dynamic, ONNX only)."""

    name: str
    shape: tuple[int | str, ...]
    dtype: str = "float32"

    def resolve(self, dims: Mapping[str, int]) -> tuple[int, ...]:
        return tuple(d if isinstance(d, int) else int(dims[d]) for d in self.shape)


def _check(name: str) -> None:
    if name not in BUNDLED:
        raise KeyError(f"unknown bundled model {name!r}; known: {', '.join(BUNDLED)}")


def default_shapes(name: str) -> dict[str, int]:
    """Default values for the model's dynamic dims, e.g. ``{"batch": 1, "seq": 128}``."""
    _check(name)
    if name == "mobilenet":
        return {"batch": 1}
    return {"batch": 1, "seq": 128}


def input_specs(name: str, layout: str = "onnx") -> tuple[InputSpec, ...]:
    """Inputs of the ONNX model (``layout="onnx"``) or of the TFLite model (``"tflite"``)."""
    _check(name)
    if layout not in ("onnx", "tflite"):
        raise ValueError("layout must be 'onnx' or 'tflite'")
    if name == "mobilenet":
        from models import mobilenet as m

        if layout == "onnx":
            return (InputSpec(m.INPUT_NAME, ("batch", m.IN_CH, m.IMAGE, m.IMAGE)),)
        return (InputSpec(m.INPUT_NAME, ("batch", m.IMAGE, m.IMAGE, m.IN_CH)),)
    from models import transformer as t

    return (InputSpec(t.INPUT_NAME, ("batch", "seq", t.D_MODEL)),)


def output_names(name: str) -> tuple[str, ...]:
    _check(name)
    return ("logits",) if name == "mobilenet" else ("hidden",)


def onnx_bytes(name: str) -> bytes:
    """The serialized ONNX model (deterministic)."""
    _check(name)
    if name == "mobilenet":
        from models import mobilenet as m
    else:
        from models import transformer as m  # type: ignore[no-redef]
    return m.onnx_model().SerializeToString()


def _resolve_dims(name: str, dims: Mapping[str, int] | None) -> dict[str, int]:
    full = default_shapes(name)
    if dims:
        unknown = set(dims) - set(full)
        if unknown:
            raise KeyError(f"{name} has no dim(s) {sorted(unknown)}; dims are {sorted(full)}")
        full.update({k: int(v) for k, v in dims.items()})
    for k, v in full.items():
        if v < 1:
            raise ValueError(f"dim {k} must be >= 1, got {v}")
    return full


def tflite_bytes(name: str, dims: Mapping[str, int] | None = None) -> bytes:
    """The serialized TFLite model with static shapes (``dims`` fills in the dynamic dims)."""
    d = _resolve_dims(name, dims)
    if name == "mobilenet":
        from models import mobilenet as m

        return m.tflite_bytes(batch=d["batch"])
    from models import transformer as t

    return t.tflite_bytes(batch=d["batch"], seq=d["seq"])


def tflite_filename(name: str, dims: Mapping[str, int] | None = None) -> str:
    """Conventional file name: ``mobilenet.tflite`` at the defaults for a CNN with batch 1,
    otherwise the dims are spelled out, e.g. ``transformer_b1_s128.tflite``."""
    d = _resolve_dims(name, dims)
    if name == "mobilenet" and d["batch"] == 1:
        return "mobilenet.tflite"
    parts = [name, f"b{d['batch']}"] + ([f"s{d['seq']}"] if "seq" in d else [])
    return "_".join(parts) + ".tflite"


def _atomic_write(out_path: str | os.PathLike[str], data: bytes) -> Path:
    out = Path(out_path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), 0o644)  # mkstemp creates 0600; artifacts are plain files
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, out)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    return out


def build_onnx(name: str, out_path: str | os.PathLike[str]) -> Path:
    """Write the ONNX model ``name`` to ``out_path`` atomically (temp file + rename)."""
    return _atomic_write(out_path, onnx_bytes(name))


def build_tflite(
    name: str, out_path: str | os.PathLike[str], dims: Mapping[str, int] | None = None
) -> Path:
    """Write the static-shape TFLite model ``name`` to ``out_path`` atomically.

    ``dims`` gives values for the dynamic dims (``{"batch": 1}`` / ``{"batch": 1, "seq": 128}``);
    missing ones take :func:`default_shapes`. The mobilenet .tflite takes NHWC input.
    """
    return _atomic_write(out_path, tflite_bytes(name, dims))
