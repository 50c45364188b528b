#!/usr/bin/env bash
# CPU time of one node's daemon while its 2 ranks allreduce 4 bytes after
# pauses of GAP each (hvdd bench --gap, whose row gives the daemon's CPU over
# the paced loop), as a training step's collectives come after its compute.
#
# Usage: bench/gapcpu.sh [GAP ...]   (default: 10ms 50ms; HVDD=binary, default bin/hvdd)
set -euo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in -h|--help) sed -n 2,6p "$0"; exit 0 ;; esac
HVDD=${HVDD:-bin/hvdd}
[ -x "$HVDD" ] || go build -o "$HVDD" ./cmd/hvdd
bin=$(readlink -f "$HVDD")
field() { grep -o "\"$1\":[0-9.e-]*" | head -1 | cut -d: -f2; }
gaps=("$@"); [ ${#gaps[@]} -gt 0 ] || gaps=(10ms 50ms)
for g in "${gaps[@]}"; do
  ms=$(echo "$g" | sed -n 's/^\([0-9]*\)ms$/\1/p'); [ -n "$ms" ] || { echo "give gaps in ms, e.g. 10ms" >&2; exit 2; }
  # About 4 s of pauses, whatever the gap.
  row=$("$bin" run -np 2 -- "$bin" bench --max-bytes 4 --gap "$g" --iters $((4000 / ms)) --json 2>&1 | grep '^\[0\]<stdout>:{' | head -1 || true)
  [ -n "$row" ] || { echo "gap $g: the job failed" >&2; exit 1; }
  printf 'gap %s: daemon %.1f %% of a core; 4 B median after the gap %.0f us\n' "$g" \
    "$(echo "$row" | field daemon_cpu_pct)" "$(echo "$row" | field median_us)"
done
