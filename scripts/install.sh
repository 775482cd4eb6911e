#!/usr/bin/env bash
# Install wavefront and every verb of its workbench into the current Python environment.
#   scripts/install.sh            the kernels and the workbench (wavefront[workbench])
#   scripts/install.sh --dev      plus the tests and checks (pytest, ruff, mypy, import-linter, transformers)
#                                 and, for the dashboard's browser tests, headless Chromium and its driver
#                                 (Debian packages chromium and chromium-driver, installed when run as root)
#   scripts/install.sh --plan     print what would be installed, install nothing
#
# Without a GPU the install is CPU-only by construction: torch comes from PyTorch's CPU wheel index when
# it is reachable; otherwise pip's own resolution is checked first and refused if it would bring CUDA
# libraries (nvidia-* packages), and the installed torch is checked afterwards (a CUDA or ROCm build on a
# machine without a GPU fails the install). With a GPU, an existing torch is kept: install the build for
# your CUDA/ROCm first (https://pytorch.org/get-started/locally/).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
TORCH_VERSION=${WAVEFRONT_TORCH_VERSION:-2.13.0}
CPU_INDEX=${WAVEFRONT_TORCH_CPU_INDEX:-https://download.pytorch.org/whl/cpu}
extras="workbench"
plan_only=0
for arg in "$@"; do
  case "$arg" in
    --dev) extras="workbench,dev" ;;
    --plan) plan_only=1 ;;
    *) echo "install.sh: unknown argument '$arg' (expected --dev or --plan)" >&2; exit 2 ;;
  esac
done

step() { printf '[install %s] %s\n' "$(date +%H:%M:%S)" "$*"; }
have_gpu() { { command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; } || [[ -e /dev/kfd ]]; }
reachable() {  # one quick look (5 s): an unreachable index must not cost pip's minutes of retries
  "$PY" - "$1" <<'EOF' >/dev/null 2>&1
import sys, urllib.request
urllib.request.urlopen(sys.argv[1].rstrip("/") + "/torch/", timeout=5)
EOF
}
# Would `pip install torch==X` (no special index) bring CUDA libraries? Resolves metadata only.
resolution_brings_cuda() {
  local report
  report=$(mktemp)
  "$PY" -m pip install --dry-run --ignore-installed --quiet --report "$report" "torch==$TORCH_VERSION" \
    >/dev/null 2>&1 || { rm -f "$report"; return 2; }
  "$PY" - "$report" <<'EOF'
import json, sys
names = [i["metadata"]["name"].lower() for i in json.load(open(sys.argv[1]))["install"]]
cuda = [n for n in names if n.startswith("nvidia-") or n.startswith("cuda-")]
print(" ".join(cuda))
sys.exit(0 if cuda else 1)
EOF
  local rc=$?
  rm -f "$report"
  return $rc
}

step "python: $("$PY" -c 'import sys; print(sys.executable, sys.version.split()[0])')"
if "$PY" -c "import torch" >/dev/null 2>&1; then
  step "torch: keeping the installed $("$PY" -c 'import torch; print(torch.__version__)')"
elif have_gpu; then
  echo "install.sh: a GPU is present but torch is not installed; install the torch build for your" \
       "CUDA/ROCm version first (https://pytorch.org/get-started/locally/), then run this again" >&2
  exit 1
elif reachable "$CPU_INDEX"; then
  step "torch: no GPU here; torch==$TORCH_VERSION from the CPU wheel index $CPU_INDEX"
  if (( plan_only == 0 )); then
    "$PY" -m pip install -q "torch==$TORCH_VERSION" --index-url "$CPU_INDEX"
  fi
else
  step "torch: no GPU here and the CPU wheel index is not reachable; checking what pip would install"
  if cuda=$(resolution_brings_cuda); then
    echo "install.sh: on this machine without a GPU, 'pip install torch==$TORCH_VERSION' resolves to a CUDA" \
         "build (it would bring: $cuda). Make a CPU build reachable (set WAVEFRONT_TORCH_CPU_INDEX to a" \
         "mirror of $CPU_INDEX, or pip's --find-links to a CPU wheel) and run this again." >&2
    exit 1
  fi
  step "torch: pip resolves torch==$TORCH_VERSION to a CPU build (no CUDA libraries)"
  if (( plan_only == 0 )); then
    "$PY" -m pip install -q "torch==$TORCH_VERSION"
  fi
fi

step "wavefront[$extras]: the kernels, the workbench$([[ $extras == *dev* ]] && echo ', tests and checks')"
# The dashboard's browser tests need headless Chromium and chromedriver (WAVEFRONT_CHROMIUM: the browser to use).
browser_for_tests() {
  local chromium=${WAVEFRONT_CHROMIUM:-$(command -v chromium || command -v chromium-browser || true)}
  if [[ -n "$chromium" && -x "$chromium" ]] && command -v chromedriver >/dev/null 2>&1; then
    step "browser tests: headless Chromium at $chromium"
  elif command -v apt-get >/dev/null 2>&1 && [[ "$(id -u)" == 0 ]]; then
    if (( plan_only == 1 )); then
      step "browser tests: would install chromium and chromium-driver (apt-get)"
    else
      step "browser tests: installing chromium and chromium-driver (apt-get)"
      apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null
    fi
  else
    step "browser tests: no headless Chromium here (they will be skipped); to run them, install chromium and" \
         "chromium-driver (Debian: sudo apt-get install chromium chromium-driver) or set WAVEFRONT_CHROMIUM"
  fi
}
if [[ $extras == *dev* ]]; then
  browser_for_tests
fi
if (( plan_only == 1 )); then
  step "plan only: nothing installed"
  exit 0
fi
"$PY" -m pip install -q -e ".[$extras]"

step "checking the installed torch against this machine"
"$PY" - <<'EOF'
import subprocess, sys
import torch

gpu = False
try:
    gpu = subprocess.run(["nvidia-smi", "-L"], capture_output=True).returncode == 0
except OSError:
    pass
import os
gpu = gpu or os.path.exists("/dev/kfd")
build = "cuda " + torch.version.cuda if torch.version.cuda else ("rocm " + torch.version.hip if torch.version.hip else "cpu")
if not gpu and build != "cpu":
    sys.exit(f"install.sh: torch {torch.__version__} is a {build} build on a machine without a GPU; "
             "uninstall it (pip uninstall torch) and run this script again to get the CPU build")
print(f"[install] torch {torch.__version__} ({build} build) on a machine {'with' if gpu else 'without'} a GPU: ok")
EOF
step "done: run 'wavefront bench' (the main job) or 'python -m pytest' (the tests)"
