"""Peers side by side: the configuration edgetune selects against the picks a user would otherwise
make, all timed and verified by edgetune in ONE interleaved run on the same machine.

Per model (zoo, at its nominal shape):
  1. edgetune's selection: an ordinary tune (``--budget`` seconds, default spaces, ``--accuracy``);
  2. the peers' picks, each found the way that peer finds it:
     - onnxruntime's default session (what most code runs);
     - OpenVINO ``benchmark_app``'s best hint: benchmark_app run with ``-hint latency`` and with
       ``-hint throughput`` (and ``-infer_precision f32`` for an exact comparison, since OpenVINO's
       default is bf16 on CPUs with bf16 units), the hint with the lower median latency kept;
     - LiteRT's defaults (``benchmark_model``'s: the interpreter with XNNPACK, default threads) on the
       ONNX model converted by edgetune's verified converter, where the ``litert`` space exists;
     - Olive's onnxruntime session-parameter tuning (``OrtSessionParamsTuning``, what ``olive
       tune-session-params`` runs), from the environment ``tools/bench/setup_olive.sh`` makes (olive-ai
       pulls PyTorch: an environment of its own, with edgetune's onnxruntime version). Olive's CLI
       gives its pass a rank-2 dummy input whatever the model (its baseline evaluation then fails,
       and it still exits 0 with no parameters), so the bench writes Olive's own workflow config with
       a dummy data config of the model's real input names, shapes and types, and runs ``olive run``.
       Olive's pick (its session options) becomes an onnxruntime candidate of the same model; a run
       that fails or returns nothing is reported as exactly that, never raced in its place;
  3. the final: every pick (and the selection) raced in ``--rounds`` fresh interleaved rounds
     (A B C, B C A, ...), each job a new agent process on new inputs, every output verified against
     the float64 reference (approximate picks judged by the same accuracy budget). These rounds did
     not choose anything, so the ratios (selection vs pick, Student t on per-round log ratios) are
     not subject to the winner's curse.

    .venv/bin/python tools/bench/bench_peers.py resnet50 mobilenetv3 --size full --budget 60 --rounds 8
    .venv/bin/python tools/bench/bench_peers.py ... --accuracy cosine=0.999
    bash tools/bench/setup_olive.sh && .venv/bin/python tools/bench/bench_peers.py ... \
        --olive .venv/share/edgetune/olive-venv/bin/olive

Prints a Markdown table; ``--json FILE`` writes every figure.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from edgetune.accuracy import AccuracyBudget  # noqa: E402
from edgetune.agent.host import AgentClient  # noqa: E402
from edgetune.candidate import Candidate  # noqa: E402
from edgetune.db import Store  # noqa: E402
from edgetune.devices.inventory import Inventory, home_subdir  # noqa: E402
from edgetune.measure import round_ratio  # noqa: E402
from edgetune.select import is_confirmation  # noqa: E402
from edgetune.space import SPACES, space_of, with_approximate  # noqa: E402
from edgetune.space.openvino import default_precision  # noqa: E402
from edgetune.tune import tune  # noqa: E402
from edgetune.tune_config import DEFAULT_SPACES, TuneConfig  # noqa: E402
from edgetune.zoo_bench import nominal_points  # noqa: E402

import models.zoo as zoo  # noqa: E402

OLIVE_NOT_SET = "not run: no Olive environment (make one with tools/bench/setup_olive.sh, then pass --olive)"
OLIVE_LEVELS = {0: "disable", 1: "basic", 2: "extended", 99: "all"}  # onnxruntime's GraphOptimizationLevel values
ONNX_TYPES = {1: "float32", 2: "uint8", 3: "int8", 5: "int16", 6: "int32", 7: "int64", 9: "bool", 10: "float16",
              11: "float64"}
# benchmark_app without OpenVINO's telemetry (it would send a usage event to an analytics service)
BENCHMARK_APP = ("import sys; sys.modules['openvino_telemetry'] = None; "
                 "from openvino.tools.benchmark.main import main; sys.argv[0] = 'benchmark_app'; main()")


def benchmark_app_best_hint(model: Path, shapes: dict[str, list[int]], exact: bool, seconds: int) -> tuple[str, dict]:
    """The hint benchmark_app's median latency prefers, and what it printed for each."""
    shape = ",".join(f"{n}[{','.join(map(str, s))}]" for n, s in shapes.items())
    medians: dict[str, float | str] = {}
    for hint in ("latency", "throughput"):
        argv = [sys.executable, "-c", BENCHMARK_APP, "-m", str(model), "-d", "CPU", "-hint", hint, "-t", str(seconds),
                "-shape", shape] + (["-infer_precision", "f32"] if exact else [])
        p = subprocess.run(argv, capture_output=True, text=True, timeout=seconds * 10 + 300)
        m = re.search(r"Median:\s+([0-9.]+)\s+(ms|us)", p.stdout)
        if p.returncode != 0 or not m:
            tail = (p.stderr.strip().splitlines() or p.stdout.strip().splitlines() or ["no output"])[-1]
            medians[hint] = f"failed: {tail[:200]}"
            continue
        medians[hint] = float(m.group(1)) / (1000.0 if m.group(2) == "us" else 1.0)
    ok = {h: v for h, v in medians.items() if isinstance(v, float)}
    if not ok:
        raise RuntimeError(f"benchmark_app failed for both hints: {medians}")
    return min(ok, key=ok.get), medians


