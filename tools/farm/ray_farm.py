#!/usr/bin/env python3
"""A Ray cluster of one node on 127.0.0.1, for the tests and for trying ``edgetune tune --ray``:

    .venv/bin/python tools/farm/ray_farm.py start /tmp/rayfarm     # prints the address
    .venv/bin/edgetune tune MODEL --ray ADDRESS ...
    .venv/bin/python tools/farm/ray_farm.py stop /tmp/rayfarm

Everything listens on loopback only (RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 makes Ray's helper
processes pick 127.0.0.1 too); usage statistics are off. The head runs in the foreground of its
own process group (``ray start --block``), so ``stop`` ends this cluster and no other."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

ENV = {"RAY_USAGE_STATS_ENABLED": "0", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ray() -> str:
    return str(Path(sys.executable).with_name("ray"))


def start(base: Path, cpus: int = 2, timeout_s: float = 120.0) -> dict:
    """Start the head under ``base`` (its session files, a short path: Ray's sockets need one);
    return {"address", "pid"} once it answers."""
    base.mkdir(parents=True, exist_ok=True)
    port = _free_port()
    log = open(base / "head.log", "wb")
    proc = subprocess.Popen([_ray(), "start", "--head", "--block", "--node-ip-address=127.0.0.1", f"--port={port}",
                             f"--num-cpus={cpus}", "--include-dashboard=false", "--disable-usage-stats",
                             f"--temp-dir={base / 'r'}"], stdout=log, stderr=subprocess.STDOUT,
                            env={**os.environ, **ENV}, start_new_session=True)
    info = {"address": f"127.0.0.1:{port}", "pid": proc.pid}
    (base / "farm.json").write_text(json.dumps(info))
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"ray start exited {proc.returncode}: {(base / 'head.log').read_text()[-2000:]}")
        st = subprocess.run([_ray(), "status", "--address", info["address"]], capture_output=True, text=True,
                            env={**os.environ, **ENV}, timeout=60)
        if st.returncode == 0 and "CPU" in st.stdout:
            return info
        time.sleep(1.0)
    stop(base)
    raise RuntimeError("the Ray head did not come up within %.0f s" % timeout_s)


def stop(base: Path) -> None:
    """End the cluster ``start`` began under ``base`` (its whole process group)."""
    try:
        info = json.loads((base / "farm.json").read_text())
    except (OSError, ValueError):
        return
    try:
        os.killpg(info["pid"], signal.SIGTERM)
        for _ in range(100):
            os.killpg(info["pid"], 0)
            time.sleep(0.1)
        os.killpg(info["pid"], signal.SIGKILL)
    except ProcessLookupError:
        pass
    # Ray's servers leave the group (their own sessions) and end when the head tells them: wait for that
    host, port = info["address"].rsplit(":", 1)
    for _ in range(300):
        try:
            socket.create_connection((host, int(port)), timeout=1).close()
        except OSError:
            break
        time.sleep(0.1)
    (base / "farm.json").unlink(missing_ok=True)


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in ("start", "stop"):
        sys.exit("usage: ray_farm.py start|stop DIR")
    if sys.argv[1] == "start":
        print(start(Path(sys.argv[2]))["address"])
    else:
        stop(Path(sys.argv[2]))
