"""Hybrid onnxruntime + TVM candidates (edgetune/space/ort_tvm.py, device_agents/native/ortop.c):
which nodes are spliced, the custom-op library running real TVM kernels inside onnxruntime, its
refusals, the companion files that travel with the model, and a tune that races the hybrid."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from edgetune.errors import UserInputError
from tests.conftest import require
from tests.fixtures.depthwise import build_depthwise

SHAPE = {"x": (1, 8, 10, 10)}


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    return build_depthwise(tmp_path_factory.mktemp("dw") / "dw.onnx")


@pytest.fixture(scope="module")
def tvm():
    try:
        import tvm as _tvm
    except ImportError:
        require(False, "TVM not installed")
    return _tvm


def test_sites_are_the_depthwise_convs_with_what_follows_them(model):
    from edgetune.space.ort_tvm import depthwise_sites

    sites = {s.conv: s for s in depthwise_sites(model, SHAPE)}
    # the 1x1 conv and the dilated depthwise conv are not sites
    assert sorted(sites) == ["dw1", "dw2", "dw3", "dw4"]
    w = {k: s.workload for k, s in sites.items()}
    assert (sites["dw1"].act, w["dw1"].act, w["dw1"].bias) == ("act1", 1, 1)
    assert (sites["dw2"].act, w["dw2"].act, w["dw2"].bias) == ("act2", 2, 0)  # Clip(0, 6) from initializers
    assert (w["dw2"].SH, w["dw2"].PT, w["dw2"].PB, w["dw2"].P) == (2, 0, 1, 5)  # TF-style SAME pads
    assert (sites["dw3"].act, w["dw3"].act, w["dw3"].R) == ("act3", 3, 5)
    # dw4's output is also read by the residual Add: the Relu stays a node of its own
    assert (sites["dw4"].act, w["dw4"].act, sites["dw4"].y) == (None, 0, "c4")
    # the shape point decides the kernel's shapes
    big = {s.conv: s.workload for s in depthwise_sites(model, {"x": (2, 8, 10, 10)})}
    assert big["dw1"].N == 2


def test_fused_workload_matches_onnxruntime_nodes():
    """The float64 reference of every fused form against onnxruntime running the same nodes."""
    import onnxruntime as ort

    from edgetune.ops.forms import op_onnx_model, weight_inputs
    from edgetune.kernels.workloads import parse_workload

    for spec in ("dwconv2d_fused:N=1,C=8,H=9,W=10,R=3,S=3,SH=2,SW=2,PB=1,PR=1,bias=1,act=2",
                 "dwconv2d_fused:N=1,C=8,H=9,W=9,R=5,S=5,PT=2,PL=2,PB=2,PR=2,bias=0,act=3",
                 "dwconv2d_fused:N=2,C=4,H=7,W=7,R=3,S=3,PT=1,PL=1,PB=1,PR=1,act=1"):
        w = parse_workload(spec)
        xs = w.random_inputs(3)
        ref = w.reference(xs)[0]
        sess = ort.InferenceSession(op_onnx_model(w).SerializeToString())
        got = sess.run(None, {t.name: x for t, x in zip(w.inputs, xs)})[0]
        assert got.shape == ref.shape
        assert np.abs(got - ref).max() <= 1e-5 * np.abs(ref).max(), spec
        # weights and bias are the constant operands (onnxruntime's path in a real model)
        assert weight_inputs(w) == ((1, 2) if w.bias else (1,))
    with pytest.raises(UserInputError, match="act must be"):
        parse_workload("dwconv2d_fused:N=1,C=4,H=7,W=7,R=3,S=3,act=9")


def _kernels(tvm, sites, out: Path, corrupt: str | None = None) -> dict[str, str]:
    """Each site's workload compiled by TVM (default schedule) into out/k-<i>.so. With ``corrupt``
    (a conv name), that site's kernel leaves out its activation: the same arguments, a wrong answer
    that raises no error."""
    from dataclasses import replace

    files = {}
    for i, s in enumerate(sites):
        w = s.workload
        if w.key() in files:
            continue
        built = replace(w, act=0) if corrupt == s.conv else w
        name = f"k-{i}.so"
        tvm.compile(built.prim_func(), target="llvm").export_library(str(out / name))
        files[w.key()] = name
    return files


def _hybrid(tvm, model: Path, out: Path, shape=SHAPE, corrupt=None) -> tuple[Path, str]:
    from edgetune.build.native import build_ortop
    from edgetune.space.ort_tvm import depthwise_sites, splice

    out.mkdir(parents=True, exist_ok=True)
    lib = build_ortop(None, out.parent / "ortop-cache")
    shutil.copyfile(lib, out / lib.name)
    sites = depthwise_sites(model, shape)
    files = _kernels(tvm, sites, out, corrupt)
    splice(model, sites, files, lib.name, out / "model.onnx")
    return out / "model.onnx", lib.name


def _session(path: Path, lib: str | None):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 3
    if lib:
        so.register_custom_ops_library(str(path.parent / lib))
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])


def test_spliced_model_runs_tvm_kernels_inside_onnxruntime(tvm, model, tmp_path):
    import onnx

    hybrid, lib = _hybrid(tvm, model, tmp_path / "art")
    m = onnx.load(str(hybrid))
    ops = [n.op_type for n in m.graph.node]
    assert ops.count("TvmKernel") == 4 and "Relu" in ops  # act4 stays (its input is read twice)
    assert ops.count("Conv") == 2  # the 1x1 and the dilated conv
    assert {"act1", "act2", "act3"}.isdisjoint(n.name for n in m.graph.node)
    assert {t.name for t in m.graph.initializer}.isdisjoint({"lo", "hi"})  # the fused Clip's bounds went
    # each spliced output's shape is in the model: onnxruntime cannot infer it through a custom op,
    # and without it its layout transformer and fusions stop there
    vi = {v.name: [d.dim_value for d in v.type.tensor_type.shape.dim] for v in m.graph.value_info}
    assert vi["a1"] == [1, 8, 10, 10] and vi["a2"] == [1, 16, 5, 5] and vi["a3"] == [1, 16, 5, 5]
    assert vi["c4"] == [1, 16, 5, 5]
    x = np.random.default_rng(3).standard_normal(SHAPE["x"]).astype(np.float32)
    ref = _session(model, None).run(None, {"x": x})[0]
    for threads in (1, 2):  # the kernels' parallel loops on onnxruntime's own pool
        import onnxruntime as ort

        so = ort.SessionOptions()
        so.intra_op_num_threads = threads
        so.register_custom_ops_library(str(hybrid.parent / lib))
        got = ort.InferenceSession(str(hybrid), so).run(None, {"x": x})[0]
        assert np.abs(got - ref).max() <= 1e-5 * np.abs(ref).max()


def test_kernel_refuses_a_shape_it_was_not_compiled_for(tvm, model, tmp_path):
    hybrid, lib = _hybrid(tvm, model, tmp_path / "art")
    sess = _session(hybrid, lib)
    x = np.ones((2, 8, 10, 10), np.float32)  # batch 2: the kernels are batch 1
    with pytest.raises(Exception, match="not the shape the kernel was compiled for"):
        sess.run(None, {"x": x})


def test_a_wrong_kernel_is_caught_by_end_to_end_verification(tvm, model, tmp_path):
    """A kernel that skips its Relu runs without an error: only the host's reference catches it."""
    from edgetune.modelfile import load_model
    from edgetune.workload import build_workload

    hybrid, lib = _hybrid(tvm, model, tmp_path / "art", corrupt="dw1")
    wl = build_workload(load_model(model), {"batch": 1})
    x = wl.input_sets[0][0]
    got = _session(hybrid, lib).run(None, {"x": x})[0]
    ref = wl.references()[0][0]
    assert np.abs(got - ref).max() > 1e-3 * np.abs(ref).max()


