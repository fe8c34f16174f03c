"""The agents' supervisor (device_agents/PROTOCOL.md "The supervisor"), both agents driven exactly as
the host drives them (``run-stdio JOBDIR``, the request on stdin, one bundle on stdout).

Candidates that attack the device rather than the measurement — a memory hog, a fork bomb, a helper
left running after a setsid + double fork, a spinner, output printed into the result stream, a
result larger than allowed, a crash — must each come back promptly as one well-formed bundle that
names the bound it broke, and leave no process of the job on the machine: every process the agent
started carries a marker in its environment, and /proc is searched for it afterwards.

Real processes, real /proc, real cgroups where this machine lets the agent make them ("cgroup") and
the path of devices that have none ("no-cgroup": EDGETUNE_AGENT_CGROUP=0), natively and (native
agent) under qemu-aarch64, where neither RLIMIT_DATA nor a subreaper exists. A fork bomb that
escaped would take the machine down with the test: where it can, the test runs the agent inside a
pids cgroup of its own, a safety net far above the bounds tested.
"""

from __future__ import annotations

import re

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import numpy as np
import pytest

from edgetune.agent.bundle import python_agent
from edgetune.build import native
from tests.conformance import suite
from tests.conftest import require

PYTHON_AGENT = python_agent()  # the one file a device runs, bundled from device_agents/python/edgetune_agent/
MAGIC = b"EDGETUNE-BUNDLE 1\n"
AARCH64 = "aarch64-linux-gnu"
QEMU = shutil.which("qemu-aarch64")
SAFETY_TASKS = 4096  # the test's own pids cgroup: far above every bound tested, far below the machine's
NATIVE_VARIANTS = ("CORRECT", "HOG", "FORKBOMB", "ORPHAN", "PRINT", "SPIN", "CRASH", "STUCK")
SPIN_ADAPTER = '''
def load(model_path, params):
    def run(inputs):
        while True:
            pass
    return run
'''
STUCK_ADAPTER = '''
import os
import time


def load(model_path, params):
    child = os.fork()
    if child == 0:  # a detached helper, as orphan.py leaves
        try:
            os.setsid()
            if os.fork() == 0:
                time.sleep(600)
        finally:
            os._exit(0)
    os.waitpid(child, 0)

    def run(inputs):
        while True:  # only a stop ends this job
            time.sleep(3600)
    return run
'''


# ---------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("supervisor")


@pytest.fixture(scope="module")
def mlp(work) -> Path:
    return suite.build_mlp(work / "mlp.onnx")


def _build_kernels(cc: str, out: Path) -> dict[str, Path]:
    out.mkdir(parents=True, exist_ok=True)
    built = {}
    for v in NATIVE_VARIANTS:
        so = out / f"gemm_{v.lower()}.so"
        subprocess.run([cc, "-O2", "-shared", "-fPIC", "-pthread", f"-DVARIANT_{v}", str(suite.KERNEL_SOURCE),
                        "-o", str(so), "-lm"], check=True, capture_output=True)
        built[v] = so
    return built


@pytest.fixture(scope="module")
def native_host(work):
    require(shutil.which(os.environ.get("CC") or "cc") is not None, "no host C compiler")
    agent = native.build_agent(None, static=False, out_dir=work / "agent")
    return [str(agent)], _build_kernels(shutil.which("gcc") or "cc", work / "k-host")


@pytest.fixture(scope="module")
def native_qemu(work):
    require(shutil.which(f"{AARCH64}-gcc") is not None, f"{AARCH64}-gcc not installed")
    require(QEMU is not None, "qemu-aarch64 (qemu-user) not installed")
    agent = native.build_agent(AARCH64, static=False, out_dir=work / "agent")
    return [QEMU, "-L", f"/usr/{AARCH64}", str(agent)], _build_kernels(f"{AARCH64}-gcc", work / "k-a64")


@pytest.fixture(scope="module")
def safety_net():
    """A pids cgroup the agent runs in (v1 hierarchy or a v2 tree with the controller), if this
    machine lets the test make one; else None. Removed at the end."""
    made = None
    for base in (Path("/sys/fs/cgroup/pids"), Path("/sys/fs/cgroup")):
        try:
            if not (base / "cgroup.procs").exists() or (base.name != "pids" and "pids" not in
                                                         (base / "cgroup.subtree_control").read_text().split()):
                continue
            d = base / f"edgetune-test-{os.getpid()}"
            d.mkdir()
            try:
                (d / "pids.max").write_text(str(SAFETY_TASKS))
            except OSError:
                d.rmdir()
                continue
            made = d
            break
        except OSError:
            continue
    yield made
    if made is not None:
        for _ in range(200):
            try:
                made.rmdir()
                break
            except OSError:
                time.sleep(0.01)


