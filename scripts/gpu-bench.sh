#!/usr/bin/env bash
# scripts/gpu-bench.sh: the figures of issue 26 in one run on a GPU machine
# (no Go, no network), from a copy of the working tree with bin/ built
# beforehand by scripts/gpu-build.sh. Every rank shares the one GPU (cuda:0).
# Steps, in order:
#
#   env            nvidia-smi, compute mode, torch, torchvision, MPS, hvdd gpus
#                  (recorded, never fails)
#   copy-B         B, the GPU's device-to-device copy rate, bytes read and
#                  written counted (peer_bench.py copy: 1 GiB copy_, CUDA
#                  events, median)                               -> B.json
#   nccl-world1    torch.distributed NCCL at world size 1: 4 KiB blocking
#                  allreduce latency, 64 MiB algbw (peer_bench.py nccl1)
#                                                                -> nccl1.json
#   hvdd-bench-npN bin/hvdd bench --np N --device cuda, 4 B .. 256 MiB, N = 1,
#                  2, 4 (its --json rows)            -> hvdd-bench-npN.jsonl
#   latency-npN    bench_latency.py --parts under bin/hvdd run -np N, N = 1
#                  and 2: hvdd.torch's 4 KiB allreduce_ (and NCCL's at 1
#                  rank), its submit and wait timed apart, and the op with a
#                  stream sync instead of an interprocess event
#                                                          -> latency-npN.json
#   train-MODE     train_resnet.py, 2 ranks under bin/hvdd run: ResNet-50,
#                  synthetic data, batch 32 per rank; MODE hvdd
#                  (DistributedOptimizer), noallreduce (the same processes,
#                  no allreduce), ddp-gloo (torch DDP on gloo, CUDA tensors)
#                                                          -> train-MODE.json
#   gloo-npN       torch.distributed gloo with CUDA tensors, N = 2 and 4
#                  ranks: 4 KiB latency, 64 MiB busbw (peer_bench.py gloo)
#                                                           -> gloo-npN.json
#   latency-npN-stream, latency-npN-inhost
#                  the same as latency-npN with the daemon's completion
#                  ordered on the GPU (HVDD_GPU_COMPLETION=stream), and with
#                  that and the client's event waited for on the daemon's
#                  host (HVDD_GPU_INPUT_WAIT=host), right after it
#   *-base         with --base (bin/hvdd-base, from scripts/gpu-build.sh
#                  --baseline REV): hvdd-bench-np2 and latency-np1/np2 run
#                  with the baseline binary too, each just before the same
#                  step with bin/hvdd (old and new alternated in one run)
#   mps-*          where nvidia-cuda-mps-control exists (and without
#                  --no-mps): MPS started (pipe directory under /tmp, its logs
#                  in mps-log/), then latency-np2, hvdd-bench-np2 and the
#                  three train steps again, as *-mps; every daemon those steps
#                  use is started after MPS (a fresh one per step), so that
#                  its context goes through MPS too. MPS is stopped at the
#                  end, and on any exit.
#
# Output, in $OUT (the device tool's folder; else ./gpu-bench-out, or --out),
# rewritten after every step, so that a run cut short still returns them:
#   summary.md   one table (measure, hvdd, peer/limit, ratio, target,
#                PASS/FAIL/INFO/n/a) against the issue's targets, then the
#                steps (clients/python/tests/gpu/bench_summary.py)
#   steps.txt    one line per step: PASS / FAIL / SKIP and why
#   bench.log    every step's command and full output
#   *.json, *.jsonl  each step's raw figures (above)
# A step starts only with a third of its time limit (20 s at least) left
# before the deadline (--deadline, default 340 s: the run stays under 6
# minutes); the rest are SKIPPED as out of time. A step whose helper finds
# no torch or no CUDA device (exit status 3) is SKIPPED with its reason.
# Exit status: 0 if no step failed (a missed target is not a failed step:
# summary.md says which), 1 if one did, 2 on usage.
#
# Usage: scripts/gpu-bench.sh [--out DIR] [--deadline SECONDS] [--quick]
#                             [--no-mps] [--base] [--only REGEX] [--dry-run]
#                             [--cpu-check] [--help]
#   --quick      fewer iterations and steps everywhere (about half the time)
#   --base       also the baseline steps (*-base) with bin/hvdd-base (about
#                a minute more: give --deadline room)
#   --no-mps     skip the MPS block
#   --only REGEX run only the steps whose names match (bash =~), e.g.
#                'train' or 'mps$' for a rerun; the others are SKIPPED
#   --dry-run    print each step's command and limit; run nothing
#   --cpu-check  the same steps on a machine without GPU, to check this
#                script: python helpers on CPU tensors (--device cpu),
#                hvdd bench on gpu/fake, small sizes; the figures mean nothing
# Environment: HVDD_BIN (default bin/hvdd), GPU_BENCH_PYTHON (default python3).
# Here first: scripts/gpu-build.sh. There, through the device tool:
#   run(command="scripts/gpu-bench.sh", carry=["bin"], timeout_s=420)
set -uo pipefail

