#!/usr/bin/env bash
# The daemon's headline (issue 16): PyTorch synthetic training,
# examples/pytorch_synthetic_benchmark.py with the same arguments for all,
# 2 "nodes" x 2 ranks: two network namespaces joined by a veth pair whose
# link tc tbf limits to --rate (bench/netns.sh), each namespace's 2 ranks in
# that namespace. Per round, interleaved (the order rotated by one each
# round), one job of each variant:
#   hvdd       hvdd run -np 4 -H A:2,B:2 --agent AGENT -- python SCRIPT ARGS
#   hvdd-fp16  the same with --wire-compression fp16
#   horovod    Horovod 0.28.1 on gloo: HVDD_BENCH_IMPL=horovod, the ranks
#              started with the environment horovodrun --gloo gives them
#              (bench/headline_launch.py --impl horovod)
#   ddp        torch DistributedDataParallel on gloo (--ddp; env:// with
#              MASTER_ADDR in namespace 0, GLOO_SOCKET_IFNAME the veth)
# and, named in --variants: horovod-hier, horovod with
# HOROVOD_HIERARCHICAL_ALLREDUCE=1 (which 0.28.1's gloo operations ignore for
# CPU tensors: the bytes on the link show it); alone, the compute without the
# exchange (below), as a variant of every round.
# Each run records rank 0's "Total img/sec on 4 rank(s)", the bytes the veth
# carried each way (its tx counters in both namespaces), the wall time, the
# CPU time of its processes (a cpuacct cgroup of the job's own) and the load
# average before and after. Before the rounds (unless
# --no-calibrate): iperf3 across the link (each way alone and both at once),
# and the compute alone: the same 4 ranks in the same namespaces, each a
# job of its own (world size 1, bench/headline_launch.py --impl alone).
# Results under bench/results/<UTC date>_headline-RATE/: meta.txt (versions,
# commit, parameters), commands.txt, one log per run, runs.tsv, summary.txt.
# Needs root (namespaces) and Horovod's venv (bench/horovod/setup.sh).
#
# Usage: bench/headline.sh [--rate 1gbit|10gbit] [--rounds N]
#          [--model "ARGS"] [--iters N] [--batches N] [--warmup N]
#          [--variants "hvdd hvdd-fp16 horovod ddp"] [--env "NAME=VALUE ..."]
#          [--no-calibrate]
# --env sets the same variables for every rank of every variant (hvdd run
# -x NAME=VALUE; the launcher's environment for the others).
# Environment: HOROVOD_VENV (default ../hvd-mpi-venv, else ../hvd-venv).
set -euo pipefail
cd "$(dirname "$0")/.."
RATE=1gbit ROUNDS=5 MODEL="--width 128 --image-size 8 --batch-size 4" ITERS=5 BATCHES=5 WARMUP=2
VARIANTS="hvdd hvdd-fp16 horovod ddp" CALIBRATE=1 ENVS=""
while [ $# -gt 0 ]; do
  case "$1" in
    --rate) RATE=$2; shift ;;
    --rounds) ROUNDS=$2; shift ;;
    --model) MODEL=$2; shift ;;
    --iters) ITERS=$2; shift ;;
    --batches) BATCHES=$2; shift ;;
    --warmup) WARMUP=$2; shift ;;
    --variants) VARIANTS=$2; shift ;;
    --env) ENVS=$2; shift ;;
    --no-calibrate) CALIBRATE=0 ;;
    -h|--help) sed -n '2,35p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "headline.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done
HVD=${HOROVOD_VENV:-}
if [ -z "$HVD" ]; then
  for d in ../hvd-mpi-venv ../hvd-venv; do [ -x "$d/bin/python" ] && { HVD=$(cd "$d" && pwd); break; }; done
fi
[ -n "$HVD" ] && "$HVD/bin/python" -c 'import horovod.torch' 2>/dev/null \
  || { echo "headline.sh: no Horovod venv (HOROVOD_VENV; bench/horovod/setup.sh builds one)" >&2; exit 1; }
PY=$PWD/.venv/bin/python
[ -x "$PY" ] || { echo "headline.sh: no .venv (scripts/setup.sh)" >&2; exit 1; }
go build -o bin/hvdd ./cmd/hvdd

