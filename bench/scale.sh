#!/usr/bin/env bash
# Scaling past two nodes (issue 16): allreduce of 64 MiB float32 on 2, 4 and 8
# "nodes" of one rank, each a network namespace on one Linux bridge, every
# link limited to the same rate in each direction with tc tbf
# (daemon/daemontest/bridge.sh, the tests' harness). Each round runs every
# node count in turn (and every rate, with several), so the drift of this
# shared VM falls on all alike; the summary gives per setting the median over
# rounds of each run's busbw (itself the median of --iters iterations), its
# ratio to 2 nodes at that rate, the machine's load average before the run
# and the CPU the job used (hvdd run, its daemons and ranks, user+system, in
# cores: 2 would mean the 2 vCPUs were the limit; on this shared VM other
# tenants' load counts too). With --iperf, each setting also measures what
# the kernel alone carries over the same ring (iperf3, node i to node i+1,
# all at once, as many parallel streams as the engine's), per link in GB/s.
# Needs root and iproute2.
#
# Usage: bench/scale.sh [--rates "1gbit 250mbit"] [--nodes "2 4 8"] [--rounds N]
#                       [--iters N] [--bytes 64M] [--streams N] [--iperf] [--keep-logs]
set -euo pipefail
cd "$(dirname "$0")/.."
RATES="1gbit"; NODES="2 4 8"; ROUNDS=3; ITERS=10; BYTES=64M; STREAMS=""; KEEP=0; IPERF=0
while [ $# -gt 0 ]; do
  case "$1" in
    --rates) RATES=$2; shift ;;
    --nodes) NODES=$2; shift ;;
    --rounds) ROUNDS=$2; shift ;;
    --iters) ITERS=$2; shift ;;
    --bytes) BYTES=$2; shift ;;
    --streams) STREAMS=$2; shift ;;
    --keep-logs) KEEP=1 ;;
    --iperf) IPERF=1 ;;
    -h|--help) sed -n '2,17p' "$0"; exit 0 ;;
    *) echo "unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done
