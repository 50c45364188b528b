#!/usr/bin/env bash
# Checks, on a machine without GPU, the scripts that run on a lent GPU
# machine (scripts/gpu-bench.sh, scripts/gpu-check.sh's kill-mid-allreduce
# step, their python helpers in clients/python/tests/gpu), since device time
# there is too short to debug them:
#
#   syntax     bash -n and shellcheck (where installed) of both scripts
#   usage      --help, a bad argument (exit status 2)
#   dry-run    every step's command printed, the MPS block included (with a
#              stand-in nvidia-cuda-mps-control on PATH), nothing run
#   cpu-check  gpu-bench.sh --cpu-check --quick --no-mps: each step on CPU
#              tensors or gpu/fake, its raw figures and summary.md's rows;
#              the steps that need CUDA SKIP with the reason
#   mps        --cpu-check --only 'mps$' with the stand-in: MPS started
#              before the steps, used, stopped ("quit") at the end
#   deadline   --deadline 25: the steps that no longer fit SKIP as out of
#              time; summary.md written all the same
#   sigterm    SIGTERM to the run's process group in the MPS block: exit
#              status 143, MPS stopped, summary.md written, nothing left
#   summary    bench_summary.py on made-up figures: ratios, PASS and FAIL
#   kill       kill_mid_allreduce.py --device fake and --device cpu (the
#              daemon's fake CUDA driver and memfd "device memory"; host
#              tensors): the kill, the survivor's error, the counters, the
#              next job
#
# Usage: scripts/gpu_bench_test.sh
# Environment: HVDD_BIN (default: go build into a temporary directory, else
# bin/hvdd); GPU_BENCH_PYTHON, a python3 with torch (default .venv-torch's,
# else python3).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
root=$PWD
case "${1:-}" in
  -h|--help) sed -n '2,28s/^# \{0,1\}//p' "$0"; exit 0 ;;
esac

t=$(mktemp -d /tmp/gpu-bench-test.XXXXXX) || exit 1
trap 'rm -rf "$t"' EXIT
fails=0
ok() { echo "ok   $*"; }
bad() { echo "FAIL $*"; fails=$((fails + 1)); }
# status GOT WANT WHAT [FILE]: an exit status; FILE's tail shown when wrong.
status() {
  if [ "$1" -eq "$2" ]; then
    ok "$3: exit status $2"
  else
    bad "$3: exit status $1, want $2"
    [ -z "${4:-}" ] || tail -40 "$4"
  fi
}
# expect FILE REGEX WHAT: FILE has a line matching REGEX (grep -E).
expect() {
  if grep -qE -- "$2" "$1"; then ok "$3"; else bad "$3: no line matching '$2' in $1"; fi
}
# expect_not FILE REGEX WHAT
expect_not() {
  if grep -qE -- "$2" "$1"; then bad "$3: '$2' in $1: $(grep -E -- "$2" "$1" | head -3)"; else ok "$3"; fi
}

if [ -n "${HVDD_BIN:-}" ]; then
  hvdd=$HVDD_BIN
elif command -v go >/dev/null && go build -o "$t/hvdd" ./cmd/hvdd; then
  hvdd=$t/hvdd
else
  hvdd=$root/bin/hvdd
fi
[ -x "$hvdd" ] || { echo "no hvdd binary ($hvdd): set HVDD_BIN or install Go" >&2; exit 1; }
py=${GPU_BENCH_PYTHON:-}
[ -n "$py" ] || { [ -x .venv-torch/bin/python ] && py=$root/.venv-torch/bin/python; } || py=python3
"$py" -c 'import torch' 2>/dev/null || { echo "$py has no torch: set GPU_BENCH_PYTHON" >&2; exit 1; }
cuda=$("$py" -c 'import torch; print(int(torch.cuda.is_available()))')
export HVDD_BIN=$hvdd GPU_BENCH_PYTHON=$py
echo "hvdd: $hvdd; python: $py (CUDA: $cuda)"

# A stand-in for nvidia-cuda-mps-control: -d logs a start; a command read
# from stdin is logged, get_server_list answers a made-up server.
mkdir -p "$t/stub"
cat > "$t/stub/nvidia-cuda-mps-control" <<'EOF'
#!/bin/sh
log=${CUDA_MPS_LOG_DIRECTORY:?}/control.log
case "${1:-}" in
  -d) echo "stub: started, pipes $CUDA_MPS_PIPE_DIRECTORY" >> "$log"; exit 0 ;;
esac
read -r cmd
echo "stub: $cmd" >> "$log"
[ "$cmd" != get_server_list ] || echo 4242
EOF
chmod +x "$t/stub/nvidia-cuda-mps-control"

