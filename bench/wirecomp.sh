#!/usr/bin/env bash
# Wire compression (issue 16): float32 allreduce of 64 MiB across two network
# namespaces joined by a veth pair limited to --rate by tc tbf (bench/netns.sh),
# 1 rank each (the tcp engine between the daemons), with
# HVDD_WIRE_COMPRESSION=none, fp16 and bf16 interleaved in each of --rounds
# rounds. hvdd run starts the daemons through the agent with its own
# environment, so the variable reaches both (hvdd serve --wire-compression).
# First one --check run per setting at info log level: the results must be
# right and each daemon must log the compression it uses. Prints each run's
# busbw (GB/s), the load average before and after it, and the medians.
# Needs root.
#
# Usage: bench/wirecomp.sh [--rounds N] [--iters N] [--rate RATE] [--bytes SIZE]
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=3 ITERS=8 RATE=1gbit BYTES=64M
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) ROUNDS=$2; shift ;;
    --iters) ITERS=$2; shift ;;
    --rate) RATE=$2; shift ;;
    --bytes) BYTES=$2; shift ;;
    -h|--help) sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "wirecomp.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done
go build -o bin/hvdd ./cmd/hvdd
OUT="bench/results/wirecomp-$RATE-$(date +%Y-%m-%d_%H%M%S)"; mkdir -p "$OUT"
log() { echo "$*" | tee -a "$OUT/log"; }
load() { cut -d' ' -f1 /proc/loadavg; }
NS=hwc; A=10.213.247.1; B=10.213.247.2; W=$(mktemp -d); TBF=1
trap netns_cleanup EXIT
. bench/netns.sh
unset HVDD_WIRE_COMPRESSION HVDD_TCP_STREAMS HVDD_TCP_CHUNK_BYTES HVDD_TCP_SMALL_BYTES
log "# commit $(git rev-parse --short HEAD)$(git diff --quiet || echo +dirty), $(nproc) cores, link $RATE (tc tbf), load $(load)"
job() { bin/hvdd run -np 2 -H $A:1,$B:1 --agent "$W/agent" -- "$PWD/bin/hvdd" bench --min-bytes "$BYTES" --max-bytes "$BYTES" "$@"; }

for m in none fp16 bf16; do
  HVDD_WIRE_COMPRESSION=$m HOROVOD_LOG_LEVEL=info job --iters 2 --warmup 1 --check --json > "$OUT/check-$m.out" 2>&1 \
    || { log "check with $m FAILED:"; tail -20 "$OUT/check-$m.out" | tee -a "$OUT/log"; exit 1; }
  logged=$(grep -c 'wire compression: float32 sums cross nodes in 16 bits.*format='"$m" "$OUT/check-$m.out" || true)
  log "check $m: $(grep -o '"check":"[a-z]*"' "$OUT/check-$m.out" | sort | uniq -c | tr -s ' '), daemons that logged the compression: $logged (want 2; 0 for none)"
done

declare -A runs
for r in $(seq 1 "$ROUNDS"); do
  for m in none fp16 bf16; do
    l0=$(load)
    bw=$(HVDD_WIRE_COMPRESSION=$m job --iters "$ITERS" --warmup 2 --json 2>&1 | tee -a "$OUT/$m.out" \
      | grep -o '{.*"busbw_gbps".*}' | python3 -c 'import json,sys; print("%.4f" % json.loads(sys.stdin.read())["busbw_gbps"])')
    runs[$m]="${runs[$m]:-} $bw"
    log "round $r $m: busbw $bw GB/s (load $l0 -> $(load))"
  done
done
python3 - "${runs[none]}" "${runs[fp16]}" "${runs[bf16]}" <<'PY' | tee -a "$OUT/log"
import statistics as st, sys
none, fp16, bf16 = ([float(x) for x in a.split()] for a in sys.argv[1:4])
mn = st.median(none)
for name, v in (("none", none), ("fp16", fp16), ("bf16", bf16)):
    m = st.median(v)
    print(f"{name}: median busbw {m:.3f} GB/s ({m*8:.2f} Gbit/s), {m/mn:.2f}x none; runs {v}")
PY
log "results in $OUT"
