"""TVM caches (MetaSchedule tuning databases, tvm-relax / tvm-tuned artifacts) are keyed by everything
that changes a result: a change of the TVM version, the kernel threads, the compiler (path or its
``--version``) or edgetune's version is a cache miss."""

from __future__ import annotations

import os
import stat
from types import SimpleNamespace

import pytest

from tests.conftest import require_module

tvm = require_module("tvm")

import edgetune  # noqa: E402
from edgetune.build import identity  # noqa: E402
from edgetune.kernels.search import LocalMeasure, database_dir, tune_workload  # noqa: E402
from edgetune.kernels.workloads import parse_workload  # noqa: E402

HOST = {"kind": "llvm", "num-cores": 2}


def fake_compiler(path, version: str):
    """A C compiler that only answers --version (enough for the identity; never asked to link here)."""
    path.write_text(f"#!/bin/sh\necho '{version}'\necho 'Copyright nobody'\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def test_compiler_identity_is_path_and_first_version_line(tmp_path):
    cc = fake_compiler(tmp_path / "cc-a", "fakecc (Edge) 12.1.0")
    ident = identity.compiler_identity(cc)
    assert ident == {"path": os.path.realpath(cc), "version": "fakecc (Edge) 12.1.0"}
    # replaced in place (an upgrade): asked again, not served from a cache
    fake_compiler(tmp_path / "cc-a", "fakecc (Edge) 13.0.0 with a longer line")
    assert identity.compiler_identity(cc)["version"] == "fakecc (Edge) 13.0.0 with a longer line"
    assert identity.compiler_identity(str(tmp_path / "missing-cc"))["version"] == "not found"
    # None: the compiler TVM links host artifacts with
    assert identity.compiler_identity(None)["path"] != "none"


def test_database_dir_misses_on_every_part_of_the_identity(tmp_path, monkeypatch):
    cc1 = fake_compiler(tmp_path / "cc1", "fakecc 1.0")
    cc2 = fake_compiler(tmp_path / "cc2", "fakecc 1.0")  # same version, other path
    base = database_dir(tmp_path, "dev", HOST, cross_cc=cc1, threads=2)
    assert base == database_dir(tmp_path, "dev", HOST, cross_cc=cc1, threads=2)  # stable
    assert base.parent.parent.parent == tmp_path
    variants = {
        "threads": database_dir(tmp_path, "dev", HOST, cross_cc=cc1, threads=4),
        "compiler path": database_dir(tmp_path, "dev", HOST, cross_cc=cc2, threads=2),
        "fingerprint": database_dir(tmp_path, "dev2", HOST, cross_cc=cc1, threads=2),
        "target": database_dir(tmp_path, "dev", {"kind": "llvm", "num-cores": 4}, cross_cc=cc1, threads=2),
    }
    fake_compiler(tmp_path / "cc1", "fakecc 1.1")
    variants["compiler version"] = database_dir(tmp_path, "dev", HOST, cross_cc=cc1, threads=2)
    fake_compiler(tmp_path / "cc1", "fakecc 1.0")
    assert database_dir(tmp_path, "dev", HOST, cross_cc=cc1, threads=2) == base
    monkeypatch.setattr(tvm, "__version__", "99.0.0")
    variants["tvm version"] = database_dir(tmp_path, "dev", HOST, cross_cc=cc1, threads=2)
    monkeypatch.undo()
    monkeypatch.setattr(edgetune, "__version__", "99.0.0")
    variants["edgetune version"] = database_dir(tmp_path, "dev", HOST, cross_cc=cc1, threads=2)
    monkeypatch.undo()
    for what, path in variants.items():
        assert path != base, what
    assert len(set(variants.values())) == len(variants)
    # the default thread count is the target's num-cores (what the default measurer uses)
    assert database_dir(tmp_path, "dev", HOST) == database_dir(tmp_path, "dev", HOST, threads=2)
    assert "tvm" + tvm.__version__ in base.name and "-2t-" in base.name


def test_a_changed_identity_retunes_instead_of_reusing_records(tmp_path, monkeypatch):
    w = parse_workload("gemm:M=16,N=16,K=16")
    with LocalMeasure(num_threads=2, warmup_ms=2, budget_ms=10, timeout_s=60) as measure:
        first = tune_workload(w, HOST, 2, measure, tmp_path, fingerprint="dev")
        assert first.trials_measured >= 1
        again = tune_workload(w, HOST, first.trials_measured, measure, tmp_path, fingerprint="dev")
        assert again.trials_measured == 0 and again.db_path == first.db_path  # same identity: a hit
        monkeypatch.setattr(tvm, "__version__", "99.0.0")
        upgraded = tune_workload(w, HOST, first.trials_measured, measure, tmp_path, fingerprint="dev")
        assert upgraded.db_path != first.db_path
        assert upgraded.reused_records == 0 and upgraded.trials_measured >= 1  # a miss: measured anew
    with LocalMeasure(num_threads=1, warmup_ms=2, budget_ms=10, timeout_s=60) as one_thread:
        monkeypatch.undo()
        other = tune_workload(w, HOST, first.trials_measured, one_thread, tmp_path, fingerprint="dev")
        assert other.db_path != first.db_path and other.reused_records == 0


def _relax_key(tmp_path, **over):
    from edgetune.space.tvm_relax import artifact_key

    model = SimpleNamespace(sha256="ab" * 32)
    wl = SimpleNamespace(model=model, input_shapes={"x": (1, 3, 6, 6)})
    info = SimpleNamespace(fingerprint={"cores": 2}, fingerprint_key="fp")
    args = dict(target=dict(HOST), cross_cc=None, tuned=False, trials=0)
    args.update(over)
    return artifact_key(wl, info, args["target"], args["cross_cc"], args["tuned"], args["trials"])


def test_tvm_relax_artifact_key_misses_on_every_part_of_the_identity(tmp_path, monkeypatch):
    cc1 = fake_compiler(tmp_path / "cc1", "fakecc 1.0")
    base = _relax_key(tmp_path, cross_cc=cc1)
    assert base == _relax_key(tmp_path, cross_cc=cc1)
    keys = {"threads": _relax_key(tmp_path, cross_cc=cc1, target={"kind": "llvm", "num-cores": 4}),
            "compiler path": _relax_key(tmp_path, cross_cc=fake_compiler(tmp_path / "cc2", "fakecc 1.0")),
            "tuned": _relax_key(tmp_path, cross_cc=cc1, tuned=True, trials=8)}
    fake_compiler(tmp_path / "cc1", "fakecc 2.0")
    keys["compiler version"] = _relax_key(tmp_path, cross_cc=cc1)
    monkeypatch.setattr(tvm, "__version__", "99.0.0")
    keys["tvm version"] = _relax_key(tmp_path, cross_cc=cc1)
    monkeypatch.undo()
    monkeypatch.setattr(edgetune, "__version__", "99.0.0")
    keys["edgetune version"] = _relax_key(tmp_path, cross_cc=cc1)
    for what, key in keys.items():
        assert key != base, what


def test_missing_cross_compiler_is_a_build_failure_not_a_crash(tmp_path, monkeypatch):
    import edgetune.space.tvm_relax as space_mod
    from edgetune.space import BuildFailed

    model = SimpleNamespace(sha256="ab" * 32, path=tmp_path / "m.onnx")
    wl = SimpleNamespace(model=model, input_shapes={"x": (1, 3, 6, 6)})
    info = SimpleNamespace(fingerprint={"cores": 2}, fingerprint_key="fp", arch="aarch64")
    cand = SimpleNamespace(param_dict={"num_threads": 1})
    target = {"kind": "llvm", "mtriple": "aarch64-linux-gnu", "num-cores": 2}
    monkeypatch.setattr(space_mod, "device_target", lambda _info: (target, "/nonexistent/aarch64-linux-gnu-gcc"))
    with pytest.raises(BuildFailed, match="not found"):
        space_mod.SPACE.prepare(cand, wl, info, tmp_path / "cache")
