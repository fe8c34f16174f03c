"""App artifacts: ``edgetune export RUN_ID... --target android|linux -o DIR`` (docs/export.md).

An export turns tune runs into what an app ships: for every device tuned in those runs, the
configuration edgetune selected and verified there, the model in the form that runtime loads
best, golden inputs and outputs with their tolerances, and loaders (a C library per ABI and a
Kotlin source file) that match the running device's fingerprint and open the session with those
options. ``edgetune export check DIR -d DEVICE`` (export/check.py) runs it on a device the way an
app would.

Layout (``--target linux``; for ``android`` the app's files are under ``assets/edgetune/``, the
libraries under ``jniLibs/<abi>/`` and the Kotlin source under ``kotlin/``):

  manifest.json      schema edgetune.export/1: versions, sha256 of every file, inputs/outputs, the
                     devices with their fingerprints, and the measured figures with their intervals
                     and the run ids behind them
  config.json        schema edgetune.config/1: what the loaders read (configurations, devices, shape
                     points, golden files and tolerances, the fallback)
  models/            the model per configuration (ORT format, or ONNX where ORT format would freeze
                     one CPU's layout; see _model_form) and required_operators.config
  golden/            golden inputs and outputs per shape point (.npy)
  lib/<abi>/         libedgetune_loader.so (abi: x86_64-linux-gnu, aarch64-linux-gnu; Android: jniLibs/<abi>/
                     with arm64-v8a, x86_64); bin/<abi>/edgetune-check; include/edgetune_loader.h
"""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np

import edgetune
from edgetune.agent.host import AgentInfo
from edgetune.build import native
from edgetune.build.native import HOST_ARCH
from edgetune.candidate import Candidate
from edgetune.db import Store
from edgetune.devices.inventory import home_subdir
from edgetune.errors import EdgetuneError, ToolchainError, UserInputError
from edgetune.hashing import sha256_file
from edgetune.pack import check_new_dir, write_new_dir
from edgetune.results import summarize_run
from edgetune.space import BuildFailed, space_of
from edgetune.verify import tolerance_for
from edgetune.modelfile import external_data_files, load_model
from edgetune.workload import build_workload

EXPORT_SCHEMA = "edgetune.export/1"
CONFIG_SCHEMA = "edgetune.config/1"
TARGETS = ("android", "linux")
# ABI name -> compiler triple, per target
ABIS = {
    "android": {"arm64-v8a": "aarch64-linux-android24", "x86_64": "x86_64-linux-android24"},
    "linux": {"aarch64-linux-gnu": "aarch64-linux-gnu", "x86_64-linux-gnu": "x86_64-linux-gnu"},
}
# device arch (uname -m) -> ABI, per target
ARCH_ABI = {
    "android": {"aarch64": "arm64-v8a", "arm64": "arm64-v8a", "x86_64": "x86_64"},
    "linux": {"aarch64": "aarch64-linux-gnu", "arm64": "aarch64-linux-gnu", "x86_64": "x86_64-linux-gnu"},
}
OPT_LEVELS = {"disable": 0, "basic": 1, "extended": 2, "all": 99}
FALLBACK_ID = "fallback"
KOTLIN_SOURCE = Path(__file__).with_name("EdgetuneSession.kt")


def layout(target: str) -> dict[str, str]:
    """Where the parts go, relative to the export directory."""
    if target == "android":
        return {"app": "assets/edgetune", "lib": "jniLibs", "bin": "bin", "include": "include", "kotlin": "kotlin"}
    return {"app": ".", "lib": "lib", "bin": "bin", "include": "include", "kotlin": "kotlin"}


@dataclass
class _Selection:
    run_id: str
    shape: dict[str, int]
    shape_key: str
    candidate: dict[str, Any]  # the selected candidate's summary (candidate, label, stats, ...)
    default_key: str | None
    baseline_key: str | None
    confirmation: dict[str, Any] | None
    accuracy_budget: dict[str, Any] | None


