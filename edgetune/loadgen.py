"""One onnxruntime configuration under MLPerf LoadGen (``edgetune bench --loadgen``).

LoadGen (``mlperf_loadgen``, the ``mlperf`` extra) issues the queries and times them; the system
under test (SUT) runs onnxruntime in this process with exactly the candidate's session options,
built by the Python agent's own ``OrtBackend`` (device_agents/python/edgetune_agent/backends/ort.py,
loaded from the agent's bundled file) from the candidate's params. LoadGen must issue and complete
queries in the process that times them, so this runs on the local device only.

The query sample library (QSL) holds ``samples`` seeded input sets (edgetune's seeded inputs at the
model's bound dims). Every completed query's outputs may be checked: a uniform random subset of
``check`` queries (reservoir sampling over all completed queries, with a seed the SUT never sees)
is compared with edgetune's reference (onnxruntime, optimizations off) under edgetune's tolerances
after LoadGen finished. A configuration with a wrong output is reported failed, without a figure.

The figures and LoadGen's own verdict ("Result is : VALID/INVALID") are read from LoadGen's
``mlperf_log_summary.txt``, written to a temporary directory of ours.
"""

from __future__ import annotations

import importlib.util
import math
import secrets
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from edgetune.agent.bundle import python_agent
from edgetune.api import find_candidate, fresh_seed, resolve_model
from edgetune.candidate import Candidate
from edgetune.db import Store
from edgetune.devices.inventory import Inventory
from edgetune.errors import MissingExtra, UserInputError
from edgetune.verify import Errors, Fail, check_values
from edgetune.modelfile import load_model
from edgetune.workload import build_workload, compute_reference, parse_dims, shape_points

SCHEMA = "edgetune.loadgen/1"
SCENARIOS = {"singlestream": "SingleStream", "offline": "Offline"}
# MLPerf's minimums for a run: SingleStream 1024 queries; Offline one query of 24576 samples (the
# figure mlperf.conf sets for its vision models: resnet50, retinanet); both at least 600 s (the
# "*.SingleStream.min_duration = 600000" and "*.Offline.min_duration" lines of LoadGen's mlperf.conf)
MIN_QUERIES = {"singlestream": 1024, "offline": 24576}
MIN_SECONDS = 600.0
SHORTENED = "shortened: not a valid MLPerf run"
LOCAL_ONLY = ("LoadGen runs on the local device only: it must issue and complete queries in the process that "
              "times them, and the SUT runs onnxruntime in-process (use -d local)")

OutputHook = Callable[[int, list], list]  # (sample index, outputs) -> outputs; tests corrupt outputs with it


def _mlperf_loadgen():
    try:
        import mlperf_loadgen
    except ImportError:
        raise MissingExtra("--loadgen (MLPerf LoadGen)", "mlperf") from None
    return mlperf_loadgen


def _agent_backend():
    """The Python agent's OrtBackend: the one mapping from a candidate's params to SessionOptions."""
    spec = importlib.util.spec_from_file_location("edgetune_agent_for_loadgen", python_agent())
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.OrtBackend


def parse_summary(text: str) -> dict[str, Any]:
    """The fields of mlperf_log_summary.txt (``key : value`` lines), values as LoadGen wrote them."""
    out: dict[str, Any] = {}
    for line in text.splitlines():
        if " : " in line:
            k, v = line.split(" : ", 1)
            out.setdefault(k.strip(), v.strip())
        elif ":" in line and line.strip().startswith("Samples per second"):
            k, v = line.split(":", 1)
            out.setdefault(k.strip(), v.strip())
    return out


def parse_detail(text: str) -> dict[str, Any]:
    """The ``result_*``, ``generated_*``, ``effective_*`` and ``num_errors`` entries of
    mlperf_log_detail.txt (``:::MLLOG {json}`` lines), first occurrence of each."""
    import json

    out: dict[str, Any] = {}
    for line in text.splitlines():
        if not line.startswith(":::MLLOG "):
            continue
        try:
            entry = json.loads(line[len(":::MLLOG "):])
        except ValueError:
            continue
        key = entry.get("key") if isinstance(entry, dict) else None
        if isinstance(key, str) and (key.startswith(("result_", "generated_", "effective_")) or key == "num_errors"):
            out.setdefault(key, entry.get("value"))
    return out


