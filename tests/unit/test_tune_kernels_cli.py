"""edgetune tune-kernels on the local device, as a user meets it: a real subprocess, the native agent
running every kernel MetaSchedule builds, every kernel verified, records reused on the second run,
results in the SQLite store, one-line errors."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import require_module

require_module("tvm")

from edgetune.agent.host import JobResult  # noqa: E402
from edgetune.kernels.device_measure import job_to_kernel_run, kernel_spec  # noqa: E402
from edgetune.verify import array_sha256  # noqa: E402
from edgetune.devices.inventory import DeviceSpec  # noqa: E402
from edgetune.ops.base import TensorSpec  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
GEMM = "gemm:M=16,N=16,K=16"


def _registered() -> bool:
    """Whether edgetune.cli.main has the command yet (the lead registers it); else a small app."""
    text = (REPO / "edgetune" / "cli" / "main.py").read_text()
    return "tune-kernels" in text


def cli(args, home, tmp_path, timeout=240):
    env = {**os.environ, "EDGETUNE_HOME": str(home), "COLUMNS": "200",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    if _registered():
        argv = [sys.executable, "-m", "edgetune.cli.main"]
    else:
        app = tmp_path / "kernels_app.py"
        app.write_text(
            "import typer\nfrom edgetune.cli import kernels\n"
            "app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)\n"
            "app.command('tune-kernels')(kernels.tune_kernels_cmd)\n"
            "@app.callback()\ndef _root():\n    pass\n"
            "app()\n")
        argv = [sys.executable, str(app)]
    return subprocess.run(argv + ["tune-kernels", *args], capture_output=True, text=True, timeout=timeout, env=env,
                          cwd=str(tmp_path))


def one_line_error(p, code):
    assert p.returncode == code, (p.returncode, p.stdout, p.stderr)
    assert "Traceback" not in p.stderr + p.stdout
    lines = [line for line in p.stderr.strip().splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), p.stderr
    return lines[0]


def test_tune_kernels_local_then_reuse(tmp_path):
    home, db = tmp_path / "home", tmp_path / "r.db"
    args = ["--op", GEMM, "--trials", "4", "--rounds", "2", "--budget-ms", "15", "--db", str(db), "--format", "json"]
    p = cli(args, home, tmp_path)
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert out["device"] == "local" and out["emulated"] is None and out["timings"] == "device"
    (w,) = out["workloads"]
    assert w["spec"] == GEMM and w["verified"] is True, w
    assert w["trials_measured"] == 4 and w["reused_records"] == 0
    assert w["gflops"] > 0 and w["median_ns"] > 0
    assert w["gflops"] == pytest.approx(2 * 16 ** 3 / w["median_ns"])
    if out["fp32_peak_gflops"]:
        assert w["peak_pct"] == pytest.approx(100 * w["gflops"] / out["fp32_peak_gflops"])
    # the peak is this machine's own only where cpufreq gives its maximum clock; else a bound
    assert out["fp32_peak_is_bound"] == (not out["fingerprint"].get("max_freq_khz"))
    # the tuning database lives under EDGETUNE_HOME, keyed by the device fingerprint
    tuning = Path(out["tuning_dir"])
    assert tuning == home / "kernels" and any(p.name.startswith(out["fingerprint_key"]) for p in tuning.iterdir())

    # the run and its records are in edgetune's store: kernel (and baseline) per round, all samples kept
    con = sqlite3.connect(db)
    kind = json.loads(con.execute("SELECT config FROM runs WHERE id=?", (out["run_id"],)).fetchone()[0])["kind"]
    assert kind == "kernels"
    rows = con.execute("SELECT candidate, status, round, length(samples) FROM records WHERE run_id=?",
                       (out["run_id"],)).fetchall()
    con.close()
    kernel_rows = [r for r in rows if json.loads(r[0])["backend"] == "tvm-kernel"]
    assert sorted(r[2] for r in kernel_rows) == [1, 2]
    assert all(r[1] == "verified" and r[3] > 0 for r in kernel_rows)
    params = json.loads(kernel_rows[0][0])["params"]
    assert params["workload"] == GEMM and json.loads(params["target"])["kind"] == "llvm"
    base = w["baseline"]
    forms = {f["form"]: f for f in base["forms"]}
    assert {"ort-constant", "ort-runtime", "numpy", "tflite"} <= set(forms)  # every form listed, run or not
    verified = [f for f in forms.values() if f["status"] == "verified"]
    for f in verified:  # each verified form ran once per round, interleaved with the kernel, its samples kept
        recs = [r for r in rows if json.loads(r[0]) == f["candidate"]]
        assert sorted(r[2] for r in recs) == [1, 2] and all(r[1] == "verified" and r[3] > 0 for r in recs)
    if base["speedup"] is not None:  # the verdict's baseline is the fastest verified form
        assert base["form"] == min(verified, key=lambda f: f["median_ns"])["form"]
        assert base["ci95"][0] <= base["speedup"] <= base["ci95"][1]
        assert base["verdict"] == "insufficient rounds"  # 2 rounds: no verdict
    if forms["ort-runtime"]["status"] == "verified":  # local onnxruntime: both onnxruntime forms ran
        assert forms["ort-constant"]["status"] == "verified"

    # second run, same device: every trial comes from the database, nothing is re-measured
    p2 = cli(args, home, tmp_path)
    assert p2.returncode == 0, p2.stderr
    w2 = json.loads(p2.stdout)["workloads"][0]
    assert w2["reused_records"] == 4 and w2["trials_measured"] == 0 and w2["verified"] is True

    # the table form (stdout) names the measured figures; progress never goes to stdout
    p3 = cli(["--op", GEMM, "--trials", "4", "--rounds", "1", "--no-baseline", "--budget-ms", "10", "--db", str(db)],
             home, tmp_path)
    assert p3.returncode == 0, p3.stderr
    assert "GFLOP/s" in p3.stdout and GEMM in p3.stdout and "yes" in p3.stdout


@pytest.mark.parametrize("smi, needle", [
    (None, "--gpu: local reports no NVIDIA GPU (nvidia-smi)"),
    ("NVIDIA T4, 7.5, 580.1, 15360, 1590, 5001, 00000000:01:00.0", "no kernel target for sm_75 (targets: cuda-sm80, "
                                                                   "cuda-sm90)"),
    ("NVIDIA H200, 9.0, 580.1, 143771, 1980, 3201, 00000000:19:00.0", "cannot run cuda kernels"),
])
def test_gpu_tuning_says_in_one_line_what_it_cannot_serve(tmp_path, monkeypatch, smi, needle):
    """--gpu on this machine: the SM comes from the device's agent (a fake nvidia-smi here); a device
    without a GPU, an SM without a target and a device whose TVM cannot reach CUDA are one line each,
    before any work. (This machine's TVM has no CUDA runtime and it has no GPU: the tuning itself
    needs a GPU device.)"""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    if smi:
        (bin_dir / "nvidia-smi").write_text(f"#!/bin/sh\necho '{smi}'\n")
        (bin_dir / "nvidia-smi").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    p = cli(["--op", GEMM, "--gpu", "--trials", "2"], tmp_path / "home", tmp_path)
    assert needle in one_line_error(p, 2)


def test_tune_kernels_float16_gemm_end_to_end(tmp_path):
    """A mixed-precision GEMM (float16 operands, float32 accumulation) tuned on this machine: the
    agent runs the float16 kernels, every trial and the final rounds are verified against the float64
    reference, and the onnxruntime and numpy forms race it (operands widened, float32 loops)."""
    spec = "gemm:M=16,N=24,K=40,dtype=float16"
    p = cli(["--op", spec, "--trials", "4", "--rounds", "3", "--budget-ms", "10", "--db", str(tmp_path / "r.db"),
             "--format", "json"], tmp_path / "home", tmp_path)
    assert p.returncode == 0, p.stderr
    (w,) = json.loads(p.stdout)["workloads"]
    assert w["spec"] == spec and w["verified"] is True and w["trials_measured"] == 4, w
    forms = {f["form"]: f for f in w["baseline"]["forms"]}
    assert forms["numpy"]["status"] == "verified" and forms["ort-runtime"]["status"] == "verified", forms
    assert "float16 operands" in forms["tflite"]["reason"]
    # the float16 MatMul itself (float16 output, at float16's tolerance) races too: on a GPU that is
    # cuBLAS's tensor-core GEMM, the baseline a float16 kernel must beat
    half = forms["ort-fp16-runtime"]
    assert half["status"] == "verified" and half["candidate"]["params"]["output"] == "float16", half
    assert "ort-cuda-fp16-runtime" not in forms  # a CPU device: no GPU forms


@pytest.mark.parametrize("args, needle", [
    (["--op", "gemm:M=8,N=x,K=8"], "must be an integer"),
    (["--op", "conv9d:N=1"], "unknown kernel op"),
    (["--op", GEMM, "--device", "no-such-device"], "unknown device"),
    ([], "give either a MODEL or"),
])
def test_bad_input_is_one_line_exit_2(tmp_path, args, needle):
    p = cli([*args, "--trials", "2", "--db", str(tmp_path / "r.db")], tmp_path / "home", tmp_path, timeout=120)
    assert needle in one_line_error(p, 2)
    assert not (tmp_path / "home" / "kernels").exists()  # nothing tuned, nothing half-written


def test_job_results_map_to_kernel_runs_and_are_judged_by_the_one_verifier():
    from edgetune.agent.fresh import fresh_inputs
    from edgetune.agent.host import TimedCheck
    from edgetune.kernels.measurement import verify_run
    from edgetune.kernels.workloads import parse_workload

    w = parse_workload("gemm:M=4,N=3,K=5")
    x = w.random_inputs(0)
    y = [w.reference(x)[0].astype(np.float32)]
    h = [array_sha256(a) for a in x]
    t = fresh_inputs([x], 77, 9)

    def result(**kw):
        base = dict(samples_ns=[5, 6, 7], outputs=[y], repeat_outputs=y, input_sha256_before=h,
                    input_sha256_after_sets=[h], first_timed_iter=8, fresh_seed=77,
                    timed_checks=[TimedCheck(9, [w.reference(t)[0].astype(np.float32)], [array_sha256(a) for a in t])])
        base.update(kw)
        return JobResult("ok", **base)

    ok = job_to_kernel_run(result(), x, list(w.outputs))
    assert ok.status == "ok" and ok.samples_ns == [5, 6, 7] and ok.job is not None
    assert verify_run(ok, w, x, w.reference(x)).ok
    changed = job_to_kernel_run(result(input_sha256_after_sets=[["0" * 64, h[1]]]), x, list(w.outputs))
    assert verify_run(changed, w, x, w.reference(x)).code == "input-mutated"
    garbled = job_to_kernel_run(result(input_sha256_before=["1" * 64, h[1]]), x, list(w.outputs))
    assert "arrived corrupted" in verify_run(garbled, w, x, w.reference(x)).reason
    missing = job_to_kernel_run(result(outputs=[[None]]), x, list(w.outputs))
    assert verify_run(missing, w, x, w.reference(x)).code == "missing-output"
    for status in ("crashed", "timeout", "error"):
        r = job_to_kernel_run(JobResult(status, reason=f"it {status}"), x, list(w.outputs))
        assert r.status == status and r.reason == f"it {status}"
        assert not verify_run(r, w, x, w.reference(x)).ok


def test_kernel_spec_forces_native_agent_in_its_own_workdir():
    board = DeviceSpec("b", "ssh://u@h:22", {"python": "/usr/bin/python3", "workdir": "/w/edgetune"})
    k = kernel_spec(board)
    assert k.options["native"] is True and k.workdir == "/w/edgetune-kernels" and k.options["python"] == "/usr/bin/python3"
    assert board.options.get("native") is None  # the device's own spec is untouched
    assert kernel_spec(DeviceSpec("p", "adb://S", {})).workdir == "/data/local/tmp/edgetune-kernels"


def test_tune_kernels_of_a_model(tmp_path):
    from tests.fixtures.tiny import build_tiny

    model = build_tiny(tmp_path / "tiny.onnx")
    home, db = tmp_path / "home", tmp_path / "r.db"
    p = cli([str(model), "--dim", "batch=4", "--max-tasks", "1", "--trials", "2", "--rounds", "1", "--budget-ms", "10",
             "--db", str(db), "--format", "json"], home, tmp_path)
    assert p.returncode == 0, p.stderr
    (w,) = json.loads(p.stdout)["workloads"]
    assert w["name"].startswith("fused_matmul") and w["verified"] is True and w["trials_measured"] == 2
    assert w["reference"].startswith("numpy float64 interpretation")  # independent of TVM, and says so
    assert w["flops"] >= 2 * 4 * 16 * 8
    bad = cli([str(model), "--dim", "nope=3", "--trials", "2", "--db", str(db)], home, tmp_path, timeout=120)
    assert "not a dynamic dimension" in one_line_error(bad, 2)


def test_device_target_from_what_the_device_reports():
    from edgetune.agent.host import AgentInfo
    from edgetune.kernels.device_measure import _foreign_cpuinfo, device_target

    fp = {"cpu_model": "implementer 0x41 part 0xd0b", "cores": 8, "max_freq_khz": [1800000, 2400000], "os": "Debian"}
    board = AgentInfo("native", "1", "aarch64", None, {}, fp)
    cpuinfo = "processor\t: 0\nFeatures\t: fp asimd evtstrm aes asimddp asimdhp i8mm\nCPU part\t: 0xd0b\n"
    target, cc = device_target(board, cpuinfo)
    assert target["mtriple"] == "aarch64-linux-gnu" and cc == "aarch64-linux-gnu-gcc"
    assert target["num-cores"] == 8 and {"+neon", "+dotprod", "+i8mm", "+fullfp16"} <= set(target["mattr"])
    phone = AgentInfo("native", "1", "aarch64", None, {}, {**fp, "os": "Android 14 (x)"})
    target, cc = device_target(phone, cpuinfo)
    assert target["mtriple"] == "aarch64-linux-android" and "android" in cc
    # an aarch64 agent that reads an x86 cpuinfo runs under qemu-user: its timings are emulated
    assert _foreign_cpuinfo("aarch64", "processor\t: 0\nvendor_id\t: GenuineIntel\nflags\t: fpu sse\n")
    assert _foreign_cpuinfo("aarch64", cpuinfo) is None and _foreign_cpuinfo("x86_64", "GenuineIntel") is None
    remote_x86 = AgentInfo("native", "1", "x86_64", None, {}, {"cpu_model": "Other CPU", "cores": 3})
    target, cc = device_target(remote_x86, "processor\t: 0\nmodel name\t: Other CPU\nflags\t: fpu sse4_2 avx avx2 fma\n")
    assert cc is None and target["num-cores"] == 3 and "mcpu" not in target and "+avx2" in target["mattr"]
