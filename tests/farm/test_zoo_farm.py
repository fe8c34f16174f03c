"""`edgetune zoo check --size small` over the three farm devices: this host (x86-64), the qemu aarch64
board (native agent; onnxruntime's own aarch64 library) and the adb phone (native agent, no Python).
Every cell passes or names a real failure mode; every model runs on onnxruntime on every device
against the independent float64 reference."""

from __future__ import annotations

import json
import shutil

import pytest

from edgetune.devices.inventory import Inventory
from edgetune.zoo import check, html_matrix, markdown
from tests.conftest import require, share_conversions

pytestmark = pytest.mark.usefixtures("private_edgetune_home")

MODES = {"pass", "n/a", "unsupported-op", "mismatch", "crash", "timeout", "out-of-memory", "build-failed", "error"}


def test_zoo_check_small_on_three_farm_devices(qemu_board, adb_farm, tmp_path, conversions):
    share_conversions(tmp_path / "home", conversions)  # (the private home's onnx2tf cache)
    require(shutil.which("aarch64-linux-gnu-gcc") is not None, "aarch64-linux-gnu-gcc")
    import models.zoo as zoo

    assert len(zoo.available()) == 10, zoo.available()
    inv = Inventory(tmp_path / "devices.toml")
    inv.add("host", "local", workdir=str(tmp_path / "wd"))
    b = qemu_board
    inv.add("board", f"ssh://{b['user']}@{b['host']}:{b['port']}", key=b["key"], known_hosts=b["known_hosts"],
            workdir=f"{b['home']}/edgetune-zoo")
    inv.add("phone", f"adb://{adb_farm.phone.serial}@{adb_farm.adb_host}:{adb_farm.adb_port}",
            workdir="/data/local/tmp/edgetune-zoo")
    # TVM on two models only (a pass and the importer's failure): its builds dominate the run's time
    # LiteRT likewise (its conversions take seconds to minutes each): a pass and a named conversion failure
    doc = check([], "small", ["host", "board", "phone"], inventory=inv, budget_ms=5.0, tvm=["resnet50", "bert_base"],
                litert=["mobilenetv3", "vit_b16"])
    print(markdown(doc))
    cells = doc["cells"]
    assert {c["status"] for c in cells} <= MODES
    bad = [c for c in cells if c["status"] in ("error", "crash", "timeout", "mismatch")]
    assert not bad, json.dumps(bad, indent=1)[:3000]
    # onnxruntime on every device: all ten architectures pass against the float64 reference
    for dev in ("host", "board", "phone"):
        ort = {c["model"]: c for c in cells if c["device"] == dev and c["runtime"] == "onnxruntime"}
        assert set(ort) == set(zoo.ZOO) and all(c["status"] == "pass" for c in ort.values()), \
            {m: (c["status"], c["reason"][:100]) for m, c in ort.items() if c["status"] != "pass"}
        assert all(c["max_rel_err"] is not None and c["max_rel_err"] < 1e-3 for c in ort.values())
    # every n/a says why; every failure says what failed
    assert all(c["reason"] for c in cells if c["status"] != "pass")
    lite = {c["model"]: c for c in cells if c["device"] == "host" and c["runtime"].startswith("LiteRT")}
    assert lite["mobilenetv3"]["status"] == "pass", lite["mobilenetv3"]
    assert lite["vit_b16"]["status"] == "build-failed" and "Select TensorFlow" in lite["vit_b16"]["reason"]
    assert all("native agent" in c["reason"] or "no tflite runtime" in c["reason"]
               for c in cells if c["device"] != "host" and c["runtime"].startswith("LiteRT"))
    tvm = {c["model"]: c["status"] for c in cells if c["device"] == "host" and c["runtime"].startswith("TVM")}
    assert tvm["resnet50"] == "pass" and tvm["bert_base"] == "build-failed" and tvm["gpt2"] == "n/a"
    # the board is emulated and reports the aarch64 onnxruntime it ran
    board = next(d for d in doc["devices"] if d["device"] == "board")
    assert board["arch"] == "aarch64" and board["emulated"]
    assert all(c["runtime_version"] for c in cells if c["device"] == "board" and c["status"] == "pass")
    page = html_matrix(doc)
    assert page.count("<tr>") == 11 and "onnx.reference" in page
