#!/usr/bin/env bash
# One call on a lent GPU (NVIDIA or ROCm), under 8 minutes, everything under $OUT as bench_<device>_<yyyymmdd>.*
# for committing under benchmarks/results/:
#   1. provenance (device, driver, versions, git sha)                                  -> .meta.json
#   2. smoke: one small call of every registered op, forward and backward, against the float64 reference, each
#      op under its own limit in worker processes that a hang cannot stall (workbench/bench/smoke.py); names a
#      failing, hanging or crashing op within seconds (limit SMOKE_LIMIT_S)              -> .smoke.jsonl, .smoke.json
#   3. profiles of a few cases (softmax, rms_norm forward, wavefront's kernels) under the timeline profiler
#      (Nsight Systems; rocprofv3 on ROCm) and, where installed, Nsight Compute (`wavefront bench --profile`),
#      each step under its own limit (PROFILE_LIMIT_S); a tool that is not on PATH is recorded as skipped. The
#      files are real vendor output for the readers' tests -> .profile/{nsys,rocprof,ncu}/
#   3b. the test suite on the GPU, as far as it gets in TEST_LIMIT_S (the smoke step covers every op)
#   4. peers: attention forward/backward against F.scaled_dot_product_attention's flash and cuDNN backends and
#      flash-attn (if installed); linear's provider choice (wavefront = the auto rule) against the vendor BLAS
#      (torch.mm / addmm) and eager, at the bench shapes                                -> .sqlite, .peers.json
#   5. every other op against eager, torch.compile, Liger-Kernel and quack-kernels (softmax, rms_norm,
#      layer_norm forward, cross_entropy; budget BENCH_BUDGET_S)                         -> .sqlite, .json
#   6. a training step of an 8B-shaped Llama: eager HF, torch.compile, Liger's patch, wavefront, same data
#      (skipped with a note if the train verb rejects the --compare list)          -> .train.json
#   7. sm_90 only, after the smoke step: the Gluon attention forward (kernels/attention_gluon.py, never run
#      before) against the default kernel and SDPA: accuracy (float64 reference) at 1, 3 and 9 key blocks
#      (GLUON_SEQS; the first two below and past its 2-stage ring, the last a long partial sequence); its time
#      is step 7b's (limit GLUON_LIMIT_S)                                 -> .gluon.jsonl (row by row), .gluon.json
#  7b. sm_90 only: the FA3-schedule forward (kernels/attention_fa3.py, never run before; scripts/gpu_check_fa3.py):
#      accuracy vs float64 and SDPA flash (1, 3, 9 key blocks and a shape with more tiles than SMs), then time
#      vs the default and Gluon kernels, SDPA flash/cuDNN and flash-attn-4 (limit FA3_LIMIT_S) -> .fa3.jsonl, .fa3.json
#  7c. sm_90 / sm_100 only (skipped elsewhere): the opt-in FP8 GEMM on the persistent TMA kernel
#      (WAVEFRONT_FP8_TMA=1, kernels/linear_fp8.py, never run before): its float64 accuracy tests on the GPU, every
#      recipe (limit FP8_TMA_TEST_LIMIT_S), then linear_fp8's forward at the bench shapes with the flag (budget
#      FP8_TMA_BUDGET_S; the default kernels' rows are step 5's)                   -> .sqlite, .fp8-tma.json
#   8. the dashboard and the results document                                           -> .html, .results.json
#
# Every step has a time limit and appends its outcome to .steps.jsonl before the next starts (its own files
# are written as it goes where the tool allows: the smoke and Gluon rows line by line, the bench store per
# record); the summary table prints at the end however the script ends (a failed or timed-out step, a kill).
# The limits sum to 445 s (smoke 60, profiles 20 each, tests 20, peers 35 + 50 of start-up, bench 20 + 45, train 60,
# Gluon 20, FA3 40, FP8 TMA tests 20 and bench 5 + 10, report 20), with the provenance outside any step.
#
#   OUT=/some/dir scripts/gpu_check.sh            # on the GPU machine
#   OUT=/tmp/x scripts/gpu_check.sh --dry-run     # anywhere: print the plan, write provenance, run nothing
#
# Liger-Kernel / flash-attn / quack-kernels: if not importable, wheels carried with the call in .whl/ are installed
# offline (pip install --no-index --find-links .whl ...); without them their columns say "unavailable" (quack
# needs sm_90/sm_100 and the CUTLASS DSL, nvidia-cutlass-dsl, among the wheels). The package is
# used from src/ (PYTHONPATH), never pip-installed in editable mode. Each step has its own time limit, so the
# script ends in time even when one step hangs; a step that fails does not stop the others.
set -uo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/gpu_check_steps.sh
source scripts/gpu_check_steps.sh

