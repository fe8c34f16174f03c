"""onnxruntime candidates whose MODEL is rewritten on the host: int8 quantization, transformer fusions.

The defaults of onnxruntime (``ort``) already fuse and lay out well; what it does not do by itself
is change the model's precision or apply the fusions of its transformer optimizer. Those are the
levers here, each a candidate measured and verified on the device like any other, run with
onnxruntime's default session options so the rewrite is the only change:

``ort-int8`` (approximate: ``precision=int8``; an accuracy verdict against the fp32 reference and
selectable only within the user's ``--accuracy`` budget, edgetune/accuracy.py):

* ``dynamic-matmul``: ``quantize_dynamic`` of MatMul/Gemm only (weights int8, activations
  quantized at run time): the transformer lever;
* ``dynamic``: ``quantize_dynamic`` of every op it supports (Conv too);
* ``qdq-u8s8`` / ``qdq-s8s8``: ``quantize_static`` in QDQ format, per-channel weights, activations
  uint8 / int8, MinMax-calibrated on ``CALIBRATION_SETS`` seeded inputs at the shape point (seeds
  of their own: never the inputs the candidate is verified on; ``BIG_CALIBRATION_SETS`` for a model
  past 1.5 GB, whose activations take gigabytes a set) plus the user's ``--input`` set;
* ``qdq-u8s8-rr``: the same with ``reduce_range`` (7-bit weights, for CPUs without VNNI, whose
  u8s8 dot products can saturate);
* on models the transformer optimizer fuses, ``fused+dynamic-matmul``: fused first, then
  quantized, onnxruntime's own recipe for BERT/GPT-2.

``ort-fused`` (exact: verified within the fp32 tolerance like any exact candidate):
``onnxruntime.transformers.optimizer`` fusions (Attention, SkipLayerNormalization, BiasGelu, ...;
its Gelu approximation stays off) for the model types whose patterns the graph has: ``bert``
(encoders and ViT), ``gpt2`` (decoders with a KV cache). A model in which nothing fuses is a
build failure that says so.

fp16 is not a candidate here: onnxruntime's CPU provider runs most fp16 ops through casts to
float32 (slower, not faster), and no device of this farm offers a provider with native fp16
kernels (XNNPACK, NNAPI, QNN, CUDA). ``Candidate.approximate`` already covers ``precision=fp16``
for when one does.

Rewritten models are cached content-addressed (model sha256, rewrite parameters, onnxruntime
version, calibration inputs) under the private artifacts directory, written to a temporary name
and renamed, so an interrupted build never leaves a half-written model behind.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from edgetune.agent.host import AgentInfo
from edgetune.candidate import REWRITE_KEYS, Candidate
from edgetune.space import BuildFailed, Prepared
from edgetune.modelfile import Model, external_data_files
from edgetune.workload import Workload, build_workload

CALIBRATION_SETS = 8
BIG_CALIBRATION_SETS = 2
EXTERNAL_BYTES = 1_500_000_000
FAILED_MARK = "edgetune-build-failed:"  # a rewritten model this big is written with external data
# in this order --max-candidates samples them (every len/n-th): the MatMul-only and the static recipes first
INT8_VARIANTS = ("dynamic-matmul", "qdq-u8s8", "dynamic", "qdq-s8s8", "qdq-u8s8-rr")
STATIC = {"qdq-u8s8": ("QUInt8", False), "qdq-s8s8": ("QInt8", False), "qdq-u8s8-rr": ("QUInt8", True)}


def _ops(model: Model) -> set[str]:
    import onnx

    m = onnx.load(str(model.path), load_external_data=False)
    return {n.op_type for n in m.graph.node}


def fusion_types(model: Model) -> list[str]:
    """The transformer optimizer's model types whose patterns this graph may hold."""
    if model.format != "onnx":
        return []
    ops = _ops(model)
    if "Softmax" not in ops or not ({"MatMul", "Gemm"} & ops):
        return []
    has_cache = any("past" in s.name.lower() for s in model.inputs)
    return ["gpt2"] if has_cache else ["bert"]


def _ort_version() -> str:
    import onnxruntime

    return onnxruntime.__version__


