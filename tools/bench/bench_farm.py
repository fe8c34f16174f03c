#!/usr/bin/env python3
"""Issue-3 benchmark on loopback: per-candidate round-trip overhead on local, ssh and adb (job wall
time minus the agent command's own time = what the transport adds), and farm throughput with 1, 2 and
4 devices (jobs per second; goal >= 0.9*N x one device where the host is not the bottleneck).

Starts its own sshd(s) and adb server + phone emulators (tools/farm) on 127.0.0.1 and stops them.

    .venv/bin/python tools/bench/bench_farm.py [--jobs 12]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from edgetune.agent.host import AgentClient, Job  # noqa: E402
from edgetune.devices.inventory import Inventory  # noqa: E402
from edgetune.modelfile import load_model  # noqa: E402
from edgetune.workload import build_workload  # noqa: E402
from tests.fixtures.tiny import build_tiny  # noqa: E402


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "tools" / "farm" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def jobs_on(client: AgentClient, wl, n: int, budget_ms: float) -> list[tuple[float, float, float]]:
    refs = wl.references()
    specs = [{"name": o, "dtype": str(r.dtype), "shape": list(r.shape)} for o, r in zip(wl.output_names, refs[0])]
    out = []
    for _ in range(n):
        job = Job("ort", wl.model.path, {"intra_op_num_threads": 1}, wl.input_names, wl.input_sets, specs,
                  budget_ms=budget_ms, warmup_ms=2.0)
        r = client.run_job(job)
        assert r.ok, r.reason
        out.append((r.wall_ms, r.agent_ms, sum(r.samples_ns) / 1e6))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--jobs", type=int, default=12)
    ap.add_argument("--budget-ms", type=float, default=200.0, help="timed budget per job in the throughput test")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="edgetune-benchfarm-"))
    os.environ["EDGETUNE_HOME"] = str(tmp / "home")
    model = load_model(build_tiny(tmp / "tiny.onnx"))
    wl = build_workload(model, {"batch": 1})
    ssh_farm, adb_farm_mod = _load("ssh_farm"), _load("adb_farm")
    inv = Inventory(tmp / "devices.toml")
    states = []
    adb = None
    try:
        for i in range(4):
            st = tmp / f"sshd{i}"
            info = ssh_farm.start(st)
            states.append(st)
            inv.add(f"ssh{i}", f"ssh://{info['user']}@{info['host']}:{info['port']}", key=info["key"],
                    known_hosts=info["known_hosts"], python=sys.executable, workdir=str(tmp / f"wd-ssh{i}"))
        import shutil

        adb = adb_farm_mod.AdbFarm(str(tmp / "adb"), shutil.which("adb"))
        adb.start()
        phone = adb.add_phone(name="benchphone")
        inv.add("phone", f"adb://{phone.serial}@{adb.adb_host}:{adb.adb_port}")

        # the same native agent on every transport, so the difference is what the transport adds
        inv.add("local-native", "local", native=True, workdir=str(tmp / "wd-local-native"))
        info0 = ssh_farm.start(tmp / "sshd-native")
        states.append(tmp / "sshd-native")
        inv.add("ssh-native", f"ssh://{info0['user']}@{info0['host']}:{info0['port']}", key=info0["key"],
                known_hosts=info0["known_hosts"], native=True, workdir=str(tmp / "wd-ssh-native"))
        print(f"# bench_farm: tiny model (16x8 MatMul+Add+Relu), {args.jobs} jobs per transport, interleaved")
        clients = {name: AgentClient(inv.get(name)) for name in ("local-native", "ssh-native", "phone")}
        for c in clients.values():
            c.provision()
            jobs_on(c, wl, 1, 5.0)  # first job pushes artifact + inputs
        res = {k: [] for k in clients}
        for _ in range(args.jobs * 2):  # interleave transports so machine noise hits all
            for name, c in clients.items():
                res[name] += jobs_on(c, wl, 1, 5.0)
        print("| transport | agent | job wall ms (median) | p10–p90 | candidate's own timed runs ms | overhead beyond local ms |")
        print("|---|---|---|---|---|---|")
        local_med = float(np.median(np.array(res["local-native"])[:, 0]))
        for name, rows in res.items():
            a = np.array(rows)
            print(f"| {clients[name].spec.kind} ({name}) | {clients[name].provision().agent} | {np.median(a[:, 0]):.1f} | "
                  f"{np.percentile(a[:, 0], 10):.1f}–{np.percentile(a[:, 0], 90):.1f} | {np.median(a[:, 2]):.1f} | "
                  f"{np.median(a[:, 0]) - local_med:+.1f} |")
        print("One job = one transport round trip (request on stdin, result and outputs back in one bundle); "
              "the artifact and inputs are pushed once per device.")
        for c in clients.values():
            c.close()

        print(f"\nFarm throughput: each device runs {args.jobs} jobs of {args.budget_ms:g} ms timed budget, "
              f"devices in parallel (ssh, Python agent, intra_op_num_threads=1)")
        import threading

        base = None
        print("| devices | wall s | jobs/s | vs 1 device | ideal N× | efficiency |")
        print("|---|---|---|---|---|---|")
        for n in (1, 2, 4):
            cs = [AgentClient(inv.get(f"ssh{i}")) for i in range(n)]
            for c in cs:
                c.provision()
                jobs_on(c, wl, 1, 5.0)
            t0 = time.perf_counter()
            th = [threading.Thread(target=jobs_on, args=(c, wl, args.jobs, args.budget_ms)) for c in cs]
            for t in th:
                t.start()
            for t in th:
                t.join()
            wall = time.perf_counter() - t0
            rate = n * args.jobs / wall
            base = base or rate
            print(f"| {n} | {wall:.1f} | {rate:.2f} | {rate / base:.2f}× | {n}× | {rate / base / n:.0%} |")
            for c in cs:
                c.close()
        print(f"host cores: {os.cpu_count()} — every 'device' here shares them, so past {os.cpu_count()} busy "
              f"agents the host CPU is the bottleneck, not edgetune")
    finally:
        for st in states:
            ssh_farm.stop(st)
        if adb is not None:
            adb.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
