#!/usr/bin/env bash
# hvdd.tensorflow against Horovod 0.28.1's TensorFlow build (horovodrun --gloo) and
# against tf.distribute.MultiWorkerMirroredStrategy, 2 ranks on this machine,
# interleaved rounds of examples/tensorflow2_synthetic_benchmark.py (img/s per rank).
#
# Per round, for each mode (tape = the script's tf.function step with
# DistributedGradientTape, fit = model.fit with the Keras DistributedOptimizer),
# each implementation once, the order rotated by one every round:
#   horovod     horovodrun --gloo -np 2 -H localhost:2  HVD_TF_PY ... --impl horovod   (TF 2.15, Keras 2)
#   hvdd        hvdd run -np 2 --socket TMP/hvdd.sock -- HVDD_PYTHON ... --impl hvdd  (TF 2.21, Keras 3)
#   mwms        2 local workers with TF_CONFIG, HVDD_PYTHON ... --impl mwms            (TF 2.21, Keras 3)
#   mwms-tf215  the same with the Horovod venv's python                               (TF 2.15, Keras 2)
#
#   bench/horovod/setup_tf.sh        # once: builds the Horovod + TensorFlow venv
#   bench/horovod/run_tf.sh          # 3 rounds; raw logs + summary.txt under bench/results/<date>_horovod_tf/
#
# Environment:
#   HOROVOD_TF_VENV  the venv setup_tf.sh built (default: <repo>/../hvd-tf-venv)
#   HVDD_BIN         the hvdd binary (default: <repo>/bin/hvdd, built with go build if absent)
#   HVDD_PYTHON      python with hvdd.tensorflow (default: <repo>/.venv/bin/python)
#   ROUNDS           interleaved rounds (default 3)
#   IMPLS            implementations, in round 1's order (default: "horovod hvdd mwms mwms-tf215")
#   MODES            "tape fit" (default), or one of them
#   BENCH_ARGS       model and size (default: --model ResNet50 --image-size 64 --batch-size 16
#                    --num-warmup-batches 5 --num-batches-per-iter 5 --num-iters 6 --threads 1)
#   RUN_TIMEOUT      seconds before a run is killed (default 600)
#   OUT              results directory (default: <repo>/bench/results/<date>_horovod_tf)
#   SUMMARY_ONLY=1   only rewrite OUT's summary.txt from its logs (IMPLS and MODES as when run)
# A configuration that fails is recorded (commands.txt, its .log, summary.txt) and
# not run again in later rounds; the others go on.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
VENV="${HOROVOD_TF_VENV:-$(dirname "$REPO")/hvd-tf-venv}"
HVDD_BIN="${HVDD_BIN:-$REPO/bin/hvdd}"
HVDD_PYTHON="${HVDD_PYTHON:-$REPO/.venv/bin/python}"
ROUNDS="${ROUNDS:-3}"
IMPLS="${IMPLS:-horovod hvdd mwms mwms-tf215}"
MODES="${MODES:-tape fit}"
BENCH_ARGS="${BENCH_ARGS:---model ResNet50 --image-size 64 --batch-size 16 --num-warmup-batches 5 --num-batches-per-iter 5 --num-iters 6 --threads 1}"
RUN_TIMEOUT="${RUN_TIMEOUT:-600}"
OUT="${OUT:-$REPO/bench/results/$(date -u +%Y-%m-%d_%H%M%S)_horovod_tf}"

