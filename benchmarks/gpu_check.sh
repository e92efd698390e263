#!/usr/bin/env bash
# The GPU check (issue 17): on a machine with NVIDIA GPUs and no network, profile one
# model's GEMMs, attention kernels and optimizer in bf16, tf32 and fp8 (those the GPU has),
# predict and run one single-GPU plan and, with several GPUs, one NCCL data-parallel plan
# (each run ends with a few steps under torch.profiler: the kernels' time by kind, GEMM,
# attention, memory-bound, optimizer, NCCL, beside the cost model's split of the step),
# and write what was predicted beside what was measured, with the device's metadata, to
# benchmarks/results/<name>.json (<name>: gpu-check-<gpu type>-<UTC time>; the work files,
# profiles, plans and run reports, in benchmarks/results/<name>/). Under 8 minutes on one
# H200; every step has a time limit within GPU_CHECK_BUDGET_S (default 450 s).
#
#   bash benchmarks/gpu_check.sh [--dry-run] [--results DIR] [--copy-to DIR]
#
#   --dry-run     (or GPU_CHECK_DRY_RUN=1) every step but the CUDA ones, on this machine's
#                 CPU: debug-tiny profiled in fp32 (tf32 and fp8 must be refused), then
#                 predicted and run on one CPU rank and, as the data-parallel branch, on
#                 two (gloo). Results in a temporary folder unless --results names one.
#   --results DIR where <name>.json and <name>/ go (default benchmarks/results)
#   --copy-to DIR also copy <name>.json, <name>.log and <name>.tar.gz (the work folder)
#                 there: the device tool's $OUT, whose files come back
#
# Settings (environment): GPU_CHECK_MODEL (gpt3-1.3b; dry run debug-tiny), GPU_CHECK_MBS
# (4; 8), GPU_CHECK_SEQ (2048; 64), GPU_CHECK_GBS per replica (16), GPU_CHECK_STEPS (20; 4),
# GPU_CHECK_RANKS (all GPUs; dry run 2), GPU_CHECK_GPU_TYPE (the catalog type, if the
# driver's GPU name is not recognised), GPU_CHECK_PYTHON (python3), GPU_CHECK_BUDGET_S.
#
# What it assumes on the GPU machine (docs/gpu-check.md): bash, coreutils and tar; a
# python3 (or GPU_CHECK_PYTHON) with a CUDA build of torch and PyYAML. Nothing is
# installed and nothing downloaded: the repo runs from this folder (PYTHONPATH), and the
# steps it runs need nothing else of the planner's dependencies. Without torch, CUDA or
# PyYAML it stops at once with one line on stderr (exit 3). Exit 0 when every step ran
# (tf32 / fp8 refused where the GPU lacks them counts as ran), 1 otherwise.
set -uo pipefail  # not -e: a failed step is recorded and the check goes on

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT" || exit 3
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
PY=${GPU_CHECK_PYTHON:-python3}
PLAN=("$PY" -m planner.cli)
DRY_RUN=${GPU_CHECK_DRY_RUN:-0}
RESULTS=""
COPY_TO=""

while (( $# )); do
  case $1 in
    --dry-run) DRY_RUN=1 ;;
    --results) RESULTS=${2:?--results needs a folder}; shift ;;
    --copy-to) COPY_TO=${2:?--copy-to needs a folder}; shift ;;
    -h|--help) sed -n '2,31p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "gpu_check: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done

for tool in timeout tar date; do
  command -v "$tool" >/dev/null || { echo "gpu_check: $tool is not on PATH" >&2; exit 3; }
done
command -v "$PY" >/dev/null || {
  echo "gpu_check: $PY is not on PATH (set GPU_CHECK_PYTHON to the python with torch)" >&2
  exit 3; }

if [[ $DRY_RUN == 1 ]]; then
  DEVICE=cpu MODEL=${GPU_CHECK_MODEL:-debug-tiny} MBS=${GPU_CHECK_MBS:-8}
  SEQ=${GPU_CHECK_SEQ:-64} STEPS=${GPU_CHECK_STEPS:-4} WARMUP=1 TRACE=2 RUN_DTYPE=fp32
  PROFILE_DTYPES=(fp32 tf32 fp8) PROFILE_FLAGS=(--warmup 1 --repeats 5)
  MIN_BYTES=64KB MAX_BYTES=1MB  # debug-tiny's gradients: 0.5 MB
else
  DEVICE=cuda MODEL=${GPU_CHECK_MODEL:-gpt3-1.3b} MBS=${GPU_CHECK_MBS:-4}
  SEQ=${GPU_CHECK_SEQ:-2048} STEPS=${GPU_CHECK_STEPS:-20} WARMUP=3 TRACE=3 RUN_DTYPE=bf16
  PROFILE_DTYPES=(bf16 tf32 fp8) PROFILE_FLAGS=()
  MIN_BYTES=1MB MAX_BYTES=4GB
