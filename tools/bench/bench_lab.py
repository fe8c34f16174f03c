#!/usr/bin/env python3
"""Load simulation of a lab's database: several host processes and many simulated devices against
one PostgreSQL server (tools/farm/pg_farm.py, on 127.0.0.1), through edgetune's own Store.

Every host process holds one Store (as ``edgetune tune`` does) and runs one worker thread per
device it is given; the device lists of the hosts overlap (each device is listed on two hosts, as in
a lab where two workstations reach the same phones), so hosts contend for device leases. A worker:
take a device's lease without waiting (a conflict when another host drives it: try another), start
a run, record ``--jobs`` jobs (each "measured" by sleeping ``--job-ms`` and stored with 64 int64
samples, as a real record), finish the run, give the device back. For each device count: jobs
recorded per second, lease conflicts, and the latency of add_record and acquire_device (p50/p99).

    .venv/bin/python tools/bench/bench_lab.py [--devices 10,100,1000] [--hosts 4] [--seconds 20]
"""

from __future__ import annotations

import argparse
import multiprocessing
import random
import shutil
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools" / "farm"))


def host(url: str, host_id: str, devices: list[str], seconds: float, jobs: int, job_ms: float, q) -> None:
    import os

    os.environ["EDGETUNE_HOST"] = host_id
    from edgetune.db import DeviceBusy, Record, Store

    st = Store(url)
    lock = threading.Lock()
    stats = {"jobs": 0, "runs": 0, "conflicts": 0, "add_ms": [], "acquire_ms": []}
    local: set[str] = set()
    end = time.monotonic() + seconds
    samples = np.arange(1, 65, dtype=np.int64) * 1000

    def worker(mine: list[str]) -> None:
        rng = random.Random(hash((host_id, tuple(mine))))
        while time.monotonic() < end:
            dev = rng.choice(mine)
            with lock:  # this host's other worker has it: not a lease question, just busy here
                if dev in local:
                    dev = None
                else:
                    local.add(dev)
            if dev is None:
                time.sleep(job_ms / 1000)
                continue
            t0 = time.perf_counter()
            try:
                st.acquire_device(dev, None, wait_s=0)
            except DeviceBusy:
                with lock:
                    stats["conflicts"] += 1
                    local.discard(dev)
                time.sleep(job_ms / 1000)
                continue
            acq = (time.perf_counter() - t0) * 1e3
            run_id = uuid.uuid4().hex[:16]
            st.start_run(run_id, "sim.onnx", "0" * 64, dev, "fk-" + dev, {"sim": True}, {}, {"sim": True})
            add = []
            for k in range(jobs):
                if time.monotonic() >= end:
                    break
                time.sleep(job_ms / 1000)  # the device measuring
                rec = Record(run_id=run_id, workload_key="w", shape={}, shape_key="s", fingerprint_key="fk-" + dev,
                             candidate={"key": f"c{k}"}, versions={}, round=0, status="verified", reason="",
                             verdict={}, samples_ns=samples, wall_ms=job_ms, agent_ms=job_ms)
                t1 = time.perf_counter()
                st.add_record(rec)
                add.append((time.perf_counter() - t1) * 1e3)
            st.finish_run(run_id, {})
            st.release_device(dev)
            with lock:
                local.discard(dev)
                stats["jobs"] += len(add)
                stats["runs"] += 1
                stats["add_ms"] += add
                stats["acquire_ms"].append(acq)

    # one worker per listed device, each choosing among its own two (a phone wanted by two workers)
    threads = [threading.Thread(target=worker, args=([d, devices[(i + 1) % len(devices)]],), daemon=True)
               for i, d in enumerate(devices)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    st.close()
    q.put(stats)


def measure(url: str, n_devices: int, n_hosts: int, seconds: float, jobs: int, job_ms: float) -> dict:
    names = [f"sim-{n_devices}-{i}" for i in range(n_devices)]
    # every device on two hosts: host h gets the devices i with i % hosts in {h, h+1}
    per_host = [[d for i, d in enumerate(names) if i % n_hosts in (h, (h + 1) % n_hosts)] for h in range(n_hosts)]
    ctx = multiprocessing.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=host, args=(url, f"host-{h}", per_host[h], seconds, jobs, job_ms, q))
             for h in range(n_hosts)]
    t0 = time.monotonic()
    for p in procs:
        p.start()
    results = [q.get(timeout=seconds + 600) for _ in procs]
    for p in procs:
        p.join(60)
    wall = time.monotonic() - t0
    add = np.array(sum((r["add_ms"] for r in results), []))
    acq = np.array(sum((r["acquire_ms"] for r in results), []))
    jobs_done = sum(r["jobs"] for r in results)
    return {"devices": n_devices, "hosts": n_hosts, "jobs": jobs_done, "jobs_per_s": jobs_done / seconds,
            "runs": sum(r["runs"] for r in results), "conflicts": sum(r["conflicts"] for r in results),
            "demand_jobs_per_s": n_devices * 1000 / job_ms,  # every device measuring all the time
            "add_p50_ms": float(np.percentile(add, 50)) if add.size else None,
            "add_p99_ms": float(np.percentile(add, 99)) if add.size else None,
            "acquire_p50_ms": float(np.percentile(acq, 50)) if acq.size else None,
            "acquire_p99_ms": float(np.percentile(acq, 99)) if acq.size else None, "wall_s": wall}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--devices", default="10,100,1000")
    ap.add_argument("--hosts", type=int, default=4)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--jobs", type=int, default=20, help="jobs per run")
    ap.add_argument("--job-ms", type=float, default=50.0, help="simulated measuring time per job")
    args = ap.parse_args()
    import pg_farm
    import psycopg

    base = Path(tempfile.mkdtemp(prefix="edgetune-pg-bench-"))
    try:
        info = pg_farm.start(base)
        print(f"PostgreSQL on 127.0.0.1:{info['port']}; {args.hosts} host processes, {args.jobs} jobs per run, "
              f"{args.job_ms:g} ms per job, {args.seconds:g} s per point")
        print("| devices | jobs/s recorded | demand jobs/s | runs | lease conflicts | add_record p50 / p99 ms | "
              "acquire p50 / p99 ms |")
        print("|---|---|---|---|---|---|---|")
        for n in (int(x) for x in args.devices.split(",")):
            name = f"lab{n}"
            with psycopg.connect(info["url"], autocommit=True) as c:
                c.execute(f"CREATE DATABASE {name}")
            url = info["url"].rsplit("/", 1)[0] + "/" + name
            r = measure(url, n, args.hosts, args.seconds, args.jobs, args.job_ms)
            print(f"| {n} | {r['jobs_per_s']:.0f} | {r['demand_jobs_per_s']:.0f} | {r['runs']} | {r['conflicts']} | "
                  f"{r['add_p50_ms']:.2f} / {r['add_p99_ms']:.2f} | {r['acquire_p50_ms']:.2f} / {r['acquire_p99_ms']:.2f} |",
                  flush=True)
    finally:
        pg_farm.stop(base)
        shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
