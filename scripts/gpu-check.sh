#!/usr/bin/env bash
# scripts/gpu-check.sh: runs hvdd's GPU path on a real NVIDIA GPU (issue 17),
# on a machine with no Go and no network, from a copy of the working tree
# with bin/ built beforehand by scripts/gpu-build.sh. Steps, in order:
#
#   env        nvidia-smi, the driver, python3's torch (recorded, never fails)
#   gpus       bin/hvdd gpus and --json, whose GPUs (UUIDs) must be the ones
#              nvidia-smi -L lists; and hvdd serve's start-up log must list
#              them (on a machine without GPU: say CPU-only)
#   test:*     each test binary of bin/gpu-tests.txt (gpu/nvml against the
#              real NVML, gpu/cuda's conformance suite against the real
#              driver, and those other parts added), run in its package
#              directory with -test.v
#   test:nccl-engine.test
#              the device engine's conformance suite (backends/devicetest)
#              on backends/nccl over the real driver and libnccl
#              (TestConformanceCUDA): one rank per GPU, so world sizes
#              beyond the GPU count skip and say so
#   nvml-sample  gpu/nvml's Sampler on the real NVML (bin/nvml.test -test.run
#              TestSampleHere, its figures written to nvml-sample.json), then
#   nvml-sample-vs-nvidia-smi  the same GPUs (UUID and index), memory total,
#              temperature and power as nvidia-smi --query-gpu reads them
#   torch-npN  an end-to-end torch CUDA job through the daemon, N = 2 and 4
#              local ranks sharing the one GPU:
#              bin/hvdd run -np N -- python3 clients/python/tests/gpu/torch_cuda_job.py
#              ($HVDD_GPU_JOB overrides the script)
#   pytest-gpu python3 -m pytest clients/python/tests/gpu (its test_*.py)
#   kill-mid-allreduce
#              a rank SIGKILLed in the middle of device allreduces (issue
#              26): 2 ranks allreduce 256 MiB tensors on cuda:0; rank 1 dies
#              with ops in the daemon and its IPC mappings open; rank 0 must
#              get HorovodInternalError naming rank 1 within 2 s; the daemon
#              must close every IPC handle it opened (its
#              hvdd_gpu_device_ops_total open = close) and the dead rank's
#              memory must leave the GPU (nvidia-smi, where it lists the
#              pid); then a new job on the same daemon and GPU must get
#              right results: python3 clients/python/tests/gpu/kill_mid_allreduce.py
#              (it starts the daemon and both jobs' ranks itself: under
#              hvdd run, a dead rank's SIGTERM to the others would stop the
#              survivor before it could show its error)
#   bench-*    bin/hvdd bench --np N --device cuda: N = 2 and 4 with --check,
#              then N = 2 timed
#
# A step whose inputs are absent (a test binary not built, the job script not
# written yet, a bench without --device) is SKIPPED and says why; nothing
# absent counts as passed. Every step has a time limit, and the whole run a
# deadline (--deadline, default 480 s, inside the device tool's 10 minutes);
# steps that no longer fit are skipped as out of time.
#
# Output, in $OUT (the device tool's folder; else ./gpu-check-out, or --out):
#   summary.txt  one line per step, PASS / FAIL / SKIP and why, then totals
#   check.log    every step's command and full output
#   gpus.json    hvdd gpus --json
#   nvml-sample.json  the NVML sampler's figures per GPU (nvml-sample)
#   kill-mid-allreduce.json  that step's checks and figures
# (five files, written as the run goes: a run cut short still returns them.)
# Exit status: 0 if no step failed (skips allowed), 1 if one did, 2 on usage.
#
# Usage: scripts/gpu-check.sh [--out DIR] [--deadline SECONDS] [--help]
# Here first: scripts/gpu-build.sh. There, through the device tool:
#   run(command="scripts/gpu-check.sh", carry=["bin"], timeout_s=600)
set -uo pipefail

out=${OUT:-./gpu-check-out}
deadline=480
while [ $# -gt 0 ]; do
  case $1 in
    -h|--help) awk 'NR > 1 && /^set -uo pipefail/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0"; exit 0 ;;
    --out) out=${2:?--out needs a directory}; shift 2 ;;
    --deadline) deadline=${2:?--deadline needs seconds}; shift 2 ;;
    *) echo "scripts/gpu-check.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
