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
A=10.213.252.1; B=10.213.252.2
W=$(mktemp -d); trap 'ip netns del hva0 2>/dev/null; ip netns del hva1 2>/dev/null; rm -rf "$W"' EXIT
ip netns del hva0 2>/dev/null || true; ip netns del hva1 2>/dev/null || true
ip netns add hva0; ip netns add hva1
ip link add hva0i netns hva0 type veth peer name hva1i netns hva1
ip -n hva0 addr add $A/24 dev hva0i; ip -n hva1 addr add $B/24 dev hva1i
for n in hva0 hva1; do ip -n $n link set lo up; ip -n $n link set ${n}i up; done
if [ "$TBF" = 1 ]; then
  for n in hva0 hva1; do ip netns exec $n tc qdisc add dev ${n}i root tbf rate 10gbit burst 1mb latency 10ms; done
fi
cat > "$W/agent" <<AGENT
#!/bin/sh
host=\$1; shift
case "\$host" in $A) ns=hva0 ;; $B) ns=hva1 ;; *) echo "unknown host \$host" >&2; exit 255 ;; esac
exec ip netns exec \$ns sh -c "\$*"
AGENT
chmod +x "$W/agent"
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