def _num(v: Any) -> float | None:
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


class _Reservoir:
    """A uniform random subset of ``k`` of all items offered (Algorithm R), chosen by an RNG seeded
    from ``secrets``: which queries get checked is known only once the test is over."""

    def __init__(self, k: int):
        self.k = k
        self.seen = 0
        self.items: list = []
        self.rng = np.random.default_rng(secrets.randbits(64))

    def offer(self, item) -> None:
        self.seen += 1
        if len(self.items) < self.k:
            self.items.append(item)
        else:
            j = int(self.rng.integers(0, self.seen))
            if j < self.k:
                self.items[j] = item


def run_loadgen(model: str, config_key: str, scenario: str, device: str = "local", *, dims: Sequence[str] = (),
                db: str | None = None, queries: int | None = None, seconds: float | None = None,
                samples: int = 64, check: int = 16, seed: int | None = None, inventory=None,
                output_hook: OutputHook | None = None) -> dict[str, Any]:
    """Run one stored onnxruntime configuration (or ``config_key='default'``: onnxruntime's default
    SessionOptions) under LoadGen in ``scenario`` (singlestream | offline); the ``edgetune.loadgen/1``
    document. ``queries``/``seconds`` below MLPerf's minimums shorten the run (labelled so)."""
    scenario = scenario.lower()
    if scenario not in SCENARIOS:
        raise UserInputError(f"--loadgen {scenario!r}: choose singlestream or offline")
    spec = (inventory or Inventory()).get(device)
    if spec.kind != "local":
        raise UserInputError(f"device '{spec.name}': {LOCAL_ONLY}")
    lg = _mlperf_loadgen()
    if queries is not None and queries < 1:
        raise UserInputError("--loadgen-queries must be at least 1")
    if seconds is not None and seconds <= 0:
        raise UserInputError("--loadgen-seconds must be positive")
    if samples < 1 or check < 1:
        raise UserInputError("--loadgen-samples and the checked count must be at least 1")

    m = load_model(resolve_model(model))
    if m.format != "onnx":
        raise UserInputError(f"{m.path.name}: --loadgen runs onnxruntime configurations (an .onnx model)")
    if config_key == "default":
        cand = Candidate.make("ort", {}, baseline=True)
    else:
        store = Store(db, create=False) if db else Store()
        try:
            cand = find_candidate(store, config_key)
        finally:
            store.close()
    if cand.backend != "ort":
        raise UserInputError(f"config {cand.key()} is a {cand.backend} configuration; --loadgen runs onnxruntime ones")
    points = shape_points(m, parse_dims(dims, m), {})
    if len(points) != 1:
        raise UserInputError("--loadgen runs one shape: bind every dynamic dimension with --dim")
    # inputs from a fresh seed (recorded; pass it to replay): never data the configuration was tuned on
    seed_source = "given" if seed is not None else "fresh"
    if seed is None:
        seed = fresh_seed({0})
    wl = build_workload(m, points[0], n_seeded=samples, seed=seed)
    qsl_sets = wl.input_sets
    ref0 = compute_reference(m, qsl_sets[0])
    out_specs = [{"name": s.name, "shape": list(r.shape), "dtype": s.dtype if s.dtype else str(r.dtype)}
                 for s, r in zip(m.outputs, ref0)]
    OrtBackend = _agent_backend()
    try:
        backend = OrtBackend(str(m.path), cand.param_dict, wl.input_names, out_specs)
    except Exception as exc:  # a session the candidate's options cannot build: the candidate failed
        doc = _doc(m, wl, cand, scenario, queries, seconds, samples, spec.name, ok=False, code="build-failed",
                   reason=f"session failed: {_first_line(exc)}")
        doc.update({"figures": {}, "mlperf_valid": False, "verdict": {"edgetune": "FAILED", "loadgen": None}})
        return doc

    def infer(index: int) -> list:
        backend.poison()
        backend.run(qsl_sets[index])
        outs = backend.results()
        return output_hook(index, outs) if output_hook else outs

    # warm-up, and LoadGen's expected latency / QPS from it
    t0 = time.perf_counter()
    warm = 0
    while warm < 3 or (time.perf_counter() - t0 < 0.2 and warm < 50):
        try:
            infer(warm % len(qsl_sets))
        except Exception as exc:
            doc = _doc(m, wl, cand, scenario, queries, seconds, samples, spec.name, ok=False, code="run-failed",
                       reason=f"warm-up run failed: {_first_line(exc)}")
            doc.update({"figures": {}, "mlperf_valid": False, "verdict": {"edgetune": "FAILED", "loadgen": None}})
            return doc
        warm += 1
    est_s = max((time.perf_counter() - t0) / warm, 1e-6)

    reservoir = _Reservoir(check)
    completed = [0]
    run_errors: list[str] = []

    def issue_queries(query_samples) -> None:
        # called on LoadGen's thread: nothing may raise here, and every query must be completed
        responses = []
        for q in query_samples:
            try:
                outs = infer(q.index)
                reservoir.offer((q.index, outs))
            except Exception as exc:  # a failed run fails the configuration; LoadGen still finishes
                if not run_errors:
                    run_errors.append(f"query sample {q.index}: run failed: {_first_line(exc)}")
            completed[0] += 1
            if scenario == "singlestream":
                lg.QuerySamplesComplete([lg.QuerySampleResponse(q.id, 0, 0)])
            else:
                responses.append(lg.QuerySampleResponse(q.id, 0, 0))
        if responses:
            lg.QuerySamplesComplete(responses)

    def flush_queries() -> None:
        pass

    def load_samples(indices) -> None:
        pass

    settings = _official_settings(lg)
    settings.scenario = getattr(lg.TestScenario, SCENARIOS[scenario])
    settings.mode = lg.TestMode.PerformanceOnly
    min_q = MIN_QUERIES[scenario] if queries is None else queries
    min_s = MIN_SECONDS if seconds is None else seconds
    # minimums, as MLPerf states them: LoadGen runs until both are met
    settings.min_query_count = min_q
    settings.min_duration_ms = int(math.ceil(min_s * 1000))
    settings.performance_sample_count_override = len(qsl_sets)
    if scenario == "singlestream":
        settings.single_stream_expected_latency_ns = max(1, int(est_s * 1e9))
    else:
        # LoadGen issues expected_qps x duration samples: an estimate above the true rate only makes
        # the run longer, one below it ends it before the minimum duration (INVALID)
        settings.offline_expected_qps = 2.0 / est_s
    shortened = min_q < MIN_QUERIES[scenario] or min_s < MIN_SECONDS

    sut = lg.ConstructSUT(issue_queries, flush_queries)
    qsl = lg.ConstructQSL(len(qsl_sets), len(qsl_sets), load_samples, load_samples)
    with tempfile.TemporaryDirectory(prefix="edgetune-loadgen-") as tmp:
        log = lg.LogSettings()
        log.log_output.outdir = tmp
        log.log_output.copy_summary_to_stdout = False
        log.log_output.copy_detail_to_stdout = False
        log.enable_trace = False
        wall0 = time.monotonic()
        try:
            lg.StartTestWithLogSettings(sut, qsl, settings, log)
        finally:
            lg.DestroyQSL(qsl)
            lg.DestroySUT(sut)
        wall = time.monotonic() - wall0
        summary_path = Path(tmp) / "mlperf_log_summary.txt"
        summary_text = summary_path.read_text(errors="replace") if summary_path.exists() else ""
        detail_path = Path(tmp) / "mlperf_log_detail.txt"
        detail = parse_detail(detail_path.read_text(errors="replace")) if detail_path.exists() else {}
    summary = parse_summary(summary_text)
    if not summary_text:
        raise UserInputError("LoadGen wrote no mlperf_log_summary.txt: no result to read")

    # check the reservoir's outputs against the reference, after the test
    errors = Errors()
    failure = None
    for index, outs in reservoir.items:
        refs = compute_reference(m, qsl_sets[index])
        try:
            check_values(f"query sample {index}", wl.output_names, outs, refs, errors, None,
                          [s.dtype for s in m.outputs])
        except Fail as f:
            failure = f
            break
    if failure is None and run_errors:
        failure = Fail("run-failed", run_errors[0])
    checked = len(reservoir.items)
    if checked == 0 and failure is None:
        failure = Fail("no-output", "LoadGen completed no query: nothing to check")
    doc = _doc(m, wl, cand, scenario, queries, seconds, samples, spec.name, ok=failure is None,
               code="ok" if failure is None else failure.code, reason="" if failure is None else failure.reason)
    lg_valid = summary.get("Result is")
    doc.update({
        "seed_source": seed_source,
        "shortened": shortened,
        "label": SHORTENED if shortened else "full length (MLPerf's minimum query count and duration)",
        "loadgen": {"result": lg_valid, "min_duration_satisfied": summary.get("Min duration satisfied"),
                    "min_queries_satisfied": summary.get("Min queries satisfied"),
                    "early_stopping_met": detail.get("early_stopping_met"),
                    "num_errors": detail.get("num_errors"), "summary": summary, "detail": detail},
        "settings": {"min_query_count": min_q, "min_duration_s": min_s,
                     "expected_latency_ms": est_s * 1e3, "samples": len(qsl_sets)},
        "completed_queries": completed[0],
        "wall_s": wall,
        "checked": {"queries": checked, "of": completed[0], "max_abs_err": errors.max_abs,
                    "max_rel_err": errors.max_rel, "norm_rel_err": errors.norm_rel},
    })
    figures: dict[str, Any] = {}
    if failure is None:
        if scenario == "singlestream":
            p90 = _num(summary.get("90.00 percentile latency (ns)") or summary.get("90.0th percentile latency (ns)"))
            n = _num(detail.get("result_query_count")) or completed[0]
            qps = _num(summary.get("QPS w/ loadgen overhead"))
            figures = {"p90_latency_ms": p90 / 1e6 if p90 is not None else None,
                       "mean_latency_ms": (_num(summary.get("Mean latency (ns)")) or math.nan) / 1e6,
                       "queries": int(n), "duration_s": n / qps if qps else wall}
        else:
            dur = _num(detail.get("result_max_latency_ns"))  # the one Offline query: issue to last completion
            figures = {"samples_per_second": _num(summary.get("Samples per second")),
                       "samples": int(_num(detail.get("generated_samples_per_query")) or completed[0]),
                       "duration_s": dur / 1e9 if dur else wall}
    doc["figures"] = figures
    doc["mlperf_valid"] = bool(failure is None and not shortened and lg_valid == "VALID")
    if not shortened:
        doc["label"] = ("meets MLPerf's run rules for the scenario (minimum queries and duration; LoadGen: VALID)"
                        if lg_valid == "VALID" else f"full length, but LoadGen says {lg_valid}")
    ours = "PASS" if failure is None else "FAILED"
    doc["verdict"] = {"edgetune": ours if not shortened or failure is not None else f"{ours} ({SHORTENED})",
                      "loadgen": lg_valid}
    return doc


