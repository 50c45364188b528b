#!/usr/bin/env bash
# A/B comparison across two "nodes" (network namespaces joined by a veth
# pair): alternates hvdd builds (and tcp stream counts) round by round, so
# that the drift of this shared VM falls on all of them alike. Each round
# measures the 4-byte allreduce median (2 nodes x 1 rank) and, with
# --bytes, the 64 MiB busbw too. Needs root and iproute2.
#
# Usage: bench/netab.sh [--rounds N] [--tbf] [--iters N] [--bytes] [--streams "4 8"] HVDD_BIN...
# Example: bench/netab.sh --rounds 6 /tmp/hvdd.old bin/hvdd
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=4; TBF=0; ITERS=1000; BYTES=0; STREAMS=""
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) ROUNDS=$2; shift ;;
    --tbf) TBF=1 ;;
    --iters) ITERS=$2; shift ;;
    --bytes) BYTES=1 ;;
    --streams) STREAMS=$2; shift ;;
    -h|--help) sed -n '2,9p' "$0"; exit 0 ;;
    -*) echo "unknown argument $1" >&2; exit 2 ;;
    *) break ;;
  esac
  shift
done
[ $# -gt 0 ] || { echo "give at least one hvdd binary (see --help)" >&2; exit 2; }
NS=hva; A=10.213.252.1; B=10.213.252.2; W=$(mktemp -d)
trap netns_cleanup EXIT
. bench/netns.sh
field() { grep -o "\"$1\":[0-9.e-]*" | head -1 | cut -d: -f2; }
for r in $(seq 1 "$ROUNDS"); do
  for bin in "$@"; do
    bin=$(readlink -f "$bin")
    for s in ${STREAMS:-default}; do
      env=(); [ "$s" = default ] || env=(HVDD_TCP_STREAMS=$s)
      lat=$(env "${env[@]}" "$bin" run -np 2 -H $A:1,$B:1 --agent "$W/agent" -- "$bin" bench --op allreduce \
        --min-bytes 4 --max-bytes 4 --iters "$ITERS" --json 2>&1 | field median_us)
      bw=""
      if [ "$BYTES" = 1 ]; then
        bw=$(env "${env[@]}" "$bin" run -np 2 -H $A:1,$B:1 --agent "$W/agent" -- "$bin" bench --op allreduce \
          --min-bytes 64M --max-bytes 64M --iters 10 --json 2>&1 | field busbw_gbps)
        bw=" busbw_64MiB_GBps=$bw"
      fi
      echo "round=$r bin=$bin streams=$s lat_4B_us=$lat$bw"
    done
  done
done
