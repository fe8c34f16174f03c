#!/usr/bin/env python3
"""An app artifact on the local device: the loader's latency against the tune's figure, and the
model form the export picks for x86_64 (ONNX) against onnxruntime's ORT format.

1. Tunes a bundled model on the local device (ort space), exports it for Linux and runs
   ``export check`` on it: the loader's median per run of the golden input, with the tune's figure
   and interval from the manifest.
2. On a copy of the artifact, the selected configuration is timed through the same C loader
   (edgetune-check) with the exported ONNX model and with an ORT-format model saved at the same
   optimization level (NCHWc layout transformer excluded, as onnxruntime's converter does):
   ``--pairs`` interleaved pairs (ONNX, ORT, ORT, ONNX, ...), each one fresh process; medians of the
   per-process medians and their ratio.

    .venv/bin/python tools/bench/bench_export.py [--model mobilenet] [--pairs 10] [--budget-ms 1000]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def edgetune(args, home) -> dict:
    env = {**os.environ, "EDGETUNE_HOME": str(home)}
    p = subprocess.run([sys.executable, "-m", "edgetune.cli.main", *map(str, args), "--format", "json"],
                       capture_output=True, text=True, env=env, timeout=1800)
    if p.returncode not in (0, 1):
        sys.exit(f"edgetune {' '.join(map(str, args))} failed: {p.stderr.strip()[-500:]}")
    return json.loads(p.stdout)


def loader_median(art: Path, ort_lib: Path, budget_ms: float) -> float:
    m = json.loads((art / "manifest.json").read_text())
    b = m["loaders"]["built"]["x86_64-linux-gnu"]
    (art / "out").mkdir(exist_ok=True)
    p = subprocess.run([str(art / b["check"]), "--loader", str(art / b["library"]), "--artifact", str(art),
                        "--ort-lib", str(ort_lib), "--out", str(art / "out"), "--budget-ms", f"{budget_ms:g}",
                        "--iters", "20"], capture_output=True, text=True, timeout=600)
    doc = json.loads(p.stdout.strip().splitlines()[-1])
    if doc.get("error") or not doc["selftest"]["ok"]:
        sys.exit(f"loader run failed: {doc.get('error') or doc['selftest']}")
    return float(np.median(doc["samples_ns"])) / 1e6


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="mobilenet")
    ap.add_argument("--pairs", type=int, default=10)
    ap.add_argument("--budget-ms", type=float, default=1000.0)
    ap.add_argument("--tune-budget", type=float, default=20.0)
    args = ap.parse_args()
    import onnxruntime

    from edgetune.export import save_ort

    work = Path(tempfile.mkdtemp(prefix="bench-export-"))
    try:
        home, db = work / "home", work / "t.db"
        tuned = edgetune(["tune", args.model, "--space", "ort", "--budget", args.tune_budget, "--db", db], home)
        run_id = tuned["runs"][0]["run_id"]
        art = work / "art"
        edgetune(["export", run_id, "--target", "linux", "-o", art, "--db", db, "--abi", "x86_64-linux-gnu"], home)
        res = edgetune(["export", "check", art, "-d", "local", "--budget-ms", args.budget_ms], home)
        print(f"model {args.model}, onnxruntime {onnxruntime.__version__}, run {run_id}")
        for s in res["shapes"]:
            lat = s["latency"]
            print(f"export check: {s['label']} at {s['shape_key']}: loader {lat['median_ms']:.3f} ms "
                  f"[{lat['ci95_ms'][0]:.3f}, {lat['ci95_ms'][1]:.3f}] (n={lat['n']}), tune "
                  f"{lat['manifest_median_ms']:.3f} ms [{lat['manifest_ci95_ms'][0]:.3f}, "
                  f"{lat['manifest_ci95_ms'][1]:.3f}] ({lat['manifest_basis']}): ratio {lat['ratio']:.3f}, "
                  f"{'GAP flagged' if lat['gap'] else 'no gap'}; outputs "
                  f"{'verified' if s['host_verification']['ok'] else 'FAILED'}; placement {s['placement']['nodes']}")

        # the model form: the exported ONNX model against an ORT-format one, same configuration, same loader
        cfg = json.loads((art / "config.json").read_text())
        cid = cfg["devices"][0]["selected"][0]["config"]
        chosen = cfg["configs"][cid]
        level = {0: "disable", 1: "basic", 2: "extended", 99: "all"}[chosen.get("graph_optimization_level", 99)]
        onnx_art, ort_art = work / "as-onnx", work / "as-ort"
        shutil.copytree(art, onnx_art)
        shutil.copytree(art, ort_art)
        ort_model = ort_art / "models" / "bench.ort"
        save_ort(ort_art / chosen["model"], ort_model, level, None)
        from edgetune.hashing import sha256_file

        chosen_ort = dict(chosen, model="models/bench.ort", files=[{"path": "models/bench.ort",
                                                                     "sha256": sha256_file(ort_model)}])
        cfg["configs"][cid] = chosen_ort
        (ort_art / "config.json").write_text(json.dumps(cfg))
        ort_lib = sorted((Path(onnxruntime.__file__).parent / "capi").glob("libonnxruntime.so*"))[0]
        meds = {"onnx": [], "ort": []}
        for i in range(args.pairs):
            order = ("onnx", "ort") if i % 2 == 0 else ("ort", "onnx")
            for form in order:
                meds[form].append(loader_median(onnx_art if form == "onnx" else ort_art, ort_lib, args.budget_ms / 2))
        a, b = float(np.median(meds["onnx"])), float(np.median(meds["ort"]))
        print(f"model form, '{chosen['label']}' (level {level}), {args.pairs} interleaved pairs of fresh processes: "
              f"ONNX {a:.3f} ms, ORT format {b:.3f} ms: ORT format / ONNX = {b / a:.3f}")
        per_pair = np.array(meds["ort"]) / np.array(meds["onnx"])
        print(f"  per-pair ratios: min {per_pair.min():.3f}, median {np.median(per_pair):.3f}, max {per_pair.max():.3f}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
