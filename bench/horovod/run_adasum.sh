#!/usr/bin/env bash
# Adasum allreduce, Horovod 0.28.1's CPU Adasum (its MPI build) against hvdd,
# interleaved rounds, on 2 and 4 ranks of this machine: the same script
# (bench/horovod/adasum.py), the same launcher (Open MPI's mpirun, which
# hvdd's client recognises: it starts the job's daemon itself); only
# HVDD_BENCH_IMPL=horovod differs.
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
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
{
  echo "date_utc: $(date -u +%FT%TZ)"
  echo "repo_head: $(git -C "$REPO" rev-parse HEAD 2>/dev/null || echo '?')"
  echo "hvdd_bin: $HVDD_BIN sha256=$(sha256sum "$HVDD_BIN" | cut -c1-16)"
  echo "horovod: $("$VENV/bin/python" -c 'import horovod; print(horovod.__version__)') in $VENV"
  echo "machine: $(nproc) cpus, loadavg $(cut -d' ' -f1-3 /proc/loadavg); ${MIB} MiB float32, $ITERS timed + 3 warm-up per job"
} | tee "$OUT/meta.txt"

for round in $(seq 1 "$ROUNDS"); do
  for np in $NPS; do
    for impl in horovod hvdd; do
      py="$HVDD_PYTHON"; [ "$impl" = horovod ] && py="$VENV/bin/python"
      cmd=(mpirun -np "$np" --oversubscribe --bind-to none -x OMP_NUM_THREADS -x HVDD_BENCH_IMPL -x HVDD_BIN -x PYTHONPATH
           "$py" "$REPO/bench/horovod/adasum.py" --mib "$MIB" -n "$ITERS")
      log="$OUT/r${round}_np${np}_${impl}.log"
      echo "[adasum-bench] round $round np=$np $impl (load $(cut -d' ' -f1 /proc/loadavg)): ${cmd[*]}" | tee -a "$OUT/commands.txt"
      HVDD_BENCH_IMPL=$impl HVDD_BIN="$HVDD_BIN" timeout 600 "${cmd[@]}" >"$log" 2>&1 \
        || { tail -n 30 "$log" >&2; die "np=$np $impl failed (log: $log)"; }
      grep '^impl=' "$log" | tee -a "$OUT/results.txt"
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
for np in sorted({k[0] for k in rows}):
    h, d = rows.get((np, "horovod"), []), rows.get((np, "hvdd"), [])
    if h and d:
        mh, md = statistics.median(h), statistics.median(d)
        print(f"{np:<3} {mh:8.1f} ({' '.join(f'{v:.1f}' for v in h):<26}) {md:8.1f} ({' '.join(f'{v:.1f}' for v in d):<26}) {mh / md:6.2f}")
PY