out=${OUT:-./gpu-bench-out}
deadline=340
quick=0 use_mps=1 with_base=0 dry=0 cpu=0 only=
while [ $# -gt 0 ]; do
  case $1 in
    -h|--help) awk 'NR > 1 && /^set -uo pipefail/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0"; exit 0 ;;
    --out) out=${2:?--out needs a directory}; shift 2 ;;
    --deadline) deadline=${2:?--deadline needs seconds}; shift 2 ;;
    --quick) quick=1; shift ;;
    --no-mps) use_mps=0; shift ;;
    --base) with_base=1; shift ;;
    --only) only=${2?--only needs a pattern}; shift 2 ;;
    --dry-run) dry=1; shift ;;
    --cpu-check) cpu=1; shift ;;
    *) echo "scripts/gpu-bench.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
case $deadline in '' | *[!0-9]*) echo "scripts/gpu-bench.sh: --deadline must be whole seconds" >&2; exit 2 ;; esac

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root" || exit 1
mkdir -p "$out" || exit 1
out=$(cd "$out" && pwd)
steps=$out/steps.txt
log=$out/bench.log
rm -f "$out"/*.json "$out"/*.jsonl "$out/summary.md"
: > "$steps"
: > "$log"
hvdd=${HVDD_BIN:-$root/bin/hvdd}
base=$root/bin/hvdd-base
py=${GPU_BENCH_PYTHON:-python3}
gpu=$root/clients/python/tests/gpu
export PYTHONPATH="$root/clients/python${PYTHONPATH:+:$PYTHONPATH}"
# gpu-build.sh's pure-Python wheels, only for what python3 lacks (as in
# gpu-check.sh): ahead of site-packages they would shadow an installed one.
if ! "$py" -c "import google.protobuf" 2>/dev/null && [ -d "$root/bin/pylib/protobuf" ]; then
  PYTHONPATH="$PYTHONPATH:$root/bin/pylib/protobuf"
  echo "$py lacks google.protobuf: using bin/pylib/protobuf"
fi
export PYTHONUNBUFFERED=1
export HVDD_BIN=$hvdd
tmp=$(mktemp -d /tmp/gpu-bench.XXXXXX) || exit 1
start=$SECONDS
npass=0 nfail=0 nskip=0
mps_on=0

# Sizes and iterations: full, --quick, --cpu-check (CPU tensors, gpu/fake).
pydev=cuda benchdev=cuda
copy_args=(--bytes $((1 << 30)) --reps 20)
nccl_args=(--iters 2000 --warmup 200 --large-iters 30)
gloo_args=(--iters 1000 --warmup 100 --large-iters 10)
bench_args=(--min-bytes 4 --max-bytes 256M)
lat_args=(--iters 2000 --warmup 200 --parts)
train_args=(--warmup 10 --steps 30)
if [ "$quick" = 1 ]; then
  copy_args=(--bytes $((1 << 30)) --reps 10)
  nccl_args=(--iters 500 --warmup 50 --large-iters 10)
  gloo_args=(--iters 300 --warmup 30 --large-iters 5)
  bench_args=(--min-bytes 4 --max-bytes 256M --step-factor 4 --small-iters 300 --small-time 50ms --iters 10)
  lat_args=(--iters 500 --warmup 50 --parts)
  train_args=(--warmup 5 --steps 10)
fi
if [ "$cpu" = 1 ]; then
  pydev=cpu benchdev=fake
  copy_args=(--bytes $((64 << 20)) --reps 3)
  gloo_args=(--iters 20 --warmup 2 --large-iters 2 --large-bytes $((4 << 20)))
  bench_args=(--min-bytes 4 --max-bytes 256M --step-factor 4 --small-iters 10 --small-time 10ms --iters 2 --warmup 1)
  lat_args=(--iters 50 --warmup 5)
  train_args=(--warmup 1 --steps 2 --model small --batch 4 --image-size 32)
fi

# note STATUS NAME WHY: one line of steps.txt, echoed (paths in the tree
# written relative to it).
note() {
  printf '%-4s %-24s %s\n' "$1" "$2" "${3//$root\//}" | tee -a "$steps"
  case $1 in PASS) npass=$((npass + 1)) ;; FAIL) nfail=$((nfail + 1)) ;; SKIP) nskip=$((nskip + 1)) ;; esac
}

# summarize: summary.md from what the steps left so far.
summarize() {
  "$py" "$gpu/bench_summary.py" "$out" > /dev/null 2>> "$log" || echo "bench_summary.py failed (bench.log)" >&2
}

# step NAME LIMIT CMD...: runs CMD in the tree under a time limit (LIMIT
# seconds, or what is left before the deadline), its output to bench.log;
# with $capture set, the output's JSON lines also go to that file. Exit
# status 3 (a helper without torch or CUDA) is a SKIP with its reason.
capture=
step() {
  local name=$1 limit=$2 left rc t0 why
  shift 2
  if ! wanted "$name"; then
    note SKIP "$name" "not matched by --only '$only'"
    return 0
  fi
  left=$((deadline - (SECONDS - start)))
  if [ "$left" -lt 20 ] || [ "$left" -lt $((limit / 3)) ]; then
    note SKIP "$name" "out of time ($left s left of --deadline $deadline s): $*"
    return 0
  fi
  [ "$limit" -le "$left" ] || limit=$left
  {
    echo
    echo "== $name (limit ${limit}s, $(date -u +%T)): $*"
  } >> "$log"
  if [ "$dry" = 1 ]; then
    note DRY "$name" "limit ${limit}s: $*"
    return 0
  fi
  t0=$SECONDS
  timeout -k 10 "$limit" "$@" > "$out/.step" 2>&1
  rc=$?
  cat "$out/.step" >> "$log"
  if [ -n "$capture" ]; then
    grep '^{' "$out/.step" > "$capture"
  fi
  case $rc in
    0) note PASS "$name" "$(( SECONDS - t0 ))s: $*" ;;
    3) why=$(grep -E 'no CUDA device|no torch|no NCCL' "$out/.step" | tail -1)
       note SKIP "$name" "${why:-exit status 3 (no torch or no CUDA device)}" ;;
    124 | 137) note FAIL "$name" "timed out after ${limit}s: $*" ;;
    *) note FAIL "$name" "exit status $rc after $(( SECONDS - t0 ))s: $*" ;;
  esac
  echo "== $name: exit status $rc" >> "$log"
  summarize
}

# wanted NAME: whether --only (if given) selects the step.
wanted() {
  [ -z "$only" ] || [[ $1 =~ $only ]]
}

# MPS: the control daemon with its pipes under $tmp and its logs in $out.
mps_start() {
  export CUDA_MPS_PIPE_DIRECTORY=$tmp/mps
  export CUDA_MPS_LOG_DIRECTORY=$out/mps-log
  mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
  echo "== mps-start: CUDA_MPS_PIPE_DIRECTORY=$CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY=$CUDA_MPS_LOG_DIRECTORY nvidia-cuda-mps-control -d" >> "$log"
  if [ "$dry" = 1 ]; then
    note DRY mps-start "nvidia-cuda-mps-control -d"
    mps_on=1
    return 0
  fi
  if timeout 20 nvidia-cuda-mps-control -d >> "$log" 2>&1; then
    mps_on=1
    note PASS mps-start "nvidia-cuda-mps-control -d (pipes $CUDA_MPS_PIPE_DIRECTORY, logs mps-log/)"
  else
    note FAIL mps-start "nvidia-cuda-mps-control -d failed (bench.log, mps-log/)"
    unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
    return 1
  fi
}

# mps_servers: the MPS servers running now (one per uid that used MPS).
mps_servers() {
  echo get_server_list | timeout 10 nvidia-cuda-mps-control 2>> "$log"
}

mps_stop() {
  [ "$mps_on" = 1 ] || return 0
  mps_on=0
  echo "== mps-stop: echo quit | nvidia-cuda-mps-control" >> "$log"
  if [ "$dry" = 1 ]; then
    note DRY mps-stop "echo quit | nvidia-cuda-mps-control"
  elif echo quit | timeout 20 nvidia-cuda-mps-control >> "$log" 2>&1; then
    sleep 1
    note PASS mps-stop "echo quit | nvidia-cuda-mps-control"
  else
    note FAIL mps-stop "echo quit | nvidia-cuda-mps-control failed: the control daemon may still run (pipes in $CUDA_MPS_PIPE_DIRECTORY)"
  fi
  {
    echo "-- mps-log/control.log:"
    cat "$CUDA_MPS_LOG_DIRECTORY/control.log" 2>&1
  } >> "$log"
  unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
}

cleanup() {
  mps_stop
  rm -f "$out/.step"
  rm -rf "$tmp"
  summarize
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# bench NAME NP [BIN]: hvdd bench --np NP on the device, its JSON rows kept.
bench() {
  capture=$out/$1.jsonl step "$1" 90 "${3:-$hvdd}" bench --np "$2" --device "$benchdev" --json "${bench_args[@]}"
}

# latency NAME NP [BIN]: bench_latency.py under hvdd run (a fresh daemon).
latency() {
  step "$1" 120 "${3:-$hvdd}" run -np "$2" --socket "$tmp/$1.sock" -- \
    "$py" "$gpu/bench_latency.py" --json "$out/$1.json" "${lat_args[@]}"
}

# latency_modes NAME NP: latency NAME (the daemon's default, host-
# synchronised completion), then NAME-stream (--gpu-completion stream:
# completion ordered on the GPU) and NAME-inhost (stream, with the client's
# event waited for on the daemon's host: HVDD_GPU_INPUT_WAIT=host),
# alternated in one run.
latency_modes() {
  based latency "$1" "$2"
  HVDD_GPU_COMPLETION=stream latency "$1-stream" "$2"
  HVDD_GPU_COMPLETION=stream HVDD_GPU_INPUT_WAIT=host latency "$1-inhost" "$2"
}

# based KIND NAME NP: with --base, KIND (bench or latency) NAME-base with
# bin/hvdd-base first, then NAME with bin/hvdd.
based() {
  if [ "$with_base" = 1 ]; then
    if [ -x "$base" ]; then
      "$1" "$2-base" "$3" "$base"
    else
      note SKIP "$2-base" "no $base: scripts/gpu-build.sh --baseline REV builds it"
    fi
  fi
  "$1" "$2" "$3"
}

# train SUFFIX: the three training steps, 2 ranks under hvdd run.
train() {
  local m
  for m in hvdd noallreduce ddp-gloo; do
    step "train-$m$1" 150 "$hvdd" run -np 2 --socket "$tmp/train-$m$1.sock" -- \
      "$py" "$gpu/train_resnet.py" --mode "$m" --device "$pydev" --store "$tmp/train-$m$1.store" \
      --json "$out/train-$m$1.json" "${train_args[@]}"
  done
}

echo "hvdd GPU bench, $(date -u '+%Y-%m-%d %H:%M:%S UTC'), $(uname -n)$([ "$quick" = 1 ] && echo ', --quick')$([ "$cpu" = 1 ] && echo ', --cpu-check')$([ "$dry" = 1 ] && echo ', --dry-run')" | tee -a "$steps"

# env: what the machine is; recorded, not judged.
{
  echo "== env"
  uname -a
  if command -v nvidia-smi >/dev/null; then
    nvidia-smi
    nvidia-smi -L
    nvidia-smi --query-gpu=name,driver_version,compute_mode,memory.total,clocks.max.memory --format=csv
  fi
  "$py" -c 'import sys, torch; print(sys.executable, "torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available(), torch.cuda.device_count(), "GPUs")'
  "$py" -c 'import torchvision; print("torchvision", torchvision.__version__)' || echo "no torchvision: train_resnet.py uses its small built-in net"
  command -v nvidia-cuda-mps-control || echo "no nvidia-cuda-mps-control"
  [ -e /tmp/nvidia-mps/control ] && echo "note: an MPS control daemon already listens on /tmp/nvidia-mps: processes without CUDA_MPS_PIPE_DIRECTORY go through it"
  [ -x "$hvdd" ] && "$hvdd" gpus
} >> "$log" 2>&1
gpu_name=$(nvidia-smi --query-gpu=name,driver_version,compute_mode --format=csv,noheader 2>/dev/null | head -1)
echo "device: ${gpu_name:-unknown (no nvidia-smi)}" | tee -a "$steps"

if [ ! -x "$hvdd" ]; then
  if [ "$dry" = 1 ]; then
    echo "(no $hvdd: a real run would stop here)" | tee -a "$steps"
  else
    note FAIL hvdd "no $hvdd: run scripts/gpu-build.sh where Go is, and carry bin/"
    echo "totals: $npass passed, $nfail failed, $nskip skipped" | tee -a "$steps"
    exit 1
  fi
else
  echo "hvdd: $("$hvdd" version 2>&1)" | tee -a "$steps"
fi

step copy-B 60 "$py" "$gpu/peer_bench.py" copy --device "$pydev" --json "$out/B.json" "${copy_args[@]}"
step nccl-world1 90 "$py" "$gpu/peer_bench.py" nccl1 --json "$out/nccl1.json" "${nccl_args[@]}"
based bench hvdd-bench-np2 2
bench hvdd-bench-np4 4
bench hvdd-bench-np1 1
latency_modes latency-np1 1
latency_modes latency-np2 2
train ""
for n in 2 4; do
  step "gloo-np$n" 120 "$py" "$gpu/peer_bench.py" gloo --np "$n" --device "$pydev" --json "$out/gloo-np$n.json" "${gloo_args[@]}"
done

# The same under MPS, where the machine has it.
left=$((deadline - (SECONDS - start)))
if [ "$use_mps" = 0 ]; then
  note SKIP mps "--no-mps"
elif ! command -v nvidia-cuda-mps-control >/dev/null; then
  note SKIP mps "no nvidia-cuda-mps-control on this machine"
elif [ "$left" -lt 40 ]; then
  note SKIP mps "out of time ($left s left of --deadline $deadline s)"
elif ! wanted latency-np2-mps && ! wanted hvdd-bench-np2-mps && ! wanted train-hvdd-mps &&
  ! wanted train-noallreduce-mps && ! wanted train-ddp-gloo-mps; then
  note SKIP mps "no MPS step matched by --only '$only'"
elif mps_start; then
  latency latency-np2-mps 2
  HVDD_GPU_COMPLETION=stream latency latency-np2-mps-stream 2
  HVDD_GPU_COMPLETION=stream HVDD_GPU_INPUT_WAIT=host latency latency-np2-mps-inhost 2
  bench hvdd-bench-np2-mps 2
  # The control daemon starts a server for the first client and logs each
  # client (control.log: "NEW CLIENT"): neither means the steps above ran
  # without MPS.
  if [ "$dry" = 0 ] && { [ -s "$out/latency-np2-mps.json" ] || [ -s "$out/hvdd-bench-np2-mps.jsonl" ]; }; then
    servers=$(mps_servers | tr '\n' ' ')
    clients=$(grep -c 'NEW CLIENT' "$CUDA_MPS_LOG_DIRECTORY/control.log" 2>/dev/null)
    echo "== MPS after latency-np2-mps and hvdd-bench-np2-mps: servers ${servers:-none}; ${clients:-0} clients in control.log" >> "$log"
    if [ -n "$servers" ] || [ "${clients:-0}" -gt 0 ]; then
      note PASS mps-used "MPS server(s) ${servers:-none running now}; ${clients:-0} clients so far (mps-log/control.log)"
    else
      note FAIL mps-used "no MPS server and no client in mps-log/control.log: latency-np2-mps and hvdd-bench-np2-mps ran without MPS"
    fi
  fi
  train -mps
  mps_stop
fi

summarize
echo
if [ -f "$out/summary.md" ]; then
  sed -n '/^| measure/,/^$/p' "$out/summary.md"
  grep '^targets:' "$out/summary.md"
fi
echo "totals: $npass passed, $nfail failed, $nskip skipped in $(( SECONDS - start ))s; the table in summary.md, details in bench.log" | tee -a "$steps"
[ "$nfail" -eq 0 ]
