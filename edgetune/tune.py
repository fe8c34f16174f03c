"""The tuning loop: candidates -> prepare -> run on the device's agent -> verify -> record -> select.

Per device and shape point:
  round 0 (screen): every candidate runs once in its own process: verified, short timing budget;
  rounds 1..R (race): the runtime baselines and the best verified candidates run again, interleaved
  (A B C, B C A, ...) so drift hits all of them; the race only selects (edgetune/select.py);
  confirmation: the winner, the strongest baseline and the default run again in fresh interleaved
  rounds on new inputs; the verdict and the speedups come from these rounds only.
Every job of every round is verified; one failure disqualifies a candidate.
Every job is committed to the database as it finishes; a re-run with the same arguments resumes.
Devices run in parallel, one worker each; a device that goes away is marked down, the others go on.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from edgetune.agent.host import MAX_PROCS, MEMORY_MB, AgentClient, AgentInfo, Job, JobResult, load_factor
from edgetune.candidate import Candidate
from edgetune.db import WAIT_POLL_S, LeaseLost, Record, Store
from edgetune.devices.inventory import DeviceSpec, Inventory, device_identity, edgetune_home, home_subdir
from edgetune.errors import AuthError, DeviceError, HostKeyMismatch, StoreError, UserInputError
from edgetune.hostwork import HostWork
from edgetune.kernels.device_measure import device_peaks
from edgetune.kernels.targets import gpu_peak_gflops
from edgetune.modelfile import Deadline, Model, load_model
from edgetune.measure import looks
from edgetune.results import summarize_run
from edgetune.rounds import interleaved
from edgetune.select import confirm_seed, confirm_tags, confirm_workload, is_confirmation, replay, stored_round
from edgetune.space import APPROXIMATE_SPACES, BuildFailed, Prepared, load_space
from edgetune.space.openvino import check_precision
from edgetune.space.ort_gpu import GPU_PROVIDERS
from edgetune.tune_config import (DeviceOutcome, TuneConfig, TuneOutcome, cap_candidates, check_join, join_config,
                                  outcome_error, run_key, run_versions)
from edgetune.verify import Verdict, verify_job
from edgetune.workload import Workload, build_workload, load_user_inputs, parse_dims, parse_sweeps, shape_points

ProgressFn = Callable[[dict[str, Any]], None]


def wants_placement(prep: Prepared) -> bool:
    """An onnxruntime candidate for a provider other than the CPU's: the one kind that can fall back."""
    return prep.backend == "ort" and prep.params.get("execution_provider", "CPUExecutionProvider") not in (
        "CPUExecutionProvider",)


# the most of a shape's share the race leaves to the confirmation when its rounds to the cap need it
CONFIRM_RESERVE_SHARE = 0.5


def confirm_reserve(share_s: float, confirm_jobs: int, job_s: float) -> float:
    """Seconds of a shape's share the race leaves to the confirmation: what its jobs up to the
    cap of rounds take at this shape's median job wall, at most half of the share. The race's first
    round always runs (its finalists are the field); a later one only outside this reserve."""
    return min(CONFIRM_RESERVE_SHARE * share_s, confirm_jobs * job_s)


