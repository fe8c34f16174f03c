"""ONNX -> .tflite (LiteRT) with onnx2tf, at one shape point, mapped and verified on the host.

onnx2tf needs TensorFlow, which needs a numpy edgetune's environment does not have: it runs in an
environment of its own (``<sys.prefix>/share/edgetune/onnx2tf-venv``, made by tools/setup.sh),
as a child process (``_onnx2tf_child.py``) whose output goes to a log file in the cache, never to
ours. Precisions:

* ``fp32``: onnx2tf's float32 model (exact: verified within the float32 tolerance);
* ``fp16``: onnx2tf's float16 model (weights float16);
* ``int8-dynamic``: TensorFlow Lite's dynamic-range quantization of onnx2tf's SavedModel (int8
  weights, activations quantized at run time);
* ``int8-full``: full int8 (weights and activations), calibrated on ``CALIBRATION_SETS`` seeded
  input sets of a seed of their own (never the inputs a candidate is verified on); float32 at the
  model's inputs and outputs.

onnx2tf turns channel-first tensors (NCHW) into channel-last ones (NHWC) and names tensors its own
way, so every converted model gets an explicit **layout mapping**: for each ONNX input, in the
ONNX order, the .tflite input tensor's index and the permutation ``perm`` with
``tflite_input = onnx_input.transpose(perm)``; for each ONNX output, the .tflite output tensor's
index and ``perm`` with ``onnx_output = tflite_output.transpose(perm)``. Tensors are matched by name
(onnx2tf keeps the ONNX names in the model's signature), else by shape; an ambiguous match is a
``conversion-mismatch``. Where several permutations fit a shape (a square image, seq == hidden), the
fp32 model's outputs on the workload's seeded inputs decide; a conversion whose outputs match the
float64 reference under no mapping is a ``conversion-mismatch``. fp16/int8 models reuse the fp32
mapping (same SavedModel) and must pass only a loose sanity bound (``APPROX_NORM``): their accuracy
verdict is the device run's, against the user's budget.

Results are cached under ``cache_dir/onnx2tf/<key>`` (a directory per key: written to a temporary
directory and renamed, so no half-written model is left), keyed by the model's sha256, the input
shapes, the precision, the calibration inputs, and the versions of onnx2tf, TensorFlow and this
recipe. A conversion that failed for a reason of its own (not a timeout or a kill) is remembered
under the same key (``<key>.failed``), so the candidates that share it fail at once. One that timed
out is remembered with its limit and the machine's load then (``<key>.timeout``): a later run with
the same or a shorter limit fails at once with that reason instead of spending the same minutes
again, and one with a longer limit tries again, as does one on a machine no longer oversubscribed
when the timeout was (load above its cores then, not now); a success removes the mark.
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import itertools
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from edgetune.private import write_atomic_file
from edgetune.space import BuildFailed
from edgetune.verify import compare, tolerance_for
from edgetune.workload import Workload, build_workload

RECIPE_VERSION = 1  # bump when the conversion recipe (child script, options) changes
PRECISIONS = ("fp32", "fp16", "int8-dynamic", "int8-full")
CALIBRATION_SETS = 8
CONVERT_TIMEOUT_S = 900.0
# fp16/int8 models: a norm-relative error above this is a broken conversion (a layout or a wrong op),
# not a precision loss; the accuracy the user cares about is judged later, from the device run
APPROX_NORM = 0.5
MAX_MAPPINGS = 16  # input permutations tried when shapes alone cannot decide
PROBE_SEED = 20240611  # onnx2tf's own sample images (it validates on them): ours, seeded
FAILED_MARK = "edgetune-convert-failed:"
_CHILD = Path(__file__).with_name("_onnx2tf_child.py")


# ---- the converter environment ---------------------------------------------------------------
def converter_dir() -> Path:
    return Path(sys.prefix) / "share" / "edgetune" / "onnx2tf-venv"


def converter_python() -> Path | None:
    py = converter_dir() / "bin" / "python"
    return py if py.is_file() and os.access(py, os.X_OK) else None


def unavailable_reason() -> str | None:
    """Why no model can be converted here (None: it can)."""
    if converter_python() is None:
        return f"the onnx2tf converter environment is missing ({converter_dir()}): run make setup"
    v = converter_versions()
    if "none" in (v["onnx2tf"], v["tensorflow"]):
        return f"the onnx2tf converter environment ({converter_dir()}) lacks onnx2tf or TensorFlow: run make setup"
    return None


@functools.lru_cache(maxsize=4)
def _dist_versions(site: str) -> dict[str, str]:
    out = {"onnx2tf": "none", "tensorflow": "none"}
    for d in sorted(Path(site).glob("*.dist-info")) if site else []:
        name, _, version = d.name[: -len(".dist-info")].partition("-")
        key = {"onnx2tf": "onnx2tf", "tensorflow_cpu": "tensorflow", "tensorflow": "tensorflow"}.get(name.lower())
        if key and out[key] == "none":
            out[key] = version
    return out


def converter_versions() -> dict[str, str]:
    """onnx2tf's and TensorFlow's versions in the converter environment (from its package metadata:
    no TensorFlow import, which takes seconds)."""
    sites = sorted(converter_dir().glob("lib/python*/site-packages"))
    return dict(_dist_versions(str(sites[0]) if sites else ""))


# ---- the mapping -------------------------------------------------------------------------------
@dataclass(frozen=True)
class TensorMap:
    """One ONNX tensor's place in the .tflite model. Inputs: ``tflite = onnx.transpose(perm)``;
    outputs: ``onnx = tflite.transpose(perm)``."""

    name: str
    index: int
    perm: tuple[int, ...]

    def as_param(self) -> dict[str, Any]:
        return {"index": self.index, "perm": list(self.perm)}


@dataclass(frozen=True)
class Converted:
    path: Path
    precision: str
    inputs: tuple[TensorMap, ...]
    outputs: tuple[TensorMap, ...]
    check: dict[str, Any]  # what the host verification found (error figures)

    def layout_params(self) -> dict[str, Any]:
        """The agent's params for this model (device_agents/PROTOCOL.md, tflite)."""
        return {"inputs": [m.as_param() for m in self.inputs], "outputs": [m.as_param() for m in self.outputs]}

    @classmethod
    def load(cls, d: Path) -> "Converted":
        meta = json.loads((d / "mapping.json").read_text())
        tm = lambda xs: tuple(TensorMap(x["name"], int(x["index"]), tuple(x["perm"])) for x in xs)  # noqa: E731
        return cls(d / "model.tflite", meta["precision"], tm(meta["inputs"]), tm(meta["outputs"]), meta["check"])


