#!/usr/bin/env python3
"""``edgetune judge`` on a GPU machine the host cannot reach (issue 14): the device half offline,
through the same agents, requests, verifier, final rounds and verdict as a live judgement.

    .venv/bin/python tools/gpu/judge_replay.py prepare DIR [--op SPEC ...] [--kernels PATH ...] [--sm sm_90]
    python3 tools/gpu/judge_replay.py run DIR OUT                                  # GPU machine
    .venv/bin/python tools/gpu/judge_replay.py verify DIR OUT [--markdown FILE]    # host

prepare (here): every CUDA kernel built with nvcc for the GPU's SM (with the op's -D macros, as the
judge builds them); the native agent built for this host's architecture; per op, the judge's plan:
each kernel at the odd-sized variant (its first correctness check) and, under compute-sanitizer's
memcheck and racecheck, once more; then ``--rounds`` rounds in the judge's rotating order of every
kernel and every GPU baseline form (onnxruntime's CUDA provider, cuBLAS/cuDNN underneath, TF32 off,
GPU-memory binding; eager PyTorch on CUDA and torch.compile max-autotune: ``kernels.baselines.baseline_forms``
on a device that has them), fresh inputs per
round, the same weights everywhere. Each job is staged as the agent's request (AgentClient.stage_job)
with paths relative to its job dir; the Job objects, the workloads and the forms stay in DIR/host.
run (on the GPU machine: stdlib only, plus numpy, PyTorch and, where installed, onnxruntime-gpu for the Python agent): both
agents' ``info`` (the native one reports the GPU from nvidia-smi), then every request in order, the
native agent's judge backend in CUDA mode for kernels, the Python agent for the forms, the sanitizer
jobs under ``compute-sanitizer --tool T --target-processes all`` when the machine has it; every
bundle saved as it came. It never sees a reference.
verify (here): every bundle through AgentClient's validation; the odd-shape checks and the sanitizer
reports as the judge reads them; then ``kernels.session.final_rounds`` itself, fed the replayed
results, and ``strongest_baseline``: each kernel's verdict (per-round medians, the t interval on
per-round log ratios) against the strongest verified GPU form. A kernel that failed a check is out,
as in the judge: its later jobs are not looked at.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve()
ROOT = HERE.parents[2]
sys.path.insert(0, str(HERE.parent))

from replay_common import load_result, machine, run_request, stage as stage_request  # noqa: E402
# what is carried to the GPU machine is every input array once (~4 MB per 1024x1024 operand and round)
DEFAULT_OPS = ("gemm:M=1024,N=1024,K=1024", "gemm:M=200,N=300,K=500")
DEFAULT_KERNELS = ("tests/judge_kernels_cuda",)


def _device_info(sm: str):
    """The device as a GPU machine with onnxruntime-gpu and a CUDA build of PyTorch reports itself
    (for the baseline forms). The lent GPU machines' python3 has a CUDA build of PyTorch and PyPI's
    CPU onnxruntime: there the onnxruntime CUDA forms fail at load with that reason, and the PyTorch
    forms (cuBLAS/cuDNN, torch.compile) are the GPU baselines."""
    return type("Info", (), {"runtimes": {"onnxruntime_providers": ["CUDAExecutionProvider", "CPUExecutionProvider"],
                                          "torch": "cuda build", "torch_cuda": "yes"},
                             "fingerprint": {"gpus": [{"sm": sm}]}})()


def prepare(out: Path, ops: list[str], kernel_paths: list[str], sm: str, rounds: int, budget_ms: float) -> int:
    sys.path.insert(0, str(ROOT))
    from edgetune import sanitizer as san
    from edgetune.agent.host import AgentClient, Job
    from edgetune.build import kernel_build as kb
    from edgetune.build import native
    from edgetune.devices.inventory import DeviceSpec
    from edgetune.judge import collect_kernels, odd_variant, op_macros
    from edgetune.kernels import session as S
    from edgetune.kernels.workloads import parse_workload
    from edgetune.rounds import interleaved

    if out.exists():
        sys.exit(f"error: {out} exists; give a new directory")
    kernels = [k for k in collect_kernels(kernel_paths) if k.kind == "cuda"]
    if not kernels:
        sys.exit("error: no .cu kernels in " + ", ".join(kernel_paths))
    workloads = [parse_workload(o) for o in ops]
    dev = out / "device"
    (out / "host").mkdir(parents=True)
    agent = native.build_agent(None, static=False, out_dir=out / "host" / "agent-build")
    (dev / "agent-native").mkdir(parents=True)
    shutil.copy2(agent, dev / "agent-native" / "edgetune-agent")
    client = AgentClient(DeviceSpec("replay", "local"), workdir=str(dev))
    jobs: list = []
    plan: list[dict] = []
    ops_doc = []

    def stage(job, entry: dict) -> None:
        n = len(jobs)
        stage_request(client, job, out / "host", dev, n)
        jobs.append(job)
        plan.append({"job": n, "jobdir": f"device/jobs/{n:04d}", **entry})

    try:
        client.provision()  # the Python agent and the layout (artifacts, inputs, jobs)
        for oi, w in enumerate(workloads):
            built = {}
            for k in kernels:
                b = kb.build_kernel(k.path, "x86_64", out / "host" / "build", cflags=op_macros(w), cuda_arch=sm)
                if b.interposed:
                    sys.exit(f"error: {k.name} interposes {', '.join(b.interposed)}")
                built[k.name] = b

            def kjob(k, view, inputs, **kw):
                b = built[k.name]
                return Job(backend="judge", artifact=Path(b.path),
                           params={"abi": b.abi, "num_threads": 1, "device": "cuda", "cuda_device": 0},
                           input_names=[s.name for s in view.inputs], input_sets=[inputs],
                           output_specs=[s.as_json() for s in view.outputs],
                           **{"budget_ms": budget_ms, "warmup_ms": min(20.0, max(5.0, budget_ms / 5)),
                              "max_iters": 20_000, "timeout_s": 120.0, "memory_mb": 8192, **kw})

            odd = odd_variant(w) or w
            check_inputs = odd.random_inputs(7)
            for k in kernels:  # 1. the first correctness check, at the odd-sized variant
                stage(kjob(k, odd, [x.copy() for x in check_inputs]), {"op": oi, "stage": "check", "who": k.name})
            san_inputs = check_inputs  # (the judge draws another set; here the carried arrays are spared)
            for k in kernels:  # 1b. once under each sanitizer tool (a checked call, no timing)
                for tool in san.TOOLS:
                    stage(kjob(k, odd, [x.copy() for x in san_inputs], min_iters=1, max_iters=2, check_iters=1,
                               check_fastest=0, probe_pairs=0),
                          {"op": oi, "stage": "sanitize", "who": k.name, "tool": tool})
            weights = S.final_weights(w)
            forms, _ = _gpu_forms(w, weights, out / "host", sm)
            participants = [("kernel", k.name) for k in kernels] + [("form", f.key) for f in forms]
            by_form = {f.key: f for f in forms}
            def plan_job(who, rnd, inputs):  # staged, not run: no participant is out before the device runs it
                kind, key = who
                if kind == "kernel":
                    job = kjob(next(k for k in kernels if k.name == key), w, [x.copy() for x in inputs])
                else:
                    f = by_form[key]
                    job = Job(backend=f.backend, artifact=f.artifact, params=dict(f.params),
                              input_names=[s.name for s in f.view.inputs], input_sets=[f.view.to_form(inputs)],
                              output_specs=[s.as_json() for s in f.view.outputs], budget_ms=budget_ms,
                              warmup_ms=min(50.0, max(5.0, budget_ms / 5)), max_iters=20_000, timeout_s=300.0)
                stage(job, {"op": oi, "stage": "round", "round": rnd, "who": key, "kind": kind,
                            "agent": "python" if kind == "form" else "native"})

            # 2. the rounds, on the judge's one round loop (its rotating order)
            interleaved(participants, rounds, plan_job,
                        before_round=lambda rnd, _w=w, _wt=weights: S.final_inputs(_w, rnd, _wt))
            ops_doc.append({"op": w.spec(), "odd": odd.spec(), "kernels": kernels, "built": built})
    finally:
        client.close()
    for p in plan:
        p.setdefault("agent", "native")
    _dedupe_inputs(dev)
    with open(out / "host" / "state.pkl", "wb") as f:
        pickle.dump({"jobs": jobs, "ops": ops_doc, "check_inputs": None}, f)
    (out / "plan.json").write_text(json.dumps({"ops": [o["op"] for o in ops_doc], "sm": sm, "rounds": rounds,
                                               "budget_ms": budget_ms, "jobs": plan}, indent=1))
    print(f"{len(plan)} jobs ({len(kernels)} kernels, {len(ops)} ops, {rounds} rounds) in {out}")
    return 0


def _gpu_forms(w, weights, workdir: Path, sm: str):
    """The GPU baseline forms the judge gives a device with onnxruntime's CUDA provider (deterministic:
    verify rebuilds the same ones), and the forms that are not GPU ones, as unavailable here."""
    from edgetune.kernels import baselines as B

    bdev = B.BaselineDevice(False, "", python=object(), python_info=_device_info(sm), num_threads=1)
    forms, skipped = B.baseline_forms(w, weights, workdir, bdev)
    gpu = ("ort-cuda", "torch-cuda")
    other = [{"form": f.key, "label": f.label, "status": "unavailable", "reason": "not in the GPU replay"}
             for f in forms if not f.key.startswith(gpu)]
    return [f for f in forms if f.key.startswith(gpu)], skipped + other


def _dedupe_inputs(dev: Path) -> None:
    """Every input array once: the staged sets (a directory per set) share arrays (the weights of
    every round, a round's activations in the kernel's and the forms' sets); the requests are
    rewritten to one file per content, inputs/arrays/<sha256>.npy."""
    import hashlib

    arrays = dev / "inputs" / "arrays"
    arrays.mkdir()
    where: dict[str, str] = {}
    for f in sorted((dev / "inputs").glob("*/in_*.npy")):
        if f.parent == arrays:
            continue
        digest = hashlib.sha256(f.read_bytes()).hexdigest()
        target = arrays / f"{digest}.npy"
        if not target.exists():
            f.rename(target)
        where[f"../../inputs/{f.parent.name}/{f.name}"] = f"../../inputs/arrays/{digest}.npy"
    for req in (dev / "requests").glob("*.json"):
        r = json.loads(req.read_text())
        r["inputs"] = [[where[x] for x in row] for row in r["inputs"]]
        req.write_text(json.dumps(r))
    for d in (dev / "inputs").iterdir():
        if d != arrays:
            shutil.rmtree(d)


def _sanitizer() -> str | None:
    exe = shutil.which("compute-sanitizer")
    if exe is None and os.access("/usr/local/cuda/bin/compute-sanitizer", os.X_OK):
        exe = "/usr/local/cuda/bin/compute-sanitizer"
    return exe


def run(src: Path, out: Path, deadline_s: float) -> int:
    """On the GPU machine: both agents' info, then every request in order; bundles saved as they came."""
    src, out = src.resolve(), out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    native_agent = src / "device" / "agent-native" / "edgetune-agent"
    py_agent = src / "device" / "agent" / "edgetune_agent.py"
    argv = {"native": [str(native_agent)], "python": [sys.executable, str(py_agent)]}
    for name, a in argv.items():
        info = subprocess.run([*a, "info"], capture_output=True, timeout=120)
        (out / f"info-{name}.json").write_bytes(info.stdout)
    exe = _sanitizer()
    (out / "sanitizer.txt").write_text(exe or "")
    plan = json.loads((src / "plan.json").read_text())
    t0 = time.monotonic()
    # the sanitizer jobs last: the tools slow a kernel 10-1000x, and the timed rounds come first
    for p in sorted(plan["jobs"], key=lambda p: p["stage"] == "sanitize"):
        n = p["job"]
        left = deadline_s - (time.monotonic() - t0)
        if left <= 0:
            print(f"deadline: {deadline_s:.0f} s passed; job {n} and the ones after it not run", flush=True)
            break
        wrap: list[str] = []
        log = out / f"{n:04d}.sanitizer.log"
        if p["stage"] == "sanitize":
            if exe is None:
                continue
            wrap = [exe, "--tool", p["tool"], "--target-processes", "all", "--print-limit", "20", "--log-file", str(log)]
        rc, took = run_request([*wrap, *argv[p["agent"]]], src, out, n, src / p["jobdir"], left + 30)
        print(f"job {n} {p['stage']} {p['who']} {p.get('tool') or p.get('round') or ''}: rc {rc}, {took:.1f} s",
              flush=True)
    print(f"{len(plan['jobs'])} jobs planned, {time.monotonic() - t0:.0f} s")
    return 0


def verify(src: Path, out: Path, markdown: Path | None) -> int:
    sys.path.insert(0, str(ROOT))
    from edgetune import sanitizer as san
    from edgetune.agent.host import AgentClient
    from edgetune.devices.inventory import DeviceSpec
    from edgetune.kernels import session as S
    from edgetune.kernels.device_measure import job_to_kernel_run
    from edgetune.kernels.targets import gpu_peak_gflops
    from edgetune.kernels.workloads import parse_workload
    from edgetune.measure import round_median, round_ratio

    plan = json.loads((src / "plan.json").read_text())
    with open(src / "host" / "state.pkl", "rb") as f:
        state = pickle.load(f)
    jobs = state["jobs"]
    client = AgentClient(DeviceSpec("replay", "local", {}))
    _, fp = machine(out / "info-native.json")
    gpus = fp.get("gpus") or []
    sm = next((g.get("sm") for g in gpus if isinstance(g, dict) and g.get("sm")), None)
    if sm != plan["sm"]:
        print(f"warning: the kernels were built for {plan['sm']}, the machine's GPU is {sm}")
    peak = gpu_peak_gflops(sm) if sm else None
    sanitizer = (out / "sanitizer.txt").read_text().strip() if (out / "sanitizer.txt").exists() else ""

    def result(n):
        return load_result(client, out, n, jobs[n])

    lines = [f"GPU machine: {json.dumps(gpus or 'no GPU reported')}; CPU {fp.get('cpu_model')}, "
             f"{fp.get('cores')} cores; compute-sanitizer: {sanitizer or 'absent'}", ""]
    ok_all = True
    import tempfile

    tmp = Path(tempfile.mkdtemp(prefix="judge-replay-"))
    for oi, od in enumerate(state["ops"]):
        w, odd = parse_workload(od["op"]), parse_workload(od["odd"])
        weights = S.final_weights(w)
        forms, skipped = _gpu_forms(w, weights, tmp, plan["sm"])
        entries = [p for p in plan["jobs"] if p["op"] == oi]
        failure: dict[str, str] = {}
        notes: dict[str, list[str]] = {k.name: [] for k in od["kernels"]}
        for p in entries:  # 1. checks, in the judge's order: odd shape, then the sanitizer tools
            if p["stage"] == "round" or p["who"] in failure:
                continue
            if p["stage"] == "check":
                jr = result(p["job"])
                if jr is None:
                    failure[p["who"]] = "not-run: the GPU machine did not run its check"
                    continue
                inputs = jobs[p["job"]].input_sets[0]
                run = job_to_kernel_run(jr, inputs, odd.outputs)
                ok, reason, _, _ = S.check_kernel_run(run, odd, inputs, odd.reference(inputs), peak_gflops=peak)
                if not ok:
                    failure[p["who"]] = f"at {odd.spec()}: {reason}"
            else:
                log = out / f"{p['job']:04d}.sanitizer.log"
                if not log.exists():
                    notes[p["who"]].append(f"{p['tool']}: {'not run' if sanitizer else 'no compute-sanitizer'}")
                    continue
                fnd = san.parse(log.read_text(errors="replace"), p["tool"])
                if fnd.ok is False:
                    failure[p["who"]] = f"{fnd.code}: {fnd.detail}"
                else:
                    notes[p["who"]].append(f"{p['tool']}: {'clean' if fnd.ok else fnd.detail}")
        # 2. the rounds, through final_rounds itself, fed the replayed results
        rounds_jobs = {(p["round"], p["who"]): p["job"] for p in entries if p["stage"] == "round"}
        current = {"round": 0}

        def replay(key, xs, outputs):
            n = rounds_jobs[(current["round"], key)]
            jr = result(n)
            if jr is None:
                from edgetune.kernels.search import KernelRun
                return None, KernelRun("error", "not run on the GPU machine (its deadline)")
            return jr, job_to_kernel_run(jr, xs, outputs)

        standing = [k for k in od["kernels"] if k.name not in failure]
        entrants = [S.Entrant(k.name, (lambda xs, _k=k: replay(_k.name, xs, w.outputs)), peak_gflops=peak)
                    for k in standing]
        rounds = S.final_rounds(w, entrants, forms, plan["rounds"], weights,
                                lambda form, xs: replay(form.key, xs, form.view.outputs),
                                lambda *a: None, on_round=lambda r: current.__setitem__("round", r))
        for k, why in rounds.failed.items():
            failure.setdefault(k, why)
        flops = int(w.flops())
        lines += [f"### {w.spec()} (odd-size check at {odd.spec()})", "",
                  "| kernel | correct | median ms | GFLOP/s | strongest baseline | its median ms | speedup [95% CI] "
                  "| verdict | sanitizer | failure |", "|---|---|---|---|---|---|---|---|---|---|"]
        for k in od["kernels"]:
            g = rounds.groups.get(k.name, [])
            if k.name in failure or len(g) != plan["rounds"]:
                why = failure.get(k.name, "not in every round")
                lines.append(f"| {k.name} | NO | — | — | — | — | — | — | {'; '.join(notes[k.name]) or '—'} | "
                             f"{why[:200]} |")
                continue
            med = round_median(g)
            b = S.strongest_baseline(forms, skipped, rounds.groups, rounds.failed, g, flops, round_ratio)
            ci = b["ci95"]
            sp = f"{b['speedup']:.3f}× [{ci[0]:.3f}, {ci[1]:.3f}]" if b["speedup"] and ci and ci[0] else "—"
            bmed = f"{b['median_ns'] / 1e6:.4f}" if b.get("median_ns") else "—"
            lines.append(f"| {k.name} | yes | {med / 1e6:.4f} | {flops / med:.0f} | {b['backend'] or b['reason']} | "
                         f"{bmed} | {sp} | {b['verdict'] or '—'} | {'; '.join(notes[k.name]) or '—'} | — |")
        for f in forms:
            g = rounds.groups.get(f.key, [])
            state_txt = (f"verified in {len(g)} rounds, median {round_median(g) / 1e6:.4f} ms, "
                         f"{flops / round_median(g):.0f} GFLOP/s") if g and f.key not in rounds.failed \
                else f"failed: {rounds.failed.get(f.key, 'no rounds')}"[:200]
            lines.append(f"\nbaseline form {f.key} ({f.label}): {state_txt}")
        lines.append("")
        # nothing to compare against without a GPU baseline verified in every round: exit 1
        ok_all &= any(len(rounds.groups.get(f.key, [])) == plan["rounds"] and f.key not in rounds.failed
                      for f in forms)
    shutil.rmtree(tmp, ignore_errors=True)
    text = "\n".join(lines)
    print(text)
    if markdown is not None:
        markdown.write_text(text + "\n")
    return 0 if ok_all else 1


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("prepare")
    p.add_argument("dir", type=Path)
    p.add_argument("--op", action="append", dest="ops")
    p.add_argument("--kernels", action="append")
    p.add_argument("--sm", default="sm_90")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--budget-ms", type=float, default=100.0)
    r = sub.add_parser("run")
    r.add_argument("dir", type=Path)
    r.add_argument("out", type=Path)
    r.add_argument("--deadline-s", type=float, default=200.0)
    v = sub.add_parser("verify")
    v.add_argument("dir", type=Path)
    v.add_argument("out", type=Path)
    v.add_argument("--markdown", type=Path)
    a = ap.parse_args(argv)
    if a.cmd == "prepare":
        return prepare(a.dir, a.ops or list(DEFAULT_OPS), a.kernels or [str(ROOT / k) for k in DEFAULT_KERNELS],
                       a.sm, a.rounds, a.budget_ms)
    if a.cmd == "run":
        return run(a.dir, a.out, a.deadline_s)
    return verify(a.dir, a.out, a.markdown)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
