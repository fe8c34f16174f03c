"""``edgetune judge`` on every transport of the farm: local, ssh (a real sshd), the adb phone (real
adb server + adbd emulator, no Python there) and the qemu aarch64 board (cross-compiled kernels,
sandbox in detect mode: qemu-user refuses guest seccomp). Our own honest kernels must be judged
correct; every dishonest or buggy one must be rejected under one of the names its header allows,
and none may ever be judged correct-and-faster."""

from __future__ import annotations

import json
import re
import shutil
import sys
from pathlib import Path

import pytest

from edgetune.devices.inventory import Inventory
from edgetune.judge import JudgeConfig, judge
from tests.conftest import require

KERNELS = Path(__file__).resolve().parents[1] / "judge_kernels"
OP = "gemm:M=24,N=20,K=16"  # odd variant gemm:M=23,N=19,K=15
HEADER = re.compile(r"edgetune-judge:\s*op=(\S+)\s+expect=(\S+)")

pytestmark = pytest.mark.usefixtures("private_edgetune_home")

HONEST = ["gemm_naive.c", "gemm_blocked.c", "gemm_blocked.cpp"]
CHEATS = ["gemm_wrong.c", "gemm_odd_sizes.c", "gemm_fp16.c", "gemm_nondeterministic.c", "gemm_mutate_input.c",
          "gemm_oob_read.c", "gemm_oob_write.c", "gemm_stale.c", "gemm_memo.c", "gemm_late_thread.c",
          "gemm_clock.c", "gemm_crash.c", "gemm_exec.c", "gemm_system.c", "gemm_network.c", "gemm_file.c",
          "gemm_kill.c", "gemm_skip_work.c"]


def expectations(names) -> dict[str, set[str]]:
    out = {}
    for n in names:
        m = HEADER.search((KERNELS / n).read_text().splitlines()[0])
        assert m, f"{n}: first line must be the edgetune-judge header"
        out[n] = set(m.group(2).split("|"))
    return out


def _inventory(request, tmp_path_factory, transport: str) -> Inventory:
    inv = Inventory(tmp_path_factory.mktemp("inv") / "devices.toml")
    wd = str(tmp_path_factory.mktemp("wd"))
    if transport == "local":
        inv.add("dev", "local", workdir=wd)
    elif transport == "ssh":
        f = request.getfixturevalue("ssh_farm")
        inv.add("dev", f"ssh://{f['user']}@{f['host']}:{f['port']}", key=f["key"], known_hosts=f["known_hosts"],
                python=sys.executable, workdir=wd)
    elif transport == "adb":
        farm = request.getfixturevalue("adb_farm")
        inv.add("dev", f"adb://{farm.phone.serial}@{farm.adb_host}:{farm.adb_port}",
                workdir="/data/local/tmp/edgetune-judge")
    elif transport == "qemu":
        require(shutil.which("aarch64-linux-gnu-gcc") is not None,
                "aarch64-linux-gnu-gcc (apt-get install gcc-aarch64-linux-gnu)")
        b = request.getfixturevalue("qemu_board")
        inv.add("dev", f"ssh://{b['user']}@{b['host']}:{b['port']}", key=b["key"], known_hosts=b["known_hosts"],
                workdir=f"{b['home']}/edgetune-judge")
    return inv


def check_verdicts(doc: dict, expect: dict[str, set[str]]) -> None:
    wrong = {}
    for r in doc["results"]:
        want = expect[r["kernel"]]
        got = "correct" if r["correct"] else r["failure"]
        if got not in want:
            wrong[r["kernel"]] = (got, r["errors"][:2], sorted(want))
    assert not wrong, f"judged under the wrong name: {wrong}"
    for r in doc["results"]:
        if expect[r["kernel"]] != {"correct"}:
            # a dishonest kernel (even one whose cheat the fresh inputs defeat) is never correct-and-faster
            assert not (r["correct"] and r["fast"].get("1")), r["kernel"]
        if expect[r["kernel"]] == {"correct"}:
            assert r["correct"] and r["failure"] is None, (r["kernel"], r["errors"])
            assert len(r["round_samples_ns"]) == doc["rounds"]
            assert r["build"]["command"] and r["artifact_sha256"] and r["abi"] == "edgetune"


