"""compute-sanitizer around judged CUDA kernels (edgetune/sanitizer.py) without a GPU: its reports
(the formats of compute-sanitizer's memcheck and racecheck) read into the judge's named failures,
an incomplete report never taken for a pass, and the judge's sanitizer step end to end on this
machine: the real native agent in CUDA mode (the host-memory driver stand-in of
test_native_judge_cuda.py) run through the local transport under a stand-in ``compute-sanitizer`` on
PATH that runs the agent's command as given and writes a prepared report to the ``--log-file`` the
judge chose. What this cannot show: the real tool finding anything in a real kernel (the GPU script)."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess

import pytest

from edgetune import sanitizer as san
from tests.conftest import require

MEMCHECK_WRITE = """========= COMPUTE-SANITIZER
========= Invalid __global__ write of size 4 bytes
=========     at gemm_naive(const float *, const float *, float *, int, int, int)+0x2b0 in gemm_oob.cu:13
=========     by thread (11,15,0) in block (0,0,0)
=========     Address 0x7f3a5c000e5c is out of bounds
=========
========= ERROR SUMMARY: 1 error
"""
MEMCHECK_READ = MEMCHECK_WRITE.replace("write of size", "read of size").replace("1 error", "3 errors")
MEMCHECK_CLEAN = "========= COMPUTE-SANITIZER\n========= ERROR SUMMARY: 0 errors\n"
RACECHECK = """========= COMPUTE-SANITIZER
========= Error: Race reported between Write access at sumKernel(int *, int *)+0x90 in block_error.cu:21
=========     and Read access at sumKernel(int *, int *)+0xb0 in block_error.cu:22 [4 hazards]
=========
========= RACECHECK SUMMARY: 1 hazard displayed (1 error, 0 warnings)
"""
RACECHECK_CLEAN = "========= COMPUTE-SANITIZER\n========= RACECHECK SUMMARY: 0 hazards displayed (0 errors, 0 warnings)\n"


def test_reports_are_named_failures():
    f = san.parse(MEMCHECK_WRITE, "memcheck")
    assert (f.ok, f.code, f.errors) == (False, "out-of-bounds-write", 1)
    assert "Invalid __global__ write of size 4 bytes" in f.detail and "gemm_oob.cu:13" in f.detail
    f = san.parse(MEMCHECK_READ, "memcheck")
    assert (f.ok, f.code, f.errors) == (False, "out-of-bounds-access", 3) and "3 errors in all" in f.detail
    assert san.parse(MEMCHECK_CLEAN, "memcheck") == san.Finding(True, None, "compute-sanitizer memcheck: no errors", 0)
    f = san.parse(RACECHECK, "racecheck")
    assert (f.ok, f.code) == (False, "data-race") and "Race reported" in f.detail
    assert san.parse(RACECHECK_CLEAN, "racecheck").ok is True
    api = "========= Program hit cudaErrorInvalidConfiguration (error 9) due to \"invalid configuration\"\n" \
          "========= ERROR SUMMARY: 1 error\n"
    assert san.parse(api, "memcheck").code == "kernel-error"


def test_an_incomplete_report_is_no_verdict():
    for text in ("", "========= COMPUTE-SANITIZER\n========= Invalid __global__ write of size 4 bytes\n"):
        f = san.parse(text, "memcheck")
        assert f.ok is None and f.code is None and "did not finish its report" in f.detail
    assert san.parse(MEMCHECK_CLEAN, "racecheck").ok is None  # another tool's summary is not this one's
    with pytest.raises(ValueError):
        san.wrap("/x/compute-sanitizer", "leakcheck; rm -rf /", "/tmp/l")


FAKE_SANITIZER = """#!/bin/sh
# stand-in: runs the command after the options it was given; the report is the test's
[ "$1" = --tool ] && [ "$3" = --target-processes ] && [ "$5" = --print-limit ] && [ "$7" = --log-file ] || exit 64
tool=$2; log=$8; shift 8
"$@"; rc=$?
cat "$FAKE_REPORTS/$tool.log" > "$log"
echo "$*" >> "$FAKE_REPORTS/commands"
exit $rc
"""


@pytest.mark.parametrize("reports,failure,check_ok", [
    ({"memcheck": MEMCHECK_CLEAN, "racecheck": RACECHECK_CLEAN}, None, [True, True]),
    ({"memcheck": MEMCHECK_WRITE, "racecheck": RACECHECK_CLEAN}, "out-of-bounds-write", [False]),
    ({"memcheck": MEMCHECK_CLEAN, "racecheck": RACECHECK}, "data-race", [True, False]),
    ({"memcheck": "", "racecheck": RACECHECK_CLEAN}, None, [None, True]),
])
def test_the_judge_runs_each_cuda_kernel_under_each_tool(tmp_path, monkeypatch, reports, failure, check_ok):
    from edgetune.agent.host import Job
    from edgetune.build.kernel_build import BuiltKernel
    from edgetune.candidate import Candidate
    from edgetune.db import Store
    from edgetune.devices.inventory import DeviceSpec
    from edgetune.judge import JudgeConfig, Judged, KernelFile
    from edgetune.judge.run import _sanitize
    from edgetune.kernels.device_measure import DeviceMeasure
    from edgetune.kernels.workloads import parse_workload
    from tests.unit.test_native_judge_cuda import KERNELS, STANDIN

    require(shutil.which("gcc") is not None, "no host C compiler")
    bin_dir, rep = tmp_path / "bin", tmp_path / "reports"
    bin_dir.mkdir()
    rep.mkdir()
    (bin_dir / "compute-sanitizer").write_text(FAKE_SANITIZER)
    (bin_dir / "compute-sanitizer").chmod(0o755)
    for tool, text in reports.items():
        (rep / f"{tool}.log").write_text(text)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_REPORTS", str(rep))
    driver, src = tmp_path / "libcuda_standin.so", tmp_path / "gemm.c"
    subprocess.run(["gcc", "-O2", "-shared", "-fPIC", "-pthread", str(STANDIN), "-o", str(driver)], check=True)
    src.write_text(KERNELS["honest"])
    so = tmp_path / "gemm.so"
    subprocess.run(["gcc", "-O2", "-shared", "-fPIC", str(src), "-o", str(so)], check=True)
    w = parse_workload("gemm:M=37,N=29,K=19")
    k = KernelFile("gemm.cu", src, "cuda", hashlib.sha256(src.read_bytes()).hexdigest())
    b = BuiltKernel(so, hashlib.sha256(so.read_bytes()).hexdigest(), k.sha256, "cuda", "edgetune", "x86_64",
                    None, None, (), ())
    res = Judged(k.name, str(src), "cuda", k.sha256, "local")
    measure = DeviceMeasure(DeviceSpec("local", "local", {"workdir": str(tmp_path / "dev")}), 1, 5.0, 60.0)
    store = Store(str(tmp_path / "j.db"))
    try:
        info = measure.probe().info

        def job(kk, inputs, view):
            return Job(backend="judge", artifact=so, params={"abi": "edgetune", "device": "cuda",
                                                             "cuda_driver": str(driver)},
                       input_names=[s.name for s in view.inputs], input_sets=[inputs],
                       output_specs=[s.as_json() for s in view.outputs], budget_ms=5.0, timeout_s=60.0)

        store.start_run("jtest", "judge:" + w.spec(), "x", "local", "fp", info.fingerprint, {}, {"kind": "judge"})
        doc = _sanitize(JudgeConfig(), DeviceSpec("local", "local"), measure, store,
                        {"run_id": "jtest", "fingerprint_key": "fp"}, {}, [k], {k.name: b}, {k.name: res}, job,
                        lambda kk: Candidate.make("judge", {"kernel": kk.name}).as_dict(), w, lambda ev: None)
        assert doc["path"] == str(bin_dir / "compute-sanitizer") and doc["tools"] == ["memcheck", "racecheck"]
        assert res.failure == failure, res.errors
        assert [c["ok"] for c in res.checks] == check_ok, res.checks
        commands = (rep / "commands").read_text().splitlines()
        assert len(commands) == len(check_ok) and all("run-stdio" in c for c in commands)
        assert not list((tmp_path / "dev").rglob("sanitizer-*.log"))  # the reports were read and removed
        recs = store.records(run_id="jtest")
        assert [r.status for r in recs] == [{True: "checked", False: "failed", None: "unchecked"}[o] for o in check_ok]
    finally:
        store.close()
        measure.close()


def test_no_sanitizer_on_the_device_is_said(tmp_path, monkeypatch):
    from edgetune.devices.local import LocalTransport

    monkeypatch.setenv("PATH", str(tmp_path))  # nothing on PATH: only the toolkit's own place is looked at
    toolkit = "/usr/local/cuda/bin/compute-sanitizer"
    assert san.find(LocalTransport()) == (toolkit if os.access(toolkit, os.X_OK) else None)
