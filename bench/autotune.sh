#!/usr/bin/env bash
# Autotuning against the defaults, on the ResNet-50 profile (hvdd bench
# --profile resnet50: 161 gradients allreduced per step):
#   1. one node, 2 ranks;
#   2. two network namespaces joined by a veth pair limited to --rate
#      (default 1gbit) by tc tbf, 1 rank each (the tcp engine across them).
# For each: one tuning run (HOROVOD_AUTOTUNE=1; its CSV log's last row is the
# best configuration), then --rounds interleaved pairs of runs, the defaults
# and the tuned settings pinned (HOROVOD_FUSION_THRESHOLD, HOROVOD_CYCLE_TIME,
# HVDD_SPIN, HVDD_TCP_STREAMS, HVDD_TCP_CHUNK_BYTES, HVDD_TCP_SMALL_BYTES),
# each the median step time of --iters steps. Prints per-run medians, their
# medians and the ratio. Needs root for the namespaces.
#
# Usage: bench/autotune.sh [--rounds N] [--iters N] [--rate RATE] [--dtype T]
#          [--steps-per-sample K] [--max-samples M] [--warmup-samples W]
#          [--only 1node|netns]
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=5 ITERS=20 RATE=1gbit DTYPE=float32 K=10 M=20 WARM=3 ONLY=""
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) ROUNDS=$2; shift ;;
    --iters) ITERS=$2; shift ;;
    --rate) RATE=$2; shift ;;
    --dtype) DTYPE=$2; shift ;;
    --steps-per-sample) K=$2; shift ;;
    --max-samples) M=$2; shift ;;
    --warmup-samples) WARM=$2; shift ;;
    --only) ONLY=$2; shift ;;
    -h|--help) sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "autotune.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done
go build -o bin/hvdd ./cmd/hvdd
OUT="bench/results/autotune-$(date +%Y-%m-%d_%H%M%S)"; mkdir -p "$OUT"
log() { echo "$*" | tee -a "$OUT/log"; }
load() { cut -d' ' -f1 /proc/loadavg; }
log "# commit $(git rev-parse --short HEAD)$(git diff --quiet || echo +dirty), $(nproc) cores, load $(load)"
# Steps a tuning run needs: (warm-ups + samples) configurations of 5 samples
# of K steps, and a margin for the steps that end samples.
TUNE_STEPS=$(( (WARM + M) * 5 * (K + 1) + 20 ))
unset HOROVOD_FUSION_THRESHOLD HOROVOD_CYCLE_TIME HVDD_SPIN HVDD_TCP_STREAMS HVDD_TCP_CHUNK_BYTES HVDD_TCP_SMALL_BYTES

# tuned_env CSV prints the environment that pins the best row of CSV.
tuned_env() {
  python3 - "$1" <<'PY'
import csv, sys
rows = list(csv.reader(open(sys.argv[1])))
head, best = rows[0], dict(zip(rows[0], rows[-1]))
env = {"fusion_threshold_mb": ("HOROVOD_FUSION_THRESHOLD", lambda v: str(int(float(v) * 2**20))),
       "cycle_time_ms": ("HOROVOD_CYCLE_TIME", lambda v: v),
       "spin_us": ("HVDD_SPIN", lambda v: "%dus" % round(float(v)) if round(float(v)) > 0 else "-1ns"),
       "streams": ("HVDD_TCP_STREAMS", lambda v: str(int(float(v)))),
       "chunk_kb": ("HVDD_TCP_CHUNK_BYTES", lambda v: str(int(float(v)) * 1024)),
       "small_kb": ("HVDD_TCP_SMALL_BYTES", lambda v: str(int(float(v)) * 1024))}
print(" ".join("%s=%s" % (env[k][0], env[k][1](best[k])) for k in head if k in env))
PY
}

# step_ms reads the resnet50 rows of a bench run and prints the median step
# time of the 161-tensor variant.
step_ms() { grep -o '{.*"161_async_waitall".*}' | head -1 | python3 -c 'import json,sys; print(json.loads(sys.stdin.read())["median_us"] / 1000)'; }

# compare NAME RUNCMD...: tuning run, then interleaved default/tuned rounds.
compare() {
  local name=$1; shift
  local csv="$PWD/$OUT/tune-$name.csv"
  log "== $name: tuning run ($TUNE_STEPS steps; K=$K M=$M warm-ups=$WARM), load $(load)"
  env HOROVOD_AUTOTUNE=1 HOROVOD_AUTOTUNE_LOG="$csv" HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE=$K \
    HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES=$M HOROVOD_AUTOTUNE_WARMUP_SAMPLES=$WARM \
    "$@" --profile resnet50 --dtype "$DTYPE" --iters "$TUNE_STEPS" --warmup 0 --json > "$OUT/tune-$name.out" 2>&1
  local tuned; tuned=$(tuned_env "$csv")
  log "best: $(tail -1 "$csv")  ->  $tuned"
  local d=() t=()
  for r in $(seq 1 "$ROUNDS"); do
    local l0; l0=$(load)
    d+=("$("$@" --profile resnet50 --dtype "$DTYPE" --iters "$ITERS" --json 2>&1 | tee -a "$OUT/$name-default.out" | step_ms)")
    t+=("$(env $tuned "$@" --profile resnet50 --dtype "$DTYPE" --iters "$ITERS" --json 2>&1 | tee -a "$OUT/$name-tuned.out" | step_ms)")
    log "round $r: default ${d[-1]} ms, tuned ${t[-1]} ms (load $l0 -> $(load))"
  done
  python3 - "$name" "${d[*]}" "${t[*]}" <<'PY' | tee -a "$OUT/log"
import statistics as st, sys
name, d, t = sys.argv[1], [float(x) for x in sys.argv[2].split()], [float(x) for x in sys.argv[3].split()]
md, mt = st.median(d), st.median(t)
print(f"{name}: median step default {md:.1f} ms, tuned {mt:.1f} ms; tuned/default throughput {md/mt:.3f}")
PY
}

if [ "$ONLY" != netns ]; then
  compare 1node bin/hvdd bench --np 2
fi
if [ "$ONLY" != 1node ]; then
  NS=hva; A=10.213.251.1; B=10.213.251.2; W=$(mktemp -d); TBF=1
  trap netns_cleanup EXIT
  . bench/netns.sh
  log "# netns link limited to $RATE (tc tbf)"
  compare "netns-$RATE" bin/hvdd run -np 2 -H $A:1,$B:1 --agent "$W/agent" -- "$PWD/bin/hvdd" bench
fi
log "results in $OUT"