@dataclass
class _Device:
    name: str
    run_id: str
    fingerprint_key: str
    fingerprint: dict[str, Any]
    versions: dict[str, Any]
    seed: int
    selections: list[_Selection] = field(default_factory=list)


# ---- reading the runs -----------------------------------------------------------------------------

def _load_runs(run_ids: Sequence[str], db: str | None):
    if not run_ids:
        raise UserInputError("give at least one run id (see 'edgetune db ls')")
    store = Store(db, create=False) if db else Store(None, create=False)
    try:
        devices: list[_Device] = []
        model_path = model_sha = None
        for rid in dict.fromkeys(run_ids):
            run = store.get_run(rid)
            if run is None:
                raise UserInputError(f"unknown run id '{rid}' in {store.path} (see 'edgetune db ls')")
            config = json.loads(run["config"] or "{}")
            if config.get("kind", "tune") != "tune":
                raise UserInputError(f"run {rid} is a '{config.get('kind')}' run; only tune runs can be exported")
            if model_sha is not None and run["model_sha256"] != model_sha:
                raise UserInputError(f"run {rid} tuned another model ({Path(run['model_path']).name}, sha256 "
                                     f"{run['model_sha256'][:12]}…) than the runs before it; export one model at a time")
            model_path, model_sha = run["model_path"], run["model_sha256"]
            if any(d.fingerprint_key == run["fingerprint_key"] for d in devices):
                raise UserInputError(f"run {rid} is a second run on device fingerprint {run['fingerprint_key']}; "
                                     f"give one run per device")
            summary = summarize_run(store, rid).as_dict()
            acc = config.get("accuracy") or None
            dev = _Device(run["device"], rid, run["fingerprint_key"],
                          {**json.loads(run["fingerprint"])}, json.loads(run["versions"]), int(config.get("seed", 0)))
            for s in summary["shapes"]:
                best = s.get("best")
                cands = {c["candidate"]["key"]: c for c in s["candidates"]}
                if not best or best not in cands:
                    continue  # nothing verified at this shape point: the device gets the fallback there
                dev.selections.append(_Selection(rid, s["shape"], s["shape_key"], cands[best], s.get("default"),
                                                 s.get("best_baseline"), s.get("confirmation"),
                                                 acc if cands[best].get("accuracy") else None))
            if not dev.selections:
                raise UserInputError(f"run {rid} on {run['device']} selected no verified configuration; "
                                     f"nothing to export for it")
            devices.append(dev)
    finally:
        store.close()
    return devices, model_path, model_sha


# ---- the model per configuration -------------------------------------------------------------------

def _model_form(arch: str) -> str:
    """onnxruntime's ORT format is what mobile and minimal builds load best, and on ARM it holds
    every optimization the tuned session applied. On x86_64 it does not: the layout optimizer
    (NCHWc) picks a block size from the CPU it runs on, so an ORT-format model either freezes the
    exporting machine's block size or loses the optimization (measured: Conv stays unblocked), so
    x86_64 devices get the ONNX model, optimized at load as in the tune."""
    return "ort" if arch in ("aarch64", "arm64", "armv7l", "armv8l") else "onnx"


def save_ort(src: Path, dst: Path, level: str, custom_ops: Path | None) -> None:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = {
        "disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL, "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
        "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED, "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
    }[level]
    so.optimized_model_filepath = str(dst)
    so.add_session_config_entry("session.save_model_format", "ORT")
    so.add_session_config_entry("session.qdqisint8allowed", "1")  # as onnxruntime's converter does for ARM
    so.log_severity_level = 3
    if custom_ops is not None:
        so.register_custom_ops_library(str(custom_ops))
    try:
        # the layout transformer makes a CPU-specific graph; never on ARM (onnxruntime's converter)
        ort.InferenceSession(str(src), so, providers=["CPUExecutionProvider"], disabled_optimizers=["NchwcTransformer"])
    except Exception as exc:  # onnxruntime raises its own types
        raise UserInputError(f"onnxruntime cannot convert {src.name} to ORT format: {str(exc).splitlines()[0][:300]}") from None
    if not dst.is_file():
        raise UserInputError(f"onnxruntime wrote no ORT-format model for {src.name}")