def olive_config(model: Path, shapes: dict[str, list[int]], out_dir: Path) -> dict:
    """Olive's workflow config for its session-parameter pass on the CPU, as ``olive
    tune-session-params -m MODEL --device cpu`` writes it (``--save_config_file``), with the one
    mend its CLI lacks: a dummy data config of the model's real inputs (names, shapes, types)."""
    import onnx

    m = onnx.load(str(model), load_external_data=False)
    init = {i.name for i in m.graph.initializer}
    inputs = [i for i in m.graph.input if i.name not in init]
    types = [ONNX_TYPES.get(i.type.tensor_type.elem_type, "float32") for i in inputs]
    return {
        "input_model": {"type": "OnnxModel", "model_path": str(model)},
        "systems": {"local_system": {"type": "LocalSystem", "accelerators": [
            {"device": "cpu", "execution_providers": ["CPUExecutionProvider"]}]}},
        "data_configs": [{"name": "session_params_tuning_data", "type": "dummydatacontainer",
                          "load_dataset_config": {"type": "dummy_dataset", "max_samples": 32,
                                                  "input_names": [i.name for i in inputs],
                                                  "input_shapes": [shapes[i.name] for i in inputs],
                                                  "input_types": types}}],
        "passes": {"session_params_tuning": {"type": "OrtSessionParamsTuning",
                                             "data_config": "session_params_tuning_data", "io_bind": False,
                                             "enable_cuda_graph": False, "trt_fp16_enable": False}},
        "host": "local_system", "target": "local_system", "no_artifacts": False,
        "output_dir": str(out_dir), "log_severity_level": 3,
    }


