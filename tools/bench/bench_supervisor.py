"""Supervisor overhead (issue 8): the same ~1 ms candidate timed by `run JOBDIR` (no supervisor, the job in the
agent's own process) and `run-stdio JOBDIR` (worker under the supervisor's 10 ms poll), interleaved
A/B rounds in one run; per agent: median of per-job medians, p90 of per-job p90s; plus the
supervisor's own CPU time (utime+stime of the supervisor process, sampled from /proc until it exits)."""
import hashlib, json, os, shutil, subprocess, sys, tempfile, time
from pathlib import Path
import numpy as np
REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
from edgetune.agent.bundle import python_agent  # noqa: E402
from edgetune.build.native import build_agent  # noqa: E402
from tests.conformance import suite  # noqa: E402

ROUNDS = int(os.environ.get("ROUNDS", "12"))
BUDGET_MS = float(os.environ.get("BUDGET_MS", "400"))
root = Path(tempfile.mkdtemp(prefix="bench-supervisor-"))
(root / "jobs").mkdir()
N = 112  # gemm N x N x N, naive C: ~1 ms here

rng = np.random.default_rng(1)
sets = []
for i in range(2):
    row = []
    for k in range(2):
        p = root / f"in_{i}_{k}.npy"; np.save(p, rng.standard_normal((N, N)).astype(np.float32)); row.append(str(p))
    sets.append(row)
so = root / "gemm.so"
subprocess.run(["gcc", "-O2", "-shared", "-fPIC", "-pthread", "-DVARIANT_CORRECT", str(suite.KERNEL_SOURCE), "-o", str(so), "-lm"], check=True)
adapter = root / "busy.py"
adapter.write_text('''
import numpy as np
def load(model_path, params):
    def run(inputs):
        a, b = inputs
        c = np.empty((a.shape[0], b.shape[1]), np.float32)
        for _ in range(40):   # fixed work, ~1 ms
            np.matmul(a, b, out=c)
        return [c]
    return run
''')
native_agent = str(build_agent(None))
AGENTS = {
    "native": ([native_agent], {"backend": "tvm-kernel", "artifact": str(so), "params": {"num_threads": 1}}),
    "python": ([sys.executable, str(python_agent())],
               {"backend": "adapter", "artifact": str(adapter), "params": {}}),
}

def request(spec):
    art = Path(spec["artifact"])
    return {"protocol": 3, **spec, "artifact_sha256": hashlib.sha256(art.read_bytes()).hexdigest(),
            "input_names": ["A", "B"], "inputs": sets, "outputs": [{"name": "C", "dtype": "float32", "shape": [N, N]}],
            "warmup_ms": 50, "budget_ms": BUDGET_MS, "min_iters": 20, "max_iters": 100000, "fresh_seed": 3,
            "check_iters": 2, "check_fastest": 1, "probe_pairs": 0,
            "limits": {"memory_mb": 4096, "max_procs": 64, "timeout_s": 60}, "max_bundle_bytes": 64 << 20}

def cpu_ticks(pid):
    try:
        f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
        return int(f[11]) + int(f[12])  # utime + stime of the process itself (children not included)
    except (OSError, IndexError):
        return None

def job(argv, req, supervised):
    jd = root / "jobs" / os.urandom(6).hex()
    if supervised:
        p = subprocess.Popen(argv + ["run-stdio", str(jd)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        p.stdin.write(json.dumps(req).encode()); p.stdin.close()
        import threading
        chunks = []
        reader = threading.Thread(target=lambda: chunks.append(p.stdout.read()))
        reader.start()
        last = 0
        while p.poll() is None:
            t = cpu_ticks(p.pid)
            last = t if t is not None else last
            time.sleep(0.02)
        reader.join()
        out = chunks[0]
        i = out.index(b"result.json ") + 12; nl = out.index(b"\n", i)
        res = json.loads(out[nl + 1: nl + 1 + int(out[i:nl])])
        return res, last, res["usage"]["wall_s"]
    jd.mkdir()
    (jd / "request.json").write_text(json.dumps(req))
    t0 = time.monotonic()
    subprocess.run(argv + ["run", str(jd)], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    res = json.loads((jd / "result.json").read_text())
    shutil.rmtree(jd)
    return res, None, time.monotonic() - t0

hz = os.sysconf("SC_CLK_TCK")
for name, (argv, spec) in (AGENTS.items() if ROUNDS else ()):
    req = request(spec)
    meds = {False: [], True: []}; p90 = {False: [], True: []}; cpu = []; wall = []
    for r in range(ROUNDS):
        for sup in ((False, True) if r % 2 == 0 else (True, False)):
            res, ticks, w = job(argv, req, sup)
            assert res["status"] == "ok", res
            s = np.array(res["samples_ns"]) / 1e6
            meds[sup].append(np.median(s)); p90[sup].append(np.percentile(s, 90))
            if sup:
                cpu.append(ticks / hz); wall.append(w)
    a, b = np.median(meds[False]), np.median(meds[True])
    ratios = np.array(meds[True]) / np.array(meds[False])
    print(f"{name}: median of per-job medians  run (no supervisor) {a:.4f} ms   run-stdio (supervised) {b:.4f} ms   "
          f"ratio {b / a:.4f} (per-round ratios median {np.median(ratios):.4f}, range {ratios.min():.3f}-{ratios.max():.3f})")
    print(f"{name}: median p90                 run {np.median(p90[False]):.4f} ms   run-stdio {np.median(p90[True]):.4f} ms")
    print(f"{name}: supervisor CPU {np.sum(cpu):.2f} s over {np.sum(wall):.1f} s of supervised jobs "
          f"({100 * np.sum(cpu) / np.sum(wall):.2f}% of one core; /proc ticks of {1000 / hz:.0f} ms)")
    print(f"{name}: {ROUNDS} rounds x 2 jobs, {len(res['samples_ns'])} samples/job, budget {BUDGET_MS} ms")
shutil.rmtree(root, ignore_errors=True)
