#!/usr/bin/env bash
# Olive (olive-ai, Microsoft's onnxruntime tuner) in an environment of its own, for the peer bench
# (tools/bench/bench_peers.py --olive DIR/bin/olive). Not part of `make setup`: no test needs it, and
# it pulls PyTorch with NVIDIA's CUDA wheels (about 6 GB installed). The bench runs Olive with its
# telemetry off (OLIVE_DISABLE_TELEMETRY=1). Usage: bash tools/bench/setup_olive.sh [DIR]
set -euo pipefail
cd "$(dirname "$0")/../.."
DIR=${1:-.venv/share/edgetune/olive-venv}
PY=${PYTHON:-python3}
STAMP="$DIR/.edgetune-olive"
# onnxruntime: edgetune's own version, so Olive times the runtime the race runs
ORT=$(.venv/bin/python -c "import onnxruntime; print(onnxruntime.__version__)")
WANT="olive-ai==0.13.0 onnxruntime==$ORT torch==2.14.1 psutil==7.2.2 requests==2.34.2"
if [ "$(cat "$STAMP" 2>/dev/null)" = "$WANT" ]; then echo "olive: $DIR/bin/olive"; exit 0; fi
# made in place (a venv's scripts name their own path); the stamp, written last, marks it complete
rm -rf "$DIR"
"$PY" -m venv "$DIR"
"$DIR/bin/python" -m pip install -q --upgrade pip
# psutil and requests: Olive imports them (its session-parameter pass, its telemetry) without declaring them
# shellcheck disable=SC2086
"$DIR/bin/python" -m pip install -q $WANT
echo "$WANT" > "$STAMP"
echo "olive: $DIR/bin/olive"
