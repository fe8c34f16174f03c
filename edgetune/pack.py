"""Reproduction packages: ``edgetune pack`` writes one, ``edgetune repro check`` re-runs it (docs/repro.md).

A package is a directory:
  manifest.json        schema edgetune.pack/1: versions, devices, the command, the model(s), shape
                       points, seeds, user inputs, every candidate with its verdict and every sample
                       of every round, the selected configuration per shape and its confirmation
  models/              the model file(s) (absent with --no-models: the manifest says how to rebuild)
  inputs/              user input files (--input name=file.npy) the runs were tuned with
  edgetune-src.tar.gz  the edgetune source the package was made with (git archive of HEAD)
  setup.sh             the steps the Dockerfile runs (EDGETUNE_REUSE_VENV: reuse a virtualenv)
  Dockerfile           FROM debian:12, runs setup.sh, ENTRYPOINT the repro command
  README.md            for the person receiving it

``repro check`` re-measures, for every shape point of every run, the selected configuration, the
onnxruntime default, the baseline it was confirmed against and the confirmation's contender in fresh
interleaved rounds (DeviceTuner.tune_shape, the machinery ``tune`` and ``bench`` use), verifies
every job on the recorded seed and each configuration once more on a fresh seed (api.verify_config,
as ``edgetune verify`` does), and compares each figure with the packed one: reproduced when within
±5% or when the 95% intervals overlap; the package reproduces when at least 95% of its figures do
and no verification failed.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import shutil
import subprocess
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any, Sequence

import numpy as np

import edgetune
from edgetune.accuracy import AccuracyBudget
from edgetune.api import fresh_seed, verify_config
from edgetune.candidate import Candidate
from edgetune.db import Store
from edgetune.devices.inventory import Inventory, device_identity
from edgetune.errors import EdgetuneError, UserInputError
from edgetune.hashing import sha256_file
from edgetune.measure import round_ratio
from edgetune.results import summarize_run
from edgetune.space import space_of
from edgetune.tune import DeviceTuner
from edgetune.tune_config import TuneConfig, run_versions
from edgetune.modelfile import load_model
from edgetune.workload import build_workload, load_user_inputs

PACK_SCHEMA = "edgetune.pack/1"
REPRO_SCHEMA = "edgetune.repro/1"
TOLERANCE = 0.05  # ±5% of the packed figure
REPRODUCE_FRACTION = 0.95  # of all figures, for the package to count as reproduced
PACK_ROOT = "/pack"  # where the Dockerfile puts the package
SRC_DEST = "/opt/edgetune"  # where setup.sh unpacks the source snapshot by default
SUPPORTED_KINDS = ("tune",)


# ---- helpers ----------------------------------------------------------------------------------

def _source_root() -> Path:
    return Path(edgetune.__file__).resolve().parent.parent


def git_commit(root: Path | None = None) -> str | None:
    root = root or _source_root()
    try:
        out = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                             timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 and out.stdout.strip() else None


def write_source_snapshot(dest: Path) -> dict[str, Any]:
    """edgetune's source as ``dest`` (.tar.gz): ``git archive`` of HEAD in a git checkout (committed
    files only), else the installed package's files."""
    root = _source_root()
    commit = git_commit(root) if (root / ".git").exists() else None
    if commit:
        st = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                            capture_output=True, text=True, timeout=60)
        dirty = bool(st.stdout.strip()) if st.returncode == 0 else None
        with open(dest, "wb") as f:
            res = subprocess.run(["git", "-C", str(root), "archive", "--format=tar.gz", commit], stdout=f,
                                 stderr=subprocess.PIPE, timeout=120)
        if res.returncode == 0:
            # dirty: the checkout had uncommitted changes to tracked files, which the snapshot lacks
            return {"source": "git archive", "commit": commit, "dirty": dirty, "sha256": sha256_file(dest)}
    with tarfile.open(dest, "w:gz") as tar:
        for name in ("edgetune", "models", "tools", "pyproject.toml", "README.md", "Makefile"):
            p = root / name
            if p.exists():
                tar.add(p, arcname=name, filter=lambda ti: None if "__pycache__" in ti.name else ti)
    return {"source": "installed package", "commit": None, "dirty": None, "sha256": sha256_file(dest)}