# ---------------------------------------------------------------- driving an agent


class Agent:
    """One agent as the host runs it: a command line, a backend, and a candidate per case."""

    def __init__(self, kind: str, argv: list[str], kernels: dict[str, Path] | None, mlp: Path, work: Path,
                 cgroup: bool, net: Path | None):
        self.kind, self.argv, self.kernels, self.mlp, self.work = kind, argv, kernels, mlp, work
        self.cgroup, self.net = cgroup, net

    def artifact(self, case: str) -> Path:
        if self.kernels is not None:
            return self.kernels[case.upper()]
        if case in ("spin", "stuck"):
            p = self.work / f"{case}.py"
            p.write_text(SPIN_ADAPTER if case == "spin" else STUCK_ADAPTER)
            return p
        return suite.ADAPTERS / f"{case}.py"

    def request(self, case: str, limits: dict, max_bundle: int | None = None) -> dict:
        c = suite.gemm_case() if self.kernels is not None else suite.mlp_case(self.mlp)
        ind = self.work / "inputs" / self.kind
        ind.mkdir(parents=True, exist_ok=True)
        sets = []
        for i, s in enumerate(c.input_sets):
            row = []
            for k, a in enumerate(s):
                np.save(ind / f"in_{i}_{k}.npy", a)
                row.append(str(ind / f"in_{i}_{k}.npy"))
            sets.append(row)
        art = self.artifact(case)
        req = {"protocol": 3, "backend": "tvm-kernel" if self.kernels is not None else "adapter",
               "artifact": str(art), "artifact_sha256": hashlib.sha256(art.read_bytes()).hexdigest(),
               "params": {"num_threads": 1} if self.kernels is not None else {},
               "input_names": c.input_names, "inputs": sets, "outputs": c.output_specs,
               "warmup_ms": 5.0, "budget_ms": 20.0, "min_iters": 20, "max_iters": 1000, "fresh_seed": 77,
               "check_iters": 4, "check_fastest": 2, "probe_pairs": 8, "limits": limits,
               "max_bundle_bytes": max_bundle}
        if self.kernels is None:
            req["model"] = {"path": str(self.mlp), "sha256": hashlib.sha256(self.mlp.read_bytes()).hexdigest()}
        return req

    def run(self, case: str, limits: dict, max_bundle: int | None = None, timeout: float = 120):
        """(result.json, every file of the bundle, seconds the command took, the job's marker)."""
        marker = f"EDGETUNE_TEST_MARKER={uuid.uuid4().hex}"
        env = {**os.environ, marker.split("=")[0]: marker.split("=")[1]}
        env["EDGETUNE_AGENT_CGROUP"] = "1" if self.cgroup else "0"
        (self.work / "jobs").mkdir(exist_ok=True)
        jobdir = self.work / "jobs" / uuid.uuid4().hex[:12]
        argv = self.argv + ["run-stdio", str(jobdir)]
        if self.net is not None:  # the agent starts inside the test's safety net
            argv = ["sh", "-c", 'echo $$ > "$0/cgroup.procs" && exec "$@"', str(self.net), *argv]
        t0 = time.monotonic()
        proc = subprocess.run(argv, input=json.dumps(self.request(case, limits, max_bundle)).encode(),
                              capture_output=True, timeout=timeout, env=env)
        elapsed = time.monotonic() - t0
        assert proc.returncode == 0, proc.stderr.decode(errors="replace")[-2000:]
        files = parse_bundle(proc.stdout)
        assert not jobdir.exists(), "the job dir is removed"
        return json.loads(files["result.json"]), files, elapsed, marker


def parse_bundle(out: bytes) -> dict[str, bytes]:
    """stdout must be one bundle and nothing else."""
    assert out.startswith(MAGIC), out[:200]
    pos, files = len(MAGIC), {}
    while True:
        nl = out.index(b"\n", pos)
        line = out[pos:nl].decode()
        if line == "END":
            assert nl + 1 == len(out), "nothing after END"
            return files
        name, size = line.rsplit(" ", 1)
        assert name not in files
        files[name] = out[nl + 1:nl + 1 + int(size)]
        assert len(files[name]) == int(size)
        pos = nl + 1 + int(size)


