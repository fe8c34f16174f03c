#!/usr/bin/env bash
# Runs on the GPU machine: the slim TVM runtime (no compiler) from the carried folder.
set -eo pipefail
SRC=${1:-.gpu}; OUT=${2:-$OUT}  # $3: "search" runs the schedule search (run_cuda_search.py)
export PYTHONPATH="$PWD/$SRC/site" TVM_USE_RUNTIME_LIB=1 PYTHONUNBUFFERED=1
# libcudart.so.13 for TVM's CUDA runtime: from the CUDA toolkit or the nvidia-* wheels
for d in /usr/local/cuda/lib64 /usr/local/cuda-13.0/lib64 /usr/local/cuda/lib \
         $(python3 -c "import site,glob;print(' '.join(glob.glob(site.getsitepackages()[0]+'/nvidia/*/lib')+glob.glob(site.getsitepackages()[0]+'/nvidia/cu13/lib')))" 2>/dev/null); do
  [ -e "$d/libcudart.so.13" ] && export LD_LIBRARY_PATH="$d:${LD_LIBRARY_PATH:-}"
done
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -c "import tvm, tvm_ffi; print('tvm', tvm.__version__, 'runtime only; cuda exists:', tvm.cuda(0).exist)"
if [ "${3:-check}" = search ]; then
  python3 tools/gpu/run_cuda_search.py "$SRC" "$OUT" 2>&1
else
  python3 tools/gpu/run_cuda_kernels.py "$SRC" "$OUT" 2>&1
fi
