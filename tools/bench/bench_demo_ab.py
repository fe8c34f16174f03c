"""The demo's verdicts beside an independent A/B of the same pair.

`make demo` runs `edgetune tune mobilenet --sweep batch=1,16` and `edgetune tune transformer --sweep
seq=32,128`; for each shape it prints the confirmed contender's verdict against the onnxruntime
default. This benchmark runs the same commands (or reads their JSON), then times each shape's pair
again without edgetune's agent, timing loop or statistics: each side is a plain script of the
runtime's own Python API (onnxruntime, OpenVINO, LiteRT) that a user would write, in a fresh
process per side and round, the two sides back to back in alternating order. It prints both
verdicts and whether they agree.

What is shared with edgetune is the artifact: the model file a candidate runs (the ONNX model, or
the .tflite / int8 model edgetune's converter built and verified, from the tune's own cache) and
its runtime settings, and what the timed call is (PROTOCOL.md, the run loop's step 6): inputs in
the ONNX layout to outputs in it, onnxruntime and OpenVINO reading the script's buffers by pointer
(IO binding, shared-memory tensors), LiteRT paying its copy and a converted model's NHWC
transposes. What is not: the process, the inputs (8 random sets cycled, not the agent's fresh
inputs), the timing code (perf_counter around the call), and the interval (a t interval on
per-round log ratios of medians, 95%). Each pair is timed a second time with the runtimes' plain
calls (`sess.run(feeds)`, `infer(dict)`, `set_tensor`), the figure a user who writes them gets.

    .venv/bin/python tools/bench/bench_demo_ab.py                       # both demo commands, budget 60
    .venv/bin/python tools/bench/bench_demo_ab.py --models mobilenet --rounds 12 --json out.json
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from edgetune.measure import t_quantile  # noqa: E402 - after the path

DEMO = {"mobilenet": ["--sweep", "batch=1,16"], "transformer": ["--sweep", "seq=32,128"]}

# one side of one round: a user's own script of the runtime's API, in a process of its own
CHILD = r'''
import json, sys, time
import numpy as np
spec = json.loads(sys.argv[1])
backend, art, params = spec["backend"], spec["artifact"], spec["params"]
rng = np.random.default_rng(spec["seed"])
sets = [[rng.standard_normal(s).astype(d) if d.startswith("float") else rng.integers(0, 2, s).astype(d)
         for s, d in zip(spec["shapes"], spec["dtypes"])] for _ in range(8)]
names = spec["names"]
plain = spec["calls"] == "plain"  # the runtimes' plain calls, else bound as the agent binds
work = [a.copy() for a in sets[0]]  # (bound: the buffers a runtime reads by pointer, rewritten in place)
if backend == "ort":
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.log_severity_level = 3
    lv = {"disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL, "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
          "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED, "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL}
    if "graph_optimization_level" in params: so.graph_optimization_level = lv[params["graph_optimization_level"]]
    if "intra_op_num_threads" in params: so.intra_op_num_threads = int(params["intra_op_num_threads"])
    if "inter_op_num_threads" in params: so.inter_op_num_threads = int(params["inter_op_num_threads"])
    if params.get("execution_mode") == "parallel": so.execution_mode = ort.ExecutionMode.ORT_PARALLEL
    if "enable_cpu_mem_arena" in params: so.enable_cpu_mem_arena = bool(params["enable_cpu_mem_arena"])
    if "enable_mem_pattern" in params: so.enable_mem_pattern = bool(params["enable_mem_pattern"])
    for k, v in params.items():
        if k.startswith("session."): so.add_session_config_entry(k, str(v))
    sess = ort.InferenceSession(art, so, providers=[params.get("execution_provider", "CPUExecutionProvider")])
    if plain:
        call = lambda x: sess.run(None, dict(zip(names, x)))
    else:  # IO binding by pointer: onnxruntime reads and writes the script's own buffers
        io = sess.io_binding()
        for n, a in zip(names, work):
            io.bind_input(n, "cpu", 0, a.dtype, list(a.shape), a.ctypes.data)
        outs = [np.empty_like(o) for o in sess.run(None, dict(zip(names, work)))]  # (shapes may be symbolic)
        for o, b in zip(sess.get_outputs(), outs):
            io.bind_output(o.name, "cpu", 0, b.dtype, list(b.shape), b.ctypes.data)
        call = lambda x: sess.run_with_iobinding(io)
elif backend == "openvino":
    sys.modules.setdefault("openvino_telemetry", None)
    import openvino as ov
    core = ov.Core()
    model = core.read_model(art)
    if params.get("shapes"):
        model.reshape({n: ov.PartialShape(d) for n, d in params["shapes"].items()})
    cfg = {}
    if "precision" in params: cfg["INFERENCE_PRECISION_HINT"] = {"fp32": "f32", "bf16": "bf16", "fp16": "f16"}[params["precision"]]
    if "hint" in params: cfg["PERFORMANCE_HINT"] = params["hint"].upper()
    if "threads" in params: cfg["INFERENCE_NUM_THREADS"] = int(params["threads"])
    if "streams" in params: cfg["NUM_STREAMS"] = int(params["streams"])
    if "pinning" in params: cfg["ENABLE_CPU_PINNING"] = bool(params["pinning"])
    compiled = core.compile_model(model, params.get("device", "CPU"), cfg)
    req = compiled.create_infer_request()
    if plain:
        call = lambda x: req.infer(dict(zip(names, x)))
    else:  # shared-memory tensors over the script's own buffers, bound once
        ports = {p.get_any_name(): i for i, p in enumerate(compiled.inputs)}
        for n, a in zip(names, work):
            req.set_input_tensor(ports[n], ov.Tensor(a, shared_memory=True))
        call = lambda x: req.infer()
elif backend == "tflite":
    try:
        from ai_edge_litert.interpreter import Interpreter, OpResolverType
    except ImportError:
        from tflite_runtime.interpreter import Interpreter, OpResolverType
    kw = {"model_path": art}
    if "num_threads" in params: kw["num_threads"] = int(params["num_threads"])
    if params.get("xnnpack") in (False, 0):
        kw["experimental_op_resolver_type"] = OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES
    it = Interpreter(**kw)
    it.allocate_tensors()
    ins = [(int(m["index"]), m["perm"]) for m in params["inputs"]] if "inputs" in params else \
          [(d["index"], list(range(len(d["shape"])))) for d in it.get_input_details()]
    outs = [(int(m["index"]), m["perm"]) for m in params["outputs"]] if "outputs" in params else \
           [(d["index"], list(range(len(d["shape"])))) for d in it.get_output_details()]
    if plain:
        def call(x):
            for (i, p), a in zip(ins, x): it.set_tensor(i, np.ascontiguousarray(a.transpose(p)))
            it.invoke()
            return [it.get_tensor(i).transpose(p) for i, p in outs]
    else:  # each input transposed straight into the interpreter's tensor, outputs back to NCHW
        views = [it.tensor(i) for i, _ in ins]
        moved = [(it.tensor(i), p) for i, p in outs if list(p) != list(range(len(p)))]
        def call(x):
            for v, (_, p), a in zip(views, ins, x):
                t = v(); np.copyto(t, a.transpose(p)); del t
            it.invoke()
            return [np.ascontiguousarray(v().transpose(p)) for v, p in moved]
else:
    raise SystemExit("backend %s is not timed here" % backend)
t_end = time.perf_counter() + spec["warmup_s"]
i = 0
def feed(k):  # the next input set: the plain calls take it as is, bound ones read it from `work`
    if plain:
        return sets[k % 8]
    for w, a in zip(work, sets[k % 8]):
        np.copyto(w, a)
    return work
while time.perf_counter() < t_end:
    call(feed(i)); i += 1
ns, t_end = [], time.perf_counter() + spec["seconds"]
while time.perf_counter() < t_end or len(ns) < 10:
    x = feed(len(ns))
    t0 = time.perf_counter_ns(); call(x); ns.append(time.perf_counter_ns() - t0)
print(json.dumps({"median_ns": float(np.median(ns)), "n": len(ns)}))
'''


def verdict(lo: float, hi: float) -> str:
    return "faster" if lo > 1 else "slower" if hi < 1 else "no significant difference"


def ab(sides: dict[str, dict], rounds: int, seconds: float, seed: int, calls: str) -> dict:
    """``rounds`` rounds of both sides (a fresh process each), in alternating order; the ratio of
    each round is the default's median over the contender's. ``calls`` "bound": each runtime bound
    the way the agent binds it (PROTOCOL.md, the run loop's step 6); "plain": its plain call."""
    ratios, meds = [], {"default": [], "contender": []}
    for r in range(rounds):
        order = ["default", "contender"] if r % 2 == 0 else ["contender", "default"]
        got = {}
        for side in order:
            spec = {**sides[side], "seed": seed + r, "seconds": seconds, "warmup_s": 0.3, "calls": calls}
            out = subprocess.run([sys.executable, "-c", CHILD, json.dumps(spec)], capture_output=True, text=True,
                                 timeout=300)
            if out.returncode != 0:
                return {"error": f"{side}: " + (out.stderr.strip().splitlines() or ["failed"])[-1][:200]}
            got[side] = json.loads(out.stdout)["median_ns"]
            meds[side].append(got[side])
        ratios.append(got["default"] / got["contender"])
    logs = np.log(ratios)
    m, se = float(np.mean(logs)), float(np.std(logs, ddof=1) / math.sqrt(len(logs)))
    t = t_quantile(0.975, len(logs) - 1)
    lo, hi = math.exp(m - t * se), math.exp(m + t * se)
    return {"ratio": math.exp(m), "ci95": [lo, hi], "verdict": verdict(lo, hi), "rounds": rounds,
            "median_ms": {k: float(np.median(v)) / 1e6 for k, v in meds.items()}}


def prepare(cand_dict: dict, model, shape: dict, home: Path):
    """The artifact and runtime settings the tune ran for this candidate (its own cache)."""
    from edgetune.agent.host import AgentClient
    from edgetune.candidate import Candidate
    from edgetune.devices.inventory import DeviceSpec
    from edgetune.space import space_of
    from edgetune.workload import build_workload

    cand = Candidate.from_dict(cand_dict)
    wl = build_workload(model, shape, {}, n_seeded=1)
    client = AgentClient(DeviceSpec("local", "local", {}))
    try:
        info = client.provision()
    finally:
        client.close()
    prep = space_of(cand).prepare(cand, wl, info, home / "artifacts")
    x = wl.input_sets[0]
    return {"backend": prep.backend, "artifact": str(prep.artifact), "params": prep.params,
            "names": list(wl.input_names), "shapes": [list(a.shape) for a in x], "dtypes": [str(a.dtype) for a in x]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="mobilenet,transformer")
    ap.add_argument("--budget", type=float, default=60.0, help="the demo's DEMO_BUDGET")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--seconds", type=float, default=1.0, help="timed seconds per side and round")
    ap.add_argument("--home", help="EDGETUNE_HOME of the tunes (default: a new temporary one)")
    ap.add_argument("--json", help="write every figure here")
    a = ap.parse_args()
    home = Path(a.home or tempfile.mkdtemp(prefix="edgetune-demo-ab-"))
    os.environ["EDGETUNE_HOME"] = str(home)
    from edgetune.modelfile import load_model

    rows = []
    for name in a.models.split(","):
        t0 = time.monotonic()
        out = subprocess.run([str(ROOT / ".venv/bin/edgetune"), "tune", name, "--budget", str(a.budget), *DEMO[name],
                              "--format", "json"], capture_output=True, text=True, env=os.environ)
        if out.returncode != 0:
            raise SystemExit(f"edgetune tune {name} failed: {out.stderr.strip()[-300:]}")
        doc = json.loads(out.stdout)
        print(f"# tune {name}: {time.monotonic() - t0:.0f} s", file=sys.stderr)
        for run in doc["runs"]:
            model = load_model(run["model"])
            for s in run["shapes"]:
                conf = s.get("confirmation") or {}
                by_key = {c["candidate"]["key"]: c for c in s["candidates"]}
                c_key, d_key = conf.get("contender"), s["default"]
                label = " ".join(f"{k}={v}" for k, v in s["shape"].items())
                row = {"model": name, "shape": label, "selected": by_key.get(s["best"], {}).get("label")}
                if not c_key or c_key == d_key or c_key not in by_key:
                    rows.append({**row, "contender": None, "note": "no contender was confirmed against the default"})
                    continue
                c = by_key[c_key]
                v = conf.get("speedup_vs_default") or c.get("speedup_vs_default") or {}
                row.update(contender=c["label"], edgetune={k: v.get(k) for k in ("speedup", "ci95", "verdict", "rounds")},
                           edgetune_medians_ms={"default": (by_key[d_key].get("confirm_stats") or {}).get("median_ms"),
                                                "contender": (c.get("confirm_stats") or {}).get("median_ms")})
                try:
                    sides = {"default": prepare(by_key[d_key]["candidate"], model, s["shape"], home),
                             "contender": prepare(c["candidate"], model, s["shape"], home)}
                except Exception as exc:  # a backend this script does not time (TVM): said, not guessed
                    rows.append({**row, "independent": {"error": f"{type(exc).__name__}: {exc}"[:200]}})
                    continue
                if any(x["backend"] not in ("ort", "openvino", "tflite") for x in sides.values()):
                    rows.append({**row, "independent": {"error": "a TVM build: not timed by this script"}})
                    continue
                rows.append({**row, "independent": ab(sides, a.rounds, a.seconds, len(rows) * 100, "bound"),
                             "plain_calls": ab(sides, a.rounds, a.seconds, len(rows) * 100, "plain")})
                print(f"# {name} {label}: done", file=sys.stderr)
    print("| model | shape | contender | edgetune (confirmation) | independent A/B, bound as the agent binds | same verdict | intervals overlap | the runtimes' plain calls |")
    print("|---|---|---|---|---|---|---|---|")
    agree = total = 0

    def fmt(x: dict) -> str:
        if "error" in x:
            return f"not run: {x['error']}"
        return f"{x['ratio']:.2f}× [{x['ci95'][0]:.2f}, {x['ci95'][1]:.2f}] {x['verdict']} ({x['rounds']} rounds)"
    for r in rows:
        if not r.get("contender"):
            print(f"| {r['model']} | {r['shape']} | — | {r['note']} | | | | |")
            continue
        e, i = r["edgetune"], r.get("independent", {})
        ef = f"{e['speedup']:.2f}× [{e['ci95'][0]:.2f}, {e['ci95'][1]:.2f}] {e['verdict']} ({e['rounds']} rounds)"
        if "error" in i:
            print(f"| {r['model']} | {r['shape']} | {r['contender']} | {ef} | {fmt(i)} | | | |")
            continue
        same = e["verdict"] == i["verdict"]
        overlap = e["ci95"][0] <= i["ci95"][1] and i["ci95"][0] <= e["ci95"][1]
        total += 1
        agree += same
        print(f"| {r['model']} | {r['shape']} | {r['contender']} | {ef} | {fmt(i)} | {'yes' if same else '**no**'} | "
              f"{'yes' if overlap else '**no**'} | {fmt(r['plain_calls'])} |")
    print("\nmedians, ms, default / contender: edgetune | bound | plain")
    for r in rows:
        if r.get("contender") and "error" not in r.get("independent", {}):
            em, bm, pm = r["edgetune_medians_ms"], r["independent"]["median_ms"], r["plain_calls"].get("median_ms", {})
            f = lambda m: "%s / %s" % tuple("%.3g" % m[k] if m.get(k) is not None else "?" for k in ("default", "contender"))  # noqa: E731
            print(f"{r['model']} {r['shape']}: {f(em)} | {f(bm)} | {f(pm)}")
    print(f"\nsame verdict in {agree} of {total} pairs")
    if a.json:
        Path(a.json).write_text(json.dumps({"home": str(home), "rows": rows, "agree": agree, "pairs": total}, indent=1))


if __name__ == "__main__":
    main()