def olive_pick(olive: str, model: Path, shapes: dict[str, list[int]], work: Path,
               timeout_s: int = 1800) -> tuple[Candidate | None, dict]:
    """Olive's session-parameter tuning of ``model``: (its pick as an onnxruntime candidate, or None
    when Olive failed or returned nothing; what happened, for the report)."""
    import hashlib
    import os

    import shutil

    olive = str(Path(olive).resolve()) if "/" in olive else (shutil.which(olive) or olive)  # it runs in work/
    work.mkdir(parents=True, exist_ok=True)
    cfg = work / "olive.json"
    cfg.write_text(json.dumps(olive_config(model, shapes, work / "out"), indent=1))
    env = {**os.environ, "OLIVE_DISABLE_TELEMETRY": "1"}
    t0 = time.monotonic()
    try:
        p = subprocess.run([olive, "run", "--run-config", str(cfg)], capture_output=True, text=True, env=env,
                           timeout=timeout_s, cwd=work)
    except subprocess.TimeoutExpired:
        return None, {"status": f"failed: olive run did not end in {timeout_s} s"}
    except OSError as e:
        return None, {"status": f"failed: {olive}: {e.strerror}"}
    note: dict[str, object] = {"seconds": round(time.monotonic() - t0, 1)}
    (work / "olive.log").write_text(p.stdout + p.stderr)
    # what Olive said went wrong: its first ERROR line (it logs a failed evaluation and goes on), else its last
    said = [ln for ln in (p.stdout + p.stderr).splitlines() if "[ERROR]" in ln or "Error:" in ln]
    tail = said[:1] or (p.stderr or p.stdout).strip().splitlines()[-1:] or [""]
    if p.returncode != 0:
        return None, {**note, "status": f"failed (exit {p.returncode}): {tail[0][:200]}"}
    mc = work / "out" / "model_config.json"
    try:
        settings = json.loads(mc.read_text())["config"]["inference_settings"]
    except (OSError, ValueError, KeyError, TypeError):
        settings = None
    if not isinstance(settings, dict) or not settings:
        return None, {**note, "status": "returned nothing: no tuned inference settings in its output "
                                        f"(exit 0; it said: {tail[0][:240]})"}
    so = settings.get("session_options") or {}
    note["olive_settings"] = settings
    # Olive may also hand back a model of its own: the pick is for the model raced, so it must be it
    out_model = work / "out" / "model.onnx"
    if out_model.exists() and hashlib.sha256(out_model.read_bytes()).digest() != hashlib.sha256(
            model.read_bytes()).digest():
        note["model_changed"] = "Olive's output model differs from its input: its session options are raced on the input"
    eps = settings.get("execution_provider") or ["CPUExecutionProvider"]
    params: dict[str, object] = {"execution_provider": eps[0] if isinstance(eps, list) else str(eps)}
    if so.get("intra_op_num_threads") is not None:
        params["intra_op_num_threads"] = int(so["intra_op_num_threads"])
    if so.get("graph_optimization_level") is not None:
        params["graph_optimization_level"] = OLIVE_LEVELS[int(so["graph_optimization_level"])]
    if so.get("execution_mode") is not None:
        params["execution_mode"] = "parallel" if int(so["execution_mode"]) == 1 else "sequential"
    if so.get("inter_op_num_threads") is not None:
        params["inter_op_num_threads"] = int(so["inter_op_num_threads"])
    extra = {k: v for k, v in so.items() if k not in ("intra_op_num_threads", "inter_op_num_threads",
                                                         "graph_optimization_level", "execution_mode")
             and v is not None}
    for k, v in (extra.pop("extra_session_config", None) or {}).items():
        params[str(k)] = v
    if extra:
        note["not_raced_settings"] = extra  # a setting edgetune's onnxruntime backend has no name for
    if len(params) == 1:
        return None, {**note, "status": "returned nothing: every session option left at onnxruntime's default"}
    note["status"] = "tuned"
    return Candidate.make("ort", params), note