echo "== syntax"
for s in scripts/gpu-bench.sh scripts/gpu-check.sh scripts/gpu_bench_test.sh; do
  if bash -n "$s"; then ok "bash -n $s"; else bad "bash -n $s"; fi
  if command -v shellcheck >/dev/null; then
    if shellcheck "$s"; then ok "shellcheck $s"; else bad "shellcheck $s"; fi
  fi
done
for f in peer_bench train_resnet kill_mid_allreduce bench_summary bench_latency; do
  if python3 -m py_compile "clients/python/tests/gpu/$f.py"; then ok "py_compile $f.py"; else bad "py_compile $f.py"; fi
done
for f in peer_bench train_resnet kill_mid_allreduce bench_summary; do
  # --help without torch: python3 here may have none.
  if python3 "clients/python/tests/gpu/$f.py" --help > "$t/help" 2>&1; then ok "$f.py --help"; else bad "$f.py --help: $(cat "$t/help")"; fi
done

echo "== usage"
scripts/gpu-bench.sh --help > "$t/help" 2>&1 && expect "$t/help" '^Usage: scripts/gpu-bench.sh' "--help"
expect "$t/help" 'run\(command="scripts/gpu-bench.sh", carry=\["bin"\]' "--help names the device tool's command"
scripts/gpu-bench.sh --bogus > /dev/null 2>&1
status $? 2 "bad argument"
scripts/gpu-bench.sh --deadline soon > /dev/null 2>&1
status $? 2 "bad --deadline"

echo "== dry-run"
PATH=$t/stub:$PATH scripts/gpu-bench.sh --dry-run --out "$t/dry" > "$t/dry.out" 2>&1
status $? 0 dry-run "$t/dry.out"
for s in copy-B nccl-world1 hvdd-bench-np1 hvdd-bench-np2 hvdd-bench-np4 latency-np1 latency-np2 \
  train-hvdd train-noallreduce train-ddp-gloo gloo-np2 gloo-np4 mps-start latency-np2-mps hvdd-bench-np2-mps \
  train-hvdd-mps train-noallreduce-mps train-ddp-gloo-mps mps-stop; do
  expect "$t/dry/steps.txt" "^DRY +$s " "dry-run lists $s"
done
expect "$t/dry/steps.txt" '^DRY +hvdd-bench-np2 .*--device cuda --json --min-bytes 4 --max-bytes 256M' "dry-run: hvdd bench on cuda, 4 B .. 256 MiB"
expect "$t/dry/steps.txt" '^DRY +train-ddp-gloo-mps .*run -np 2 .*--mode ddp-gloo --device cuda' "dry-run: ddp-gloo under hvdd run -np 2"
if [ -e "$t/dry/B.json" ]; then bad "dry-run wrote B.json"; else ok "dry-run ran nothing"; fi
expect "$t/dry/summary.md" '^\| measure \| hvdd \| peer/limit \| ratio \| target \| result \|' "dry-run: summary.md has the table"

echo "== cpu-check (--quick --no-mps)"
scripts/gpu-bench.sh --cpu-check --quick --no-mps --out "$t/cpu" > "$t/cpu.out" 2>&1
status $? 0 cpu-check "$t/cpu/bench.log"
for s in copy-B hvdd-bench-np1 hvdd-bench-np2 hvdd-bench-np4 train-hvdd train-noallreduce train-ddp-gloo gloo-np2 gloo-np4; do
  expect "$t/cpu/steps.txt" "^PASS +$s " "cpu-check: $s passes"
done
if [ "$cuda" = 0 ]; then
  for s in nccl-world1 latency-np1 latency-np2; do
    expect "$t/cpu/steps.txt" "^SKIP +$s .*no CUDA device" "cpu-check: $s SKIPs, no CUDA device"
  done
fi
expect "$t/cpu/steps.txt" '^SKIP +mps +--no-mps' "cpu-check: --no-mps"
expect "$t/cpu/hvdd-bench-np2.jsonl" '"bytes":4,' "hvdd-bench-np2.jsonl: the 4 B row"
expect "$t/cpu/hvdd-bench-np2.jsonl" '"bytes":268435456,.*"busbw_gbps"' "hvdd-bench-np2.jsonl: the 256 MiB row"
expect "$t/cpu/hvdd-bench-np4.jsonl" '"bytes":67108864,' "hvdd-bench-np4.jsonl: the 64 MiB row"
for f in B.json train-hvdd.json train-noallreduce.json train-ddp-gloo.json gloo-np2.json gloo-np4.json; do
  if "$py" -c 'import json, sys; json.load(open(sys.argv[1]))' "$t/cpu/$f" 2>/dev/null; then ok "$f is JSON"; else bad "$f missing or not JSON"; fi
