#!/usr/bin/env bash
# Adasum allreduce, Horovod 0.28.1's CPU Adasum (its MPI build) against hvdd,
# interleaved rounds, on 2 and 4 ranks of this machine: the same script
# (bench/horovod/adasum.py), the same launcher (Open MPI's mpirun, whose
# placement hvdd's client reads); only HVDD_BENCH_IMPL=horovod differs, and
# for hvdd a daemon of the job's own on a private socket (see start_daemon).
# Results: meta.txt (versions), commands.txt (each command with the 1-minute
# load average before and after it), results.txt, summary.txt, and per job
# its log (and for hvdd its daemon's log).
#
#   HOROVOD_MPI=1 bench/horovod/setup.sh   # once: Horovod with MPI in ../hvd-mpi-venv
#   bench/horovod/run_adasum.sh            # logs + summary.txt under bench/results/<date>_adasum/
#
# Environment:
#   HOROVOD_VENV  the venv (default: <repo>/../hvd-mpi-venv)
#   HVDD_BIN      the hvdd binary (default: <repo>/bin/hvdd)
#   HVDD_PYTHON   python with hvdd.torch (default: <repo>/.venv/bin/python)
#   ROUNDS        interleaved rounds (default 3); NPS ranks per job (default "2 4")
#   MIB, ITERS    tensor size in MiB (default 64) and timed allreduces per job (default 10)
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
VENV="${HOROVOD_VENV:-$(dirname "$REPO")/hvd-mpi-venv}"
HVDD_BIN="${HVDD_BIN:-$REPO/bin/hvdd}"
HVDD_PYTHON="${HVDD_PYTHON:-$REPO/.venv/bin/python}"
ROUNDS="${ROUNDS:-3}"
NPS="${NPS:-2 4}"
MIB="${MIB:-64}"
ITERS="${ITERS:-10}"
OUT="${OUT:-$REPO/bench/results/$(date -u +%Y-%m-%d_%H%M%S)_adasum}"

die() { printf '[adasum-bench] %s\n' "$*" >&2; exit 1; }
[ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c 'import horovod.torch' 2>/dev/null \
  || die "no Horovod in $VENV: run HOROVOD_MPI=1 bench/horovod/setup.sh first"
[ -x "$HVDD_BIN" ] || die "no hvdd binary at $HVDD_BIN (go build -o bin/hvdd ./cmd/hvdd)"
mkdir -p "$OUT"
# The hvdd ranks' daemon: one per job, started here on a private socket
# (HVDD_SOCKET, which the ranks then join rather than starting one), with
# the flags the client's launcher support would give it (hvdd._launcher:
# serve --slots N --exit-after-job), so that a daemon someone else left on
# the default socket is neither joined nor measured; its log goes to $OUT.
RUNDIR="$(mktemp -d /tmp/hvdd-adasum.XXXXXX)"
daemon=
trap '[ -n "$daemon" ] && kill "$daemon" 2>/dev/null; rm -rf "$RUNDIR"' EXIT
start_daemon() { # NP LOG
  rm -f "$RUNDIR/hvdd.sock"
  "$HVDD_BIN" serve --slots "$1" --socket "$RUNDIR/hvdd.sock" --exit-after-job --log-level info >"$2" 2>&1 &
  daemon=$!
  for _ in $(seq 100); do [ -S "$RUNDIR/hvdd.sock" ] && return 0; sleep 0.1; done
  die "hvdd serve did not start (log: $2)"
}
{
  echo "date_utc: $(date -u +%FT%TZ)"
  echo "repo_head: $(git -C "$REPO" rev-parse HEAD 2>/dev/null || echo '?')"
  echo "hvdd_bin: $HVDD_BIN sha256=$(sha256sum "$HVDD_BIN" | cut -c1-16)"
  echo "horovod: $("$VENV/bin/python" -c 'import horovod; print(horovod.__version__)') in $VENV"
  echo "mpirun: $(mpirun --version 2>/dev/null | head -1)"
  # getconf, not nproc: nproc reports OMP_NUM_THREADS when it is set.
  echo "machine: $(getconf _NPROCESSORS_ONLN) cpus, loadavg $(cut -d' ' -f1-3 /proc/loadavg); ${MIB} MiB float32, $ITERS timed + 3 warm-up per job"
} | tee "$OUT/meta.txt"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1

for round in $(seq 1 "$ROUNDS"); do
  for np in $NPS; do
    for impl in horovod hvdd; do
      py="$HVDD_PYTHON"; [ "$impl" = horovod ] && py="$VENV/bin/python"
      cmd=(mpirun -np "$np" --oversubscribe --bind-to none -x OMP_NUM_THREADS -x HVDD_BENCH_IMPL -x HVDD_BIN -x HVDD_SOCKET -x PYTHONPATH
           "$py" "$REPO/bench/horovod/adasum.py" --mib "$MIB" -n "$ITERS")
      log="$OUT/r${round}_np${np}_${impl}.log"
      before=$(cut -d' ' -f1 /proc/loadavg)
      [ "$impl" = hvdd ] && start_daemon "$np" "$OUT/r${round}_np${np}_${impl}.daemon.log"
      sock=; [ "$impl" = hvdd ] && sock="$RUNDIR/hvdd.sock"
      HVDD_BENCH_IMPL=$impl HVDD_BIN="$HVDD_BIN" HVDD_SOCKET="$sock" timeout 600 "${cmd[@]}" >"$log" 2>&1 \
        || { tail -n 30 "$log" >&2; die "np=$np $impl failed (log: $log)"; }
      echo "[adasum-bench] round $round np=$np $impl (load before $before, after $(cut -d' ' -f1 /proc/loadavg)): ${cmd[*]}" | tee -a "$OUT/commands.txt"
      grep '^impl=' "$log" | sed "s/\$/ load_before=$before load_after=$(cut -d' ' -f1 /proc/loadavg)/" | tee -a "$OUT/results.txt"
      if [ -n "$daemon" ]; then wait "$daemon" || true; daemon=; fi
    done
  done
done

"$HVDD_PYTHON" - "$OUT/results.txt" <<'PY' | tee "$OUT/summary.txt"
import re, statistics, sys
rows = {}
for line in open(sys.argv[1]):
    kv = dict(re.findall(r"(\w+)=(\S+)", line))
    rows.setdefault((int(kv["np"]), kv["impl"]), []).append(float(kv["median_ms"]))
print("np  Horovod median ms (rounds)            hvdd median ms (rounds)               Horovod/hvdd")
ratios = {}
for np in sorted({k[0] for k in rows}):
    h, d = rows.get((np, "horovod"), []), rows.get((np, "hvdd"), [])
    if h and d:
        mh, md = statistics.median(h), statistics.median(d)
        print(f"{np:<3} {mh:8.1f} ({' '.join(f'{v:.1f}' for v in h):<26}) {md:8.1f} ({' '.join(f'{v:.1f}' for v in d):<26}) {mh / md:6.2f}")
        ratios[np] = [a / b for a, b in zip(h, d)]
# Each round's Horovod and hvdd jobs ran one after the other: their ratio
# is the pair's, less exposed to the machine's drift between rounds.
for np, rs in ratios.items():
    print(f"np={np}: Horovod/hvdd per round {' '.join(f'{v:.2f}' for v in rs)}; median {statistics.median(rs):.2f}, min {min(rs):.2f}")
PY