def bundled_generator(model_path: str, sha: str) -> dict[str, Any] | None:
    """For a bundled model (byte-reproducible), the command that rebuilds it, or None."""
    name = Path(model_path).stem
    try:
        import models
    except ImportError:
        return None
    if name not in getattr(models, "BUNDLED", ()):
        return None
    try:
        if hashlib.sha256(models.onnx_bytes(name)).hexdigest() != sha:
            return None
    except Exception:
        return None
    return {"bundled": name, "command": f"python -m models build --model {name} --out DIR",
            "file": f"{name}.onnx"}


def _user_inputs(command: str) -> dict[str, str]:
    """name -> file of every ``--input name=file`` in a recorded command."""
    try:
        words = shlex.split(command or "")
    except ValueError:
        return {}
    out = {}
    for i, w in enumerate(words):
        val = None
        if w == "--input" and i + 1 < len(words):
            val = words[i + 1]
        elif w.startswith("--input="):
            val = w.split("=", 1)[1]
        if val and "=" in val:
            name, path = val.split("=", 1)
            out[name] = path
    return out


def _stats_fig(stats: dict | None) -> tuple[float | None, list[float] | None]:
    if not stats:
        return None, None
    return stats["median_ms"], list(stats["ci95_ms"])


def _ratio_fig(r: dict | None) -> tuple[float | None, list[float] | None]:
    if not r:
        return None, None
    ci = r.get("ci95")
    return r["speedup"], (list(ci) if ci and ci[0] != ci[1] else None)  # one round or race: no interval


# ---- pack ---------------------------------------------------------------------------------------

def pack(run_ids: Sequence[str], out: str | os.PathLike, *, db: str | None = None, no_models: bool = False) -> Path:
    """Write the package of ``run_ids`` to ``out`` (a new directory), atomically."""
    if not run_ids:
        raise UserInputError("give at least one run id (see 'edgetune db ls')")
    out = check_new_dir(out, "package")
    store = Store(db, create=False) if db else Store(None, create=False)
    try:
        runs = []
        for rid in dict.fromkeys(run_ids):
            run = store.get_run(rid)
            if run is None:
                raise UserInputError(f"unknown run id '{rid}' in {store.path} (see 'edgetune db ls')")
            config = json.loads(run["config"] or "{}")
            kind = config.get("kind", "tune") if isinstance(config, dict) else "?"
            if kind not in SUPPORTED_KINDS:
                raise UserInputError(f"run {rid} is a '{kind}' run; only tune runs can be packed")
            runs.append((run, config, summarize_run(store, rid), store.records(run_id=rid)))
    finally:
        store.close()

    write_new_dir(out, "package", lambda tmp: _write(tmp, runs, no_models))
    return out


def check_new_dir(out: str | os.PathLike, what: str) -> Path:
    """``out`` as a directory to create: refused (one line) when it exists or its parent is missing
    or not writable."""
    out = Path(out)
    if os.path.lexists(out):
        raise UserInputError(f"output {out} already exists; give a new directory")
    parent = out.absolute().parent
    if not parent.is_dir():
        raise UserInputError(f"cannot write {what} {out}: directory {parent} does not exist")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise UserInputError(f"cannot write {what} {out}: directory {parent} is not writable")
    return out


def write_new_dir(out: Path, what: str, write: Any) -> Any:
    """``write(tmp)`` into a temporary directory next to ``out``, renamed to ``out`` when it returns:
    a failure leaves nothing behind. Returns what ``write`` returned."""
    try:
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.absolute().parent))
    except OSError as exc:
        raise UserInputError(f"cannot write {what} {out}: {exc.strerror or exc}") from None
    try:
        result = write(tmp)
        os.chmod(tmp, 0o755)
        os.rename(tmp, out)
    except BaseException as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(exc, OSError):
            raise UserInputError(f"cannot write {what} {out}: {exc.strerror or exc}") from None
        raise
    return result


