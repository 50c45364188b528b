#!/usr/bin/env bash
# Horovod 0.28.1 (horovodrun --gloo) against hvdd on this machine, 2 ranks,
# interleaved rounds: per round
#   synthetic  examples/pytorch_synthetic_benchmark.py   (img/s per rank)
#   latency    clients/python/bench/overhead.py --worker (median µs of a 4-byte allreduce)
# each as horovod (HOROVOD_CYCLE_TIME unset = 1 ms), hvdd, horovod (HOROVOD_CYCLE_TIME=0.1),
# and the synthetic one also as PyTorch DistributedDataParallel on gloo (--ddp).
# The scripts are the same for both; HVDD_BENCH_IMPL=horovod makes them import
# horovod.torch instead of hvdd.torch.
#
#   bench/horovod/setup.sh          # once: builds the Horovod venv
#   bench/horovod/run.sh            # 2 rounds, raw logs + summary.txt under bench/results/<date>_horovod/
#
# Environment:
#   HOROVOD_VENV   the venv setup.sh built (default: <repo>/../hvd-venv)
#   HVDD_BIN       the hvdd binary (default: <repo>/bin/hvdd, built with go build if absent)
#   HVDD_PYTHON    python with hvdd.torch (default: <repo>/.venv/bin/python); PYTHONPATH
#                  may point it at another copy of clients/python (meta.txt records which)
#   ROUNDS         interleaved rounds (default 2)
#   CYCLE_TIMES    Horovod HOROVOD_CYCLE_TIME values per round, "default" = unset (default: "default 0.1")
#   SYN_ARGS       extra arguments for the synthetic benchmark (default: none, the script's defaults)
#   LAT_N, LAT_WARMUP  timed / warm-up allreduces per latency run (default 5000 / 500)
#   OUT            results directory (default: <repo>/bench/results/<date>_horovod)
#   ONLY           "synthetic" or "latency" to run one of the two
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
VENV="${HOROVOD_VENV:-$(dirname "$REPO")/hvd-venv}"
HVDD_BIN="${HVDD_BIN:-$REPO/bin/hvdd}"
HVDD_PYTHON="${HVDD_PYTHON:-$REPO/.venv/bin/python}"
ROUNDS="${ROUNDS:-2}"
CYCLE_TIMES="${CYCLE_TIMES:-default 0.1}"
SYN_ARGS="${SYN_ARGS:-}"
LAT_N="${LAT_N:-5000}"
LAT_WARMUP="${LAT_WARMUP:-500}"
OUT="${OUT:-$REPO/bench/results/$(date -u +%Y-%m-%d_%H%M%S)_horovod}"
ONLY="${ONLY:-}"

die() { printf '[horovod-bench] %s\n' "$*" >&2; exit 1; }
[ -x "$VENV/bin/horovodrun" ] || die "no horovodrun in $VENV: run bench/horovod/setup.sh first"
[ -x "$HVDD_PYTHON" ] || die "no python at $HVDD_PYTHON (HVDD_PYTHON)"
"$HVDD_PYTHON" -c 'import hvdd.torch' || die "$HVDD_PYTHON cannot import hvdd.torch"
if [ ! -x "$HVDD_BIN" ]; then
  echo "[horovod-bench] building $HVDD_BIN"
  (cd "$REPO" && go build -o "$HVDD_BIN" ./cmd/hvdd) || die "go build ./cmd/hvdd failed"
fi

mkdir -p "$OUT"
SYN="$REPO/examples/pytorch_synthetic_benchmark.py"
LAT="$REPO/clients/python/bench/overhead.py"
TMP="$(mktemp -d /tmp/hvdd-vs-horovod.XXXXXX)"
trap 'rm -rf "$TMP"' EXIT

{
  echo "date_utc: $(date -u +%FT%TZ)"
  echo "repo_head: $(git -C "$REPO" rev-parse HEAD 2>/dev/null || echo '?')"
  echo "repo_dirty_files: $(git -C "$REPO" status --porcelain 2>/dev/null | wc -l)"
  echo "hvdd_bin: $HVDD_BIN sha256=$(sha256sum "$HVDD_BIN" | cut -c1-16)"
  echo "hvdd_python: $HVDD_PYTHON (hvdd.torch from $("$HVDD_PYTHON" -c 'import os, hvdd; print(os.path.dirname(hvdd.__file__))'))"
  echo "horovod_venv: $VENV ($("$VENV/bin/python" -c 'import horovod; print("horovod", horovod.__version__)'))"
  echo "torch: $("$VENV/bin/python" -c 'import torch; print(torch.__version__)')"
  echo "machine: $(nproc) cpus, $(uname -srm), loadavg $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "rounds: $ROUNDS; horovod cycle times: $CYCLE_TIMES; SYN_ARGS: ${SYN_ARGS:-(defaults)}; latency n=$LAT_N warmup=$LAT_WARMUP"
} | tee "$OUT/meta.txt"

