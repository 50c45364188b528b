#!/usr/bin/env bash
# torch.distributed on backend hvdd against gloo in the same run (issue 32's
# benchmark): bench/torchdist_worker.py (a 4-byte all_reduce, a 64 MiB
# all_reduce, DDP training of the synthetic SmallResNet) under hvdd run, once
# per backend per round, the backends alternated; then the medians over the
# rounds and hvdd's speedup over gloo (>1: hvdd ahead).
#
#   --nodes 1   2 ranks on this machine (default)
#   --nodes 2   2 "nodes" x 2 ranks in network namespaces joined by a veth
#               pair limited to --rate (default 1gbit) by tc tbf (needs root)
#
# Usage: bench/torchdist.sh [--nodes 1|2] [--rate 1gbit] [--rounds 3] [--what lat,bw,ddp]
# Environment: PYTHON (default .venv-torch/bin/python: torch >= 2.15).
set -euo pipefail
cd "$(dirname "$0")/.."
NODES=1; ROUNDS=3; RATE=1gbit; WHAT=lat,bw,ddp; extra=()
while [ $# -gt 0 ]; do
  case "$1" in
    --nodes) NODES=$2; shift ;;
    --rounds) ROUNDS=$2; shift ;;
    --rate) RATE=$2; shift ;;
    --what) WHAT=$2; shift ;;
    -h | --help) sed -n '2,14s/^# \{0,1\}//p' "$0"; exit 0 ;;
    *) echo "bench/torchdist.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done
PY=${PYTHON:-$PWD/.venv-torch/bin/python}
[ -x "$PY" ] || { echo "bench/torchdist.sh: no $PY: run scripts/setup-torch.sh (or set PYTHON)" >&2; exit 1; }
go build -o bin/hvdd ./cmd/hvdd
OUT="bench/results/torchdist-${NODES}n-$(date +%Y-%m-%d_%H%M%S)"; mkdir -p "$OUT"
case $NODES in
  1) launch=(bin/hvdd run -np 2 --) ;;
  2)
    [ "$(id -u)" -eq 0 ] || { echo "bench/torchdist.sh: --nodes 2 needs root (network namespaces)" >&2; exit 1; }
    NS=hvt; A=10.213.251.1; B=10.213.251.2; W=$(mktemp -d); TBF=1
    trap netns_cleanup EXIT
    # shellcheck source=bench/netns.sh
    . bench/netns.sh
    # One name for the link in both namespaces, for gloo's GLOO_SOCKET_IFNAME.
    for n in "${NS}0" "${NS}1"; do
      ip -n "$n" link set "${n}i" down; ip -n "$n" link set "${n}i" name hvtlink; ip -n "$n" link set hvtlink up
    done
    extra=(--gloo-ifname hvtlink)
    launch=(bin/hvdd run -np 4 -H "$A:2,$B:2" --agent "$W/agent" --) ;;
  *) echo "bench/torchdist.sh: --nodes must be 1 or 2" >&2; exit 2 ;;
esac
echo "torchdist: $NODES node(s)$([ "$NODES" = 2 ] && echo ", link $RATE"), $ROUNDS rounds, $("$PY" -c 'import torch; print("torch", torch.__version__)'); output in $OUT" | tee "$OUT/log"
for r in $(seq 1 "$ROUNDS"); do
  for b in gloo hvdd; do
    echo "== round $r: $b" | tee -a "$OUT/log"
    "${launch[@]}" "$PY" "$PWD/bench/torchdist_worker.py" --backend $b --what "$WHAT" "${extra[@]}" 2>&1 | tee -a "$OUT/log" | grep 'RESULT\|rror' || true
  done
done
"$PY" - "$OUT/log" <<'PY' | tee "$OUT/summary"
import json, statistics, sys
res = {}
for line in open(sys.argv[1]):
    i = line.find("RESULT {")  # hvdd run prefixes a rank's lines with "[0]<stdout>:"
    if i >= 0:
        o = json.loads(line[i + 7 :])
        res.setdefault(o["figure"], {}).setdefault(o["backend"], []).append(o)
key = {"allreduce_4B": ("median_us", "us", False), "allreduce_64MiB": ("median_us", "us", False), "ddp_img_s": ("img_s", "img/s", True)}
print(f"{'figure':16} {'gloo':>16} {'hvdd':>16}  hvdd speedup (medians over rounds; runs)")
for fig, (k, unit, higher) in key.items():
    if fig not in res:
        continue
    g = statistics.median(o[k] for o in res[fig].get("gloo", [{k: float("nan")}]))
    h = statistics.median(o[k] for o in res[fig].get("hvdd", [{k: float("nan")}]))
    sp = h / g if higher else g / h
    extra = ""
    if fig == "allreduce_64MiB":
        extra = f"  busbw gloo {statistics.median(o['busbw_gbps'] for o in res[fig]['gloo']):.2f} hvdd {statistics.median(o['busbw_gbps'] for o in res[fig]['hvdd']):.2f} GB/s"
    print(f"{fig:16} {g:10.1f} {unit:5} {h:10.1f} {unit:5}  {sp:5.2f}x ({len(res[fig].get('gloo', []))}, {len(res[fig].get('hvdd', []))}){extra}")
PY
