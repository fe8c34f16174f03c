"""``edgetune judge``: third-party kernels verified and raced against the strongest baseline on
your own devices, through the same protocol, verifier and final rounds as edgetune's own kernels.

``judge(JudgeConfig(op="gemm:M=97,N=130,K=75", kernels=["k.c", "dir/"], devices=["local"]))``:

1. the op spec and every kernel path are checked before any device work; a directory is judged
   kernel by kernel (C, C++, CUDA sources, prebuilt shared objects, TVM-exported modules);
2. per device: the native agent is provisioned (it must offer the ``judge`` backend: a sandboxed
   child process per kernel, timed by the agent's worker, which the kernel cannot patch); each
   source is built HERE for the device's architecture with the device's toolchain
   (``edgetune.build.kernel_build``), so the binary judged is known by its sha256 and exact
   command; exports that interpose libc/agent symbols are refused before anything runs;
3. correctness at an odd-sized variant of the spec (every even dimension minus one), unless the
   kernel is shape-specialised (TVM module) or ``exact_shape`` is set;
   CUDA kernels (``.cu``, on a device whose agent reports an NVIDIA GPU) run in the agent's CUDA
   mode (device buffers with guard zones, the call + cuCtxSynchronize timed by the worker) and,
   where the device has compute-sanitizer, once more under memcheck and racecheck (``_sanitize``);
4. ``rounds`` interleaved rounds (``kernels.session.final_rounds``): every kernel still standing
   and every honest baseline form of the op the device can run (onnxruntime with constant and
   runtime weights, numpy/BLAS, LiteRT/XNNPACK; on a GPU device onnxruntime's CUDA provider),
   rotating order, fresh inputs each round, every
   run verified; a kernel that fails any check is out with its named failure;
5. the verdict per kernel: correct or the first failure's code; speed against the strongest
   verified baseline form (per-round medians, t interval on per-round log ratios); fast_p = the
   whole 95% interval at or above p (no claim from a point estimate). Emulated devices (qemu)
   get correctness only: their timings are not the hardware's.

Every run is a record in the database (run kind "judge"), and ``report_dir`` receives the JSON
(every sample of every round), a Markdown leaderboard, the kernels (sources and the binaries
judged) and a script that re-runs the judgement.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import shutil
import tempfile
import uuid
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

import edgetune
from edgetune import sanitizer as san
from edgetune.agent.host import Job
from edgetune.build import kernel_build as kb
from edgetune.build.kernel_build import classify
from edgetune.candidate import Candidate
from edgetune.db import Record, Store
from edgetune.devices.inventory import Inventory, device_identity, home_subdir
from edgetune.errors import DeviceError, EdgetuneError, UserInputError
from edgetune.kernels.device_measure import DeviceMeasure, job_to_kernel_run
from edgetune.kernels.baselines import (BaselineDevice, baseline_device, baseline_forms, close_baseline_agent,
                                        run_baseline_form)
from edgetune.kernels.session import (Entrant, check_kernel_run, final_rounds, final_weights, record_form,
                                      strongest_baseline)
from edgetune.kernels.targets import device_sm, gpu_peak_gflops
from edgetune.kernels.workloads import parse_workload
from edgetune.measure import round_median, round_ratio
from edgetune.report import write_atomic
from edgetune.text import md_text

JudgeEvent = Callable[[dict[str, Any]], None]

# Where the device cannot install the seccomp filter (qemu-user refuses guest filters: the test
# farm's emulated board), the agent only DETECTS forbidden acts after a call (new processes, open
# sockets, files open for writing) and cannot see one that was undone in time. There, a kernel
# that imports a function of those families is refused before it runs.
FORBIDDEN_IMPORTS: dict[str, frozenset[str]] = {
    "forbidden-exec": frozenset({"execve", "execv", "execvp", "execvpe", "execl", "execlp", "execle", "fexecve",
                                 "execveat", "system", "popen", "posix_spawn", "posix_spawnp", "dlopen", "dlsym",
                                 "dlmopen", "dlvsym"}),
    "forbidden-process": frozenset({"fork", "vfork", "clone", "clone3", "daemon", "_Fork"}),
    "forbidden-network": frozenset({"socket", "socketpair", "connect", "bind", "listen", "accept", "accept4",
                                    "getaddrinfo", "gethostbyname", "sendto", "sendmsg", "recvfrom", "recvmsg"}),
    # (not open/openat: reading is allowed, and a static C++ runtime imports open)
    "forbidden-file": frozenset({"creat", "creat64", "fopen", "fopen64",
                                 "freopen", "freopen64", "mkdir", "mkdirat", "unlink", "unlinkat", "remove",
                                 "rename", "renameat", "renameat2", "link", "linkat", "symlink", "symlinkat",
                                 "truncate", "truncate64", "chmod", "fchmodat", "chown", "lchown", "fchownat",
                                 "mknod", "mknodat", "mkfifo", "tmpfile", "mkstemp", "mkostemp"}),
    "forbidden-syscall": frozenset({"syscall", "kill", "tgkill", "tkill", "ptrace", "process_vm_readv",
                                    "process_vm_writev", "pidfd_open", "pidfd_send_signal", "killpg", "sigqueue",
                                    "prctl", "mount", "umount", "umount2", "unshare", "setns", "chroot",
                                    "personality", "io_uring_setup", "io_uring_enter", "perf_event_open"}),
}


def forbidden_imports(undefined) -> tuple[str, list[str]] | None:
    """(code, the imported names) of the first family a kernel imports from, or None."""
    for code, names in FORBIDDEN_IMPORTS.items():
        hit = sorted(names & set(undefined))
        if hit:
            return code, hit
    return None

SCHEMA = "edgetune.judge/1"
FAST_P = (1.0, 1.5, 2.0)
DEFAULT_ROUNDS = 5
SOURCE_SUFFIXES = {".c": "c", ".cc": "c++", ".cpp": "c++", ".cxx": "c++", ".cu": "cuda"}
# parameters an odd-size check keeps (strides, pads, filter sizes, flags): per op, since a
# convolution's S is its filter width and attention's S its sequence length
_KEEP = {"conv2d_nchw": {"R", "S", "stride", "pad"}, "conv2d_nhwc": {"R", "S", "stride", "pad"},
         "depthwise_conv2d_nchw": {"R", "S", "stride", "pad"}, "batch_matmul": {"TB"}, "attention": {"causal"}}


@dataclass
class JudgeConfig:
    op: str = ""
    kernels: Sequence[str] = ()
    devices: Sequence[str] = ("local",)
    rounds: int = DEFAULT_ROUNDS
    budget_ms: float = 50.0
    timeout_s: float = 60.0
    memory_mb: int = 4096  # resident memory of a kernel run, all its processes (the agent's supervisor)
    num_threads: int | None = None
    cflags: Sequence[str] = ()
    exact_shape: bool = False
    baseline: bool = True
    db: str | None = None
    report_dir: str | None = None
    command: str = ""
    inventory: Any = None  # an Inventory (tests); default: the user's
    build_dir: str | None = None  # where built kernels are cached (default EDGETUNE_HOME/judge)


@dataclass(frozen=True)
class KernelFile:
    name: str  # unique display name (the file name; a clash gets its parent directory)
    path: Path
    kind: str  # c | c++ | cuda | shared-object
    sha256: str  # of the file as given


@dataclass
class Judged:
    """One kernel on one device: what the JSON and the leaderboard show."""

    kernel: str
    path: str
    kind: str
    file_sha256: str
    device: str
    abi: str | None = None
    artifact_sha256: str | None = None
    build: dict[str, Any] | None = None
    correct: bool = False
    failure: str | None = None  # the first failed check by name
    errors: list[str] = field(default_factory=list)
    checks: list[dict[str, Any]] = field(default_factory=list)  # every verification: spec, round, ok, code
    speed: dict[str, Any] | None = None
    fast: dict[str, bool | None] = field(default_factory=dict)
    sandbox: str | None = None
    handshake_ns: float | None = None
    timer: str | None = None  # how the agent's worker waited for the kernel's return: spin | sleep
    median_ns: float | None = None
    round_samples_ns: list[list[int]] = field(default_factory=list)

    def fail(self, code: str, error: str) -> None:
        if self.correct or self.failure is None:
            self.failure = code
        self.correct = False
        self.errors.append(error)

    def as_dict(self) -> dict[str, Any]:
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        d["fast"] = {_p(p): v for p, v in self.fast.items()} if self.fast else {}
        return d


def _p(p: float) -> str:
    return f"{p:g}"


# ---------------------------------------------------------------------------------------------
# Inputs
# ---------------------------------------------------------------------------------------------


def collect_kernels(paths: Sequence[str]) -> list[KernelFile]:
    """Every kernel named: files as given, directories by their kernel files (sorted); one clear
    UserInputError for a path that is missing, unreadable or not a kernel."""
    if not paths:
        raise UserInputError("give one or more KERNEL files or directories to judge")
    found: list[tuple[Path, str]] = []
    for raw in paths:
        p = Path(raw).expanduser()
        if p.is_dir():
            inside = []
            for q in sorted(p.iterdir()):
                if not q.is_file():
                    continue
                if q.suffix.lower() not in SOURCE_SUFFIXES and q.suffix.lower() != ".so":
                    continue
                inside.append((q, classify(q)))
            if not inside:
                raise UserInputError(f"{p}: no kernels in this directory (.c, .cc, .cpp, .cu, .so)")
            found.extend(inside)
        else:
            if not p.exists():
                raise UserInputError(f"{p}: no such kernel file")
            found.append((p, classify(p)))
    seen: set[Path] = set()
    out: list[KernelFile] = []
    names: set[str] = set()
    for p, kind in found:
        rp = p.resolve()
        if rp in seen:
            continue
        seen.add(rp)
        name = p.name if p.name not in names else f"{p.parent.name}/{p.name}"
        i = 2
        while name in names:
            name, i = f"{p.name}#{i}", i + 1
        names.add(name)
        try:
            sha = hashlib.sha256(p.read_bytes()).hexdigest()
        except OSError as exc:
            raise UserInputError(f"{p}: cannot read it ({exc.strerror or exc})") from None
        out.append(KernelFile(name, p, kind, sha))
    return out


def odd_variant(w):
    """The op with every even dimension made odd (minus one), or None when it has none: the shape
    of the correctness check that catches kernels right only on friendly sizes."""
    params = w.params()
    keep = _KEEP.get(w.op, set())
    changed = {k: (v - 1 if (k not in keep and isinstance(v, int) and v > 1 and v % 2 == 0) else v)
               for k, v in params.items()}
    if changed == params:
        return None
    spec = f"{w.op}:" + ",".join(f"{k}={v}" for k, v in changed.items())
    try:
        return parse_workload(spec)
    except UserInputError:
        return None  # an op whose constraints the variant breaks: checked at the spec only


# ---------------------------------------------------------------------------------------------
# The judgement
# ---------------------------------------------------------------------------------------------


def judge(cfg: JudgeConfig, progress: JudgeEvent | None = None) -> dict[str, Any]:
    """Judge every kernel on every device; returns the JSON document (schema ``edgetune.judge/1``)."""
    emit = progress or (lambda ev: None)
    if cfg.rounds < 1:
        raise UserInputError(f"--rounds must be >= 1, got {cfg.rounds}")
    if cfg.budget_ms <= 0 or cfg.timeout_s <= 0 or cfg.memory_mb <= 0:
        raise UserInputError("--budget-ms, --timeout and --memory-mb must be positive")
    w = parse_workload(cfg.op)
    kernels = collect_kernels(cfg.kernels)
    inventory = cfg.inventory or Inventory()
    specs = [inventory.get(d) for d in (cfg.devices or ["local"])]  # unknown device: one line, before any work
    report, made = _prepare_report_dir(cfg.report_dir) if cfg.report_dir else (None, False)
    odd = None if cfg.exact_shape else odd_variant(w)
    doc: dict[str, Any] = {"schema": SCHEMA, "op": w.spec(), "workload_key": w.key(), "flops": int(w.flops()),
                           "odd_shape": odd.spec() if odd else None, "rounds": cfg.rounds,
                           "budget_ms": cfg.budget_ms, "command": cfg.command, "fast_p": list(FAST_P),
                           "kernels": [{"name": k.name, "path": str(k.path), "kind": k.kind, "sha256": k.sha256}
                                       for k in kernels],
                           "devices": [], "results": []}
    emit({"event": "start", "op": w.spec(), "kernels": len(kernels), "devices": [s.name for s in specs]})
    try:
        for spec in specs:
            dev_doc, results = _judge_device(cfg, spec, w, odd, kernels, emit)
            doc["devices"].append(dev_doc)
            doc["results"].extend(r.as_dict() for r in results)
    except BaseException:
        if made:  # a report directory this run created and never filled is not left behind
            shutil.rmtree(report, ignore_errors=True)
        raise
    if report is not None:
        _write_report(report, doc, kernels, cfg)
        doc["report_dir"] = str(report)
    return doc


def _judge_device(cfg: JudgeConfig, spec, w, odd, kernels: list[KernelFile], emit) -> tuple[dict, list[Judged]]:
    store = Store(cfg.db)
    measure = DeviceMeasure(spec, cfg.num_threads, cfg.budget_ms, cfg.timeout_s, max_iters=20_000)
    bdev = BaselineDevice()
    run_id = "j" + uuid.uuid4().hex[:15]
    started = False
    try:
        probe = measure.probe()
        info = probe.info
        if info.agent != "native" or "judge" not in info.runtimes:
            raise DeviceError(f"{spec.name}: its agent ({info.agent} {info.agent_version}) has no judge backend; "
                              f"the judge needs the dynamic native agent 0.4 or later")
        sandbox = str(info.runtimes.get("judge-sandbox") or "unknown")
        emulated = probe.emulated
        peak = None if emulated else measure.peak_gflops
        # a CUDA kernel's roofline is its GPU's (the SM's stated dense tensor-core peak), not the CPU's
        sm = device_sm(info.fingerprint)
        gpu_peak = None if emulated or sm is None else gpu_peak_gflops(sm)

        def kpeak(k: KernelFile):
            return gpu_peak if k.kind == "cuda" else peak
        fp, fp_key = probe.fingerprint, probe.fingerprint_key
        versions = {"edgetune": edgetune.__version__, "agent": f"{info.agent} {info.agent_version}",
                    "device_runtimes": {k: v for k, v in sorted(info.runtimes.items()) if not isinstance(v, list)}}
        emit({"event": "device", "device": spec.name, "arch": info.arch, "emulated": emulated, "sandbox": sandbox})
        store.acquire_device(device_identity(spec), run_id)  # one process drives a device at a time
        store.start_run(run_id, "judge:" + w.spec(), hashlib.sha256(w.key().encode()).hexdigest(), spec.name,
                        fp_key, fp, versions,
                        {"kind": "judge", "op": w.spec(), "odd_shape": odd.spec() if odd else None,
                         "rounds": cfg.rounds, "budget_ms": cfg.budget_ms, "timeout_s": cfg.timeout_s,
                         "kernels": [{"name": k.name, "sha256": k.sha256, "kind": k.kind} for k in kernels],
                         "cflags": list(cfg.cflags), "command": cfg.command, "num_threads": measure.num_threads,
                         "memory_mb": cfg.memory_mb})
        started = True
        results = [Judged(k.name, str(k.path), k.kind, k.sha256, spec.name) for k in kernels]
        built: dict[str, Any] = {}
        for k, res in zip(kernels, results):
            b = _build_for(k, info, cfg, res, op_macros(w))
            if b is not None:
                built[k.name] = b
        shape = {"op": w.spec()}
        common = dict(run_id=run_id, workload_key=w.key(), shape=shape,
                      shape_key=hashlib.sha256(w.key().encode()).hexdigest()[:16], fingerprint_key=fp_key)

        def candidate(k: KernelFile) -> dict[str, Any]:
            b = built.get(k.name)
            return Candidate.make("judge", {"kernel": k.name, "file_sha256": k.sha256,
                                            "artifact_sha256": b.sha256 if b else None,
                                            "abi": b.abi if b else None}).as_dict()

        def job(k: KernelFile, inputs, view):
            b = built[k.name]
            params = {"abi": b.abi, "num_threads": measure.num_threads}
            if k.kind == "cuda":  # device buffers, the call timed with cuCtxSynchronize (PROTOCOL.md)
                params.update(device="cuda", cuda_device=0)
            return Job(backend="judge", artifact=Path(b.path), params=params,
                       input_names=[s.name for s in view.inputs], input_sets=[inputs],
                       output_specs=[s.as_json() for s in view.outputs], budget_ms=cfg.budget_ms,
                       warmup_ms=min(20.0, max(5.0, cfg.budget_ms / 5)), max_iters=20_000, timeout_s=cfg.timeout_s,
                       memory_mb=cfg.memory_mb)

        def run_kernel(k: KernelFile, view, inputs):
            jr = measure.run_job(job(k, inputs, view))
            res = by_name[k.name]
            if k.kind == "cuda" and jr.status != "ok" and "cuda-unavailable: " in (jr.reason or ""):
                # the device's failure, not the kernel's: its GPU (nvidia-smi saw it) cannot be opened
                res.fail("not-applicable", "the device's GPU could not be opened: "
                         + (jr.reason or "").split("cuda-unavailable: ", 1)[1])
            res.sandbox = res.sandbox or jr.backend_info.get("sandbox")
            hs = jr.backend_info.get("handshake_ns")
            if isinstance(hs, (int, float)) and res.handshake_ns is None:
                res.handshake_ns = float(hs)
            spin = jr.backend_info.get("spin_ns")
            if isinstance(spin, (int, float)) and jr.ok:  # the last run's choice (made once threads were known)
                res.timer = "spin" if spin > 0 else "sleep"
            return jr, job_to_kernel_run(jr, inputs, view.outputs)

        by_name = {r.kernel: r for r in results}
        # 1. correctness at the odd-sized variant (shape-generic kernels only)
        if odd is not None:
            inputs = odd.random_inputs(7)
            reference = odd.reference(inputs)
            for k in kernels:
                res = by_name[k.name]
                if k.name not in built:
                    continue
                if built[k.name].abi != "edgetune":
                    res.checks.append({"spec": odd.spec(), "round": 0, "ok": None,
                                       "code": None, "reason": "shape-specialised (TVM module): not run"})
                    continue
                emit({"event": "check", "device": spec.name, "kernel": k.name, "spec": odd.spec()})
                jr, run = run_kernel(k, odd, [x.copy() for x in inputs])
                ok, reason, mabs, mrel = check_kernel_run(run, odd, inputs, reference, peak_gflops=kpeak(k),
                                                     timings_trusted=not emulated)
                code = None if ok else reason.split(":", 1)[0]
                res.checks.append({"spec": odd.spec(), "round": 0, "ok": ok, "code": code, "reason": reason,
                                   "max_abs_err": mabs, "max_rel_err": mrel})
                store.add_record(Record(
                    run_id=run_id, workload_key=odd.key(), shape={"op": odd.spec()},
                    shape_key=hashlib.sha256(odd.key().encode()).hexdigest()[:16],
                    fingerprint_key=fp_key, candidate=candidate(k), versions=versions, round=0,
                    status="verified" if ok else "failed", reason=reason,
                    verdict={"ok": ok, "reason": reason, "max_abs_err": mabs, "max_rel_err": mrel,
                             "check": "odd shape", "build": res.build, "sandbox": res.sandbox},
                    samples_ns=run.samples_ns, wall_ms=jr.wall_ms, agent_ms=jr.agent_ms))
                if not ok:
                    res.fail(code, f"at {odd.spec()}: {reason}")
                    emit({"event": "failed", "device": spec.name, "kernel": k.name, "code": code})
                if measure.device_error is not None:
                    raise DeviceError(f"{spec.name}: device lost: {measure.device_error}")

        # 1b. CUDA kernels still standing, once per compute-sanitizer tool, where the device has it
        sanitizer_doc = _sanitize(cfg, spec, measure, store, common, versions, kernels, built, by_name, job,
                                  candidate, odd or w, emit)

        # 2. the interleaved rounds: every kernel still standing and every baseline form
        standing = [k for k in kernels if k.name in built and by_name[k.name].failure is None]
        bcfg = _BaselineCfg(cfg.baseline, cfg.budget_ms, cfg.timeout_s)
        bdev = baseline_device(bcfg, spec, measure, info, [w])
        weights = final_weights(w)
        workdir = Path(tempfile.mkdtemp(prefix="edgetune-judge-base-"))
        entrants = [Entrant(k.name, (lambda xs, _k=k: run_kernel(_k, w, xs)), peak_gflops=kpeak(k),
                            timings_trusted=not emulated) for k in standing]
        kfile = {k.name: k for k in kernels}

        def record(who, rnd, ok, reason, mabs, mrel, run, jr, wall_ms):
            verdict = {"ok": ok, "reason": reason, "max_abs_err": mabs, "max_rel_err": mrel}
            if who.form is None:
                res = by_name[who.key]
                code = None if ok else reason.split(":", 1)[0]
                res.checks.append({"spec": w.spec(), "round": rnd, "ok": ok, "code": code, "reason": reason,
                                   "max_abs_err": mabs, "max_rel_err": mrel})
                if not ok:
                    res.fail(code, f"round {rnd}: {reason}")
                    emit({"event": "failed", "device": spec.name, "kernel": who.key, "code": code})
                store.add_record(Record(**common, candidate=candidate(kfile[who.key]), versions=versions, round=rnd,
                                        status="verified" if ok else "failed", reason=reason,
                                        verdict={**verdict, "load_ms": run.load_ms, "build": res.build,
                                                 "sandbox": res.sandbox, "handshake_ns": res.handshake_ns},
                                        samples_ns=run.samples_ns, wall_ms=jr.wall_ms if jr else wall_ms,
                                        agent_ms=jr.agent_ms if jr else wall_ms))
                return
            record_form(store, common, versions, who.form, rnd, ok, reason, verdict, jr)

        forms: list = []
        skipped: list = []
        rounds = None
        try:
            forms, skipped = baseline_forms(w, weights, workdir, bdev)
            emit({"event": "rounds", "device": spec.name, "kernels": len(standing), "forms": [f.key for f in forms],
                  "rounds": cfg.rounds})
            rounds = final_rounds(w, entrants, forms, cfg.rounds, weights,
                                  lambda form, xs: run_baseline_form(form, xs, measure, bdev, bcfg), record,
                                  device_lost=lambda: measure.device_error is not None,
                                  on_round=lambda r: emit({"event": "round", "device": spec.name, "round": r}))
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
        if rounds is None or measure.device_error is not None:
            raise DeviceError(f"{spec.name}: device lost while judging: {measure.device_error}")

        # 3. verdicts
        flops = int(w.flops())
        baseline_doc = None
        for k in standing:
            res = by_name[k.name]
            g = rounds.groups.get(k.name, [])
            if res.failure is not None or len(g) != cfg.rounds:
                continue
            res.correct = True
            res.round_samples_ns = [[int(x) for x in a] for a in g]
            res.median_ns = round_median(g)
            b = strongest_baseline(forms, skipped, rounds.groups, rounds.failed, g, flops, round_ratio)
            if baseline_doc is None:
                baseline_doc = {kk: b[kk] for kk in ("backend", "form", "median_ns", "gflops", "reason", "forms")}
                baseline_doc["round_samples_ns"] = {f.key: [[int(x) for x in a] for a in rounds.groups.get(f.key, [])]
                                                    for f in forms}
            if emulated:
                res.speed = {"verdict": None, "speedup": None, "ci95": None, "baseline": b["form"],
                             "reason": f"emulated device ({emulated}): timings are not the hardware's; "
                                       f"correctness only"}
                res.fast = {p: None for p in FAST_P}
            elif b["form"] is None:
                res.speed = {"verdict": None, "speedup": None, "ci95": None, "baseline": None, "reason": b["reason"]}
                res.fast = {p: None for p in FAST_P}
            else:
                res.speed = {"verdict": b["verdict"], "speedup": b["speedup"], "ci95": b["ci95"],
                             "baseline": b["form"], "baseline_label": b["backend"],
                             "baseline_median_ns": b["median_ns"], "median_ns": res.median_ns,
                             "rounds": b["rounds"], "method": b["method"], "reason": ""}
                low = b["ci95"][0] if b["ci95"] and b["ci95"][0] is not None else None
                res.fast = {p: bool(low is not None and b["verdict"] != "insufficient rounds" and low >= p)
                            for p in FAST_P}
        for res in results:
            if res.failure is None and not res.correct:
                res.fail("not-judged", "no verdict (it did not run in every round)")
            if not res.correct:
                res.fast = {p: False for p in FAST_P}
        dev_doc = {"device": spec.name, "run_id": run_id, "fingerprint_key": fp_key, "fingerprint": fp,
                   "arch": info.arch, "emulated": emulated, "sandbox": sandbox,
                   "agent": f"{info.agent} {info.agent_version}", "fp32_peak_gflops": peak,
                   "gpu": {"sm": sm, "peak_gflops": gpu_peak} if sm else None,
                   "sanitizer": sanitizer_doc,
                   "baseline": baseline_doc or {"form": None, "reason": "no kernel was correct in every round"
                                                if standing else "no kernel reached the rounds",
                                                "forms": [dict(s) for s in skipped]},
                   "leaderboard": leaderboard(results, emulated), "db": str(store.path)}
        store.finish_run(run_id, {"kind": "judge", **dev_doc})
        started = False
        emit({"event": "device-done", "device": spec.name, "leaderboard": dev_doc["leaderboard"]})
        return dev_doc, results
    except BaseException as exc:
        if started:
            try:
                store.release_run(run_id, "down" if isinstance(exc, DeviceError) else f"failed: {exc}"[:200])
            except Exception:  # noqa: BLE001 - the original error is the one to report
                pass
        raise
    finally:
        close_baseline_agent(bdev)
        measure.close()
        store.close()


def _sanitize(cfg: JudgeConfig, spec, measure, store, common, versions, kernels, built, by_name, job, candidate,
              view, emit) -> dict[str, Any] | None:
    """Each CUDA kernel still standing, once under each compute-sanitizer tool (``edgetune.sanitizer``):
    a finding is the kernel's named failure. None when no CUDA kernel is judged here."""
    import dataclasses

    cuda = [k for k in kernels if k.kind == "cuda" and k.name in built and by_name[k.name].failure is None]
    if not cuda:
        return None
    transport = measure.client.transport
    exe = san.find(transport)
    if exe is None:
        return {"path": None, "tools": [], "reason": "no compute-sanitizer on the device (PATH, /usr/local/cuda/bin)"}
    inputs = view.random_inputs(13)
    shape_key = hashlib.sha256(view.key().encode()).hexdigest()[:16]
    for k in cuda:
        res = by_name[k.name]
        for tool in san.TOOLS:
            if res.failure is not None:
                break
            emit({"event": "sanitize", "device": spec.name, "kernel": k.name, "tool": tool})
            log = san.log_path(measure.client.workdir, tool)
            # one checked call is the point, not timing: the tools slow a kernel 10-100x
            j = dataclasses.replace(job(k, [x.copy() for x in inputs], view), budget_ms=1.0, warmup_ms=0.0,
                                    min_iters=1, max_iters=2, check_iters=1, check_fastest=0, probe_pairs=0,
                                    timeout_s=cfg.timeout_s * 10, memory_mb=cfg.memory_mb * 2)
            try:
                jr = measure.run_job(j, san.wrap(exe, tool, log))
                c = transport.run(["cat", log], timeout=60)
                text = c.text() if c.ok else ""
            finally:
                try:
                    transport.run(["rm", "-f", log], timeout=30)
                except DeviceError:
                    pass
            f = san.parse(text, tool)
            if f.ok is not False and jr.status != "ok":  # not a finding: said, never a pass
                f = san.Finding(None, None, f"{f.detail}; the job under it: {jr.status}: {jr.reason}"[:400], f.errors)
            res.checks.append(san.as_check(f, tool, view.spec()))
            c0 = candidate(k)  # a record of its own: not the odd-shape check's (same shape, same round)
            cand = Candidate.make(c0["backend"], {**c0["params"], "check": f"compute-sanitizer {tool}"}).as_dict()
            store.add_record(Record(
                run_id=common["run_id"], workload_key=view.key(), shape={"op": view.spec()},
                shape_key=shape_key, fingerprint_key=common["fingerprint_key"], candidate=cand,
                versions=versions, round=0,
                status="failed" if f.ok is False else "checked" if f.ok else "unchecked",
                reason=f.detail, verdict={"ok": f.ok, "reason": f.detail, "check": f"compute-sanitizer {tool}",
                                          "errors": f.errors},
                samples_ns=[], wall_ms=jr.wall_ms, agent_ms=jr.agent_ms))
            if f.ok is False:
                res.fail(f.code, f.detail)
                emit({"event": "failed", "device": spec.name, "kernel": k.name, "code": f.code})
    return {"path": exe, "tools": list(san.TOOLS), "reason": ""}