done
expect "$t/cpu/summary.md" '^\| 4 B allreduce, hvdd bench --np 2 --device cuda \(median µs\) \| [0-9.]+ µs \| 30.0 µs \| [0-9.]+ \| ≤ 30 µs \| (PASS|FAIL) \|' "summary: the 4 B row judged"
expect "$t/cpu/summary.md" '^\| 256 MiB allreduce busbw, hvdd bench --np 4 vs .*\| [0-9.]+ GB/s \| [0-9.]+ GB/s \| [0-9.]+ \| ≥ 0.8 \| (PASS|FAIL) \|' "summary: the np 4 busbw row judged against B"
expect "$t/cpu/summary.md" '^\| training, .*2 ranks: hvdd vs the same without allreduce .*\| (PASS|FAIL) \|' "summary: the training row judged"
expect "$t/cpu/summary.md" '^## Steps' "summary: the steps under the table"
expect "$t/cpu/summary.md" '^totals: ' "summary: the steps' totals"
expect "$t/cpu.out" '^\| measure ' "the table printed at the end"

echo "== mps (stand-in nvidia-cuda-mps-control, --only 'mps\$')"
PATH=$t/stub:$PATH scripts/gpu-bench.sh --cpu-check --quick --only 'mps$' --out "$t/mps" > "$t/mps.out" 2>&1
status $? 0 mps "$t/mps.out"
expect "$t/mps/steps.txt" '^SKIP +copy-B +not matched by --only' "--only skips the others"
expect "$t/mps/steps.txt" '^PASS +mps-start ' "mps-start"
expect "$t/mps/steps.txt" '^PASS +hvdd-bench-np2-mps ' "hvdd-bench-np2-mps"
expect "$t/mps/steps.txt" '^PASS +mps-used +MPS server\(s\) 4242' "mps-used asks the control daemon"
expect "$t/mps/steps.txt" '^PASS +train-hvdd-mps ' "train-hvdd-mps"
expect "$t/mps/steps.txt" '^PASS +mps-stop ' "mps-stop"
expect "$t/mps/mps-log/control.log" '^stub: started, pipes /tmp/gpu-bench\.' "MPS started with its pipes under /tmp"
expect "$t/mps/mps-log/control.log" '^stub: quit$' "MPS stopped"
if [ "$(grep -c '^stub: quit$' "$t/mps/mps-log/control.log")" = 1 ]; then ok "MPS stopped once"; else bad "MPS stopped $(grep -c '^stub: quit$' "$t/mps/mps-log/control.log") times"; fi
expect "$t/mps/bench.log" "CUDA_MPS_PIPE_DIRECTORY=/tmp/gpu-bench" "bench.log: MPS's environment"
expect "$t/mps/train-hvdd-mps.json" '"mps": true' "the MPS steps' processes saw CUDA_MPS_PIPE_DIRECTORY"

echo "== deadline"
scripts/gpu-bench.sh --cpu-check --quick --no-mps --deadline 25 --out "$t/dl" > "$t/dl.out" 2>&1
status $? 0 deadline "$t/dl.out"
expect "$t/dl/steps.txt" '^SKIP +hvdd-bench-np2 +out of time' "deadline: a later step SKIPs as out of time"
expect "$t/dl/steps.txt" '^SKIP +train-hvdd +out of time' "deadline: training SKIPs as out of time"
expect "$t/dl/summary.md" '^\| measure ' "deadline: summary.md written"

echo "== sigterm"
PATH=$t/stub:$PATH setsid scripts/gpu-bench.sh --cpu-check --quick --only 'train-hvdd-mps' --out "$t/term" > "$t/term.out" 2>&1 &
pid=$!
for _ in $(seq 300); do
  grep -qE '^PASS +mps-start' "$t/term/steps.txt" 2>/dev/null && break
  sleep 0.1
done
sleep 2 # into train-hvdd-mps
kill -TERM -- -"$pid" 2>/dev/null
wait "$pid"
status $? 143 sigterm "$t/term.out"
expect "$t/term/mps-log/control.log" '^stub: quit$' "sigterm: MPS stopped on the way out"
expect "$t/term/summary.md" '^\| measure ' "sigterm: summary.md written"
if pgrep -g "$pid" > /dev/null 2>&1; then bad "sigterm: processes left in the group: $(pgrep -g "$pid" -a)"; else ok "sigterm: nothing left running"; fi

echo "== summary (made-up figures)"
d=$t/made
mkdir -p "$d"
echo '{"B_GBps": 3000, "bytes": 1073741824, "device": "H200"}' > "$d/B.json"
echo '{"small_median_us": 20, "large_algbw_GBps": 1000}' > "$d/nccl1.json"
echo '{"results": {"hvdd (CUDA IPC)": {"median_us": 40}, "torch.distributed nccl": {"median_us": 21}}}' > "$d/latency-np1.json"
echo '{"results": {"hvdd (CUDA IPC)": {"median_us": 61}}}' > "$d/latency-np2.json"
printf '%s\n' '{"op":"allreduce","bytes":4,"ranks":2,"median_us":25}' \
  '{"op":"allreduce","bytes":268435456,"ranks":2,"median_us":900,"busbw_gbps":600}' > "$d/hvdd-bench-np2.jsonl"