OUT="bench/results/$(date -u +%Y-%m-%d_%H%M%S)_headline-$RATE"; mkdir -p "$OUT"
log() { echo "$*" | tee -a "$OUT/summary.txt"; }
load() { cut -d' ' -f1 /proc/loadavg; }
NS=hhd; A=10.213.236.1; B=10.213.236.2; W=$(mktemp -d); TBF=1
IF0=${NS}0i IF1=${NS}1i
# CPU time of each job: its processes in a cpuacct cgroup of their own (v1),
# where there is one.
CG=""
if [ -w /sys/fs/cgroup/cpuacct ]; then CG=/sys/fs/cgroup/cpuacct/hvdd-headline-$$; mkdir -p "$CG"; fi
cleanup() { netns_cleanup; rm -rf "/etc/netns/${NS}0" "/etc/netns/${NS}1"; [ -z "$CG" ] || rmdir "$CG" 2>/dev/null || true; }
trap cleanup EXIT
. bench/netns.sh
# Horovod 0.28.1 makes the gloo device of every process set (the global one
# included) from the host name, not HOROVOD_GLOO_IFACE (gloo_context.cc,
# InitializeForProcessSet: this context's gloo_iface_ is empty), so the host
# name must resolve to the host's own address, as it does on real hosts.
# ip netns exec bind-mounts /etc/netns/NS/hosts over /etc/hosts.
mkdir -p "/etc/netns/${NS}0" "/etc/netns/${NS}1"
printf '127.0.0.1 localhost\n%s %s\n' "$A" "$(hostname)" > "/etc/netns/${NS}0/hosts"
printf '127.0.0.1 localhost\n%s %s\n' "$B" "$(hostname)" > "/etc/netns/${NS}1/hosts"

unset HVDD_WIRE_COMPRESSION HVDD_TCP_STREAMS HVDD_TCP_CHUNK_BYTES HVDD_TCP_SMALL_BYTES HVDD_SPIN \
  HOROVOD_CYCLE_TIME HOROVOD_FUSION_THRESHOLD HOROVOD_AUTOTUNE HOROVOD_TIMELINE HOROVOD_HIERARCHICAL_ALLREDUCE
SCRIPT=$PWD/examples/pytorch_synthetic_benchmark.py
ARGS="$MODEL --num-warmup-batches $WARMUP --num-batches-per-iter $BATCHES --num-iters $ITERS"
STEPS=$((WARMUP + BATCHES * ITERS))
HOSTS="$A:${NS}0:$IF0:2,$B:${NS}1:$IF1:2"
PARAMS=$("$PY" - $MODEL <<'PY'
import sys, importlib.util
sys.argv = ["x"] + sys.argv[1:]
spec = importlib.util.spec_from_file_location("b", "examples/pytorch_synthetic_benchmark.py")
b = importlib.util.module_from_spec(spec); spec.loader.exec_module(b)
a, _ = b.parser.parse_known_args()
m = b.SmallResNet(a.width)
print(sum(p.numel() for p in m.parameters()), len(list(m.parameters())))
PY
)
NPARAM=${PARAMS% *}
{
  echo "date_utc: $(date -u +%FT%TZ)"
  echo "commit: $(git rev-parse --short HEAD)$(git diff --quiet HEAD || echo +dirty)"
  echo "hvdd: $(bin/hvdd version) sha256=$(sha256sum bin/hvdd | cut -c1-16)"
  echo "hvdd.torch: $("$PY" -c 'import os, hvdd; print(os.path.dirname(hvdd.__file__))')"
  echo "horovod: $("$HVD/bin/python" -c 'import horovod; print(horovod.__version__)') ($HVD)"
  echo "torch: $("$PY" -c 'import torch; print(torch.__version__)') (hvdd, ddp); $("$HVD/bin/python" -c 'import torch; print(torch.__version__)') (horovod)"
  echo "python: $("$PY" -c 'import sys; print(sys.version.split()[0])')"
  echo "machine: $(nproc) cpus, $(uname -sr), load $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "link: veth $IF0 ($A, ${NS}0) <-> $IF1 ($B, ${NS}1), tc tbf rate $RATE burst 1mb latency 10ms"
  echo "script: examples/pytorch_synthetic_benchmark.py $ARGS"
  echo "model: SmallResNet, ${PARAMS#* } gradient tensors, $NPARAM float32 parameters = $((NPARAM * 4)) bytes of gradients per step"
  echo "steps per run: $STEPS (warm-up $WARMUP + $ITERS x $BATCHES timed), plus one broadcast of the parameters"
  echo "rounds: $ROUNDS; variants: $VARIANTS; environment of every rank: ${ENVS:-(nothing added)}"
} | tee "$OUT/meta.txt"