@dataclass
class _BaselineCfg:  # what the session's baseline helpers read from a config
    baseline: bool
    budget_ms: float
    timeout_s: float


def op_macros(w) -> list[str]:
    """``-D`` flags for a source kernel: the op's attributes that are not tensor shapes (a causal
    mask, strides, pads, filter sizes, a transposed operand), e.g. ``-DEDGETUNE_ATTENTION_CAUSAL=1``:
    the ABI passes shapes, not attributes. The same in the odd-size check and the rounds."""
    keep = _KEEP.get(w.op, set())
    return [f"-DEDGETUNE_{w.op.upper()}_{k.upper()}={v}" for k, v in w.params().items() if k in keep]


def _build_for(k: KernelFile, info, cfg: JudgeConfig, res: Judged, macros: Sequence[str] = ()):
    """The binary judged on this device (built here for its architecture), or None with the
    kernel's failure recorded (build error, wrong architecture, interposed symbols, CUDA on a CPU)."""
    arch = info.arch
    out_dir = Path(cfg.build_dir) if cfg.build_dir else home_subdir("judge") / arch
    try:
        if k.kind == "cuda":
            # built for the device GPU's own SM (its fingerprint, from nvidia-smi), not nvcc's default
            sm = device_sm(info.fingerprint)
            if sm is None:
                res.fail("not-applicable", "a CUDA kernel: this device has no CUDA GPU")
                return None
            b = kb.build_kernel(k.path, arch, out_dir, cflags=[*macros, *cfg.cflags], cuda_arch=sm)
        elif k.kind == "shared-object":
            b = kb.prepare_prebuilt(k.path, arch)
        else:
            triple = None if arch == "x86_64" else "aarch64-linux-gnu" if arch in ("aarch64", "arm64") else arch
            b = kb.build_kernel(k.path, arch, out_dir, triple=triple, cflags=[*macros, *cfg.cflags])
    except EdgetuneError as exc:
        msg = str(exc)
        code = "wrong-architecture" if "architecture" in msg else "bad-artifact" if k.kind == "shared-object" \
            else "build-failed"
        res.fail(code, msg)
        return None
    res.abi, res.artifact_sha256 = b.abi, b.sha256
    res.build = {"command": list(b.command) if b.command else None,
                 "command_line": shlex.join(b.command) if b.command else None,
                 "compiler": b.compiler, "flags": list(b.flags or []), "arch": arch, "binary": str(b.path)}
    if b.interposed:
        res.fail("interposed-symbol", "exports symbols of libc or the agent it could interpose: "
                 + ", ".join(sorted(b.interposed)[:8]))
        return None
    if not str(info.runtimes.get("judge-sandbox") or "").startswith("seccomp"):
        hit = forbidden_imports(kb.elf_info(b.path).undefined)
        if hit:
            res.fail(hit[0], f"imports {', '.join(hit[1][:6])}: this device has no seccomp sandbox (detect mode), "
                             f"so kernels importing process, file, network or raw-syscall functions are refused")
            return None
    return b


