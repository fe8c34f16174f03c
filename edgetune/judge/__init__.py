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
   where the device has compute-sanitizer, once more under memcheck and racecheck (``run._sanitize``);
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

from edgetune.judge.inputs import KernelFile, collect_kernels, odd_variant, op_macros
from edgetune.judge.report import fmt_ns, markdown, speed_text
from edgetune.judge.results import DEFAULT_ROUNDS, FAST_P, SCHEMA, JudgeConfig, Judged, leaderboard
from edgetune.judge.run import JudgeEvent, judge

__all__ = ["DEFAULT_ROUNDS", "FAST_P", "SCHEMA", "JudgeConfig", "JudgeEvent", "Judged", "KernelFile", "collect_kernels",
           "fmt_ns", "judge", "leaderboard", "markdown", "odd_variant", "op_macros", "speed_text"]
