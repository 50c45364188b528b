#!/usr/bin/env bash
# What Horovod's timeline costs a training step: the resnet50 profile
# (hvdd bench --profile resnet50: ResNet-50's 161 gradients allreduced
# asynchronously per step) with the timeline off and on, 2 ranks on one
# node (--np 2) or on two "nodes" of one rank each, daemons on the loopback
# addresses 127.0.0.2 and 127.0.0.3 (--nodes 2: hvdd run -H
# 127.0.0.2:1,127.0.0.3:1).
#
# Usage: bench/timeline.sh [--rounds N] [--iters N] [--gap DURATION] [--nodes 1|2] [--separate] [HVDD_BIN]
#        (defaults: 5 rounds, 20 iterations, no gap, 1 node, bin/hvdd)
#
# Two ways to alternate:
#   default     each round is one job, hvdd bench --timeline F --timeline-compare:
#               its steps alternate between timeline off and on in blocks of 5
#               (rank 0 starts the timeline before each traced block and stops
#               it after, untimed), so both see the same moments of this shared
#               machine;
#   --separate  each round is two jobs, off then on, the second with the
#               timeline running for the whole job (hvdd bench --timeline F,
#               its steady state), each also timing one fused allreduce of the
#               same bytes, alternated step by step (its time follows the
#               machine's drift, not the timeline: the step over the fused
#               takes that drift out).
#
# --gap sleeps that long before each step (hvdd bench --gap, untimed): the
# compute of a training step between its reductions; without it every step
# is reduction only, the worst case for the timeline's share.
#
# Results in bench/results/<UTC date>_timeline[_separate][_gapD][_2nodes]/:
# meta.txt, commands.txt (every command with the 1-minute load average
# before and after it), one .log per job (the JSON rows, the daemons'
# warnings: a timeline that drops events says so there), results.tsv and
# summary.txt (medians over rounds and on/off ratios).
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=5; ITERS=20; GAP=0s; NODES=1; SEPARATE=0
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) ROUNDS=$2; shift ;;
    --iters) ITERS=$2; shift ;;
    --gap) GAP=$2; shift ;;
    --nodes) NODES=$2; shift ;;
    --separate) SEPARATE=1 ;;
    -h|--help) sed -n '2,33p' "$0"; exit 0 ;;
    -*) echo "unknown argument $1" >&2; exit 2 ;;
    *) break ;;
  esac
  shift
done
case "$NODES" in 1|2) ;; *) echo "--nodes 1 or 2" >&2; exit 2 ;; esac
bin=$(readlink -f "${1:-bin/hvdd}")
[ -x "$bin" ] || { echo "no hvdd binary at $bin (go build -o bin/hvdd ./cmd/hvdd)" >&2; exit 1; }
suffix=""; [ "$SEPARATE" = 1 ] && suffix="_separate"
[ "$GAP" != 0s ] && suffix="${suffix}_gap$GAP"; [ "$NODES" = 2 ] && suffix="${suffix}_2nodes"
OUT=${OUT:-bench/results/$(date -u +%Y-%m-%d_%H%M%S)_timeline$suffix}
mkdir -p "$OUT"
W=$(mktemp -d); trap 'rm -rf "$W"' EXIT
{
  echo "date_utc: $(date -u +%FT%TZ)"
  echo "repo_head: $(git rev-parse HEAD 2>/dev/null || echo '?') $(git diff --quiet HEAD -- . 2>/dev/null || echo '(tree differs from HEAD)')"
  echo "hvdd_bin: $bin sha256=$(sha256sum "$bin" | cut -c1-16)"
  echo "machine: $(getconf _NPROCESSORS_ONLN) cpus, $(uname -r), loadavg $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "profile: resnet50, 2 ranks on $NODES node(s), iters $ITERS, warm-up 5, gap $GAP, rounds $ROUNDS, separate jobs $SEPARATE"
} | tee "$OUT/meta.txt"

load() { cut -d' ' -f1 /proc/loadavg; }
# median_ms LOG VARIANT: the median of VARIANT's row, in ms.
median_ms() {
  local us
  us=$(grep -o "\"variant\":\"$2\".*" "$1" | grep -o '"median_us":[0-9.e+-]*' | head -1 | cut -d: -f2)
  [ -n "$us" ] || { echo "no $2 row in $1" >&2; exit 1; }
  printf '%.3f' "$(echo "$us / 1000" | bc -l)"
}
# job NAME ARGS...: runs hvdd bench ARGS as a 2-rank job into $OUT/NAME.log.
job() {
  local name=$1; shift
  local cmd
  if [ "$NODES" = 1 ]; then
    cmd=("$bin" bench --np 2 "$@")
  else
    cmd=("$bin" run -np 2 -H 127.0.0.2:1,127.0.0.3:1 -- "$bin" bench "$@")
  fi
  local before after
  before=$(load)
  "${cmd[@]}" >"$OUT/$name.log" 2>&1 || { tail -n 20 "$OUT/$name.log" >&2; echo "$name failed (log: $OUT/$name.log)" >&2; exit 1; }
  after=$(load)
  echo "$name (load before $before, after $after): ${cmd[*]}" | tee -a "$OUT/commands.txt"
  LOADS="$before	$after"
}
# events FILE: the number of records in a timeline file, which is then removed.
events() { python3 -c 'import json,sys; print(len(json.load(open(sys.argv[1]))))' "$1"; rm -f "$1"; }

