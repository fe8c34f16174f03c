#!/usr/bin/env python3
"""What a candidate costs beyond its own timed runs on the local device, in the Python agent's
three ways of running a runtime configuration: on the agent's session (one process per device
connection serving every job: the default), on the zygote through one ``run-stdio`` command per
job (devices.toml ``session = false``), and in a fresh agent process per job (``zygote = false``).

The same onnxruntime job (a bundled model at batch 1, the default session, a 20 ms timing budget)
is run N times through the host's real path (AgentClient: transfer, agent process, supervisor,
verification runs, bundle, validation), the modes in turn (order alternating) so all see the same
machine. Per job: the host's wall time, the agent command's time, the candidate's own timed runs
(the sum of its timed samples), its session load, and the worker's other stages as it reports them
(``phases_ms``: verification runs, warm-up, TEST04 probe pairs, the late-change wait). The overhead
is wall time minus own timed runs; "harness" is what is left after every stage of the candidate's
own (load, verification runs, warm-up, timed loop, probe, late-change wait): processes, transport,
supervisor, bundle, validation. Medians per mode and the ratios.

    .venv/bin/python tools/bench/bench_zygote.py [--jobs 30] [--models mobilenet,transformer]

``--torch-op SPEC`` (e.g. softmax:M=64,N=128) times the PyTorch baseline form of that operator
instead (the Python agent's torch backend: eager, then torch.compile warm from the agent's cache),
the same way: per job, the host's wall time, alternating zygote and fresh.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from edgetune.api import resolve_model  # noqa: E402
from edgetune.db import Store  # noqa: E402
from edgetune.devices.inventory import Inventory  # noqa: E402
from edgetune.space import Prepared  # noqa: E402
from edgetune.tune import DeviceTuner  # noqa: E402
from edgetune.tune_config import TuneConfig  # noqa: E402
from edgetune.modelfile import load_model  # noqa: E402
from edgetune.workload import build_workload, shape_points  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=30, help="jobs per mode and model")
    ap.add_argument("--models", default="mobilenet,transformer")
    ap.add_argument("--budget-ms", type=float, default=20.0)
    ap.add_argument("--torch-op", default=None, help="time the PyTorch form of this operator spec instead")
    args = ap.parse_args()
    spec = Inventory().get("local")
    modes = {"session": spec, "zygote": dataclasses.replace(spec, options={**spec.options, "session": False}),
             "fresh": dataclasses.replace(spec, options={**spec.options, "zygote": False})}
    if args.torch_op:
        return torch_jobs(modes, args.torch_op, args.jobs, args.budget_ms)
    tuners = {m: DeviceTuner(s, Store(":memory:"), TuneConfig(spaces=())) for m, s in modes.items()}
    print("| model | mode | jobs | wall ms | agent command ms | own timed runs ms | load ms | verification runs ms "
          "| warm-up ms | probe ms | late-change wait ms | overhead beyond own timed runs ms | harness ms |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for name in args.models.split(","):
        model = load_model(resolve_model(name))
        wl = build_workload(model, shape_points(model, {"batch": 1}, {})[0])
        prep = Prepared("ort", model.path, {})
        rows: dict[str, list[tuple[float, ...]]] = {m: [] for m in modes}
        isolation: dict[str, set] = {m: set() for m in modes}
        for i in range(args.jobs + 1):
            for m in (modes if i % 2 == 0 else reversed(list(modes))):
                res = tuners[m]._job(wl, prep, budget_ms=args.budget_ms)
                if res.status != "ok":
                    print(f"{name} {m}: job failed: {res.reason}", file=sys.stderr)
                    return 1
                if i == 0:
                    time.sleep(2.0)  # the zygote starts after this job: let it come up
                    continue  # provisioning, and the job after which the zygote starts
                own = float(np.sum(res.samples_ns)) / 1e6
                ph = res.phases_ms
                stages = [ph.get(k, 0.0) for k in ("verify", "warmup", "probe", "late_change")]
                # the timed phase holds the timed calls and the fresh inputs between them: all the candidate's
                work = (res.load_ms or 0.0) + sum(stages) + max(own, ph.get("timed", 0.0))
                rows[m].append((res.wall_ms, res.agent_ms, own, res.load_ms or 0.0, *stages, res.wall_ms - own,
                                res.wall_ms - work))
                isolation[m].add(res.limits_enforced.get("isolation"))
        med = {m: np.median(np.array(r), axis=0) for m, r in rows.items()}
        for m in modes:
            cells = " | ".join(f"{v:.0f}" for v in med[m])
            print(f"| {name} | {m} ({', '.join(sorted(map(str, isolation[m])))}) | {len(rows[m])} | {cells} |")
        for a, b in (("zygote", "session"), ("fresh", "session")):
            print(f"| {name} | {a} / {b} | | | | | | | | | | {med[a][8] / med[b][8]:.2f}× | {med[a][9] / med[b][9]:.2f}× |")
    for t in tuners.values():
        if t.client is not None:
            t.client.close()
    return 0


def torch_jobs(modes, op: str, jobs: int, budget_ms: float) -> int:
    import tempfile

    from edgetune.agent.host import AgentClient, Job
    from edgetune.ops.forms import torch_op_artifact
    from edgetune.kernels.workloads import parse_workload

    w = parse_workload(op)
    art = Path(tempfile.mkdtemp(prefix="bench-zygote-")) / "op.json"
    art.write_text(torch_op_artifact(w) or "")
    clients = {m: AgentClient(s) for m, s in modes.items()}
    xs = w.random_inputs(1)
    print(f"| {op} | mode | jobs | wall ms (median) |")
    print("|---|---|---|---|")
    for compile_mode in ("", "default"):
        walls: dict[str, list[float]] = {m: [] for m in modes}
        isolation: dict[str, set] = {m: set() for m in modes}
        for i in range(jobs + 1):
            for m in (modes if i % 2 == 0 else reversed(list(modes))):
                job = Job(backend="torch", artifact=art, params={"device": "cpu", "compile": compile_mode,
                                                                 "num_threads": 1},
                          input_names=[s.name for s in w.inputs], input_sets=[xs],
                          output_specs=[s.as_json() for s in w.outputs], budget_ms=budget_ms, warmup_ms=5.0)
                t0 = time.perf_counter()
                res = clients[m].run_job(job)
                wall = (time.perf_counter() - t0) * 1e3
                if res.status != "ok":
                    print(f"{op} {m}: job failed: {res.reason}", file=sys.stderr)
                    return 1
                if i == 0:
                    time.sleep(3.0)  # provisioning, a cold compile; the zygote starts after this job
                    continue
                walls[m].append(wall)
                isolation[m].add(res.limits_enforced.get("isolation"))
        label = "torch.compile" if compile_mode else "eager"
        for m in modes:
            print(f"| {label} | {m} ({', '.join(sorted(map(str, isolation[m])))}) | {len(walls[m])} | "
                  f"{np.median(walls[m]):.0f} |")
        print(f"| {label} | fresh / zygote | | {np.median(walls['fresh']) / np.median(walls['zygote']):.2f}× |")
    for c in clients.values():
        c.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
