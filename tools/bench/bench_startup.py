"""What a process of edgetune pays before it does any work: the imports every CLI run, agent job and
MetaSchedule builder worker makes, each timed in fresh processes (CPU and wall, medians).

    .venv/bin/python tools/bench/bench_startup.py [--runs 5]

A suite of ~900 tests starts thousands of such processes, and a user's every `edgetune` command is
one: a dependency whose import costs half a second (ml_dtypes 0.7.0's extension, imported by onnx and
tvm) shows here first. Figures: docs/results/suite-time.md.
"""
from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

CASES = {
    "python (no site)": ["-S", "-c", "pass"],
    "numpy": ["-c", "import numpy"],
    "ml_dtypes": ["-c", "import ml_dtypes"],
    "onnx": ["-c", "import onnx"],
    "onnxruntime": ["-c", "import onnxruntime"],
    "openvino": ["-c", "import openvino"],
    "tvm (torch hidden, as edgetune imports it)": [
        "-c", "import edgetune.tvm_without_torch as t; t.install(); import tvm"],
    "edgetune --help": ["-m", "edgetune.cli.main", "--help"],
}


def _child_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def time_once(argv: list[str]) -> tuple[float, float] | None:
    """(wall s, CPU s) of one fresh process, or None when it failed (a runtime not installed)."""
    cpu0, t0 = _child_cpu(), time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, cwd=ROOT)
    wall, cpu = time.perf_counter() - t0, _child_cpu() - cpu0
    return (wall, cpu) if proc.returncode == 0 else None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    from edgetune.agent.bundle import bundle

    with tempfile.TemporaryDirectory() as tmp:
        agent = Path(tmp) / "edgetune_agent.py"
        agent.write_bytes(bundle())
        cases = {**CASES, "agent info (imports every runtime)": ["-S", str(agent), "info"]}
        import ml_dtypes

        print(f"python {sys.version.split()[0]}, ml_dtypes {ml_dtypes.__version__}, {os.cpu_count()} CPUs, "
              f"load average {os.getloadavg()[0]:.2f}; medians of {args.runs} fresh processes, interleaved")
        got: dict[str, list[tuple[float, float]]] = {k: [] for k in cases}
        for _ in range(args.runs):  # interleaved: a change in the machine's load hits every case alike
            for name, argv in cases.items():
                r = time_once([sys.executable, *argv])
                if r is not None:
                    got[name].append(r)
    print("| process | wall ms | CPU ms |\n|---|---|---|")
    for name, rs in got.items():
        if not rs:
            print(f"| {name} | (failed: not installed?) | |")
            continue
        print(f"| {name} | {statistics.median(w for w, _ in rs) * 1e3:.0f} | "
              f"{statistics.median(c for _, c in rs) * 1e3:.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