base=(--profile resnet50 --iters "$ITERS" --gap "$GAP" --json)
if [ "$SEPARATE" = 0 ]; then
  printf 'round\toff_median_ms\ton_median_ms\ton_over_off\tlast_block_events\tload_before\tload_after\n' >"$OUT/results.tsv"
  for r in $(seq 1 "$ROUNDS"); do
    job "r$r" "${base[@]}" --timeline "$W/timeline.json" --timeline-compare
    off=$(median_ms "$OUT/r$r.log" 161_async_waitall)
    on=$(median_ms "$OUT/r$r.log" 161_async_waitall_timeline)
    printf '%s\t%s\t%s\t%.4f\t%s\t%s\n' "$r" "$off" "$on" "$(echo "$on / $off" | bc -l)" "$(events "$W/timeline.json")" "$LOADS" \
      | tee -a "$OUT/results.tsv"
  done
else
  printf 'round\tmode\tstep_median_ms\tfused_median_ms\ttimeline_events\tload_before\tload_after\n' >"$OUT/results.tsv"
  for r in $(seq 1 "$ROUNDS"); do
    for mode in off on; do
      tl=(); [ "$mode" = on ] && tl=(--timeline "$W/timeline.json")
      job "r${r}_$mode" "${base[@]}" "${tl[@]}"
      n=0; [ "$mode" = on ] && n=$(events "$W/timeline.json")
      printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$r" "$mode" "$(median_ms "$OUT/r${r}_$mode.log" 161_async_waitall)" \
        "$(median_ms "$OUT/r${r}_$mode.log" 1_fused)" "$n" "$LOADS" | tee -a "$OUT/results.tsv"
    done
  done
fi

python3 - "$OUT/results.tsv" "$SEPARATE" <<'PY' | tee "$OUT/summary.txt"
import csv, statistics, sys
rows = list(csv.DictReader(open(sys.argv[1]), delimiter="\t"))
med = statistics.median
fmt = lambda xs, f="{:.2f}": " ".join(f.format(v) for v in xs)
if sys.argv[2] == "0":
    off = [float(r["off_median_ms"]) for r in rows]
    on = [float(r["on_median_ms"]) for r in rows]
    ratio = [float(r["on_over_off"]) for r in rows]
    print(f"step, timeline off: median {med(off):.2f} ms ({fmt(off)})")
    print(f"step, timeline on:  median {med(on):.2f} ms ({fmt(on)})")
    print(f"on/off: median of the rounds' ratios {med(ratio):.3f} ({fmt(ratio, '{:.3f}')}); of the medians {med(on) / med(off):.3f}")
else:
    by = {m: [r for r in rows if r["mode"] == m] for m in ("off", "on")}
    for q in ("step", "fused"):
        off = [float(r[q + "_median_ms"]) for r in by["off"]]
        on = [float(r[q + "_median_ms"]) for r in by["on"]]
        pairs = [b / a for a, b in zip(off, on)]
        print(f"{q:5}  off median {med(off):8.2f} ms ({fmt(off)})")
        print(f"{q:5}  on  median {med(on):8.2f} ms ({fmt(on)})")
        print(f"{q:5}  on/off of the medians {med(on) / med(off):.3f}; median of the rounds' on/off {med(pairs):.3f} ({fmt(pairs, '{:.3f}')})")
    norm = {m: [float(r["step_median_ms"]) / float(r["fused_median_ms"]) for r in by[m]] for m in ("off", "on")}
    pairs = [b / a for a, b in zip(norm["off"], norm["on"])]
    print(f"step/fused off {med(norm['off']):.3f}, on {med(norm['on']):.3f}: on/off {med(norm['on']) / med(norm['off']):.3f}; "
          f"median of the rounds' on/off {med(pairs):.3f} ({fmt(pairs, '{:.3f}')})")
loads = [float(r[k]) for r in rows for k in ("load_before", "load_after")]
print(f"load average (1 min) over the runs: {min(loads):.2f} to {max(loads):.2f}")
PY
if grep -q 'dropped' "$OUT"/*.log; then
  echo "timeline dropped events in: $(grep -l 'dropped' "$OUT"/*.log | xargs)" | tee -a "$OUT/summary.txt"
fi
