#!/usr/bin/env bash
# The whole hvdd test suite: formatting (gofmt, black) and vet, the Go tests under the race
# detector, a short run of every fuzz target, and the Python client's tests, each once, in two
# streams at once (scripts/test-python.sh; as root, stream a starts once the -race tests of every
# package but clients/go are done): the torch client's on the newest PyPI torch in
# .venv-torch, the others in .venv (Debian's torch, PyPI's TF); then the scripts the GPU machine
# runs, checked without a GPU (scripts/gpu_bench_test.sh), and, as root, a short elastic fault
# campaign (bench/chaos/chaos.py --quick) at the end of the second stream.
# It installs what it needs first (scripts/setup.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
# The newest torch (about 5 GB of wheels) installs in the background while
# the Go tests run; the second Python pass waits for it.
HVDD_SETUP_TORCH=later ./scripts/setup.sh
torch_log=$(mktemp)
./scripts/setup-torch.sh > "$torch_log" 2>&1 &
torch_setup=$!

# stage NAME: a heading with the minutes and seconds since the start, so a
# CI log shows where its time goes.
stage() { echo "== $* [$((SECONDS / 60))m$((SECONDS % 60))s]"; }
stage "gofmt / go vet / black"
bad=$(gofmt -l $(git ls-files '*.go' | grep -v '\.pb\.go$') || true)
if [ -n "$bad" ]; then echo "gofmt needed on: $bad"; exit 1; fi
go vet ./...
# Python: black (Debian's), line length and exclusions in clients/python/pyproject.toml.
black --config clients/python/pyproject.toml --check -q $(git ls-files '*.py') \
  || { echo "black needed: black --config clients/python/pyproject.toml \$(git ls-files '*.py')"; exit 1; }

stage "go test -race"
# clients/go is the long pole (9 minutes alone): it runs in a go test of its
# own, started first, with every other package beside it, where one go test
# started it late and left a core idle at the end. Its output follows the
# others'.
race_log=$(mktemp)
# Its workers (Go client processes) run a build without -race, but in the
# tests of the client's own paths (daemontest.RaceCheckedWorkers): the
# daemons, in the test process, are race-checked in every test, and the
# race-built workers took four fifths of the CPU time (TestCollectives:
# 59 CPU-seconds with race-built workers, 11 without).
worker_bin=$(mktemp -d)/clients-go.test
go test -c -o "$worker_bin" ./clients/go
HVDD_TEST_WORKER_BINARY=$worker_bin HVDD_REQUIRE_PTXAS=1 go test -race -count=1 -timeout 20m ./clients/go > "$race_log" 2>&1 &
race_clients=$!
race_rc=0
HVDD_REQUIRE_PTXAS=1 go test -race -count=1 -timeout 20m $(go list ./... | grep -v '/clients/go$') || race_rc=$?

# in_private_run CMD...: CMD in a mount namespace of its own whose /run/hvdd
# is a private tmpfs (as root), so that its jobs that start a daemon on the
# default socket (root's /run/hvdd/hvdd.sock) start their own.
in_private_run() {
  mkdir -p /run/hvdd
  unshare --mount --propagation private \
    bash -c 'mount -t tmpfs -o mode=0755 hvdd-test /run/hvdd && exec "$@"' _ "$@"
}
# As root, the Python tests' stream a (TensorFlow, Keras, launchers,
# elastic jobs: scripts/test-python.sh --help) starts now, beside
# clients/go's -race tests, the MPI stage and the fuzz targets, which leave
# a fifth to a third of the CPU idle (vmstat 30 in run 10 of the test
# command: clients/go alone, 16-23%; MPI and fuzz, 6-75%, about 30%), and
# the fuzz targets run for a fixed time. Its output is shown after stream
# b's, in the Python stage.
a_started=
if [ -d clients/python/tests ] && [ "$(id -u)" -eq 0 ]; then
  a_log=$(mktemp /tmp/hvdd-test-python-a.XXXXXX)
  stage "python client, stream a (scripts/test-python.sh a), started beside the rest; its output comes with the Python stage's"
  mkdir -p /run/hvdd
  # setsid: a session and process group of its own, which the trap ends
  # if this script exits first (a failed stage).
  HVDD_BIN="$PWD/bin/hvdd" setsid -w unshare --mount --propagation private \
    bash -c 'mount -t tmpfs -o mode=0755 hvdd-test /run/hvdd && exec "$@"' _ scripts/test-python.sh a > "$a_log" 2>&1 &
  a_started=$!
  trap 'kill -- -$a_started 2>/dev/null || true' EXIT
fi
clients_rc=0
wait $race_clients || clients_rc=$?
cat "$race_log"
rm -f "$race_log"
rm -rf "$(dirname "$worker_bin")"
if [ $race_rc -ne 0 ] || [ $clients_rc -ne 0 ]; then
  echo "go test -race failed: the other packages exited $race_rc, ./clients/go $clients_rc"
  exit 1
fi
# The PTX interpreter's tests, which skip under -race (single-threaded test
# code that the detector only slows down).
go test -count=1 -timeout 10m -run 'TestSimulate' ./gpu/kernels/gen/