MAXN=0; for n in $NODES; do [ "$n" -gt "$MAXN" ] && MAXN=$n; done
go build -o bin/hvdd ./cmd/hvdd
HVDD=$PWD/bin/hvdd
OUT="bench/results/scale-$(date +%Y-%m-%d_%H%M%S)"; mkdir -p "$OUT"
P="hvsc$$"   # the namespaces: ${P}n0.. and ${P}br
W=$(mktemp -d)
BR=daemon/daemontest/bridge.sh
cleanup() { "$BR" down "$P" "$MAXN"; rm -rf "$W"; }
trap cleanup EXIT
first=${RATES%% *}
"$BR" up "$P" "$MAXN" "$first"
cat > "$W/agent" <<AGENT
#!/bin/sh
# hvdd run's remote agent: host 10.77.0.K is namespace ${P}n(K-1).
host=\$1; shift
case "\$host" in 10.77.0.*) ns=${P}n\$(( \${host##*.} - 1 )) ;; *) echo "unknown host \$host" >&2; exit 255 ;; esac
exec ip netns exec "\$ns" sh -c "\$*"
AGENT
chmod +x "$W/agent"
field() { grep -o "\"$1\":[0-9.e+-]*" | head -1 | cut -d: -f2; }
env=(); [ -z "$STREAMS" ] || env=(HVDD_TCP_STREAMS=$STREAMS)
# iperf_ring N: node i sends to node i+1 (mod N), every node at once, for 3 s;
# prints the mean received rate per link in GB/s.
iperf_ring() {
  local i pids=()
  for i in $(seq 0 $(($1 - 1))); do ip netns exec "${P}n$i" iperf3 -s -1 -B "10.77.0.$((i + 1))" >/dev/null 2>&1 & pids+=($!); done
  sleep 0.5
  for i in $(seq 0 $(($1 - 1))); do
    ip netns exec "${P}n$i" iperf3 -c "10.77.0.$(( (i + 1) % $1 + 1 ))" -t 3 -P "${STREAMS:-8}" -J > "$W/iperf$i.json" 2>/dev/null &
  done
  wait
  for i in $(seq 0 $(($1 - 1))); do
    python3 -c "import json,sys;print(json.load(open(sys.argv[1]))['end']['sum_received']['bits_per_second']/8e9)" "$W/iperf$i.json" 2>/dev/null || echo 0
  done | awk '{s += $1} END {printf "%.4f", s / NR}'
}
{
  echo "# $(date -u +%FT%TZ) $(nproc) CPUs; rates: $RATES; nodes: $NODES; rounds $ROUNDS; $BYTES x $ITERS iters; streams ${STREAMS:-default}"
  echo "# $(git rev-parse --short HEAD 2>/dev/null) $(uname -r)"
} | tee "$OUT/log"
for r in $(seq 1 "$ROUNDS"); do
  for rate in $RATES; do
    "$BR" rate "$P" "$MAXN" "$rate"
    for n in $NODES; do
      hosts=$(seq -f "10.77.0.%g:1" 1 "$n" | paste -sd,)
      load=$(cut -d' ' -f1 /proc/loadavg)
      log="$OUT/run-r$r-$rate-n$n.log"
      # GNU time counts the daemons and ranks too: hvdd run waits for them.
      env "${env[@]}" HOROVOD_LOG_LEVEL=info /usr/bin/time -f "%e %U %S" -o "$W/time" "$HVDD" run -np "$n" -H "$hosts" --agent "$W/agent" -- \
        "$HVDD" bench --op allreduce --min-bytes "$BYTES" --max-bytes "$BYTES" --iters "$ITERS" --warmup 2 --json > "$log" 2>&1 || true
      cores=$(awk 'END{printf "%.2f", ($2+$3)/$1}' "$W/time")
      row=$(grep -o '^\[0\]<stdout>:{.*}' "$log" | sed 's/^\[0\]<stdout>://' || true)
      bw=$(echo "$row" | field busbw_gbps); med=$(echo "$row" | field median_us)
      ip=""; [ "$IPERF" = 0 ] || ip=" iperf3_ring_GBps=$(iperf_ring "$n")"
      echo "round=$r rate=$rate nodes=$n busbw_GBps=${bw:-FAILED} median_us=${med:-} load1=$load cpu_cores=$cores$ip" | tee -a "$OUT/log"
      [ "$KEEP" = 1 ] || [ -z "$bw" ] || rm -f "$log"
    done
  done
done
echo "== medians over $ROUNDS rounds (busbw in GB/s; ratio to 2 nodes at the same rate)" | tee -a "$OUT/log"
awk '
  /^round=/ { for (i = 1; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] }
              k = v["rate"] " " v["nodes"]; bw[k] = bw[k] " " v["busbw_GBps"]; ld[k] = ld[k] " " v["load1"]; id[k] = id[k] " " v["cpu_cores"]; ip[k] = ip[k] " " v["iperf3_ring_GBps"]
              if (!(k in seen)) { seen[k] = 1; order[++nk] = k } }
  function med(s,   a, n, i, j, t) { n = split(s, a, " "); for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (a[j] + 0 < a[i] + 0) { t = a[i]; a[i] = a[j]; a[j] = t }
                                   return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2 }
  END { for (i = 1; i <= nk; i++) { split(order[i], p, " "); m[order[i]] = med(bw[order[i]]) }
        for (i = 1; i <= nk; i++) { split(order[i], p, " "); base = m[p[1] " 2"]
          printf "rate=%s nodes=%s busbw_GBps=%.4f ratio_to_2=%s load1_median=%s cpu_cores_median=%s%s\n", p[1], p[2], m[order[i]],
            (base > 0 ? sprintf("%.3f", m[order[i]] / base) : "-"), med(ld[order[i]]), med(id[order[i]]),
            (ip[order[i]] ~ /[0-9]/ ? " iperf3_ring_GBps_median=" med(ip[order[i]]) : "") } }' "$OUT/log" | tee -a "$OUT/summary"
cat "$OUT/summary" >> "$OUT/log"
echo "results in $OUT"
