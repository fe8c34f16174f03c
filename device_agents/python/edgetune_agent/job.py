"""``run JOBDIR``: one job, the run loop of PROTOCOL.md (checked runs, warm-up, timed iterations on
fresh inputs, the checked ones chosen after they ran, the TEST04 probe, the late-write check), and
the job's bounds as a request states them."""

import errno
import functools
import json
import os
import time

from .backends import BACKENDS
from .common import AGENT, AGENT_VERSION, CODE_PARAMS, PAGE, PROTOCOL, _read_bytes, sha256_array, sha256_file
from .fresh import M64, fill_fresh, fill_set
from .info import backend_versions, device_state

_WORKER_PID = None  # the process running the job: a candidate's forked child never writes its files


def _path(jobdir, p):
    return p if os.path.isabs(p) else os.path.normpath(os.path.join(jobdir, p))


def _only_the_worker():
    """A process a candidate forked that unwinds or returns into the agent's code stops here,
    before it can write a file of the job (the job's own process goes on)."""
    if _WORKER_PID is not None and os.getpid() != _WORKER_PID:
        os._exit(0)


def _write_json_atomic(path, obj):
    _only_the_worker()
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


class Reservoir:
    """Keeps `size` timed iterations chosen uniformly at random, each decided AFTER the iteration
    returned, from the OS's randomness: a candidate cannot know which of its results are checked."""

    def __init__(self, size):
        import random

        self.size = size
        self.seen = 0
        self.rng = random.SystemRandom()
        self.kept = []  # (iteration, outputs, input sha256s)

    def offer(self, t, snapshot):
        self.seen += 1
        if len(self.kept) < self.size:
            self.kept.append((t,) + snapshot())
            return
        j = self.rng.randrange(self.seen)
        if j < self.size:
            self.kept[j] = (t,) + snapshot()


WARMUP_MIN_ITERS = 5  # warm-up iterations at least (2 for a model slower than the warm-up)
WARMUP_KEEP = 4096  # the timed run is planned from the median of the first this many
# The warm-up and the timed run are planned on the timer a candidate's own Python code could patch
# (time.perf_counter_ns: an adapter can make every call seem to take a nanosecond): each also ends
# past this much real time, read on CLOCK_MONOTONIC through a reference of the agent's own taken at
# import, so a lying timer cannot make a job run 2 x max_iters calls and time out as "hung" on a busy
# device instead of being caught by the host (impossible timings). An honest job spends
# about its budget; the bound is 20 times that, at least 3 s (the timed run keeps min_iters calls).
WALL_FACTOR = 20
WALL_FLOOR_NS = 3_000_000_000
_WALL_NS = functools.partial(time.clock_gettime_ns, time.CLOCK_MONOTONIC)
# The late-write wait (step 5): 3 x the median timed call, and at least a floor. A job that brings
# code of its own (an adapter, a custom-op library, a TVM build) may leave a thread of its own
# running past the call, which the scheduler can hold back for a while; so may an accelerator's
# queue: such a job waits 50 ms at least. A runtime configuration on the CPU runs only the
# runtime's code, whose thread pool is done when the call returns: 2 ms at least is the check's
# scheduling margin, and the wait no longer costs every candidate 50 ms (PROTOCOL.md, step 8).
LATE_WAIT_FLOOR_S = 0.05
LATE_WAIT_FLOOR_CPU_RUNTIME_S = 0.002
CODE_BACKENDS = ("tvm",)


def late_wait_floor(req):
    """The late-write wait's floor for this job (seconds)."""
    params = req.get("params") if isinstance(req.get("params"), dict) else {}
    code = req.get("backend") in CODE_BACKENDS or any(k in params for k in CODE_PARAMS)
    cpu = params.get("device", "cpu") in ("cpu", "CPU") \
        and params.get("execution_provider", "CPUExecutionProvider") == "CPUExecutionProvider"
    return LATE_WAIT_FLOOR_CPU_RUNTIME_S if cpu and not code else LATE_WAIT_FLOOR_S


class Fastest:
    """Keeps the `size` fastest timed iterations: work a candidate skipped makes an iteration fast,
    so the iterations a speedup would rest on are the ones checked, whatever the candidate does."""

    def __init__(self, size):
        self.size = size
        self.kept = []  # (ns, iteration, outputs, input sha256s)

    def offer(self, ns, t, snapshot):
        if len(self.kept) < self.size:
            self.kept.append((ns, t) + snapshot())
            return
        slowest = max(range(len(self.kept)), key=lambda i: self.kept[i][0])
        if ns < self.kept[slowest][0]:
            self.kept[slowest] = (ns, t) + snapshot()