# run NAME CMD...: runs from the repo root, output to $OUT/NAME.log.
run() {
  local name="$1"; shift
  echo "[horovod-bench] $name: $*" | tee -a "$OUT/commands.txt"
  local t0=$SECONDS load0
  load0="$(cut -d' ' -f1 /proc/loadavg)"
  if ! (cd "$REPO" && timeout 600 "$@") >"$OUT/$name.log" 2>&1; then
    tail -n 20 "$OUT/$name.log" >&2
    die "$name failed (log: $OUT/$name.log)"
  fi
  echo "[horovod-bench]   done in $((SECONDS - t0)) s; 1-min loadavg before $load0, after $(cut -d' ' -f1 /proc/loadavg)" \
    | tee -a "$OUT/commands.txt"
}

# horovod_cmd CYCLE SCRIPT ARGS... / hvdd_cmd SCRIPT ARGS...: set CMD to the job's command line.
horovod_cmd() {
  local cyc="$1"; shift
  if [ "$cyc" = default ]; then
    CMD=(env -u HOROVOD_CYCLE_TIME HVDD_BENCH_IMPL=horovod)
  else
    CMD=(env HOROVOD_CYCLE_TIME="$cyc" HVDD_BENCH_IMPL=horovod)
  fi
  CMD+=("$VENV/bin/horovodrun" --gloo -np 2 -H localhost:2 "$VENV/bin/python" "$@")
}
hvdd_cmd() { # a private daemon for the job, on a temporary socket
  CMD=(env -u HOROVOD_CYCLE_TIME HVDD_BENCH_IMPL=hvdd "$HVDD_BIN" run -np 2 --socket "$TMP/hvdd.sock" --
       "$HVDD_PYTHON" "$@")
}

read -r -a cycles <<<"$CYCLE_TIMES"
read -r -a syn_args <<<"$SYN_ARGS"
lat_args=(--worker -n "$LAT_N" --warmup "$LAT_WARMUP")
for r in $(seq 1 "$ROUNDS"); do
  for kind in synthetic latency; do
    [ -z "$ONLY" ] || [ "$ONLY" = "$kind" ] || continue
    if [ "$kind" = synthetic ]; then script=("$SYN" "${syn_args[@]}"); else script=("$LAT" "${lat_args[@]}"); fi
    # horovod (first cycle time), hvdd, horovod (the other cycle times)
    for i in "${!cycles[@]}"; do
      horovod_cmd "${cycles[$i]}" "${script[@]}"
      run "r${r}_${kind}_horovod_cycle-${cycles[$i]}" "${CMD[@]}"
      if [ "$i" = 0 ]; then
        hvdd_cmd "${script[@]}"
        run "r${r}_${kind}_hvdd" "${CMD[@]}"
        if [ "$kind" = synthetic ]; then
          # PyTorch DistributedDataParallel on gloo, the same model and batches.
          run "r${r}_${kind}_ddp-gloo" "$HVDD_PYTHON" "$SYN" --ddp --np 2 "${syn_args[@]}"
        fi
      fi
    done
  done
done

# Summary: one line per run, then the median over rounds of each configuration.
python3 - "$OUT" <<'EOF' | tee "$OUT/summary.txt"
import os, re, statistics, sys
out = sys.argv[1]
rows = {}
for name in sorted(os.listdir(out)):
    m = re.match(r"r(\d+)_(synthetic|latency)_(.+)\.log$", name)
    if not m:
        continue
    text = open(os.path.join(out, name)).read()
    if m.group(2) == "synthetic":
        v = re.search(r"Img/sec per rank: ([\d.]+)", text)
        vals = (float(v.group(1)),) if v else None
    else:
        v = re.search(r"python median_us=([\d.]+) \(allreduce_\) ([\d.]+) \(allreduce\)", text)
        vals = (float(v.group(1)), float(v.group(2))) if v else None
    rows.setdefault((m.group(2), m.group(3)), []).append((int(m.group(1)), vals))
for (kind, impl), runs in sorted(rows.items()):
    unit = "img/s per rank" if kind == "synthetic" else "us median, allreduce_ / allreduce"
    per = "  ".join("r%d=%s" % (r, "/".join("%.1f" % x for x in v) if v else "?") for r, v in sorted(runs))
    good = [v for _, v in runs if v]
    med = "/".join("%.1f" % statistics.median(col) for col in zip(*good)) if good else "?"
    print("%-9s %-24s %s  median=%s  (%s)" % (kind, impl, per, med, unit))
EOF
echo "[horovod-bench] raw logs: $OUT"
