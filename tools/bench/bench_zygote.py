#!/usr/bin/env python3
"""What a candidate costs beyond its own timed runs, with the Python agent's zygote and without
(every job in a fresh agent process: devices.toml ``zygote = false``), on the local device.

The same onnxruntime job (a bundled model at batch 1, the default session, a 20 ms timing budget)
is run N times through the host's real path (AgentClient: transfer, agent process, supervisor,
verification runs, bundle, validation), alternating zygote and fresh so both see the same machine.
Per job: the host's wall time, the agent command's time, the candidate's own timed runs (the sum of
its timed samples) and its session load; the overhead is wall time minus own runs. Medians per mode
and their ratio.

    .venv/bin/python tools/bench/bench_zygote.py [--jobs 30] [--models mobilenet,transformer]
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
from edgetune.tune import DeviceTuner, TuneConfig  # noqa: E402
from edgetune.workload import build_workload, load_model, shape_points  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=30, help="jobs per mode and model")
    ap.add_argument("--models", default="mobilenet,transformer")
    ap.add_argument("--budget-ms", type=float, default=20.0)
    args = ap.parse_args()
    spec = Inventory().get("local")
    modes = {"zygote": spec, "fresh": dataclasses.replace(spec, options={**spec.options, "zygote": False})}
    tuners = {m: DeviceTuner(s, Store(":memory:"), TuneConfig(spaces=())) for m, s in modes.items()}
    print("| model | mode | jobs | wall ms | agent command ms | own timed runs ms | load ms | overhead beyond own runs ms |")
    print("|---|---|---|---|---|---|---|---|")
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
                rows[m].append((res.wall_ms, res.agent_ms, own, res.load_ms or 0.0, res.wall_ms - own))
                isolation[m].add(res.limits_enforced.get("isolation"))
        med = {m: np.median(np.array(r), axis=0) for m, r in rows.items()}
        for m in modes:
            w, a, own, load, over = med[m]
            print(f"| {name} | {m} ({', '.join(sorted(map(str, isolation[m])))}) | {len(rows[m])} | {w:.0f} | {a:.0f} | "
                  f"{own:.0f} | {load:.0f} | {over:.0f} |")
        print(f"| {name} | fresh / zygote overhead | | | | | | {med['fresh'][4] / med['zygote'][4]:.2f}× |")
    for t in tuners.values():
        if t.client is not None:
            t.client.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
