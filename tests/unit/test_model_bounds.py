"""Host-side work on a model is bounded: node count, file size, and a deadline (issue 8)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgetune.errors import ModelError, UserInputError
from edgetune.modelfile import Deadline, ModelLimits, count_nodes, load_model
from edgetune.workload import build_workload, model_flops


def _varint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _field(no: int, payload: bytes) -> bytes:
    return _varint(no << 3 | 2) + _varint(len(payload)) + payload


def _chain(n: int) -> onnx.ModelProto:
    """x -> Relu -> ... -> y: n nodes (helper-built; fine for small n)."""
    names = ["x"] + [f"t{i}" for i in range(n - 1)] + ["y"]
    nodes = [helper.make_node("Relu", [names[i]], [names[i + 1]]) for i in range(n)]
    g = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def _write_many_nodes(path, n: int) -> None:
    """A model file whose main graph has ``n`` nodes, written from bytes in milliseconds (the same
    serialized node repeated: not a runnable graph, but the count is what must be refused, before
    any parse)."""
    small = _chain(1)
    node = small.graph.node[0].SerializeToString()
    graph = small.graph.__deepcopy__()
    del graph.node[:]
    graph_bytes = _field(1, node) * n + graph.SerializeToString()
    rest = small.__deepcopy__()
    rest.ClearField("graph")
    path.write_bytes(rest.SerializeToString() + _field(7, graph_bytes))


def test_default_limit_refuses_one_node_more_quickly(tmp_path):
    limit = ModelLimits().max_nodes
    big = tmp_path / "big.onnx"
    t0 = time.monotonic()
    _write_many_nodes(big, limit + 1)
    with pytest.raises(ModelError) as exc:
        load_model(big)
    assert time.monotonic() - t0 < 10
    msg = str(exc.value)
    assert f"model has {limit + 1:,} nodes; edgetune's limit is {limit:,} (EDGETUNE_MAX_NODES={limit}" in msg
    assert "\n" not in msg


def test_far_above_the_limit_counts_are_capped(tmp_path, monkeypatch):
    monkeypatch.setenv("EDGETUNE_MAX_NODES", "10")
    big = tmp_path / "big.onnx"
    _write_many_nodes(big, 5000)
    with pytest.raises(ModelError, match="model has more than 100 nodes; edgetune's limit is 10 "):
        load_model(big)


def test_model_at_the_limit_loads_and_gets_references(tmp_path, monkeypatch):
    monkeypatch.setenv("EDGETUNE_MAX_NODES", "40")
    p = tmp_path / "chain.onnx"
    onnx.save(_chain(40), p)
    wl = build_workload(load_model(p), {})
    assert len(wl.references()) == len(wl.input_sets)
    onnx.save(_chain(41), p)
    with pytest.raises(ModelError, match="model has 41 nodes; edgetune's limit is 40 .EDGETUNE_MAX_NODES=40"):
        load_model(p)


def test_subgraph_nodes_count(tmp_path, monkeypatch):
    body = helper.make_graph([helper.make_node("Relu", ["x"], [f"b{i}"]) for i in range(30)] +
                             [helper.make_node("Identity", ["x"], ["out"])], "body", [],
                             [helper.make_tensor_value_info("out", TensorProto.FLOAT, [1, 4])])
    iff = helper.make_node("If", ["c"], ["y"], then_branch=body, else_branch=body)
    g = helper.make_graph([iff], "g", [helper.make_tensor_value_info("c", TensorProto.BOOL, []),
                                       helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    assert count_nodes(m) == 1 + 2 * 31
    p = tmp_path / "if.onnx"
    onnx.save(m, p)
    monkeypatch.setenv("EDGETUNE_MAX_NODES", "50")
    with pytest.raises(ModelError, match="model has 63 nodes; edgetune's limit is 50"):
        load_model(p)


def _matmul(n: int) -> onnx.ModelProto:
    w = numpy_helper.from_array(np.arange(n * n, dtype=np.float32).reshape(n, n) / (n * n), "w")
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "mm",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", n])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", n])], [w])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def test_file_cap_and_external_data(tmp_path, monkeypatch):
    monkeypatch.setenv("EDGETUNE_MAX_MODEL_MB", "1")
    single = tmp_path / "single.onnx"
    onnx.save(_matmul(600), single)  # 1.4 MB of weights in the file
    with pytest.raises(ModelError) as exc:
        load_model(single)
    msg = str(exc.value)
    assert "model file is 1.4 MB; edgetune's limit is 1 MB (EDGETUNE_MAX_MODEL_MB=1)" in msg
    assert "external data" in msg
    split = tmp_path / "split.onnx"
    onnx.save_model(_matmul(600), split, save_as_external_data=True, location="split.data")
    m = load_model(split)  # the weights are not counted
    wl = build_workload(m, {"batch": 2})
    assert wl.references()[0][0].shape == (2, 600)
    assert wl.flops() == 2.0 * 2 * 600 * 600


def test_flops_without_reading_the_weights(tmp_path):
    p = tmp_path / "mm.onnx"
    onnx.save(_matmul(64), p)  # 16 KB weight: left out of the graph parsed for shape inference
    m = load_model(p)
    assert model_flops(str(m.path), m.sha256, (("x", (3, 64)),)) == 2.0 * 3 * 64 * 64


@pytest.mark.parametrize("value", ["abc", "0", "-5"])
def test_bad_limit_values(tiny_model, monkeypatch, value):
    monkeypatch.setenv("EDGETUNE_MAX_NODES", value)
    with pytest.raises(UserInputError, match="EDGETUNE_MAX_NODES"):
        load_model(tiny_model)


def test_deadline(tiny_model):
    m = load_model(tiny_model)
    passed = Deadline(time.monotonic() - 1, 30.0)
    with pytest.raises(UserInputError,
                       match=r"host-side work on the model \(inputs\) exceeded the tuning budget of 30s"):
        build_workload(m, {"batch": 2}, deadline=passed)
    wl = build_workload(m, {"batch": 2})
    with pytest.raises(UserInputError, match=r"\(references\) exceeded the tuning budget of 30s"):
        wl.references(deadline=passed)
    with pytest.raises(UserInputError, match=r"\(load\) exceeded"):
        load_model(tiny_model, deadline=passed)
    ok = Deadline.after(60.0)
    wl = build_workload(m, {"batch": 2}, deadline=ok)  # computes the references within the deadline
    assert wl._references is not None and len(wl.references(deadline=passed)) == len(wl.input_sets)  # cached


def test_cli_refuses_with_one_line(tmp_path):
    big = tmp_path / "big.onnx"
    _write_many_nodes(big, 21)
    env = {**os.environ, "EDGETUNE_HOME": str(tmp_path / "home"), "EDGETUNE_MAX_NODES": "20"}
    p = subprocess.run([sys.executable, "-m", "edgetune.cli.main", "tune", str(big), "--db", str(tmp_path / "x.db")],
                       capture_output=True, text=True, timeout=120, env=env)
    assert p.returncode == 2, p.stderr
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), p.stderr
    assert "model has 21 nodes; edgetune's limit is 20 (EDGETUNE_MAX_NODES=20" in lines[0]
    assert "Traceback" not in p.stderr
