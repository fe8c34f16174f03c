"""``edgetune export check DIR -d DEVICE``: the app artifact on a device, run as an app runs it.

The artifact's files are checked against its manifest, then pushed to the device with the loader
built for the device's ABI and the device's libonnxruntime. ``edgetune-check`` (C, no Python)
loads the artifact's own loader library, which reads config.json, matches the device's
fingerprint, checks every file's sha256 and opens the session with the selected configuration.
Per shape point it runs the golden inputs (the loader compares them itself), reports where
onnxruntime placed the nodes (a profiled run) and times the loader's own ``et_run``. The host then
verifies the outputs it pulled against the golden outputs it holds, and compares the latency with
the figure in the manifest (flagging a gap beyond its interval).
"""

from __future__ import annotations

import hashlib
import json
import math
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from edgetune.accuracy import Accuracy, AccuracyBudget
from edgetune.agent.host import AgentClient
from edgetune.build.native import LOADER_CHECK, LOADER_LIB
from edgetune.db import device_lease
from edgetune.devices.inventory import Inventory
from edgetune.errors import DeviceError, UserInputError
from edgetune.export import ARCH_ABI, load_artifact, match_level
from edgetune.measure import summarize
from edgetune.pack import reproduced
from edgetune.text import device_text
from edgetune.verify import Tolerance, compare

CHECK_SCHEMA = "edgetune.export-check/1"
LATENCY_TOLERANCE = 0.05  # a gap within ±5% of the manifest's median is no gap (as repro check)


def _known(config: dict[str, Any], key: str, fingerprint: dict[str, Any]) -> tuple[dict[str, Any] | None, str | None]:
    """The artifact's device this one is, and how: by its exact fingerprint key, else the first
    with the same hardware (the loader's rule, export.match_level)."""
    devices = config.get("devices", [])
    exact = next((d for d in devices if d.get("fingerprint_key") == key), None)
    if exact is not None:
        return exact, "exact"
    for d in devices:
        if match_level(d.get("fingerprint") or {}, fingerprint):
            return d, "hardware"
    return None, None


def export_check(artifact: str, device: str = "local", *, inventory: Any = None, iters: int = 20,
                 budget_ms: float = 1000.0, fallback: bool = False, timeout_s: float = 300.0) -> dict[str, Any]:
    d, manifest, config = load_artifact(artifact)
    spec = (inventory or Inventory()).get(device)
    started = time.monotonic()
    with device_lease(spec):  # one process drives a device at a time, whichever host
        client = AgentClient(spec)
        try:
            info = client.provision()
            fp_key = info.fingerprint_key
            dev, level = _known(config, fp_key, {**info.fingerprint, "arch": info.arch})
            if dev is None and not fallback:
                have = ", ".join(f"{x['name']} ({x['fingerprint_key']})" for x in config.get("devices", [])) or "none"
                raise UserInputError(
                    f"device '{spec.name}' (fingerprint {fp_key}: {info.fingerprint.get('cpu_model')}, {info.arch}) is not "
                    f"one this artifact was tuned on, nor the same hardware (it has: {have}); an app there would run the "
                    f"fallback configuration — check that with --fallback")
            target = manifest["target"]
            abi = ARCH_ABI[target].get(info.arch)
            built = manifest["loaders"]["built"].get(abi or "")
            if built is None:
                why = manifest["loaders"]["not_built"].get(abi or "", "")
                raise UserInputError(f"artifact {d} has no loader for {spec.name}'s architecture {info.arch} "
                                     f"(target {target}, built: {', '.join(manifest['loaders']['built']) or 'none'})"
                                     + (f": {why}" if why else ""))
            ort_lib = client.ort_library_for(info.arch)
            if ort_lib is None:
                raise DeviceError(f"{spec.name}: no libonnxruntime.so for {info.arch} to run the artifact with "
                                  f"(give the device an ort_lib option)")
            app_rel = manifest.get("app_dir", ".")
            rdir = f"{client.workdir}/export/" + hashlib.sha256(json.dumps(manifest["files"], sort_keys=True).encode()).hexdigest()[:16]
            files = [(d / rel, f"{rdir}/app/{Path(rel).relative_to(app_rel)}", None) for rel in manifest["files"]
                     if _under(rel, app_rel) and not rel.startswith(("jniLibs/", "lib/", "bin/", "include/", "kotlin/"))]
            files += [(d / built["library"], f"{rdir}/lib/{LOADER_LIB}", None),
                      (d / built["check"], f"{rdir}/bin/{LOADER_CHECK}", "755"),
                      (Path(ort_lib), f"{rdir}/lib/libonnxruntime.so", None)]
            try:
                client.push_files(files)
                shapes = _shapes_to_check(config, dev)
                results = []
                for i, (shape_key, sel) in enumerate(shapes):
                    results.append(_check_shape(client, d / app_rel, rdir, i, shape_key, sel, config, manifest, dev,
                                                level, info, iters, budget_ms, timeout_s))
            finally:
                try:
                    client.transport.run(["rm", "-rf", rdir], timeout=60)
                except DeviceError:
                    pass
        finally:
            client.transport.close()
    ok = all(r["ok"] for r in results)
    return {"schema": CHECK_SCHEMA, "artifact": str(d), "device": spec.name, "fingerprint_key": fp_key,
            "known_device": dev["name"] if dev else None, "match": level or "fallback", "abi": abi, "target": target,
            "emulated": info.emulated, "files_checked": len(manifest["files"]), "shapes": results,
            "latency_flags": sum(1 for r in results if r.get("latency", {}).get("gap")),
            "ok": ok, "elapsed_s": round(time.monotonic() - started, 2)}


