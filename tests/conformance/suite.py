"""The conformance suite of device_agents/PROTOCOL.md: cheating and buggy candidates, and the named
reason (``Verdict.code``) under which the host must reject each. Every agent, on every transport of
the test farm, runs these through the real protocol (tests/farm/test_conformance.py); a candidate
not caught, or caught under another name, fails the suite.

* ``adapters/``: Python adapters, run by the Python agent's ``adapter`` backend on a small MLP.
* ``kernels/gemm.c``: C kernels with the TVM FFI ABI, run by the native agent's ``tvm-kernel``
  backend (built per variant for the device's architecture).

Some candidates attack the device rather than the measurement (a memory hog, a fork bomb, a helper
left running, output printed into the result stream): the agent's supervisor must bound them under
the job's limits (``CASE_LIMITS``) and name the bound they broke.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from edgetune.agent.host import AgentClient, Job
from edgetune.verify import Verdict, verify_job
from edgetune.modelfile import load_model
from edgetune.seeded import MODEL, seeded_array
from edgetune.workload import build_workload

HERE = Path(__file__).resolve().parent
ADAPTERS = HERE / "adapters"
KERNEL_SOURCE = HERE / "kernels" / "gemm.c"

# fixture -> the codes that name its failure ("ok": must be verified). Background work may be seen
# either as outputs changing after the call returned or as outputs unwritten when it returned.
ADAPTER_CASES: dict[str, tuple[str, ...]] = {
    "correct": ("ok",), "lazy": ("ok",),
    "stale": ("stale-output",), "stall": ("stale-output", "wrong-when-timed"),
    "sometimes": ("stale-output", "wrong-when-timed"), "memoize": ("caching",),
    # skip_warm's outputs past the first row are its warm-up's, reused: when two timed calls' first
    # rows coincide (fresh inputs are splices of the seeded sets) it returns another call's outputs exactly
    "skip_warm": ("wrong-when-timed", "stale-output"),
    "background": ("late-write", "wrong-when-timed"), "wrong": ("wrong-output",), "lowp": ("imprecise",),
    "nan": ("non-finite",), "mutate": ("input-mutated",), "faketimer": ("impossible-timing",), "constant": ("insensitive",),
    "noisy": ("non-deterministic",), "crash": ("crashed",), "hang": ("hung",),
    "hog": ("out-of-memory",), "forkbomb": ("too-many-processes",), "orphan": ("ok",), "printer": ("ok",),
}
KERNEL_CASES: dict[str, tuple[str, ...]] = {
    "CORRECT": ("ok",), "STALE": ("stale-output",), "STALL": ("stale-output", "wrong-when-timed"), "SOMETIMES": ("stale-output", "wrong-when-timed"), "MEMOIZE": ("caching",), "SKIP_WARM": ("wrong-when-timed",),
    "BACKGROUND": ("late-write", "wrong-when-timed"), "WRONG": ("wrong-output",), "MUTATE": ("input-mutated",),
    "OOB": ("out-of-bounds-write",), "LOWP": ("imprecise",), "NAN": ("non-finite",), "CONSTANT": ("insensitive",),
    "NONDET": ("non-deterministic",), "HANG": ("hung",), "CRASH": ("crashed",),
    "HOG": ("out-of-memory",), "FORKBOMB": ("too-many-processes",), "ORPHAN": ("ok",), "PRINT": ("ok",),
}
# the bounds a case runs under where the host's defaults do not fit it: a hog is stopped at 256 MB,
# not after filling a CI machine's memory up to the default (keyed by the artifact's file stem)
CASE_LIMITS: dict[str, dict[str, int]] = {"hog": {"memory_mb": 256}, "gemm_hog": {"memory_mb": 256}}
# at least 20 timed calls (the cheats turn on after a dozen calls, and a slow first call on a loaded
# machine or an emulator must not end the timed loop before that), except for the cases whose stall
# is that slow first call: they run at the tuner's own minimum (3), and the agent's plan must hold
MIN_ITERS = 20
CASE_MIN_ITERS: dict[str, int] = {"stall": 3, "gemm_stall": 3}
GEMM_M = GEMM_N = GEMM_K = 64


def build_mlp(path: Path) -> Path:
    """x[batch, 128] -> MatMul 128x256 -> Relu -> MatMul 256x64: costly enough that a cache hit shows."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(11)
    w1 = numpy_helper.from_array((rng.standard_normal((128, 256)) / 11).astype(np.float32), "W1")
    w2 = numpy_helper.from_array((rng.standard_normal((256, 64)) / 16).astype(np.float32), "W2")
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 128])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 64])
    nodes = [helper.make_node("MatMul", ["x", "W1"], ["h"]), helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("MatMul", ["r", "W2"], ["y"])]
    model = helper.make_model(helper.make_graph(nodes, "mlp", [x], [y], [w1, w2]),
                              opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.save(model, str(path))
    return path


@dataclass
class Case:
    """What one candidate runs on: input sets, their references, and how to replay references."""

    input_sets: list[list[np.ndarray]]
    references: list[list[np.ndarray]]
    reference_fn: Callable[[Sequence[np.ndarray]], list[np.ndarray]]
    output_names: list[str]
    output_specs: list[dict]
    input_names: list[str]
    flops: float | None = None


def mlp_case(model_path: Path, batch: int = 4) -> Case:
    wl = build_workload(load_model(model_path), {"batch": batch})
    refs = wl.references()
    specs = [{"name": n, "dtype": str(r.dtype), "shape": list(r.shape)} for n, r in zip(wl.output_names, refs[0])]
    return Case(wl.input_sets, refs, wl.reference_for, wl.output_names, specs, wl.input_names, wl.flops())


def gemm_reference(inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
    a, b = (np.asarray(x, np.float64) for x in inputs)
    return [(a @ b).astype(np.float32)]


def gemm_case(seed: int = 3) -> Case:
    sets = []
    for i in range(3):
        rng = np.random.default_rng([seed, i])
        sets.append([seeded_array("float32", (GEMM_M, GEMM_K), rng, MODEL), seeded_array("float32", (GEMM_K, GEMM_N), rng, MODEL)])
    return Case(sets, [gemm_reference(s) for s in sets], gemm_reference, ["C"],
                [{"name": "C", "dtype": "float32", "shape": [GEMM_M, GEMM_N]}], ["A", "B"], 2.0 * GEMM_M * GEMM_N * GEMM_K)


def build_kernels(out_dir: Path, cc: str = "gcc") -> dict[str, Path]:
    """Every kernel variant as a shared object for the compiler's target."""
    if shutil.which(cc) is None:
        raise FileNotFoundError(cc)
    out_dir.mkdir(parents=True, exist_ok=True)
    built = {}
    for variant in KERNEL_CASES:
        so = out_dir / f"gemm_{variant.lower()}.so"
        subprocess.run([cc, "-O2", "-shared", "-fPIC", "-pthread", f"-DVARIANT_{variant}", str(KERNEL_SOURCE),
                        "-o", str(so), "-lm"], check=True, capture_output=True)
        built[variant] = so
    return built


def run_case(client: AgentClient, case: Case, backend: str, artifact: Path, model: Path | None = None,
             timeout_s: float = 8.0, budget_ms: float = 30.0, peak_gflops: float | None = None
             ) -> tuple[Verdict, object]:
    job = Job(backend=backend, artifact=artifact, params={"num_threads": 1} if backend == "tvm-kernel" else {},
              input_names=case.input_names, input_sets=case.input_sets, output_specs=case.output_specs, model=model,
              budget_ms=budget_ms, warmup_ms=5.0, timeout_s=timeout_s,
              min_iters=CASE_MIN_ITERS.get(Path(artifact).stem, MIN_ITERS), **CASE_LIMITS.get(Path(artifact).stem, {}))
    res = client.run_job(job)
    info = client.provision()
    return verify_job(res, case.input_sets, case.references, case.reference_fn, case.output_names,
                      flops=case.flops, peak_gflops=peak_gflops, timings_trusted=not info.emulated), res
