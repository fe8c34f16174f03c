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
     - Olive's onnxruntime session-parameter tuning: not run here, and said so (olive-ai 0.13 pulls
       PyTorch and downgrades onnxruntime to 1.23: it needs an environment of its own);
  3. the final: every pick (and the selection) raced in ``--rounds`` fresh interleaved rounds
     (A B C, B C A, ...), each job a new agent process on new inputs, every output verified against
     the float64 reference (approximate picks judged by the same accuracy budget). These rounds did
     not choose anything, so the ratios (selection vs pick, Student t on per-round log ratios) are
     not subject to the winner's curse.

    .venv/bin/python tools/bench/bench_peers.py resnet50 mobilenetv3 --size full --budget 60 --rounds 8
    .venv/bin/python tools/bench/bench_peers.py ... --accuracy cosine=0.999

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
from edgetune.tune import DEFAULT_SPACES, TuneConfig, tune  # noqa: E402
from edgetune.zoo_bench import nominal_points  # noqa: E402

import models.zoo as zoo  # noqa: E402

OLIVE = "not run: olive-ai 0.13 pulls PyTorch and downgrades onnxruntime to 1.23 (an environment of its own)"
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


def picks_for(model: Path, dims: dict[str, int], info, acc: AccuracyBudget, seconds: int) -> tuple[list, dict]:
    from edgetune.workload import build_workload, load_model

    wl = build_workload(load_model(model), dims, {}, n_seeded=1)
    shapes = {n: list(a.shape) for n, a in zip(wl.input_names, wl.input_sets[0])}
    picks = [("onnxruntime default", Candidate.make("ort", {}, baseline=True))]
    notes: dict[str, object] = {"olive": OLIVE}
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
        spaces = with_approximate(tuple(x for x in a.space.split(",") if x) or DEFAULT_SPACES, acc.set)
        cfg = TuneConfig(budget_s=a.budget, spaces=spaces, accuracy=acc, max_candidates=a.max_candidates, fresh=True)
        sel = tune(path, ["local"], db=work / "tune.db", config=cfg, points=[dims]).devices[0]
        shape = sel.summary.shapes[0] if sel.summary and sel.summary.shapes else None
        if shape is None or shape.best is None:
            doc["models"].append({"name": name, "error": sel.error or "nothing selected"})
            continue
        selected = shape.best.candidate
        picks, notes = picks_for(path, dims, info, acc, a.benchmark_app_seconds)
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
            print(f"- {mdl['name']}: {k}: {v}")
    if a.json:
        Path(a.json).write_text(json.dumps(doc, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