def _under(rel: str, app_rel: str) -> bool:
    return app_rel in (".", "") or rel == app_rel or rel.startswith(app_rel.rstrip("/") + "/")


def _shapes_to_check(config: dict[str, Any], dev: dict[str, Any] | None) -> list[tuple[str, dict | None]]:
    if dev is None:  # the fallback configuration, at every shape point
        return [(s["shape_key"], None) for s in config["shapes"]]
    return [(sel["shape_key"], sel) for sel in dev["selected"]]


def _check_shape(client, app: Path, rdir: str, i: int, shape_key: str, sel: dict | None, config, manifest, dev,
                 level: str | None, info, iters: int, budget_ms: float, timeout_s: float) -> dict[str, Any]:
    out_dir = f"{rdir}/out/s{i}"
    client.transport.run(["mkdir", "-p", out_dir], timeout=60)
    argv = [f"{rdir}/bin/{LOADER_CHECK}", "--loader", f"{rdir}/lib/{LOADER_LIB}", "--artifact", f"{rdir}/app",
            "--ort-lib", f"{rdir}/lib/libonnxruntime.so", "--shape", shape_key, "--out", out_dir, "--placement",
            "--min-match", level or "fallback", "--iters", str(iters), "--budget-ms", f"{budget_ms:g}"]
    c = client.transport.run(argv, timeout=timeout_s)
    want_cfg = sel["config"] if sel else config["fallback"]["config"]
    res: dict[str, Any] = {"shape_key": shape_key, "config": want_cfg,
                           "label": config["configs"].get(want_cfg, {}).get("label"), "ok": False}
    if c.timed_out:
        res["error"] = f"edgetune-check did not finish within {timeout_s:g} s"
        return res
    lines = c.stdout.decode("utf-8", "replace").strip().splitlines()
    try:
        doc = json.loads(lines[-1]) if lines else None
    except ValueError:
        doc = None
    if not isinstance(doc, dict):
        tail = c.stderr.decode("utf-8", "replace").strip().splitlines()[-1:] or [f"exit {c.returncode}"]
        res["error"] = f"edgetune-check gave no result: {device_text(tail[0], 300)}"
        return res
    if doc.get("error"):
        res["error"] = f"the loader refused: {device_text(str(doc['error']), 400)}"
        return res
    cfg = doc.get("config") if isinstance(doc.get("config"), dict) else {}
    res.update({"loader_match": doc.get("match"), "loader_device": doc.get("device"),
                "loader_config": cfg.get("id"), "onnxruntime": doc.get("onnxruntime")})
    problems = []
    if dev is not None and (doc.get("match") not in ("exact", "hardware") or doc.get("device") != dev["name"]):
        problems.append(f"the loader matched this device as '{doc.get('match')}' ({doc.get('device') or 'no device'}), "
                        f"the agent's fingerprint says it is {dev['name']} ({level})")
    if cfg.get("id") != want_cfg:
        problems.append(f"the loader picked configuration {cfg.get('id')}, expected {want_cfg}")
    tuned_ort = (next((m for m in manifest["devices"] if m["fingerprint_key"] == info.fingerprint_key), {}) or {}) \
        .get("runtimes") or {}
    if tuned_ort.get("onnxruntime") and doc.get("onnxruntime") != tuned_ort.get("onnxruntime"):
        res["runtime_note"] = (f"tuned with onnxruntime {tuned_ort['onnxruntime']}, checked with "
                               f"{doc.get('onnxruntime')}")

    # outputs: the loader's own comparison, and the host's on the outputs it pulls
    st = doc.get("selftest") if isinstance(doc.get("selftest"), dict) else {}
    res["loader_selftest"] = st
    if st.get("ok") is not True:
        problems.append("the loader's golden check failed: " + "; ".join(
            f"{o.get('name')}: worst ratio {o.get('worst_ratio')}, cosine {o.get('cosine')}"
            for o in st.get("outputs", []) if isinstance(o, dict) and not o.get("ok")))
    shape = next(s for s in config["shapes"] if s["shape_key"] == shape_key)
    res["host_verification"] = _verify_outputs(client, out_dir, app, shape, sel)
    if not res["host_verification"]["ok"]:
        problems.append("host verification failed: " + res["host_verification"]["reason"])

    # placement
    pl = doc.get("placement") if isinstance(doc.get("placement"), dict) else {"error": "not reported"}
    res["placement"] = pl
    nodes = pl.get("nodes") if isinstance(pl.get("nodes"), dict) else None
    if nodes is None:
        problems.append(f"placement unknown: {pl.get('error')}")
    else:
        total = sum(int(v) for v in nodes.values() if isinstance(v, (int, float)))
        on = int(nodes.get(cfg.get("execution_provider"), 0) or 0)
        res["placement_share"] = on / total if total else None
        if not on:
            problems.append(f"the intended provider {cfg.get('execution_provider')} ran no node ({nodes})")

    res["latency"] = _latency(doc.get("samples_ns"), manifest, info, shape_key, dev)
    if level == "hardware" and "manifest_median_ms" in res["latency"]:
        res["latency"]["note"] = "the same hardware with another kernel, OS build or governor than the tuned device"
    if res["latency"].get("error"):
        problems.append(res["latency"]["error"])
    res["problems"] = problems
    res["ok"] = not problems
    return res