def _norm(name: str) -> str:
    return re.sub(r"[^0-9a-z]+", "_", name.lower()).strip("_")


def _perms(src: Sequence[int], dst: Sequence[int]) -> list[tuple[int, ...]]:
    """Permutations p with dst[i] == src[p[i]], most likely first: none, channel-last (onnx2tf's
    NC... -> N...C), then the others."""
    n = len(src)
    if len(dst) != n:
        return []
    first = [tuple(range(n))]
    if n >= 3:
        first.append((0, *range(2, n), 1))
    rest = [p for p in itertools.permutations(range(n)) if p not in first] if n <= 6 else []
    return [p for p in first + rest if all(dst[i] == src[p[i]] for i in range(n))]


def _invert(p: Sequence[int]) -> tuple[int, ...]:
    return tuple(int(i) for i in np.argsort(p))


def _match(kind: str, onnx: list[tuple[str, tuple[int, ...], str]],
           tfl: list[tuple[str, int, tuple[int, ...], str]]) -> list[tuple[int, tuple[int, ...], tuple[int, ...]]]:
    """For each ONNX tensor (name, shape, dtype): (tflite index, tflite shape, ...) matched by name,
    else by shape; ambiguous or missing matches raise BuildFailed."""
    if len(onnx) != len(tfl):
        raise BuildFailed(f"conversion-mismatch: the .tflite has {len(tfl)} {kind}s, the ONNX model {len(onnx)}")
    chosen: dict[int, int] = {}
    for i, (name, _, _) in enumerate(onnx):
        hits = ([j for j, t in enumerate(tfl) if t[0] == name]
                or [j for j, t in enumerate(tfl) if _norm(t[0]) == _norm(name)])
        if len(hits) == 1:
            chosen[i] = hits[0]
    for i, (name, shape, _) in enumerate(onnx):
        if i in chosen:
            continue
        free = [j for j, t in enumerate(tfl) if j not in chosen.values() and _perms(shape, t[2])]
        if len(free) != 1:
            what = "no" if not free else f"{len(free)} ({', '.join(tfl[j][0] for j in free)})"
            raise BuildFailed(f"conversion-mismatch: {kind} {name} {list(shape)}: {what} .tflite {kind}s "
                              f"of a matching shape and no name match")
        chosen[i] = free[0]
    out = []
    for i, (name, shape, dtype) in enumerate(onnx):
        tname, index, tshape, tdtype = tfl[chosen[i]]
        if tdtype != dtype:
            raise BuildFailed(f"conversion-mismatch: {kind} {name} is {tdtype} in the .tflite, "
                              f"{dtype} in the ONNX model")
        if not _perms(shape, tshape):
            raise BuildFailed(f"conversion-mismatch: {kind} {name} {list(shape)} is {list(tshape)} in the .tflite")
        out.append((index, tuple(tshape), tuple(shape)))
    return out