def _write(tmp: Path, runs: list, no_models: bool) -> None:
    (tmp / "models").mkdir()
    models_by_sha: dict[str, dict[str, Any]] = {}
    inputs: dict[str, dict[str, Any]] = {}
    run_docs = []
    for run, config, summary, records in runs:
        sha = run["model_sha256"]
        if sha not in models_by_sha:
            src = Path(run["model_path"])
            gen = bundled_generator(str(src), sha)
            entry: dict[str, Any] = {"name": src.name, "recorded_path": str(src), "sha256": sha, "generator": gen,
                                     "file": None}
            if not no_models:
                if not src.is_file():
                    raise UserInputError(f"run {run['id']}: model file {src} is gone; rebuild it, or pack with "
                                         f"--no-models" + ("" if gen else " (not a bundled model: it cannot be "
                                                                        "regenerated)"))
                rel = f"models/{sha[:12]}-{src.name}"
                shutil.copyfile(src, tmp / rel)
                if sha256_file(tmp / rel) != sha:
                    raise UserInputError(f"run {run['id']}: model file {src} changed since the run "
                                         f"(sha256 differs from the recorded one)")
                entry["file"] = rel
            elif gen is None:
                raise UserInputError(f"run {run['id']}: --no-models needs a bundled model that can be "
                                     f"regenerated; {src.name} is not one")
            models_by_sha[sha] = entry
        run_inputs = {}
        for name, path in _user_inputs(config.get("command", "")).items():
            p = Path(path)
            if not p.is_file():
                raise UserInputError(f"run {run['id']}: user input {name}={path} is gone")
            digest = sha256_file(p)
            rel = f"inputs/{digest[:12]}-{name}.npy"
            if digest not in inputs:
                (tmp / "inputs").mkdir(exist_ok=True)
                shutil.copyfile(p, tmp / rel)
                inputs[digest] = {"file": rel, "sha256": digest}
            run_inputs[name] = {"file": rel, "sha256": digest, "recorded_path": path}
        sdict = summary.as_dict()
        shapes = []
        for s in sdict["shapes"]:
            conf = s.get("confirmation") or {}
            shapes.append({
                "shape": s["shape"], "shape_key": s["shape_key"], "workload_key": s["workload_key"],
                "selected": s["best"], "default": s["default"], "baseline": s["best_baseline"],
                "contender": conf.get("contender"), "confirmation": conf or None,
                "candidates": s["candidates"]})
        run_docs.append({
            "run_id": run["id"], "kind": config.get("kind", "tune"), "status": run["status"],
            "device": run["device"], "fingerprint_key": run["fingerprint_key"],
            "fingerprint": json.loads(run["fingerprint"]), "versions": json.loads(run["versions"]),
            "command": config.get("command", ""), "config": config, "model_sha256": sha,
            "points": config.get("points", [s["shape"] for s in sdict["shapes"]]),
            "seed": int(config.get("seed", 0)), "user_inputs": run_inputs, "shapes": shapes,
            "accuracy": config.get("accuracy") or {},
            "records": [{"id": r.id, "shape": r.shape, "shape_key": r.shape_key, "workload_key": r.workload_key,
                         "candidate_key": r.candidate_key, "candidate": r.candidate, "round": r.round,
                         "status": r.status, "reason": r.reason, "verdict": r.verdict,
                         "samples_ns": [int(x) for x in r.samples_ns], "wall_ms": r.wall_ms, "agent_ms": r.agent_ms}
                        for r in records]})
    src_info = write_source_snapshot(tmp / "edgetune-src.tar.gz")
    manifest = {
        "schema": PACK_SCHEMA, "created": time.time(),
        "edgetune": {"version": edgetune.__version__, "commit": src_info["commit"], "source": src_info},
        "repro_command": f"edgetune repro check {PACK_ROOT} -d local",
        "models": list(models_by_sha.values()), "runs": run_docs}
    (tmp / "manifest.json").write_text(json.dumps(manifest, indent=1, default=str) + "\n")
    (tmp / "setup.sh").write_text(SETUP_SH)
    os.chmod(tmp / "setup.sh", 0o755)
    (tmp / "Dockerfile").write_text(DOCKERFILE)
    (tmp / "README.md").write_text(_readme(manifest, no_models))


