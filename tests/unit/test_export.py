"""edgetune export / export check (docs/export.md) on the local device: a real tune of the bundled
mobilenet exported for Linux, checked through the artifact's own C loader, and every way an
artifact can be wrong refused: an altered, missing or extra file, a device it was not tuned on, an
execution provider the runtime lacks, golden outputs the session does not reproduce. The farm's
three devices, and a device an artifact was not tuned on, are in tests/farm/test_export_farm.py."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from edgetune.export import CONFIG_SCHEMA, EXPORT_SCHEMA
from edgetune.hashing import sha256_file
from tests.conftest import require

EDGETUNE = [sys.executable, "-m", "edgetune.cli.main"]
QUICK = ["--budget", "3", "--rounds", "2", "--finalists", "1", "--max-candidates", "2", "--space", "ort"]


def run(args, home, timeout=300):
    env = {**os.environ, "EDGETUNE_HOME": str(home), "COLUMNS": "200"}
    env.pop("EDGETUNE_DB", None)
    env.pop("ANDROID_NDK_HOME", None)
    env.pop("ANDROID_NDK_ROOT", None)
    return subprocess.run(EDGETUNE + [str(a) for a in args], capture_output=True, text=True, timeout=timeout, env=env)


def one_line_error(p):
    assert p.returncode != 0, p.stdout
    assert "Traceback" not in p.stderr + p.stdout
    lines = [x for x in p.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), p.stderr
    return lines[0]


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    """One real tune (bundled mobilenet, local) and its Linux export."""
    require(shutil.which("aarch64-linux-gnu-gcc") is not None, "aarch64-linux-gnu-gcc (apt-get install gcc-aarch64-linux-gnu)")
    base = tmp_path_factory.mktemp("export")
    home, db = base / "home", base / "t.db"
    p = run(["tune", "mobilenet", *QUICK, "--db", db, "--format", "json"], home)
    assert p.returncode == 0, p.stderr
    run_id = json.loads(p.stdout)["runs"][0]["run_id"]
    art = base / "art"
    p = run(["export", run_id, "--target", "linux", "-o", art, "--db", db], home)
    assert p.returncode == 0, p.stderr
    assert "artifact written" in p.stdout
    return {"home": home, "db": db, "run_id": run_id, "art": art, "base": base}


def _json(path: Path) -> dict:
    return json.loads(path.read_text())


def test_artifact_layout_manifest_and_config(tuned):
    art = tuned["art"]
    m = _json(art / "manifest.json")
    assert m["schema"] == EXPORT_SCHEMA and m["target"] == "linux" and m["runs"] == [tuned["run_id"]]
    # every file but the manifest is listed with its sha256
    on_disk = {str(p.relative_to(art)) for p in art.rglob("*") if p.is_file()} - {"manifest.json"}
    assert set(m["files"]) == on_disk
    assert all(sha256_file(art / f) == h for f, h in m["files"].items())
    cfg = _json(art / "config.json")
    assert cfg["schema"] == CONFIG_SCHEMA
    (dev,) = cfg["devices"]
    assert dev["name"] == "local" and dev["fingerprint"]["arch"] == os.uname().machine
    sel = dev["selected"][0]
    chosen = cfg["configs"][sel["config"]]
    # an x86_64 device gets the ONNX model (its layout optimizer is CPU-specific); the fallback ORT format
    assert chosen["model_form"] == "onnx" and chosen["model"].endswith(".onnx")
    fb = cfg["configs"][cfg["fallback"]["config"]]
    assert fb["model_form"] == "ort" and fb["model"].endswith(".ort")
    req = (art / "models" / "required_operators.config").read_text()
    assert "ai.onnx;" in req and "Conv" in req and str(tuned["base"]) not in req and ".tmp-" not in req
    # the figure behind the selection: the run, the median and its interval
    (fig,) = [f for f in m["figures"] if f["shape_key"] == sel["shape_key"]]
    assert fig["run_id"] == tuned["run_id"] and fig["median_ms"] > 0 and len(fig["ci95_ms"]) == 2
    # inputs, outputs, golden files and their tolerances
    (shape,) = cfg["shapes"]
    assert shape["inputs"][0]["shape"] == list(np.load(art / shape["golden"]["inputs"][0]).shape)
    assert shape["golden"]["tolerance"][0]["atol"] > 0
    # loaders for both Linux ABIs, the header and the Kotlin source
    assert set(m["loaders"]["built"]) == {"x86_64-linux-gnu", "aarch64-linux-gnu"}
    for b in m["loaders"]["built"].values():
        assert (art / b["library"]).is_file() and os.access(art / b["check"], os.X_OK)
    assert (art / "include" / "edgetune_loader.h").is_file()
    assert (art / "kotlin" / "dev" / "edgetune" / "EdgetuneSession.kt").is_file()


def test_check_on_the_local_device_runs_it_through_the_c_loader(tuned):
    p = run(["export", "check", tuned["art"], "-d", "local", "--format", "json", "--budget-ms", "200"], tuned["home"])
    assert p.returncode == 0, p.stdout + p.stderr
    res = json.loads(p.stdout)
    assert res["ok"] and res["known_device"] == "local" and res["abi"] == "x86_64-linux-gnu"
    (s,) = res["shapes"]
    assert s["loader_match"] == "exact" and s["loader_device"] == "local" and s["loader_config"] == s["config"]
    assert s["loader_selftest"]["ok"] and s["host_verification"]["ok"]
    assert s["placement"]["intended"] == "CPUExecutionProvider" and s["placement_share"] == 1.0
    assert sum(s["placement"]["nodes"].values()) > 5  # mobilenet's nodes, each one placed
    lat = s["latency"]
    assert lat["n"] >= 20 and lat["median_ms"] > 0 and lat["manifest_median_ms"] > 0 and "gap" in lat
    # the table form says what it found
    p = run(["export", "check", tuned["art"], "-d", "local", "--budget-ms", "100"], tuned["home"])
    assert p.returncode == 0 and "PASSED" in p.stdout and "exact" in p.stdout


@pytest.fixture
def copy(tuned, tmp_path):
    dst = tmp_path / "art"
    shutil.copytree(tuned["art"], dst)
    return dst


def test_an_altered_file_is_refused(tuned, copy):
    model = next(p for p in (copy / "models").iterdir() if p.suffix == ".onnx")
    data = bytearray(model.read_bytes())
    data[-10] ^= 0xFF
    model.write_bytes(bytes(data))
    err = one_line_error(run(["export", "check", copy, "-d", "local"], tuned["home"]))
    assert f"file models/{model.name} is altered" in err


def test_a_missing_or_extra_file_is_refused(tuned, copy):
    (copy / "golden" / "s0" / "output_0.npy").unlink()
    err = one_line_error(run(["export", "check", copy, "-d", "local"], tuned["home"]))
    assert "file golden/s0/output_0.npy is missing" in err
    shutil.copytree(tuned["art"], copy, dirs_exist_ok=True)
    (copy / "models" / "planted.so").write_bytes(b"\x7fELF")
    err = one_line_error(run(["export", "check", copy, "-d", "local"], tuned["home"]))
    assert "file models/planted.so is not in the manifest" in err


# ---- the loader itself, as an app meets it (no manifest: config.json and the files only) ----

def _check(art: Path, *extra: str) -> dict:
    m = _json(art / "manifest.json")
    b = m["loaders"]["built"]["x86_64-linux-gnu"]
    import onnxruntime

    ort_lib = sorted((Path(onnxruntime.__file__).parent / "capi").glob("libonnxruntime.so*"))[0]
    out = art / "out"
    out.mkdir(exist_ok=True)
    p = subprocess.run([str(art / b["check"]), "--loader", str(art / b["library"]), "--artifact", str(art),
                        "--ort-lib", str(ort_lib), "--out", str(out), "--iters", "3", "--budget-ms", "0", *extra],
                       capture_output=True, text=True, timeout=120)
    doc = json.loads(p.stdout.strip().splitlines()[-1])
    assert p.returncode == (2 if doc.get("error") else 0)
    return doc


def _edit_config(art: Path, fn) -> dict:
    cfg = _json(art / "config.json")
    fn(cfg)
    (art / "config.json").write_text(json.dumps(cfg))
    return cfg


def test_loader_refuses_a_model_that_is_not_the_one_config_json_names(copy):
    cfg = _json(copy / "config.json")
    chosen = cfg["configs"][cfg["devices"][0]["selected"][0]["config"]]
    (copy / chosen["model"]).write_bytes((copy / chosen["model"]).read_bytes()[:-1] + b"\0")
    doc = _check(copy)
    assert "is altered" in doc["error"] and chosen["model"] in doc["error"]
    doc = _check(copy, "--min-match", "fallback")  # the same device: still its own (altered) configuration
    assert "is altered" in doc["error"]


def test_loader_matches_exact_hardware_or_fallback(copy):
    doc = _check(copy, "--min-match", "exact")
    assert doc["match"] == "exact" and doc["selftest"]["ok"]
    _edit_config(copy, lambda c: c["devices"][0]["fingerprint"].update(kernel="0.0.1-other"))
    doc = _check(copy, "--min-match", "exact")
    assert "matches none of the artifact's devices at the 'exact' level (best: hardware)" in doc["error"]
    doc = _check(copy, "--min-match", "hardware")
    assert doc["match"] == "hardware" and doc["device"] == "local" and doc["config"]["id"].startswith("c-")
    _edit_config(copy, lambda c: c["devices"][0]["fingerprint"].update(cpu_model="Some Other CPU"))
    doc = _check(copy)
    assert doc["match"] == "fallback" and doc["config"]["id"] == "fallback" and doc["selftest"]["ok"]


def test_loader_says_when_the_runtime_lacks_the_execution_provider(copy):
    def xnnpack(c):
        sel = c["devices"][0]["selected"][0]["config"]
        c["configs"][sel]["execution_provider"] = "XnnpackExecutionProvider"
    _edit_config(copy, xnnpack)
    doc = _check(copy)
    # onnxruntime's own word (the wheel's CPU build has no XNNPACK), under onnxruntime's name for it
    assert doc["error"].startswith("onnxruntime XnnpackExecutionProvider:") and "XNNPACK" in doc["error"], doc["error"]
    assert "not supported in this build" in doc["error"] or "not available" in doc["error"], doc["error"]
    _edit_config(copy, lambda c: c["configs"][c["devices"][0]["selected"][0]["config"]].update(
        execution_provider="MadeUpExecutionProvider"))
    assert "execution provider MadeUpExecutionProvider is not one the loader can append" in _check(copy)["error"]


def test_loader_refuses_below_min_match_when_the_device_was_not_tuned_at_that_shape(copy):
    _edit_config(copy, lambda c: c["devices"][0].update(selected=[]))
    doc = _check(copy, "--min-match", "exact")
    assert "matches 'local' at the 'exact' level, but that device was not tuned at shape point" in doc["error"]
    doc = _check(copy)  # an app takes the fallback there
    assert doc["match"] == "fallback" and doc["config"]["id"] == "fallback" and doc["selftest"]["ok"]


def _rehash(art: Path, key: str) -> None:
    """Rewrite the manifest after a deliberate change (an artifact made that way): the device's new
    fingerprint key and every file's sha256."""
    m = _json(art / "manifest.json")
    for entry in m["figures"] + m["devices"]:
        entry["fingerprint_key"] = key
    m["files"] = {f: sha256_file(art / f) for f in m["files"]}
    (art / "manifest.json").write_text(json.dumps(m))