fi
GBS=${GPU_CHECK_GBS:-16}
BUDGET_S=${GPU_CHECK_BUDGET_S:-450}
START_S=$(date +%s)
DEADLINE=$(( START_S + BUDGET_S ))

# ---- preflight: torch, CUDA, the GPU's catalog type (one line and exit 3 if not) ----------
PRE=$(mktemp -d "${TMPDIR:-/tmp}/gpu-check-pre.XXXXXX")
"$PY" benchmarks/gpu_check.py preflight --device "$DEVICE" --out "$PRE/device.json" \
  > "$PRE/device.env" || exit 3
GPU_TYPE=$(sed -n 's/^gpu_type=//p' "$PRE/device.env")
NUM_GPUS=$(sed -n 's/^num_gpus=//p' "$PRE/device.env")
if [[ $DRY_RUN == 1 ]]; then
  RANKS=${GPU_CHECK_RANKS:-2}
  NAME=gpu-check-dry-run-$(date -u +%Y%m%dT%H%M%SZ)
  RESULTS=${RESULTS:-$(mktemp -d "${TMPDIR:-/tmp}/gpu-check-dry-run.XXXXXX")}
else
  RANKS=${GPU_CHECK_RANKS:-$NUM_GPUS}
  (( RANKS > NUM_GPUS )) && RANKS=$NUM_GPUS
  SLUG=$(echo "$GPU_TYPE" | tr 'A-Z' 'a-z' | tr -c 'a-z0-9.\n' '-')
  NAME=gpu-check-$SLUG-$(date -u +%Y%m%dT%H%M%SZ)
  RESULTS=${RESULTS:-$ROOT/benchmarks/results}
fi
WORK=$RESULTS/$NAME
mkdir -p "$WORK/profiles" "$WORK/plans" "$WORK/runs" || exit 3
mv "$PRE/device.json" "$WORK/device.json" && rm -rf "$PRE"
LOG=$WORK/log.txt
: > "$WORK/steps.tsv"
if [[ $DRY_RUN == 1 ]]; then
  echo "gpu_check: dry run on $RANKS CPU ranks, $MODEL, work folder $WORK" | tee "$LOG"
else
  echo "gpu_check: $NUM_GPUS x $GPU_TYPE, $MODEL, work folder $WORK" | tee "$LOG"
fi

# ---- steps ------------------------------------------------------------------------------
ms() { date +%s%3N; }

