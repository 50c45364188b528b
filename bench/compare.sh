#!/bin/bash
# compare.sh - hvdd against its peers (membw, uds_pingpong, Open MPI, gloo) on this machine,
# interleaved in rounds so that ratios come from the same time window (as peers/ratios.sh does).
#
# Usage: bench/compare.sh [--quick] [--rounds N]
#   --quick     one round, fewer repetitions (about 1 minute); default 3 rounds (about 4 minutes)
#   --rounds N  number of interleaved rounds
# Environment: PEERS (default ../shared/bench/peers from the repository root), GO (default go).
#
# Per round: membw (2 threads, 64 MiB), uds_pingpong (8 B, pinned to cpu0/cpu1), mpi_allreduce
# np=2 over shm (sweep 4 B..64 MiB, then the resnet mode), gloo world=2 at 4 B and 64 MiB (when
# /usr/bin/python3 has torch), and hvdd bench --np 2 at 4 B, 64 MiB and --profile resnet50.
# Once at the end: hvdd bench --profile idle --duration 10s. Raw outputs go to
# bench/results/<date>/; the summary (medians over rounds and the target ratios) is printed and
# saved there as summary.txt.
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(dirname "$HERE")
PEERS=${PEERS:-$ROOT/../shared/bench/peers}
GO=${GO:-go}
ROUNDS=3 QUICK=0
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) QUICK=1; ROUNDS=1 ;;
    --rounds) ROUNDS=$2; shift ;;
    -h|--help) sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "compare.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done
if [ "$QUICK" = 1 ]; then REPS=3 ITERS=10 UDS_ITERS=20000; else REPS=5 ITERS=20 UDS_ITERS=100000; fi
M=67108864

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 GLOO_SOCKET_IFNAME=lo
OUT=$HERE/results/$(date +%Y-%m-%d_%H%M%S)
mkdir -p "$OUT" || exit 1
BUILD=$(mktemp -d /tmp/hvdd-compare-XXXXXX) || exit 1
trap 'rm -rf "$BUILD"' EXIT
METRICS=$OUT/metrics.tsv
: > "$METRICS"
say() { echo "compare.sh: $*" >&2; }
metric() { [ -n "${3:-}" ] && printf '%s\t%s\t%s\n' "$1" "$2" "$3" >> "$METRICS"; }
jget() { sed -n "s/.*\"$1\":\([-0-9.eE+]*\).*/\1/p" | head -1; }

# --- build -------------------------------------------------------------------------------------
[ -d "$PEERS" ] || { say "no peers at $PEERS (set PEERS)"; exit 1; }
HAVE_MPI=1 HAVE_GLOO=1
command -v gcc >/dev/null || { say "gcc missing: apt-get install -y gcc"; exit 1; }
if ! command -v mpicc >/dev/null || ! command -v mpirun >/dev/null; then
  say "Open MPI missing, skipping it: apt-get install -y openmpi-bin libopenmpi-dev"; HAVE_MPI=0
fi
if ! /usr/bin/python3 -c 'import torch.distributed' 2>/dev/null; then
  say "/usr/bin/python3 has no torch, skipping gloo: apt-get install -y python3-torch"; HAVE_GLOO=0
fi
say "building into $BUILD"
gcc -O3 -march=native -pthread -o "$BUILD/membw" "$PEERS/membw.c" || exit 1
gcc -O2 -o "$BUILD/uds_pingpong" "$PEERS/uds_pingpong.c" || exit 1
if [ $HAVE_MPI = 1 ]; then
  mpicc -O3 -march=native -I"$PEERS" -o "$BUILD/mpi_allreduce" "$PEERS/mpi_allreduce.c" || HAVE_MPI=0
fi
(cd "$ROOT" && "$GO" build -o "$BUILD/hvdd" ./cmd/hvdd) || exit 1
HVDD=$BUILD/hvdd
PIN=1
[ "$(nproc)" -lt 2 ] && PIN=0

{
  echo "date: $(date -Is)"
  echo "host: $(uname -a)"
  echo "cpus: $(nproc); $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-)"
  grep MemTotal /proc/meminfo
  "$GO" version
  [ $HAVE_MPI = 1 ] && mpirun --version 2>&1 | head -1
  [ $HAVE_GLOO = 1 ] && /usr/bin/python3 -c 'import torch; print("torch", torch.__version__)'
  echo "hvdd: $("$HVDD" version) ($(cd "$ROOT" && git rev-parse --short HEAD 2>/dev/null), tree may be dirty)"
  echo "rounds=$ROUNDS reps=$REPS iters=$ITERS quick=$QUICK"
} > "$OUT/machine.txt" 2>&1