def test_check_accepts_the_same_hardware_with_another_kernel(tuned, copy):
    # an artifact tuned on this machine under an older kernel: the same CPU, another fingerprint key
    def older_kernel(c):
        d = c["devices"][0]
        d["fingerprint"]["kernel"] = "5.10.0-old"
        d["fingerprint_key"] = "0000aaaa1111bbbb"
    _edit_config(copy, older_kernel)
    _rehash(copy, "0000aaaa1111bbbb")
    p = run(["export", "check", copy, "-d", "local", "--format", "json", "--budget-ms", "100"], tuned["home"])
    assert p.returncode == 0, p.stdout + p.stderr
    res = json.loads(p.stdout)
    (s,) = res["shapes"]
    assert res["match"] == "hardware" and res["known_device"] == "local"
    assert s["loader_match"] == "hardware" and s["config"].startswith("c-") and s["host_verification"]["ok"]
    assert "another kernel" in s["latency"]["note"]


def test_loader_golden_check_fails_on_outputs_that_differ(copy):
    g = copy / "golden" / "s0" / "output_0.npy"
    ref = np.load(g)
    np.save(g, (ref * 1.01 + 0.01).astype(ref.dtype))
    doc = _check(copy, "--placement")
    assert doc["selftest"]["ok"] is False and doc["selftest"]["outputs"][0]["worst_ratio"] > 1
    assert doc["placement"]["nodes"]["CPUExecutionProvider"] > 0


