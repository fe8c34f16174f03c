#!/usr/bin/env python3
"""Per-command round trip of ``true`` over AdbTransport (real adb server -> adbd emulator on
127.0.0.1) vs LocalTransport (a local subprocess). Prints median / p10 / p90 in milliseconds.

    .venv/bin/python tools/bench/bench_transport_adb.py [--n 300] [--adb /usr/bin/adb]

Brings up its own private farm (tools/farm/adb_farm.py) in a temp dir and stops it afterwards.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tools", "farm"))

from adb_farm import AdbFarm, bundled_adb  # noqa: E402

from edgetune.devices.adb import AdbTransport  # noqa: E402
from edgetune.devices.local import LocalTransport  # noqa: E402


def measure(transport, argv, n: int) -> list[float]:
    for _ in range(10):  # warm-up
        transport.run(argv, timeout=10)
    xs = []
    for _ in range(n):
        t0 = time.perf_counter()
        r = transport.run(argv, timeout=10)
        xs.append((time.perf_counter() - t0) * 1e3)
        assert r.ok, r
    return xs


def line(name: str, xs: list[float]) -> str:
    q = statistics.quantiles(xs, n=10)
    return f"{name:<34} median {statistics.median(xs):7.2f} ms   p10 {q[0]:7.2f}   p90 {q[-1]:7.2f}   (n={len(xs)})"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=300)
    ap.add_argument("--adb", default=shutil.which("adb") or bundled_adb())
    a = ap.parse_args()
    print(f"host: {platform.node()} {platform.machine()} cpus={os.cpu_count()} python={platform.python_version()}")
    print(f"adb: {a.adb}")
    with tempfile.TemporaryDirectory(prefix="bench-adb-") as d, AdbFarm(d, a.adb) as farm:
        phone = farm.add_phone()
        adb_t = AdbTransport(phone.serial, adb_port=farm.adb_port)
        print(line("local subprocess: true", measure(LocalTransport(), ["true"], a.n)))
        print(line("adb (shell v2 via server): true", measure(adb_t, ["true"], a.n)))
        src = os.path.join(d, "f.bin")
        with open(src, "wb") as f:
            f.write(os.urandom(8 * 1024 * 1024))
        t0 = time.perf_counter()
        adb_t.push(src, "/data/local/tmp/f.bin")
        t1 = time.perf_counter()
        adb_t.pull("/data/local/tmp/f.bin", src + ".back")
        t2 = time.perf_counter()
        print(f"adb push 8 MiB: {(t1 - t0) * 1e3:.1f} ms   pull 8 MiB: {(t2 - t1) * 1e3:.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