# run NAME CMD...: append CMD's output, under a round header, to NAME.txt, and echo it.
run() {
  local name=$1; shift
  { echo "### round $R: $*"; } >> "$OUT/$name.txt"
  timeout 600 "$@" 2>>"$OUT/$name.err" | tee -a "$OUT/$name.txt"
}

# --- rounds ------------------------------------------------------------------------------------
for R in $(seq "$ROUNDS"); do
  say "round $R of $ROUNDS (load: $(cut -d' ' -f1-3 /proc/loadavg))"
  echo "round $R start $(date +%T) load $(cut -d' ' -f1-3 /proc/loadavg)" >> "$OUT/load.txt"

  o=$(run membw "$BUILD/membw" 2 "$REPS" $M $M)
    # op threads bytes iters rate_median rate_min rate_max traffic_median
  metric "$R" membw_memcpy_1T_GBps "$(awk '$1=="memcpy" && $2==1 {print $5}' <<<"$o")"
  metric "$R" membw_reduce_2T_GBps "$(awk '$1=="reduce" && $2==2 {print $5}' <<<"$o")"

  o=$(run uds_pingpong "$BUILD/uds_pingpong" "$UDS_ITERS" 8 "$REPS" "$PIN")
  metric "$R" uds_stream_rtt_us "$(awk '$1=="SOCK_STREAM" {print $2}' <<<"$o")"

  if [ $HAVE_MPI = 1 ]; then
    o=$(run mpi_sweep mpirun -np 2 "$BUILD/mpi_allreduce" sweep "$REPS" $M 4)
    metric "$R" mpi_4B_us "$(awk '$1==4 {print $4}' <<<"$o")"
    metric "$R" mpi_64MiB_algbw_GBps "$(awk -v m=$M '$1==m {print $7}' <<<"$o")"
    o=$(run mpi_resnet mpirun -np 2 "$BUILD/mpi_allreduce" resnet "$REPS")
    metric "$R" mpi_resnet_161_iallreduce_ms "$(awk '$1=="161_Iallreduce_Waitall" {print $2}' <<<"$o")"
    metric "$R" mpi_resnet_1_fused_ms "$(awk '$1=="1_concat_no_copy" {print $2}' <<<"$o")"
  fi

  if [ $HAVE_GLOO = 1 ]; then
    o=$(run gloo /usr/bin/python3 "$PEERS/gloo_allreduce.py" --world 2 --mode sweep --reps "$REPS" --min-bytes 4 --max-bytes 4)
    metric "$R" gloo_4B_us "$(awk '$1==4 {print $3}' <<<"$o")"
    o=$(run gloo /usr/bin/python3 "$PEERS/gloo_allreduce.py" --world 2 --mode sweep --reps "$REPS" --min-bytes $M --max-bytes $M)
    metric "$R" gloo_64MiB_algbw_GBps "$(awk -v m=$M '$1==m {print $6}' <<<"$o")"
  fi

  o=$(run hvdd_4B "$HVDD" bench --np 2 --min-bytes 4 --max-bytes 4 --json --timeout 300s)
  metric "$R" hvdd_4B_us "$(jget median_us <<<"$o")"
  o=$(run hvdd_64MiB "$HVDD" bench --np 2 --min-bytes 64M --max-bytes 64M --iters "$ITERS" --json --timeout 300s)
  metric "$R" hvdd_64MiB_algbw_GBps "$(jget algbw_gbps <<<"$o")"
  o=$(run hvdd_resnet "$HVDD" bench --np 2 --profile resnet50 --iters "$ITERS" --json --timeout 60s)
  if [ -z "$o" ]; then say "hvdd resnet50 profile failed or timed out (see $OUT/hvdd_resnet.err)"; fi
  metric "$R" hvdd_resnet_161_async_ms "$(grep '"variant":"161_async_waitall"' <<<"$o" | jget median_us | awk '{print $1/1000}')"
  metric "$R" hvdd_resnet_1_fused_ms "$(grep '"variant":"1_fused"' <<<"$o" | jget median_us | awk '{print $1/1000}')"
done

R=idle
say "idle profile (10 s)"
o=$(run hvdd_idle "$HVDD" bench --np 2 --profile idle --duration 10s --json --timeout 120s)
metric idle hvdd_idle_daemon_cpu_pct "$(jget daemon_cpu_pct <<<"$o")"
metric idle hvdd_idle_clients_cpu_pct "$(jget clients_cpu_pct_total <<<"$o")"
echo "end $(date +%T) load $(cut -d' ' -f1-3 /proc/loadavg)" >> "$OUT/load.txt"