def leaderboard(results: Sequence[Judged], emulated: Any = None) -> dict[str, Any]:
    """KernelBench's fast_p with intervals: the fraction correct, and the fraction correct with
    the whole 95% interval of the speedup over the strongest baseline at or above p."""
    n = len(results)
    correct = sum(1 for r in results if r.correct)
    board: dict[str, Any] = {"kernels": n, "correct": correct, "fraction_correct": correct / n if n else None}
    for p in FAST_P:
        if emulated:
            board[f"fast_{_p(p)}"] = None
            continue
        hits = sum(1 for r in results if r.correct and r.fast.get(p))
        board[f"fast_{_p(p)}"] = hits / n if n else None
    failures: dict[str, int] = {}
    for r in results:
        if r.failure:
            failures[r.failure] = failures.get(r.failure, 0) + 1
    board["failures"] = dict(sorted(failures.items()))
    return board


# ---------------------------------------------------------------------------------------------
# Evidence: the report directory
# ---------------------------------------------------------------------------------------------


def _prepare_report_dir(path: str) -> tuple[Path, bool]:
    """The report directory and whether this call made it: made now, so an unwritable path fails
    before any device work. A re-run into the same directory replaces its files (each written
    whole, then renamed)."""
    p = Path(path).expanduser()
    if p.exists() and not p.is_dir():
        raise UserInputError(f"--report-dir {p}: exists and is not a directory")
    made = not p.exists()
    try:
        p.mkdir(parents=True, exist_ok=True)
        probe = p / f".edgetune-write-test-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        if made:
            shutil.rmtree(p, ignore_errors=True)
        raise UserInputError(f"--report-dir {p}: cannot write there ({exc.strerror or exc})") from None
    return p, made


