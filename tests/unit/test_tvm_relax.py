"""Whole-model TVM Relax builds (default and tuned) agree with onnxruntime on a tiny conv+relu+gemm."""

from __future__ import annotations

import numpy as np
import pytest

from tests.conftest import require_module

tvm = require_module("tvm")
onnx = require_module("onnx")
ort = require_module("onnxruntime")

from edgetune.errors import ModelError, UserInputError  # noqa: E402

HOST = {"kind": "llvm", "num-cores": 2}
SHAPES = {"x": (1, 3, 6, 6)}


@pytest.fixture(scope="module")
def tiny_onnx(tmp_path_factory):
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    w = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
    b = rng.standard_normal((4,)).astype(np.float32)
    g = rng.standard_normal((4 * 6 * 6, 5)).astype(np.float32)
    gb = rng.standard_normal((5,)).astype(np.float32)
    nodes = [
        helper.make_node("Conv", ["x", "W", "B"], ["c"], pads=[1, 1, 1, 1], strides=[1, 1]),
        helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node("Flatten", ["r"], ["f"], axis=1),
        helper.make_node("Gemm", ["f", "G", "GB"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes, "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 6, 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 5])],
        [numpy_helper.from_array(a, n) for a, n in ((w, "W"), (b, "B"), (g, "G"), (gb, "GB"))],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    path = tmp_path_factory.mktemp("onnx") / "tiny.onnx"
    onnx.save(model, str(path))
    return path


def _run_vm(path, x):
    from tvm import relax

    lib = tvm.runtime.load_module(str(path))
    vm = relax.VirtualMachine(lib, tvm.cpu())
    return vm["main"](tvm.runtime.tensor(x)).numpy()


def _ort(path, x):
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]


def _close(got, want):
    return np.abs(got.astype(np.float64) - want).max() <= 1e-4 * np.abs(want).max()


def test_default_build_matches_onnxruntime(tiny_onnx, tmp_path):
    from edgetune.build.tvm_relax import build_relax_model

    info: dict = {}
    path = build_relax_model(tiny_onnx, SHAPES, HOST, tmp_path / "m.so", info=info)
    assert info["tuned_functions"] == 0
    for seed in (0, 1):
        x = (np.random.default_rng(seed).standard_normal((1, 3, 6, 6)) * 10).astype(np.float32)
        assert _close(_run_vm(path, x), _ort(tiny_onnx, x))


def test_tuned_build_applies_records_and_matches_onnxruntime(tiny_onnx, tmp_path):
    from edgetune.build.tvm_relax import tune_relax_model
    from edgetune.kernels.search import LocalMeasure

    with LocalMeasure(num_threads=2, warmup_ms=2, budget_ms=10) as measure:
        out = tune_relax_model(tiny_onnx, SHAPES, HOST, 8, tmp_path / "db", measure, fingerprint="tiny-dev")
    tuned = [(t.name, o) for t, o in out.tasks if o is not None]
    assert {name for name, _ in tuned} >= {"fused_conv2d_add_relu"}
    assert all(o.verified for _, o in tuned)
    measured = sum(o.trials_measured + o.reused_records for _, o in tuned)  # fresh db: all records
    assert 0 < measured <= 8  # the model's budget, shared among its kernels, never exceeded
    assert out.tuned_functions == len(tuned)  # every tuned task's record was applied in the build
    x = np.random.default_rng(7).standard_normal((1, 3, 6, 6)).astype(np.float32)
    assert _close(_run_vm(out.artifact_path, x), _ort(tiny_onnx, x))


def test_input_errors(tiny_onnx, tmp_path):
    from edgetune.build.tvm_relax import build_relax_model

    with pytest.raises(ModelError):
        build_relax_model(tmp_path / "missing.onnx", SHAPES, HOST, tmp_path / "m.so")
    with pytest.raises(UserInputError, match="no input named"):
        build_relax_model(tiny_onnx, {"nope": (1,)}, HOST, tmp_path / "m.so")