def processes_with(marker: str) -> list[str]:
    """Live processes whose environment carries the marker (zombies are dead and hold nothing)."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            stat = Path(f"/proc/{pid}/stat").read_bytes()
            if stat[stat.rfind(b")") + 2:][:1] == b"Z":
                continue
            if marker.encode() in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
                found.append(f"{pid}: {Path(f'/proc/{pid}/cmdline').read_bytes()[:120]!r}")
        except OSError:
            continue
    return found


def assert_nothing_left(marker: str) -> None:
    # a process killed without a subreaper (qemu-user) is reaped by init a moment later
    deadline = time.monotonic() + 3.0
    while (left := processes_with(marker)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not left, f"processes of the job still running: {left}"


AGENTS = [("python", True), ("python", False), ("native", True), ("native", False), ("native-qemu", False)]


def _agent(request, kind: str, cgroup: bool) -> Agent:
    mlp, work, net = (request.getfixturevalue(f) for f in ("mlp", "work", "safety_net"))
    if kind == "python":
        return Agent(kind, [sys.executable, str(PYTHON_AGENT)], None, mlp, work, cgroup, net)
    argv, kernels = request.getfixturevalue("native_host" if kind == "native" else "native_qemu")
    return Agent(kind, argv, kernels, mlp, work, cgroup, net)


@pytest.fixture(params=AGENTS, ids=[f"{k}-{'cgroup' if c else 'no-cgroup'}" for k, c in AGENTS])
def agent(request) -> Agent:
    return _agent(request, *request.param)


BOUNDS = {"memory_mb": 1024, "max_procs": 16, "timeout_s": 60}


# ---------------------------------------------------------------- the cases


def test_an_honest_job_says_how_it_was_bounded(agent):
    res, files, _, marker = agent.run("correct", BOUNDS, max_bundle=10 << 20)
    assert res["status"] == "ok", res["reason"]
    assert res["protocol"] == 3 and "limit" not in res and res["leftover_processes"] == 0
    enforced = res["limits_enforced"]
    assert set(enforced) == {"memory", "processes", "time", "output", "leftovers",
                             *(("isolation",) if agent.kind == "python" else ())}
    assert enforced["time"] == enforced["output"] == "supervisor"
    if not agent.cgroup:
        assert enforced["memory"] in ("rlimit+poll", "poll") and enforced["processes"] in ("rlimit+poll", "poll")
    if agent.kind == "native-qemu":  # qemu-user ignores RLIMIT_DATA and refuses PR_SET_CHILD_SUBREAPER
        assert enforced["memory"] == "poll" and enforced["leftovers"] == "process group+cmdline"
    else:
        assert enforced["leftovers"] == "subreaper"
    assert res["usage"]["peak_procs"] >= 1 and res["usage"]["wall_s"] > 0
    assert all(f"{n}" in files for row in res["outputs"] for n in row)
    assert_nothing_left(marker)


def test_memory_hog_is_stopped_at_its_bound(agent):
    res, _, elapsed, marker = agent.run("hog", {**BOUNDS, "memory_mb": 128})
    assert res["status"] == "error" and res["limit"] == "memory", res
    assert res["reason"].startswith("out of memory: ") and "128 MB" in res["reason"], res["reason"]
    assert elapsed < 20, elapsed
    assert_nothing_left(marker)


def test_fork_bomb_is_stopped_and_every_process_killed(agent):
    res, _, elapsed, marker = agent.run("forkbomb", BOUNDS)
    assert res["status"] == "error" and res["limit"] == "processes", res
    assert res["reason"].startswith("too many processes: ") and "(limit 16)" in res["reason"], res["reason"]
    assert elapsed < 20, elapsed
    assert_nothing_left(marker)


def test_fork_bomb_under_qemu_is_stopped_though_its_live_processes_stay_under_the_bound(request):
    """qemu-user makes every process two tasks (its RCU thread), and a child that cannot start that
    thread dies, a zombie its parent never reaps: in a pids cgroup of 2 x max_procs tasks a fork bomb
    soon lists no more than max_procs live processes in cgroup.procs, and stays so. The forks the
    cgroup keeps refusing name it (or the count, if a poll caught a moment above the bound), in
    moments, not at the deadline."""
    agent = _agent(request, "native-qemu", True)
    max_procs = 64 + 16 * os.sysconf("SC_NPROCESSORS_ONLN")  # the job's pids.max: max_procs + 64 + 16/cpu
    res, _, elapsed, marker = agent.run("forkbomb", {**BOUNDS, "max_procs": max_procs, "timeout_s": 60})
    assert res["status"] == "error" and res["limit"] == "processes", res
    assert res["reason"].startswith("too many processes: ") and f"(limit {max_procs}" in res["reason"], res["reason"]
    assert elapsed < 20, elapsed
    assert_nothing_left(marker)


def test_detached_helper_is_killed_and_the_job_returns_at_once(agent):
    """The candidate's grandchild (setsid, double fork) sleeps 600 s holding the stdout and stderr it
    inherited; the job itself is correct and must come back at once, the helper killed."""
    res, files, elapsed, marker = agent.run("orphan", BOUNDS)
    assert res["status"] == "ok", res["reason"]
    assert res["leftover_processes"] == 1
    assert elapsed < 30, elapsed
    assert_nothing_left(marker)


def test_spinning_candidate_ends_at_the_deadline(agent):
    res, _, elapsed, marker = agent.run("spin", {**BOUNDS, "timeout_s": 2})
    assert res["status"] == "error" and res["limit"] == "time", res
    assert res["reason"].startswith("hung: ") and "(limit 2 s)" in res["reason"], res["reason"]
    assert 1.9 <= elapsed < 8, elapsed
    assert_nothing_left(marker)


def test_result_larger_than_allowed_is_refused(agent):
    res, files, _, marker = agent.run("correct", BOUNDS, max_bundle=2000)
    assert set(files) == {"result.json"}
    assert res["status"] == "error" and res["limit"] == "output", res
    assert res["reason"].startswith("result too large: ") and "(limit 2000 bytes)" in res["reason"], res["reason"]
    assert_nothing_left(marker)


def test_what_a_candidate_prints_never_reaches_the_result_stream(agent):
    res, files, _, marker = agent.run("printer" if agent.kind == "python" else "print", BOUNDS)
    assert res["status"] == "ok", res["reason"]
    assert len(files) > 1 and all(n == "result.json" or n.endswith(".npy") for n in files)
    assert_nothing_left(marker)


def test_crashing_worker_is_a_well_formed_answer(agent):
    res, files, _, marker = agent.run("crash", BOUNDS)
    assert set(files) == {"result.json"}
    assert res["status"] == "crashed" and res["signal"] == "SIGSEGV", res
    if agent.kind == "python":  # faulthandler's dump in the worker's log names where it struck
        assert re.fullmatch(r"crashed: the worker was killed by SIGSEGV in \S+ \(\S+\.py:\d+\)", res["reason"]), res
    else:
        assert res["reason"] == "crashed: the worker was killed by SIGSEGV"
    assert_nothing_left(marker)


@pytest.mark.parametrize("limits", [{"memory_mb": -1}, {"max_procs": 2.5}, {"timeout_s": "10"}, []])
@pytest.mark.parametrize("kind", ["python", "native"])
def test_malformed_bounds_are_refused(request, kind, limits):
    res, files, _, _ = _agent(request, kind, True).run("correct", limits)
    assert set(files) == {"result.json"}
    assert res["status"] == "error" and res["reason"].startswith("bad request: "), res


@pytest.mark.parametrize("kind", ["python", "native"])
def test_agent_told_to_stop_kills_the_job_first(request, kind):
    """The host gave up (SIGTERM to the agent): the job dies with it, and no bundle is written. The job
    (a detached helper, then a run that never returns) can only end by the stop, so the stop always
    finds it running."""
    a = _agent(request, kind, False)
    marker = f"EDGETUNE_TEST_MARKER={uuid.uuid4().hex}"
    env = {**os.environ, "EDGETUNE_TEST_MARKER": marker.split("=")[1], "EDGETUNE_AGENT_CGROUP": "0"}
    (a.work / "jobs").mkdir(exist_ok=True)
    proc = subprocess.Popen(a.argv + ["run-stdio", str(a.work / "jobs" / uuid.uuid4().hex[:12])],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)
    proc.stdin.write(json.dumps(a.request("stuck", BOUNDS)).encode())
    proc.stdin.close()
    deadline = time.monotonic() + 20
    while len(processes_with(marker)) < 3 and time.monotonic() < deadline:  # supervisor, worker, helper
        time.sleep(0.05)
    proc.terminate()
    assert proc.wait(timeout=20) == 128 + 15
    assert proc.stdout.read() == b""
    assert_nothing_left(marker)


def test_python_worker_names_an_allocation_refused_under_its_rlimit(mlp, work):
    """Where RLIMIT_DATA, not the poll, stops a hog, the worker itself names the bound (MemoryError)."""
    import resource

    a = Agent("python", [sys.executable, str(PYTHON_AGENT)], None, mlp, work, False, None)
    job = work / "jobs" / uuid.uuid4().hex[:12]
    job.mkdir(parents=True)
    (job / "request.json").write_text(json.dumps(a.request("hog", {"memory_mb": 128})))
    cap = 768 << 20
    subprocess.run([sys.executable, str(PYTHON_AGENT), "run", str(job)], check=True, timeout=60,
                   preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_DATA, (cap, cap)))
    res = json.loads((job / "result.json").read_text())
    assert res["status"] == "error" and res["limit"] == "memory", res
    assert res["reason"].startswith("out of memory: MemoryError") and "(limit 128 MB;" in res["reason"], res["reason"]