SETUP_SH = r"""#!/usr/bin/env bash
# The steps the Dockerfile runs (as root on Debian 12), runnable without Docker.
#   EDGETUNE_SRC_DIR     where to unpack edgetune's source snapshot (default /opt/edgetune)
#   EDGETUNE_REUSE_VENV  an existing virtualenv with edgetune's dependencies: reuse it instead of
#                        running the snapshot's tools/setup.sh (apt packages + a new virtualenv)
# Either way it writes $EDGETUNE_SRC_DIR/bin/edgetune-repro, a launcher of the snapshot's edgetune.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
DEST="${EDGETUNE_SRC_DIR:-/opt/edgetune}"
mkdir -p "$DEST"
tar -xzf "$HERE/edgetune-src.tar.gz" -C "$DEST"
mkdir -p "$DEST/bin"
want="$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["edgetune"]["version"])' "$HERE/manifest.json")"
if [ -n "${EDGETUNE_REUSE_VENV:-}" ]; then
  PY="$EDGETUNE_REUSE_VENV/bin/python"
  [ -x "$PY" ] || { echo "setup: EDGETUNE_REUSE_VENV=$EDGETUNE_REUSE_VENV has no bin/python" >&2; exit 1; }
  cat > "$DEST/bin/edgetune-repro" <<EOF
#!/usr/bin/env bash
PYTHONPATH="$DEST\${PYTHONPATH:+:\$PYTHONPATH}" exec "$PY" -m edgetune.cli.main "\$@"
EOF
else
  bash "$DEST/tools/setup.sh"
  cat > "$DEST/bin/edgetune-repro" <<EOF
#!/usr/bin/env bash
exec "$DEST/.venv/bin/edgetune" "\$@"
EOF
fi
chmod +x "$DEST/bin/edgetune-repro"
got="$("$DEST/bin/edgetune-repro" --version)"
if [ "$got" != "$want" ]; then
  echo "setup: the snapshot's edgetune says version $got, the package was made with $want" >&2
  exit 1
fi
echo "setup: edgetune $got ready: $DEST/bin/edgetune-repro"
"""

DOCKERFILE = f"""FROM debian:12
# edgetune reproduction package (README.md): the source snapshot, set up as setup.sh does, then the check
RUN apt-get update -qq && apt-get install -y -qq --no-install-recommends python3 ca-certificates \\
    && rm -rf /var/lib/apt/lists/*
COPY . {PACK_ROOT}
RUN bash {PACK_ROOT}/setup.sh
ENTRYPOINT ["{SRC_DEST}/bin/edgetune-repro", "repro", "check", "{PACK_ROOT}", "-d", "local"]
"""


def _readme(m: dict, no_models: bool) -> str:
    lines = ["# edgetune reproduction package", "",
             f"Made with edgetune {m['edgetune']['version']}"
             + (f" (commit {m['edgetune']['commit']})" if m['edgetune']['commit'] else "") + "."
             + (" The checkout had uncommitted changes to tracked files; `edgetune-src.tar.gz` holds the commit "
                "without them." if m["edgetune"]["source"].get("dirty") else ""), "",
             "## What is in it", "",
             "- `manifest.json` (schema `edgetune.pack/1`): for every run, the device it ran on (name, fingerprint "
             "and fingerprint key), the versions, the exact command, the model (name, sha256, and for a bundled "
             "model the command that rebuilds it), the shape points, the input seed and user inputs, every "
             "candidate configuration with its verdict and every timing sample of every round, and per shape "
             "the selected configuration and the baseline it was confirmed against (speedup with its 95% interval).",
             "- `models/`: the model files" + (" (omitted: rebuilt from the generator command in the manifest)"
                                               if no_models else "") + ".",
             "- `inputs/`: user input files the runs were tuned with (if any).",
             "- `edgetune-src.tar.gz`: the edgetune source the package was made with.",
             "- `setup.sh`: the set-up the Dockerfile runs; `Dockerfile`: Debian 12, set-up, then the check.", "",
             "## Runs", ""]
    for r in m["runs"]:
        lines.append(f"- run `{r['run_id']}` on `{r['device']}` (fingerprint `{r['fingerprint_key']}`): "
                     f"`{r['command'] or '(tuned through the Python API)'}`")
        for s in r["shapes"]:
            shape = " ".join(f"{k}={v}" for k, v in s["shape"].items()) or "static shape"
            lines.append(f"  - {shape}: selected `{s['selected']}`, baseline `{s['baseline']}`")
    lines += ["", "## Re-run it", "",
              "With Docker (measures inside the container, on this machine):", "",
              "    docker build -t edgetune-repro . && docker run --rm edgetune-repro", "",
              "Without Docker, as root on Debian 12 (`setup.sh` runs the source snapshot's `tools/setup.sh`):", "",
              "    bash setup.sh && /opt/edgetune/bin/edgetune-repro repro check . -d local", "",
              "With an edgetune you already have (same version), on any device in its inventory:", "",
              "    edgetune repro check . -d DEVICE [--format json] [--rounds N] [--seed S]", "",
              "## What \"reproduced\" means", "",
              "For every shape point of every run, the selected configuration, the onnxruntime default, the "
              "baseline and the confirmation's contender are measured again in fresh interleaved rounds, and "
              "every output is verified again on the recorded input seed and on a fresh one. Each figure (the "
              "selected configuration's median time, and speedups over the baseline and default) is reproduced "
              f"when the new value is within ±{TOLERANCE:.0%} of the packed one or the two 95% intervals overlap. "
              f"The package is reproduced when at least {REPRODUCE_FRACTION:.0%} of its figures are and no "
              "verification failed; `repro check` then exits 0, else 1. A device whose fingerprint key differs "
              "from the packed one is reported as a different device (figures still compared).", ""]
    return "\n".join(lines)