class DeviceTuner:
    """Tunes one model on one device; owns that device's agent client."""

    def __init__(self, spec: DeviceSpec, store: Store, cfg: TuneConfig, progress: ProgressFn | None = None,
                 client: AgentClient | None = None, hostwork: HostWork | None = None):
        self.spec = spec
        self.hostwork = hostwork or HostWork(None)
        self.store = store
        self.cfg = cfg
        self.progress = progress or (lambda ev: None)
        self.client = client
        self.overhead_ms: list[float] = []
        self.jobs_run = 0
        self.jobs_skipped = 0
        self.cache_dir = edgetune_home() / "artifacts"
        self._peak: tuple[float | None, float | None] | None = None  # (fp32 GFLOP/s, int8 GOP/s)
        self.device_id: str | None = None  # the physical device (inventory.device_identity), once known
        self.families_not_run: dict[str, str] = {}
        # the last job's view of the device (its load: _time_limit); kept here as well as in the
        # client's device_state because a reconnect makes a new client, which has seen no job yet
        self._device_state: dict[str, Any] = {}
        self._wall_s: dict[str, float] = {}  # candidate key -> its slowest verified job's wall time

    # ---- device access with bounded retries -------------------------------------------
    def _with_retries(self, fn, what: str):
        delay = 0.5
        for attempt in range(self.cfg.retries + 1):
            try:
                if self.client is None:
                    self.client = AgentClient(self.spec)
                return fn()
            except (HostKeyMismatch, AuthError):
                raise
            except DeviceError as exc:
                if attempt == self.cfg.retries:
                    raise DeviceError(f"{self.spec.name}: {what} failed after {self.cfg.retries + 1} tries: {exc}")
                self.progress({"event": "retry", "device": self.spec.name, "what": what, "error": str(exc),
                               "attempt": attempt + 1})
                try:
                    if self.client is not None:
                        self.client.close()
                except Exception:
                    pass
                self.client = None
                time.sleep(delay)
                delay *= 2

    def info(self) -> AgentInfo:
        return self._with_retries(lambda: self.client.provision(), "provisioning the agent")

    # ---- candidates ---------------------------------------------------------------------
    def candidates(self, model: Model, info: AgentInfo) -> list[tuple[Candidate, Any]]:
        out: list[tuple[Candidate, Any]] = []
        for name in self.cfg.spaces:
            try:
                space = load_space(name)
            except (KeyError, ImportError):
                continue
            why = space.unavailable(model, info) if hasattr(space, "unavailable") else None
            if why:
                self.families_not_run[name] = why
                self.progress({"event": "unavailable", "device": self.spec.name, "space": name, "reason": why})
                continue
            cands = (space.candidates(model, info, self.cfg.tvm_trials) if getattr(space, "wants_trials", False)
                     else space.candidates(model, info))
            if not self.cfg.accuracy.set and name not in APPROXIMATE_SPACES:
                # a family's approximate configurations cannot be selected without a budget: not raced.
                # Its approximate default still runs (it fails as approximate, which tells the user what
                # it is), and so does a space of approximate forms the user names (its accuracy reported)
                cands = [c for c in cands if c.baseline or not c.approximate]
            if self.cfg.max_candidates is not None:
                cands = cap_candidates(cands, self.cfg.max_candidates)
            out.extend((c, space) for c in cands)
        for cand, prepared in self.cfg.extra:
            out.append((cand, prepared))
        return out

    # ---- one job -------------------------------------------------------------------------
    def _time_limit(self, budget_ms: float, cand_key: str | None) -> float:
        """A job's time limit: the configured one plus its measuring budget, scaled by the load the
        device was under at its last job (1-minute load average per CPU, up to 8x), and never below
        three times what the same candidate's slowest job took: an honest job on a busy machine is
        slow, not hung."""
        base = self.cfg.timeout_s + budget_ms / 1e3 * 3
        load = self.load_factor()
        seen = self._wall_s.get(cand_key or "", 0.0)
        return max(base * load, 3.0 * seen)

    def load_factor(self) -> float:
        return load_factor(self.spec, self._device_state)

    def _job(self, wl: Workload, prep: Prepared, budget_ms: float, cand_key: str | None = None) -> JobResult:
        refs = wl.references()
        specs = [{"name": n, "dtype": str(r.dtype), "shape": list(r.shape)} for n, r in zip(wl.output_names, refs[0])]
        job = Job(backend=prep.backend, artifact=prep.artifact, params=prep.params, input_names=wl.input_names,
                  input_sets=wl.input_sets, output_specs=specs, model=prep.model, budget_ms=budget_ms,
                  warmup_ms=min(50.0, max(5.0, budget_ms / 5)), timeout_s=self._time_limit(budget_ms, cand_key),
                  # the device's bounds on a candidate (devices.toml: memory_mb, max_procs)
                  memory_mb=int(self.spec.options.get("memory_mb", MEMORY_MB)),
                  max_procs=int(self.spec.options.get("max_procs", MAX_PROCS)),
                  # an accelerator may take only part of the graph: ask where the nodes ran
                  placement=wants_placement(prep))
        res = self._with_retries(lambda: self.client.run_job(job), "running a job")
        if res.device_state:
            self._device_state = res.device_state
        if res.ok and cand_key:
            self._wall_s[cand_key] = max(self._wall_s.get(cand_key, 0.0), res.wall_ms / 1e3)
        return res

    def _verify(self, wl: Workload, res: JobResult, cand: Candidate | None = None) -> Verdict:
        info = self.info()
        if self._peak is None:  # once per device: a roofline needs the device's clock and ISA
            self._peak = device_peaks(self.client, info)
        # a lower precision's roofline: bf16/fp16 units do twice fp32's work a cycle, int8 its own peak
        precision = cand.param_dict.get("precision") if cand else None
        peak = self._peak[1] if precision == "int8" else self._peak[0]
        if precision in ("bf16", "fp16") and peak is not None:
            peak *= 2
        if cand and (cand.param_dict.get("execution_provider") in GPU_PROVIDERS
                     or cand.param_dict.get("device") == "cuda"):
            # a GPU candidate's roofline is its GPU's (stated tensor-core peak of its SM), not the CPU's
            sms = [g.get("sm") for g in info.fingerprint.get("gpus") or [] if isinstance(g, dict)]
            peak = max((p for p in map(gpu_peak_gflops, sms) if p), default=None)
        verdict = verify_job(res, wl.input_sets, wl.references(), wl.reference_for, wl.output_names,
                             flops=wl.flops(), peak_gflops=peak,
                             timings_trusted=not info.emulated,
                             approximate=bool(cand and cand.approximate), budget=self.cfg.accuracy)
        mismatch = check_precision(cand, res.backend_info) if cand is not None and res.ok else None
        if mismatch:  # verified or not, a run in another precision than its label is not that candidate
            return Verdict.failed(f"precision-mismatch: {mismatch}", code="precision-mismatch")
        return verdict

    # ---- one shape point -------------------------------------------------------------------
    def tune_shape(self, run_id: str, model: Model, info: AgentInfo, wl: Workload, cands: list[tuple[Candidate, Any]],
                   versions: dict, deadline: float) -> None:
        existing = {(r.candidate_key, r.round): r for r in self.store.records(run_id=run_id)
                    if r.shape_key == wl.shape_key}
        share_s = max(0.0, deadline - time.monotonic())  # this shape's share of the budget
        job_walls: list[float] = []  # seconds, every job this shape ran here
        prepared: dict[str, Prepared | str] = {}

        def prep(cand: Candidate, space: Any) -> Prepared | str:
            k = cand.key()
            if k not in prepared:
                if isinstance(space, Prepared):
                    prepared[k] = space
                else:
                    try:
                        extra: dict[str, Any] = {}
                        if getattr(space, "wants_spec", False):
                            extra["spec"] = self.spec
                        if getattr(space, "wants_hostwork", False):  # a build a Ray cluster may run
                            extra["hostwork"] = self.hostwork
                        if getattr(space, "wants_store", False):  # a build that records sessions of its own
                            extra["db"] = str(self.store.path)
                        if getattr(space, "wants_deadline", False):  # a conversion bounded by the budget
                            extra["deadline"] = deadline
                        if getattr(space, "wants_progress", False):  # long builds (tvm-tuned) report as they go
                            extra["progress"] = lambda ev, _label=cand.label(): self.progress(
                                {"event": "build", "device": self.spec.name, "shape": wl.shape_label,
                                 "candidate": _label, **ev})
                        prepared[k] = space.prepare(cand, wl, info, self.cache_dir, **extra)
                    except BuildFailed as exc:
                        prepared[k] = f"build failed: {exc}"
            return prepared[k]

        def run_one(cand: Candidate, space: Any, rnd: int, budget_ms: float, job_wl: Workload | None = None,
                    tags: dict[str, Any] | None = None) -> str | None:
            # job_wl: the inputs of this job (confirmation rounds run on new ones); tags: added to the
            # verdict JSON. Returns None when the job was verified (or is stored), else its reason
            job_wl = job_wl or wl
            tags = tags or {}
            key = cand.key()
            if (key, rnd) in existing:  # (counted in jobs_skipped when the run was taken up)
                self.progress({"event": "skip", "device": self.spec.name, "candidate": cand.label(), "round": rnd})
                return None
            p = prep(cand, space)
            t0 = time.perf_counter()
            if isinstance(p, str):
                res, verdict = JobResult("error", p), Verdict.failed(p)
            else:
                res = self._job(job_wl, p, budget_ms, key)
                verdict = self._verify(job_wl, res, cand)
            wall = res.wall_ms or (time.perf_counter() - t0) * 1e3
            if res.ok:
                own = sum(res.samples_ns) / 1e6
                self.overhead_ms.append(max(0.0, wall - own))
                job_walls.append(wall / 1e3)
            status = "verified" if verdict.ok else "failed"
            self.store.add_record(Record(
                run_id=run_id, workload_key=job_wl.key(), shape=wl.bindings, shape_key=wl.shape_key,
                fingerprint_key=info.fingerprint_key, candidate=cand.as_dict(),
                versions={**versions, "job_runtime": res.runtime_versions}, round=rnd, status=status,
                reason=verdict.reason, verdict={**verdict.as_dict(), "device_state": res.device_state,
                                                "measured_on": self.device_id, "fresh_seed": res.fresh_seed,
                                                "load_ms": res.load_ms, **tags,
                                                **({"placement": res.placement} if res.placement else {})},
                samples_ns=res.samples_ns, wall_ms=wall, agent_ms=res.agent_ms))
            self.jobs_run += 1
            existing[(key, rnd)] = None  # type: ignore[assignment]
            med = float(np.median(res.samples_ns)) / 1e6 if res.samples_ns else None
            self.progress({"event": "job", "device": self.spec.name, "shape": wl.shape_label,
                           "candidate": cand.label(), "round": rnd, "status": status, "reason": verdict.reason,
                           "median_ms": med, **tags})
            return None if verdict.ok else (verdict.reason or "failed")

        def per_job_budget(n_jobs: int, share: float, lo: float, hi: float) -> float:
            left_ms = max(0.0, (deadline - time.monotonic()) * 1e3 * share)
            over = float(np.median(self.overhead_ms)) if self.overhead_ms else 400.0
            return float(min(hi, max(lo, left_ms / max(1, n_jobs) - over)))

        # round 0: screen everything
        budget0 = per_job_budget(len(cands), 0.35, 20.0, 300.0)
        for cand, space in cands:
            run_one(cand, space, 0, budget0)

        # finalists: verified baselines + fastest verified others (decided from stored round-0 records)
        rows = [r for r in self.store.records(run_id=run_id) if r.shape_key == wl.shape_key and r.round == 0]
        ok = {r.candidate_key: float(np.median(r.samples_ns)) for r in rows if r.status == "verified" and r.samples_ns.size}
        by_key = {c.key(): (c, s) for c, s in cands}
        base = [k for k in ok if k in by_key and by_key[k][0].baseline]
        others = sorted((k for k in ok if k in by_key and not by_key[k][0].baseline), key=lambda k: ok[k])
        finalists = base + others[: self.cfg.finalists]
        # confirmation jobs are planned from the start so the race leaves them their share of the time:
        # every round up to the cap, since a real win of 1.2x on a noisy device needs the later looks
        # (a tune that stops at an earlier look just ends sooner)
        confirm_jobs = (self.cfg.confirm_rounds * min(3, len(base) + 1) if others or len(base) > 1 else 0)
        # the race: the one round loop (rounds.interleaved); a finalist that fails a round is out,
        # also one whose failure a resumed run finds stored
        out = {r.candidate_key: r.reason for r in existing.values()
               if r is not None and 0 < r.round and not is_confirmation(r.round) and r.status != "verified"}

        def race_budget(rnd: int) -> float:
            remaining_rounds = self.cfg.rounds - rnd + 1
            return per_job_budget(len(finalists) * remaining_rounds + confirm_jobs, 1.0, 30.0, 2000.0)

        confirming = any(is_confirmation(rnd) for _, rnd in existing)

        def race_goes_on(rnd: int) -> bool:
            # the race's later rounds yield to the confirmation, whose rounds make the verdict: one
            # more round only when the time it takes still leaves the confirmation its reserve. A run
            # taken up during its confirmation does not race again (it replays what it stored)
            if confirming:
                return False
            job_s = float(np.median(job_walls)) if job_walls else 0.0
            left = deadline - time.monotonic() - len(finalists) * job_s
            return left >= confirm_reserve(share_s, confirm_jobs, job_s)

        interleaved(finalists, self.cfg.rounds,
                    lambda k, rnd, budget: run_one(*by_key[k], rnd, budget), before_round=race_budget, out=out,
                    go_on=race_goes_on)
        self._confirm(run_id, wl, by_key, run_one, per_job_budget, deadline)

    def _confirm(self, run_id: str, wl: Workload, by_key: dict[str, tuple[Candidate, Any]],
                 run_one: Callable[..., None], per_job_budget: Callable[[int, float, float, float], float],
                 deadline: float) -> None:
        """Select, then confirm: replay the stored records (select.replay) to learn which rounds an
        uninterrupted run has walked and who runs in each, run (or, when stored, skip) their jobs on the
        round's new inputs, repeat until the replay is done. A resumed run so runs exactly the jobs
        an uninterrupted one would have, and skips those already stored. The rounds up to the first
        look always run (a verdict needs them); later ones, and a runner-up's, only while the shape's
        budget lasts: a confirmation cut short is judged at the rounds it has (select._level)."""
        ran: set[int] = set()
        first_look = looks(self.cfg.confirm_rounds)[0] if self.cfg.confirm_rounds else 0
        while True:
            rows = [r for r in self.store.records(run_id=run_id) if r.shape_key == wl.shape_key]
            time_left = time.monotonic() < deadline
            conf = replay(rows, self.cfg.confirm_rounds, extend=time_left)
            todo = [(k, order) for k, order in conf.walked if k not in ran]
            if not todo:  # done, or nothing new to run (never loop forever)
                return
            if not time_left and len(conf.rounds) >= first_look:
                return  # out of time past the first look: judged at the rounds there are
            for k, order in todo:
                seed = confirm_seed(self.cfg.seed, k)
                cwl = confirm_workload(wl, seed)
                # timing planned over the rounds left to the cap: more, shorter jobs. A round's
                # ratio carries the noise between processes, which only more rounds reduce; a
                # job's samples past a few dozen add little (docs/results/power.md)
                plan = max(self.cfg.confirm_rounds, len(conf.rounds) + 1)
                left = max(1, plan - len(conf.rounds)) * len(order)
                budget = per_job_budget(left, 1.0, 30.0, 2000.0)
                for key in order:
                    cand, space = by_key[key]
                    run_one(cand, space, stored_round(k), budget, job_wl=cwl, tags=confirm_tags(k, seed))
                ran.add(k)

    # ---- whole run ------------------------------------------------------------------------
    def tune(self, model: Model, points: list[dict[str, int]], user_inputs: Mapping[str, np.ndarray],
             command: str = "", join: dict[str, Any] | None = None) -> DeviceOutcome:
        """Tune on this device. Whatever ends it, the run is given back with a status that says
        how (complete, down, failed: <error>, interrupted), never left 'running'. Every failure is
        this device's outcome (the other devices go on); only a private home refused before any
        device work, an infrastructure StoreError and Ctrl-C end the whole command.

        The run's shape points are claimed one at a time (Store.claim_shape), so other processes,
        on other hosts and devices of the same hardware, can join it (``join``: the run's row):
        each point is measured once, by one process on one device. The run's holder ends it once
        every point is measured; a joiner that finds the holder gone takes the run up and ends it."""
        out = DeviceOutcome(self.spec.name, "down")
        self.cache_dir = home_subdir("artifacts")  # private: artifacts hold the user's model
        held_device = None
        holding = False
        claimed: str | None = None
        try:
            info = self.info()
            cands = self.candidates(model, info)
            if not cands:
                raise UserInputError(f"{self.spec.name}: no runtime on the device can run a {model.format} model "
                                     f"(device has: {', '.join(k for k in info.runtimes if k != 'numpy') or 'none'})")
            versions = run_versions(info)
            ui_key = hashlib.sha256(b"".join(a.tobytes() for a in user_inputs.values())).hexdigest()[:12]
            cand_keys = hashlib.sha256(json.dumps(sorted(c.key() for c, _ in cands)).encode()).hexdigest()[:16]
            run_id = run_key(self.spec.name, model, info, points, [c for c, _ in cands], self.cfg, ui_key, versions)
            if join is not None:
                run_id = join["id"]
                check_join(join, self.spec.name, info, versions, cand_keys, ui_key)
            elif self.cfg.fresh:
                run_id = hashlib.sha256(f"{run_id}{time.time_ns()}".encode()).hexdigest()[:16]

            def waiting(holder: str) -> None:  # an identical run is measuring this device: wait, then resume
                self.progress({"event": "wait", "device": self.spec.name, "run_id": run_id, "holder": holder,
                               "message": f"waiting for run {run_id} held by {holder}"})

            # the device itself: one process drives it at a time, whichever host and run (a lab's database)
            device_id = self.device_id = device_identity(self.spec)

            def device_busy(holder: str) -> None:
                self.progress({"event": "wait", "device": self.spec.name, "run_id": run_id, "holder": holder,
                               "message": f"waiting for device {device_id}, driven by {holder}"})

            self.store.acquire_device(device_id, run_id, on_wait=device_busy)
            held_device = device_id
            if join is None:
                existed = self.store.start_run(
                    run_id, str(model.path), model.sha256, self.spec.name, info.fingerprint_key,
                    {**info.fingerprint, "arch": info.arch}, versions,
                    {**self.cfg.key_dict(), "points": points, "command": command, "timeout_s": self.cfg.timeout_s,
                     "candidates": cand_keys, "inputs": ui_key},
                    on_wait=waiting)
                holding = True
            else:  # a run nobody holds now is taken up (resumed); a held one is helped
                holding, existed = self.store.take_run(run_id), True
                out.joined = not holding
            out.run_id, out.resumed = run_id, existed
            if existed:  # what the run had recorded when this process took it up: not measured again
                self.jobs_skipped = len(self.store.records(run_id=run_id))
            self.progress({"event": "start", "device": self.spec.name, "run_id": run_id, "resumed": existed,
                           "joined": out.joined, "candidates": len(cands), "points": len(points),
                           "total_jobs": len(points) * (len(cands) + self.cfg.rounds * (self.cfg.finalists + 2)
                                                         + self.cfg.confirm_rounds * 2)})
            start = time.monotonic()
            # host-side work on the model (references, FLOP count) counts against the budget too:
            # done for every shape point before the device's share of the budget is spent on them
            deadline = Deadline(start + self.cfg.budget_s, self.cfg.budget_s)
            workloads = {}
            remote = self.hostwork.remote  # references on the Ray cluster, all points at once
            for bindings in points:
                wl = build_workload(model, bindings, user_inputs, seed=self.cfg.seed,
                                    deadline=None if remote else deadline)
                wl.flops(deadline=deadline)
                workloads[wl.shape_key] = wl
            if remote:
                self.hostwork.references(list(workloads.values()), lambda: deadline.check("references"))
                for wl in workloads.values():  # the tvm-relax builds of every point begin there now
                    for cand, space in cands:
                        if hasattr(space, "prefetch"):
                            space.prefetch(cand, wl, info, self.cache_dir, self.hostwork)
            self.store.plan_shapes(run_id, list(workloads))
            waited = False
            while True:  # claim the next shape point nobody measures; each point's share of the budget
                claimed, busy = self.store.claim_shape(run_id, device_id)
                if claimed is not None:
                    share_end = start + self.cfg.budget_s * (len(out.shapes) + 1) / len(points)
                    self.tune_shape(run_id, model, info, workloads[claimed], cands, versions, share_end)
                    self.store.finish_shape(run_id, claimed)
                    out.shapes.append(claimed)
                    claimed = None
                    continue
                if busy == 0:
                    break
                if not holding:  # the rest is measured elsewhere: the run's holder ends it, unless it is gone
                    holding = self.store.take_run(run_id)
                    if not holding:
                        break
                    out.joined = False  # taken up: this process waits for the rest and ends the run
                if not waited:  # the holder waits for its joiners (a dead one's point is claimed again)
                    waited = True
                    self.progress({"event": "wait", "device": self.spec.name, "run_id": run_id, "holder": "",
                                   "joiners": True,
                                   "message": f"run {run_id}: waiting for {busy} shape point(s) measured by "
                                              f"other processes (a dead one's is claimed again when its lease runs out)"})
                time.sleep(WAIT_POLL_S)
            if not holding and busy == 0:  # every point measured and the holder gone: end the run here
                holding = self.store.take_run(run_id)
            out.summary = summarize_run(self.store, run_id)
            if holding:
                out.summary.status = "complete"
                self.store.finish_run(run_id, out.summary.as_dict())
                out.status = "complete"
                out.joined = False
            else:
                out.status = "joined"
        except Exception as exc:
            out.status = "down"
            out.error = outcome_error(exc)
            self.progress({"event": "down", "device": self.spec.name, "error": out.error})
            self._release_shape(out.run_id, claimed)
            if out.run_id and holding:
                self._give_back(out, "down" if isinstance(exc, DeviceError) else f"failed: {out.error}")
            if isinstance(exc, StoreError) and not isinstance(exc, LeaseLost):
                raise  # the database failed: every device's results go there
        except BaseException:  # Ctrl-C, SystemExit: give the run back, then stop everything
            self._release_shape(out.run_id, claimed)
            if out.run_id and holding:
                self._give_back(out, "interrupted")
            raise
        finally:
            out.jobs_run, out.jobs_skipped = self.jobs_run, self.jobs_skipped
            out.families_not_run = dict(self.families_not_run)
            if self.hostwork.remote:
                out.host_work = {"ray": self.hostwork.address, "workers": sorted(map(list, self.hostwork.workers))}
            if held_device is not None:
                try:
                    self.store.release_device(held_device)
                except StoreError:
                    pass  # its lease runs out by itself
            if self.client is not None:
                try:
                    self.client.close()
                except Exception:
                    pass
        return out

    def _release_shape(self, run_id: str | None, shape_key: str | None) -> None:
        """Give back the shape point being measured when the tune ended (it stays pending: whoever
        claims it next resumes it, skipping what was recorded)."""
        if run_id and shape_key:
            try:
                self.store.release_shape(run_id, shape_key)
            except StoreError:
                pass  # its lease runs out by itself

    def _give_back(self, out: DeviceOutcome, status: str) -> None:
        """Release an unfinished run with ``status`` and keep what summary its records give."""
        try:
            out.summary = summarize_run(self.store, out.run_id)
        except Exception:
            out.summary = None
        status = status[:500]
        if out.summary is not None:
            out.summary.status = status
        try:
            self.store.release_run(out.run_id, status, out.summary.as_dict() if out.summary else None)
        except Exception:
            pass  # lost to another holder, or the database failed: its lease runs out, this host takes it over