def _prepared_model(cand: dict[str, Any], dev: _Device, workload, cache: Path) -> tuple[Path, dict[str, Any]]:
    """The model file the candidate ran (a rewritten one for int8, fusions, hybrid kernels) and the
    agent params it ran with, prepared as the tune prepared it."""
    c = Candidate.from_dict(cand["candidate"])
    if c.backend != "ort":  # before any build: a TVM Relax build can take minutes
        raise UserInputError(f"cannot export '{cand['label']}' for {dev.name}: the loaders run onnxruntime "
                             f"configurations; a {c.backend} configuration is not exported yet")
    fp = dict(dev.fingerprint)
    arch = fp.pop("arch", "x86_64")
    kind, _, version = str(dev.versions.get("agent", "native ?")).partition(" ")
    info = AgentInfo(kind, version, arch, None, dict(dev.versions.get("device_runtimes") or {}), fp)
    try:
        # the tune's own artifact cache: a rewritten model is rebuilt byte for byte, and a hybrid
        # finds the kernels its tune verified on the device (content-addressed)
        prep = space_of(c).prepare(c, workload, info, cache)
    except (BuildFailed, KeyError, ImportError) as exc:
        raise UserInputError(f"cannot export '{cand['label']}' for {dev.name}: {exc}") from None
    if prep.backend != "ort":
        raise UserInputError(f"cannot export '{cand['label']}' for {dev.name}: the loaders run onnxruntime "
                             f"configurations; a {prep.backend} configuration is not exported yet")
    return Path(prep.artifact), dict(prep.params)


def _session_fields(params: dict[str, Any]) -> dict[str, Any]:
    """A candidate's runtime parameters in the loaders' vocabulary (onnxruntime's C API values)."""
    out: dict[str, Any] = {"execution_provider": params.get("execution_provider", "CPUExecutionProvider"),
                           "provider_options": {str(k): str(v) for k, v in (params.get("provider_options") or {}).items()}}
    for k in ("intra_op_num_threads", "inter_op_num_threads"):
        if k in params:
            out[k] = int(params[k])
    if "graph_optimization_level" in params:
        out["graph_optimization_level"] = OPT_LEVELS[params["graph_optimization_level"]]
    if "execution_mode" in params:
        out["execution_mode"] = str(params["execution_mode"])
    out["session_config"] = {k: str(v) for k, v in params.items() if k.startswith("session.")}
    return out


# ---- export ---------------------------------------------------------------------------------------

def export(run_ids: Sequence[str], target: str, out: str | os.PathLike, *, db: str | None = None,
           abis: Sequence[str] | None = None, progress=None) -> dict[str, Any]:
    """Write the app artifact of ``run_ids`` for ``target`` to ``out`` (a new directory, atomically);
    returns its manifest."""
    if target not in TARGETS:
        raise UserInputError(f"--target must be one of {', '.join(TARGETS)}, not '{target}'")
    want_abis = list(abis) if abis else list(ABIS[target])
    for a in want_abis:
        if a not in ABIS[target]:
            raise UserInputError(f"--abi {a} is not an ABI of target {target} ({', '.join(ABIS[target])})")
    out = check_new_dir(out, "artifact")
    devices, model_path, model_sha = _load_runs(run_ids, db)
    src = Path(model_path)
    if not src.is_file():
        raise UserInputError(f"the tuned model {src} is gone; rebuild it at that path to export")
    if sha256_file(src) != model_sha:
        raise UserInputError(f"the model {src} changed since it was tuned (sha256 differs); refusing to export it")
    return write_new_dir(out, "artifact",
                         lambda tmp: _write(tmp, target, want_abis, devices, src, model_sha, progress or (lambda msg: None)))


