#!/usr/bin/env bash
# What the daemon's Prometheus metrics cost a running job (issue 16): for
# each of three modes, a fresh daemon of 2 slots and a job of 2 ranks
# measuring the 4-byte allreduce latency (hvdd bench --max-bytes 4, at least
# 2 s of iterations) and the 64 MiB allreduce (40 iterations):
#
#   off      hvdd serve without --metrics-addr
#   on       --metrics-addr, never scraped
#   scraped  --metrics-addr, scraped every $EVERY (default 100ms) by
#            bench/scrape (one kept-alive connection, as Prometheus does)
#
# The modes take turns within each round (the order rotates every round),
# so that the machine's drift weighs on all alike; it prints every round,
# then each mode's median over the rounds and its ratio to off, and the
# median over rounds of each round's ratio to that round's off (the paired
# figure, which the machine's drift between rounds moves least). Last, the
# CPU one scrape costs the daemon: an idle daemon scraped every 10 ms for
# 10 s, its utime+stime (/proc) over the scrapes made.
#
# Usage: bench/metrics.sh [ROUNDS]   (default 7; HVDD=binary, default bin/hvdd)
set -euo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in -h|--help) sed -n 2,18p "$0"; exit 0 ;; esac
rounds=${1:-7}
every=${EVERY:-100ms}
HVDD=${HVDD:-bin/hvdd}
[ -x "$HVDD" ] || go build -o "$HVDD" ./cmd/hvdd
bin=$(readlink -f "$HVDD")
tmp=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$tmp"; }
trap cleanup EXIT
go build -o "$tmp/scrape" ./bench/scrape
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
field() { grep -o "\"$1\":[0-9.e+-]*" | head -1 | cut -d: -f2; }

# run MODE: one daemon, both measurements; prints "MODE LATENCY_US BIG_US SCRAPES".
run() {
  local mode=$1 sock="$tmp/$1.sock" args=(serve --slots 2 --log-level warning)
  [ "$mode" = off ] || args+=(--metrics-addr "127.0.0.1:$port")
  "$bin" "${args[@]}" --socket "$sock" 2>>"$tmp/daemon.log" &
  local dpid=$!; pids+=("$dpid")
  for _ in $(seq 200); do [ -S "$sock" ] && break; sleep 0.05; done
  local spid="" scrapes=-
  if [ "$mode" = scraped ]; then
    "$tmp/scrape" -every "$every" "http://127.0.0.1:$port/metrics" >"$tmp/scrape.out" &
    spid=$!; pids+=("$spid")
  fi
  local lat big
  lat=$(HVDD_SOCKET="$sock" "$bin" run -np 2 -- "$bin" bench --max-bytes 4 --small-time 2s --json 2>&1 | grep '^\[0\]<stdout>:{' | field median_us)
  big=$(HVDD_SOCKET="$sock" "$bin" run -np 2 -- "$bin" bench --min-bytes 64M --max-bytes 64M --iters 40 --json 2>&1 | grep '^\[0\]<stdout>:{' | field median_us)
  if [ -n "$spid" ]; then
    kill -TERM "$spid"; wait "$spid" || true
    scrapes=$(awk '{print $2 "/" $4 "/" $6}' "$tmp/scrape.out")  # made/failed/median time
  fi
  kill -TERM "$dpid"; wait "$dpid" || true
  [ -n "$lat" ] && [ -n "$big" ] || { echo "mode $mode: a bench failed; daemon log:" >&2; cat "$tmp/daemon.log" >&2; exit 1; }
  echo "$mode $lat $big $scrapes"
}

modes=(off on scraped)
echo "# round mode 4B_median_us 64MiB_median_us scrapes(made/failed/median)"
for r in $(seq "$rounds"); do
  for i in 0 1 2; do
    m=${modes[$(( (i + r) % 3 ))]}
    echo "$r $(run "$m")"
  done
done | tee "$tmp/rounds"
echo "# mode median_4B_us ratio_to_off median_64MiB_us ratio_to_off"
for m in "${modes[@]}"; do
  lat=$(awk -v m="$m" '$2 == m {print $3}' "$tmp/rounds" | sort -g | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}')
  big=$(awk -v m="$m" '$2 == m {print $4}' "$tmp/rounds" | sort -g | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}')
  echo "$m $lat $big"
done | awk 'NR == 1 {l0 = $2; b0 = $3} {printf "%s %.2f %.3f %.0f %.3f\n", $1, $2, $2 / l0, $3, $3 / b0}'
echo "# mode median_over_rounds(4B/off_4B) median_over_rounds(64MiB/off_64MiB)"
med() { sort -g | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }
for m in on scraped; do
  l=$(awk -v m="$m" '$2 == "off" {lo[$1] = $3; bo[$1] = $4} $2 == m {l[$1] = $3} END {for (r in l) print l[r] / lo[r]}' "$tmp/rounds" | med)
  b=$(awk -v m="$m" '$2 == "off" {lo[$1] = $3; bo[$1] = $4} $2 == m {b[$1] = $4} END {for (r in b) print b[r] / bo[r]}' "$tmp/rounds" | med)
  printf '%s %.3f %.3f\n' "$m" "$l" "$b"
done
echo "# load average: $(cut -d' ' -f1-3 /proc/loadavg)"

# The daemon's CPU per scrape.
"$bin" serve --slots 2 --log-level warning --socket "$tmp/cpu.sock" --metrics-addr "127.0.0.1:$port" 2>>"$tmp/daemon.log" &
dpid=$!; pids+=("$dpid")
for _ in $(seq 200); do [ -S "$tmp/cpu.sock" ] && break; sleep 0.05; done
ticks() { awk '{print $14 + $15}' "/proc/$dpid/stat"; }
t0=$(ticks)
"$tmp/scrape" -every 10ms "http://127.0.0.1:$port/metrics" >"$tmp/scrape.out" &
spid=$!; pids+=("$spid")
sleep 10
kill -TERM "$spid"; wait "$spid" || true
t1=$(ticks)
kill -TERM "$dpid"; wait "$dpid" || true
awk -v t=$((t1 - t0)) -v hz="$(getconf CLK_TCK)" '{printf "# idle daemon scraped every 10 ms: %d scrapes (%d failed), median %s, daemon CPU %.2f ms per scrape\n", $2, $4, $6, 1000 * t / hz / $2}' "$tmp/scrape.out"