# ---- repro check --------------------------------------------------------------------------------

def reproduced(packed: float | None, packed_ci: Sequence[float] | None, measured: float | None,
               measured_ci: Sequence[float] | None, tolerance: float = TOLERANCE) -> bool:
    """MLPerf Mobile's rule: within ±tolerance of the packed figure, or the 95% intervals overlap."""
    if packed is None or measured is None:
        return False
    if packed > 0 and abs(measured - packed) / packed <= tolerance:
        return True
    if packed_ci and measured_ci:
        return max(packed_ci[0], measured_ci[0]) <= min(packed_ci[1], measured_ci[1])
    return False


def package_verdict(figures: Sequence[dict], verifications_ok: bool) -> dict[str, Any]:
    n = len(figures)
    k = sum(1 for f in figures if f["reproduced"])
    frac = k / n if n else 0.0
    return {"figures": n, "reproduced_figures": k, "fraction": frac, "threshold": REPRODUCE_FRACTION,
            "verifications_ok": verifications_ok, "ok": bool(n) and frac >= REPRODUCE_FRACTION and verifications_ok}


def load_package(pkg: str | os.PathLike) -> dict[str, Any]:
    d = Path(pkg)
    if not d.is_dir():
        raise UserInputError(f"package {d} not found (give the directory 'edgetune pack' wrote)")
    try:
        m = json.loads((d / "manifest.json").read_text())
    except (OSError, ValueError) as exc:
        raise UserInputError(f"package {d}: cannot read manifest.json ({type(exc).__name__})") from None
    if not isinstance(m, dict) or m.get("schema") != PACK_SCHEMA:
        raise UserInputError(f"package {d}: manifest.json is not of schema {PACK_SCHEMA}")
    return m


def _model_file(pkg: Path, entry: dict, work: Path) -> Path:
    """The package's model file, checked against its recorded sha256 (rebuilt when omitted)."""
    if entry.get("file"):
        p = pkg / entry["file"]
        if not p.is_file():
            raise UserInputError(f"package {pkg}: model file {entry['file']} is missing")
    else:
        gen = entry.get("generator") or {}
        if not gen.get("bundled"):
            raise UserInputError(f"package {pkg}: model {entry['name']} is neither in the package nor regenerable")
        import models

        p = models.build_onnx(gen["bundled"], work / gen["file"])
    if sha256_file(p) != entry["sha256"]:
        raise UserInputError(f"package {pkg}: model {p.name} does not match its recorded sha256 "
                             f"({entry['sha256'][:12]}…); refusing to measure a different model")
    return p


