#!/usr/bin/env bash
# Binary size and start-up time of two hvdd binaries, measured interleaved
# (A, B, B, A, A, B, ...) so that load on the machine falls on both alike:
#   version  `hvdd version` from exec to exit;
#   serve    `hvdd serve --slots 1` from exec until its socket accepts a
#            connection (connect(2) succeeds: the daemon listens), then
#            SIGTERM and wait.
# It prints each binary's size and the median (and quartiles) of RUNS runs
# of each, and the ratio B/A. Written for issue 17 ("the default build's
# binary size and start-up unchanged within 10%").
#
# Usage: bench/startup.sh [-n RUNS] OLD_HVDD NEW_HVDD
#   e.g. git archive 85f0211 | tar -x -C /tmp/old && (cd /tmp/old && go build -o /tmp/hvdd-old ./cmd/hvdd)
#        go build -o /tmp/hvdd-new ./cmd/hvdd && bench/startup.sh -n 30 /tmp/hvdd-old /tmp/hvdd-new
set -euo pipefail
runs=30
case "${1:-}" in
  -h|--help) sed -n 2,16p "$0"; exit 0 ;;
  -n) runs=$2; shift 2 ;;
esac
if [ $# -ne 2 ]; then
  echo "usage: bench/startup.sh [-n RUNS] OLD_HVDD NEW_HVDD (see --help)" >&2
  exit 2
fi
for b in "$1" "$2"; do
  [ -x "$b" ] || { echo "bench/startup.sh: $b is not an executable" >&2; exit 2; }
done
exec python3 - "$runs" "$1" "$2" <<'PY'
import os, signal, socket, statistics, subprocess, sys, tempfile, time

runs, bins = int(sys.argv[1]), sys.argv[2:4]

def version(b):
    t = time.perf_counter_ns()
    subprocess.run([b, "version"], check=True, stdout=subprocess.DEVNULL)
    return (time.perf_counter_ns() - t) / 1e6

def serve(b, d):
    sock = os.path.join(d, "hvdd.sock")
    t = time.perf_counter_ns()
    p = subprocess.Popen([b, "serve", "--slots", "1", "--socket", sock, "--log-level", "error"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    while True:
        try:
            s.connect(sock)
            break
        except (FileNotFoundError, ConnectionRefusedError):
            if p.poll() is not None:
                sys.exit(f"{b} serve exited ({p.returncode}) before its socket answered")
            time.sleep(0.0002)
    ms = (time.perf_counter_ns() - t) / 1e6
    s.close()
    p.send_signal(signal.SIGTERM)
    # 0, or killed by the signal when it came before serve set up its
    # handler (the socket listens a little earlier).
    if p.wait(30) not in (0, -signal.SIGTERM):
        sys.exit(f"{b} serve exited {p.returncode} after SIGTERM")
    return ms

res = {b: {"version": [], "serve": []} for b in bins}
with tempfile.TemporaryDirectory() as d:
    for b in bins:  # warm the page cache: one untimed run each
        version(b); serve(b, d)
    for i in range(runs):
        for b in (bins if i % 2 == 0 else bins[::-1]):  # neither always first
            res[b]["version"].append(version(b))
            res[b]["serve"].append(serve(b, d))

def q(xs):
    qs = statistics.quantiles(xs, n=4)
    return qs[1], qs[0], qs[2]

old, new = bins
print(f"{'':24} {'A: ' + os.path.basename(old):>22} {'B: ' + os.path.basename(new):>22} {'B/A':>7}")
so, sn = os.path.getsize(old), os.path.getsize(new)
print(f"{'size (bytes)':24} {so:>22} {sn:>22} {sn / so:>7.3f}")
for m in ("version", "serve"):
    mo, mn = q(res[old][m]), q(res[new][m])
    cell = lambda x: f"{x[0]:.2f} ({x[1]:.2f}-{x[2]:.2f})"
    print(f"{m + ' ms, median (IQR)':24} {cell(mo):>22} {cell(mn):>22} {mn[0] / mo[0]:>7.3f}")
print(f"{runs} runs each, interleaved; {os.cpu_count()} CPUs; load average {os.getloadavg()[0]:.2f}")
PY
