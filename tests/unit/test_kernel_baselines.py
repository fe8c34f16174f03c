"""The strongest baseline of a tuned kernel (DESIGN.md §4.5) and independent references of fused tasks.

No device, no farm: the final rounds of ``kernels.session`` run against in-process fakes of the
agents (onnxruntime, the numpy adapter and LiteRT executed here, on exactly the artifacts and
inputs the session would send), so the tests check what is BUILT and DECIDED — the constant-weight
forms hold the kernel's weights, the verdict's baseline is the fastest verified form, a failing form
is recorded and never used — never that anything is faster (timings here are synthetic).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import importlib.util
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import require_module

from edgetune.agent.bundle import python_agent  # noqa: E402
from edgetune.kernels import baselines as B  # noqa: E402
from edgetune.kernels import session as S  # noqa: E402
from edgetune.kernels.search import KernelRun  # noqa: E402
from edgetune.kernels.workloads import parse_workload  # noqa: E402
from edgetune.measure import round_median, round_ratio  # noqa: E402
from edgetune.ops import forms as F  # noqa: E402
from edgetune.ops.base import FormView  # noqa: E402

DW = "depthwise_conv2d_nchw:N=1,C=8,H=12,W=12,R=3,S=3,stride=2,pad=1"
GEMM = "gemm:M=16,N=24,K=8"


def _sha(a) -> str:
    return hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()


# ---------------------------------------------------------------------------------------------
# In-process fakes of the agents
# ---------------------------------------------------------------------------------------------

# synthetic per-iteration times (ns) by participant: what the verdict must pick from
SPEEDS = {"kernel": 60, "ort-constant": 100, "ort-runtime": 50, "numpy": 30, "tflite": 80}


def _samples(who: str, rnd: int) -> list[int]:
    base = SPEEDS[who] * (1.0 + 0.05 * rnd)  # drift between rounds hits everyone alike
    return [int(base * (1 + 0.001 * i)) for i in range(21)]


def _key_of(job) -> str:
    if job.backend == "ort":
        return "ort-constant" if "ort-constant" in job.artifact.name else "ort-runtime"
    return "numpy" if job.backend == "adapter" else "tflite"


AGENT = python_agent()  # the one file a device runs, bundled from device_agents/python/edgetune_agent/


def _agent_module(workdir: Path):
    """The Python agent, from a copy in ``workdir`` (W/agent/edgetune_agent.py, as a device has it:
    torch.compile's caches go to W/cache, never into this repository)."""
    import shutil

    where = workdir / "agent" / "edgetune_agent.py"
    where.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(AGENT, where)
    spec = importlib.util.spec_from_file_location("edgetune_agent_baselines_test", where)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _execute(job) -> list[np.ndarray]:
    """Run the artifact the session built, on the inputs it sent, the way the agent's backend would."""
    xs = job.input_sets[0]
    if job.backend == "torch":  # the agent's own backend class, as its run loop drives it
        outs = [s.as_json() for s in job.outputs]
        b = _agent_module(Path(job.artifact).parent / "W").TorchBackend(str(job.artifact), job.params,
                                                                        job.input_names, outs)
        work = [x.copy() for x in xs]
        b.stage(work)
        b.poison()
        b.run(work)
        return b.results()
    if job.backend == "ort":
        import onnxruntime as ort

        sess = ort.InferenceSession(str(job.artifact), providers=["CPUExecutionProvider"])
        return sess.run(None, dict(zip(job.input_names, xs)))
    if job.backend == "adapter":
        spec = importlib.util.spec_from_file_location("edgetune_test_adapter", job.artifact)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return [np.array(o) for o in mod.load(str(job.artifact), job.params)(xs)]
    from ai_edge_litert.interpreter import Interpreter

    it = Interpreter(model_path=str(job.artifact), num_threads=int(job.params.get("num_threads", 1)))
    it.allocate_tensors()
    for d, a in zip(it.get_input_details(), xs):
        it.set_tensor(d["index"], a)
    it.invoke()
    return [np.array(it.get_tensor(d["index"])) for d in it.get_output_details()]


class FakeAgents:
    """``measure`` (the kernel agent: kernel runs and native onnxruntime jobs) and the Python agent."""

    def __init__(self, w, wrong: set[str] = frozenset(), crash: set[str] = frozenset()):
        self.w, self.wrong, self.crash = w, set(wrong), set(crash)
        self.num_threads = 1
        self.device_error = None
        self.kernel_inputs: list[list[np.ndarray]] = []
        self.jobs: list = []
        self.sent_artifacts: list[tuple[str, bytes]] = []  # what each job carried (removed after the rounds)
        self.order: list[str] = []

    # the kernel (DeviceMeasure.__call__)
    def __call__(self, artifact, inputs, output_specs):
        self.kernel_inputs.append([x.copy() for x in inputs])
        self.order.append("kernel")
        rnd = len(self.kernel_inputs)
        outs = [np.asarray(r, np.float32) for r in self.w.reference(inputs)]
        return KernelRun("ok", reason="", samples_ns=_samples("kernel", rnd), outputs=outs,
                         repeat_outputs=[o.copy() for o in outs], load_ms=1.0)

    def _job(self, job):
        from edgetune.agent.host import JobResult

        who = _key_of(job)
        self.jobs.append(job)
        self.sent_artifacts.append((who, job.artifact.read_bytes()))
        self.order.append(who)
        if who in self.crash:
            return JobResult("crashed", "crashed: agent killed by SIGSEGV")
        outs = [np.asarray(o, np.float32) for o in _execute(job)]
        if who in self.wrong:  # a buggy baseline: off by 1% everywhere
            outs = [o * np.float32(1.01) for o in outs]
        h = [_sha(a) for a in job.input_sets[0]]
        return JobResult("ok", samples_ns=_samples(who, len(self.kernel_inputs)), outputs=[outs],
                         repeat_outputs=[o.copy() for o in outs], input_sha256_before=h, load_ms=1.0)

    def run_job(self, job):  # native agent: onnxruntime
        assert job.backend == "ort"
        return self._job(job)


class FakePython:
    def __init__(self, agents: FakeAgents):
        self.agents = agents

    def run_job(self, job):
        assert job.backend in ("adapter", "tflite")
        return self.agents._job(job)


class FakeStore:
    def __init__(self):
        self.records: list[dict] = []

    def add_record(self, record):  # a Record, kept as its fields
        self.records.append({f.name: getattr(record, f.name) for f in dataclasses.fields(record)})
        return len(self.records)


def _simple_verify(run, workload, inputs, reference, rtol=1e-4):
    """A plain check (the real verifier is tested elsewhere): ok, shape and values within tolerance."""
    if run.status != "ok":
        return False, f"{run.status}: {run.reason}", None, None
    for out, ref in zip(run.outputs, reference):
        ref = np.asarray(ref, np.float64)
        err = float(np.abs(np.asarray(out, np.float64) - ref).max())
        if out.shape != ref.shape or err > rtol * float(np.abs(ref).max()):
            return False, f"wrong output: max error {err:.3g}", err, None
    return True, "", 0.0, 0.0


def _to_kernel_run(res, inputs, output_specs):
    if res.status != "ok":
        return KernelRun(res.status if res.status in ("error", "crashed", "timeout") else "error", reason=res.reason)
    assert res.input_sha256_before == [_sha(x) for x in inputs]  # the form was sent exactly these inputs
    return KernelRun("ok", reason="", samples_ns=list(res.samples_ns), outputs=list(res.outputs[0]),
                     repeat_outputs=list(res.repeat_outputs), load_ms=res.load_ms)


def _finish(tmp_path, monkeypatch, spec, rounds=3, wrong=(), crash=(), python=True, tflite=True):
    from edgetune.kernels import device_measure
    from edgetune.kernels.search import TuneOutcome

    monkeypatch.setattr(S, "check_kernel_run", _simple_verify)
    monkeypatch.setattr(device_measure, "job_to_kernel_run", _to_kernel_run)
    w = parse_workload(spec)
    agents = FakeAgents(w, set(wrong), set(crash))
    art = tmp_path / "kernel.so"
    art.write_bytes(b"not a real kernel: the fake agent computes the reference")
    out = TuneOutcome(workload_key=w.key(), target_key="llvm-test", best_gflops=1.0, best_latency_ns=1.0,
                      artifact_path=art, records=[], verified=True)

    class Info:
        runtimes = {"tflite": "test"} if tflite else {}

    dev = B.BaselineDevice(native_ort=True, python=FakePython(agents) if python else None,
                           python_info=Info() if python else None,
                           python_reason="" if python else "no Python with numpy on the device", num_threads=1)
    cfg = S.KernelSessionConfig(rounds=rounds, budget_ms=5.0)
    store = FakeStore()
    res = S._finish_workload(store, "krun", w, w.spec(), out, agents, dev, cfg, "fp", {"edgetune": "test"},
                             {"kind": "llvm"}, None, None)
    return w, res, agents, store


# ---------------------------------------------------------------------------------------------
# The constant-weight form is built from the weights the kernel receives
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("spec", [DW, GEMM])
def test_constant_weight_form_holds_exactly_the_kernels_weights(tmp_path, monkeypatch, spec):
    require_module("onnxruntime")
    import onnx
    from onnx import numpy_helper

    w, res, agents, store = _finish(tmp_path, monkeypatch, spec, rounds=3, python=False)
    assert res.verified, res.reason
    (wi,) = F.weight_inputs(w)
    # the kernel got the same weight values in every round, and new activations each round
    kernel_weights = [x[wi] for x in agents.kernel_inputs]
    assert len(kernel_weights) == 3 and all(np.array_equal(kernel_weights[0], k) for k in kernel_weights)
    acts = [x[0] for x in agents.kernel_inputs]
    assert not np.array_equal(acts[0], acts[1]) and not np.array_equal(acts[1], acts[2])
    const_jobs = [j for j in agents.jobs if _key_of(j) == "ort-constant"]
    runtime_jobs = [j for j in agents.jobs if _key_of(j) == "ort-runtime"]
    assert len(const_jobs) == 3 and len(runtime_jobs) == 3
    # the model the constant form actually ran, in every round: its initializer IS the kernel's weight
    sent = [onnx.load_model_from_string(b) for who, b in agents.sent_artifacts if who == "ort-constant"]
    assert len(sent) == 3
    for model in sent:
        (init,) = model.graph.initializer
        assert init.name == w.inputs[wi].name
        assert np.array_equal(numpy_helper.to_array(init), kernel_weights[0])
        assert [i.name for i in model.graph.input] == [w.inputs[0].name]  # only the activation is an input
    for model in (onnx.load_model_from_string(b) for who, b in agents.sent_artifacts if who == "ort-runtime"):
        assert not model.graph.initializer and len(model.graph.input) == 2
    for k, job in enumerate(const_jobs):  # the constant form is sent the activation only, the same one
        assert job.input_names == [w.inputs[0].name] and len(job.input_sets[0]) == 1
        assert np.array_equal(job.input_sets[0][0], acts[k])
    for k, job in enumerate(runtime_jobs):  # the runtime form gets both, the weights being the kernel's
        assert np.array_equal(job.input_sets[0][1], kernel_weights[0])
    # the records say which weights: one sha for every participant of every round
    shas = {json_sha for r in store.records for json_sha in [str(r["verdict"].get("weights_sha256"))]}
    assert len(shas) == 1


def test_form_view_refuses_other_weights():
    w = parse_workload(GEMM)
    weights = S.final_weights(w)
    view = FormView(w, weights, tag="ort-constant")
    xs = S.final_inputs(w, 1, weights)
    assert [x.shape for x in view.to_form(xs)] == [(16, 8)]
    other = [xs[0], xs[1] + 1.0]
    with pytest.raises(ValueError, match="differs from the weights"):
        view.to_form(other)
    # its reference is the operator's, with its constant weights put back
    (ref,) = view.reference(view.to_form(xs))
    assert np.allclose(ref, w.reference(xs)[0])


def test_batch_matmul_has_no_constant_form_and_a_correct_transposed_one(tmp_path):
    require_module("onnxruntime")
    import onnxruntime as ort

    w = parse_workload("batch_matmul:B=2,M=4,N=6,K=3,TB=1")
    assert F.weight_inputs(w) == () and S.final_weights(w) == {}
    dev = B.BaselineDevice(native_ort=True, num_threads=1, python_reason="none here")
    forms, skipped = B.baseline_forms(w, {}, tmp_path, dev)
    assert [f.key for f in forms] == ["ort-runtime"]
    assert {s["form"]: s["reason"] for s in skipped}["ort-constant"].startswith("batch_matmul has no weight operand")
    xs = w.random_inputs(5)
    sess = ort.InferenceSession(str(forms[0].artifact), providers=["CPUExecutionProvider"])
    (y,) = sess.run(None, {"A": xs[0], "B": xs[1]})
    assert np.allclose(y, w.reference(xs)[0], rtol=1e-4, atol=1e-4)


# ---------------------------------------------------------------------------------------------
# The verdict is against the fastest verified form; failed forms are recorded, never used
# ---------------------------------------------------------------------------------------------


def test_verdict_baseline_is_the_fastest_verified_form_and_a_wrong_form_is_not_used(tmp_path, monkeypatch):
    require_module("onnxruntime")
    tfl = importlib.util.find_spec("ai_edge_litert") is not None
    # numpy is the fastest of all (30 ns) but wrong: it must be recorded as failed and not be the baseline
    w, res, agents, store = _finish(tmp_path, monkeypatch, DW, rounds=3, wrong={"numpy"}, tflite=tfl)
    assert res.verified, res.reason
    b = res.baseline
    forms = {f["form"]: f for f in b["forms"]}
    assert forms["numpy"]["status"] == "failed" and "wrong output" in forms["numpy"]["reason"]
    assert forms["numpy"]["strongest"] is False and forms["numpy"]["gflops"] is None
    verified = {k: f for k, f in forms.items() if f["status"] == "verified"}
    assert {"ort-constant", "ort-runtime"} <= set(verified) and ("tflite" in verified) == tfl
    fastest = min(verified.values(), key=lambda f: f["median_ns"])
    assert b["form"] == fastest["form"] == "ort-runtime" and fastest["strongest"] is True
    assert sum(f["strongest"] for f in b["forms"]) == 1
    # the verdict: round_ratio over the same rounds, kernel vs that form
    def recorded(form):
        return {r["round"]: np.asarray(r["samples_ns"]) for r in store.records
                if r["verdict"].get("form", "kernel") == form}

    base, kern = recorded("ort-runtime"), recorded("kernel")
    ratio = round_ratio([(base[r], kern[r]) for r in (1, 2, 3)])  # pairs of the SAME round
    assert b["speedup"] == pytest.approx(ratio.value) and b["ci95"] == pytest.approx([ratio.ci_low, ratio.ci_high])
    assert b["verdict"] == ratio.verdict and b["rounds"] == 3 and b["method"] == ratio.method
    assert b["median_ns"] == pytest.approx(round_median([base[r] for r in (1, 2, 3)]))
    assert res.median_ns == pytest.approx(round_median([kern[r] for r in (1, 2, 3)]))
    # every form's figures are listed; its own ratio too
    for f in verified.values():
        assert f["gflops"] == pytest.approx(w.flops() / f["median_ns"]) and f["rounds"] == 3
    # records: numpy failed once and was not run again; every verified form once per round
    by_form: dict[str, list] = {}
    for r in store.records:
        by_form.setdefault(r["verdict"].get("form", "kernel"), []).append((r["round"], r["status"]))
    assert by_form["numpy"] == [(1, "failed")]
    for key in verified:
        assert by_form[key] == [(1, "verified"), (2, "verified"), (3, "verified")]
    assert [x for x in by_form["kernel"]] == [(1, "verified"), (2, "verified"), (3, "verified")]
    numpy_rec = [r for r in store.records if r["verdict"].get("form") == "numpy"][0]
    assert numpy_rec["candidate"]["backend"] == "numpy" and numpy_rec["candidate"]["baseline"] is True
    const_rec = [r for r in store.records if r["verdict"].get("form") == "ort-constant"][0]
    assert const_rec["candidate"]["params"] == {"weights": "constant"} and const_rec["candidate"]["backend"] == "ort"


def test_crashing_form_is_failed_and_rounds_rotate_the_order(tmp_path, monkeypatch):
    require_module("onnxruntime")
    w, res, agents, store = _finish(tmp_path, monkeypatch, GEMM, rounds=4, crash={"ort-runtime"}, python=False)
    b = res.baseline
    forms = {f["form"]: f for f in b["forms"]}
    assert forms["ort-runtime"]["status"] == "failed" and "crashed" in forms["ort-runtime"]["reason"]
    assert b["form"] == "ort-constant"  # the only verified form
    assert forms["numpy"]["status"] == "unavailable" and "Python" in forms["numpy"]["reason"]
    # rotation K C R | C R K | R K C | K C R, with R (crashed in round 1) not run again
    K, C, R = "kernel", "ort-constant", "ort-runtime"
    assert agents.order == [K, C, R, C, K, K, C, K, C]
    rec = [(r["round"], r["verdict"].get("form", "kernel"), r["status"]) for r in store.records]
    assert (1, R, "failed") in rec and not [x for x in rec if x[1] == R and x[0] > 1]


def test_no_verdict_below_three_rounds(tmp_path, monkeypatch):
    require_module("onnxruntime")
    w, res, agents, store = _finish(tmp_path, monkeypatch, GEMM, rounds=2, python=False)
    assert res.baseline["speedup"] is not None and res.baseline["verdict"] == "insufficient rounds"


def test_strongest_baseline_pure():
    w = parse_workload(GEMM)

    def form(key):
        return B.BaselineForm(key, key, S.Candidate.make("x", {"f": key}, baseline=True), "native", "ort",
                              Path("/nonexistent"), FormView(w, {}, tag=key))

    k = [np.array([100, 101, 102]), np.array([110, 111, 112]), np.array([105, 106, 107])]
    groups = {"a": [np.array([90, 91]), np.array([95, 96]), np.array([93, 94])],
              "b": [np.array([80]), np.array([85]), np.array([500])],  # one slow round: the median of rounds holds
              "c": [np.array([10]), np.array([10]), np.array([10])]}  # fastest, but failed
    out = S.strongest_baseline([form("a"), form("b"), form("c")], [{"form": "d", "label": "d", "status": "unavailable",
                                                                     "reason": "not here"}],
                               groups, {"c": "wrong output"}, k, w.flops(), round_ratio)
    rows = {r["form"]: r for r in out["forms"]}
    assert out["form"] == "b" and rows["b"]["strongest"] and rows["b"]["median_ns"] == 85.0
    assert rows["c"]["status"] == "failed" and rows["d"]["status"] == "unavailable"
    assert out["rounds"] == 3 and out["verdict"] in ("faster", "slower", "no significant difference")
    none = S.strongest_baseline([form("c")], [], groups, {"c": "wrong output"}, k, w.flops(), round_ratio)
    assert none["speedup"] is None and "wrong output" in none["reason"]


def test_tflite_and_numpy_forms_compute_the_operator(tmp_path):
    """Every form of every operator kind, run here as its agent would, matches the float64 reference."""
    require_module("onnxruntime")
    tfl = importlib.util.find_spec("ai_edge_litert") is not None

    class Info:
        runtimes = {"tflite": "x"} if tfl else {}

    dev = B.BaselineDevice(True, "", python=object(), python_info=Info(), num_threads=1)
    specs = [GEMM, DW, "batch_matmul:B=2,M=4,N=6,K=3", "conv2d_nchw:N=1,C=4,H=9,W=9,K=6,R=3,S=3,stride=2,pad=1",
             "conv2d_nchw:N=2,C=4,H=6,W=6,K=5,R=1,S=1", "conv2d_nhwc:N=1,C=4,H=7,W=7,K=6,R=3,S=3,stride=1,pad=1",
             "depthwise_conv2d_nchw:N=1,C=4,H=8,W=8,R=3,S=3,stride=1,pad=1"]
    for spec in specs:
        w = parse_workload(spec)
        weights = S.final_weights(w)
        forms, skipped = B.baseline_forms(w, weights, tmp_path, dev)
        keys = {f.key for f in forms}
        assert {"ort-runtime", "numpy"} <= keys and (("tflite" in keys) == tfl), (spec, skipped)
        xs = S.final_inputs(w, 1, weights)
        ref = w.reference(xs)
        for f in forms:
            fin = f.view.to_form(xs)

            class J:
                backend, artifact, params, input_names, input_sets = (f.backend, f.artifact, f.params,
                                                                      [s.name for s in f.view.inputs], [fin])
            outs = _execute(J)
            want = f.view.outputs_to_form(ref)
            assert [o.shape for o in outs] == [tuple(s.shape) for s in f.view.outputs], (spec, f.key)
            for o, r in zip(outs, want):
                assert np.abs(o - r).max() <= 1e-4 * np.abs(r).max(), (spec, f.key)


def test_float16_matmuls_are_held_to_float32_accumulation_and_so_are_their_forms(tmp_path):
    """gemm/batch_matmul with dtype=float16: float16 operands, float32 accumulation and output (what
    tensor cores compute). The spec round-trips; the TVM compute, the onnxruntime forms (operands
    widened: ONNX's float16 MatMul would return float16) and the numpy form (a float32 loop) all
    match the float64 reference within float32's tolerance, where numpy's own float16 loop does
    not; other ops refuse float16."""
    require_module("onnxruntime")
    import tvm

    from edgetune.errors import UserInputError

    class Info:
        runtimes = {}

    dev = B.BaselineDevice(True, "", python=object(), python_info=Info(), num_threads=1)
    for spec in ("gemm:M=33,N=20,K=300,dtype=float16", "batch_matmul:B=2,M=9,N=7,K=200,TB=1,dtype=float16"):
        w = parse_workload(spec)
        assert w.spec() == spec and parse_workload(w.spec()) == w and w.key() == spec
        assert [s.dtype for s in w.inputs] == ["float16"] * 2 and w.outputs[0].dtype == "float32"
        weights = S.final_weights(w)
        xs = S.final_inputs(w, 1, weights)
        ref = w.reference(xs)[0]
        lib = tvm.compile(tvm.IRModule({"main": w.prim_func()}), target="llvm")
        args = [tvm.runtime.tensor(x) for x in xs] + [tvm.runtime.tensor(np.zeros(ref.shape, np.float32))]
        lib["main"](*args)
        assert np.abs(args[-1].numpy() - ref).max() <= 1e-5 * np.abs(ref).max()
        forms, skipped = B.baseline_forms(w, weights, tmp_path, dev)
        assert {f.key for f in forms} >= {"ort-runtime", "numpy"}, skipped
        for f in forms:
            if f.view.out_dtype == "float16":  # the float16 MatMul itself (test_a_float16_matmul_on_a_gpu_...)
                continue

            class J:
                backend, artifact, params, input_names, input_sets = (f.backend, f.artifact, f.params,
                                                                      [s.name for s in f.view.inputs],
                                                                      [f.view.to_form(xs)])
            out = _execute(J)[0]
            assert out.dtype == np.float32 and np.abs(out - ref).max() <= 1e-5 * np.abs(ref).max(), (spec, f.key)
        if w.op == "gemm":  # what the numpy form avoids: float16 accumulation is far off
            y = np.empty(ref.shape, np.float32)
            np.matmul(xs[0], xs[1], out=y)
            assert np.abs(y - ref).max() > 1e-4 * np.abs(ref).max()
    with pytest.raises(UserInputError, match="dtype 'float16' not supported"):
        parse_workload("softmax:M=4,N=8,dtype=float16")
    with pytest.raises(UserInputError, match="not supported"):
        parse_workload("gemm:M=4,N=8,K=2,dtype=bfloat16")


def test_a_gpu_device_gets_onnxruntime_cuda_forms_and_a_cpu_device_none(tmp_path):
    """On a device with a GPU whose onnxruntime has the CUDA provider, cuBLAS/cuDNN through onnxruntime
    are baseline forms (GPU memory bound, TF32 off: fp32 against fp32); without the provider they are
    named unavailable; a CPU device has no GPU forms at all. The forms' models compute the operator
    (run here by the CPU provider: what differs on the GPU is where, not what)."""
    require_module("onnxruntime")

    def info(providers, gpus):
        return type("Info", (), {"runtimes": {"onnxruntime_providers": providers},
                                 "fingerprint": {"gpus": gpus} if gpus else {}})()

    h200 = [{"name": "NVIDIA H200", "sm": "sm_90"}]
    w = parse_workload(GEMM)
    weights = S.final_weights(w)
    gpu = B.BaselineDevice(True, "", python=object(), num_threads=1,
                           python_info=info(["TensorrtExecutionProvider", "CUDAExecutionProvider",
                                             "CPUExecutionProvider"], h200))
    forms, skipped = B.baseline_forms(w, weights, tmp_path, gpu)
    cuda = {f.key: f for f in forms if f.key.startswith("ort-cuda")}
    assert set(cuda) == {"ort-cuda-constant", "ort-cuda-runtime"}, (forms, skipped)
    xs = S.final_inputs(w, 1, weights)
    ref = w.reference(xs)
    for f in cuda.values():
        assert (f.agent, f.backend) == ("python", "ort") and f.candidate.baseline
        assert f.params == {"execution_provider": "CUDAExecutionProvider", "io_binding": "device",
                            "provider_options": {"use_tf32": "0"}}

        class J:
            backend, artifact, params, input_names, input_sets = (f.backend, f.artifact, f.params,
                                                                  [s.name for s in f.view.inputs], [f.view.to_form(xs)])
        out = _execute(J)[0]
        assert np.abs(out - f.view.outputs_to_form(ref)[0]).max() <= 1e-4 * np.abs(ref[0]).max()
    no_ep = B.BaselineDevice(True, "", python=object(), num_threads=1,
                             python_info=info(["CPUExecutionProvider"], h200))
    forms, skipped = B.baseline_forms(w, weights, tmp_path, no_ep)
    assert not [f for f in forms if f.key.startswith("ort-cuda")]
    assert {s["form"]: s["reason"] for s in skipped if s["form"].startswith("ort-cuda")} == {
        "ort-cuda-constant": "the device's onnxruntime has no CUDAExecutionProvider (onnxruntime-gpu)",
        "ort-cuda-runtime": "the device's onnxruntime has no CUDAExecutionProvider (onnxruntime-gpu)"}
    cpu = B.BaselineDevice(True, "", python=object(), num_threads=1, python_info=info(["CPUExecutionProvider"], []))
    forms, skipped = B.baseline_forms(w, weights, tmp_path, cpu)
    assert not [x for x in [*(f.key for f in forms), *(s["form"] for s in skipped)] if x.startswith("ort-cuda")]



def test_a_float16_matmul_on_a_gpu_races_cublas_in_float16(tmp_path):
    """A float16 GEMM (float32 accumulation and output) on a GPU device: besides the widened forms
    (a float32 GEMM: no baseline for tensor cores), onnxruntime's float16 MatMul, float16 output,
    runs on the CUDA provider (cuBLAS's tensor-core GEMM) and on the device's CPU. Its model has no
    widening Cast, its output is float16, and the verifier holds it to float16's tolerance against
    the same float64 reference; a float32 operator gets no such form."""
    require_module("onnxruntime")
    import onnx

    from edgetune.verify import tolerance_for

    info = type("Info", (), {"runtimes": {"onnxruntime_providers": ["CUDAExecutionProvider", "CPUExecutionProvider"]},
                             "fingerprint": {"gpus": [{"name": "NVIDIA H200", "sm": "sm_90"}]}})()
    gpu = B.BaselineDevice(True, "", python=object(), num_threads=1, python_info=info)
    w = parse_workload("gemm:M=24,N=40,K=56,dtype=float16")
    weights = S.final_weights(w)
    forms, _ = B.baseline_forms(w, weights, tmp_path, gpu)
    by = {f.key: f for f in forms}
    assert {"ort-fp16-runtime", "ort-cuda-fp16-runtime", "ort-cuda-runtime", "ort-runtime"} <= set(by), set(by)
    xs = S.final_inputs(w, 1, weights)
    ref = w.reference(xs)
    for key in ("ort-fp16-runtime", "ort-cuda-fp16-runtime"):
        f = by[key]
        assert f.candidate.param_dict["output"] == "float16" and [o.dtype for o in f.view.outputs] == ["float16"]
        model = onnx.load(str(f.artifact))
        assert [n.op_type for n in model.graph.node] == ["MatMul"]  # no widening
        assert model.graph.output[0].type.tensor_type.elem_type == onnx.TensorProto.FLOAT16

        class J:
            backend, artifact, params, input_names, input_sets = (f.backend, f.artifact, f.params,
                                                                  [s.name for s in f.view.inputs], [f.view.to_form(xs)])
        out = _execute(J)[0]
        assert out.dtype == np.float16
        # rounded to float16: outside float32's tolerance, inside float16's
        err = np.abs(out.astype(np.float64) - ref[0]).max() / np.abs(ref[0]).max()
        assert tolerance_for("float32").rtol < err < tolerance_for("float16").rtol, err
    assert by["ort-cuda-fp16-runtime"].params["execution_provider"] == "CUDAExecutionProvider"
    assert by["ort-fp16-runtime"].agent == "native" and by["ort-cuda-fp16-runtime"].agent == "python"
    assert by["ort-fp16-runtime"].candidate.key() != by["ort-runtime"].candidate.key()
    # a float32 GEMM: no float16 form
    forms, skipped = B.baseline_forms(parse_workload(GEMM), S.final_weights(parse_workload(GEMM)), tmp_path, gpu)
    assert not [k for k in [*(f.key for f in forms), *(x["form"] for x in skipped)] if "fp16" in k]


TORCH_SPECS = [GEMM, DW, "batch_matmul:B=2,M=4,N=6,K=3", "batch_matmul:B=2,M=5,N=6,K=7,TB=1",
               "conv2d_nchw:N=1,C=4,H=9,W=9,K=6,R=3,S=3,stride=2,pad=1", "conv2d_nchw:N=2,C=4,H=6,W=6,K=5,R=1,S=1",
               "conv2d_nhwc:N=1,C=4,H=7,W=7,K=6,R=3,S=3,stride=1,pad=1", "softmax:M=10,N=33", "layernorm:M=10,N=33",
               "attention:B=1,H=2,S=12,D=8,L=16,causal=1", "attention:B=2,H=2,S=9,D=8,causal=1",
               "attention:B=1,H=3,S=7,D=4,L=11", "gemm:M=33,N=20,K=300,dtype=float16",
               "batch_matmul:B=2,M=9,N=7,K=200,TB=1,dtype=float16"]


def _torch_device(gpus=(), torch_cuda=None):
    runtimes = {"torch": "2.13.0", **({"torch_cuda": torch_cuda} if gpus else {})}
    info = type("Info", (), {"runtimes": runtimes, "fingerprint": {"gpus": list(gpus)} if gpus else {}})()
    return B.BaselineDevice(True, "", python=object(), python_info=info, num_threads=1)


def test_torch_forms_compute_every_operator_and_pass_the_verifier(tmp_path):
    """Where the device has PyTorch, eager PyTorch is a form of every operator kind. Its artifact names
    the operator (the agent holds PyTorch's form of it: a job brings no code), and each, run by the
    agent's own backend class on the inputs the session sends, passes the real verifier against the
    float64 reference; a float16 matmul returns float16 (held to float16's tolerance)."""
    require_module("torch")
    from edgetune.kernels.measurement import verify_run

    dev = _torch_device()
    for spec in TORCH_SPECS:
        w = parse_workload(spec)
        weights = S.final_weights(w)
        forms, skipped = B.baseline_forms(w, weights, tmp_path, dev)
        by = {f.key: f for f in forms}
        f = by["torch"]
        assert (f.agent, f.backend, f.params["device"], f.params["compile"]) == ("python", "torch", "cpu", "")
        doc = json.loads(f.artifact.read_text())
        assert doc["op"] == w.op and set(doc) == {"op", "params", "dtype"}  # data, not code
        half = getattr(w, "dtype", "float32") == "float16"
        assert [o.dtype for o in f.view.outputs] == (["float16"] if half else [o.dtype for o in w.outputs])
        if w.op in ("softmax", "layernorm", "attention"):
            assert by["torch-compile"].params["compile"] == "default"
        else:
            assert "same oneDNN/BLAS routine" in {x["form"]: x["reason"] for x in skipped}["torch-compile"]
        assert not [k for k in [*by, *(x["form"] for x in skipped)] if k.startswith("torch-cuda")]  # a CPU device
        xs = S.final_inputs(w, 1, weights)
        ref = w.reference(xs)
        fin = f.view.to_form(xs)

        class J:
            backend, artifact, params, input_names, input_sets, outputs = (
                f.backend, f.artifact, f.params, [s.name for s in f.view.inputs], [fin], f.view.outputs)
        outs = _execute(J)
        assert [o.dtype for o in outs] == [np.dtype(o.dtype) for o in f.view.outputs], spec
        run = KernelRun("ok", samples_ns=[1000] * 5, outputs=outs, repeat_outputs=[o.copy() for o in outs])
        v = verify_run(run, f.view, fin, f.view.outputs_to_form(ref))
        assert v.ok, (spec, v.reason)
        if half:  # rounded to float16: outside float32's tolerance
            from edgetune.verify import tolerance_for

            err = np.abs(outs[0].astype(np.float64) - ref[0]).max() / np.abs(ref[0]).max()
            assert err > tolerance_for("float32").rtol, (spec, err)
    # a device without PyTorch: named unavailable, not raced
    no_torch = B.BaselineDevice(True, "", python=object(), python_info=type("I", (), {"runtimes": {}})(),
                                num_threads=1)
    forms, skipped = B.baseline_forms(parse_workload(GEMM), S.final_weights(parse_workload(GEMM)), tmp_path, no_torch)
    assert not [f for f in forms if f.backend == "torch"]
    assert {x["form"]: x["reason"] for x in skipped}["torch"] == "no PyTorch on the device"


def test_torch_compile_form_runs_compiled(tmp_path):
    """The torch.compile form (softmax: inductor writes its own kernel) computes the operator through
    a compiled function, and a wrong operator name in the artifact is refused at load."""
    require_module("torch")
    w = parse_workload("softmax:M=10,N=33")
    forms, _ = B.baseline_forms(w, {}, tmp_path, _torch_device())
    f = {f.key: f for f in forms}["torch-compile"]
    xs = S.final_inputs(w, 1, {})

    class J:
        backend, artifact, params, input_names, input_sets, outputs = (
            f.backend, f.artifact, f.params, [s.name for s in f.view.inputs], [xs], f.view.outputs)
    (out,) = _execute(J)
    ref = w.reference(xs)[0]
    assert np.abs(out - ref).max() <= 1e-5 * np.abs(ref).max()
    # its job may take longer than --timeout to load (the compile is not a hang, and never timed)
    jobs = []

    class Recorder:
        def run_job(self, job):
            jobs.append(job)
            from edgetune.agent.host import JobResult

            return JobResult("error", "recorded")

    dev = B.BaselineDevice(True, "", python=Recorder(), num_threads=1)
    cfg = S.KernelSessionConfig(budget_ms=5.0, timeout_s=30.0)
    for key in ("torch", "torch-compile"):
        B.run_baseline_form({f.key: f for f in forms}[key], [xs[0]], None, dev, cfg)
    assert [j.timeout_s for j in jobs] == [30.0, 30.0 + B.COMPILE_ALLOWANCE_S]
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"op": "__import__('os').system('true')", "params": {}}))
    with pytest.raises(ValueError, match="must name an operator"):
        _agent_module(tmp_path / "W").TorchBackend(str(bad), {}, ["X"], [s.as_json() for s in w.outputs])