# ---- android, and bad input ----

def test_android_export_without_the_ndk_says_so(tuned):
    out = tuned["base"] / "android"
    p = run(["export", tuned["run_id"], "--target", "android", "-o", out, "--db", tuned["db"]], tuned["home"])
    assert p.returncode == 0, p.stderr
    assert p.stdout.count("NOT BUILT: ANDROID_NDK_HOME is not set") == 2
    m = _json(out / "manifest.json")
    assert m["app_dir"] == "assets/edgetune" and not m["loaders"]["built"]
    assert set(m["loaders"]["not_built"]) == {"arm64-v8a", "x86_64"}
    assert (out / "assets" / "edgetune" / "config.json").is_file()
    assert (out / "kotlin" / "dev" / "edgetune" / "EdgetuneSession.kt").is_file()
    assert not (out / "jniLibs").exists()
    err = one_line_error(run(["export", "check", out, "-d", "local"], tuned["home"]))
    assert "has no loader for local's architecture" in err and "ANDROID_NDK_HOME" in err


def test_bad_input_gets_one_line_and_leaves_nothing(tuned, tmp_path):
    home, db = tuned["home"], tuned["db"]
    err = one_line_error(run(["export", "feedbeef", "--target", "linux", "-o", tmp_path / "a", "--db", db], home))
    assert "unknown run id 'feedbeef'" in err
    err = one_line_error(run(["export", tuned["run_id"], "--target", "ios", "-o", tmp_path / "a", "--db", db], home))
    assert "--target must be one of android, linux" in err
    err = one_line_error(run(["export", tuned["run_id"], "--target", "linux", "-o", tuned["art"], "--db", db], home))
    assert "already exists" in err
    err = one_line_error(run(["export", tuned["run_id"], "--target", "linux", "-o", tmp_path / "no" / "a",
                              "--db", db], home))
    assert "does not exist" in err
    p = run(["export", "--target", "linux", "-o", tmp_path / "opts-first", tuned["run_id"], "--db", db,
             "--abi", "x86_64-linux-gnu"], home)  # options before the run ids work too
    assert p.returncode == 0, p.stderr
    shutil.rmtree(tmp_path / "opts-first")
    err = one_line_error(run(["export", "check", tmp_path / "nothing", "-d", "local"], home))
    assert "not found" in err
    err = one_line_error(run(["export", "check", tuned["art"], "-d", "nosuch"], home))
    assert "unknown device 'nosuch'" in err
    assert list(tmp_path.iterdir()) == []


def test_loader_loads_no_file_whose_sha256_config_json_does_not_list(copy):
    def unlisted(c):
        sel = c["devices"][0]["selected"][0]["config"]
        c["configs"][sel]["model"] = c["configs"]["fallback"]["model"]  # a file, but not this configuration's
    _edit_config(copy, unlisted)
    doc = _check(copy)
    assert "its model is not among the files whose sha256 config.json lists" in doc["error"]
    _edit_config(copy, lambda c: c["configs"]["fallback"].update(model="../../etc/passwd"))
    _edit_config(copy, lambda c: c["devices"][0]["fingerprint"].update(cpu_model="Some Other CPU"))
    doc = _check(copy)
    assert "outside the artifact" in doc["error"] or "not among the files" in doc["error"], doc["error"]
