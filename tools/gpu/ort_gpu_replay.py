#!/usr/bin/env python3
"""onnxruntime's GPU candidates on a GPU machine the host cannot reach, through edgetune's own agent,
request validation and verification (issue 14): the device half runs offline.

    .venv/bin/python tools/gpu/ort_gpu_replay.py prepare DIR --model mobilenet --batch 1,8   # host
    python3 tools/gpu/ort_gpu_replay.py run DIR OUT                                        # GPU machine
    .venv/bin/python tools/gpu/ort_gpu_replay.py verify DIR OUT [--markdown FILE]          # host

prepare: the candidates the ``ort`` space gives a device whose onnxruntime has the CUDA and TensorRT
providers (space/ort_gpu.py), the onnxruntime defaults and the CPU provider's defaults as baselines,
each staged as the agent's request by AgentClient.stage_job into DIR (artifacts, inputs, requests
with paths relative to their job dirs), in ``--rounds`` interleaved rounds; the host's Job objects
(fresh-input seeds included) stay in DIR/host, with the references computed here.
run (stdlib + numpy + onnxruntime-gpu; no edgetune): the Python agent's ``info`` (the GPU's
fingerprint: nvidia-smi, CUDA versions), then every request through ``edgetune_agent.py run-stdio``,
its bundle saved as it came. Never sees a reference.
verify: every bundle through AgentClient's validation and verify.verify_job against the references
computed here, as a live device's answers are; a table of medians with 95% intervals and speedups
against the CUDA provider at its defaults (the strongest GPU baseline of the run) and onnxruntime's
defaults (the CPU provider: onnxruntime-gpu names no default).
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve()
sys.path.insert(0, str(HERE.parent))

from replay_common import load_result, machine, run_request, stage  # noqa: E402


def prepare(out: Path, model_name: str, batches: list[int], rounds: int, budget_ms: float) -> int:
    sys.path.insert(0, str(HERE.parents[2]))
    from edgetune.agent.host import AgentClient, AgentInfo, Job
    from edgetune.api import resolve_model
    from edgetune.candidate import Candidate
    from edgetune.devices.inventory import DeviceSpec
    from edgetune.space import load_space
    from edgetune.modelfile import load_model
    from edgetune.workload import build_workload

    if out.exists():
        sys.exit(f"error: {out} exists; give a new directory")
    model = load_model(resolve_model(model_name))
    # the device as a GPU machine's onnxruntime-gpu reports itself: CUDA, TensorRT, CPU
    info = AgentInfo("python", "expected", "x86_64", "3", {
        "onnxruntime": "gpu", "onnxruntime_providers": ["TensorrtExecutionProvider", "CUDAExecutionProvider",
                                                        "CPUExecutionProvider"]}, {"cores": 16})
    gpu = [c for c in load_space("ort").candidates(model, info)
           if c.param_dict.get("execution_provider") in ("CUDAExecutionProvider", "TensorrtExecutionProvider")]
    cands = [Candidate.make("ort", {}, baseline=True), *gpu]  # the defaults (the CPU), the GPU providers' own
    dev = out / "device"
    (out / "host").mkdir(parents=True)
    client = AgentClient(DeviceSpec("replay", "local"), workdir=str(dev))
    jobs, plan = [], []
    try:
        client.provision()  # the device's layout (agent, artifacts, inputs, jobs) as on any device
        for b in batches:
            dims = {d: b for s in model.inputs for d in s.dims if isinstance(d, str)}
            wl = build_workload(model, dims, seed=0)
            wl.references()
            specs = [{"name": n, "dtype": str(r.dtype), "shape": list(r.shape)}
                     for n, r in zip(wl.output_names, wl.references()[0])]
            for rnd in range(rounds):
                order = cands[rnd % len(cands):] + cands[:rnd % len(cands)]  # interleaved, rotated per round
                for c in order:
                    job = Job(backend="ort", artifact=model.path, params=c.param_dict, input_names=wl.input_names,
                              input_sets=wl.input_sets, output_specs=specs, budget_ms=budget_ms,
                              warmup_ms=min(50.0, budget_ms / 4), timeout_s=600.0, memory_mb=None,
                              placement=True)
                    n = len(jobs)
                    jobdir = stage(client, job, out / "host", dev, n)
                    jobs.append(job)
                    plan.append({"job": n, "batch": b, "round": rnd, "candidate": c.as_dict(), "label": c.label(),
                                 "jobdir": os.path.relpath(jobdir, out)})
            with open(out / "host" / f"workload-{b}.pkl", "wb") as f:
                pickle.dump(wl, f)
    finally:
        client.close()
    with open(out / "host" / "jobs.pkl", "wb") as f:
        pickle.dump(jobs, f)
    (out / "plan.json").write_text(json.dumps({"model": model_name, "batches": batches, "rounds": rounds,
                                               "jobs": plan}, indent=1))
    print(f"{len(plan)} jobs ({len(cands)} candidates x {len(batches)} batch sizes x {rounds} rounds) in {out}")
    return 0


def run(src: Path, out: Path) -> int:
    """On the GPU machine: the agent's info, then every request, in order; bundles saved as they came."""
    out.mkdir(parents=True, exist_ok=True)
    agent = src / "device" / "agent" / "edgetune_agent.py"
    info = subprocess.run([sys.executable, str(agent), "info"], capture_output=True, timeout=120)
    (out / "info.json").write_bytes(info.stdout)
    plan = json.loads((src / "plan.json").read_text())
    t0 = time.monotonic()
    for p in plan["jobs"]:
        n = p["job"]
        rc, took = run_request([sys.executable, str(agent)], src, out, n, src / p["jobdir"], 900)
        print(f"job {n} {p['label']} batch {p['batch']} round {p['round']}: rc {rc}, {took:.1f} s", flush=True)
    print(f"{len(plan['jobs'])} jobs in {time.monotonic() - t0:.0f} s")
    return 0