@contextlib.contextmanager
def _quiet():
    """onnxruntime's quantization and transformer tools advise on the root logger ("consider
    pre-processing", "model producer not matched"): not the user's business, kept off their terminal."""
    logging.disable(logging.WARNING)
    try:
        yield
    finally:
        logging.disable(logging.NOTSET)


def _big(path: Path) -> bool:
    """Past protobuf's 2 GiB limit (or already external): rewrite with external data."""
    return bool(external_data_files(path)) or path.stat().st_size > EXTERNAL_BYTES


def _built(final: Path) -> Path | None:
    """The model a finished build left in its cache directory, if any."""
    return next(final.glob("*.onnx"), None) if final.is_dir() else None


def cached_build(cache_dir: Path, kind: str, payload: dict[str, Any], spec: dict[str, Any],
            feeds: list[dict[str, Any]] | None = None) -> Path:
    """The artifact a rewrite (``spec``: ``fuse`` or ``quantize``, run by ``_child``) builds, cached
    in a directory of its own per key (a model and its external data files, if any). The rewrite
    runs in a child process in a temporary directory, renamed into place when it succeeded: the
    rewriting tools hold several copies of the model in memory, and a model that does not fit is
    this candidate's build failure (the child is what the kernel's OOM killer stops), not the end of
    the tune."""
    key = hashlib.sha256(json.dumps({**payload, "ort": _ort_version()}, sort_keys=True).encode()).hexdigest()[:20]
    d = cache_dir / kind
    d.mkdir(parents=True, exist_ok=True)
    final = d / key
    done = _built(final)
    if done:
        return done
    tmp = Path(tempfile.mkdtemp(prefix=".build-", dir=d))
    try:
        out_dir = tmp / "out"
        out_dir.mkdir()
        spec = {**spec, "out_dir": str(out_dir)}
        if feeds is not None:
            names = list(feeds[0]) if feeds else []
            np.savez(tmp / "feeds.npz", **{f"s{i}_k{k}": f[n] for i, f in enumerate(feeds) for k, n in enumerate(names)})
            spec.update(feeds=str(tmp / "feeds.npz"), feed_names=names, feed_sets=len(feeds))
        (tmp / "spec.json").write_text(json.dumps(spec))
        p = subprocess.run([sys.executable, "-m", "edgetune.space.ort_rewrite", str(tmp / "spec.json")],
                           capture_output=True, text=True)
        if p.returncode != 0:
            lines = [ln for ln in p.stderr.strip().splitlines() if ln.strip()]
            mark = [ln for ln in lines if ln.startswith(FAILED_MARK)]
            if mark:
                raise BuildFailed(mark[-1][len(FAILED_MARK):].strip())
            if p.returncode < 0:
                why = ("killed: out of memory (the rewrite holds several copies of the model)"
                       if p.returncode == -9 else f"killed by signal {-p.returncode}")
            else:
                why = (lines[-1] if lines else f"exit {p.returncode}")[:300]
            raise BuildFailed(f"{kind}: {why}")
        made = out_dir / p.stdout.strip().splitlines()[-1]
        os.replace(out_dir, final)
        return final / made.name
    except OSError as exc:
        done = _built(final)  # another build of the same key won the race: use it
        if done:
            return done
        raise BuildFailed(f"{kind}: {exc}") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _child(spec_path: str) -> int:
    """``python -m edgetune.space.ort_rewrite SPEC.json``: one rewrite; prints the model's file name
    (in ``out_dir``, with its external data files and nothing else)."""
    spec = json.loads(Path(spec_path).read_text())
    out_dir = Path(spec["out_dir"])
    try:
        with _quiet():
            feeds = None
            if spec.get("feeds"):
                z = np.load(spec["feeds"], allow_pickle=False)
                feeds = [{n: z[f"s{i}_k{k}"] for k, n in enumerate(spec["feed_names"])}
                         for i in range(int(spec["feed_sets"]))]
            if spec["op"] == "fuse":
                made = fuse(Path(spec["src"]), spec["model_type"], out_dir)
            elif spec["op"] == "nncf":
                made = quantize_nncf(Path(spec["src"]), feeds or [], out_dir, spec.get("recipe", "nncf"))
            else:
                made = quantize(Path(spec["src"]), spec["variant"], feeds, out_dir)
        keep = {made.name, *external_data_files(made)}
        for f in out_dir.iterdir():  # intermediate files of the recipe (pre-processed, augmented models)
            if f.name not in keep:
                f.unlink() if f.is_file() else shutil.rmtree(f)
    except BuildFailed as exc:
        print(f"{FAILED_MARK} {exc}", file=sys.stderr)
        return 3
    except Exception as exc:  # the rewriting library's own error: this candidate's build failure
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        print(f"{FAILED_MARK} {spec['op']}: {first[:300]}", file=sys.stderr)
        return 3
    print(made.name)
    return 0