def tune(model_path: str | os.PathLike, devices: Sequence[str] = ("local"), *, dims: Sequence[str] = (),
         sweeps: Sequence[str] = (), inputs: Sequence[str] = (), db: str | os.PathLike | None = None,
         config: TuneConfig | None = None, inventory: Inventory | None = None,
         progress: ProgressFn | None = None, command: str = "",
         points: Sequence[Mapping[str, int]] | None = None, join: str | None = None) -> TuneOutcome:
    """Tune MODEL on each device (in parallel). Bad input raises UserInputError before any device work.
    ``points``: the shape points themselves (e.g. a decoder's prefill and decode step, which are not
    a product of dims), instead of the ones ``dims`` and ``sweeps`` span.
    ``join``: a run recorded in ``db`` (another host's, say) to measure on these devices too: its
    settings and shape points are the run's; each device claims the points nobody measures yet."""
    cfg = config or TuneConfig()
    if isinstance(devices, str):
        devices = [devices]
    joined = None
    if join is not None:
        st = Store(db, create=False)
        try:
            joined = st.get_run(join)
        finally:
            st.close()
        if joined is None:
            raise UserInputError(f"no run '{join}' to join in the database")
        if joined["status"] == "complete":
            raise UserInputError(f"run {join} is complete: there is nothing left to join")
        cfg, points = join_config(joined, cfg)
    deadline = Deadline.after(cfg.budget_s)  # loading and checking the model on the host count too
    model = load_model(model_path, deadline=deadline)
    if joined is not None and model.sha256 != joined["model_sha256"]:
        raise UserInputError(f"{model_path} is not the model of run {join} (sha256 {model.sha256[:12]}…, the run's "
                             f"{joined['model_sha256'][:12]}…)")
    dim_values = parse_dims(dims, model)
    sweep_values = parse_sweeps(sweeps, model)
    user_inputs = load_user_inputs(inputs)
    for spec in model.inputs:  # user data binds the dynamic dims it fixes, unless given explicitly
        arr = user_inputs.get(spec.name)
        if arr is None or arr.ndim != len(spec.dims):
            continue
        for d, n in zip(spec.dims, arr.shape):
            if isinstance(d, str) and d not in dim_values and d not in sweep_values:
                dim_values[d] = int(n)
    points = [dict(p) for p in points] if points is not None else shape_points(model, dim_values, sweep_values)
    for p in points:  # validate every shape point on the host before touching a device
        build_workload(model, p, user_inputs, n_seeded=1, seed=cfg.seed, deadline=deadline)
    inv = inventory or Inventory()
    specs = [inv.get(d) for d in dict.fromkeys(devices)]
    hostwork = HostWork(cfg.ray)  # a cluster it cannot use is refused before anything is written
    try:
        store = Store(db)
    except BaseException:
        hostwork.close()
        raise
    lock = threading.Lock()

    def safe_progress(ev: dict[str, Any]) -> None:
        if progress:
            with lock:
                progress(ev)

    outcomes: list[DeviceOutcome | None] = [None] * len(specs)
    errors: list[BaseException] = []

    def work(i: int, spec: DeviceSpec) -> None:
        # one device's failure is that device's outcome; the others go on
        try:
            outcomes[i] = DeviceTuner(spec, store, cfg, safe_progress, hostwork=hostwork).tune(
                model, points, user_inputs, command, join=joined)
        except (UserInputError, StoreError) as exc:  # before device work, or the database: the whole command
            errors.append(exc)
        except Exception as exc:  # a bug outside DeviceTuner.tune's own net
            outcomes[i] = DeviceOutcome(spec.name, "down", outcome_error(exc))
            safe_progress({"event": "down", "device": spec.name, "error": outcomes[i].error})
        except BaseException as exc:  # surfaced in the caller's thread
            errors.append(exc)

    try:
        if len(specs) == 1:
            work(0, specs[0])
        else:
            threads = [threading.Thread(target=work, args=(i, s), daemon=True) for i, s in enumerate(specs)]
            for t in threads:
                t.start()
            for t in threads:
                while t.is_alive():
                    t.join(0.2)
        if errors:
            raise errors[0]
    finally:
        hostwork.close()
        store.close()
    return TuneOutcome(str(model.path), [o for o in outcomes if o is not None])