def repro_check(pkg: str | os.PathLike, device: str = "local", *, rounds: int = 5, seed: int | None = None,
                budget_s: float = 30.0, inventory: Any = None) -> dict[str, Any]:
    """Re-run a package on ``device`` (``edgetune repro check``): the JSON document edgetune.repro/1."""
    if rounds < 2:
        raise UserInputError("--rounds must be at least 2 (an interval needs two rounds)")
    d = Path(pkg)
    m = load_package(d)
    spec = (inventory or Inventory()).get(device)
    started = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="edgetune-repro-"))
    figures: list[dict] = []
    verifications: list[dict] = []
    runs_out = []
    try:
        model_files = {e["sha256"]: _model_file(d, e, work) for e in m.get("models", [])}
        for run in m["runs"]:
            for name, inp in run.get("user_inputs", {}).items():
                p = d / inp["file"]
                if not p.is_file() or sha256_file(p) != inp["sha256"]:
                    raise UserInputError(f"package {d}: user input {inp['file']} is missing or altered")
        db = work / "repro.db"
        for run in m["runs"]:
            path = model_files.get(run["model_sha256"])
            if path is None:
                raise UserInputError(f"package {d}: run {run['run_id']}: its model is not in the package")
            model = load_model(str(path))
            rec_seed = int(run.get("seed", 0))
            fseed = seed if seed is not None else fresh_seed({rec_seed})
            if fseed == rec_seed:
                raise UserInputError(f"--seed {seed} is the recorded seed; give a different one")
            ui_items = [f"{n}={d / i['file']}" for n, i in run.get("user_inputs", {}).items()]
            user_inputs = load_user_inputs(ui_items)
            store = Store(db)
            try:
                # an approximate candidate is held to the accuracy budget it was selected under
                acc = AccuracyBudget.from_dict(run.get("accuracy"))
                cfg = TuneConfig(budget_s=budget_s, rounds=rounds, finalists=3, confirm_rounds=0, spaces=(),
                                 seed=rec_seed, timeout_s=60.0, accuracy=acc)
                tuner = DeviceTuner(spec, store, cfg)
                info = tuner.info()
                same = info.fingerprint_key == run["fingerprint_key"]
                versions = run_versions(info)
                rid = "repro-" + hashlib.sha256(f"{run['run_id']}{time.time_ns()}".encode()).hexdigest()[:10]
                store.acquire_device(device_identity(spec), rid)  # one process drives a device at a time
                store.start_run(rid, str(path), run["model_sha256"], spec.name, info.fingerprint_key,
                                {**info.fingerprint, "arch": info.arch}, versions,
                                {"kind": "repro", "package_run": run["run_id"], "rounds": rounds,
                                 "points": run["points"], "seed": rec_seed})
                deadline = time.monotonic() + budget_s
                for s in run["shapes"]:
                    cands_by_key = {c["candidate"]["key"]: c for c in s["candidates"]}
                    keys = [k for k in dict.fromkeys([s["default"], s["baseline"], s["selected"], s["contender"]])
                            if k and k in cands_by_key]
                    cands = []
                    for k in keys:
                        cand = Candidate.from_dict(cands_by_key[k]["candidate"])
                        try:
                            cands.append((cand, space_of(cand)))
                        except (KeyError, ImportError):
                            raise UserInputError(f"run {run['run_id']}: backend '{cand.backend}' of {k} is not "
                                                 f"available here") from None
                    wl = build_workload(model, s["shape"], user_inputs, seed=rec_seed)
                    share = time.monotonic() + max(1.0, deadline - time.monotonic()) / max(1, len(run["shapes"]))
                    tuner.tune_shape(rid, model, info, wl, cands, versions, share)
                if tuner.client is not None:
                    tuner.client.close()
                summary = summarize_run(store, rid)
                rows = store.records(run_id=rid)
                store.finish_run(rid, summary.as_dict())
            finally:
                store.close()
            for s in run["shapes"]:
                cands_by_key = {c["candidate"]["key"]: c for c in s["candidates"]}
                now = next((x for x in summary.shapes if x.shape == s["shape"]), None)
                srows = [r for r in rows if now is not None and r.shape_key == now.shape_key]
                label = " ".join(f"{k}={v}" for k, v in s["shape"].items()) or "static"
                # verification: every job above ran on the recorded seed; now each on a fresh one
                for k in [k for k in dict.fromkeys([s["default"], s["baseline"], s["selected"], s["contender"]])
                          if k and k in cands_by_key]:
                    mine = [r for r in srows if r.candidate_key == k]
                    bad = [r for r in mine if r.status != "verified"]
                    verifications.append({"run_id": run["run_id"], "shape": s["shape"], "candidate": k,
                                          "seed": rec_seed, "seed_source": "recorded", "jobs": len(mine),
                                          "ok": bool(mine) and not bad,
                                          "reason": bad[0].reason if bad else ("" if mine else "not measured")})
                    try:
                        v = verify_config(str(path), k, device, dims=[f"{a}={b}" for a, b in s["shape"].items()],
                                          inputs=ui_items, db=str(db), inventory=inventory, seed=fseed)
                        ok = v["ok"]
                        reason = "; ".join(x.get("reason", "") for x in v["shapes"] if not x["ok"])
                    except EdgetuneError as exc:
                        ok, reason = False, str(exc)
                    verifications.append({"run_id": run["run_id"], "shape": s["shape"], "candidate": k,
                                          "seed": fseed, "seed_source": "given" if seed is not None else "fresh",
                                          "ok": ok, "reason": reason})
                figures.extend(_shape_figures(run, s, label, now, srows, same, round_ratio))
            runs_out.append({"run_id": run["run_id"], "device": spec.name, "packed_device": run["device"],
                             "fingerprint_key": info.fingerprint_key, "packed_fingerprint_key": run["fingerprint_key"],
                             "same_device": same, "repro_run_id": rid, "seed": rec_seed, "fresh_seed": fseed})
    finally:
        shutil.rmtree(work, ignore_errors=True)
    vok = all(v["ok"] for v in verifications)
    return {"schema": REPRO_SCHEMA, "package": str(d), "device": spec.name, "rounds": rounds,
            "tolerance": TOLERANCE, "rule": f"within ±{TOLERANCE:.0%} of the packed figure or 95% intervals overlap",
            "same_device": all(r["same_device"] for r in runs_out), "runs": runs_out, "figures": figures,
            "verifications": verifications, "verdict": package_verdict(figures, vok),
            "elapsed_s": round(time.monotonic() - started, 2)}


