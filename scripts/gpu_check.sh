#!/usr/bin/env bash
# One call on a lent GPU: the test suite on the GPU, then the full bench (every registered op, every
# baseline: eager, torch.compile, Liger-Kernel), with the results store, the dashboard, the bench JSON,
# a provenance file and the log written under $OUT as bench_<device>_<yyyymmdd>.* for committing under
# benchmarks/results/. Sized to finish in under 8 minutes (test and bench limits below).
#
#   OUT=/some/dir scripts/gpu_check.sh            # on the GPU machine
#   OUT=/tmp/x scripts/gpu_check.sh --dry-run     # anywhere: print the plan, write provenance, run nothing
#
# Liger-Kernel: if it is not importable, wheels carried with the call in .whl/ are installed offline
# (pip install --no-index --find-links .whl liger-kernel); without them its column says "unavailable".
# The package is used from src/ (PYTHONPATH), never pip-installed in editable mode.
set -uo pipefail
cd "$(dirname "$0")/.."

DRY=0
TEST_LIMIT_S=${TEST_LIMIT_S:-150}
BENCH_BUDGET_S=${BENCH_BUDGET_S:-200}
for arg in "$@"; do
  case "$arg" in
    --dry-run) DRY=1 ;;
    -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
    *) echo "gpu_check.sh: unknown argument $arg (expected --dry-run)" >&2; exit 2 ;;
  esac
done

PY=${PYTHON:-python3}
OUT=${OUT:-artifacts/gpu-check}
mkdir -p "$OUT"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"

if [[ $DRY == 1 ]]; then
  device=dryrun
else
  device=$("$PY" - <<'EOF'
import re, torch
if not torch.cuda.is_available():
    raise SystemExit("gpu_check.sh: torch sees no GPU (use --dry-run to check the script without one)")
from wavefront.workbench.hardware import gpu_from_device_name
name = torch.cuda.get_device_name()
try:
    print(gpu_from_device_name(name).key)
except ValueError:
    print(re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-"))
EOF
) || exit 1
fi
stem="$OUT/bench_${device}_$(date -u +%Y%m%d)"
LOG="$stem.log"
: > "$LOG"

say() { echo "== $*" | tee -a "$LOG"; }
step() {  # run a command (or only show it on --dry-run), teeing into the log; returns its exit code
  echo "+ $*" | tee -a "$LOG"
  [[ $DRY == 1 ]] && return 0
  "$@" 2>&1 | tee -a "$LOG"
  return "${PIPESTATUS[0]}"
}

say "provenance -> $stem.meta.json"
"$PY" - "$stem.meta.json" "$DRY" <<'EOF' 2>&1 | tee -a "$LOG"
import json, platform, subprocess, sys
from datetime import datetime, timezone
import torch
from wavefront import runtime
from wavefront.workbench.bench.provenance import git_revision
sha, dirty = git_revision(".")
meta = {"date_utc": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"), "git_sha": sha, "git_dirty": dirty,
        "dry_run": sys.argv[2] == "1", "runtime": runtime.describe(), "torch": torch.__version__,
        "cuda": torch.version.cuda, "hip": getattr(torch.version, "hip", None), "host": platform.node()}
try:
    meta["triton"] = __import__("triton").__version__
except Exception as exc:
    meta["triton"] = f"unavailable: {exc}"
for cmd in (["nvidia-smi", "--query-gpu=name,driver_version,memory.total,clocks.max.sm", "--format=csv,noheader"],
            ["rocm-smi", "--showproductname", "--showdriverversion"]):
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
        if out.returncode == 0:
            meta[cmd[0]] = out.stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        pass
try:
    meta["liger_kernel"] = __import__("importlib.metadata").metadata.version("liger-kernel")
except Exception:
    meta["liger_kernel"] = None
json.dump(meta, open(sys.argv[1], "w"), indent=2)
print(json.dumps(meta, indent=2))
EOF

say "Liger-Kernel"
if "$PY" -c "import liger_kernel" >/dev/null 2>&1; then
  echo "liger-kernel already installed" | tee -a "$LOG"
elif compgen -G ".whl/*.whl" >/dev/null; then
  step "$PY" -m pip install -q --no-index --find-links .whl liger-kernel
else
  echo "liger-kernel is not installed and .whl/ carries no wheels: its column will say unavailable" | tee -a "$LOG"
fi

say "tests on the GPU (limit ${TEST_LIMIT_S} s)"
step timeout "$TEST_LIMIT_S" "$PY" -m pytest -q -x -p no:cacheprovider -n 0
test_rc=$?

say "full bench (timing budget ${BENCH_BUDGET_S} s)"
step timeout $((BENCH_BUDGET_S + 150)) "$PY" -m wavefront bench --budget-s "$BENCH_BUDGET_S" \
  --store "$stem.sqlite" --report "$stem.html" --json "$stem.json" --label "gpu_check $(date -u +%F)"
bench_rc=$?
step "$PY" -m wavefront report --store "$stem.sqlite" --out "$stem.html" --export-json "$stem.results.json"

say "done: tests exit $test_rc, bench exit $bench_rc; files:"
ls -la "$OUT" | tee -a "$LOG"
[[ $test_rc == 0 && $bench_rc == 0 ]]