def _write(tmp: Path, target: str, abis: list[str], devices: list[_Device], src: Path, model_sha: str,
           progress) -> dict[str, Any]:
    lay = layout(target)
    app = tmp / lay["app"]
    (app / "models").mkdir(parents=True, exist_ok=True)
    (app / "golden").mkdir(exist_ok=True)
    model = load_model(str(src))
    if model.format != "onnx":
        raise UserInputError(f"{src.name} is a {model.format} model; the export packages onnxruntime configurations "
                             f"(ONNX models) only so far")
    stem = src.stem

    cache = home_subdir("artifacts")
    # golden inputs and outputs per shape point, from the first device's seed (any seed is as good:
    # the references are computed on the host, independently of every runtime under test)
    shapes: dict[str, dict[str, Any]] = {}
    workloads: dict[str, Any] = {}
    for dev in devices:
        for sel in dev.selections:
            if sel.shape_key in shapes:
                continue
            wl = build_workload(model, sel.shape, seed=dev.seed)
            workloads[sel.shape_key] = wl
            idx = len(shapes)
            gdir = app / "golden" / f"s{idx}"
            gdir.mkdir()
            ins = wl.input_sets[0]
            refs = wl.references()[0]
            names_in, names_out = [], []
            for i, a in enumerate(ins):
                np.save(gdir / f"input_{i}.npy", np.ascontiguousarray(a))
                names_in.append(f"golden/s{idx}/input_{i}.npy")
            outs_spec = []
            tols = []
            for i, (spec, r) in enumerate(zip(model.outputs, refs)):
                r = np.ascontiguousarray(r)
                np.save(gdir / f"output_{i}.npy", r)
                names_out.append(f"golden/s{idx}/output_{i}.npy")
                outs_spec.append({"name": spec.name, "dtype": str(r.dtype), "shape": list(r.shape)})
                tols.append(tolerance_for(str(r.dtype)).as_dict())
            shapes[sel.shape_key] = {
                "shape_key": sel.shape_key, "shape": sel.shape,
                "inputs": [{"name": s.name, "dtype": str(a.dtype), "shape": list(a.shape)}
                           for s, a in zip(model.inputs, ins)],
                "outputs": outs_spec,
                "golden": {"inputs": names_in, "outputs": names_out, "tolerance": tols, "seed": dev.seed,
                           "reference": "host, float64 (onnx.reference / numpy), cast to the output dtype"}}

    # one configuration per distinct candidate and model form
    configs: dict[str, dict[str, Any]] = {}
    written: dict[tuple[str, str, str], str] = {}  # (model sha, form, level) -> relative path

    def model_file(path: Path, form: str, level: str, custom_ops: Path | None) -> str:
        key = (sha256_file(path), form, level)
        if key in written:
            return written[key]
        tag = key[0][:12]
        if form == "ort":
            rel = f"models/{stem}-{tag}.{level}.ort"
            progress(f"converting {path.name} to ORT format (optimization level {level})")
            save_ort(path, app / rel, level, custom_ops)
        else:
            rel = f"models/{stem}-{tag}.onnx"
            shutil.copyfile(path, app / rel)
        written[key] = rel
        return rel

    def add_config(cid: str, cand: dict[str, Any] | None, dev: _Device | None, sel: _Selection | None) -> str:
        arch = (dev.fingerprint.get("arch") if dev else None) or "x86_64"
        form = _model_form(arch) if dev else "ort"
        if cand is None:
            path, params = src, {}
        else:
            path, params = _prepared_model(cand, dev, workloads[sel.shape_key], cache)
        ops_lib = params.get("custom_ops_library")
        if ops_lib:
            # a hybrid: the rewritten model beside its custom-op library and kernels (its companions),
            # all built for the tuned device's ABI; the model stays ONNX next to them
            d = app / "models" / f"hybrid-{sha256_file(path)[:12]}"
            d.mkdir(exist_ok=True)
            names = list(dict.fromkeys([path.name, *external_data_files(path), ops_lib]))
            for name in names:
                shutil.copyfile(path.parent / name, d / name)
            files = [str((d / n).relative_to(app)) for n in names]
            rel, form, ops_rel = files[0], "onnx", str((d / ops_lib).relative_to(app))
        else:
            rel = model_file(path, form, params.get("graph_optimization_level", "all"), None)
            files, ops_rel = [rel], None
        configs[cid] = {
            "runtime": "onnxruntime", "model": rel, "model_form": form,
            "files": [{"path": f, "sha256": sha256_file(app / f)} for f in files],
            "custom_ops_library": ops_rel,
            **_session_fields(params),
            "precision": params.get("precision", "fp32") if cand else "fp32",
            "candidate": cand["candidate"] if cand else None,
            "label": cand["label"] if cand else "onnxruntime defaults (fallback)"}
        return cid

    for dev in devices:  # every selection the loaders cannot run is refused before any work or output
        for sel in dev.selections:
            backend = sel.candidate["candidate"]["backend"]
            if backend != "ort":
                raise UserInputError(f"cannot export '{sel.candidate['label']}' for {dev.name}: the loaders run "
                                     f"onnxruntime configurations; a {backend} configuration is not exported yet")
    dev_docs, figures = [], []
    for dev in devices:
        arch = dev.fingerprint.get("arch") or "x86_64"
        selected = []
        for sel in dev.selections:
            key = sel.candidate["candidate"]["key"]
            # a hybrid's kernels were tuned for this device: its configuration is this device's alone
            hybrid = "hybrid" in sel.candidate["candidate"]["params"]
            cid = f"c-{key}-{dev.fingerprint_key}" if hybrid else f"c-{key}-{_model_form(arch)}"
            if cid not in configs:
                progress(f"{dev.name}: preparing '{sel.candidate['label']}'")
                add_config(cid, sel.candidate, dev, sel)
            entry = {"shape_key": sel.shape_key, "config": cid}
            if sel.accuracy_budget:
                entry["accuracy"] = {k: v for k, v in sel.accuracy_budget.items() if v is not None}
            selected.append(entry)
            figures.append(_figure(dev, sel, cid))
        dev_docs.append({"name": dev.name, "run_id": dev.run_id, "fingerprint_key": dev.fingerprint_key,
                         "fingerprint": dev.fingerprint, "selected": selected})
    add_config(FALLBACK_ID, None, None, None)

    # onnxruntime's reduced-build operator list for every ORT-format model in the artifact
    ort_models = sorted({c["model"] for c in configs.values() if c["model_form"] == "ort"})
    if ort_models:
        from onnxruntime.tools.ort_format_model.utils import create_config_from_models

        import logging

        logging.getLogger("ort_format_model.utils").setLevel(logging.WARNING)
        req = app / "models" / "required_operators.config"
        create_config_from_models([app / m for m in ort_models], req, enable_type_reduction=False)
        # the generator names the files by their absolute (temporary) paths: name them as shipped
        req.write_text(req.read_text().replace(str(app) + "/", ""))

    config = {"schema": CONFIG_SCHEMA, "model": {"name": src.name, "sha256": model_sha},
              "shapes": list(shapes.values()), "configs": configs, "devices": dev_docs,
              "fallback": {"config": FALLBACK_ID,
                           "why": "a device the artifact was not tuned on gets onnxruntime's defaults, the "
                                  "baseline every tune measured"}}
    (app / "config.json").write_text(json.dumps(config, indent=1) + "\n")

    # loaders, per ABI
    built, not_built = {}, {}
    for abi in abis:
        triple = ABIS[target][abi]
        try:
            progress(f"building the loader for {abi}")
            b = native.build_loader(None if _host_triple(triple) else triple)
        except ToolchainError as exc:
            not_built[abi] = str(exc)
            continue
        ldir = tmp / lay["lib"] / abi
        bdir = tmp / lay["bin"] / abi
        ldir.mkdir(parents=True, exist_ok=True)
        bdir.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(b.library, ldir / native.LOADER_LIB)
        shutil.copyfile(b.check, bdir / native.LOADER_CHECK)
        os.chmod(bdir / native.LOADER_CHECK, 0o755)
        built[abi] = {"triple": b.triple, "library": f"{lay['lib']}/{abi}/{native.LOADER_LIB}",
                      "check": f"{lay['bin']}/{abi}/{native.LOADER_CHECK}"}
    if target == "android" and not (os.environ.get("ANDROID_NDK_HOME") or os.environ.get("ANDROID_NDK_ROOT")):
        for abi in abis:
            not_built[abi] = ("ANDROID_NDK_HOME is not set: the C loader for Android needs the NDK's clang "
                              "(the Kotlin loader needs no native code)")
    (tmp / lay["include"]).mkdir(parents=True, exist_ok=True)
    shutil.copyfile(native.AGENT_SRC / "edgetune_loader.h", tmp / lay["include"] / "edgetune_loader.h")
    (tmp / lay["kotlin"] / "dev" / "edgetune").mkdir(parents=True, exist_ok=True)
    shutil.copyfile(KOTLIN_SOURCE, tmp / lay["kotlin"] / "dev" / "edgetune" / KOTLIN_SOURCE.name)

    import onnxruntime

    manifest = {
        "schema": EXPORT_SCHEMA, "created": time.time(), "target": target,
        "edgetune": {"version": edgetune.__version__},
        "exported_with": {"onnxruntime": onnxruntime.__version__},
        "app_dir": lay["app"], "model": {"name": src.name, "sha256": model_sha},
        "io": {"layout": "dense, C order; dimensions as the model declares them",
               "shapes": [{k: s[k] for k in ("shape_key", "shape", "inputs", "outputs")} for s in shapes.values()]},
        "devices": [{"name": d.name, "run_id": d.run_id, "fingerprint_key": d.fingerprint_key,
                     "fingerprint": d.fingerprint, "agent": d.versions.get("agent"),
                     "runtimes": d.versions.get("device_runtimes")} for d in devices],
        "figures": figures, "runs": [d.run_id for d in devices],
        "loaders": {"built": built, "not_built": not_built}}
    (tmp / "README.md").write_text(_readme(manifest))
    manifest["files"] = {str(p.relative_to(tmp)): sha256_file(p) for p in sorted(tmp.rglob("*")) if p.is_file()}
    (tmp / "manifest.json").write_text(json.dumps(manifest, indent=1, default=str) + "\n")
    return manifest


