#!/usr/bin/env python3
"""Per-command and per-push cost of SshTransport vs LocalTransport, on loopback.

    PYTHONPATH=. python tools/bench/bench_transport_ssh.py [--n 300] [--state DIR] [--board]

Starts a farm sshd (tools/farm/ssh_farm.py) in a temporary state dir unless --state names one
that is already running, and stops what it started. Prints medians with p10/p90; the goal is a
`true` round trip within 5 ms of a local subprocess on loopback. --board measures the emulated
aarch64 board instead (its figures are emulated: never compare them with a real device's).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from edgetune.devices.local import LocalTransport  # noqa: E402
from edgetune.devices.ssh import SshTransport  # noqa: E402


def _farm():
    spec = importlib.util.spec_from_file_location("ssh_farm", ROOT / "tools" / "farm" / "ssh_farm.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _time(fn, n: int, warmup: int = 10) -> list[float]:
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(n):
        t0 = time.perf_counter_ns()
        fn()
        samples.append((time.perf_counter_ns() - t0) / 1e6)
    return samples


def _interleaved(fa, fb, n: int, warmup: int = 10) -> tuple[list[float], list[float]]:
    """A B A B ... so that machine drift hits both (docs/design.md section 4, rule 5)."""
    for _ in range(warmup):
        fa()
        fb()
    a, b = [], []
    for _ in range(n):
        for fn, out in ((fa, a), (fb, b)):
            t0 = time.perf_counter_ns()
            fn()
            out.append((time.perf_counter_ns() - t0) / 1e6)
    return a, b


def _summary(samples: list[float]) -> dict:
    q = statistics.quantiles(samples, n=10)
    return {"median_ms": round(statistics.median(samples), 3), "p10_ms": round(q[0], 3),
            "p90_ms": round(q[-1], 3), "n": len(samples)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=300, help="samples per figure")
    p.add_argument("--state", help="state dir of a running farm sshd (default: start one)")
    p.add_argument("--board", action="store_true", help="the emulated aarch64 board")
    p.add_argument("--format", choices=["text", "json"], default="text")
    args = p.parse_args()

    farm = _farm()
    started = None
    if args.state and (Path(args.state) / "info.json").exists():
        info = json.loads((Path(args.state) / "info.json").read_text())
    else:
        started = Path(args.state or tempfile.mkdtemp(prefix="edgetune-bench-ssh-"))
        info = farm.start(started, board=args.board)
    try:
        ssh = SshTransport(info["host"], info["port"], info["user"], info["key"], info["known_hosts"])
        local = LocalTransport()
        t0 = time.perf_counter()
        ssh.connect()
        connect_ms = (time.perf_counter() - t0) * 1e3
        local_true, ssh_true = _interleaved(
            lambda: local.run(["true"], timeout=10), lambda: ssh.run(["true"], timeout=10), args.n)
        results = {
            "device": ssh.address + (" (emulated: qemu-aarch64)" if info.get("emulated") else ""),
            "connect_ms": round(connect_ms, 2),
            "local_true": _summary(local_true),
            "ssh_true": _summary(ssh_true),
        }
        with tempfile.TemporaryDirectory() as tmp:
            small = Path(tmp, "small.bin")
            small.write_bytes(os.urandom(4096))
            big = Path(tmp, "big.bin")
            big.write_bytes(os.urandom(5 * 1024 * 1024))
            rdir = f"{info['home']}/bench"
            ssh.run(["mkdir", "-p", rdir], timeout=10)
            local_push, ssh_push = _interleaved(
                lambda: local.push(str(small), f"{tmp}/copy.bin"),
                lambda: ssh.push(str(small), f"{rdir}/small.bin"), max(20, args.n // 3))
            results["local_push_4k"] = _summary(local_push)
            results["ssh_push_4k"] = _summary(ssh_push)
            big_push = _summary(_time(lambda: ssh.push(str(big), f"{rdir}/big.bin"), 10, warmup=1))
            big_pull = _summary(_time(lambda: ssh.pull(f"{rdir}/big.bin", f"{tmp}/back.bin"), 10, warmup=1))
            results["ssh_push_5MiB"] = dict(big_push, MiB_per_s=round(5 / (big_push["median_ms"] / 1e3), 1))
            results["ssh_pull_5MiB"] = dict(big_pull, MiB_per_s=round(5 / (big_pull["median_ms"] / 1e3), 1))
        ssh.close()
    finally:
        if started is not None:
            farm.stop(started)
    overhead = results["ssh_true"]["median_ms"] - results["local_true"]["median_ms"]
    results["ssh_overhead_ms"] = round(overhead, 3)
    results["goal_overhead_ms"] = 5.0
    results["goal_met"] = overhead <= 5.0
    if args.format == "json":
        print(json.dumps(results, indent=2))
        return 0
    print(f"device: {results['device']}   connect: {results['connect_ms']} ms")
    for key in ("local_true", "ssh_true", "local_push_4k", "ssh_push_4k", "ssh_push_5MiB", "ssh_pull_5MiB"):
        r = results[key]
        extra = f"  ({r['MiB_per_s']} MiB/s)" if "MiB_per_s" in r else ""
        print(f"{key:15s} median {r['median_ms']:8.3f} ms  p10 {r['p10_ms']:8.3f}  p90 {r['p90_ms']:8.3f}"
              f"  n={r['n']}{extra}")
    print(f"ssh overhead per command over local: {overhead:.3f} ms "
          f"(goal <= 5 ms: {'met' if results['goal_met'] else 'NOT met'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