txb() { ip netns exec "$1" cat "/sys/class/net/$2/statistics/tx_bytes"; }

cpu() { if [ -n "$CG" ]; then cat "$CG/cpuacct.usage"; else echo 0; fi; }
# run NAME CMD...: one job; prints "IMG BYTES_AB BYTES_BA SECONDS LOAD0 LOAD1 CPU_SECONDS".
run() {
  local name=$1; shift
  local l0 a0 b0 t0 c0 rc=0 img a1 b1 c1
  echo "$name: $*" >> "$OUT/commands.txt"
  l0=$(load); a0=$(txb ${NS}0 $IF0); b0=$(txb ${NS}1 $IF1); c0=$(cpu); t0=$(date +%s.%N)
  timeout 900 bash -c '[ -z "$1" ] || echo $$ > "$1/cgroup.procs"; shift; exec "$@"' _ "$CG" "$@" > "$OUT/$name.log" 2>&1 || rc=$?
  local secs; secs=$(python3 -c "import time; print('%.1f' % (time.time() - $t0))")
  a1=$(txb ${NS}0 $IF0); b1=$(txb ${NS}1 $IF1); c1=$(cpu)
  grep -m1 '^+ ' "$OUT/$name.log" | sed 's/^+/  command:/' >> "$OUT/commands.txt" || true
  local cpus; cpus=$(python3 -c "print('%.1f' % (($c1 - $c0) / 1e9))")
  img=$(grep -o 'Total img/sec on [0-9]* rank(s): [0-9.]*' "$OUT/$name.log" | tail -1 | awk '{print $NF}')
  if [[ $name == *alone ]]; then # each rank a job of its own: the sum of theirs
    img=$(grep -o 'Total img/sec on 1 rank(s): [0-9.]*' "$OUT/$name.log" | awk '{s += $NF} END {if (NR == 4) printf "%.1f", s}')
  fi
  if [ $rc != 0 ] || [ -z "$img" ]; then
    echo "  $name FAILED (rc $rc): $OUT/$name.log" >> "$OUT/commands.txt"
    tail -5 "$OUT/$name.log" >&2
    img=NaN
  fi
  echo "  -> $img img/s, $((a1 - a0)) B A->B, $((b1 - b0)) B B->A, ${secs} s, ${cpus} CPU s, load $l0 -> $(load)" >> "$OUT/commands.txt"
  echo "$img $((a1 - a0)) $((b1 - b0)) $secs $l0 $(load) $cpus"
}

# variant NAME: runs one job of variant NAME, after writing its command line
# (with the environment it adds) on stderr, which run() keeps in the job's log.
variant() {
  local cmd
  case "$1" in
    hvdd) cmd=(bin/hvdd run -np 4 -H $A:2,$B:2 --agent "$W/agent" $XFLAGS -- "$PY" "$SCRIPT" $ARGS) ;;
    hvdd-fp16) cmd=(bin/hvdd run -np 4 -H $A:2,$B:2 --agent "$W/agent" $XFLAGS --wire-compression fp16 -- "$PY" "$SCRIPT" $ARGS) ;;
    horovod) cmd=(env $ENVS HVDD_BENCH_IMPL=horovod ip netns exec ${NS}0 "$HVD/bin/python" bench/headline_launch.py --impl horovod
      --hosts "$HOSTS" --python "$HVD/bin/python" -- "$SCRIPT" $ARGS) ;;
    horovod-hier) cmd=(env $ENVS HOROVOD_HIERARCHICAL_ALLREDUCE=1 HVDD_BENCH_IMPL=horovod ip netns exec ${NS}0 "$HVD/bin/python"
      bench/headline_launch.py --impl horovod --hosts "$HOSTS" --python "$HVD/bin/python" -- "$SCRIPT" $ARGS) ;;
    ddp) cmd=(env $ENVS python3 bench/headline_launch.py --impl ddp --hosts "$HOSTS" --python "$PY" -- "$SCRIPT" --ddp $ARGS) ;;
    alone) cmd=(env $ENVS python3 bench/headline_launch.py --impl alone --hosts "$HOSTS" --python "$PY" -- "$SCRIPT" --ddp $ARGS) ;;
    *) echo "headline.sh: unknown variant $1" >&2; return 2 ;;
  esac
  echo "+ ${cmd[*]}" >&2
  "${cmd[@]}"
}
XFLAGS=""; for e in $ENVS; do XFLAGS="$XFLAGS -x $e"; done
export -f variant
export A B W NS PY SCRIPT ARGS HVD HOSTS ENVS XFLAGS