_SEEDS: dict[str, int] = {}


def _official_settings(lg):
    """TestSettings with the official random seeds (query order, sample indices, schedule) from the
    mlperf.conf built into LoadGen (its ``*.*`` lines, read through the SingleStream section, the
    only one its ``FromConfig`` applies to a model it does not name). LoadGen reads its mlperf.conf
    once per process, so the seeds are read once and kept."""
    if not _SEEDS:
        base = lg.TestSettings()
        base.scenario = lg.TestScenario.SingleStream
        with tempfile.TemporaryDirectory(prefix="edgetune-loadgen-conf-") as tmp:
            user = Path(tmp) / "user.conf"
            user.write_text("")
            base.FromConfig(str(user), "edgetune", "SingleStream", 1)
        _SEEDS.update({k: getattr(base, k) for k in ("qsl_rng_seed", "sample_index_rng_seed", "schedule_rng_seed")})
    settings = lg.TestSettings()
    for k, v in _SEEDS.items():
        setattr(settings, k, v)
    return settings


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:300] if text else type(exc).__name__


def _doc(m, wl, cand, scenario, queries, seconds, samples, device, *, ok: bool, code: str, reason: str) -> dict:
    return {"schema": SCHEMA, "model": str(m.path), "model_sha256": m.sha256, "shape": wl.shape_label,
            "device": device, "scenario": SCENARIOS[scenario], "candidate": cand.as_dict(), "config": cand.label(),
            "ok": ok, "code": code, "reason": reason,
            "seed": wl.seed, "requested": {"queries": queries, "seconds": seconds, "samples": samples}}
