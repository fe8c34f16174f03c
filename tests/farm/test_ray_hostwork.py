"""The host's heavy work on a Ray cluster (issue 13, ``--ray ADDRESS``): a real one-node Ray cluster
on 127.0.0.1 (tools/farm/ray_farm.py). References computed there are this host's, bit for bit;
tvm-relax builds made there are checked against this host's build identity; a cluster of other
versions, or an address that does not answer, is refused in one line; a tune with --ray verifies
and selects as one without it, its heavy work done by the cluster's worker processes."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest

from edgetune.errors import EdgetuneError, UserInputError
from tests.conftest import load_tool, require_module
from tests.fixtures.tiny import build_tiny

EDGETUNE = [sys.executable, "-m", "edgetune.cli.main"]


@pytest.fixture(scope="module")
def ray_cluster():
    farm = load_tool("farm", "ray_farm")
    base = Path(tempfile.mkdtemp(prefix="etray-"))  # short: Ray's socket paths
    old = {k: os.environ.get(k) for k in farm.ENV}
    os.environ.update(farm.ENV)  # no usage statistics from this process's Ray driver either
    try:
        require_module("ray")
        info = farm.start(base)
        try:
            yield info["address"]
        finally:
            farm.stop(base)
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        shutil.rmtree(base, ignore_errors=True)


def test_references_come_back_bit_for_bit_and_a_foreign_build_is_refused(ray_cluster, tmp_path, monkeypatch):
    import edgetune
    from edgetune.build.identity import build_identity
    from edgetune.hostwork import HostWork
    from edgetune.modelfile import load_model
    from edgetune.workload import build_workload, compute_reference

    model = load_model(build_tiny(tmp_path / "tiny.onnx"))
    wls = [build_workload(model, {"batch": b}, seed=3) for b in (1, 5)]
    hw = HostWork(ray_cluster)
    try:
        hw.references(wls)
        for wl in wls:
            assert len(wl._references) == len(wl.input_sets)
            for got, inputs in zip(wl._references, wl.input_sets):
                want = compute_reference(model, inputs)
                assert all(np.array_equal(g, w) and g.dtype == w.dtype for g, w in zip(got, want))
        assert hw.workers and all(pid != os.getpid() for _, pid in hw.workers)  # computed by the cluster's workers
        # a build whose identity is not the one its cache key names is refused, and nothing is written
        target = {"kind": "llvm"}
        out = tmp_path / "a.so"
        hw.start_build(model, wls[0].input_shapes, target, None, 1, out)
        with pytest.raises(EdgetuneError, match="its artifact is not the one this candidate names"):
            hw.finish_build(out, {**build_identity(None, 1), "tvm": "0.0-other"})
        assert not out.exists()
        assert hw.finish_build(out, build_identity(None, 1)) == out and out.stat().st_size > 0
    finally:
        hw.close()
    # a cluster whose versions are not this host's: refused before any work
    monkeypatch.setattr(edgetune, "__version__", "0.0-other")
    with pytest.raises(UserInputError, match=r"runs edgetune .* \(here 0\.0-other\): its references and builds"):
        HostWork(ray_cluster)


def _tune(args, home):
    env = {**os.environ, "EDGETUNE_HOME": str(home)}
    env.pop("EDGETUNE_DB", None)
    return subprocess.run(EDGETUNE + [str(a) for a in args], capture_output=True, text=True, timeout=600, env=env)


def test_tune_with_ray_builds_and_references_on_the_cluster(ray_cluster, tmp_path):
    require_module("tvm")
    model = build_tiny(tmp_path / "tiny.onnx")
    args = ["tune", model, "-d", "local", "--budget", "20", "--rounds", "1", "--finalists", "1", "--max-candidates",
            "1", "--space", "ort,tvm-relax", "--sweep", "batch=1,3", "--db", tmp_path / "r.db", "--format", "json"]
    p = _tune([*args, "--ray", ray_cluster], tmp_path / "home")
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    (d,), (r,) = doc["devices"], doc["runs"]
    assert d["status"] == "complete" and d["host_work"]["ray"] == ray_cluster and d["host_work"]["workers"]
    for s in r["shapes"]:  # the tvm-relax build of each point came from the cluster, verified on the device
        tvm = [c for c in s["candidates"] if c["candidate"]["backend"] == "tvm-relax"]
        assert tvm and all(c["status"] == "verified" for c in tvm), s
    arts = list((tmp_path / "home" / "artifacts").glob("tvm-relax-*.so"))
    assert len(arts) == 2  # one per shape point, written here from the bytes the cluster built

    # an address that does not answer, or is not one: one line, at once, nothing recorded
    for addr, msg in (("127.0.0.1:1", "cannot reach the Ray cluster at 127.0.0.1:1"),
                      ("nonsense", "--ray wants HOST:PORT")):
        p = _tune([*args[:-2], "--db", tmp_path / "x.db", "--ray", addr], tmp_path / "home")
        assert p.returncode == 2 and p.stderr.count("\n") == 1 and msg in p.stderr, p.stderr
    assert not (tmp_path / "x.db").exists()
