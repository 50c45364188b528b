#!/usr/bin/env bash
# Two "nodes" in network namespaces joined by a veth pair (optionally limited
# to 10 Gbit/s with tc tbf), measured in one run: iperf3 across the pair (one
# direction, then both at once), hvdd
# (tcp engine, 2 nodes x 1 rank) allreduce of 64 MiB float32 and 4 B (beside the
# TCP round trip of peers/tcp_pingpong across the same pair), PyTorch
# gloo (bench/gloo_net.py) and Open MPI's MPI_Allreduce over its tcp transport
# (64 MiB) on the same pair, and hvdd 2 nodes x 2
# ranks with the daemons' cross-node byte counters. Needs root, iproute2,
# iperf3, Open MPI (scripts/setup.sh installs them).
#
# Usage: bench/netbench.sh [--tbf] [--rounds N]
set -euo pipefail
cd "$(dirname "$0")/.."
TBF=0; ROUNDS=3
while [ $# -gt 0 ]; do
  case "$1" in
    --tbf) TBF=1 ;;
    --rounds) ROUNDS=$2; shift ;;
    -h|--help) sed -n '2,11p' "$0"; exit 0 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
go build -o bin/hvdd ./cmd/hvdd
OUT="bench/results/net-$(date +%Y-%m-%d_%H%M%S)"; mkdir -p "$OUT"
NS=hvb; A=10.213.250.1; B=10.213.250.2; W=$(mktemp -d)
trap netns_cleanup EXIT
. bench/netns.sh
gcc -O2 -o "$W/tcp_pingpong" ../shared/bench/peers/tcp_pingpong.c
gcc -O3 -march=native -o "$W/mpi_allreduce" -I../shared/bench/peers ../shared/bench/peers/mpi_allreduce.c $(pkg-config --cflags --libs ompi-c) 2>/dev/null \
  || mpicc -O3 -march=native -o "$W/mpi_allreduce" ../shared/bench/peers/mpi_allreduce.c

for r in $(seq 1 "$ROUNDS"); do
  echo "== round $r" | tee -a "$OUT/log"
  ip netns exec hvb1 iperf3 -s -1 -B $B >/dev/null 2>&1 &
  sleep 0.5
  ip netns exec hvb0 iperf3 -c $B -t 3 -J > "$OUT/iperf-$r.json" || true
  wait || true
  python3 -c "import json;d=json.load(open('$OUT/iperf-$r.json'));print('iperf3 Gbit/s', round(d['end']['sum_received']['bits_per_second']/1e9,2))" | tee -a "$OUT/log"
  # Both directions at once, as an allreduce uses the pair: on a veth pair the
  # two directions share the CPUs, so each gets less than one alone.
  ip netns exec hvb1 iperf3 -s -1 -B $B >/dev/null 2>&1 &
  sleep 0.5
  ip netns exec hvb0 iperf3 -c $B -t 3 --bidir -J > "$OUT/iperf-bidir-$r.json" || true
  wait || true
  python3 -c "import json;e=json.load(open('$OUT/iperf-bidir-$r.json'))['end'];print('iperf3-bidir Gbit/s', round(e['sum_received']['bits_per_second']/1e9,2), round(e['sum_received_bidir_reverse']['bits_per_second']/1e9,2))" | tee -a "$OUT/log" || true
  # The TCP round trip across the pair, for the 4-byte target (2 round trips + the local path).
  ip netns exec hvb1 "$W/tcp_pingpong" server 5999 >/dev/null 2>&1 &
  sleep 0.3
  ip netns exec hvb0 "$W/tcp_pingpong" client $B 5999 5000 8 3 | sed 's/^/tcp-rtt /' | tee -a "$OUT/log" || true
  wait || true
  bin/hvdd run -np 2 -H $A:1,$B:1 --agent "$W/agent" -- "$PWD/bin/hvdd" bench --op allreduce --min-bytes 4 --max-bytes 4 --json 2>&1 \
    | grep -o '{.*}' | sed 's/^/hvdd-lat /' | tee -a "$OUT/log"
  bin/hvdd run -np 2 -H $A:1,$B:1 --agent "$W/agent" -- "$PWD/bin/hvdd" bench --op allreduce --min-bytes 64M --max-bytes 64M --iters 10 --json 2>&1 \
    | grep -o '{.*}' | sed 's/^/hvdd-64M /' | tee -a "$OUT/log"
  if /usr/bin/python3 -c 'import torch' 2>/dev/null; then
    ip netns exec hvb1 env GLOO_SOCKET_IFNAME=hvb1i /usr/bin/python3 bench/gloo_net.py --rank 1 --addr $A > "$W/gloo1.log" 2>&1 &
    ip netns exec hvb0 env GLOO_SOCKET_IFNAME=hvb0i /usr/bin/python3 bench/gloo_net.py --rank 0 --addr $A 2>&1 | sed 's/^/gloo /' | tee -a "$OUT/log"
    wait || true
  fi
  # mpirun itself runs in the first namespace, so that its daemons can
  # reach it; only the 64 MiB size (its small sizes take ~4 ms each here).
  ip netns exec hvb0 mpirun --host $A,$B -np 2 --mca plm_rsh_agent "$W/agent" --mca routed direct \
    --mca oob_tcp_if_include 10.213.250.0/24 --mca pml ob1 --mca btl tcp,self --mca btl_tcp_if_include 10.213.250.0/24 \
    "$W/mpi_allreduce" sweep 3 67108864 67108864 2>&1 | grep -E '^ +67108864 ' | sed 's/^/mpi-tcp /' | tee -a "$OUT/log" || echo "mpi-tcp failed" | tee -a "$OUT/log"
done
echo "== 2 nodes x 2 ranks: cross-node bytes of 20 steps of a 64 MiB allreduce" | tee -a "$OUT/log"
HOROVOD_LOG_LEVEL=info bin/hvdd run -np 4 -H $A:2,$B:2 --agent "$W/agent" -- "$PWD/bin/hvdd" bench --op allreduce --min-bytes 64M --max-bytes 64M --iters 15 --warmup 5 --json 2>&1 \
  | grep -E 'cross-node bytes|^\[0\]' | tee -a "$OUT/log"
echo "results in $OUT"