def picks_for(model: Path, dims: dict[str, int], info, acc: AccuracyBudget, seconds: int,
              olive: str | None = None, work: Path | None = None) -> tuple[list, dict]:
    from edgetune.modelfile import load_model
    from edgetune.workload import build_workload

    wl = build_workload(load_model(model), dims, {}, n_seeded=1)
    shapes = {n: list(a.shape) for n, a in zip(wl.input_names, wl.input_sets[0])}
    picks = [("onnxruntime default", Candidate.make("ort", {}, baseline=True))]
    notes: dict[str, object] = {}
    if olive:
        cand, notes["olive"] = olive_pick(olive, model, shapes, (work or Path(tempfile.mkdtemp())) / "olive")
        if cand is not None:
            picks.append(("Olive session-parameter tuning", cand))
    else:
        notes["olive"] = {"status": OLIVE_NOT_SET}
    exact = not acc.set
    hint, medians = benchmark_app_best_hint(model, shapes, exact, seconds)
    notes["benchmark_app_median_ms"] = medians
    prec = "fp32" if exact else default_precision(info)
    picks.append((f"OpenVINO benchmark_app best hint ({hint}, {prec})",
                  Candidate.make("openvino", {"precision": prec, "hint": hint})))
    if "litert" in SPACES:
        from edgetune.space import load_space

        lit = [c for c in load_space("litert").candidates(load_model(model), info) if c.baseline]
        if lit:
            # converted as a user converting by hand would: without the budget's bound (up to the
            # converter's own limit), then cached; the final's rounds and any later tune find it there
            from edgetune.space import BuildFailed

            t0 = time.monotonic()
            try:
                load_space("litert").prepare(lit[0], wl, info, home_subdir("artifacts"))
                notes["litert_conversion_s"] = round(time.monotonic() - t0, 1)
            except BuildFailed as e:
                notes["litert_conversion"] = f"failed: {e}"
            picks.append(("LiteRT defaults (XNNPACK)", lit[0]))
        else:
            notes["litert"] = "no LiteRT candidate on this device or for this model"
    else:
        notes["litert"] = "no litert space in this edgetune"
    return picks, notes