printf '%s\n' '# a comment line' '{"op":"allreduce","bytes":268435456,"ranks":4,"busbw_gbps":244}' > "$d/hvdd-bench-np4.jsonl"
echo '{"total_img_per_s": 900, "model": "torchvision 0.20 resnet50 (weights=None)", "resnet50": true}' > "$d/train-hvdd.json"
echo '{"total_img_per_s": 1000, "resnet50": true}' > "$d/train-noallreduce.json"
echo '{"total_img_per_s": 950, "resnet50": true}' > "$d/train-ddp-gloo.json"
"$py" clients/python/tests/gpu/bench_summary.py "$d" > /dev/null
s=$d/summary.md
expect "$s" '^\| 4 KiB allreduce_, hvdd.torch 1 rank vs torch NCCL world 1 \(median µs\) \| 40.0 µs \| 20.0 µs \| 2.00 \| ≤ 2x \| PASS \|' "summary: 1 rank at 2.00x passes"
expect "$s" '^\| 4 KiB allreduce_, hvdd.torch 2 ranks .*\| 61.0 µs \| 20.0 µs \| 3.05 \| ≤ 3x \| FAIL \|' "summary: 2 ranks at 3.05x fails"
expect "$s" '^\| 4 B allreduce, hvdd bench --np 2 --device cuda \(median µs\) \| 25.0 µs \| 30.0 µs \| 0.83 \| ≤ 30 µs \| PASS \|' "summary: 25 µs passes"
expect "$s" '^\| 256 MiB allreduce busbw, hvdd bench --np 2 vs .*\| 600 GB/s \| 750 GB/s \| 0.80 \| ≥ 0.8 \| PASS \|' "summary: busbw np 2 against B/4"
expect "$s" '^\| 256 MiB allreduce busbw, hvdd bench --np 4 vs .*\| 244 GB/s \| 562 GB/s \| 0.43 \| ≥ 0.8 \| FAIL \|' "summary: busbw np 4 against 3B/16"
expect "$s" '^\| training, ResNet-50, 2 ranks: hvdd vs the same without allreduce .*\| 900 img/s \| 1000 img/s \| 0.90 \| ≥ 0.9 \| PASS \|' "summary: training 0.90 passes"
expect "$s" '^\| training, ResNet-50, 2 ranks: hvdd vs DDP .*\| 0.95 \| > 1 \| FAIL \|' "summary: behind DDP fails"
expect "$s" '^\| 256 MiB allreduce busbw, hvdd bench --np 2 under MPS .*\| — \| 750 GB/s \| — \| ≥ 0.8 \| n/a \|' "summary: a missing figure is n/a"
expect "$s" '^targets: 4 met, 3 missed' "summary: the count of targets"

echo "== kill_mid_allreduce.py"
for dev in fake cpu; do
  PYTHONPATH=$root/clients/python "$py" clients/python/tests/gpu/kill_mid_allreduce.py --device "$dev" --mib 32 \
    --json "$t/kill-$dev.json" > "$t/kill-$dev.out" 2>&1
  status $? 0 "kill ($dev)" "$t/kill-$dev.out"
  expect "$t/kill-$dev.out" '^PASS survivor.s error: hvdd.exceptions.HvddInternalError .*names rank 1: True' "kill ($dev): the survivor's HorovodInternalError names rank 1"
  expect "$t/kill-$dev.out" '^PASS error within limit' "kill ($dev): within 2 s"
  expect "$t/kill-$dev.out" '^PASS next job' "kill ($dev): the next job runs"
done
expect "$t/kill-fake.out" '^PASS mappings released \(victim job\): opens ([0-9]+) closes \1 ' "kill (fake): opens = closes after the victim job"
expect "$t/kill-fake.out" '^PASS mappings released \(next job\)' "kill (fake): and after the next"
expect "$t/kill-cpu.out" '^SKIP mappings released \(victim job\): the daemon has no hvdd_gpu_device_ops_total' "kill (cpu): no counters, said so"
if [ "$cuda" = 0 ]; then
  PYTHONPATH=$root/clients/python "$py" clients/python/tests/gpu/kill_mid_allreduce.py > "$t/kill-cuda.out" 2>&1
  status $? 3 "kill (cuda, none here)" "$t/kill-cuda.out"
  expect "$t/kill-cuda.out" 'no CUDA device' "kill (cuda, none here): says why"
fi

echo
if [ "$fails" -eq 0 ]; then echo "gpu_bench_test: all passed"; else echo "gpu_bench_test: $fails failed"; fi
[ "$fails" -eq 0 ]