def _interpreter(path: Path):
    from ai_edge_litert.interpreter import Interpreter

    return Interpreter(model_path=str(path))


def _details(interp) -> tuple[list, list]:
    """(inputs, outputs) as (signature name, index, shape, dtype); names from the model's one signature
    (onnx2tf writes the ONNX names there), else the tensors' own."""
    ins = [(d["name"], int(d["index"]), tuple(int(x) for x in d["shape"]), np.dtype(d["dtype"]).name)
           for d in interp.get_input_details()]
    outs = [(d["name"], int(d["index"]), tuple(int(x) for x in d["shape"]), np.dtype(d["dtype"]).name)
            for d in interp.get_output_details()]
    sigs = interp._get_full_signature_list() if hasattr(interp, "_get_full_signature_list") else {}
    if len(sigs) == 1:
        sig = next(iter(sigs.values()))
        by_index = lambda m: {int(v): k for k, v in m.items()}  # noqa: E731
        si, so = by_index(sig.get("inputs", {})), by_index(sig.get("outputs", {}))
        ins = [(si.get(i, n), i, s, d) for n, i, s, d in ins]
        outs = [(so.get(i, n), i, s, d) for n, i, s, d in outs]
    return ins, outs


def _run(interp, inputs: Sequence[tuple[int, tuple[int, ...]]], outputs: Sequence[int],
         sets: Sequence[Sequence[np.ndarray]]) -> list[list[np.ndarray]]:
    res = []
    for s in sets:
        for (index, perm), a in zip(inputs, s):
            interp.set_tensor(index, np.ascontiguousarray(a.transpose(perm)))
        interp.invoke()
        res.append([np.array(interp.get_tensor(i)) for i in outputs])
    return res


def _error(outs: list[list[np.ndarray]], refs: list[list[np.ndarray]], k: int, perm: tuple[int, ...],
           dtype: str, exact: bool) -> tuple[bool, float]:
    """Does output ``k`` (permuted by ``perm``) match the reference on every set? (ok, worst norm error)"""
    worst = 0.0
    tol = tolerance_for(dtype)
    for o, r in zip(outs, refs):
        y = o[k].transpose(perm)
        if y.shape != r[k].shape:
            return False, float("inf")
        e = compare(y, r[k], tol)
        worst = max(worst, e.norm_rel)
        if (exact and (e.excess > 1.0 or e.norm_rel > tol.norm)) or (not exact and not e.norm_rel <= APPROX_NORM):
            return False, worst
    return True, worst


