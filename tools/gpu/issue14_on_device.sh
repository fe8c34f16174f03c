#!/usr/bin/env bash
# The one prepared GPU run of issue 14 (a lent GPU machine, one call, a few minutes). Host first:
#   .venv/bin/python tools/gpu/build_cuda_kernels.py .gpu                                   # TVM kernels, sm_90
#   .venv/bin/python tools/gpu/ort_gpu_replay.py prepare .gpu-ort --model mobilenet --batch 1,8 --rounds 2 --budget-ms 200
# then on the GPU machine (carry .gpu and .gpu-ort):
#   bash tools/gpu/issue14_on_device.sh .gpu .gpu-ort $OUT
# then here:
#   .venv/bin/python tools/gpu/verify_results.py .gpu OUTDIR/kernels
#   .venv/bin/python tools/gpu/ort_gpu_replay.py verify .gpu-ort OUTDIR/ort --markdown docs/results/gpu-ort.md
# Each step is bounded in time and runs even when one before it failed; nothing here sees a reference.
set -uo pipefail
KSRC=${1:-.gpu}; OSRC=${2:-.gpu-ort}; OUT=${3:-$OUT}
mkdir -p "$OUT/kernels" "$OUT/ort"
{
  nvidia-smi --query-gpu=name,compute_cap,driver_version,memory.total,clocks.max.sm --format=csv,noheader
  python3 -c "import onnxruntime as o; print('onnxruntime', o.__version__, o.get_available_providers())" 2>&1
  python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)" 2>&1 | tail -1
  python3 -c "import cupy; print('cupy', cupy.__version__)" 2>&1 | tail -1
} > "$OUT/machine.txt" 2>&1
cat "$OUT/machine.txt"
# 1. onnxruntime's GPU candidates through edgetune's agent (detection: the agent's info, nvidia-smi)
timeout 240 python3 tools/gpu/ort_gpu_replay.py run "$OSRC" "$OUT/ort" > "$OUT/ort/log.txt" 2>&1
echo "ort replay: rc $?"; tail -3 "$OUT/ort/log.txt"
# 2. TVM kernels vs cuBLAS, torch.matmul and torch.compile, CUDA events per launch after an L2 flush
timeout 240 bash tools/gpu/run_on_device.sh "$KSRC" "$OUT/kernels" > "$OUT/kernels/log.txt" 2>&1
echo "kernels: rc $?"; tail -5 "$OUT/kernels/log.txt"