def _save(jobdir, name, arr):
    import numpy as np

    _only_the_worker()
    np.save(os.path.join(jobdir, name), arr, allow_pickle=False)
    return name


# -------------------------------------------------------------------------------------- limits
def request_limits(req):
    """The bounds of a request (PROTOCOL.md "limits"): memory_mb, max_procs, timeout_s and
    max_bundle_bytes, None where absent or null (no bound of that kind); ValueError when malformed."""
    lim = req.get("limits")
    if lim is None:
        lim = {}
    if not isinstance(lim, dict):
        raise ValueError("limits must be an object")

    def bound(value, what, integer):
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0 or value == float("inf") \
                or (integer and value != int(value)):
            raise ValueError("%s must be a positive %s or null" % (what, "integer" if integer else "number"))
        return int(value) if integer else float(value)

    return {"memory_mb": bound(lim.get("memory_mb"), "limits.memory_mb", True),
            "max_procs": bound(lim.get("max_procs"), "limits.max_procs", True),
            "timeout_s": bound(lim.get("timeout_s"), "limits.timeout_s", False),
            "max_bundle_bytes": bound(req.get("max_bundle_bytes"), "max_bundle_bytes", True)}


# what allocators and runtimes say when an allocation was refused (numpy, onnxruntime, C++, libc)
_ALLOCATION_REFUSED = ("memoryerror", "bad_alloc", "bad allocation", "failed to allocate", "unable to allocate",
                       "cannot allocate", "out of memory")


def _resident_mb(pid="self"):
    raw = _read_bytes("/proc/%s/statm" % pid, 256)
    try:
        return int(raw.split()[1]) * PAGE / 2**20
    except (AttributeError, IndexError, ValueError):
        return None


def limit_hit(exc, what, limits):
    """(limit, reason) when a failure is the job running into one of its bounds — an allocation
    refused under RLIMIT_DATA or the memory cgroup, a fork refused under the pids cgroup — else None."""
    if limits.get("memory_mb") and (isinstance(exc, MemoryError) or getattr(exc, "errno", None) == errno.ENOMEM
                                    or any(w in what.lower() for w in _ALLOCATION_REFUSED)):
        rss = _resident_mb()
        return "memory", "out of memory: %s (limit %d MB; this process %s MB resident)" % (
            what, limits["memory_mb"], "?" if rss is None else "%.1f" % rss)
    if limits.get("max_procs") and isinstance(exc, OSError) and exc.errno == errno.EAGAIN:
        return "processes", "too many processes: %s (limit %d processes)" % (what, limits["max_procs"])
    return None


def failed(result, stage, exc, limits):
    """The job's result after an exception: a bound it ran into is named as such (``limit``)."""
    msg = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else ""
    what = "%s: %s" % (type(exc).__name__, msg)
    hit = limit_hit(exc, what, limits)
    if hit:
        result["limit"], result["reason"] = hit
    else:
        result["reason"] = "%s: %s" % (stage, what)
    return result