def map_and_verify(path: Path, wl: Workload, precision: str,
                   fixed: tuple[tuple[TensorMap, ...], tuple[TensorMap, ...]] | None = None) -> dict[str, Any]:
    """The verified mapping of ``path`` (the .tflite of ``wl.model`` at ``wl``'s shapes), as mapping.json
    holds it; raises BuildFailed ``conversion-mismatch: ...`` when none matches the reference.
    ``fixed``: the fp32 model's mapping, whose permutations an fp16/int8 model of it keeps."""
    try:
        interp = _interpreter(path)
        interp.allocate_tensors()
        ins, outs = _details(interp)
    except Exception as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        if "Select TensorFlow op" in first:  # onnx2tf allows TensorFlow ops no LiteRT interpreter has built in
            first = "it needs Select TensorFlow (Flex) ops, which the LiteRT interpreter does not run"
        raise BuildFailed(f"conversion failed: the .tflite does not load: {first[:300]}") from None
    model = wl.model
    onnx_in = [(s.name, tuple(wl.input_shapes[s.name]), s.dtype) for s in model.inputs]
    refs = wl.references()
    onnx_out = [(s.name, tuple(r.shape), s.dtype) for s, r in zip(model.outputs, refs[0])]
    mi = _match("input", onnx_in, ins)
    mo = _match("output", onnx_out, outs)
    exact = precision == "fp32"
    if fixed is not None:
        in_choices = [[p.perm] for p in fixed[0]]
        out_choices = [[p.perm] for p in fixed[1]]
    else:
        in_choices = [_perms(shape, tshape) for _, tshape, shape in mi]
        out_choices = [[_invert(p) for p in _perms(shape, tshape)] for _, tshape, shape in mo]
    worst_seen = float("inf")
    for n, combo in enumerate(itertools.product(*in_choices)):
        if n >= MAX_MAPPINGS:
            break
        try:
            got = _run(interp, [(index, p) for (index, _, _), p in zip(mi, combo)], [m[0] for m in mo], wl.input_sets)
        except Exception as exc:
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise BuildFailed(f"conversion failed: the .tflite does not run: {first[:300]}") from None
        out_perms, errs = [], []
        for k, choices in enumerate(out_choices):
            for p in choices:
                ok, err = _error(got, refs, k, p, onnx_out[k][2], exact)
                if ok:
                    out_perms.append(p)
                    errs.append(err)
                    break
                worst_seen = min(worst_seen, err)
            else:
                break
        if len(out_perms) == len(mo):
            return {"precision": precision,
                    "inputs": [{"name": o[0], "index": m[0], "perm": list(p)} for o, m, p in zip(onnx_in, mi, combo)],
                    "outputs": [{"name": o[0], "index": m[0], "perm": list(p)}
                                for o, m, p in zip(onnx_out, mo, out_perms)],
                    "check": {"sets": len(wl.input_sets), "norm_rel_err": max(errs, default=0.0),
                              "bound": "float32 tolerance" if exact else f"norm error <= {APPROX_NORM}"}}
    bound = "the float32 tolerance" if exact else f"a norm error of {APPROX_NORM}"
    raise BuildFailed(f"conversion-mismatch: the {precision} .tflite does not compute the ONNX model's function "
                      f"under any layout mapping (best norm error {worst_seen:.3g}, bound {bound})")


# ---- converting ----------------------------------------------------------------------------------
def _key(payload: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:20]


def _static_onnx(wl: Workload, dst: Path) -> None:
    """The model with its inputs' dimensions fixed at the workload's shape point."""
    import onnx

    m = onnx.load(str(wl.model.path))
    for inp in m.graph.input:
        shape = wl.input_shapes.get(inp.name)
        if shape is None:  # an initializer listed as an input
            continue
        for d, v in zip(inp.type.tensor_type.shape.dim, shape):
            d.ClearField("dim_param")
            d.dim_value = int(v)
    onnx.save(m, str(dst))