def _verify_outputs(client, out_dir: str, app: Path, shape: dict, sel: dict | None) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="edgetune-export-check-"))
    try:
        worst = []
        acc = Accuracy()
        for k, (ref_rel, spec, tol) in enumerate(zip(shape["golden"]["outputs"], shape["outputs"],
                                                     shape["golden"]["tolerance"])):
            local = tmp / f"output_{k}.npy"
            try:
                client.transport.pull(f"{out_dir}/output_{k}.npy", str(local))
                out = np.load(local, allow_pickle=False)
            except (DeviceError, OSError, ValueError) as exc:
                return {"ok": False, "reason": f"output {spec['name']}: not readable from the device ({exc})"}
            ref = np.load(app / ref_rel, allow_pickle=False)
            if out.shape != ref.shape or out.dtype != ref.dtype:
                return {"ok": False, "reason": f"output {spec['name']}: {out.dtype}{list(out.shape)} from the device, "
                                               f"golden {ref.dtype}{list(ref.shape)}"}
            e = compare(out, ref, Tolerance(tol["atol"], tol["rtol"], tol["norm"]))
            acc.add(spec["name"], out, ref)
            worst.append({"name": spec["name"], "max_abs": e.max_abs, "norm_rel": e.norm_rel, "worst_ratio": e.excess})
        if sel and sel.get("accuracy"):
            bad = AccuracyBudget.from_dict(sel["accuracy"]).violations(acc)
            return {"ok": not bad, "rule": "accuracy budget", "accuracy": acc.as_dict(), "outputs": worst,
                    "reason": "; ".join(bad)}
        bad = [w for w in worst if not (w["worst_ratio"] <= 1.0 and w["norm_rel"] <= _tol_norm(shape, w["name"]))]
        return {"ok": not bad, "rule": "tolerance", "outputs": worst,
                "reason": "; ".join(f"{w['name']}: worst ratio {w['worst_ratio']:.3g}, norm-relative error "
                                    f"{w['norm_rel']:.3g}" for w in bad)}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _tol_norm(shape: dict, name: str) -> float:
    for spec, tol in zip(shape["outputs"], shape["golden"]["tolerance"]):
        if spec["name"] == name:
            return float(tol["norm"])
    return 0.0


def _latency(samples: Any, manifest: dict, info, shape_key: str, dev: dict | None) -> dict[str, Any]:
    if not isinstance(samples, list) or not samples or not all(isinstance(x, int) and x > 0 for x in samples):
        return {"error": "the loader reported no valid timings"}
    sd = summarize(np.asarray(samples, np.float64)).as_dict()
    med, ci = sd["median_ms"], sd["ci95_ms"]
    out: dict[str, Any] = {"median_ms": med, "ci95_ms": ci, "n": sd["n"], "p10_ms": sd["p10_ms"], "p90_ms": sd["p90_ms"]}
    fig = next((f for f in manifest.get("figures", []) if dev and f["fingerprint_key"] == dev["fingerprint_key"]
                and f["shape_key"] == shape_key), None)
    if fig is None or fig.get("median_ms") is None:
        out["compared"] = "no figure in the manifest for this device (fallback)"
        return out
    out.update({"manifest_median_ms": fig["median_ms"], "manifest_ci95_ms": fig["ci95_ms"],
                "manifest_basis": fig["basis"], "ratio": med / fig["median_ms"]})
    if info.emulated:
        out["compared"] = "emulated device: timings are not comparable, no gap is flagged"
        out["gap"] = False
        return out
    same = reproduced(fig["median_ms"], fig["ci95_ms"], med, ci, LATENCY_TOLERANCE)
    out["gap"] = not same
    out["compared"] = ("within the manifest's interval or ±5%" if same else
                       f"gap: {med:.4g} ms in the loader vs {fig['median_ms']:.4g} ms "
                       f"[{fig['ci95_ms'][0]:.4g}, {fig['ci95_ms'][1]:.4g}] in the tune "
                       f"({(med / fig['median_ms'] - 1) * 100:+.0f}%)")
    if not math.isfinite(out["ratio"]):
        out["gap"] = True
    return out
