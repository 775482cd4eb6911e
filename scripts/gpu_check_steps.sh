# Step runner for scripts/gpu_check.sh (sourced, not run): every step has a name and a time limit, its output
# goes to the log as it comes, and its outcome is appended to $STEPS_FILE (one JSON line) before the next step
# starts; the summary table prints when the script ends, however it ends (failures, timeouts, a kill).
#
#   steps_init FILE LOG DRY      # FILE: the step records (JSON lines); DRY=1: show the commands, run nothing
#   run_step NAME LIMIT_S CMD... # returns the command's exit status (124/137: it ran past LIMIT_S);
#                                # SKIP_RC=N run_step ...: exit status N means "skipped" (recorded so, returns 0)
#   skip_step NAME LIMIT_S WHY   # a step this machine cannot run: recorded as skipped, WHY in the summary
#   STEP_NOTES+=("text")          # lines the summary prints under the table (e.g. the smoke step's verdict)

STEP_NAMES=()
STEP_STATUS=()
STEP_RC=()
STEP_WALL=()
STEP_LIMIT=()
STEP_NOTES=()
CURRENT_STEP=""
CURRENT_START=0
CURRENT_LIMIT=0
STEP_PID=""
SUMMARY_DONE=0

steps_init() {
  STEPS_FILE=$1
  STEPS_LOG=$2
  STEPS_DRY=$3
  : > "$STEPS_FILE"
  trap steps_summary EXIT
  trap 'exit 143' TERM INT HUP
}

_step_record() {  # name status rc wall limit
  STEP_NAMES+=("$1"); STEP_STATUS+=("$2"); STEP_RC+=("$3"); STEP_WALL+=("$4"); STEP_LIMIT+=("$5")
  printf '{"step": "%s", "status": "%s", "rc": %s, "wall_s": %s, "limit_s": %s}\n' "$1" "$2" "$3" "$4" "$5" \
    >> "$STEPS_FILE"
  sync "$STEPS_FILE" 2>/dev/null || true
}

run_step() {
  local name=$1 limit=$2 rc start
  shift 2
  echo "+ timeout -k 5 $limit $*" | tee -a "$STEPS_LOG"
  if [[ $STEPS_DRY == 1 ]]; then
    _step_record "$name" planned 0 0 "$limit"
    return 0
  fi
  CURRENT_STEP=$name
  start=$SECONDS
  CURRENT_START=$start
  CURRENT_LIMIT=$limit
  # -k 5: a process that ignores SIGTERM (one waiting on a hung kernel) is killed 5 s later. In the background
  # with `wait`: a signal to this script runs its trap at once (bash defers traps until a foreground command
  # ends), and the trap ends the step.
  timeout -k 5 "$limit" "$@" <&0 > >(tee -a "$STEPS_LOG") 2>&1 &
  STEP_PID=$!
  wait "$STEP_PID"
  rc=$?
  STEP_PID=""
  CURRENT_STEP=""
  local status=ok
  if [[ -n ${SKIP_RC:-} && $rc == "$SKIP_RC" ]]; then
    status=skipped
    rc=0
  elif [[ $rc == 124 || $rc == 137 ]]; then
    status=timeout
  elif [[ $rc != 0 ]]; then
    status=failed
  fi
  _step_record "$name" "$status" "$rc" $((SECONDS - start)) "$limit"
  return "$rc"
}

skip_step() {
  local name=$1 limit=$2 why=$3
  echo "$name: skipped, $why" | tee -a "$STEPS_LOG"
  _step_record "$name" skipped 0 0 "$limit"
  STEP_NOTES+=("$name: skipped, $why")
}

steps_summary() {
  [[ $SUMMARY_DONE == 1 ]] && return
  SUMMARY_DONE=1
  if [[ -n $CURRENT_STEP ]]; then  # the script itself was ended during a step
    [[ -n $STEP_PID ]] && kill -TERM "$STEP_PID" 2>/dev/null
    _step_record "$CURRENT_STEP" killed 143 $((SECONDS - CURRENT_START)) "$CURRENT_LIMIT"
  fi
  {
    echo "== summary (records: $STEPS_FILE)"
    printf '%-10s %-8s %5s %7s %7s\n' step status rc wall_s limit_s
    local i
    for i in "${!STEP_NAMES[@]}"; do
      printf '%-10s %-8s %5s %7s %7s\n' "${STEP_NAMES[$i]}" "${STEP_STATUS[$i]}" "${STEP_RC[$i]}" "${STEP_WALL[$i]}" \
        "${STEP_LIMIT[$i]}"
    done
    for i in "${!STEP_NOTES[@]}"; do
      echo "${STEP_NOTES[$i]}"
    done
  } | tee -a "$STEPS_LOG"
}

steps_ok() {  # 0 when every step that ran ended with status ok (or was only planned)
  local s
  for s in "${STEP_STATUS[@]}"; do
    [[ $s == ok || $s == planned || $s == skipped ]] || return 1
  done
  return 0
}