die() { printf '[horovod-tf-bench] %s\n' "$*" >&2; exit 1; }
# summarize: each configuration's rank-0 "Img/sec per rank" per round, as the mean over the
# timed iterations (what the script reports first) and as their median (which a one-off
# stall in one iteration does not move); the median over rounds of each; hvdd's ratio to
# each of the others. Writes $OUT/summary.txt.
summarize() {
python3 - "$OUT" "$IMPLS" "$MODES" <<'EOF' | tee "$OUT/summary.txt"
import os, re, statistics, sys
out, impls, modes = sys.argv[1], sys.argv[2].split(), sys.argv[3].split()
rows = {}
for name in sorted(os.listdir(out)):
    m = re.match(r"r(\d+)_(tape|fit)_(.+)\.log$", name)
    if not m:
        continue
    v = re.search(r"Img/sec per rank: ([\d.]+) \+-[\d.]+ \(median ([\d.]+)\)",
                  open(os.path.join(out, name), errors="replace").read())
    rows.setdefault((m.group(2), m.group(3)), []).append(
        (int(m.group(1)), (float(v.group(1)), float(v.group(2))) if v else None))
for col, what in ((0, "mean"), (1, "median")):
    med = {}
    print("img/s per rank: rank 0's %s over the timed iterations, per round; median over rounds" % what)
    for mode in modes:
        for impl in impls:
            runs = sorted(rows.get((mode, impl), []))
            good = [v[col] for _, v in runs if v is not None]
            if good:
                med[(mode, impl)] = statistics.median(good)
            per = "  ".join("r%d=%s" % (r, "%.1f" % v[col] if v is not None else "FAILED") for r, v in runs)
            print("  %-5s %-11s %s  median=%s" % (mode, impl, per or "(not run)",
                                                 "%.1f" % med[(mode, impl)] if good else "?"))
    print("  ratios of those medians (hvdd / other):")
    for mode in modes:
        h = med.get((mode, "hvdd"))
        for impl in impls:
            if impl != "hvdd":
                o = med.get((mode, impl))
                print("  %-5s hvdd/%-11s %s" % (mode, impl, "%.3f" % (h / o) if h and o else "?"))
    print()
EOF
}
if [ "${SUMMARY_ONLY:-0}" = 1 ]; then # only (re)write summary.txt of an existing OUT
  [ -d "$OUT" ] || die "SUMMARY_ONLY=1 needs OUT=<an existing results directory>"
  summarize
  exit 0
fi

HVD_TF_PY="$VENV/bin/python"
[ -x "$VENV/bin/horovodrun" ] || die "no horovodrun in $VENV: run bench/horovod/setup_tf.sh first"
[ -x "$HVDD_PYTHON" ] || die "no python at $HVDD_PYTHON (HVDD_PYTHON)"
export TF_CPP_MIN_LOG_LEVEL="${TF_CPP_MIN_LOG_LEVEL:-2}"
"$HVDD_PYTHON" -c 'import hvdd.tensorflow' || die "$HVDD_PYTHON cannot import hvdd.tensorflow"
if [ ! -x "$HVDD_BIN" ]; then
  echo "[horovod-tf-bench] building $HVDD_BIN"
  (cd "$REPO" && go build -o "$HVDD_BIN" ./cmd/hvdd) || die "go build ./cmd/hvdd failed"
fi

mkdir -p "$OUT"
SYN="$REPO/examples/tensorflow2_synthetic_benchmark.py"
TMP="$(mktemp -d /tmp/hvdd-vs-horovod-tf.XXXXXX)"
trap 'rm -rf "$TMP"' EXIT

# MultiWorkerMirroredStrategy launcher: N local workers, free ports, TF_CONFIG,
# output lines tagged [i] like horovodrun/hvdd run; fails fast.
cat >"$TMP/mwms_launch.py" <<'EOF'
import json, os, socket, subprocess, sys, threading, time
n, cmd = int(sys.argv[1]), sys.argv[2:]
socks = []
for _ in range(n):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    socks.append(s)
workers = ["127.0.0.1:%d" % s.getsockname()[1] for s in socks]
for s in socks:
    s.close()
print("[mwms-launch] workers: %s" % " ".join(workers), flush=True)
def pump(i, name, src, dst):
    for line in iter(src.readline, b""):
        dst.write(b"[%d]<%s>:" % (i, name.encode()) + line)
        dst.flush()