case $deadline in '' | *[!0-9]*) echo "scripts/gpu-check.sh: --deadline must be whole seconds" >&2; exit 2 ;; esac

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root" || exit 1
mkdir -p "$out" || exit 1
out=$(cd "$out" && pwd)
summary=$out/summary.txt
log=$out/check.log
: > "$summary"
: > "$log"
hvdd=$root/bin/hvdd
export PYTHONPATH="$root/clients/python${PYTHONPATH:+:$PYTHONPATH}"
# gpu-build.sh's pure-Python wheels, only for what python3 lacks: ahead of
# site-packages they would shadow an installed (and maybe compiled) one.
for m in protobuf:google.protobuf pytest:pytest; do
  if ! python3 -c "import ${m#*:}" 2>/dev/null && [ -d "$root/bin/pylib/${m%%:*}" ]; then
    PYTHONPATH="$PYTHONPATH:$root/bin/pylib/${m%%:*}"
    echo "python3 lacks ${m#*:}: using bin/pylib/${m%%:*}"
  fi
done
export PYTHONUNBUFFERED=1
export HVDD_BIN=$hvdd # clients/python/tests/conftest.py: use it, build nothing
start=$SECONDS
npass=0 nfail=0 nskip=0

# note STATUS NAME WHY: one line of the summary, echoed (paths in the
# tree written relative to it).
note() {
  printf '%-4s %-22s %s\n' "$1" "$2" "${3//$root\//}" | tee -a "$summary"
  case $1 in PASS) npass=$((npass + 1)) ;; FAIL) nfail=$((nfail + 1)) ;; SKIP) nskip=$((nskip + 1)) ;; esac
}

# step NAME LIMIT DIR CMD...: runs CMD in DIR under a time limit (LIMIT
# seconds, or what is left before the deadline), its output to check.log.
step() {
  local name=$1 limit=$2 dir=$3 left rc t0
  shift 3
  left=$((deadline - (SECONDS - start)))
  if [ "$left" -lt 20 ]; then
    note SKIP "$name" "out of time (--deadline $deadline s): $*"
    return 0
  fi
  [ "$limit" -le "$left" ] || limit=$left
  {
    echo
    echo "== $name (in ${dir#"$root"/}, limit ${limit}s): $*"
  } >> "$log"
  t0=$SECONDS
  (cd "$dir" && timeout -k 10 "$limit" "$@") > "$out/.step" 2>&1
  rc=$?
  cat "$out/.step" >> "$log"
  case $rc in
    0) if grep -q '^testing: warning: no tests to run' "$out/.step"; then
         note SKIP "$name" "no test matched: $*"
       else
         note PASS "$name" "$(( SECONDS - t0 ))s: $*"
       fi ;;
    124 | 137) note FAIL "$name" "timed out after ${limit}s: $*" ;;
    *) note FAIL "$name" "exit status $rc after $(( SECONDS - t0 ))s: $*" ;;
  esac
  echo "== $name: exit status $rc" >> "$log"
}

echo "hvdd GPU check, $(date -u '+%Y-%m-%d %H:%M:%S UTC'), $(uname -n)" | tee -a "$summary"

# env: what the machine is; recorded, not judged.
{
  echo "== env"
  uname -a
  command -v nvidia-smi >/dev/null && nvidia-smi && nvidia-smi -L && nvidia-smi topo -m
  python3 -c 'import sys, torch; print(sys.executable, "torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available(), torch.cuda.device_count(), "GPUs")'
} >> "$log" 2>&1
gpu_name=$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1)
echo "device: ${gpu_name:-unknown (no nvidia-smi)}" | tee -a "$summary"

if [ ! -x "$hvdd" ]; then
  note FAIL hvdd "no $hvdd: run scripts/gpu-build.sh where Go is, and carry bin/"
  echo "totals: $npass passed, $nfail failed, $nskip skipped" | tee -a "$summary"
  exit 1
fi
echo "hvdd: $("$hvdd" version 2>&1)" | tee -a "$summary"

# gpus: hvdd gpus, and its UUIDs against nvidia-smi's.
step gpus 60 "$root" "$hvdd" gpus
"$hvdd" gpus --json > "$out/gpus.json" 2>> "$log"
if command -v nvidia-smi >/dev/null; then
  step gpus-vs-nvidia-smi 60 "$root" python3 -c '
import json, subprocess, sys
r = json.load(open(sys.argv[1]))
smi = sorted(l.split("UUID: ")[1].rstrip(")") for l in subprocess.check_output(["nvidia-smi", "-L"], text=True).splitlines() if "UUID: " in l)
got = sorted(g["uuid"] for g in r["gpus"])
print("nvidia-smi -L:", smi)
print("hvdd gpus:   ", got, "" if r["available"] else r["reason"])
sys.exit(0 if r["available"] and got == smi and smi else 1)
' "$out/gpus.json"
else
  note SKIP gpus-vs-nvidia-smi "no nvidia-smi on this machine"