def test_a_gpu_device_with_cuda_pytorch_races_eager_and_compiled_pytorch_on_the_gpu(tmp_path):
    """On a GPU device whose PyTorch reaches the GPU: eager PyTorch on CUDA (cuBLAS/cuDNN) and
    torch.compile with max-autotune (Triton templates against cuBLAS, the fastest it measured) are
    forms; a CPU build of PyTorch on a GPU device is said, not raced."""
    h200 = [{"name": "NVIDIA H200", "sm": "sm_90"}]
    for spec in (GEMM, "gemm:M=24,N=40,K=56,dtype=float16", "softmax:M=10,N=33"):
        w = parse_workload(spec)
        forms, skipped = B.baseline_forms(w, S.final_weights(w), tmp_path, _torch_device(h200, "12.8"))
        by = {f.key: f for f in forms}
        assert by["torch-cuda"].params == {"device": "cuda", "compile": ""}
        assert by["torch-cuda-compile"].params == {"device": "cuda", "compile": "max-autotune-no-cudagraphs"}
        assert len({by[k].candidate.key() for k in ("torch", "torch-cuda", "torch-cuda-compile")}) == 3
        if "float16" in spec:
            assert by["torch-cuda"].view.out_dtype == "float16" and "float16 output" in by["torch-cuda"].label
        forms, skipped = B.baseline_forms(w, S.final_weights(w), tmp_path, _torch_device(h200, None))
        reasons = {x["form"]: x["reason"] for x in skipped}
        assert not [f for f in forms if f.key.startswith("torch-cuda")]
        assert reasons["torch-cuda"] == reasons["torch-cuda-compile"] == \
            "the device's PyTorch 2.13.0 has no CUDA (a CPU build, or no driver)"