def fuse(model_path: Path, model_type: str, out_dir: Path) -> Path:
    from onnxruntime.transformers.fusion_options import FusionOptions
    from onnxruntime.transformers.optimizer import optimize_model

    opts = FusionOptions(model_type)
    opts.enable_gelu_approximation = False  # exact candidates only: no tanh Gelu
    m = optimize_model(str(model_path), model_type=model_type, num_heads=0, hidden_size=0,
                       optimization_options=opts, opt_level=0, use_gpu=False)
    fused = {k: v for k, v in (m.get_fused_operator_statistics() or {}).items() if v}
    if not fused:
        raise BuildFailed(f"fuse-{model_type}: the transformer optimizer found nothing to fuse in this graph")
    out = out_dir / "fused.onnx"
    m.save_model_to_file(str(out), use_external_data_format=_big(model_path))
    return out


class _Reader:
    """onnxruntime's CalibrationDataReader over a list of feeds."""

    def __init__(self, feeds: list[dict[str, Any]]):
        self._it = iter(feeds)

    def get_next(self):
        return next(self._it, None)

    def rewind(self):  # pragma: no cover - used by some calibrators
        pass


def calibration_feeds(wl: Workload) -> list[dict[str, Any]]:
    """Calibration inputs at the workload's shape point: seeded sets of their own (a seed derived
    from the workload's, never the verification inputs) and the user's ``--input`` set when given."""
    seed = int.from_bytes(hashlib.sha256(f"edgetune-calibration:{wl.seed}".encode()).digest()[:4], "little")
    user = dict(zip(wl.input_names, wl.input_sets[-1])) if wl.user_input_sets else {}
    # the calibrator keeps every set's activations in memory (onnxruntime 1.20's option to bound that
    # drops the data it collected): a model past 1.5 GB (gigabytes of activations a set) gets fewer
    n = CALIBRATION_SETS if not _big(wl.model.path) else BIG_CALIBRATION_SETS
    cal = build_workload(wl.model, wl.bindings, user, n_seeded=n, seed=seed)
    return [dict(zip(cal.input_names, s)) for s in cal.input_sets]


def quantize(src: Path, variant: str, feeds: list[dict[str, Any]] | None, out_dir: Path) -> Path:
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_dynamic, quantize_static

    out = out_dir / "int8.onnx"
    if variant in ("dynamic-matmul", "dynamic"):
        ops = ["MatMul", "Gemm"] if variant == "dynamic-matmul" else None
        import onnx

        # DefaultTensorType: a fused graph has contrib ops (Attention, ...) shape inference cannot type
        quantize_dynamic(str(src), str(out), op_types_to_quantize=ops, weight_type=QuantType.QInt8,
                         use_external_data_format=_big(src),
                         extra_options={"MatMulConstBOnly": True, "DefaultTensorType": onnx.TensorProto.FLOAT})
        return out
    act, rr = STATIC[variant]
    big = _big(src)
    pre = src
    if not big:  # pre-processing (shape inference, folding) is an optimisation of the recipe, not required
        try:
            from onnxruntime.quantization.shape_inference import quant_pre_process

            quant_pre_process(str(src), str(out_dir / "pre.onnx"), skip_symbolic_shape=True)
            pre = out_dir / "pre.onnx"
        except Exception:
            pre = src
    quantize_static(str(pre), str(out), _Reader(feeds or []), quant_format=QuantFormat.QDQ, per_channel=True,
                    use_external_data_format=big,
                    reduce_range=rr, activation_type=getattr(QuantType, act), weight_type=QuantType.QInt8,
                    calibrate_method=CalibrationMethod.MinMax,
                    extra_options={"ActivationSymmetric": act == "QInt8", "WeightSymmetric": True})
    return out


