"""What the offline GPU replays (ort_gpu_replay.py, judge_replay.py) share: staging a job as the
agent's request with paths relative to its job dir, running a request on the GPU machine (stdlib
only there) and saving its answer as it came, and reading answers back through AgentClient's
validation here."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path


def stage(client, job, host_dir: Path, dev: Path, n: int) -> str:
    """Job ``n`` staged on ``dev`` (the agent's work dir, here); its request in dev/requests/NNNN.json
    with device paths relative to its job dir dev/jobs/NNNN (the directory may sit anywhere on the GPU
    machine). Returns the job dir."""
    request = client.stage_job(job, host_dir)
    text = json.dumps(request).replace(f'"{dev}/', '"../../')
    (dev / "requests").mkdir(exist_ok=True)
    (dev / "requests" / f"{n:04d}.json").write_text(text)
    return f"{dev}/jobs/{n:04d}"


def run_request(argv: list[str], src: Path, out: Path, n: int, jobdir: Path, timeout: float) -> tuple[int, float]:
    """On the GPU machine: request ``n`` through ``argv + [run-stdio, jobdir]``; the bundle and what
    the host needs to read it (return code, time, stderr's tail) saved in ``out``. (rc, seconds)."""
    request = (src / "device" / "requests" / f"{n:04d}.json").read_bytes()
    s = time.monotonic()
    try:
        c = subprocess.run([*argv, "run-stdio", str(jobdir)], input=request, capture_output=True, timeout=timeout,
                           cwd=str(src / "device"))
        rc, stdout, stderr = c.returncode, c.stdout, c.stderr
    except subprocess.TimeoutExpired as exc:
        rc, stdout, stderr = -9, exc.stdout or b"", f"timed out after {timeout:.0f} s".encode()
    took = time.monotonic() - s
    (out / f"{n:04d}.bundle").write_bytes(stdout)
    (out / f"{n:04d}.meta").write_text(json.dumps({"returncode": rc, "agent_ms": took * 1e3,
                                                   "stderr": stderr.decode("utf-8", "replace")[-2000:]}))
    return rc, took


def load_result(client, out: Path, n: int, job):
    """Job ``n``'s answer as a JobResult, validated as a live device's (None: it was not run)."""
    from edgetune.devices.base import Completed

    meta_p = out / f"{n:04d}.meta"
    if not meta_p.exists():
        return None
    meta = json.loads(meta_p.read_text())
    return client._collect(Completed(meta["returncode"], (out / f"{n:04d}.bundle").read_bytes(),
                                     meta["stderr"].encode()), job, meta["agent_ms"])


def machine(info_path: Path) -> tuple[dict, dict]:
    """(info, fingerprint) of the GPU machine's agent ``info``, validated; reported, never trusted."""
    from edgetune.agent import validate

    try:
        info = validate.info_dict(info_path.read_bytes(), "the GPU machine")
        return info, validate.clean_map(info.get("fingerprint"), "fingerprint")
    except Exception as exc:  # noqa: BLE001 - what went wrong is the report
        return {}, {"error": str(exc)}