@pytest.mark.parametrize("attr,value,match", [
    ("kernel", "../k-0.so", "not a file name next to the library"),
    ("kernel", "missing.so", "dlopen failed"),
    ("in_shapes", "1,8,x", "bad in_shapes"),
])
def test_library_refuses_bad_attributes(tvm, model, tmp_path, attr, value, match):
    import onnx

    hybrid, lib = _hybrid(tvm, model, tmp_path / "art")
    m = onnx.load(str(hybrid))
    node = next(n for n in m.graph.node if n.op_type == "TvmKernel")
    a = next(a for a in node.attribute if a.name == attr)
    a.s = value.encode()
    onnx.save(m, str(hybrid))
    with pytest.raises(Exception, match=match):
        _session(hybrid, lib).run(None, {"x": np.ones(SHAPE["x"], np.float32)})


def test_companion_files_travel_with_the_model(tvm, model, tmp_path):
    import onnx

    from edgetune.modelfile import external_data_files

    hybrid, lib = _hybrid(tvm, model, tmp_path / "art")
    files = external_data_files(hybrid)
    assert files[0] == lib and sorted(files[1:]) == sorted(p.name for p in hybrid.parent.glob("k-*.so"))
    m = onnx.load(str(hybrid))
    for bad, match in ((["../evil.so"], "not a file next to the model"), (["gone.so"], "is missing"),
                       ("not a list", "not a list")):
        prop = next(p for p in m.metadata_props if p.key == "edgetune:companions")
        prop.value = json.dumps(bad)
        onnx.save(m, str(tmp_path / "bad.onnx"))
        with pytest.raises(UserInputError, match=match):
            external_data_files(tmp_path / "bad.onnx")