def _shape_figures(run: dict, s: dict, label: str, now: Any, srows: list, same: bool, round_ratio) -> list[dict]:
    cands = {c["candidate"]["key"]: c for c in s["candidates"]}
    conf = s.get("confirmation") or {}
    out: list[dict] = []

    def add(what: str, unit: str, packed, packed_ci, measured, measured_ci):
        delta = (measured - packed) / packed * 100 if packed and measured is not None else None
        out.append({"run_id": run["run_id"], "shape": s["shape"], "figure": f"{label}: {what}", "unit": unit,
                    "packed": packed, "packed_ci95": packed_ci, "measured": measured, "measured_ci95": measured_ci,
                    "delta_pct": delta, "reproduced": reproduced(packed, packed_ci, measured, measured_ci),
                    "device": "same device" if same else "different device"})

    def measured_ratio(base: str, key: str):
        by_round: dict[int, dict[str, np.ndarray]] = {}
        for r in srows:
            if r.round > 0 and r.status == "verified" and r.samples_ns.size and r.candidate_key in (base, key):
                by_round.setdefault(r.round, {})[r.candidate_key] = r.samples_ns
        pairs = [(v[base], v[key]) for _, v in sorted(by_round.items()) if base in v and key in v]
        if not pairs:
            return None, None
        rr = round_ratio(pairs)
        return rr.value, [rr.ci_low, rr.ci_high]

    sel = s["selected"]
    if sel and sel in cands:
        c = cands[sel]
        # the race rounds' statistics on both sides: same inputs (the recorded seed), an interval with
        # rounds as the independent units (results._race_stats); confirmation statistics pool samples
        packed, pci = _stats_fig(c.get("stats") or c.get("confirm_stats"))
        cur = now.get(sel) if now is not None else None
        meas, mci = _stats_fig(cur.stats.as_dict() if cur is not None and cur.stats else None)
        add(f"median ms of selected {c['label']} [{sel}]", "ms", packed, pci, meas, mci)
    pairs = []  # (what, base key, candidate key, packed ratio dict)
    contender = s.get("contender")
    if sel and s["baseline"] and sel != s["baseline"]:
        packed_r = (conf.get("speedup_vs_best_baseline") if contender == sel
                    else cands[sel].get("speedup_vs_best_baseline") or cands[sel].get("race_speedup_vs_best_baseline"))
        pairs.append(("speedup of selected over baseline", s["baseline"], sel, packed_r))
    if sel and s["default"] and sel != s["default"] and s["default"] != s["baseline"]:
        packed_r = (conf.get("speedup_vs_default") if contender == sel
                    else cands[sel].get("speedup_vs_default") or cands[sel].get("race_speedup_vs_default"))
        pairs.append(("speedup of selected over default", s["default"], sel, packed_r))
    if contender and contender != sel and s["baseline"] and contender in cands:
        pairs.append((f"speedup of contender {cands[contender]['label']} over baseline (confirmation)",
                      s["baseline"], contender, conf.get("speedup_vs_best_baseline")))
    for what, base, key, packed_r in pairs:
        packed, pci = _ratio_fig(packed_r)
        meas, mci = measured_ratio(base, key)
        add(what, "x", packed, pci, meas, mci)
    return out