def _write_report(report: Path, doc: dict[str, Any], kernels: Sequence[KernelFile], cfg: JudgeConfig) -> None:
    kdir = report / "kernels"
    kdir.mkdir(exist_ok=True)
    for k in kernels:
        dest = kdir / k.name.replace("/", "__")
        if not dest.exists() or hashlib.sha256(dest.read_bytes()).hexdigest() != k.sha256:
            write_atomic(dest, k.path.read_bytes())
    bdir = report / "built"
    bdir.mkdir(exist_ok=True)
    for r in doc["results"]:
        b = r.get("build") or {}
        sha = r.get("artifact_sha256")
        if sha and b.get("binary") and not (bdir / f"{sha}.so").exists():
            data = Path(b["binary"]).read_bytes()
            if hashlib.sha256(data).hexdigest() == sha:  # the binary judged, byte for byte
                write_atomic(bdir / f"{sha}.so", data)
    write_atomic(report / "judge.json", (json.dumps(doc, indent=1, default=_json_default) + "\n").encode())
    write_atomic(report / "judge.md", markdown(doc).encode())
    devices = " ".join(f"-d {shlex.quote(d['device'])}" for d in doc["devices"])
    flags = " ".join(f"--cflag={shlex.quote(c)}" for c in cfg.cflags)
    rerun = (f"#!/bin/sh\n# re-run this judgement: the same op, the same kernels (sha256 in judge.json),\n"
             f"# on your devices (edit -d). Every figure is measured again; nothing is read from this report.\n"
             f"cd \"$(dirname \"$0\")\" && exec edgetune judge --op {shlex.quote(doc['op'])} kernels "
             f"{devices} --rounds {doc['rounds']} --budget-ms {doc['budget_ms']:g}"
             + (" --exact-shape" if cfg.exact_shape else "") + (f" {flags}" if flags else "")
             + " --report-dir rerun \"$@\"\n")
    write_atomic(report / "rerun.sh", rerun.encode())
    os.chmod(report / "rerun.sh", 0o755)


