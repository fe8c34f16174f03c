"""The judgement itself: per device, build, check, sanitize and race the kernels (see the package's docstring for the stages)."""

from __future__ import annotations

import hashlib
import shlex
import shutil
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import edgetune
from edgetune import sanitizer as san
from edgetune.agent.host import Job
from edgetune.build import kernel_build as kb
from edgetune.candidate import Candidate
from edgetune.db import Record, Store
from edgetune.devices.inventory import Inventory, device_identity, home_subdir
from edgetune.errors import DeviceError, EdgetuneError, UserInputError
from edgetune.kernels.baselines import (BaselineDevice, baseline_device, baseline_forms, close_baseline_agent,
                                        run_baseline_form)
from edgetune.kernels.device_measure import DeviceMeasure, job_to_kernel_run
from edgetune.kernels.session import (Entrant, check_kernel_run, final_rounds, final_weights, record_form,
                                      strongest_baseline)
from edgetune.kernels.targets import device_sm, gpu_peak_gflops
from edgetune.kernels.workloads import parse_workload
from edgetune.judge.inputs import KernelFile, collect_kernels, forbidden_imports, odd_variant, op_macros
from edgetune.judge.report import prepare_report_dir, write_report
from edgetune.judge.results import FAST_P, SCHEMA, JudgeConfig, Judged, leaderboard
from edgetune.measure import round_median, round_ratio

JudgeEvent = Callable[[dict[str, Any]], None]


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
    report, made = prepare_report_dir(cfg.report_dir) if cfg.report_dir else (None, False)
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
        write_report(report, doc, kernels, cfg)
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


