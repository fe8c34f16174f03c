#!/usr/bin/env python3
"""`edgetune judge` on the whole test farm: local, ssh (a real sshd), the adb phone (real adb server
+ adbd emulator, no Python there) and the qemu aarch64 board, with our own kernels: honest ones
(naive, blocked, blocked C++, a TVM-tuned GEMM) and every cheat of tests/judge_kernels. Prints a
Markdown table: each kernel's verdict per device, and on the local device its median and speedup
over the strongest baseline with the 95% interval.

Starts its own sshd, qemu board and adb server + phone (tools/farm) on 127.0.0.1 and stops them.

    .venv/bin/python tools/bench/bench_judge_farm.py [--op gemm:M=97,N=130,K=75] [--rounds 5] [--trials 32]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from edgetune.devices.inventory import Inventory  # noqa: E402
from edgetune.judge import JudgeConfig, fmt_ns, judge  # noqa: E402

KERNELS = ROOT / "tests" / "judge_kernels"
SKIP = {"gemm_hang.c", "gemm_memhog.c"}  # slow by design (the timeout, 4 GiB): tests/farm covers them


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "tools" / "farm" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def tvm_kernels(op: str, trials: int, work: Path) -> dict[str, Path]:
    """A GEMM tuned by MetaSchedule on this machine (x86-64), and the same op with TVM's default
    schedule for aarch64 (tuning on the emulated board would tune for qemu)."""
    import tvm

    from edgetune.build import native
    from edgetune.kernels.device_measure import LocalMeasure, device_kernel_target
    from edgetune.kernels.search import tune_workload
    from edgetune.kernels.workloads import parse_workload

    w = parse_workload(op)
    m = LocalMeasure(budget_ms=20.0)
    try:
        probe = m.probe()
        target = dict(device_kernel_target(probe.info, probe.cpuinfo).tvm_target)
        out = tune_workload(w, target, trials, m, work / "tuning", lambda *a: None, fingerprint="bench")
    finally:
        m.close()
    x86 = work / "tvm-x86" / "gemm_tvm_tuned.so"
    x86.parent.mkdir(parents=True)
    shutil.copy(out.artifact_path, x86)
    a64 = work / "tvm-a64" / "gemm_tvm_default.so"
    a64.parent.mkdir(parents=True)
    t = tvm.target.Target({"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mattr": ["+neon"]})
    lib = tvm.compile(tvm.IRModule({"main": w.prim_func()}), target=t)
    native.export_kernel_library(lib, a64, "aarch64-linux-gnu")
    return {"x86_64": x86, "aarch64": a64}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--op", default="gemm:M=97,N=130,K=75")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--budget-ms", type=float, default=50.0)
    ap.add_argument("--trials", type=int, default=32)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="edgetune-benchjudge-"))
    os.environ["EDGETUNE_HOME"] = str(tmp / "home")
    ssh_farm, adb_farm = _load("ssh_farm"), _load("adb_farm")
    names = sorted(p.name for p in KERNELS.iterdir() if p.name.startswith("gemm_") and p.name not in SKIP)
    tvm = tvm_kernels(args.op, args.trials, tmp)
    inv = Inventory(tmp / "devices.toml")
    inv.add("host", "local", workdir=str(tmp / "wd-local"))
    states, phone_farm = [], None
    try:
        s1 = tmp / "ssh"
        states.append(s1)
        f = ssh_farm.start(s1, board=False)
        inv.add("ssh", f"ssh://{f['user']}@{f['host']}:{f['port']}", key=f["key"], known_hosts=f["known_hosts"],
                python=sys.executable, workdir=str(tmp / "wd-ssh"))
        s2 = tmp / "board"
        states.append(s2)
        b = ssh_farm.start(s2, board=True)
        inv.add("board", f"ssh://{b['user']}@{b['host']}:{b['port']}", key=b["key"], known_hosts=b["known_hosts"],
                workdir=f"{b['home']}/edgetune-judge")
        phone_farm = adb_farm.AdbFarm(str(tmp / "adb"), shutil.which("adb"))
        phone_farm.start()
        phone_farm.add_phone(name="bench-phone")
        inv.add("phone", f"adb://{phone_farm.phone.serial}@{phone_farm.adb_host}:{phone_farm.adb_port}",
                workdir="/data/local/tmp/edgetune-judge")
        docs = {}
        for dev in ("host", "ssh", "phone", "board"):
            kernel = tvm["aarch64" if dev == "board" else "x86_64"]
            cfg = JudgeConfig(op=args.op, kernels=[str(KERNELS / n) for n in names] + [str(kernel)], devices=[dev],
                              rounds=args.rounds, budget_ms=args.budget_ms, inventory=inv, db=str(tmp / "j.db"))
            docs[dev] = judge(cfg)
            print(f"{dev}: done", file=sys.stderr)
    finally:
        if phone_farm is not None:
            phone_farm.stop()
        for s in states:
            ssh_farm.stop(s)
    local = docs["host"]
    d0 = local["devices"][0]
    print(f"\n`{args.op}`, {args.rounds} rounds, {args.budget_ms:g} ms per run. Strongest baseline on local: "
          f"{d0['baseline'].get('backend')} ({fmt_ns(d0['baseline'].get('median_ns'))}).\n")
    print("| kernel | local | ssh | adb phone | qemu board (emulated) | local median | local vs strongest baseline [95% CI] |")
    print("|---|---|---|---|---|---|---|")
    rows = {}
    for dev, doc in docs.items():
        for r in doc["results"]:
            key = "gemm_tvm (TVM: tuned on x86-64, default schedule on aarch64)" if r["kernel"].startswith("gemm_tvm") \
                else r["kernel"]
            rows.setdefault(key, {})[dev] = r
    order = sorted(rows, key=lambda k: (not rows[k]["host"]["correct"], k))
    for k in order:
        cells = []
        for dev in ("host", "ssh", "phone", "board"):
            r = rows[k][dev]
            cells.append("correct" if r["correct"] else f"`{r['failure']}`")
        r = rows[k]["host"]
        s = r.get("speed") or {}
        vs = (f"{s['speedup']:.2f}× [{s['ci95'][0]:.2f}, {s['ci95'][1]:.2f}] {s['verdict']}"
              if s.get("speedup") else "—")
        print(f"| {k} | " + " | ".join(cells) + f" | {fmt_ns(r.get('median_ns'))} | {vs} |")
    for dev, doc in docs.items():
        board = doc["devices"][0]["leaderboard"]
        fast = ", ".join(f"fast_{p:g} {board[f'fast_{p:g}']:.0%}" if board[f"fast_{p:g}"] is not None
                         else f"fast_{p:g} n/a" for p in doc["fast_p"])
        print(f"\n{dev}: {board['correct']}/{board['kernels']} correct, {fast}; sandbox {doc['devices'][0]['sandbox']}",
              end="")
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