def final_rounds(model: Path, dims: dict[str, int], entrants: list[tuple[str, Candidate]], acc: AccuracyBudget,
                 rounds: int, budget_s: float, db: Path) -> dict[str, dict]:
    """Every entrant in ``rounds`` interleaved race rounds (none selects anything here)."""
    extra = [(c, space_of(c)) for _, c in entrants]
    cfg = TuneConfig(budget_s=budget_s, rounds=rounds, finalists=len(entrants), confirm_rounds=0, spaces=(),
                     extra=extra, accuracy=acc, fresh=True)
    out = tune(model, ["local"], db=db, config=cfg, points=[dims]).devices[0]
    if out.status != "complete":
        raise RuntimeError(f"final rounds: {out.error}")
    st = Store(db)
    try:
        recs = [r for r in st.records(run_id=out.run_id) if not is_confirmation(r.round)]
    finally:
        st.close()
    by: dict[str, dict] = {}
    for label, c in entrants:
        mine = [r for r in recs if r.candidate_key == c.key()]
        failed = [r for r in mine if r.status != "verified"]
        by[label] = {"key": c.key(), "candidate": c.label(), "approximate": c.approximate,
                     "failed": failed[0].reason if failed else None,
                     "rounds": {r.round: r.samples_ns for r in mine if r.round > 0 and r.samples_ns.size},
                     "accuracy": next((r.verdict.get("accuracy") for r in mine if r.verdict.get("accuracy")), None)}
    return by


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("models", nargs="+")
    ap.add_argument("--size", default="full")
    ap.add_argument("--budget", type=float, default=60.0, help="edgetune's tune, seconds per model")
    ap.add_argument("--rounds", type=int, default=8, help="interleaved rounds of the final")
    ap.add_argument("--final-budget", type=float, default=90.0, help="seconds for the final's rounds")
    ap.add_argument("--accuracy", action="append", default=[])
    ap.add_argument("--max-candidates", type=int, default=None)
    ap.add_argument("--space", default="ort,ort-fused,openvino,litert",
                    help="edgetune's spaces (default: every family but TVM, whose untuned builds of full-size "
                         "models take minutes each and were never the fastest on a CPU here)")
    ap.add_argument("--benchmark-app-seconds", type=int, default=10)
    ap.add_argument("--olive", help="the olive executable of its own environment (tools/bench/setup_olive.sh)")
    ap.add_argument("--json")
    a = ap.parse_args()
    acc = AccuracyBudget.parse(a.accuracy)
    client = AgentClient(Inventory().get("local"))
    try:
        info = client.provision()
    finally:
        client.close()
    work = Path(tempfile.mkdtemp(prefix="bench-peers-"))
    doc = {"command": " ".join(sys.argv), "date": time.strftime("%Y-%m-%d"), "accuracy": acc.as_dict(),
           "fingerprint": info.fingerprint, "runtimes": {k: v for k, v in info.runtimes.items()}, "models": []}
    rows = []
    for name in a.models:
        path = zoo.build(name, a.size, home_subdir("zoo") / a.size)
        dims = nominal_points(name, a.size)[0]["dims"]
        t0 = time.monotonic()
        # the peers' picks first: LiteRT's conversion is made here without the budget's bound (as by
        # hand), so edgetune's tune below finds its fp32 conversion in the cache like the final does
        picks, notes = picks_for(path, dims, info, acc, a.benchmark_app_seconds, a.olive, work / name)
        spaces = with_approximate(tuple(x for x in a.space.split(",") if x) or DEFAULT_SPACES, acc.set)
        cfg = TuneConfig(budget_s=a.budget, spaces=spaces, accuracy=acc, max_candidates=a.max_candidates, fresh=True)
        sel = tune(path, ["local"], db=work / "tune.db", config=cfg, points=[dims]).devices[0]
        shape = sel.summary.shapes[0] if sel.summary and sel.summary.shapes else None
        if shape is None or shape.best is None:
            doc["models"].append({"name": name, "error": sel.error or "nothing selected"})
            continue
        selected = shape.best.candidate
        entrants = [("edgetune's selection", selected)] + [(l, c) for l, c in picks if c.key() != selected.key()]
        same = [l for l, c in picks if c.key() == selected.key()]
        fin = final_rounds(path, dims, entrants, acc, a.rounds, a.final_budget, work / "final.db")
        mine = fin["edgetune's selection"]
        res = {"name": name, "dims": dims, "selected": selected.label(), "same_as_selection": same, "notes": notes,
               "entrants": {}, "wall_s": round(time.monotonic() - t0, 1)}
        for label, e in fin.items():
            common = sorted(set(e["rounds"]) & set(mine["rounds"]))
            ratio = None
            if label != "edgetune's selection" and common and not e["failed"] and not mine["failed"]:
                ratio = round_ratio([(e["rounds"][k], mine["rounds"][k]) for k in common])
            med = sorted(float(np.median(e["rounds"][k])) for k in common)  # per-round medians
            res["entrants"][label] = {"candidate": e["candidate"], "failed": e["failed"], "approximate": e["approximate"],
                                      "accuracy": e["accuracy"], "median_of_round_medians_ms":
                                      (med[len(med) // 2] / 1e6 if med else None),
                                      "selection_vs_this": ratio.as_dict() if ratio else None}
            rows.append((name, label, e, ratio, med))
        doc["models"].append(res)
        print(f"{name}: done in {res['wall_s']} s", file=sys.stderr)
    print("| model | pick | configuration | median ms | edgetune's selection vs this pick [95% CI] |")
    print("|---|---|---|---|---|")
    for name, label, e, ratio, med in rows:
        m = f"{med[len(med) // 2] / 1e6:.3f}" if med else "—"
        if e["failed"]:
            r = f"failed: {e['failed'][:80]}"
        elif ratio is None:
            r = "—"
        else:
            r = f"{ratio.value:.2f}× [{ratio.ci_low:.2f}, {ratio.ci_high:.2f}] {ratio.verdict}"
        acc_txt = f" (cos {e['accuracy']['cosine']:.5f})" if e.get("accuracy") and e["accuracy"].get("cosine") else ""
        print(f"| {name} | {label} | {e['candidate']}{acc_txt} | {m} | {r} |")
    for mdl in doc["models"]:
        for k, v in (mdl.get("notes") or {}).items():
            if isinstance(v, dict) and "status" in v:  # a peer's tuning: what it did, in a line
                v = v["status"] + "".join(f"; {x}: {v[x]}" for x in ("seconds", "model_changed", "not_raced_settings")
                                          if x in v)
            print(f"- {mdl['name']}: {k}: {v}")
    if a.json:
        Path(a.json).write_text(json.dumps(doc, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
