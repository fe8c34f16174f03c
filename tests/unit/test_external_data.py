"""ONNX models with external data (every model past protobuf's 2 GiB, e.g. the full-size LLaMA of the
zoo): the data files travel with the model to the device, and a model cannot point them elsewhere."""

from __future__ import annotations

import json

import onnx
import pytest

from edgetune.errors import UserInputError
from edgetune.modelfile import external_data_files
from tests.fixtures.tiny import build_tiny
from tests.unit.test_cli import assert_one_line_error, run


@pytest.fixture
def home(tmp_path):
    return tmp_path / "home"


def _external(tmp_path, location="tiny.onnx.data"):
    src = build_tiny(tmp_path / "src.onnx")
    m = onnx.load(str(src))
    d = tmp_path / "ext"
    d.mkdir()
    onnx.save_model(m, str(d / "tiny.onnx"), save_as_external_data=True, all_tensors_to_one_file=True,
                    location=location, size_threshold=0)
    return d / "tiny.onnx"


def test_external_files_are_listed(tmp_path):
    path = _external(tmp_path)
    assert external_data_files(path) == ["tiny.onnx.data"]
    assert external_data_files(build_tiny(tmp_path / "plain.onnx")) == []


def test_a_model_with_external_data_is_tuned_and_verified(tmp_path, home):
    path = _external(tmp_path)
    db = tmp_path / "t.db"
    p = run(["tune", str(path), "--budget", "2", "--rounds", "1", "--finalists", "1", "--max-candidates", "1",
             "--space", "ort", "--db", str(db), "--format", "json"], home)
    assert p.returncode == 0, p.stderr
    cands = json.loads(p.stdout)["runs"][0]["shapes"][0]["candidates"]
    assert cands and all(c["status"] == "verified" for c in cands), cands
    # on the device, the model and its data sit in a directory of their own, under the names it refers to
    dirs = [d for d in (home / "work" / "artifacts").iterdir() if d.is_dir()]
    assert len(dirs) == 1 and {f.name for f in dirs[0].iterdir()} == {"model.onnx", "tiny.onnx.data"}


def test_a_location_outside_the_models_directory_is_refused(tmp_path, home):
    path = _external(tmp_path)
    m = onnx.load(str(path), load_external_data=False)
    for t in m.graph.initializer:
        for e in t.external_data:
            if e.key == "location":
                e.value = "../../etc/passwd"
    onnx.save(m, str(path))
    with pytest.raises(UserInputError, match="not a file next to the model"):
        external_data_files(path)
    assert_one_line_error(run(["tune", str(path), "--budget", "2", "--space", "ort"], home), 2)