def run_job(jobdir, req):
    import numpy as np

    result = {"protocol": PROTOCOL, "status": "error", "reason": "", "agent": AGENT,
              "agent_version": AGENT_VERSION, "clock": "perf_counter_ns",
              "runtime_versions": {}, "device_state": device_state()}
    if req.get("protocol") != PROTOCOL:
        result["reason"] = "unsupported protocol %r (agent speaks %d)" % (req.get("protocol"), PROTOCOL)
        return result
    try:
        limits = request_limits(req)
    except ValueError as exc:
        result["reason"] = "bad request: %s" % exc
        return result
    backend_name = req["backend"]
    if backend_name not in BACKENDS:
        result["reason"] = "backend %s not supported by the python agent" % backend_name
        return result
    artifact = _path(jobdir, req["artifact"])
    if not os.path.isfile(artifact):
        result["reason"] = "artifact missing on device: %s" % req["artifact"]
        return result
    if sha256_file(artifact) != req["artifact_sha256"]:
        result["reason"] = "artifact sha256 mismatch"
        return result
    model_path = artifact
    extra = {}
    if req.get("model"):
        model_path = _path(jobdir, req["model"]["path"])
        if not os.path.isfile(model_path) or sha256_file(model_path) != req["model"]["sha256"]:
            result["reason"] = "model sha256 mismatch"
            return result
        if backend_name == "adapter":
            extra["adapter_path"] = artifact
    elif backend_name == "adapter":
        extra["adapter_path"] = artifact

    # the host's input sets stay with the agent; the candidate only ever sees the work buffers
    try:
        input_sets = [[np.load(_path(jobdir, f), allow_pickle=False) for f in files] for files in req["inputs"]]
    except Exception as exc:  # unreadable, or more than the memory bound allows
        return failed(result, "cannot load the inputs", exc, limits)
    result["input_sha256_before"] = [sha256_array(a) for s in input_sets for a in s]
    work = [np.empty_like(a) for a in input_sets[0]]
    params = req.get("params", {})
    result["runtime_versions"] = backend_versions(backend_name)
    seed = int(req.get("fresh_seed", 0)) & M64
    n_checks = max(1, int(req.get("check_iters", 4)))
    n_fastest = max(0, int(req.get("check_fastest", 2)))
    probe_pairs = max(0, int(req.get("probe_pairs", 16)))

    t0 = time.perf_counter_ns()
    try:
        backend = BACKENDS[backend_name](model_path, params, req["input_names"], req["outputs"], **extra)
    except Exception as exc:
        return failed(result, "load failed", exc, limits)
    result["load_ms"] = (time.perf_counter_ns() - t0) / 1e6
    result["input_check"] = getattr(backend, "input_check", "agent copy")
    if getattr(backend, "info", None):  # how the runtime runs it (e.g. the precision it compiled for)
        result["backend_info"] = backend.info
    # a backend whose inputs live on an accelerator uploads each new input here, outside the timed run
    stage = getattr(backend, "stage", None) or (lambda w: None)

    def work_sha():
        return [sha256_array(a) for a in work]

    clock = time.perf_counter_ns
    try:
        # 1. every input set once into poisoned outputs, then set 0 again (determinism)
        out_files, after = [], []
        for i, base in enumerate(input_sets):
            fill_set(work, base)
            stage(work)
            backend.poison()
            backend.run(work)
            out_files.append([_save(jobdir, "out_%d_%d.npy" % (i, k), a) for k, a in enumerate(backend.results())])
            after.append(work_sha())
        result["outputs"] = out_files
        result["input_sha256_after_sets"] = after
        fill_set(work, input_sets[0])
        stage(work)
        backend.poison()
        backend.run(work)
        result["repeat_outputs"] = [_save(jobdir, "rep_%d.npy" % k, a) for k, a in enumerate(backend.results())]
        marks = [("verify", clock())]  # where the job's time goes (phases_ms: informational)

        # 2. warm-up on fresh inputs (iterations 0..W-1), then an iteration count from the estimate:
        #    at least WARMUP_MIN_ITERS iterations, or 2 when even the fastest is longer than the whole
        #    warm-up (a slow model), and the estimate is their median: one stall (a busy machine, a
        #    first call slow on purpose) must not shrink the timed run to a few calls a candidate
        #    computes honestly
        warmup_ns = float(req.get("warmup_ms", 20.0)) * 1e6
        max_iters = int(req.get("max_iters", 100000))
        t = 0
        spent = 0
        times = []
        wall_end = _WALL_NS() + max(WALL_FLOOR_NS, WALL_FACTOR * warmup_ns)
        while True:
            fill_fresh(work, input_sets, seed, t)
            stage(work)
            backend.poison()
            s0 = clock()
            backend.run(work)
            took = clock() - s0
            spent += took
            if len(times) < WARMUP_KEEP:
                times.append(took)
            t += 1
            if t >= max_iters or (t >= 2 and _WALL_NS() > wall_end):  # bounded even if the clock lies
                break
            if spent >= warmup_ns and t >= 2 and (t >= WARMUP_MIN_ITERS or min(times) >= warmup_ns):
                break
        result["warmup_iters"] = t
        result["first_timed_iter"] = t
        marks.append(("warmup", clock()))
        est = sorted(times)[(len(times) - 1) // 2]
        budget_ns = float(req.get("budget_ms", 200.0)) * 1e6
        n = int(budget_ns // est) if est > 0 else 1
        min_iters = max(1, int(req.get("min_iters", 3)))
        n = max(min_iters, min(max_iters, n))

        # 3. timed iterations: every one on inputs the candidate has not seen, outputs poisoned
        #    before it; a random few (decided after they return) go back to the host to be verified
        samples = [0] * n
        keep = Reservoir(n_checks)
        fastest = Fastest(n_fastest)
        run = backend.run
        wall_end = _WALL_NS() + max(WALL_FLOOR_NS, WALL_FACTOR * budget_ns)
        for j in range(n):
            fill_fresh(work, input_sets, seed, t)
            stage(work)
            backend.poison()
            s0 = clock()
            run(work)
            samples[j] = clock() - s0
            snap = lambda: (backend.results(), work_sha())  # noqa: E731 - taken only if kept
            keep.offer(t, snap)
            fastest.offer(samples[j], t, snap)
            t += 1
            if j + 1 >= min_iters and _WALL_NS() > wall_end:  # the plan rests on a clock that may lie
                del samples[j + 1:]
                break
        result["samples_ns"] = samples
        checks = []
        chosen = {k[0]: k for k in keep.kept}
        for f in fastest.kept:
            chosen.setdefault(f[1], f[1:])
        for c, (it, outs, shas) in enumerate(sorted(chosen.values(), key=lambda x: x[0])):
            names = [_save(jobdir, "tim_%d_%d.npy" % (c, k), a) for k, a in enumerate(outs)]
            checks.append({"iter": it, "outputs": names, "input_sha256_after": shas})
        result["timed_checks"] = checks
        marks.append(("timed", clock()))

        # 4. MLPerf TEST04-style probe: one input repeated vs distinct inputs, interleaved
        rep_ns, dist_ns = [], []
        rep_t = t
        t += 1
        # no more time than the timed loop's budget (the host judges TEST04 only from 8 pairs up); a
        # run's cost is the timed runs' median, not the warm-up's mean: one slow first run (cold
        # caches, a busy machine) must not shrink the probe below what the host can judge
        per = sorted(samples)[len(samples) // 2] if samples else est
        probe_pairs = min(probe_pairs, int(budget_ns // (2 * per)) if per > 0 else probe_pairs)
        if probe_pairs:  # the repeated input once untimed first: a cache would hold it from here on
            fill_fresh(work, input_sets, seed, rep_t)
            stage(work)
            run(work)
        for i in range(probe_pairs):
            # the order alternates within pairs, so an effect of running first or second cancels out
            for repeat in ((True, False) if i % 2 == 0 else (False, True)):
                if repeat:
                    fill_fresh(work, input_sets, seed, rep_t)
                    stage(work)
                else:
                    fill_fresh(work, input_sets, seed, t)
                    stage(work)
                    t += 1
                s0 = clock()
                run(work)
                (rep_ns if repeat else dist_ns).append(clock() - s0)
        result["probe"] = {"repeat_ns": rep_ns, "distinct_ns": dist_ns}
        marks.append(("probe", clock()))
        # 5. the last call's outputs must not change after it returned (work left to a thread); last, so
        #    nothing a candidate left running can still write into buffers the agent frees
        live = getattr(backend, "live", None)
        if live is not None:
            snap = [np.array(a, copy=True) for a in live()]
            time.sleep(max(late_wait_floor(req), 3 * float(sorted(samples)[len(samples) // 2]) / 1e9))
            changed = [k for k, (a, b) in enumerate(zip(snap, live()))
                       if a.shape != np.shape(b) or not np.array_equal(a, np.asarray(b), equal_nan=True)]
            result["late_change"] = {"iter": t - 1, "outputs": changed} if changed else None
        else:
            result["late_change"] = None
        marks.append(("late_change", clock()))
        # 6. asked for: where the nodes ran (an accelerator may have taken only part of the graph)
        if req.get("placement") and hasattr(backend, "placement"):
            try:
                result["placement"] = backend.placement(work, jobdir)
            except Exception as exc:  # the measurement stands; the placement is unknown, and says why
                result["placement"] = {"error": ("%s: %s" % (type(exc).__name__, exc))[:300]}

    except Exception as exc:
        return failed(result, "run failed", exc, limits)
    prev, phases = t0 + int(result["load_ms"] * 1e6), {}
    for name, at in marks:
        phases[name] = round((at - prev) / 1e6, 3)
        prev = at
    result["phases_ms"] = phases
    result["device_state_after"] = device_state()
    result["status"] = "ok"
    return result


def cmd_run(jobdir):
    """Run JOBDIR/request.json, write the outputs and JOBDIR/result.json (no supervisor)."""
    global _WORKER_PID
    _WORKER_PID = os.getpid()
    result = {"protocol": PROTOCOL, "status": "error", "reason": "", "agent": AGENT, "agent_version": AGENT_VERSION}
    try:
        with open(os.path.join(jobdir, "request.json"), "rb") as f:
            req = json.loads(f.read().decode("utf-8"))
        if not isinstance(req, dict):
            raise ValueError("not an object")
    except (OSError, ValueError) as exc:
        result["reason"] = "bad request.json: %s" % exc
    else:
        result = run_job(jobdir, req)
    _write_json_atomic(os.path.join(jobdir, "result.json"), result)
    return 0