def verify(src: Path, out: Path, markdown: Path | None) -> int:
    sys.path.insert(0, str(HERE.parents[2]))
    from edgetune.agent.host import AgentClient
    from edgetune.devices.inventory import DeviceSpec
    from edgetune.measure import speedup, summarize
    from edgetune.results import placement_label
    from edgetune.verify import verify_job

    plan = json.loads((src / "plan.json").read_text())
    with open(src / "host" / "jobs.pkl", "rb") as f:
        jobs = pickle.load(f)
    wls = {}
    for b in plan["batches"]:
        with open(src / "host" / f"workload-{b}.pkl", "rb") as f:
            wls[b] = pickle.load(f)
    client = AgentClient(DeviceSpec("replay", "local", {}))
    info, fp = machine(out / "info.json")
    lines = [f"GPU machine: {json.dumps(fp.get('gpus') or 'no GPU reported')}; "
             f"CPU {fp.get('cpu_model')}, {fp.get('cores')} cores; onnxruntime "
             f"{json.dumps((info.get('runtimes') or {}).get('onnxruntime_providers')) if isinstance(info, dict) else '?'}",
             ""]
    by: dict[tuple[int, str], dict] = {}
    for p in plan["jobs"]:
        n, job, wl = p["job"], jobs[p["job"]], wls[p["batch"]]
        res = load_result(client, out, n, job)
        verdict = verify_job(res, wl.input_sets, wl.references(), wl.reference_for, wl.output_names,
                             timings_trusted=True, approximate=False)
        row = by.setdefault((p["batch"], p["label"]), {"candidate": p["candidate"], "samples": [], "ok": True,
                                                       "reasons": [], "placement": None})
        row["ok"] &= verdict.ok
        if not verdict.ok:
            row["reasons"].append(verdict.reason)
        row["samples"] += list(res.samples_ns) if verdict.ok else []
        row["placement"] = res.placement or row["placement"]
    for b in plan["batches"]:
        rows = {label: r for (bb, label), r in by.items() if bb == b}
        cuda = next((r for r in rows.values() if r["candidate"]["params"] == {"execution_provider":
                                                                             "CUDAExecutionProvider"}), None)
        cpu = next((r for r in rows.values() if not r["candidate"]["params"]), None)  # the agent's default: CPU
        default = cuda
        lines += [f"### batch {b}", "", "| candidate | verified | median ms [95% CI] | vs CUDA at its defaults | "
                  "vs onnxruntime's defaults (CPU) | where the nodes ran | why not |", "|---|---|---|---|---|---|---|"]
        for label, r in rows.items():
            med = vs_d = vs_c = "—"
            if r["ok"] and r["samples"]:
                s = summarize(r["samples"])
                med = f"{s.median_ns / 1e6:.4f} [{s.ci_low_ns / 1e6:.4f}, {s.ci_high_ns / 1e6:.4f}]"
                for base, slot in ((default, "d"), (cpu, "c")):
                    if base is not None and base is not r and base["ok"] and base["samples"]:
                        x = speedup(base["samples"], r["samples"])
                        txt = f"{x.value:.2f}× [{x.ci_low:.2f}, {x.ci_high:.2f}]"
                        vs_d, vs_c = (txt, vs_c) if slot == "d" else (vs_d, txt)
            nodes = placement_label(r["placement"]) or "—"  # a GPU candidate that ran on the CPU says so
            why = "; ".join(dict.fromkeys(r["reasons"]))[:160] or ""
            lines.append(f"| {label} | {'yes' if r['ok'] else 'NO'} | {med} | {vs_d} | {vs_c} | {nodes} | {why} |")
        lines.append("")
    text = "\n".join(lines)
    print(text)
    if markdown is not None:
        markdown.write_text(text + "\n")
    return 0


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("prepare")
    p.add_argument("dir", type=Path)
    p.add_argument("--model", default="mobilenet")
    p.add_argument("--batch", default="1,8")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--budget-ms", type=float, default=300.0)
    r = sub.add_parser("run")
    r.add_argument("dir", type=Path)
    r.add_argument("out", type=Path)
    v = sub.add_parser("verify")
    v.add_argument("dir", type=Path)
    v.add_argument("out", type=Path)
    v.add_argument("--markdown", type=Path)
    a = ap.parse_args(argv)
    if a.cmd == "prepare":
        return prepare(a.dir, a.model, [int(x) for x in a.batch.split(",")], a.rounds, a.budget_ms)
    if a.cmd == "run":
        return run(a.dir, a.out)
    return verify(a.dir, a.out, a.markdown)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
