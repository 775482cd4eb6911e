#!/usr/bin/env bash
# Install wavefront into the current Python environment.
#   scripts/install.sh          runtime dependencies
#   scripts/install.sh --dev    plus the test tools (pytest, hypothesis, ruff) and test-only extras
# On a machine without a GPU it installs the CPU build of torch 2.13.0 first, so pip never pulls a
# multi-GB CUDA build; with a GPU, an existing torch is kept (install the build for your CUDA/ROCm first).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
extras=""
[[ "${1:-}" == "--dev" ]] && extras="[dev]"

have_gpu() { command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 || [[ -e /dev/kfd ]]; }

if ! "$PY" -c "import torch" >/dev/null 2>&1; then
  if have_gpu; then
    echo "install.sh: a GPU is present but torch is not installed; install the torch build for your" \
         "CUDA/ROCm version first (https://pytorch.org/get-started/locally/)" >&2
    exit 1
  fi
  "$PY" -m pip install -q "torch==2.13.0"
fi
"$PY" -m pip install -q -e ".${extras}"