if [ "$CALIBRATE" = 1 ]; then
  for mode in "" "--reverse" "--bidir"; do
    ip netns exec ${NS}1 iperf3 -s -1 -D -p 5298 >/dev/null; sleep 0.5
    r=$(ip netns exec ${NS}0 iperf3 -c $B -p 5298 -t 5 -f m $mode 2>&1 | grep -E 'receiver' | awk '{for(i=1;i<=NF;i++) if($i=="Mbits/sec") print $(i-1)}' | tr '\n' ' ')
    log "iperf3 ${mode:-A->B} (5 s, 1 stream): $r Mbit/s (load $(load))"
  done
  read -r img ab ba secs l0 l1 cpus < <(run calibrate-alone bash -c 'variant alone')
  log "compute alone (the 4 ranks in place, each a job of its own, no exchange): $img img/s in all (${secs} s, ${cpus} CPU s, load $l0 -> $l1)"
fi

printf 'round\tvariant\timg_s\tbytes_a_to_b\tbytes_b_to_a\tseconds\tload_before\tload_after\tcpu_seconds\n' > "$OUT/runs.tsv"
read -ra V <<< "$VARIANTS"
for r in $(seq 1 "$ROUNDS"); do
  n=${#V[@]}
  for i in $(seq 0 $((n - 1))); do
    v=${V[$(( (i + r - 1) % n ))]}
    read -r img ab ba secs l0 l1 cpus < <(run "r$r-$v" bash -c "variant $v")
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$r" "$v" "$img" "$ab" "$ba" "$secs" "$l0" "$l1" "$cpus" >> "$OUT/runs.tsv"
    log "round $r $v: $img img/s, per step $((ab / STEPS / 1000000)) MB A->B, $((ba / STEPS / 1000000)) MB B->A, ${secs} s, ${cpus} CPU s, load $l0 -> $l1"
  done
done

python3 - "$OUT/runs.tsv" "$STEPS" "$NPARAM" "$VARIANTS" <<'PY' | tee -a "$OUT/summary.txt"
import csv, math, statistics as st, sys
rows = list(csv.DictReader(open(sys.argv[1]), delimiter="\t"))
steps, nparam, variants = int(sys.argv[2]), int(sys.argv[3]), sys.argv[4].split()
by = {v: [r for r in rows if r["variant"] == v] for v in variants}
med = {}
print("\nimg/s (4 ranks) per round, and medians:")
for v in variants:
    vals = [float(r["img_s"]) for r in by[v]]
    ok = [x for x in vals if not math.isnan(x)]
    med[v] = st.median(ok) if ok else float("nan")
    mb = st.median([max(int(r["bytes_a_to_b"]), int(r["bytes_b_to_a"])) for r in by[v]]) / steps / 1e6
    cpu = st.median([float(r["cpu_seconds"]) for r in by[v]])
    print("  %-10s %s  median %.2f; link bytes per step (the busier way, broadcast included) %.1f MB = %.2fx the gradients (%.1f MB); CPU per run %.1f s"
          % (v, " ".join("%.2f" % x for x in vals), med[v], mb, mb / (nparam * 4 / 1e6), nparam * 4 / 1e6, cpu))
print("\nratios of the medians:")
for h in ("hvdd", "hvdd-fp16"):
    for p in ("horovod", "ddp"):
        if h in med and p in med:
            print("  %s / %s = %.2fx" % (h, p, med[h] / med[p]))
PY
log "results in $OUT"
