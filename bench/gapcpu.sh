#!/usr/bin/env bash
# CPU time of one node's daemon while its 2 ranks allreduce 4 bytes after
# pauses of GAP each (hvdd bench --gap), as a training step's collectives
# come after its compute: the daemon's user+system ticks over 2 s of the run.
#
# Usage: bench/gapcpu.sh [GAP ...]   (default: 10ms 50ms; HVDD=binary, default bin/hvdd)
set -euo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in -h|--help) sed -n 2,6p "$0"; exit 0 ;; esac
HVDD=${HVDD:-bin/hvdd}
[ -x "$HVDD" ] || go build -o "$HVDD" ./cmd/hvdd
tick=$(getconf CLK_TCK)
gaps=("$@"); [ ${#gaps[@]} -gt 0 ] || gaps=(10ms 50ms)
for g in "${gaps[@]}"; do
  out=$(mktemp)
  # About 5 s of pauses, whatever the gap.
  ms=$(echo "$g" | sed -n 's/^\([0-9]*\)ms$/\1/p'); [ -n "$ms" ] || { echo "give gaps in ms, e.g. 10ms" >&2; exit 2; }
  "$HVDD" run -np 2 -- "$(readlink -f "$HVDD")" bench --max-bytes 4 --gap "$g" --iters $((5000 / ms)) --json > "$out" 2>&1 &
  job=$!
  sleep 1.5
  p=$(pgrep -n -f -- "$(basename "$HVDD") serve --slots 2") || { kill "$job" 2>/dev/null; wait "$job" || true; echo "no daemon found:" >&2; cat "$out" >&2; exit 1; }
  a=$(awk '{print $14+$15}' /proc/"$p"/stat)
  sleep 2
  b=$(awk '{print $14+$15}' /proc/"$p"/stat)
  wait "$job"
  echo "gap $g: daemon $((b - a)) ticks ($tick/s) in 2 s; 4 B median after the gap $(grep -o '"median_us":[0-9.]*' "$out" | cut -d: -f2) us"
  rm -f "$out"
done
