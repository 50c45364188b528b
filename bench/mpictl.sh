#!/usr/bin/env bash
# Control links over TCP or over MPI (hvdd serve --control tcp|mpi) with the
# mpi engine: the 4-byte allreduce median, 2 "nodes" x 1 rank on the loopback
# addresses 127.0.0.2 and 127.0.0.3 of this machine (a local agent stands in
# for ssh), alternated round by round. Needs hvdd built with -tags mpi and
# Open MPI's mpirun. With --gap, each timed allreduce follows a pause of
# that length (hvdd bench --gap), as a training step's first one does.
#
# Usage: bench/mpictl.sh [--rounds N] [--iters N] [--gap DURATION] [HVDD_BIN]
#        (default binary: a fresh -tags mpi build; --gap 50ms makes --iters default to 60)
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=4; ITERS=; GAP=0s
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) ROUNDS=$2; shift ;;
    --iters) ITERS=$2; shift ;;
    --gap) GAP=$2; shift ;;
    -h|--help) sed -n '2,10p' "$0"; exit 0 ;;
    -*) echo "unknown argument $1" >&2; exit 2 ;;
    *) break ;;
  esac
  shift
done
if [ -z "$ITERS" ]; then
  if [ "$GAP" = 0s ]; then ITERS=1000; else ITERS=60; fi
fi
W=$(mktemp -d); trap 'rm -rf "$W"' EXIT
bin=${1:-}
if [ -z "$bin" ]; then
  bin=$W/hvdd; go build -tags mpi -o "$bin" ./cmd/hvdd
fi
bin=$(readlink -f "$bin")
# agent HOST COMMAND: every "host" is this machine; each orted gets its own
# Open MPI session directory (two creating a shared one can fail, EEXIST).
cat > "$W/agent" <<AGENT
#!/bin/sh
OMPI_MCA_orte_tmpdir_base=$W/ompi-\$1; export OMPI_MCA_orte_tmpdir_base
mkdir -p "\$OMPI_MCA_orte_tmpdir_base"; shift
exec sh -c "\$*"
AGENT
chmod +x "$W/agent"
# Open MPI's orted can crash writing the hwloc topology when several "hosts"
# share one machine (rtc_hwloc_vmhole=none).
export OMPI_MCA_rtc_hwloc_vmhole=none
for r in $(seq 1 "$ROUNDS"); do
  for ctl in tcp mpi; do
    med=$(HVDD_CONTROL=$ctl "$bin" run -np 2 -H 127.0.0.2:1,127.0.0.3:1 --backend mpi --agent "$W/agent" -- \
      "$bin" bench --op allreduce --min-bytes 4 --max-bytes 4 --iters "$ITERS" --gap "$GAP" --json 2>&1 \
      | grep -o '"median_us":[0-9.e-]*' | head -1 | cut -d: -f2)
    echo "round $r control $ctl 4B median_us ${med:-FAILED} (gap $GAP)"
  done
done
