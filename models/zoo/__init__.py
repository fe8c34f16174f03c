"""The zoo: ten architectures people ship, authored in code (onnxscript / onnx helpers) with seeded
random weights — no downloads — each in a ``full`` size (the published dimensions) and a ``small``
size (the same graph structure, few layers, narrow: for tests and quick checks).

Every build is reproducible byte for byte: ``build(name, size, out_dir)`` writes
``<name>-<size>.onnx`` (weights larger than 2 GiB in total go to ``<name>-<size>.onnx.data`` next
to it, ONNX external data) and the same call gives the same sha256 on any machine.

A model module (``models/zoo/<module>.py``) defines:

* ``TITLE`` (str), ``FAMILY`` ("vision" | "text" | "decoder" | "audio" | "detection" | "segmentation");
* ``DIMS = {"small": {...}, "full": {...}}``: the values of its dynamic dimensions used by checks
  (``batch``, ``seq``, ``past`` ...);
* ``TFLITE``: None when a .tflite variant can be written here, else the one-line reason there is none;
* ``model(size) -> onnx.ModelProto``: deterministic (``numpy.random.default_rng`` with a fixed seed,
  graph assembled in a fixed order), opset 17 or 18, IR version <= 9 (onnxruntime 1.17+ loads it),
  standard ONNX ops only (so ``onnx.reference`` can compute its float64 reference), dynamic
  dimensions as named ``dim_param`` where the architecture has them.
"""

from __future__ import annotations

import hashlib
import importlib
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SIZES = ("small", "full")
EXTERNAL_DATA_BYTES = 1 << 31  # above this, weights go to external data (protobuf's 2 GiB limit)


@dataclass(frozen=True)
class ZooEntry:
    name: str
    module: str  # models.zoo.<module>

    def mod(self) -> Any:
        return importlib.import_module(f"models.zoo.{self.module}")

    @property
    def title(self) -> str:
        return self.mod().TITLE

    @property
    def family(self) -> str:
        return self.mod().FAMILY

    def dims(self, size: str) -> dict[str, int]:
        return dict(self.mod().DIMS[size])

    @property
    def tflite(self) -> str | None:
        return getattr(self.mod(), "TFLITE", "no .tflite converter path here")


# name -> module; order is the order of `edgetune zoo ls`
ZOO: dict[str, ZooEntry] = {e.name: e for e in (
    ZooEntry("resnet50", "resnet"),
    ZooEntry("mobilenetv3", "mobilenet_v3"),
    ZooEntry("efficientnet_b0", "efficientnet"),
    ZooEntry("vit_b16", "vit"),
    ZooEntry("bert_base", "bert"),
    ZooEntry("gpt2", "gpt2"),
    ZooEntry("llama", "llama"),
    ZooEntry("whisper_encoder", "whisper"),
    ZooEntry("yolov8n", "yolo"),
    ZooEntry("unet", "unet"),
)}


def available() -> list[str]:
    """Zoo names whose module exists (all ten once the zoo is complete)."""
    out = []
    for name, e in ZOO.items():
        try:
            e.mod()
        except ModuleNotFoundError as exc:
            if exc.name == f"models.zoo.{e.module}":
                continue
            raise
        out.append(name)
    return out


def entry(name: str) -> ZooEntry:
    if name not in ZOO:
        raise KeyError(f"unknown zoo model {name!r}; known: {', '.join(ZOO)}")
    return ZOO[name]


def build(name: str, size: str, out_dir: str | os.PathLike) -> Path:
    """Write ``<out_dir>/<name>-<size>.onnx`` (atomically) and return its path."""
    import onnx

    if size not in SIZES:
        raise ValueError(f"size must be one of {SIZES}, got {size!r}")
    model = entry(name).mod().model(size)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name}-{size}.onnx"
    big = sum(len(t.raw_data) for t in model.graph.initializer) > EXTERNAL_DATA_BYTES
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}-{size}-", dir=out))
    try:
        tmp_model = tmp / path.name
        if big:
            onnx.save_model(model, str(tmp_model), save_as_external_data=True, all_tensors_to_one_file=True,
                            location=path.name + ".data", size_threshold=1024)
            os.replace(tmp / (path.name + ".data"), out / (path.name + ".data"))
        else:
            onnx.save_model(model, str(tmp_model))
        os.replace(tmp_model, path)
    finally:
        for p in tmp.iterdir() if tmp.exists() else []:
            p.unlink()
        if tmp.exists():
            tmp.rmdir()
    return path


def sha256(path: str | os.PathLike) -> str:
    """sha256 of a built model (its external data file too, when it has one)."""
    h = hashlib.sha256()
    p = Path(path)
    for f in (p, p.with_name(p.name + ".data")):
        if f.exists():
            with open(f, "rb") as fh:
                for chunk in iter(lambda: fh.read(1 << 20), b""):
                    h.update(chunk)
    return h.hexdigest()