procs, pumps = [], []
for i in range(n):
    cfg = {"cluster": {"worker": workers}, "task": {"type": "worker", "index": i}}
    p = subprocess.Popen(cmd, env=dict(os.environ, TF_CONFIG=json.dumps(cfg)),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    procs.append(p)
    for name, src, dst in (("stdout", p.stdout, sys.stdout.buffer), ("stderr", p.stderr, sys.stderr.buffer)):
        t = threading.Thread(target=pump, args=(i, name, src, dst), daemon=True)
        t.start()
        pumps.append(t)
rc = 0
try:
    while any(p.poll() is None for p in procs):
        bad = [p.returncode for p in procs if p.returncode not in (None, 0)]
        if bad:
            rc = bad[0]
            break
        time.sleep(0.2)
finally:
    for p in procs:
        if p.poll() is None:
            p.terminate()
    for p in procs:
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
    for t in pumps:
        t.join(5)
rc = rc or next((p.returncode for p in procs if p.returncode), 0)
sys.exit(rc if rc > 0 else 128 - rc if rc < 0 else 0)
EOF

ver() { "$1" -c 'import tensorflow as tf, keras, numpy, platform
print("python %s, tensorflow %s, keras %s, numpy %s" % (platform.python_version(), tf.__version__, keras.__version__, numpy.__version__))' 2>/dev/null || echo '?'; }
{
  echo "date_utc: $(date -u +%FT%TZ)"
  echo "repo_head: $(git -C "$REPO" rev-parse HEAD 2>/dev/null || echo '?')"
  echo "repo_dirty_files: $(git -C "$REPO" status --porcelain 2>/dev/null | wc -l)"
  echo "example: $SYN sha256=$(sha256sum "$SYN" | cut -c1-16) ($(git -C "$REPO" status --porcelain -- "$SYN" | grep -q . && echo modified || echo as committed))"
  echo "hvdd_bin: $HVDD_BIN sha256=$(sha256sum "$HVDD_BIN" | cut -c1-16)"
  echo "hvdd_python: $HVDD_PYTHON (hvdd.tensorflow from $("$HVDD_PYTHON" -c 'import os, hvdd; print(os.path.dirname(hvdd.__file__))' 2>/dev/null)); $(ver "$HVDD_PYTHON")"
  echo "horovod_tf_venv: $VENV (horovod $("$HVD_TF_PY" -c 'import horovod; print(horovod.__version__)' 2>/dev/null)); $(ver "$HVD_TF_PY")"
  echo "machine: $(nproc) cpus, $(uname -srm), loadavg $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "rounds: $ROUNDS; impls: $IMPLS; modes: $MODES; BENCH_ARGS: $BENCH_ARGS"
} | tee "$OUT/meta.txt"

declare -A FAILED=()
# run NAME CMD...: runs from the repo root, output to $OUT/NAME.log; a failure is recorded, not fatal.
run() {
  local name="$1"; shift
  echo "[horovod-tf-bench] $name: $*" | tee -a "$OUT/commands.txt"
  local t0=$SECONDS load0 rc=0
  load0="$(cut -d' ' -f1 /proc/loadavg)"
  (cd "$REPO" && timeout "$RUN_TIMEOUT" "$@") >"$OUT/$name.log" 2>&1 || rc=$?
  if [ "$rc" != 0 ]; then
    tail -n 15 "$OUT/$name.log" >&2
    echo "[horovod-tf-bench]   FAILED (exit $rc) after $((SECONDS - t0)) s; log: $name.log" | tee -a "$OUT/commands.txt"
    return 1
  fi
  echo "[horovod-tf-bench]   done in $((SECONDS - t0)) s; 1-min loadavg before $load0, after $(cut -d' ' -f1 /proc/loadavg)" \
    | tee -a "$OUT/commands.txt"
}

# impl_cmd IMPL ARGS...: set CMD to the job's command line.
impl_cmd() {
  local impl="$1"; shift
  case "$impl" in
    horovod) CMD=(env -u HOROVOD_CYCLE_TIME "$VENV/bin/horovodrun" --gloo -np 2 -H localhost:2 "$HVD_TF_PY" "$SYN" --impl horovod "$@") ;;
    hvdd) # a private daemon for the job, on a temporary socket; hvdd reads HOROVOD_CYCLE_TIME too
      CMD=(env -u HOROVOD_CYCLE_TIME "$HVDD_BIN" run -np 2 --socket "$TMP/hvdd.sock" -- "$HVDD_PYTHON" "$SYN" --impl hvdd "$@") ;;
    mwms) CMD=("$HVDD_PYTHON" "$TMP/mwms_launch.py" 2 "$HVDD_PYTHON" "$SYN" --impl mwms "$@") ;;
    mwms-tf215) CMD=("$HVD_TF_PY" "$TMP/mwms_launch.py" 2 "$HVD_TF_PY" "$SYN" --impl mwms "$@") ;;
    *) die "unknown implementation $impl" ;;
  esac
}

read -r -a impls <<<"$IMPLS"
read -r -a bench_args <<<"$BENCH_ARGS"
n=${#impls[@]}
for r in $(seq 1 "$ROUNDS"); do
  for mode in $MODES; do
    margs=("${bench_args[@]}")
    [ "$mode" = fit ] && margs+=(--fit)
    for k in $(seq 0 $((n - 1))); do
      impl="${impls[$(((k + r - 1) % n))]}"
      name="r${r}_${mode}_${impl}"
      if [ -n "${FAILED[${mode}_$impl]:-}" ]; then
        echo "[horovod-tf-bench] $name: skipped (failed in round ${FAILED[${mode}_$impl]})" | tee -a "$OUT/commands.txt"
        continue
      fi
      impl_cmd "$impl" "${margs[@]}"
      run "$name" "${CMD[@]}" || FAILED[${mode}_$impl]=$r
    done
  done
done

summarize
echo "[horovod-tf-bench] raw logs: $OUT"