stage "MPI engine under a real mpirun (build tag mpi)"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
go test -tags mpi -count=1 -timeout 10m ./backends/mpi/
# cmd/hvdd's other tests ran above (-race); here only those an MPI build
# changes: the MPI engine and control, and the engines' refusals.
go test -tags mpi -count=1 -timeout 10m -run 'MPI|WireCompression|ResolveControl' ./cmd/hvdd/
# The engine on MPICH too (the default mpirun stays Open MPI's).
go test -tags "mpi mpich" -c -o /tmp/hvdd-mpich.$$.test ./backends/mpi/
(cd backends/mpi && mpiexec.mpich -n 3 /tmp/hvdd-mpich.$$.test -test.run '^TestMPIConformance$' -test.count=1)
rm -f /tmp/hvdd-mpich.$$.test
# Daemons across 4 nodes x 2 ranks on both engines, and 8 namespaced nodes:
# every scenario, a lost node, hvdd run over 8 hosts (too slow under -race,
# where these tests skip saying so).
go test -tags mpi -count=1 -timeout 10m -run 'TestMPIMultiNode|TestMPICHMultiNode|TestMultiNodeWide|TestScaleNetns8|TestScaleRun8' ./clients/go/
# The layouts of TestMultiNodeCollectives and TestMultiNodeLargeFused that
# -race above skips (it runs [1 2], [1 1 1 1] and [2 2] of them).
go test -tags mpi -count=1 -timeout 10m -run 'TestMultiNode(Collectives|LargeFused)$/^.(1_1|2_2|1_1_1).$' ./clients/go/
# The tcp engine's conformance matrix with wire compression (minutes under -race).
go test -count=1 -timeout 10m -run 'TestConformanceCompressed' ./backends/tcp/

stage "fuzz (${FUZZTIME:=5s} per target)"
for t in "./ipc FuzzReadClient" "./ipc FuzzChannel" "./daemon/internal/loop FuzzResolve" "./daemon/internal/exec/device FuzzResolveDevice" "./shm FuzzSlice" "./reduce FuzzReduce" "./reduce FuzzWire" "./daemon/plan FuzzTable" \
         "./backends/tcp FuzzParse" "./backends/tcp FuzzHandshakeServer" "./backends/tcp FuzzWireMessage" "./cluster FuzzFrames"; do
  set -- $t
  # Go's fuzzer sometimes fails with "context deadline exceeded" and no
  # failing input when -fuzztime runs out on a slow, loaded machine (while
  # gathering baseline coverage, or with a worker mid-input); that is not a
  # finding, so such a run is repeated once, and its output (a FAIL line)
  # is not shown, only said.
  if go test -run '^$' -fuzz "^$2\$" -fuzztime "$FUZZTIME" "$1" > /tmp/hvdd-fuzz.$$.log 2>&1; then
    cat /tmp/hvdd-fuzz.$$.log
  elif grep -q 'context deadline exceeded' /tmp/hvdd-fuzz.$$.log && ! grep -q 'Failing input\|failing input' /tmp/hvdd-fuzz.$$.log; then
    echo "== $2: 'context deadline exceeded' as fuzz time ran out, no failing input: once more"
    go test -run '^$' -fuzz "^$2\$" -fuzztime "$FUZZTIME" "$1"
  else
    cat /tmp/hvdd-fuzz.$$.log
    rm -f /tmp/hvdd-fuzz.$$.log
    exit 1
  fi
  rm -f /tmp/hvdd-fuzz.$$.log
done

if [ -d clients/python/tests ]; then
  if ! wait $torch_setup; then
    cat "$torch_log"; echo "scripts/setup-torch.sh failed"; exit 1
  fi
  # Each Python test once, in two streams at once (scripts/test-python.sh
  # --help): the torch client's on the newest PyPI torch in .venv-torch,
  # every other one on .venv; then the GPU machine's scripts, checked
  # without a GPU.
  # As root, stream b ends with the elastic fault campaign's short run
  # (bench/chaos/chaos.py --help): one fault of every kind, from a seed it
  # draws and prints (a failure prints the command that replays it), on 4
  # network-namespace hosts.
  if [ -n "$a_started" ]; then
    stage "python client: stream b (scripts/test-python.sh b, beside stream a), then the elastic fault campaign (bench/chaos/chaos.py --quick)"
    b_rc=0
    HVDD_TEST_CHAOS=1 HVDD_BIN="$PWD/bin/hvdd" in_private_run scripts/test-python.sh b || b_rc=$?
    a_rc=0
    wait $a_started || a_rc=$?
    trap - EXIT
    stage "python client: stream a's output (it started after the other packages' -race tests)"
    cat "$a_log"
    rm -f "$a_log"
    if [ $a_rc -ne 0 ] || [ $b_rc -ne 0 ]; then
      echo "the Python tests failed: stream a exited $a_rc, stream b $b_rc"
      exit 1
    fi
  else
    stage "python client (scripts/test-python.sh, one stream after the other)"
    HVDD_BIN="$PWD/bin/hvdd" scripts/test-python.sh
    stage "NOT RUN: the elastic fault campaign (bench/chaos/chaos.py --quick) needs root for its network namespaces"
  fi
fi
stage "all tests passed"
