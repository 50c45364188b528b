#!/usr/bin/env bash
# The Python client's tests, as scripts/test.sh runs them: each test once, in
# two streams that run at the same time (most of these tests wait on the
# processes they start, so two streams keep both cores of a small machine
# busy where one leaves them idle half the time):
#
#   a   the TensorFlow, Keras (their elastic examples too), launcher and
#       elastic-job tests on .venv (Debian's torch, PyPI's TensorFlow and
#       Keras)
#   b   the torch client's own tests (its API, units, elastic state, GPU
#       path on the fake driver, torch.distributed) on .venv-torch (the
#       newest torch from PyPI, what users install), then the GPU
#       machine's scripts checked without a GPU (scripts/gpu_bench_test.sh),
#       then, with HVDD_TEST_CHAOS=1 (as root), the elastic fault
#       campaign's short run (bench/chaos/chaos.py --quick)
#
# Stream b runs in a mount namespace of its own whose /run/hvdd is a private
# tmpfs, when run as root: jobs that start a daemon on the default socket
# (root's /run/hvdd/hvdd.sock) then start their own, not the other stream's.
# Not as root, the streams run one after the other. Stream b's output is
# shown after stream a's, each with its `==` stage lines.
#
# Usage: scripts/test-python.sh [a|b|all]     (default: all)
# Environment: HVDD_BIN (default: bin/hvdd), HVDD_TEST_CHAOS (default 0). The venvs must exist
# (scripts/setup.sh, scripts/setup-torch.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
case "${1:-all}" in
  -h | --help)
    sed -n '2,26s/^# \{0,1\}//p' "$0"
    exit 0
    ;;
  a | b | all) which=${1:-all} ;;
  *)
    echo "scripts/test-python.sh: unknown stream '$1'; use a, b or all (see --help)" >&2
    exit 2
    ;;
esac
export HVDD_BIN="${HVDD_BIN:-$PWD/bin/hvdd}"
t=clients/python/tests
start=$SECONDS
stage() { echo "== $* [$(((SECONDS - start) / 60))m$(((SECONDS - start) % 60))s of the Python tests]"; }
torch_of() { "$1" -c 'import torch; print("torch", torch.__version__)'; }

# Stream b's files (test_torch*.py: the torch client and its
# torch.distributed backend); stream a runs every other file (tests/gpu needs a real
# GPU: scripts/gpu-check.sh runs it on the GPU machine).
torch_tests=($t/test_torch*.py $t/test_units.py $t/test_elastic_units.py
  $t/test_gpu_units.py $t/test_gpu_ipc.py $t/test_gpu_steady.py)

# Each step ends its stream with `|| return 1`: `set -e` does not hold
# inside a function called as `stream_a || a_rc=$?` (run 9 of the test
# command printed "1 failed, 97 passed", then "stream a: passed").
stream_a() {
  stage "stream a: TensorFlow, Keras, launchers, elastic jobs (.venv, Debian's $(torch_of .venv/bin/python))"
  .venv/bin/python -m pytest -q --durations=15 $t --ignore=$t/gpu \
    $(printf -- '--ignore=%s ' "${torch_tests[@]}") || return 1
  stage "stream a: passed"
}

stream_b() {
  stage "stream b: the torch client's tests, on PyPI's $(torch_of .venv-torch/bin/python) (.venv-torch)"
  .venv-torch/bin/python -m pytest -q --durations=10 "${torch_tests[@]}" || return 1
  stage "stream b: the GPU machine's scripts, checked without a GPU (scripts/gpu_bench_test.sh)"
  GPU_BENCH_PYTHON="$PWD/.venv-torch/bin/python" scripts/gpu_bench_test.sh || return 1
  if [ "${HVDD_TEST_CHAOS:-0}" = 1 ]; then
    # Stream b ends minutes before stream a: the campaign takes that time
    # (it needs root: its hosts are network namespaces).
    stage "stream b: the elastic fault campaign, one fault of every kind (bench/chaos/chaos.py --quick)"
    .venv/bin/python bench/chaos/chaos.py --quick || return 1
  fi
  stage "stream b: passed"
}

case $which in
  a) stream_a ;;
  b) stream_b ;;
  all)
    if [ "$(id -u)" -ne 0 ]; then
      stream_a
      stream_b
      exit 0
    fi
    b_log=$(mktemp /tmp/hvdd-test-python-b.XXXXXX)
    mkdir -p /run/hvdd
    # shellcheck disable=SC2016 # expanded by the inner shell
    unshare --mount --propagation private \
      bash -c 'mount -t tmpfs -o mode=0755 hvdd-test /run/hvdd && exec "$@"' _ "$0" b > "$b_log" 2>&1 &
    b=$!
    a_rc=0
    stream_a || a_rc=$?
    b_rc=0
    wait $b || b_rc=$?
    cat "$b_log"
    rm -f "$b_log"
    if [ $a_rc -ne 0 ] || [ $b_rc -ne 0 ]; then
      echo "the Python tests failed: stream a exited $a_rc, stream b $b_rc (its output is above)"
      exit 1
    fi
    stage "both streams passed"
    ;;
esac
