#!/usr/bin/env python3
"""NNCF's int8 recipes on zoo models: what each keeps of the fp32 function, and how fast OpenVINO
runs it, beside OpenVINO's defaults and the onnxruntime default, in one process.

The exploration behind the openvino space's recipe list (``edgetune.space.openvino.NNCF_RECIPES``)
and behind the recipes it does not race. Each recipe is calibrated on 16 seeded sets; the cosine is
the worst over 6 other seeded sets (never calibrated on) against onnxruntime's fp32 output, as the
tuner's verdict takes it; latency is the median of 15 runs of OpenVINO's LATENCY hint with the
non-quantized ops in bf16 (what OpenVINO computes in by default on a CPU with bf16 units) and in f32.
Recipes:

  - ``nncf``: the default preset; ``mixed``: asymmetric activations; ``mixed-fbc``: and full bias
    correction (the space's ``nncf-mixed``); ``tr``: NNCF's transformer model type;
  - ``ac``: ``nncf.quantize_with_accuracy_control`` with the mixed preset, validated by onnxruntime
    on 4 further seeded sets, metric the worst cosine to fp32, ``max_drop`` 0.0004 (half of a
    ``cosine=0.999`` budget's room, for the margin to the verification inputs).

The timings are one process's medians: a screen, not a verdict (the tuner's interleaved rounds are).

    .venv/bin/python tools/bench/bench_nncf_recipes.py mobilenetv3 nncf,mixed-fbc,ac
    .venv/bin/python tools/bench/bench_nncf_recipes.py bert_base nncf,tr --dim seq=128
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

os.environ["NNCF_CI"] = "1"  # no telemetry from NNCF or OpenVINO
sys.modules.setdefault("openvino_telemetry", None)
ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from edgetune.modelfile import load_model  # noqa: E402
from edgetune.workload import build_workload  # noqa: E402
import models.zoo as zoo  # noqa: E402


def _cos(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b) + 1e-300))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", help="a zoo model name (built at full size)")
    ap.add_argument("recipes", help="comma-separated: nncf, mixed, mixed-fbc, tr, ac")
    ap.add_argument("--dim", action="append", default=[], help="NAME=N (batch=1 unless given)")
    args = ap.parse_args()
    import nncf
    import onnx
    import onnxruntime as ort
    import openvino as ov

    work = Path(tempfile.mkdtemp(prefix="nncf-recipes-"))
    try:
        return _run(args, work, nncf, onnx, ort, ov)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _run(args, work: Path, nncf, onnx, ort, ov) -> int:
    path = zoo.build(args.model, "full", work)
    model = load_model(path)
    dims = {"batch": 1, **{k: int(v) for k, v in (d.split("=", 1) for d in args.dim)}}
    names = [i.name for i in model.inputs]
    sets = {name: [dict(zip(names, s)) for s in build_workload(model, dims, None, n_seeded=n, seed=seed).input_sets]
            for name, n, seed in (("cal", 16, 123), ("val", 6, 999), ("ac", 4, 555))}
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    refs = {k: [sess.run(None, f) for f in v] for k, v in sets.items()}
    core = ov.Core()

    def timed(fn) -> float:
        ts = []
        for _ in range(15):
            t = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t)
        return float(np.median(ts) * 1e3)

    def on_openvino(m: str | Path, precision: str) -> tuple[float, float]:
        cm = core.compile_model(str(m), "CPU", {"INFERENCE_PRECISION_HINT": precision, "PERFORMANCE_HINT": "LATENCY"})
        req = cm.create_infer_request()
        worst = 1.0
        for f, ref in zip(sets["val"], refs["val"]):
            out = req.infer(f)
            worst = min([worst] + [_cos(out[o], r) for o, r in zip(cm.outputs, ref)])
        return worst, timed(lambda: req.infer(sets["val"][0]))

    def row(name: str, m: str | Path, build_s: float | None = None) -> None:
        (cb, tb), (cf, tf) = on_openvino(m, "bf16"), on_openvino(m, "f32")
        b = f"{build_s:.0f}" if build_s is not None else "-"
        print(f"| {args.model} | {name} | {b} | {cb:.6f} | {tb:.2f} | {cf:.6f} | {tf:.2f} |", flush=True)

    print("| model | form | build s | cosine (rest bf16) | ms | cosine (rest f32) | ms |\n|---|---|---|---|---|---|---|")
    row("OpenVINO, no int8", path)
    print(f"| {args.model} | onnxruntime default | - | 1 | {timed(lambda: sess.run(None, sets['val'][0])):.2f} | | |",
          flush=True)
    proto = onnx.load(str(path))
    calls = [0]
    for recipe in args.recipes.split(","):
        kw: dict = {}
        if recipe in ("mixed", "mixed-fbc", "ac"):
            kw["preset"] = nncf.QuantizationPreset.MIXED
        if recipe == "mixed-fbc":
            kw["fast_bias_correction"] = False
        if recipe == "tr":
            kw["model_type"] = nncf.ModelType.TRANSFORMER
        t0 = time.time()
        cal = nncf.Dataset(sets["cal"])
        if recipe == "ac":
            from nncf.quantization.advanced_parameters import AdvancedAccuracyRestorerParameters

            def validate(m, data):
                calls[0] += 1
                s = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
                vals = []
                for f in data:
                    i = next(k for k, g in enumerate(sets["ac"]) if g is f)
                    vals.append(min(_cos(o, r) for o, r in zip(s.run(None, f), refs["ac"][i])))
                return float(min(vals)), vals

            q = nncf.quantize_with_accuracy_control(
                proto, cal, nncf.Dataset(sets["ac"]), validate, max_drop=0.0004, subset_size=len(sets["cal"]),
                advanced_accuracy_restorer_parameters=AdvancedAccuracyRestorerParameters(ranking_subset_size=2), **kw)
        elif recipe in ("nncf", "mixed", "mixed-fbc", "tr"):
            q = nncf.quantize(proto, cal, subset_size=len(sets["cal"]), **kw)
        else:
            raise SystemExit(f"unknown recipe {recipe!r}")
        build_s = time.time() - t0
        out = work / f"{recipe}.onnx"
        onnx.save(q, str(out))
        row(f"int8 {recipe}" + (f" ({calls[0]} validations)" if recipe == "ac" else ""), out, build_s)
    return 0


if __name__ == "__main__":
    sys.exit(main())