def _host_triple(triple: str) -> bool:
    return triple.split("-")[0] == HOST_ARCH and "android" not in triple


def _figure(dev: _Device, sel: _Selection, cid: str) -> dict[str, Any]:
    """The selected configuration's measured time and speedups, with intervals and where they came from."""
    c = sel.candidate
    conf = sel.confirmation or {}
    confirmed = conf.get("contender") == c["candidate"]["key"] and bool(c.get("confirm_stats"))
    stats = c.get("confirm_stats") if confirmed else c.get("stats")
    return {"device": dev.name, "fingerprint_key": dev.fingerprint_key, "run_id": dev.run_id,
            "shape_key": sel.shape_key, "shape": sel.shape, "config": cid, "label": c["label"],
            "median_ms": stats["median_ms"] if stats else None, "ci95_ms": stats["ci95_ms"] if stats else None,
            "basis": "confirmation rounds" if confirmed else "race rounds",
            "speedup_vs_default": c.get("speedup_vs_default"), "speedup_vs_best_baseline": c.get("speedup_vs_best_baseline"),
            "confirmation_verdict": conf.get("verdict"), "emulated": bool(dev.fingerprint.get("emulated"))}


def _readme(m: dict[str, Any]) -> str:
    lines = ["# edgetune app artifact", "",
             f"Target `{m['target']}`, made with edgetune {m['edgetune']['version']} from run(s) "
             + ", ".join(f"`{r}`" for r in m["runs"]) + ".", "",
             "The layout, the config.json schema and an Android walk-through are in edgetune's docs/export.md.", "",
             "## Devices and their figures", ""]
    for f in m["figures"]:
        ci = f["ci95_ms"]
        lines.append(f"- {f['device']} (`{f['fingerprint_key']}`), {f['shape_key']}: `{f['label']}`, "
                     + (f"median {f['median_ms']:.4g} ms" if f["median_ms"] is not None else "no timing")
                     + (f" [{ci[0]:.4g}, {ci[1]:.4g}]" if ci else "")
                     + f" ({f['basis']}, run `{f['run_id']}`)" + (" — emulated, not a real timing" if f["emulated"] else ""))
    lines += ["", "## Loaders", ""]
    for abi, b in m["loaders"]["built"].items():
        lines.append(f"- {abi}: `{b['library']}` (and `{b['check']}` for `edgetune export check`)")
    for abi, why in m["loaders"]["not_built"].items():
        lines.append(f"- {abi}: not built: {why}")
    lines += ["", "Check it on a device: `edgetune export check . -d DEVICE`.", ""]
    return "\n".join(lines)


