"""tools/gpu/zoo_cuda.py, the zoo's CUDA column for a lent GPU machine: its three steps end to end,
with the CPU provider standing in for CUDA (no GPU here). The device step never sees a reference;
the host's float64 check catches a wrong output and names a provider that is not there."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np

TOOL = Path(__file__).resolve().parents[2] / "tools" / "gpu" / "zoo_cuda.py"


def _run(*args):
    return subprocess.run([sys.executable, str(TOOL), *map(str, args)], capture_output=True, text=True, timeout=300)


def test_prepare_run_verify_and_a_wrong_output(tmp_path):
    src, out = tmp_path / "carry", tmp_path / "out"
    assert _run("prepare", src, "mobilenetv3").returncode == 0
    manifest = json.loads((src / "manifest.json").read_text())
    assert [m["name"] for m in manifest["models"]] == ["mobilenetv3"]
    assert not list(src.rglob("*ref*"))  # references stay here: the carried folder holds inputs only
    p = _run("run", src, out, "--provider", "CPUExecutionProvider")
    assert p.returncode == 0, p.stderr
    p = _run("verify", src, out, "--markdown", tmp_path / "col.md")
    assert p.returncode == 0, p.stdout + p.stderr
    row = (tmp_path / "col.md").read_text().splitlines()[-1]
    assert "| mobilenetv3 | batch=1 | pass (" in row and " of " in row

    res = json.loads((out / "results.json").read_text())
    f = out / res["models"][0]["outputs"][1][0]
    a = np.load(f)
    np.save(f, a + np.float32(0.1) * np.abs(a).max())  # one input set's output off
    p = _run("verify", src, out)
    assert p.returncode == 1 and "wrong-output" in p.stdout

    # a provider the machine does not have is n/a, with what it has
    p = _run("run", src, tmp_path / "out2", "--provider", "NoSuchExecutionProvider")
    assert p.returncode == 0
    p = _run("verify", src, tmp_path / "out2")
    assert "n/a: NoSuchExecutionProvider not in this onnxruntime" in p.stdout
