"""Bundled models (models/): reproducible bytes, valid ONNX, dynamic shapes, TFLite parity."""

from __future__ import annotations

import hashlib
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import models
from tests.conftest import require

REPO = Path(__file__).resolve().parents[2]
HAVE_LITERT = importlib.util.find_spec("ai_edge_litert") is not None


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture(scope="module")
def onnx_blobs() -> dict[str, bytes]:
    return {name: models.onnx_bytes(name) for name in models.BUNDLED}


@pytest.fixture(scope="module")
def sessions(onnx_blobs: dict[str, bytes]) -> dict[str, ort.InferenceSession]:
    return {
        name: ort.InferenceSession(blob, providers=["CPUExecutionProvider"])
        for name, blob in onnx_blobs.items()
    }


def _input(name: str, dims: dict[str, int], seed: int, layout: str = "onnx") -> np.ndarray:
    spec = models.input_specs(name, layout)[0]
    rng = np.random.default_rng(seed)
    return rng.standard_normal(spec.resolve(dims)).astype(np.float32)


def _assert_close(actual: np.ndarray, ref: np.ndarray, rel: float = 1e-4) -> None:
    """Within ``rel`` of the reference, relative to the reference's largest magnitude."""
    assert actual.shape == ref.shape
    scale = float(np.abs(ref).max())
    np.testing.assert_allclose(actual, ref, rtol=rel, atol=rel * scale)


# --- API ------------------------------------------------------------------------------------


def test_api_surface() -> None:
    assert models.BUNDLED == ("mobilenet", "transformer")
    assert models.default_shapes("mobilenet") == {"batch": 1}
    assert models.default_shapes("transformer") == {"batch": 1, "seq": 128}
    # callers may mutate the returned dict freely
    models.default_shapes("mobilenet")["batch"] = 7
    assert models.default_shapes("mobilenet") == {"batch": 1}
    assert models.input_specs("mobilenet")[0].shape == ("batch", 3, 96, 96)
    assert models.input_specs("mobilenet", "tflite")[0].shape == ("batch", 96, 96, 3)
    assert models.input_specs("transformer")[0].shape == ("batch", "seq", 128)
    assert models.tflite_filename("transformer", {"batch": 1, "seq": 128}) == (
        "transformer_b1_s128.tflite"
    )
    assert models.tflite_filename("mobilenet") == "mobilenet.tflite"
    assert models.tflite_filename("mobilenet", {"batch": 4}) == "mobilenet_b4.tflite"


def test_unknown_model_and_bad_dims(tmp_path: Path) -> None:
    with pytest.raises(KeyError):
        models.build_onnx("resnet", tmp_path / "x.onnx")
    with pytest.raises(KeyError):
        models.default_shapes("resnet")
    with pytest.raises(KeyError):
        models.tflite_bytes("mobilenet", {"seq": 4})
    with pytest.raises(ValueError):
        models.tflite_bytes("transformer", {"batch": 0})
    assert not list(tmp_path.iterdir())


# --- ONNX -----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", models.BUNDLED)
def test_onnx_reproducible(name: str, onnx_blobs: dict[str, bytes], tmp_path: Path) -> None:
    a = models.build_onnx(name, tmp_path / "a" / f"{name}.onnx")
    b = models.build_onnx(name, tmp_path / "b" / f"{name}.onnx")
    assert isinstance(a, Path) and a.is_file()
    assert _sha(a.read_bytes()) == _sha(b.read_bytes()) == _sha(onnx_blobs[name])
    # atomic write leaves no temp files behind and replaces an existing file
    a.write_bytes(b"stale")
    models.build_onnx(name, a)
    assert a.read_bytes() == onnx_blobs[name]
    assert sorted(p.name for p in a.parent.iterdir()) == [f"{name}.onnx"]


@pytest.mark.parametrize("name", models.BUNDLED)
def test_onnx_valid(name: str, onnx_blobs: dict[str, bytes]) -> None:
    m = onnx.load_from_string(onnx_blobs[name])
    onnx.checker.check_model(m, full_check=True)
    assert m.producer_name == "edgetune-models"
    assert m.ir_version in (8, 9)
    assert [(o.domain, o.version) for o in m.opset_import] == [("", 17)]
    spec = models.input_specs(name)[0]
    (inp,) = m.graph.input
    assert inp.name == spec.name
    assert inp.type.tensor_type.elem_type == onnx.TensorProto.FLOAT
    dims = [d.dim_param or d.dim_value for d in inp.type.tensor_type.shape.dim]
    assert tuple(dims) == spec.shape
    assert [o.name for o in m.graph.output] == list(models.output_names(name))