def test_tune_races_the_hybrid_and_verifies_it_end_to_end(tvm, tmp_path, monkeypatch):
    """The hybrid space on the host device: kernels tuned and verified on the device, the spliced
    model built, measured and verified like any candidate; the candidate confirmed faster or not,
    and a tvm-faster hybrid only when some kernel was confirmed faster than onnxruntime's nodes."""
    from edgetune.db import Store
    from edgetune.tune import tune
    from edgetune.tune_config import TuneConfig

    monkeypatch.setenv("EDGETUNE_HOME", str(tmp_path / "home"))
    model = build_depthwise(tmp_path / "dw1.onnx", minimal=True)  # one depthwise node: one kernel to tune
    cfg = TuneConfig(budget_s=3.0, rounds=1, finalists=2, timeout_s=60, spaces=("ort", "ort-tvm"),
                     max_candidates=2, tvm_trials=4)
    out = tune(str(model), ["local"], db=tmp_path / "t.db", config=cfg)
    dev = out.devices[0]
    assert dev.status == "complete", dev.error
    by = {c.candidate.param_dict.get("hybrid"): c for c in dev.summary.shapes[0].candidates}
    allc = by["tvm-all"]
    assert allc.status == "verified", allc.reason
    faster = by["tvm-faster"]
    assert faster.status == "verified" or "no tuned kernel was confirmed faster" in faster.reason, faster.reason
    # the kernels' own session is recorded with its verdicts against onnxruntime's nodes
    store = Store(tmp_path / "t.db")
    try:
        kinds = [json.loads(r["config"]).get("kind")
                 for r in store.runs()]
    finally:
        store.close()
    assert "kernels" in kinds

    # the hybrid as an app artifact: the spliced model, the custom-op library and the kernels the tune
    # verified travel together, and the C loader runs them (the selection is made the hybrid here: the
    # confirmation keeps the default on this one-node model, and the export ships what was selected)
    import edgetune.export as ex
    from edgetune.export.check import export_check

    real = ex._load_runs

    def hybrid_selected(*a, **k):
        devices, path, sha = real(*a, **k)
        sel = devices[0].selections[0]
        sel.candidate = next(c for c in dev.summary.as_dict()["shapes"][0]["candidates"]
                             if c["candidate"]["params"].get("hybrid") == "tvm-all")
        return devices, path, sha

    monkeypatch.setattr(ex, "_load_runs", hybrid_selected)
    art = tmp_path / "art"
    m = ex.export([dev.run_id], "linux", art, db=str(tmp_path / "t.db"), abis=["x86_64-linux-gnu"])
    cfg = json.loads((art / "config.json").read_text())
    chosen = cfg["configs"][cfg["devices"][0]["selected"][0]["config"]]
    assert chosen["custom_ops_library"] and chosen["model_form"] == "onnx"
    assert len(chosen["files"]) >= 3  # the model, the library, at least one kernel
    assert all(f["path"] in m["files"] for f in chosen["files"])
    res = export_check(str(art), "local", iters=3, budget_ms=0)
    (s,) = res["shapes"]
    assert res["ok"], s.get("problems") or s.get("error")
    assert s["loader_selftest"]["ok"] and s["host_verification"]["ok"]