DRY=0
SMOKE_LIMIT_S=${SMOKE_LIMIT_S:-60}  # the whole smoke step; its workers stop starting ops 8 s before
SMOKE_OP_TIMEOUT_S=${SMOKE_OP_TIMEOUT_S:-25}  # one op, forward and backward, its kernels' compile included
SMOKE_JOBS=${SMOKE_JOBS:-6}
TEST_LIMIT_S=${TEST_LIMIT_S:-20}
PROFILE_LIMIT_S=${PROFILE_LIMIT_S:-20}  # each profiler: python and torch start-up, the cases, the export
PEERS_BUDGET_S=${PEERS_BUDGET_S:-35}
BENCH_BUDGET_S=${BENCH_BUDGET_S:-20}
TRAIN_LIMIT_S=${TRAIN_LIMIT_S:-60}
TRAIN_MODEL=${TRAIN_MODEL:-llama3-8b}
GLUON_LIMIT_S=${GLUON_LIMIT_S:-20}
GLUON_SEQS=${GLUON_SEQS:-"128 384 1124"}  # 1, 3 and 9 key blocks of 128
FA3_LIMIT_S=${FA3_LIMIT_S:-40}
FP8_TMA_TEST_LIMIT_S=${FP8_TMA_TEST_LIMIT_S:-20}
FP8_TMA_BUDGET_S=${FP8_TMA_BUDGET_S:-5}
FP8_TMA_BENCH_LIMIT_S=$((FP8_TMA_BUDGET_S + 10))
REPORT_LIMIT_S=${REPORT_LIMIT_S:-20}
for arg in "$@"; do
  case "$arg" in
    --dry-run) DRY=1 ;;
    -h|--help) sed -n '2,46p' "$0"; exit 0 ;;
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
steps_init "$stem.steps.jsonl" "$LOG" "$DRY"

say "provenance -> $stem.meta.json"
"$PY" - "$stem.meta.json" "$DRY" "$stem.ops" <<'EOF' 2>&1 | tee -a "$LOG"
import json, platform, subprocess, sys
from datetime import datetime, timezone
from importlib import metadata
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
for dist in ("liger-kernel", "flash-attn", "quack-kernels"):
    try:
        meta[dist.replace("-", "_")] = metadata.version(dist)
    except Exception:
        meta[dist.replace("-", "_")] = None
json.dump(meta, open(sys.argv[1], "w"), indent=2)
print(json.dumps(meta, indent=2))
from wavefront.ops import REGISTRY  # the ops of step 5 (attention and linear are step 4's)
open(sys.argv[3], "w").write(" ".join(f"--op {n}" for n in REGISTRY if n not in ("attention", "linear")))
EOF

say "smoke: every op once, forward and backward, vs the reference (limit ${SMOKE_LIMIT_S} s, ${SMOKE_OP_TIMEOUT_S} s per op)"
run_step smoke "$SMOKE_LIMIT_S" "$PY" -m wavefront.workbench.bench.smoke --results "$stem.smoke.jsonl" \
  --json "$stem.smoke.json" --device cuda --timeout-s "$SMOKE_OP_TIMEOUT_S" --budget-s $((SMOKE_LIMIT_S - 8)) \
  --jobs "$SMOKE_JOBS"
[[ -f "$stem.smoke.json" ]] && STEP_NOTES+=("smoke: $(tr -d '\n' < "$stem.smoke.json" | grep -o '"counts": {[^}]*}')")

say "profiles: a few cases under nsys (rocprofv3 on ROCm) and ncu, when installed (limit ${PROFILE_LIMIT_S} s each)"
# exit 2: the tool is not on PATH (or this GPU is not its vendor's): recorded as skipped
timeline=nsys
"$PY" -c "import sys, torch; sys.exit(0 if torch.version.hip else 1)" 2>/dev/null && timeline=rocprof
SKIP_RC=2 run_step profile-timeline "$PROFILE_LIMIT_S" "$PY" -m wavefront bench --profile "$timeline" --op softmax \
  --op rms_norm --mode fwd --provider wavefront --profile-dir "$stem.profile/$timeline" \
  --json "$stem.profile-$timeline.json"