fi

# serve: the daemon logs the GPUs once at start-up (cmd/hvdd/gpus.go's
# logGPUs): their list where nvidia-smi sees GPUs, else the CPU-only line.
serve_logs_gpus() { # HVDD WANT: start serve, wait for its GPU line, stop it
  local dir p rc=1
  dir=$(mktemp -d)
  "$1" serve --slots 1 --socket "$dir/hvdd.sock" --log-level info > "$dir/log" 2>&1 &
  p=$!
  for _ in $(seq 200); do
    if grep -qE 'msg="NVIDIA GPUs"|CPU-only|GPU discovery failed' "$dir/log"; then break; fi
    sleep 0.1
  done
  kill "$p"
  wait "$p"
  cat "$dir/log"
  grep -qE "$2" "$dir/log" && rc=0
  rm -rf "$dir"
  return "$rc"
}
export -f serve_logs_gpus
if nvidia-smi -L 2>/dev/null | grep -q UUID; then
  step serve-logs-gpus 40 "$root" bash -c 'serve_logs_gpus "$@"' _ "$hvdd" 'msg="NVIDIA GPUs"'
else
  step serve-logs-cpu-only 40 "$root" bash -c 'serve_logs_gpus "$@"' _ "$hvdd" 'CPU-only'
fi

# test binaries, as scripts/gpu-build.sh listed them.
manifest=$root/bin/gpu-tests.txt
if [ ! -f "$manifest" ]; then
  note SKIP "test:*" "no bin/gpu-tests.txt: run scripts/gpu-build.sh"
else
  while read -r bin pkg run; do
    [ -n "$bin" ] || continue
    if [ ! -x "$root/bin/$bin" ]; then
      note SKIP "test:$bin" "bin/$bin is missing (listed in bin/gpu-tests.txt)"
      continue
    fi
    step "test:$bin" 240 "$root/$pkg" "$root/bin/$bin" -test.v -test.count=1 -test.timeout=230s -test.run "$run"
  done < "$manifest"
  for b in gputest-cuda nvml.test nccl-engine.test; do
    grep -q "^$b " "$manifest" || note SKIP "test:$b" "not built: its package had no tests when scripts/gpu-build.sh ran"
  done
fi

# nvml-sample: gpu/nvml's Sampler reads the real GPUs (utilization, memory,
# temperature, power, PCIe, NVLink, ECC, XID events; none lost), then its
# figures are compared with nvidia-smi's.
nvml_vs_smi() { # SAMPLE_JSON: the sampler's figures against nvidia-smi --query-gpu
  python3 -c '
import json, subprocess, sys
samples = json.load(open(sys.argv[1]))
q = "index,uuid,memory.total,temperature.gpu,power.draw"
smi = {}
for line in subprocess.check_output(["nvidia-smi", "--query-gpu=" + q, "--format=csv,noheader,nounits"], text=True).splitlines():
    i, uuid, mem, temp, power = (x.strip() for x in line.split(","))
    smi[uuid] = dict(index=int(i), mem_mib=float(mem), temp=float(temp), power=power)
bad = []
for g in samples:
    n = smi.get(g["uuid"])
    print("sampler GPU %d %s: valid %s, unsupported %s, util %d%%/%d%%, memory %d/%d MiB, %d C, %.1f W, PCIe tx/rx %d/%d B/s, NVLink tx/rx %d/%d B, ECC %d/%d, XIDs %s, lost %s" % (
        g["index"], g["uuid"], g["valid"], g["unsupported"], g["utilization_gpu"], g["utilization_memory"],
        g["memory_used"] >> 20, g["memory_total"] >> 20, g["temperature"], g["power_milliwatts"] / 1000,
        g["pcie_tx_bytes_per_second"], g["pcie_rx_bytes_per_second"], g["nvlink_tx_bytes"], g["nvlink_rx_bytes"],
        g["ecc_corrected"], g["ecc_uncorrected"], g.get("xids", []), g.get("lost")))
    print("nvidia-smi:", n)
    if n is None:
        bad.append("GPU %d: UUID %s not in nvidia-smi" % (g["index"], g["uuid"]))
        continue
    if n["index"] != g["index"]:
        bad.append("GPU %s: index %d, nvidia-smi %d" % (g["uuid"], g["index"], n["index"]))
    if abs(g["memory_total"] / 2**20 - n["mem_mib"]) > 0.01 * n["mem_mib"]:
        bad.append("GPU %d: memory total %d MiB, nvidia-smi %d" % (g["index"], g["memory_total"] >> 20, n["mem_mib"]))
    if abs(g["temperature"] - n["temp"]) > 10:
        bad.append("GPU %d: %d C, nvidia-smi %d C" % (g["index"], g["temperature"], n["temp"]))
    if "power" in g["valid"].split("|") and n["power"].replace(".", "").isdigit():
        w, sw = g["power_milliwatts"] / 1000, float(n["power"])
        if abs(w - sw) > max(50, 0.5 * sw):
            bad.append("GPU %d: %.1f W, nvidia-smi %.1f W" % (g["index"], w, sw))
    if g.get("lost"):
        bad.append("GPU %d lost: %s" % (g["index"], g["lost"]))
if sorted(smi) != sorted(g["uuid"] for g in samples):
    bad.append("GPUs: sampler %s, nvidia-smi %s" % (sorted(g["uuid"] for g in samples), sorted(smi)))
for b in bad:
    print("MISMATCH:", b)
sys.exit(1 if bad else 0)
' "$1"
}
export -f nvml_vs_smi
if [ ! -x "$root/bin/nvml.test" ]; then
  note SKIP nvml-sample "no bin/nvml.test: run scripts/gpu-build.sh"
