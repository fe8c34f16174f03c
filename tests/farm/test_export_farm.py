"""Issue 12's acceptance: a tune on the farm's three devices (this machine, the qemu aarch64 board
and the adb phone, the last two without Python) exported for Linux, and the export passing
``edgetune export check`` on each of them through its C loader: on the board the aarch64 loader
and onnxruntime 1.20.1's aarch64 library run the ORT-format model under qemu. An artifact of the
phone alone is refused on the board (another fingerprint) unless its fallback is asked for."""

from __future__ import annotations

import json
import shutil

import pytest

from edgetune.devices.inventory import Inventory
from edgetune.export import export
from edgetune.export.check import export_check
from edgetune.tune import tune
from edgetune.tune_config import TuneConfig
from edgetune.errors import UserInputError
from tests.conftest import require
from tests.fixtures.tiny import build_tiny


@pytest.fixture(scope="module")
def farm_tune(qemu_board, adb_farm, tmp_path_factory):
    require(shutil.which("aarch64-linux-gnu-gcc") is not None, "aarch64-linux-gnu-gcc (apt-get install gcc-aarch64-linux-gnu)")
    base = tmp_path_factory.mktemp("export-farm")
    mp = pytest.MonkeyPatch()
    mp.setenv("EDGETUNE_HOME", str(base / "home"))
    inv = Inventory(base / "devices.toml")
    inv.add("board", f"ssh://{qemu_board['user']}@{qemu_board['host']}:{qemu_board['port']}", key=qemu_board["key"],
            known_hosts=qemu_board["known_hosts"], workdir=f"{qemu_board['home']}/edgetune-export")
    phone = adb_farm.phone
    inv.add("phone", f"adb://{phone.serial}@{adb_farm.adb_host}:{adb_farm.adb_port}")
    model = build_tiny(base / "tiny.onnx")
    cfg = TuneConfig(budget_s=2, rounds=1, finalists=1, timeout_s=60, spaces=("ort",), max_candidates=2, retries=1)
    out = tune(model, ["local", "board", "phone"], db=base / "t.db", config=cfg, inventory=inv)
    assert [d.status for d in out.devices] == ["complete"] * 3, [d.error for d in out.devices]
    runs = {d.device: d.run_id for d in out.devices}
    art = base / "art"
    export(list(runs.values()), "linux", art, db=str(base / "t.db"))
    yield {"inv": inv, "runs": runs, "art": art, "base": base}
    mp.undo()


@pytest.mark.parametrize("device", ["local", "board", "phone"])
def test_export_passes_check_on_every_farm_device(farm_tune, device):
    res = export_check(str(farm_tune["art"]), device, inventory=farm_tune["inv"], iters=5, budget_ms=50)
    print(json.dumps(res, indent=1)[:3000])
    assert res["ok"], [s.get("problems") or s.get("error") for s in res["shapes"]]
    assert res["known_device"] == device
    (s,) = res["shapes"]
    assert s["loader_match"] == "exact" and s["loader_device"] == device
    assert s["loader_selftest"]["ok"] and s["host_verification"]["ok"]
    assert s["placement"]["nodes"] == {"CPUExecutionProvider": sum(s["placement"]["nodes"].values())}
    cfg = json.loads((farm_tune["art"] / "config.json").read_text())
    chosen = cfg["configs"][s["config"]]
    if device == "board":  # ARM: the ORT-format model, run by onnxruntime 1.20.1 under qemu
        assert res["abi"] == "aarch64-linux-gnu" and res["emulated"] and chosen["model_form"] == "ort"
        assert s["onnxruntime"] == "1.20.1" and s["latency"]["gap"] is False  # emulated: never compared
    else:
        assert res["abi"] == "x86_64-linux-gnu" and not res["emulated"] and chosen["model_form"] == "onnx"
        assert s["latency"]["manifest_median_ms"] > 0 and isinstance(s["latency"]["gap"], bool)


def test_an_artifact_of_another_device_is_refused_unless_fallback(farm_tune):
    only_phone = farm_tune["base"] / "phone-only"
    export([farm_tune["runs"]["phone"]], "linux", only_phone, db=str(farm_tune["base"] / "t.db"))
    with pytest.raises(UserInputError, match="not one this artifact was tuned on, nor the same hardware .*phone"):
        export_check(str(only_phone), "board", inventory=farm_tune["inv"])
    res = export_check(str(only_phone), "board", inventory=farm_tune["inv"], fallback=True, iters=3, budget_ms=0)
    (s,) = res["shapes"]
    assert res["ok"] and res["known_device"] is None and s["config"] == "fallback" and s["loader_match"] == "fallback"
    assert s["onnxruntime"] == "1.20.1" and s["host_verification"]["ok"]