# ---------------------------------------------------------------------------------------------
# Fused tasks: an independent float64 reference (numpy interpretation of the unscheduled TIR)
# ---------------------------------------------------------------------------------------------


def _tiny_tasks(tmp_path):
    require_module("tvm")
    from edgetune.kernels.targets import host_target
    from edgetune.kernels.workloads import extract_onnx_tasks
    from tests.fixtures.tiny import build_tiny

    model = build_tiny(tmp_path / "tiny.onnx")
    return extract_onnx_tasks(model, {"x": (4, 16)}, host_target().tvm_target)


def test_fused_task_reference_is_numpy_float64_not_tvm(tmp_path, monkeypatch):
    import tvm

    from edgetune.kernels import workloads as W

    tasks = _tiny_tasks(tmp_path)
    assert tasks
    for t in tasks:
        xs = t.random_inputs(3)
        expected = t.tvm_reference(xs)  # TVM's unscheduled build, fp32 (for comparison only)

        def no_tvm(*a, **k):
            raise AssertionError("the independent reference must not compile with TVM")

        monkeypatch.setattr(tvm, "compile", no_tvm)
        monkeypatch.setattr(W, "_host_reference_module", no_tvm)
        got = t.reference(xs)
        monkeypatch.undo()
        assert t.reference_kind == W.TIR_REFERENCE_KIND and "not independent" not in t.reference_kind
        for g, e in zip(got, expected):
            assert g.dtype == np.float64 and g.shape == e.shape
            assert np.abs(g - e).max() <= 1e-5 * max(np.abs(g).max(), 1e-30)
        # and it is the operator the model says: relu(x @ W + b) in float64
        if t.name.startswith("fused_matmul"):
            x, wt, b = (np.asarray(v, np.float64) for v in xs[:3])
            assert np.allclose(got[0], np.maximum(x @ wt + b, 0.0), rtol=1e-12, atol=1e-12)


