#!/usr/bin/env bash
# All set-up on a fresh Debian 12 machine (as root): apt packages, then a virtualenv with edgetune.
# Idempotent and quick when everything is already there.
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PACKAGES=(python3 python3-venv python3-dev gcc g++ make binutils openssh-server adb qemu-user
              gcc-aarch64-linux-gnu g++-aarch64-linux-gnu libc6-dev-arm64-cross binutils-aarch64-linux-gnu util-linux procps
              postgresql)
missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  if [ "$(id -u)" != 0 ]; then
    echo "setup: missing Debian packages (${missing[*]}); run as root or install them" >&2
    exit 1
  fi
  echo "setup: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

PY=${PYTHON:-python3}
STAMP=.venv/.edgetune-installed
want="$(sha256sum pyproject.toml | cut -c1-16)"
if [ ! -x .venv/bin/python ] || [ "$(cat "$STAMP" 2>/dev/null)" != "$want" ]; then
  [ -x .venv/bin/python ] || "$PY" -m venv .venv
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q -e '.[all]'
  # OpenVINO's telemetry: 'import openvino' sends a usage event to an analytics service unless a consent
  # file says no. Without the package OpenVINO uses its stub (and the agent refuses to import it anyway)
  .venv/bin/python -m pip uninstall -y -q openvino-telemetry 2>/dev/null || true
  echo "$want" > "$STAMP"
fi

# The onnx2tf converter (ONNX -> .tflite, edgetune/convert/onnx2tflite.py) in an environment of its own:
# TensorFlow needs numpy < 2.2, edgetune's has numpy 2. tensorflow-cpu (not onnx2tf's pin of the
# full tensorflow, which tf-keras also asks for: installed without its dependencies); onnx2tf's
# other pins as it states them. opencv-python, onnxoptimizer and simple-onnx-processing-tools are
# left out: nothing of a conversion imports them. ~1.7 GB, about a minute.
O2T_DIR=.venv/share/edgetune/onnx2tf-venv
O2T_PINS=(tensorflow-cpu==2.19.0 keras==3.10.0 numpy==1.26.4 onnx==1.19.1 onnxruntime==1.23.0
          onnx-graphsurgeon==0.5.8 onnxsim==0.4.36 sng4onnx==1.0.5 sne4onnx==1.0.15 psutil==5.9.5
          h5py==3.11.0 ml-dtypes==0.5.1 protobuf==4.25.5 flatbuffers==25.12.19 ai-edge-litert==2.1.0
          requests==2.32.5)
O2T_NODEPS=(tf-keras==2.19.0 onnx2tf==1.29.24)
o2t_want="$(printf '%s\n' "${O2T_PINS[@]}" "${O2T_NODEPS[@]}" | sha256sum | cut -c1-16)"
if [ "$(cat "$O2T_DIR/.edgetune-installed" 2>/dev/null)" != "$o2t_want" ]; then
  echo "setup: installing the onnx2tf converter into $O2T_DIR"
  # made in place (a venv's scripts name their own path: it cannot be moved); onnx2tf goes in last,
  # so an interrupted install has none, and edgetune says the converter is missing
  rm -rf "$O2T_DIR"
  "$PY" -m venv "$O2T_DIR"
  "$O2T_DIR/bin/python" -m pip install -q --upgrade pip
  "$O2T_DIR/bin/python" -m pip install -q "${O2T_PINS[@]}"
  "$O2T_DIR/bin/python" -m pip install -q --no-deps "${O2T_NODEPS[@]}"
  echo "$o2t_want" > "$O2T_DIR/.edgetune-installed"
fi

# NVIDIA's CUDA compiler (nvcc 13.0, NVIDIA's own wheels on PyPI) when the machine has none: CUDA
# kernels (judge) and TVM's CUDA builds are compiled and checked for sm_80/sm_90 here, no GPU needed.
# `make` puts .venv/bin (and this nvcc) on PATH.
CUDA_DIR=.venv/share/edgetune/cuda-13.0
NVCC_WHEELS=(nvidia-cuda-nvcc==13.0.88 nvidia-cuda-crt==13.0.88 nvidia-cuda-runtime==13.0.96
             nvidia-cuda-cccl==13.0.85 nvidia-nvvm==13.0.88)
if ! PATH="$PWD/.venv/bin:$PATH" command -v nvcc >/dev/null && [ ! -x "$CUDA_DIR/nvidia/cu13/bin/nvcc" ]; then
  echo "setup: installing NVIDIA's nvcc 13.0 into $CUDA_DIR"
  rm -rf "$CUDA_DIR.tmp"
  .venv/bin/python -m pip install -q --no-deps --target "$CUDA_DIR.tmp" "${NVCC_WHEELS[@]}"
  ln -sfn lib "$CUDA_DIR.tmp/nvidia/cu13/lib64"  # where nvcc.profile looks for libcudart_static
  rm -rf "$CUDA_DIR" && mv "$CUDA_DIR.tmp" "$CUDA_DIR"
fi
if [ -x "$CUDA_DIR/nvidia/cu13/bin/nvcc" ]; then
  printf '#!/bin/sh\nexec "%s" "$@"\n' "$PWD/$CUDA_DIR/nvidia/cu13/bin/nvcc" > .venv/bin/nvcc
  chmod 755 .venv/bin/nvcc
fi

# onnxruntime's own libonnxruntime.so for aarch64 boards without Python (the native agent loads it):
# from the onnxruntime wheel of that architecture on PyPI. 1.20.1: later aarch64 builds crash at load
# under qemu-user (the test farm's board), 1.20.1 loads there and on hardware.
ORT_A64_VERSION=1.20.1
ORT_A64=.venv/share/edgetune/ort-aarch64-$ORT_A64_VERSION/libonnxruntime.so
if [ ! -s "$ORT_A64" ]; then
  tmp=$(mktemp -d)
  if .venv/bin/python -m pip download -q --no-deps --only-binary=:all: --python-version 3.11 \
       --platform manylinux_2_27_aarch64 --platform manylinux2014_aarch64 -d "$tmp" \
       "onnxruntime==$ORT_A64_VERSION" 2>/dev/null; then
    mkdir -p "$(dirname "$ORT_A64")"
    .venv/bin/python - "$tmp" "$ORT_A64" <<'PY'
import glob, os, sys, zipfile
whl = glob.glob(os.path.join(sys.argv[1], "*.whl"))[0]
with zipfile.ZipFile(whl) as z:
    name = next(n for n in z.namelist() if "/libonnxruntime.so" in n)
    data = z.read(name)
tmp = sys.argv[2] + ".tmp"
with open(tmp, "wb") as f:
    f.write(data)
os.replace(tmp, sys.argv[2])
PY
  else
    echo "setup: could not download onnxruntime $ORT_A64_VERSION for aarch64 (boards get no onnxruntime)" >&2
  fi
  rm -rf "$tmp"
fi