def _json_default(o: Any) -> Any:
    if isinstance(o, (np.integer,)):
        return int(o)
    if isinstance(o, (np.floating,)):
        return float(o)
    if isinstance(o, Path):
        return str(o)
    raise TypeError(f"not JSON: {type(o).__name__}")


def fmt_ns(ns: float | None) -> str:
    if ns is None:
        return "—"
    if ns < 1e3:
        return f"{ns:.0f} ns"
    if ns < 1e6:
        return f"{ns / 1e3:.1f} µs"
    return f"{ns / 1e6:.2f} ms"


def speed_text(s: dict[str, Any] | None) -> str:
    if not s:
        return "—"
    if s.get("speedup") is None:
        return f"— ({s.get('reason') or 'no verdict'})"
    lo, hi = s["ci95"] or (None, None)
    ci = f" [{lo:.2f}, {hi:.2f}]" if lo is not None else ""
    return f"{s['speedup']:.2f}×{ci} {s['verdict']} vs {s['baseline']}"


def markdown(doc: dict[str, Any]) -> str:
    """The leaderboard and the per-kernel verdicts as Markdown (every device-given string escaped)."""
    out = [f"# edgetune judge: `{md_text(doc['op'])}`", ""]
    if doc.get("odd_shape"):
        out.append(f"Correctness also checked at `{md_text(doc['odd_shape'])}` (odd sizes).")
    out.append(f"{doc['rounds']} interleaved rounds per kernel and baseline form, {doc['budget_ms']:g} ms budget "
               f"per run; fast_p = correct and the whole 95% interval of the speedup over the strongest baseline ≥ p.")
    if doc.get("command"):
        out += ["", f"Command: `{md_text(doc['command'])}`"]
    for d in doc["devices"]:
        fp = d.get("fingerprint") or {}
        board = d["leaderboard"]
        out += ["", f"## {md_text(d['device'])} — {md_text(str(fp.get('cpu_model')))}, {d['arch']}"
                + (f", EMULATED ({md_text(str(d['emulated']))})" if d["emulated"] else "")
                + f", sandbox: {md_text(d['sandbox'])}", ""]
        b = d.get("baseline") or {}
        if b.get("form"):
            out.append(f"Strongest baseline: {md_text(str(b.get('backend')))} ({b['form']}), median "
                       f"{fmt_ns(b.get('median_ns'))}.")
        else:
            out.append(f"No baseline verdict: {md_text(str(b.get('reason')))}")
        fr = board["fraction_correct"]
        cells = [f"{board['correct']}/{board['kernels']} correct ({fr:.0%})" if fr is not None else "no kernels"]
        for p in doc["fast_p"]:
            v = board.get(f"fast_{p:g}")
            cells.append(f"fast_{p:g} = {v:.0%}" if v is not None else f"fast_{p:g} = n/a (emulated)")
        out += ["", "**" + " · ".join(cells) + "**", "",
                "| kernel | abi | verdict | failure | detail | median | vs strongest baseline [95% CI] |",
                "|---|---|---|---|---|---|---|"]
        rows = [r for r in doc["results"] if r["device"] == d["device"]]
        rows.sort(key=lambda r: (not r["correct"], -((r.get("speed") or {}).get("speedup") or 0), r["kernel"]))
        for r in rows:
            verdict = "correct" if r["correct"] else "rejected"
            err = md_text(r["errors"][0][:140]) if r["errors"] else ""
            out.append(f"| {md_text(r['kernel'])} | {r.get('abi') or '—'} | {verdict} | "
                       f"{md_text(r['failure'] or '')} | {err} | {fmt_ns(r.get('median_ns'))} | "
                       f"{md_text(speed_text(r.get('speed')))} |")
    return "\n".join(out) + "\n"