def test_mobilenet_ops_and_structure(onnx_blobs: dict[str, bytes]) -> None:
    m = onnx.load_from_string(onnx_blobs["mobilenet"])
    ops = [n.op_type for n in m.graph.node]
    assert {"Conv", "Clip", "Add", "GlobalAveragePool", "Gemm"} <= set(ops)
    assert ops.count("Add") >= 2  # residual connections
    groups = [a.i for n in m.graph.node if n.op_type == "Conv" for a in n.attribute
              if a.name == "group"]
    assert max(groups) > 1  # depthwise


def test_transformer_ops(onnx_blobs: dict[str, bytes]) -> None:
    m = onnx.load_from_string(onnx_blobs["transformer"])
    ops = {n.op_type for n in m.graph.node}
    assert {"LayerNormalization", "MatMul", "Softmax", "Reshape", "Transpose", "Erf"} <= ops
    assert "Gelu" not in ops  # opset 17: GELU is spelled with Erf


@pytest.mark.parametrize("batch", [1, 4, 16])
def test_mobilenet_runs_dynamic_batch(
    batch: int, sessions: dict[str, ort.InferenceSession]
) -> None:
    sess = sessions["mobilenet"]
    x = _input("mobilenet", {"batch": batch}, seed=batch)
    (y,) = sess.run(None, {"input": x})
    assert y.shape == (batch, 1000) and y.dtype == np.float32
    assert np.isfinite(y).all()
    assert 0.1 < float(y.std()) < 10.0  # neither exploding nor vanishing
    # rows are computed independently: first row equals a batch-1 run of the same image
    (y0,) = sess.run(None, {"input": x[:1]})
    _assert_close(y[:1], y0, rel=1e-5)
    if batch > 1:  # different images give different logits
        assert float(np.abs(y[0] - y[1]).max()) > 1e-2


def test_mobilenet_output_depends_on_input(sessions: dict[str, ort.InferenceSession]) -> None:
    sess = sessions["mobilenet"]
    outs = [sess.run(None, {"input": _input("mobilenet", {"batch": 1}, seed=s)})[0] for s in (1, 2)]
    zeros = sess.run(None, {"input": np.zeros((1, 3, 96, 96), np.float32)})[0]
    assert float(np.abs(outs[0] - outs[1]).mean()) > 1e-2
    assert float(np.abs(outs[0] - zeros).mean()) > 1e-2


@pytest.mark.parametrize("batch", [1, 4, 16])
@pytest.mark.parametrize("seq", [32, 128, 512])
def test_transformer_runs_dynamic_shapes(
    batch: int, seq: int, sessions: dict[str, ort.InferenceSession]
) -> None:
    x = _input("transformer", {"batch": batch, "seq": seq}, seed=batch * 1000 + seq)
    (y,) = sessions["transformer"].run(None, {"tokens_embed": x})
    assert y.shape == (batch, seq, 128) and y.dtype == np.float32
    assert np.isfinite(y).all()
    assert 0.3 < float(y.std()) < 5.0
    # the block is not the identity and the output depends on the input
    assert float(np.abs(y - x).mean()) > 1e-2
    assert float(np.abs(y[:, 0] - y[:, 1]).mean()) > 1e-2


def test_transformer_attention_mixes_tokens(sessions: dict[str, ort.InferenceSession]) -> None:
    """Changing one token changes the other tokens' outputs (attention), not only its own."""
    x = _input("transformer", {"batch": 1, "seq": 32}, seed=5)
    x2 = x.copy()
    # (a random direction: a constant shift would be removed by LayerNorm)
    x2[0, 7] += np.random.default_rng(6).standard_normal(128).astype(np.float32)
    sess = sessions["transformer"]
    (y,) = sess.run(None, {"tokens_embed": x})
    (y2,) = sess.run(None, {"tokens_embed": x2})
    assert float(np.abs(y2[0, 0] - y[0, 0]).max()) > 1e-3


