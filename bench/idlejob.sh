#!/usr/bin/env bash
# CPU time of the daemons of a 2-node job (loopback "hosts") whose ranks sit
# idle for 10 s after init: what heartbeats and link checks cost. Extra
# arguments go to hvdd run, e.g. --backend mpi --agent AGENT (with
# HVDD_CONTROL=mpi in the environment for control over MPI).
#
# Usage: bench/idlejob.sh [HVDD_RUN_ARGS...]
set -euo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in -h|--help) sed -n 2,7p "$0"; exit 0 ;; esac
HVDD=${HVDD:-bin/hvdd}
"$HVDD" run -np 2 -H 127.0.0.2:1,127.0.0.3:1 "$@" -- .venv/bin/python -c "import hvdd.torch as hvd, time; hvd.init(); print('up', flush=True); time.sleep(12)" > "${TMPDIR:-/tmp}/idlejob.$$" 2>&1 &
job=$!
until grep -q up "${TMPDIR:-/tmp}/idlejob.$$" 2>/dev/null; do
  kill -0 "$job" 2>/dev/null || { echo "the job ended before its ranks were up:" >&2; cat "${TMPDIR:-/tmp}/idlejob.$$" >&2; exit 1; }
  sleep 0.2
done
sleep 1
pids=$(pgrep -f 'serve --slots 1 --nodes 2 --node-rank' | while read -r p; do
  case "$(cat /proc/$p/comm)" in mpirun|orterun) ;; *) echo "$p" ;; esac
done)
tick=$(getconf CLK_TCK)
declare -A a
for p in $pids; do a[$p]=$(awk '{print $14+$15}' /proc/$p/stat); done
sleep 10
for p in $pids; do b=$(awk '{print $14+$15}' /proc/$p/stat); echo "daemon $p: $(( b - ${a[$p]} )) ticks ($tick/s) in 10 s"; done
wait
rm -f "${TMPDIR:-/tmp}/idlejob.$$"