def match_level(recorded: dict[str, Any], device: dict[str, Any]) -> str | None:
    """How a device's fingerprint (as its agent reports it, with "arch") matches one the artifact was
    tuned on, by the loader's rule (loader_config.c ld_match_level): "exact", "hardware" (same arch,
    CPU, cores and frequencies; another kernel, OS build or governor) or None."""
    def same(k: str) -> bool:
        return (recorded.get(k) or None) == (device.get(k) or None)

    if not all(same(k) for k in ("arch", "cpu_model", "cores")):
        return None
    if recorded.get("max_freq_khz") is not None and list(recorded["max_freq_khz"]) != list(device.get("max_freq_khz") or []):
        return None
    return "exact" if all(same(k) for k in ("kernel", "os", "governor", "emulated", "soc")) else "hardware"


def load_artifact(path: str | os.PathLike) -> tuple[Path, dict[str, Any], dict[str, Any]]:
    """(directory, manifest, config) of an export, every file checked against the manifest's sha256:
    a missing, altered or extra file is refused with the file's name."""
    d = Path(path)
    if not d.is_dir():
        raise UserInputError(f"artifact {d} not found (give the directory 'edgetune export' wrote)")
    try:
        m = json.loads((d / "manifest.json").read_text())
    except (OSError, ValueError) as exc:
        raise UserInputError(f"artifact {d}: cannot read manifest.json ({type(exc).__name__})") from None
    if not isinstance(m, dict) or m.get("schema") != EXPORT_SCHEMA or not isinstance(m.get("files"), dict):
        raise UserInputError(f"artifact {d}: manifest.json is not of schema {EXPORT_SCHEMA}")
    for rel, digest in m["files"].items():
        p = d / rel
        if not _inside(d, p):
            raise UserInputError(f"artifact {d}: manifest.json names a file outside the artifact: {rel}")
        if not p.is_file():
            raise UserInputError(f"artifact {d}: file {rel} is missing")
        if sha256_file(p) != digest:
            raise UserInputError(f"artifact {d}: file {rel} is altered (sha256 differs from the manifest's)")
    extra = [str(p.relative_to(d)) for p in d.rglob("*") if p.is_file() and p.name != "manifest.json"
             and str(p.relative_to(d)) not in m["files"]]
    if extra:
        raise UserInputError(f"artifact {d}: file {extra[0]} is not in the manifest")
    try:
        config = json.loads((d / m.get("app_dir", ".") / "config.json").read_text())
    except (OSError, ValueError) as exc:
        raise UserInputError(f"artifact {d}: cannot read config.json ({type(exc).__name__})") from None
    return d, m, config


def _inside(root: Path, p: Path) -> bool:
    try:
        p.resolve().relative_to(root.resolve())
        return True
    except ValueError:
        return False


__all__ = ["export", "load_artifact", "layout", "EdgetuneError"]