# --- TFLite ---------------------------------------------------------------------------------


def _tflite_run(blob: bytes, x: np.ndarray) -> np.ndarray:
    from ai_edge_litert.interpreter import Interpreter

    it = Interpreter(model_content=blob, num_threads=1)
    it.allocate_tensors()
    (inp,) = it.get_input_details()
    (out,) = it.get_output_details()
    assert tuple(inp["shape"]) == x.shape
    it.set_tensor(inp["index"], np.ascontiguousarray(x))
    it.invoke()
    return it.get_tensor(out["index"]).copy()


@pytest.mark.parametrize(
    "name,dims",
    [
        ("mobilenet", {"batch": 1}),
        ("mobilenet", {"batch": 3}),
        ("transformer", {"batch": 1, "seq": 128}),
        ("transformer", {"batch": 2, "seq": 32}),
    ],
)
def test_tflite_matches_onnx(
    name: str, dims: dict[str, int], sessions: dict[str, ort.InferenceSession]
) -> None:
    require(HAVE_LITERT, "ai-edge-litert is not installed (extra 'tflite')")
    blob = models.tflite_bytes(name, dims)
    x = _input(name, dims, seed=42)  # NCHW for mobilenet
    (ref,) = sessions[name].run(None, {models.input_specs(name)[0].name: x})
    # the TFLite mobilenet is NHWC: transpose the same data; the transformer layout is shared
    x_tfl = x.transpose(0, 2, 3, 1) if name == "mobilenet" else x
    got = _tflite_run(blob, x_tfl)
    _assert_close(got, ref, rel=1e-4)


@pytest.mark.parametrize("name", models.BUNDLED)
def test_tflite_reproducible_and_well_formed(name: str, tmp_path: Path) -> None:
    require(HAVE_LITERT, "ai-edge-litert is not installed (extra 'tflite')")
    from ai_edge_litert import schema_py_generated as S

    dims = models.default_shapes(name)
    a = models.build_tflite(name, tmp_path / "a.tflite", dims)
    b = models.build_tflite(name, tmp_path / "b.tflite", dims)
    data = a.read_bytes()
    assert _sha(data) == _sha(b.read_bytes())
    assert data[4:8] == b"TFL3"
    model = S.Model.GetRootAs(data, 0)
    assert model.Version() == 3
    sg = model.Subgraphs(0)
    in_t = sg.Tensors(sg.Inputs(0))
    assert in_t.Name().decode() == models.input_specs(name)[0].name
    assert tuple(in_t.ShapeAsNumpy()) == models.input_specs(name, "tflite")[0].resolve(dims)
    assert sg.Tensors(sg.Outputs(0)).Name().decode() == models.output_names(name)[0]
    # constant buffers are 16-byte aligned in the file (as the official converter writes them)
    start = np.frombuffer(data, np.uint8).__array_interface__["data"][0]
    n_const = 0
    for i in range(model.BuffersLength()):
        buf = model.Buffers(i)
        if buf.DataLength():
            off = buf.DataAsNumpy().__array_interface__["data"][0] - start
            assert off % 16 == 0, (i, off)
            n_const += 1
    assert n_const > 5


# --- CLI ------------------------------------------------------------------------------------


def test_cli_build_writes_all(tmp_path: Path, onnx_blobs: dict[str, bytes]) -> None:
    require(HAVE_LITERT, "ai-edge-litert is not installed (extra 'tflite')")
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run(
        [sys.executable, "-m", "models", "build", "--out", str(tmp_path)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    printed = [Path(line) for line in proc.stdout.split()]
    expected = {"mobilenet.onnx", "transformer.onnx", "mobilenet.tflite",
                "transformer_b1_s128.tflite"}
    assert {p.name for p in printed} == expected
    assert {p.name for p in tmp_path.iterdir()} == expected
    # a separate process produces byte-identical files (fixed seeds, deterministic writers)
    for name in models.BUNDLED:
        assert (tmp_path / f"{name}.onnx").read_bytes() == onnx_blobs[name]
    assert (tmp_path / "mobilenet.tflite").read_bytes() == models.tflite_bytes("mobilenet")
    assert (tmp_path / "transformer_b1_s128.tflite").read_bytes() == models.tflite_bytes(
        "transformer", {"batch": 1, "seq": 128}
    )
