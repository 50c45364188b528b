#!/usr/bin/env bash
# Soak: one daemon (--slots 4, metrics on) runs two jobs at once for
# --minutes, each a loop of `hvdd bench --check` jobs of 2 ranks over every
# collective at mixed sizes (4 B to 16 MiB), so jobs come and go on the
# daemon the whole time. Every --every seconds it records the daemon's RSS,
# open descriptors, memfd mappings (count and bytes, from /proc) and
# goroutines (go_goroutines from /metrics); at the end, with no job left, it
# compares the idle daemon against its idle state after the first round of
# jobs. Any bench job that fails, any wrong result (--check) or a growth
# beyond --slack counts as a failure. Not part of CI: run by hand.
#
# Usage: bench/soak.sh [--minutes M] [--every S] [--slack PCT]
set -euo pipefail
cd "$(dirname "$0")/.."
MINUTES=10 EVERY=30 SLACK=10
while [ $# -gt 0 ]; do
  case "$1" in
    --minutes) MINUTES=$2; shift ;;
    --every) EVERY=$2; shift ;;
    --slack) SLACK=$2; shift ;;
    -h|--help) sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "soak.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done
go build -o bin/hvdd ./cmd/hvdd
OUT="bench/results/soak-$(date +%Y-%m-%d_%H%M%S)"; mkdir -p "$OUT"
W=$(mktemp -d); SOCK=$W/hvdd.sock
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
log() { echo "$*" | tee -a "$OUT/log"; }
bin/hvdd serve --slots 4 --socket "$SOCK" --metrics-addr "127.0.0.1:$PORT" --log-level info 2> "$OUT/daemon.log" &
DAEMON=$!
cleanup() { kill "${LOOPS[@]}" 2>/dev/null || true; kill $DAEMON 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$W"; }
LOOPS=()
trap cleanup EXIT
for _ in $(seq 100); do [ -S "$SOCK" ] && break; sleep 0.1; done

# sample prints: seconds rss_kib fds memfd_maps memfd_kib goroutines jobs
sample() {
  local m gor heap jobs
  m=$(curl -s "http://127.0.0.1:$PORT/metrics")
  gor=$(echo "$m" | awk '/^go_goroutines /{print $2}')
  heap=$(echo "$m" | awk '/^go_memstats_heap_inuse_bytes /{printf "%d", $2/1024}')
  jobs=$(bin/hvdd status --socket "$SOCK" --json | python3 -c 'import json,sys; print(len(json.load(sys.stdin).get("jobs",[])))')
  python3 - "$DAEMON" "$SECONDS" "${gor:-?}" "${heap:-?}" "$jobs" <<'PY'
import os, sys
pid, secs, gor, heap, jobs = sys.argv[1:6]
st = {l.split(":")[0]: l.split()[1] for l in open(f"/proc/{pid}/status") if l.startswith(("VmRSS", "RssAnon"))}
fds = len(os.listdir(f"/proc/{pid}/fd"))
maps = kib = 0
for l in open(f"/proc/{pid}/maps"):
    if "memfd:" in l:
        lo, hi = (int(x, 16) for x in l.split()[0].split("-"))
        maps, kib = maps + 1, kib + (hi - lo) // 1024
print(secs, st["VmRSS"], fds, maps, kib, gor, jobs, st["RssAnon"], heap)
PY
}

# jobloop NAME: bench jobs of 2 ranks over every collective, until $DEADLINE.
OPS=(allreduce allgather broadcast alltoall reducescatter)
jobloop() {
  local name=$1 i=0 fails=0 runs=0
  while [ $SECONDS -lt $DEADLINE ]; do
    local op=${OPS[$((i % ${#OPS[@]}))]}
    if ! bin/hvdd run -np 2 --socket "$SOCK" --job "$name-$i" -- "$PWD/bin/hvdd" bench --op "$op" \
        --min-bytes 4 --max-bytes 16M --step-factor 16 --iters 10 --small-iters 50 --small-time 20ms --check --json \
        >> "$OUT/$name.out" 2>&1; then
      fails=$((fails + 1))
      echo "FAILED: job $name-$i ($op)" >> "$OUT/$name.out"
    fi
    runs=$((runs + 1)); i=$((i + 1))
  done
  echo "$name: $runs jobs, $fails failed" > "$OUT/$name.result"
}

log "# commit $(git rev-parse --short HEAD)$(git diff --quiet || echo +dirty), $(nproc) cores, $MINUTES minutes, samples every ${EVERY}s"
log "# seconds rss_kib fds memfd_maps memfd_kib goroutines jobs rss_anon_kib heap_inuse_kib"
log "start $(sample)"
# A first round of jobs warms the daemon (pools, regions, the Go heap); the
# baseline is the idle daemon after it.
DEADLINE=$((SECONDS + 1)); jobloop warmA & w1=$!; jobloop warmB & w2=$!; wait $w1 $w2
BASE=$(sample); log "baseline $BASE"
DEADLINE=$((SECONDS + MINUTES * 60))
jobloop A & LOOPS+=($!)
jobloop B & LOOPS+=($!)
while [ $SECONDS -lt $DEADLINE ]; do
  sleep "$EVERY"
  log "running $(sample)"
done
wait "${LOOPS[@]}"
LOOPS=()
# Idle again: the jobs' connections have closed (status shows no job).
for _ in $(seq 100); do
  s=$(sample); [ "$(echo "$s" | awk '{print $7}')" = 0 ] && break; sleep 0.1
done
END=$(sample); log "end $END"
cat "$OUT"/A.result "$OUT"/B.result | tee -a "$OUT/log"
python3 - "$BASE" "$END" "$SLACK" "$OUT" <<'PY' | tee -a "$OUT/log"
import sys, glob, statistics
base, end, slack, out = sys.argv[1].split(), sys.argv[2].split(), float(sys.argv[3]), sys.argv[4]
bad = []
# Idle against idle: descriptors, memfd mappings and their bytes, goroutines.
for i, n in [(2, "fds"), (3, "memfd_maps"), (4, "memfd_kib"), (5, "goroutines")]:
    b, e = base[i], end[i]
    if "?" in (b, e):
        print(f"idle {n}: {b} -> {e} (not measured)"); continue
    ok = float(e) <= float(b)
    print(f"idle {n}: {b} -> {e} {'ok' if ok else 'GREW'}")
    if not ok: bad.append(n)
# Memory under load, the last third of the run against the middle third
# (the first third includes the growth to the daemon's working set, and the
# metrics of ended jobs, kept --metrics retention (5 minutes), build up
# during it): the Go heap in use, and the private RSS. Medians of the
# samples taken while jobs ran: the heap in use holds whatever garbage the
# collector has not yet swept when the sample comes, so one sample's value
# swings by a third either way.
run = [l.split() for l in open(out + "/log") if l.startswith("running ") and int(l.split()[7]) > 0]
if len(run) >= 3:
    k = len(run) // 3
    for col, n in [(9, "heap_inuse_kib"), (8, "rss_anon_kib"), (2, "rss_kib")]:
        mid = statistics.median(int(r[col]) for r in run[k:2 * k])
        last = statistics.median(int(r[col]) for r in run[-k:])
        grew = (last - mid) / mid * 100
        ok = grew <= slack or n == "rss_kib"  # rss_kib includes the jobs' shared memory: shown, not judged
        print(f"{n} under load: middle third median {mid:.0f}, last third median {last:.0f} ({grew:+.1f}%) {'ok' if ok else 'GREW'}")
        if not ok: bad.append(n)
else:
    print("memory under load: too few samples (raise --minutes or lower --every)")
fails = sum(int(open(f).read().split()[3]) for f in glob.glob(out + "/[AB].result"))
checks = sum(open(f).read().count('"check":"FAIL"') for f in glob.glob(out + "/[AB].out"))
print(f"failed jobs: {fails}, failed checks: {checks}")
sys.exit(1 if bad or fails or checks else 0)
PY
log "results in $OUT"
