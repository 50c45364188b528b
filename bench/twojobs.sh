#!/usr/bin/env bash
# Two jobs on one daemon against one job alone: a daemon with --slots 4 runs
# `hvdd bench` (2 ranks, named job A) alone, then jobs A and B (2 ranks each)
# at once, in --rounds interleaved rounds. Each figure is a job's median
# iteration time of a float32 allreduce of --bytes (and the resnet50 profile
# with --resnet), as throughput relative to A alone in the same round.
#
# Usage: bench/twojobs.sh [--rounds N] [--bytes SIZE] [--iters N] [--resnet]
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=5 BYTES=64M ITERS=30 RESNET=0
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) ROUNDS=$2; shift ;;
    --bytes) BYTES=$2; shift ;;
    --iters) ITERS=$2; shift ;;
    --resnet) RESNET=1 ;;
    -h|--help) sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "twojobs.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done
go build -o bin/hvdd ./cmd/hvdd
OUT="bench/results/twojobs-$(date +%Y-%m-%d_%H%M%S)"; mkdir -p "$OUT"
W=$(mktemp -d); SOCK=$W/hvdd.sock
log() { echo "$*" | tee -a "$OUT/log"; }
load() { cut -d' ' -f1 /proc/loadavg; }
bin/hvdd serve --slots 4 --socket "$SOCK" --log-level info 2> "$OUT/daemon.log" &
DAEMON=$!
trap 'kill $DAEMON 2>/dev/null; wait $DAEMON 2>/dev/null; rm -rf "$W"' EXIT
for _ in $(seq 100); do [ -S "$SOCK" ] && break; sleep 0.1; done
log "# commit $(git rev-parse --short HEAD)$(git diff --quiet || echo +dirty), $(nproc) cores, $BYTES allreduce, $ITERS iterations"
if [ "$RESNET" = 1 ]; then
  ARGS=(--profile resnet50 --iters "$ITERS" --json); KEY=161_async_waitall
else
  ARGS=(--min-bytes "$BYTES" --max-bytes "$BYTES" --iters "$ITERS" --json); KEY='"op":"allreduce"'
fi
# job NAME: one bench job on the shared daemon; prints its median µs.
job() {
  bin/hvdd run -np 2 --socket "$SOCK" --job "$1" -- "$PWD/bin/hvdd" bench "${ARGS[@]}" 2>&1 \
    | tee -a "$OUT/$1.out" | grep -o "{.*$KEY.*}" | head -1 \
    | python3 -c 'import json,sys; print(json.loads(sys.stdin.read())["median_us"])'
}
alone=() a=() b=()
for r in $(seq 1 "$ROUNDS"); do
  l0=$(load)
  alone+=("$(job alone)")
  job A > "$W/a" & pa=$!
  job B > "$W/b" & pb=$!
  wait $pa $pb
  a+=("$(cat "$W/a")"); b+=("$(cat "$W/b")")
  log "round $r: alone ${alone[-1]} µs; together A ${a[-1]} µs, B ${b[-1]} µs (load $l0 -> $(load))"
done
python3 - "${alone[*]}" "${a[*]}" "${b[*]}" <<'PY' | tee -a "$OUT/log"
import statistics as st, sys
al, a, b = ([float(x) for x in s.split()] for s in sys.argv[1:4])
m = st.median(al)
print(f"median iteration: alone {m:.0f} µs, together A {st.median(a):.0f} µs, B {st.median(b):.0f} µs")
print(f"throughput of each job together / alone: A {m/st.median(a):.3f}, B {m/st.median(b):.3f} (fair share: 0.5)")
PY
log "results in $OUT"
