"""edgetune pack / repro check (docs/repro.md): a real tune of the bundled mobilenet on the local device,
packed, re-run from the package, a tampered package refused, the Dockerfile's set-up steps run
(reusing this virtualenv), bad inputs refused with one line and nothing left behind."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from edgetune import __version__
from edgetune.db import Store
from edgetune.pack import PACK_SCHEMA, REPRO_SCHEMA, REPRODUCE_FRACTION, _model_file, package_verdict, reproduced

EDGETUNE = [sys.executable, "-m", "edgetune.cli.main"]
QUICK = ["--budget", "3", "--rounds", "2", "--finalists", "1", "--max-candidates", "1", "--space", "ort"]


def run(args, home, timeout=300):
    env = {**os.environ, "EDGETUNE_HOME": str(home), "COLUMNS": "200"}
    env.pop("EDGETUNE_DB", None)
    return subprocess.run(EDGETUNE + [str(a) for a in args], capture_output=True, text=True, timeout=timeout, env=env)


def one_line_error(p, code=None):
    assert p.returncode != 0, p.stdout
    if code is not None:
        assert p.returncode == code, (p.returncode, p.stderr)
    assert "Traceback" not in p.stderr + p.stdout
    lines = [x for x in p.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), p.stderr
    return lines[0]


def leftovers(parent: Path, name: str) -> list[str]:
    return [p.name for p in parent.iterdir() if p.name == name or p.name.startswith(f".{name}.tmp-")] \
        if parent.is_dir() else []


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    """One real tune (bundled mobilenet, local, ~10 s) and its package."""
    base = tmp_path_factory.mktemp("pack")
    home, db = base / "home", base / "t.db"
    p = run(["tune", "mobilenet", *QUICK, "--db", db, "--format", "json"], home)
    assert p.returncode == 0, p.stderr
    run_id = json.loads(p.stdout)["runs"][0]["run_id"]
    pkg = base / "pkg"
    p = run(["pack", run_id, "-o", pkg, "--db", db], home)
    assert p.returncode == 0, p.stderr
    return {"home": home, "db": db, "run_id": run_id, "pkg": pkg, "base": base}


def test_manifest_holds_the_run_and_every_sample(tuned):
    pkg = tuned["pkg"]
    for f in ("manifest.json", "Dockerfile", "setup.sh", "README.md", "edgetune-src.tar.gz"):
        assert (pkg / f).is_file(), f
    m = json.loads((pkg / "manifest.json").read_text())
    assert m["schema"] == PACK_SCHEMA and m["edgetune"]["version"] == __version__
    (model,) = m["models"]
    assert model["name"] == "mobilenet.onnx"
    assert hashlib.sha256((pkg / model["file"]).read_bytes()).hexdigest() == model["sha256"]
    assert model["generator"]["bundled"] == "mobilenet" and "python -m models build" in model["generator"]["command"]
    (r,) = m["runs"]
    assert r["run_id"] == tuned["run_id"] and r["kind"] == "tune" and r["device"] == "local"
    assert r["fingerprint_key"] and r["fingerprint"]["cores"] >= 1 and r["versions"]["device_runtimes"]["onnxruntime"]
    assert r["command"].startswith("edgetune tune mobilenet") and "--budget 3" in r["command"]
    assert r["points"] == [{"batch": 1}] and r["seed"] == 0
    (s,) = r["shapes"]
    assert s["selected"] and s["default"] and s["baseline"]
    keys = {c["candidate"]["key"] for c in s["candidates"]}
    assert {s["selected"], s["default"], s["baseline"]} <= keys
    for c in s["candidates"]:
        assert c["candidate"]["backend"] == "ort" and "params" in c["candidate"] and c["status"] in ("verified", "failed")
    if s["contender"]:
        ratio = s["confirmation"]["speedup_vs_best_baseline"]
        assert ratio["ci95"][0] <= ratio["speedup"] <= ratio["ci95"][1]
    # every record and every sample of the database is in the package
    store = Store(tuned["db"], create=False)
    try:
        want = {(x.shape_key, x.candidate_key, x.round, x.status, tuple(int(v) for v in x.samples_ns))
                for x in store.records(run_id=tuned["run_id"])}
    finally:
        store.close()
    got = {(x["shape_key"], x["candidate_key"], x["round"], x["status"], tuple(x["samples_ns"])) for x in r["records"]}
    assert got == want and sum(len(w[4]) for w in want) > 0
    df = (pkg / "Dockerfile").read_text()
    assert df.startswith("FROM debian:12") and "setup.sh" in df and "ENTRYPOINT" in df and "repro" in df


def test_repro_check_round_trip(tuned):
    p = run(["repro", "check", tuned["pkg"], "-d", "local", "--format", "json", "--rounds", "3", "--budget", "8"],
            tuned["base"] / "home2")
    assert p.returncode in (0, 1), p.stderr
    res = json.loads(p.stdout)
    assert res["schema"] == REPRO_SCHEMA and res["device"] == "local" and res["same_device"] is True
    figs = res["figures"]
    assert figs and any(f["unit"] == "ms" for f in figs)
    for f in figs:
        assert f["packed"] is not None and f["measured"] is not None and f["device"] == "same device"
        assert f["reproduced"] == reproduced(f["packed"], f["packed_ci95"], f["measured"], f["measured_ci95"])
    # every measured configuration verified on the recorded seed and on a fresh one
    seeds = {(v["candidate"], v["seed_source"]) for v in res["verifications"]}
    assert {src for _, src in seeds} == {"recorded", "fresh"}
    assert all(v["ok"] for v in res["verifications"]), res["verifications"]
    fresh = {v["seed"] for v in res["verifications"] if v["seed_source"] == "fresh"}
    assert 0 not in fresh
    v = res["verdict"]
    assert v["figures"] == len(figs) and v["reproduced_figures"] == sum(f["reproduced"] for f in figs)
    assert v["ok"] == (v["reproduced_figures"] / v["figures"] >= REPRODUCE_FRACTION)
    assert p.returncode == (0 if v["ok"] else 1)


def test_reproduced_rule_on_synthetic_figures():
    assert reproduced(10.0, [9.9, 10.1], 10.4, [10.35, 10.45])  # +4%: within 5%
    assert not reproduced(10.0, [9.9, 10.1], 10.6, [10.55, 10.65])  # +6%, disjoint intervals
    assert reproduced(10.0, [9.0, 11.0], 10.9, [10.5, 11.5])  # +9%, intervals overlap
    assert reproduced(2.0, None, 1.95, None)  # no intervals: 5% alone
    assert not reproduced(2.0, None, 1.8, [1.7, 1.9])
    assert not reproduced(None, None, 1.0, [0.9, 1.1])

    def figs(k, n):
        return [{"reproduced": i < k} for i in range(n)]

    assert package_verdict(figs(19, 20), True)["ok"]  # 95%
    assert not package_verdict(figs(18, 20), True)["ok"]  # 90%
    assert not package_verdict(figs(20, 20), False)["ok"]  # a verification failed
    assert not package_verdict([], True)["ok"]  # nothing compared: nothing reproduced


def test_tampered_package_is_refused(tuned, tmp_path):
    pkg = tmp_path / "tampered"
    shutil.copytree(tuned["pkg"], pkg)
    m = json.loads((pkg / "manifest.json").read_text())
    model = pkg / m["models"][0]["file"]
    model.write_bytes(model.read_bytes() + b"\0")
    p = run(["repro", "check", pkg, "-d", "local"], tmp_path / "home")
    line = one_line_error(p, 2)
    assert "sha256" in line


def test_no_models_package_rebuilds_the_bundled_model(tuned, tmp_path):
    out = tmp_path / "nomodels"
    p = run(["pack", tuned["run_id"], "-o", out, "--db", tuned["db"], "--no-models"], tuned["home"])
    assert p.returncode == 0, p.stderr
    assert list((out / "models").iterdir()) == []
    (entry,) = json.loads((out / "manifest.json").read_text())["models"]
    assert entry["file"] is None and entry["generator"]["bundled"] == "mobilenet"
    work = tmp_path / "work"
    work.mkdir()
    assert hashlib.sha256(_model_file(out, entry, work).read_bytes()).hexdigest() == entry["sha256"]


def test_package_setup_sh_reusing_a_virtualenv(tuned, tmp_path):
    """The Dockerfile's RUN step (setup.sh) in a fresh directory, reusing this virtualenv instead of
    apt + a new one (the full path needs root on Debian 12: docs/repro.md)."""
    dest = tmp_path / "opt-edgetune"
    env = {**os.environ, "EDGETUNE_SRC_DIR": str(dest), "EDGETUNE_REUSE_VENV": sys.prefix,
           "EDGETUNE_HOME": str(tmp_path / "home")}
    p = subprocess.run(["bash", str(tuned["pkg"] / "setup.sh")], capture_output=True, text=True, env=env,
                       timeout=120, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    launcher = dest / "bin" / "edgetune-repro"
    assert (dest / "edgetune" / "pack.py").is_file() and (dest / "tools" / "setup.sh").is_file()
    v = subprocess.run([str(launcher), "--version"], capture_output=True, text=True, env=env, timeout=60, cwd=tmp_path)
    assert v.stdout.strip() == __version__
    where = subprocess.run([str(launcher), "repro", "check", "--help"],
                           capture_output=True, text=True, env=env, timeout=60, cwd=tmp_path)
    assert where.returncode == 0, where.stderr
    src = subprocess.run(["bash", "-c", f"grep -o 'PYTHONPATH=\"[^$]*' {launcher}"], capture_output=True, text=True)
    assert str(dest) in src.stdout
    # a wrong virtualenv is one clear line, non-zero
    bad = subprocess.run(["bash", str(tuned["pkg"] / "setup.sh")], capture_output=True, text=True, timeout=60,
                         env={**env, "EDGETUNE_SRC_DIR": str(tmp_path / "other"),
                              "EDGETUNE_REUSE_VENV": str(tmp_path / "novenv")})
    assert bad.returncode != 0 and "EDGETUNE_REUSE_VENV" in bad.stderr


def test_bad_inputs_are_one_line_and_leave_nothing(tuned, tmp_path):
    home, db, rid = tuned["home"], tuned["db"], tuned["run_id"]
    out = tmp_path / "p"
    one_line_error(run(["pack", "deadbeef", "-o", out, "--db", db], home), 2)
    assert leftovers(tmp_path, "p") == []
    blocker = tmp_path / "afile"
    blocker.write_text("x")
    one_line_error(run(["pack", rid, "-o", blocker / "p", "--db", db], home), 2)
    one_line_error(run(["pack", rid, "-o", "/proc/edgetune-pack-test", "--db", db], home), 2)
    assert not os.path.exists("/proc/edgetune-pack-test")
    one_line_error(run(["pack", rid, "-o", tuned["pkg"], "--db", db], home), 2)  # exists: never overwritten
    one_line_error(run(["pack", rid, "-o", out, "--db", tmp_path / "none.db"], home))
    garbage = tmp_path / "garbage.db"
    garbage.write_bytes(b"not a database" * 100)
    one_line_error(run(["pack", rid, "-o", out, "--db", garbage], home))
    assert leftovers(tmp_path, "p") == []
    one_line_error(run(["repro", "check", tmp_path / "missing", "-d", "local"], home), 2)
    # a run of another kind (a bench) is refused with one line
    other = tmp_path / "other.db"
    shutil.copyfile(db, other)
    store = Store(other)
    try:
        store.start_run("bench-x", "m.onnx", "0" * 64, "local", "fp", {}, {}, {"kind": "bench"})
        store.release_run("bench-x", "complete")
    finally:
        store.close()
    line = one_line_error(run(["pack", "bench-x", "-o", out, "--db", other], home), 2)
    assert "bench" in line and leftovers(tmp_path, "p") == []