# --- summary -----------------------------------------------------------------------------------
# med METRIC: the median of METRIC over the rounds (empty when never measured).
med() {
  awk -F'\t' -v m="$1" '$2==m {print $3}' "$METRICS" | sort -g |
    awk '{v[NR]=$1} END {if (NR==0) exit; if (NR%2) print v[(NR+1)/2]; else print (v[NR/2]+v[NR/2+1])/2}'
}
vals() { awk -F'\t' -v m="$1" '$2==m {printf "%s%s", s, $3; s=" "}' "$METRICS"; }
# ratio NAME A B TARGET_OP TARGET: print A/B against the target.
ratio() {
  awk -v n="$1" -v a="$2" -v b="$3" -v op="$4" -v t="$5" 'BEGIN {
    if (a == "" || b == "" || b+0 == 0) { printf "%-58s %10s   target %s %s   n/a (not measured)\n", n, "-", op, t; exit }
    r = a / b; ok = (op == ">=") ? r >= t : (op == "<=") ? r <= t : r < t
    printf "%-58s %10.3f   target %s %-5s %s\n", n, r, op, t, ok ? "met" : "MISSED" }'
}
# info NAME A B: print A/B with no target.
info() {
  awk -v n="$1" -v a="$2" -v b="$3" 'BEGIN {
    if (a == "" || b == "" || b+0 == 0) printf "%-58s %10s\n", n, "-"; else printf "%-58s %10.3f\n", n, a / b }'
}
{
  echo "# hvdd vs. peers, $(date -Is), $ROUNDS round(s); raw outputs in $OUT"
  echo "# load during the run:"; sed 's/^/#   /' "$OUT/load.txt"
  echo
  printf '%-34s %12s   %s\n' metric median "per round"
  for m in membw_memcpy_1T_GBps membw_reduce_2T_GBps uds_stream_rtt_us mpi_4B_us mpi_64MiB_algbw_GBps \
           mpi_resnet_161_iallreduce_ms mpi_resnet_1_fused_ms gloo_4B_us gloo_64MiB_algbw_GBps hvdd_4B_us \
           hvdd_64MiB_algbw_GBps hvdd_resnet_161_async_ms hvdd_resnet_1_fused_ms hvdd_idle_daemon_cpu_pct \
           hvdd_idle_clients_cpu_pct; do
    printf '%-34s %12s   %s\n' "$m" "$(med $m | awk '{printf "%.4g", $1}')" "$(vals $m)"
  done
  echo
  red2=$(med membw_reduce_2T_GBps)
  limit=$(awk -v r="$red2" 'BEGIN { if (r != "") print r * 3 / 4 }')
  echo "memory-traffic limit for a 2-rank in-place allreduce: reduce-2T ${red2:-?} GB/s x 3 (traffic) / 4 (traffic per tensor byte) = ${limit:-?} GB/s algbw"
  echo
  ratio "(a) hvdd 64 MiB algbw / MPI's" "$(med hvdd_64MiB_algbw_GBps)" "$(med mpi_64MiB_algbw_GBps)" ">=" 3
  ratio "(a) hvdd 64 MiB algbw / memory-traffic limit" "$(med hvdd_64MiB_algbw_GBps)" "$limit" ">=" 0.5
  ratio "(b) hvdd 4 B latency / UDS round trip" "$(med hvdd_4B_us)" "$(med uds_stream_rtt_us)" "<=" 1.5
  ratio "(c) hvdd resnet50 step / one fused allreduce" "$(med hvdd_resnet_161_async_ms)" "$(med hvdd_resnet_1_fused_ms)" "<=" 1.2
  ratio "(c) hvdd resnet50 step / MPI 161 Iallreduce+Waitall step" "$(med hvdd_resnet_161_async_ms)" "$(med mpi_resnet_161_iallreduce_ms)" "<=" 0.7
  ratio "(d) idle daemon CPU % of one core (10 s)" "$(med hvdd_idle_daemon_cpu_pct)" 1 "<" 1
  echo
  echo "# for information"
  info "hvdd 4 B latency / MPI's (shm, busy-polling)" "$(med hvdd_4B_us)" "$(med mpi_4B_us)"
  info "hvdd 64 MiB algbw / gloo's" "$(med hvdd_64MiB_algbw_GBps)" "$(med gloo_64MiB_algbw_GBps)"
  info "hvdd 4 B latency / gloo's" "$(med hvdd_4B_us)" "$(med gloo_4B_us)"
  info "MPI resnet50 161 Iallreduce step / its one fused allreduce" "$(med mpi_resnet_161_iallreduce_ms)" "$(med mpi_resnet_1_fused_ms)"
} | tee "$OUT/summary.txt"
echo
echo "raw outputs and summary: $OUT"