def quantize_nncf(src: Path, feeds: list[dict[str, Any]], out_dir: Path, recipe: str = "nncf") -> Path:
    """NNCF's post-training quantization (its ONNX backend: a QDQ model OpenVINO runs in int8),
    calibrated on ``feeds`` (all of them; symmetric per-channel weights). ``recipe``: ``nncf`` (the
    default preset), ``nncf-mixed`` (asymmetric activations, full bias correction) or
    ``nncf-transformer`` (NNCF's transformer model type)."""
    # NNCF reports usage to Intel's telemetry unless told it runs in CI: nothing leaves this host
    os.environ["NNCF_CI"] = "1"
    sys.modules.setdefault("openvino_telemetry", None)  # and OpenVINO's import (nncf imports it) neither
    import nncf
    import onnx

    model = onnx.load(str(src))
    if _big(src):
        raise BuildFailed("int8 by NNCF: models with external data are not quantized here")
    options: dict[str, Any] = {
        "nncf": {},
        "nncf-mixed": {"preset": nncf.QuantizationPreset.MIXED, "fast_bias_correction": False},
        "nncf-transformer": {"model_type": nncf.ModelType.TRANSFORMER},
    }[recipe]
    quantized = nncf.quantize(model, nncf.Dataset(feeds), subset_size=len(feeds), **options)
    out = out_dir / "int8.onnx"
    onnx.save(quantized, str(out))
    return out


def _session_params(cand: Candidate) -> dict[str, Any]:
    return {k: v for k, v in cand.param_dict.items() if k not in REWRITE_KEYS}


def _available(model: Model, info: AgentInfo) -> bool:
    return model.format == "onnx" and "onnxruntime" in info.runtimes


class OrtInt8Space:
    name = "ort-int8"

    def candidates(self, model: Model, info: AgentInfo) -> list[Candidate]:
        if not _available(model, info):
            return []
        out = [Candidate.make("ort", {"precision": "int8", "quant": v}) for v in INT8_VARIANTS]
        for t in fusion_types(model):
            out.append(Candidate.make("ort", {"precision": "int8", "quant": "dynamic-matmul", "rewrite": f"fuse-{t}"}))
        return out

    def prepare(self, cand: Candidate, workload: Workload, info: AgentInfo, cache_dir: Path) -> Prepared:
        p = cand.param_dict
        variant = str(p["quant"])
        model = workload.model
        src, payload = model.path, {"model": model.sha256, "quant": variant, "rewrite": p.get("rewrite")}
        if p.get("rewrite"):
            mtype = str(p["rewrite"]).removeprefix("fuse-")
            src = cached_build(cache_dir, "ort-fused", {"model": model.sha256, "type": mtype},
                          {"op": "fuse", "src": str(model.path), "model_type": mtype})
        feeds = None
        if variant in STATIC:
            feeds = calibration_feeds(workload)
            payload["calibration"] = [hashlib.sha256(b"".join(a.tobytes() for a in f.values())).hexdigest()[:16]
                                      for f in feeds]
        art = cached_build(cache_dir, "ort-int8", payload, {"op": "quantize", "src": str(src), "variant": variant}, feeds)
        return Prepared("ort", art, _session_params(cand))


class OrtFusedSpace:
    name = "ort-fused"

    def candidates(self, model: Model, info: AgentInfo) -> list[Candidate]:
        if not _available(model, info):
            return []
        return [Candidate.make("ort", {"rewrite": f"fuse-{t}"}) for t in fusion_types(model)]

    def prepare(self, cand: Candidate, workload: Workload, info: AgentInfo, cache_dir: Path) -> Prepared:
        mtype = str(cand.param_dict["rewrite"]).removeprefix("fuse-")
        model = workload.model
        art = cached_build(cache_dir, "ort-fused", {"model": model.sha256, "type": mtype},
                      {"op": "fuse", "src": str(model.path), "model_type": mtype})
        return Prepared("ort", art, _session_params(cand))


INT8 = OrtInt8Space()
FUSED = OrtFusedSpace()


if __name__ == "__main__":
    sys.exit(_child(sys.argv[1]))