SKIP_RC=2 run_step profile-ncu "$PROFILE_LIMIT_S" "$PY" -m wavefront bench --profile ncu --op softmax \
  --case attn_scores_4k --mode fwd --provider wavefront --profile-dir "$stem.profile/ncu" --json "$stem.profile-ncu.json"

say "optional peers: Liger-Kernel, flash-attn, quack-kernels"
for pair in "liger_kernel:liger-kernel" "flash_attn:flash-attn" "flash_attn.cute:flash-attn-4" "quack:quack-kernels"; do
  module=${pair%%:*}; dist=${pair##*:}
  if "$PY" -c "import $module" >/dev/null 2>&1; then
    echo "$dist already installed" | tee -a "$LOG"
  elif compgen -G ".whl/*.whl" >/dev/null; then
    run_step "pip-$module" 20 "$PY" -m pip install -q --no-index --find-links .whl "$dist" \
      || echo "$dist: no wheel in .whl/" | tee -a "$LOG"
  else
    echo "$dist is not installed and .whl/ carries no wheels: its column will say unavailable" | tee -a "$LOG"
  fi
done

say "tests on the GPU (limit ${TEST_LIMIT_S} s)"
run_step tests "$TEST_LIMIT_S" "$PY" -m pytest -q -x -p no:cacheprovider -n 0 tests/ops

say "peers: attention vs SDPA (flash, cuDNN) and flash-attn; linear's provider rule vs the vendor BLAS (budget ${PEERS_BUDGET_S} s)"
run_step peers $((PEERS_BUDGET_S + 50)) "$PY" -m wavefront bench --op attention --op linear --skip-correctness \
  --provider wavefront --provider eager --provider vendor --provider sdpa_flash --provider sdpa_cudnn \
  --provider flash_attn --budget-s "$PEERS_BUDGET_S" --store "$stem.sqlite" --no-report --json "$stem.peers.json" \
  --label "gpu_check peers $(date -u +%F)"

say "bench: every other op (timing budget ${BENCH_BUDGET_S} s)"
others=$(cat "$stem.ops")
# shellcheck disable=SC2086  # one word per --op flag
run_step bench $((BENCH_BUDGET_S + 45)) "$PY" -m wavefront bench $others --provider wavefront --provider eager \
  --provider torch_compile --provider liger --provider quack --budget-s "$BENCH_BUDGET_S" --store "$stem.sqlite" \
  --no-report \
  --json "$stem.json" --label "gpu_check $(date -u +%F)"

say "training step, ${TRAIN_MODEL}-shaped Llama: eager, compile, liger, wavefront (limit ${TRAIN_LIMIT_S} s)"
# exit 2: the verb rejected the --compare list / --model (not available in this checkout): recorded as skipped
SKIP_RC=2 run_step train "$TRAIN_LIMIT_S" "$PY" -m wavefront train --compare eager,compile,liger,wavefront \
  --model "$TRAIN_MODEL" --seq-len 2048 --global-batch 1 --micro-batch 1 --steps 4 --warmup-steps 2 --activation-checkpointing \
  --store "$stem.sqlite" --json "$stem.train.json"

say "Gluon attention forward on sm_90: accuracy beside the default kernel and SDPA, sequences $GLUON_SEQS (limit ${GLUON_LIMIT_S} s)"
# shellcheck disable=SC2086  # one argument per sequence length
run_step gluon "$GLUON_LIMIT_S" "$PY" - "$stem.gluon.json" $GLUON_SEQS <<'EOF'
import json, sys
import torch
from wavefront import reference
from wavefront.kernels import attention as default_kernel, attention_gluon
from wavefront.ops._spec import Tolerance
cap = torch.cuda.get_device_capability()
if cap != (9, 0):
    print(f"gluon: skipped, the device is sm_{cap[0]}{cap[1]}, not sm_90")
    raise SystemExit(0)
doc, gen = {"accuracy": []}, torch.Generator("cuda").manual_seed(0)  # its time: the FA3 step's rows
rows = open(sys.argv[1].removesuffix(".json") + ".jsonl", "a")  # row by row: a hang leaves the rows before it
def keep(kind, row):
    doc[kind].append(row); print(row, flush=True)
    rows.write(json.dumps({"kind": kind, **row}) + "\n"); rows.flush()
def qkv(b, h, hk, s, d):
    mk = lambda *shape: torch.randn(*shape, device="cuda", dtype=torch.bfloat16, generator=gen)
    return mk(b, h, s, d), mk(b, hk, s, d), mk(b, hk, s, d)
# Shortest first: a hang in the key loop shows as the first missing row (1 block, 3 blocks: past the 2-stage
# ring at d128, 9 blocks), each synchronized before the next. The accuracy rule (ops._spec.Tolerance): vs
# float64, <= 2 x eager's error (SDPA math) + 1 ulp.
for s in sorted(int(a) for a in sys.argv[2:]):
    for d, causal in ((64, False), (64, True), (128, False), (128, True)):
        q, k, v = qkv(1, 4, 2, s, d)
        ref = reference.attention(q.double(), k.double(), v.double(), causal, d ** -0.5)
        eager = reference.attention_sdpa_math(q, k, v, causal, d ** -0.5)
        o, lse2 = attention_gluon.attention_fwd(q, k, v, causal, d ** -0.5)
        torch.cuda.synchronize()
        o_def, lse2_def = default_kernel.attention_fwd(q, k, v, causal, d ** -0.5)
        err = lambda x: (x.double() - ref).abs().max().item()
        row = {"seq": s, "key_blocks": -(-s // 128), "head_dim": d, "causal": causal, "err_gluon": err(o),
               "err_default": err(o_def), "err_eager": err(eager),
               "lse2_max_diff_vs_default": (lse2 - lse2_def).abs().max().item()}
        row["bound"] = Tolerance().bound(row["err_eager"], ref.abs().max().item(), q.dtype)
        row["pass"] = row["err_gluon"] <= row["bound"]
        keep("accuracy", row)
json.dump(doc, open(sys.argv[1], "w"), indent=1)
print("gluon: accuracy", "PASS" if all(r["pass"] for r in doc["accuracy"]) else "FAIL")
EOF

say "FA3-schedule attention forward on sm_90 vs the default, Gluon, SDPA and flash-attn-4 (limit ${FA3_LIMIT_S} s)"
# shellcheck disable=SC2086  # one argument per sequence length
run_step fa3 "$FA3_LIMIT_S" "$PY" scripts/gpu_check_fa3.py "$stem.fa3.json" $GLUON_SEQS

say "FP8 GEMM on the TMA kernel (WAVEFRONT_FP8_TMA=1), sm_90/sm_100 only: float64 accuracy tests, then a bench"
fp8_tma_skip=""
if [[ $DRY == 0 ]]; then
  fp8_tma_skip=$("$PY" -c "import torch; c = torch.cuda.get_device_capability(); print('' if torch.version.cuda \
and c[0] in (9, 10) else f'{torch.cuda.get_device_name()} (capability {c[0]}.{c[1]})')" 2>&1 | tail -n 1)
fi
if [[ -n $fp8_tma_skip ]]; then
  skip_step fp8-tma-tests "$FP8_TMA_TEST_LIMIT_S" "$fp8_tma_skip, not sm_90/sm_100"
  skip_step fp8-tma-bench "$FP8_TMA_BENCH_LIMIT_S" "$fp8_tma_skip, not sm_90/sm_100"
else
  # The ragged case over three K blocks (partial last block, bias and residual), every recipe, on the GPU's own
  # tiles; in parallel workers: each recipe compiles its own kernels.
  run_step fp8-tma-tests "$FP8_TMA_TEST_LIMIT_S" env WAVEFRONT_FP8_TMA=1 "$PY" -m pytest -q -p no:cacheprovider \
    -n 4 tests/ops/test_linear_fp8_tma.py -k "test_tma_kernel_matches_float64 and 70-36-272"
  run_step fp8-tma-bench "$FP8_TMA_BENCH_LIMIT_S" env WAVEFRONT_FP8_TMA=1 "$PY" -m wavefront bench --op linear_fp8 \
    --mode fwd --provider wavefront --budget-s "$FP8_TMA_BUDGET_S" --store "$stem.sqlite" --no-report \
    --json "$stem.fp8-tma.json" --label "gpu_check fp8-tma $(date -u +%F)"
fi

say "dashboard and results document (limit ${REPORT_LIMIT_S} s)"
run_step report "$REPORT_LIMIT_S" "$PY" -m wavefront report --store "$stem.sqlite" --out "$stem.html" \
  --export-json "$stem.results.json"

say "files:"
ls -la "$OUT" | tee -a "$LOG"
steps_ok  # the exit status; the summary table prints on exit (steps_summary, trap EXIT)
