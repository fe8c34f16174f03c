"""The zoo's vision models (ResNet-50, MobileNetV3-Large, EfficientNet-B0, YOLOv8n, U-Net).

small: byte-reproducible builds, onnxruntime at batch 1 and 2, float32 output against the float64
``onnx.reference`` run (norm-relative 1e-4), sane output scale.
full: the graph's parameter count matches the published one within 5 %, and it runs once.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from models import zoo
from models.zoo.reference import float64_copy, reference_outputs

VISION = ("resnet50", "mobilenetv3", "efficientnet_b0", "yolov8n", "unet")
PUBLISHED_PARAMS = {
    "resnet50": 25.6e6,
    "mobilenetv3": 5.4e6,
    "efficientnet_b0": 5.3e6,
    "yolov8n": 3.2e6,
    "unet": 31.0e6,
}
OUTPUT = {"resnet50": "logits", "mobilenetv3": "logits", "efficientnet_b0": "logits",
          "yolov8n": "detections", "unet": "logits"}


def _input_shape(model: onnx.ModelProto, batch: int) -> list[int]:
    dims = model.graph.input[0].type.tensor_type.shape.dim
    assert dims[0].dim_param == "batch"
    return [batch] + [d.dim_value for d in dims[1:]]


def _session(model_bytes: bytes):
    import onnxruntime as ort

    return ort.InferenceSession(model_bytes, providers=["CPUExecutionProvider"])


@pytest.mark.parametrize("name", VISION)
def test_small_reproducible_runs_and_matches_reference(name, tmp_path):
    p1 = zoo.build(name, "small", tmp_path / "a")
    p2 = zoo.build(name, "small", tmp_path / "b")
    assert zoo.sha256(p1) == zoo.sha256(p2)
    assert p1.read_bytes() == p2.read_bytes()

    model = onnx.load(str(p1))
    assert model.ir_version <= 9
    assert {o.domain: o.version for o in model.opset_import}.get("", 0) in (17, 18)
    assert [o.name for o in model.graph.output] == [OUTPUT[name]]
    assert model.graph.output[0].type.tensor_type.shape.dim[0].dim_param == "batch"
    sess = _session(p1.read_bytes())
    rng = np.random.default_rng(1234)
    for batch in (1, 2):
        x = rng.standard_normal(_input_shape(model, batch)).astype(np.float32)
        (y,) = sess.run(None, {"input": x})
        assert y.shape[0] == batch
        assert y.dtype == np.float32
        assert np.isfinite(y).all()
        assert 1e-3 < float(y.std()) < 1e3, f"{name} output std {y.std()}"
        if batch == 2:  # batch items are independent
            (y0,) = sess.run(None, {"input": x[:1]})
            np.testing.assert_allclose(y[:1], y0, rtol=1e-4, atol=1e-4 * float(np.abs(y0).max()))
    (ref,) = reference_outputs(model, {"input": x})
    assert ref.dtype == np.float64 and ref.shape == y.shape
    err = np.linalg.norm(y.astype(np.float64) - ref) / np.linalg.norm(ref)
    assert err < 1e-4, f"{name}: norm-relative error {err:.3g} against the float64 reference"


@pytest.mark.parametrize("name", VISION)
def test_full_parameter_count_and_runs(name):
    model = zoo.entry(name).mod().model("full")
    # learned parameters are named <layer>.weight / <layer>.bias (BN folded into conv bias);
    # constants (anchors, Resize scales, shapes, DFL bins) are not counted
    params = sum(int(np.prod(t.dims)) for t in model.graph.initializer
                 if t.name.endswith((".weight", ".bias")))
    published = PUBLISHED_PARAMS[name]
    assert abs(params - published) / published < 0.05, f"{name}: {params} parameters vs {published:.3g}"
    sess = _session(model.SerializeToString())
    x = np.random.default_rng(0).standard_normal(_input_shape(model, 1)).astype(np.float32)
    (y,) = sess.run(None, {"input": x})
    assert np.isfinite(y).all()
    assert 1e-3 < float(y.std()) < 1e3


def test_entries_and_interface():
    for name in VISION:
        e = zoo.entry(name)
        assert name in zoo.available()
        assert e.title and isinstance(e.title, str)
        assert e.family in ("vision", "detection", "segmentation")
        assert e.dims("small") == {"batch": 1} and e.dims("full") == {"batch": 1}
        assert isinstance(e.tflite, str) and e.tflite


def test_float64_copy_keeps_resize_scales_float32():
    model = zoo.entry("yolov8n").mod().model("small")
    m64 = float64_copy(model)
    types = {t.name: t.data_type for t in m64.graph.initializer}
    scales = [n.input[2] for n in m64.graph.node if n.op_type == "Resize"]
    assert scales and all(types[s] == onnx.TensorProto.FLOAT for s in scales)
    weights = [n.input[1] for n in m64.graph.node if n.op_type == "Conv"]
    assert weights and all(types[w] == onnx.TensorProto.DOUBLE for w in weights)
    assert m64.graph.input[0].type.tensor_type.elem_type == onnx.TensorProto.DOUBLE
    assert model.graph.input[0].type.tensor_type.elem_type == onnx.TensorProto.FLOAT  # a copy