@pytest.mark.parametrize("transport", ["local", "ssh", "adb", "qemu"])
def test_judge_on_every_transport(request, tmp_path_factory, tmp_path, transport):
    inv = _inventory(request, tmp_path_factory, transport)
    # ssh and the phone run the same x86-64 binaries as local: every honest kernel and one cheat of
    # each kind of check there (output checks, guard pages, sandbox, interposition, timed checks);
    # local and the board (another architecture, another sandbox) get the whole suite
    names = HONEST + (CHEATS if transport in ("local", "qemu") else
                      ["gemm_wrong.c", "gemm_oob_read.c", "gemm_exec.c", "gemm_network.c", "gemm_file.c",
                       "gemm_clock.c", "gemm_stale.c", "gemm_mutate_input.c"])
    expect = expectations(names)
    kdir = tmp_path / "kernels"
    kdir.mkdir()
    for n in names:
        shutil.copy(KERNELS / n, kdir / n)
    emulated = transport == "qemu"
    cfg = JudgeConfig(op=OP, kernels=[str(kdir)], devices=["dev"], rounds=3, budget_ms=20.0 if not emulated else 60.0,
                      timeout_s=60.0, db=str(tmp_path / "j.db"), report_dir=str(tmp_path / "report"), inventory=inv,
                      command="pytest")
    doc = judge(cfg)
    (dev,) = doc["devices"]
    print(transport, json.dumps(dev["leaderboard"]), dev["sandbox"])
    for r in doc["results"]:
        print(" ", r["kernel"], "correct" if r["correct"] else r["failure"], (r["errors"] or [""])[0][:120])
    if emulated:
        # qemu-user emulates the harness's side of every return more slowly than the kernel's own
        # thread finishes a tiny GEMM, so the late work is complete before any check reads it; an
        # emulated device gives no speed verdict, so the cheat gains nothing there (on hardware: late-write)
        expect["gemm_late_thread.c"] = expect["gemm_late_thread.c"] | {"correct"}
    check_verdicts(doc, expect)
    assert dev["sandbox"] == ("detect" if emulated else "seccomp")
    assert bool(dev["emulated"]) == emulated
    board = dev["leaderboard"]
    assert board["kernels"] == len(names)
    assert board["correct"] == sum(1 for r in doc["results"] if r["correct"])
    if emulated:
        assert board["fast_1"] is None and all(r["speed"] is None or r["speed"]["speedup"] is None
                                               for r in doc["results"])
    else:
        assert dev["baseline"]["form"], dev["baseline"]  # onnxruntime on the native agent at least
    # the evidence: every sample in the report, the kernels and binaries judged, a re-run script
    rep = Path(doc["report_dir"])
    stored = json.loads((rep / "judge.json").read_text())
    assert stored["results"] == json.loads(json.dumps(doc["results"]))
    assert (rep / "rerun.sh").read_text().count("edgetune judge --op") == 1
    assert {p.name for p in (rep / "kernels").iterdir()} == set(names)
    for r in doc["results"]:
        if r["correct"]:
            assert (rep / "built" / f"{r['artifact_sha256']}.so").is_file()


def test_judge_names_hang_and_memory_hog_and_keeps_other_verdicts(tmp_path_factory, tmp_path, request):
    """A kernel that hangs or eats memory is stopped and named; the honest kernel judged in the same
    session is still correct (nothing one kernel does changes another's verdict)."""
    inv = _inventory(request, tmp_path_factory, "local")
    names = ["gemm_hang.c", "gemm_memhog.c", "gemm_naive.c", "gemm_kill.c", "gemm_file.c"]
    expect = expectations(names)
    cfg = JudgeConfig(op=OP, kernels=[str(KERNELS / n) for n in names], devices=["dev"], rounds=3,
                      budget_ms=20.0, timeout_s=8.0, memory_mb=512, db=str(tmp_path / "j.db"), inventory=inv,
                      baseline=False)
    doc = judge(cfg)
    check_verdicts(doc, expect)
    assert not list(Path("/tmp").glob("edgetune-judge-pwned-*")), "a kernel wrote a file outside its sandbox"