def test_uninterpretable_task_falls_back_and_says_so():
    require_module("tvm")
    import tvm
    from tvm.script import tirx as T

    from edgetune.kernels import workloads as W

    @T.prim_func(s_tir=True)
    def shifted(a: T.Buffer((8,), "float32"), b: T.Buffer((8,), "float32")):
        T.func_attr({"tirx.noalias": True})
        for i in range(8):
            with T.sblock("b"):
                vi = T.axis.spatial(8, i)
                T.where(i < 8)  # a block predicate: not covered by the interpreter
                b[vi] = a[vi] * T.float32(2.0)

    mod = tvm.IRModule({"main": shifted})
    ins, outs = W.prim_func_io(W._single_func(mod))
    t = W.TirWorkload("shifted", mod, ins, outs)
    with pytest.raises(W.TirNotInterpretable):
        W.tir_reference(t.prim_func(), t.random_inputs(0), t.inputs, t.outputs)
    x = t.random_inputs(1)
    (y,) = t.reference(x)
    assert np.allclose(y, 2.0 * x[0])
    assert t.reference_kind.startswith("tvm-unscheduled (not independent)")


def test_transformer_tasks_all_interpreted_and_agree_with_tvm(tmp_path):
    """layer norm, softmax (max reduction, exp), GELU (erf), reshapes/transposes, batched matmuls:
    every task of the bundled transformer gets the independent reference, within fp32 error of TVM's."""
    require_module("tvm")
    import onnx

    import models.transformer as tr
    from edgetune.kernels import workloads as W
    from edgetune.kernels.targets import host_target

    path = tmp_path / "tr.onnx"
    onnx.save(tr.onnx_model(), str(path))
    m = onnx.load(str(path))
    shapes = {i.name: [d.dim_value or 1 for d in i.type.tensor_type.shape.dim] for i in m.graph.input}
    tasks = W.extract_onnx_tasks(path, shapes, host_target().tvm_target)
    names = {t.name for t in tasks}
    assert {"softmax", "layer_norm"} <= names and any("erf" in n for n in names)
    for t in tasks:
        xs = t.random_inputs(4)
        got = W.tir_reference(t.prim_func(), xs, t.inputs, t.outputs)
        for g, e in zip(got, t.tvm_reference(xs)):
            assert np.abs(g - e).max() <= 1e-4 * max(np.abs(g).max(), 1e-30), t.name