def _child(spec: dict[str, Any], workdir: Path, log: Path, timeout_s: float) -> None:
    py = converter_python()
    if py is None:
        raise BuildFailed(f"conversion failed: {unavailable_reason()}")
    (workdir / "spec.json").write_text(json.dumps(spec))
    env = {**os.environ, "PATH": f"{py.parent}{os.pathsep}{os.environ.get('PATH', '')}",  # its onnxsim
           "TF_CPP_MIN_LOG_LEVEL": "2", "CUDA_VISIBLE_DEVICES": "", "PYTHONNOUSERSITE": "1"}
    env.pop("PYTHONPATH", None)
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "wb") as f:
        try:
            p = subprocess.run([str(py), str(_CHILD), str(workdir / "spec.json")], cwd=workdir, env=env,
                               stdin=subprocess.DEVNULL, stdout=f, stderr=subprocess.STDOUT, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            raise _Transient(f"conversion failed: timed out after {timeout_s:g} s (log: {log})",
                             timeout_s=timeout_s) from None
    if p.returncode != 0:
        lines = [ln.strip() for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
        mark = [ln for ln in lines if ln.startswith(FAILED_MARK)]
        if mark:
            raise BuildFailed(f"conversion failed: {mark[-1][len(FAILED_MARK):].strip()[:300]}")
        if p.returncode < 0:
            raise _Transient(f"conversion failed: the converter was killed by signal {-p.returncode} (log: {log})")
        raise BuildFailed(f"conversion failed: {(lines[-1] if lines else f'exit {p.returncode}')[:300]}")


class _Transient(BuildFailed):
    """A failure that may not repeat (a timeout, a kill): never ``.failed``; a timeout is remembered
    with its limit (``timeout_s``; None for a kill)."""

    def __init__(self, reason: str, timeout_s: float | None = None):
        super().__init__(reason)
        self.timeout_s = timeout_s


# conversions that timed out or were killed in this process: not cached on disk (a later run, with
# more time or memory, tries again), but the other candidates of this run that need the same
# conversion fail at once instead of spending the same minutes again
_TRANSIENT: dict[Path, str] = {}


def _load() -> float | None:
    """The 1-minute load average per core, or None where the OS does not say."""
    try:
        return os.getloadavg()[0] / (os.cpu_count() or 1)
    except (AttributeError, OSError):
        return None


def _timed_out(mark: Path) -> tuple[float, str] | None:
    """The limit and reason of a remembered timeout that still holds, or None: no mark, one that cannot
    be read, or one made while the machine was oversubscribed (load above its cores) when it no
    longer is (the same limit may do then)."""
    try:
        d = json.loads(mark.read_text())
        limit, reason, then = float(d["timeout_s"]), str(d["reason"]), d.get("load_per_core")
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    now = _load()
    if isinstance(then, (int, float)) and then > 1.0 and now is not None and now <= 1.0:
        return None
    return limit, reason


def _done(cache: Path, key: str, timeout_s: float) -> Path | None:
    """``cache/key`` where it is built; a remembered failure raised again; None where it is to be built."""
    final = cache / key
    if (final / "mapping.json").is_file():
        return final
    failed = cache / f"{key}.failed"
    if failed.is_file():
        raise BuildFailed(failed.read_text().strip())
    if final in _TRANSIENT:
        raise BuildFailed(f"{_TRANSIENT[final]} (earlier in this run)")
    mark = cache / f"{key}.timeout"
    earlier = _timed_out(mark)
    if earlier and timeout_s <= earlier[0]:
        raise BuildFailed(f"{earlier[1]} (in an earlier run; not tried again within a limit of {timeout_s:g} s: "
                          f"a longer one tries again, up to {CONVERT_TIMEOUT_S:g} s, or remove {mark})")
    return None


def _build(cache: Path, key: str, make, timeout_s: float = CONVERT_TIMEOUT_S) -> Path:
    """The directory ``cache/key``, made by ``make(tmpdir)`` once; a deterministic failure is remembered
    (``key.failed``) and raised again without converting; a timeout (``key.timeout``) is raised again
    without converting while the limit is no longer than the one it ran out of. Two processes that
    need the same key (two tunes on one home, a farm's devices) convert it once: the second waits on
    the key's lock (``.key.lock``, released by the kernel if its holder dies) and then finds it
    built, or its failure."""
    final = _done(cache, key, timeout_s)
    if final is not None:
        return final
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / f".{key}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # (the holder's conversion has its own time limit)
        final = _done(cache, key, timeout_s)
        if final is not None:
            return final
        return _make(cache, key, make)


def _make(cache: Path, key: str, make) -> Path:
    final, mark = cache / key, cache / f"{key}.timeout"
    tmp = Path(tempfile.mkdtemp(prefix=".build-", dir=cache))
    try:
        make(tmp)
        try:
            os.replace(tmp, final)
        except OSError:
            if not (final / "mapping.json").is_file():  # (else: a build of the same key without the lock won)
                raise
        mark.unlink(missing_ok=True)
        return final
    except _Transient as exc:
        _TRANSIENT[final] = str(exc)
        if exc.timeout_s is not None:  # (a mark that held was raised above: this limit is longer)
            load = _load()
            why = str(exc) if load is None else f"{exc} (load {load:.2f} per core then)"
            write_atomic_file(mark, json.dumps({"timeout_s": exc.timeout_s, "reason": why, "load_per_core": load}))
        raise
    except BuildFailed as exc:
        write_atomic_file(cache / f"{key}.failed", str(exc))
        raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def calibration_seed(wl: Workload) -> int:
    """A seed of the calibration inputs' own, never one the verification inputs are made with."""
    return int.from_bytes(hashlib.sha256(f"edgetune-litert-calibration:{wl.seed}".encode()).digest()[:4], "little")


def convert(wl: Workload, precision: str, cache_dir: Path, timeout_s: float = CONVERT_TIMEOUT_S) -> Converted:
    """``wl.model`` as a verified .tflite of ``precision`` at ``wl``'s shapes (cached); BuildFailed
    with a one-line reason otherwise."""
    if precision not in PRECISIONS:
        raise ValueError(f"unknown precision {precision!r}")
    if wl.model.format != "onnx":
        raise BuildFailed("conversion failed: not an ONNX model")
    why = unavailable_reason()
    if why:
        raise BuildFailed(f"conversion failed: {why}")
    cache = Path(cache_dir) / "onnx2tf"
    base = {"recipe": RECIPE_VERSION, "model": wl.model.sha256, **converter_versions(),
            "shapes": {k: list(v) for k, v in wl.input_shapes.items()}, "probe_seed": PROBE_SEED}
    # the fp32 conversion (its SavedModel and fp16 model too), verified within the float32 tolerance
    base_key = _key(base)

    def make_base(tmp: Path) -> None:
        work = tmp / "work"
        work.mkdir()
        _static_onnx(wl, work / "model.onnx")
        _child({"op": "convert", "onnx": str(work / "model.onnx"), "out": str(tmp), "probe_seed": PROBE_SEED},
               work, cache / "logs" / f"{base_key}.log", timeout_s)
        shutil.rmtree(work)
        os.replace(tmp / "fp32.tflite", tmp / "model.tflite")
        (tmp / "mapping.json").write_text(json.dumps(map_and_verify(tmp / "model.tflite", wl, "fp32")))

    fp32_dir = _build(cache, base_key, make_base, timeout_s)
    fp32 = Converted.load(fp32_dir)
    if precision == "fp32":
        return fp32
    fixed = (fp32.inputs, fp32.outputs)
    payload: dict[str, Any] = {**base, "precision": precision}
    feeds: list[list[np.ndarray]] = []
    if precision == "int8-full":
        cal = build_workload(wl.model, wl.bindings, {}, n_seeded=CALIBRATION_SETS, seed=calibration_seed(wl))
        feeds = cal.input_sets
        payload["calibration"] = hashlib.sha256(b"".join(a.tobytes() for s in feeds for a in s)).hexdigest()[:16]
    key = _key(payload)

    def make(tmp: Path) -> None:
        if precision == "fp16":
            shutil.copyfile(fp32_dir / "fp16.tflite", tmp / "model.tflite")
        else:
            work = tmp / "work"
            work.mkdir()
            spec: dict[str, Any] = {"op": "quantize", "saved_model": str(fp32_dir / "saved_model"),
                                    "precision": precision, "out": str(tmp / "model.tflite")}
            if feeds:
                names = _signature_inputs(fp32_dir / "model.tflite", fp32.inputs)
                np.savez(work / "calibration.npz", **{f"s{i}__{n}": np.ascontiguousarray(a.transpose(m.perm))
                                                      for i, s in enumerate(feeds)
                                                      for n, m, a in zip(names, fp32.inputs, s)})
                spec.update(calibration=str(work / "calibration.npz"), sets=len(feeds))
            _child(spec, work, cache / "logs" / f"{key}.log", timeout_s)
            shutil.rmtree(work)
        (tmp / "mapping.json").write_text(json.dumps(map_and_verify(tmp / "model.tflite", wl, precision, fixed)))

    return Converted.load(_build(cache, key, make, timeout_s))


def _signature_inputs(path: Path, inputs: Sequence[TensorMap]) -> list[str]:
    """The SavedModel signature's input names of the mapped inputs (what a representative dataset is keyed by)."""
    interp = _interpreter(path)
    sigs = interp._get_full_signature_list()
    if len(sigs) != 1:
        raise BuildFailed("conversion failed: the converted model has no single signature to calibrate")
    by_index = {int(v): k for k, v in next(iter(sigs.values())).get("inputs", {}).items()}
    try:
        return [by_index[m.index] for m in inputs]
    except KeyError as exc:
        raise BuildFailed(f"conversion failed: input tensor {exc} is not in the model's signature") from None