else
  rm -f "$out/nvml-sample.json"
  step nvml-sample 60 "$root/gpu/nvml" "$root/bin/nvml.test" -test.v -test.count=1 -test.run '^TestSampleHere$' -sample-out "$out/nvml-sample.json"
  # grep without -q reads all of nvidia-smi's output: -q would quit at the
  # first GPU, and a SIGPIPE'd nvidia-smi fail the pipeline (pipefail).
  if ! nvidia-smi -L 2>/dev/null | grep UUID >/dev/null; then
    note SKIP nvml-sample-vs-nvidia-smi "nvidia-smi lists no GPU here"
  else
    step nvml-sample-vs-nvidia-smi 60 "$root" bash -c 'nvml_vs_smi "$@"' _ "$out/nvml-sample.json"
  fi
fi

# torch CUDA jobs through the daemon: 2 and 4 local ranks on the one GPU.
job=${HVDD_GPU_JOB:-clients/python/tests/gpu/torch_cuda_job.py}
if [ ! -f "$root/$job" ]; then
  note SKIP torch-np2 "no $job (the python client's GPU job; not written yet)"
  note SKIP torch-np4 "no $job"
elif ! python3 -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' >> "$log" 2>&1; then
  note FAIL torch-np2 "python3's torch sees no CUDA device"
  note FAIL torch-np4 "python3's torch sees no CUDA device"
else
  for n in 2 4; do
    step "torch-np$n" 150 "$root" "$hvdd" run -np "$n" -- python3 "$root/$job"
  done
fi
if compgen -G "$root/clients/python/tests/gpu/test_*.py" >/dev/null; then
  step pytest-gpu 180 "$root" python3 -m pytest -v -x -p no:cacheprovider clients/python/tests/gpu
else
  note SKIP pytest-gpu "no clients/python/tests/gpu/test_*.py"
fi

# kill-mid-allreduce: a rank dies mid-op; the survivor's error, the
# daemon's IPC handles closed, the next job on the same GPU.
kill_job=clients/python/tests/gpu/kill_mid_allreduce.py
if [ ! -f "$root/$kill_job" ]; then
  note SKIP kill-mid-allreduce "no $kill_job"
elif ! python3 -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' >> "$log" 2>&1; then
  note FAIL kill-mid-allreduce "python3's torch sees no CUDA device"
else
  step kill-mid-allreduce 120 "$root" python3 "$root/$kill_job" --hvdd "$hvdd" --json "$out/kill-mid-allreduce.json"
fi

# hvdd bench on the device.
if "$hvdd" bench --help 2>&1 | grep -q -- '-device'; then
  step bench-check-np2 120 "$root" "$hvdd" bench --np 2 --device cuda --check --max-bytes 64M --iters 5
  step bench-check-np4 120 "$root" "$hvdd" bench --np 4 --device cuda --check --max-bytes 64M --iters 5
  step bench-np2 120 "$root" "$hvdd" bench --np 2 --device cuda --max-bytes 256M
else
  note SKIP "bench-*" "this hvdd bench has no --device flag (not built yet)"
fi

rm -f "$out/.step"
echo "totals: $npass passed, $nfail failed, $nskip skipped in $(( SECONDS - start ))s; details in check.log" | tee -a "$summary"
[ "$nfail" -eq 0 ]