# ---------------------------------------------------------------------------------------------
# Transformer operators: softmax, layernorm, attention
# ---------------------------------------------------------------------------------------------

TRANSFORMER = ["softmax:M=37,N=101", "layernorm:M=33,N=77", "attention:B=1,H=2,S=17,D=16,L=23,causal=1",
               "attention:B=2,H=3,S=9,D=8"]


def test_transformer_weight_operands():
    ln = parse_workload("layernorm:M=4,N=6")
    assert F.weight_inputs(ln) == (1, 2)
    weights = S.final_weights(ln)
    assert sorted(weights) == [1, 2] and weights[1].shape == (6,) and weights[2].shape == (6,)
    xs = S.final_inputs(ln, 1, weights)
    assert xs[1] is weights[1] and xs[2] is weights[2]
    for spec in ("softmax:M=4,N=6", "attention:B=1,H=1,S=3,D=2"):
        assert F.weight_inputs(parse_workload(spec)) == () and S.final_weights(parse_workload(spec)) == {}


@pytest.mark.parametrize("spec", TRANSFORMER)
def test_transformer_onnx_forms_run_in_onnxruntime_and_match_the_reference(spec):
    require_module("onnxruntime")
    import onnx
    import onnxruntime as ort
    from onnx import numpy_helper

    w = parse_workload(spec)
    weights = S.final_weights(w)
    for consts in ([{}, weights] if weights else [{}]):
        model = F.op_onnx_model(w, consts)
        onnx.checker.check_model(model)
        assert model.ir_version == 8 and model.opset_import[0].version == 17
        graph_inputs = [i.name for i in model.graph.input]
        assert graph_inputs == [s.name for k, s in enumerate(w.inputs) if k not in consts]
        assert [o.name for o in model.graph.output] == [s.name for s in w.outputs]
        inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
        for k, v in consts.items():  # the constant-weight form holds exactly the kernel's weights
            assert np.array_equal(inits[w.inputs[k].name], v)
        ops = [n.op_type for n in model.graph.node]
        if w.op == "softmax":
            assert ops == ["Softmax"]
        elif w.op == "layernorm":
            (node,) = model.graph.node
            assert node.op_type == "LayerNormalization"
            attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
            assert attrs["axis"] == -1 and abs(attrs["epsilon"] - 1e-5) < 1e-12
        else:
            assert ops == ["Transpose", "MatMul", "Mul"] + (["Add"] if w.causal else []) + ["Softmax", "MatMul"]
            assert ("causal_mask" in inits) == bool(w.causal)
            if w.causal:
                assert np.array_equal(np.isneginf(inits["causal_mask"]), w.mask())
        sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        for seed in range(3):
            xs = S.final_inputs(w, seed, weights)
            (y,) = sess.run(None, {s.name: x for k, (s, x) in enumerate(zip(w.inputs, xs)) if k not in consts})
            ref = w.reference(xs)[0]
            assert y.shape == ref.shape and np.isfinite(y).all()
            assert np.abs(y - ref).max() <= 1e-5 * max(1.0, np.abs(ref).max()), (spec, bool(consts), seed)