record() {  # record STEP STATUS MILLISECONDS EXIT_CODE NOTE
  local note=${5//$'\t'/ }
  printf '%s\t%s\t%d.%03d\t%s\t%s\n' "$1" "$2" $(( $3 / 1000 )) $(( $3 % 1000 )) "$4" \
    "${note//$'\n'/ }" >> "$WORK/steps.tsv"
  printf 'gpu_check: %-24s %-8s %4d s  %s\n' "$1" "$2" $(( $3 / 1000 )) \
    "$([[ $2 == ok ]] || echo "${note//$'\n'/ }")" | tee -a "$LOG"
}

run_step() {  # run_step STEP CAP_S STDOUT REFUSABLE CMD...: run it within the budget, record it
  local step=$1 cap=$2 out=$3 refusable=$4; shift 4
  local left=$(( DEADLINE - $(date +%s) ))
  if (( left < 20 )); then
    record "$step" skipped 0 - "out of time (GPU_CHECK_BUDGET_S=$BUDGET_S)"; return 124
  fi
  (( cap > left )) && cap=$left
  echo "== $step (limit ${cap} s): $*" >> "$LOG"
  local t0 rc=0
  t0=$(ms)
  timeout -k 15 "$cap" "$@" > "$out" 2> "$WORK/$step.err" || rc=$?
  local took=$(( $(ms) - t0 ))
  cat "$WORK/$step.err" >> "$LOG"
  local last
  last=$(grep -v '^\s*$' "$WORK/$step.err" | tail -n 1)
  if (( rc == 0 )); then
    record "$step" ok "$took" 0 ""
  elif (( rc == 2 )) && [[ $refusable == refusable ]]; then
    record "$step" refused "$took" "$rc" "$last"
  elif (( rc == 124 || rc == 137 )); then
    record "$step" failed "$took" "$rc" "timed out after $cap s; $last"
  else
    record "$step" failed "$took" "$rc" "$last"
  fi
  return "$rc"
}

gpu_state() {  # clocks and load beside the timings (best effort)
  command -v nvidia-smi >/dev/null && nvidia-smi --format=csv \
    --query-gpu=index,name,clocks.sm,clocks.mem,temperature.gpu,power.draw,memory.used \
    >> "$LOG" 2>&1
}

[[ $DRY_RUN == 1 ]] || gpu_state

# 1. profile the model's ops in each dtype (tf32 and fp8 refused where the GPU lacks them)
for dtype in "${PROFILE_DTYPES[@]}"; do
  refusable=required
  [[ $dtype == tf32 || $dtype == fp8 ]] && refusable=refusable
  run_step "profile-$dtype" 180 "$WORK/profile-$dtype.out" "$refusable" \
    "${PLAN[@]}" profile --device "$DEVICE" --model "$MODEL" --tp 1 --mbs "$MBS" \
    --seq "$SEQ" --dtype "$dtype" ${PROFILE_FLAGS[@]+"${PROFILE_FLAGS[@]}"} \
    -o "$WORK/profiles/ops-$dtype.csv"
done

# 2. with several GPUs (dry run: CPU ranks), the collectives among them
if (( RANKS > 1 )); then
  run_step "profile-collectives" 120 "$WORK/profile-collectives.out" required \
    "${PLAN[@]}" profile --device "$DEVICE" --collectives --nprocs "$RANKS" \
    --min-bytes "$MIN_BYTES" --max-bytes "$MAX_BYTES" ${PROFILE_FLAGS[@]+"${PROFILE_FLAGS[@]}"} \
    -o "$WORK/profiles/collectives-$RANKS.csv"
fi

# 3. predict and run each plan: one GPU, then data parallelism over all of them
plan_step() {  # plan_step NAME DP
  local name=$1 dp=$2
  local where=(--gpus "$GPU_TYPE:$dp")
  [[ $DRY_RUN == 1 ]] && where=(--cluster cluster_specs/local-cpu.yaml)
  run_step "predict-$name" 120 "$WORK/predict-$name.json" required \
    "${PLAN[@]}" simulate --model "$MODEL" "${where[@]}" --tp 1 --pp 1 --dp "$dp" \
    --mbs "$MBS" --gbs $(( GBS * dp )) --seq "$SEQ" --dtype "$RUN_DTYPE" \
    --profile "$WORK/profiles" -o "$WORK/plans/$name.yaml" --json || return
  run_step "predict-$name-analytic" 120 "$WORK/predict-$name-analytic.json" required \
    "${PLAN[@]}" simulate --plan "$WORK/plans/$name.yaml" --json
  run_step "run-$name" 300 "$WORK/runs/$name.json" required \
    "${PLAN[@]}" run --plan "$WORK/plans/$name.yaml" --profile "$WORK/profiles" \
    --steps "$STEPS" --warmup "$WARMUP" --trace "$TRACE" --report "$WORK/runs/$name" --json
}

PLANS=(single)
plan_step single 1
if (( RANKS > 1 )); then
  PLANS+=("dp$RANKS")
  plan_step "dp$RANKS" "$RANKS"
fi
[[ $DRY_RUN == 1 ]] || gpu_state

# 4. predicted vs measured, with the device's metadata
printf '{"model": "%s", "micro_batch_size": %d, "seq_len": %d, "global_batch_per_replica": %d, "steps": %d, "warmup_steps": %d, "trace_steps": %d, "run_dtype": "%s", "profile_dtypes": ["%s"], "ranks": %d, "budget_s": %d, "plans": ["%s"]}\n' \
  "$MODEL" "$MBS" "$SEQ" "$GBS" "$STEPS" "$WARMUP" "$TRACE" "$RUN_DTYPE" \
  "$(IFS=,; echo "${PROFILE_DTYPES[*]}" | sed 's/,/", "/g')" "$RANKS" "$BUDGET_S" \
  "$(IFS=,; echo "${PLANS[*]}" | sed 's/,/", "/g')" > "$WORK/settings.json"
DRY_FLAG=()
[[ $DRY_RUN == 1 ]] && DRY_FLAG=(--dry-run)
"$PY" benchmarks/gpu_check.py summarize --work "$WORK" --out "$RESULTS/$NAME.json" \
  ${DRY_FLAG[@]+"${DRY_FLAG[@]}"} 2>&1 | tee -a "$LOG"
status=${PIPESTATUS[0]}
echo "gpu_check: wrote $RESULTS/$NAME.json in $(( $(date +%s) - START_S )) s" | tee -a "$LOG"

if [[ -n $COPY_TO ]]; then
  mkdir -p "$COPY_TO" && cp "$RESULTS/$NAME.json" "$COPY_TO/" && cp "$LOG" "$COPY_TO/$NAME.log" \
    && tar -czf "$COPY_TO/$NAME.tar.gz" -C "$RESULTS" "$NAME" \
    || echo "gpu_check: copying to $COPY_TO failed" >&2
fi
(( status == 0 )) || exit 1
cut -f2 "$WORK/steps.tsv" | grep -qvE '^(ok|refused)$' && exit 1
exit 0