def _load_adapter(src: str, tmp_path: Path, name: str):
    path = tmp_path / f"{name}.py"
    path.write_text(src)
    spec = importlib.util.spec_from_file_location(f"edgetune_test_{name}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.load(str(path), {})


@pytest.mark.parametrize("spec", TRANSFORMER)
def test_transformer_numpy_forms_match_the_reference(spec, tmp_path):
    w = parse_workload(spec)
    run = _load_adapter(F.numpy_adapter_source(w), tmp_path, w.op)
    first = None
    for seed in range(3):
        xs = w.random_inputs(seed)
        before = [x.copy() for x in xs]
        (y,) = run(xs)
        assert all(np.array_equal(a, b) for a, b in zip(xs, before))  # inputs untouched
        ref = w.reference(xs)[0]
        assert y.dtype == np.float32 and y.shape == ref.shape and np.isfinite(y).all()
        assert np.abs(y - ref).max() <= 1e-5 * max(1.0, np.abs(ref).max()), (spec, seed)
        first = y if first is None else first
    assert first is y  # computed into one preallocated buffer, every call


def test_transformer_baseline_forms_and_their_verification(tmp_path):
    """Which forms each operator gets (layernorm: constant and runtime weights; softmax, attention:
    no weight operand), and every form, run as its agent would, passes the real verifier."""
    require_module("onnxruntime")
    from edgetune.kernels.measurement import verify_run

    tfl = importlib.util.find_spec("ai_edge_litert") is not None

    class Info:
        runtimes = {"tflite": "x"} if tfl else {}

    dev = B.BaselineDevice(True, "", python=object(), python_info=Info(), num_threads=1)
    expect = {"softmax": {"ort-runtime", "numpy"} | ({"tflite"} if tfl else set()),
              "layernorm": {"ort-constant", "ort-runtime", "numpy"}, "attention": {"ort-runtime", "numpy"}}
    for spec in TRANSFORMER:
        w = parse_workload(spec)
        weights = S.final_weights(w)
        forms, skipped = B.baseline_forms(w, weights, tmp_path, dev)
        assert {f.key for f in forms} == expect[w.op], (spec, skipped)
        reasons = {s["form"]: s["reason"] for s in skipped}
        if w.op != "layernorm":
            assert "no weight operand" in reasons["ort-constant"]
        xs = S.final_inputs(w, 1, weights)
        ref = w.reference(xs)
        for f in forms:
            fin = f.view.to_form(xs)

            class J:
                backend, artifact, params, input_names, input_sets = (f.backend, f.artifact, f.params,
                                                                      [s.name for s in f.view.inputs], [fin])
            outs = [np.asarray(o, np.float32) for o in _execute(J)]
            run = KernelRun("ok", samples_ns=[1000] * 5, outputs=outs, repeat_outputs=[o.copy() for o in outs])
            v = verify_run(run, f.view, fin, f.view.outputs_to_form(ref))
            assert v.ok, (spec, f.key, v.reason)


def test_layernorm_final_rounds_use_the_constant_weight_form(tmp_path, monkeypatch):
    require_module("onnxruntime")
    from onnx import numpy_helper
    import onnx

    w, res, agents, store = _finish(tmp_path, monkeypatch, "layernorm:M=8,N=24", rounds=3, tflite=False)
    assert res.verified, res.reason
    forms = {row["form"]: row for row in res.baseline["forms"]}
    assert {k for k, r in forms.items() if r["status"] == "verified"} == {"ort-constant", "ort-runtime", "numpy"}
    gammas = [x[1] for x in agents.kernel_inputs]
    assert all(np.array_equal(gammas[0], g) for g in gammas)
    for model in (onnx.load_model_from_string(b) for who, b in agents.sent_artifacts if who == "ort-constant"):
        inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
        assert sorted(inits) == ["beta", "gamma"] and np.array_equal(inits["gamma"], gammas[0])
        assert [i.name for i in model.graph.input] == ["X"]
