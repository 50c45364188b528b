#!/usr/bin/env bash
# Builds here, where Go is, what scripts/gpu-check.sh runs on a GPU machine
# that has no Go and no network (issue 17):
#   bin/hvdd               the default build
#   bin/<test binaries>    `go test -c` of the GPU packages in the table
#                          below, each built only where its package has tests
#   bin/gpu-tests.txt      the manifest gpu-check.sh reads: per line the test
#                          binary, its package directory (the test runs there,
#                          as go test would) and its -test.run pattern
#   bin/pylib/{protobuf,pytest}  pure-Python wheels (PyPI) unpacked, which
#                          gpu-check.sh puts on PYTHONPATH only where the GPU
#                          machine's python3 lacks them (the client needs
#                          protobuf, the GPU tests pytest)
#   bin/hvdd-base          with --baseline REV: hvdd built from commit REV
#                          (git archive), which scripts/gpu-bench.sh
#                          alternates with bin/hvdd (old and new in one run)
# Everything is stripped (-ldflags='-s -w'; Go's stack traces survive) to fit
# the device tool's 64 MiB (working tree and carried bin/ together); with
# --no-tests the test binaries are left out (a bench-only carry).
#
# Usage: scripts/gpu-build.sh [--baseline REV] [--no-tests] [--help]
# Then, on the GPU machine (device tool: carry ["bin"]): scripts/gpu-check.sh
# or scripts/gpu-bench.sh
set -euo pipefail
cd "$(dirname "$0")/.."
baseline='' tests_too=1
while [ $# -gt 0 ]; do
  case $1 in
    -h|--help) sed -n '2,22s/^# \{0,1\}//p' "$0"; exit 0 ;;
    --baseline) baseline=${2:?--baseline needs a commit}; shift 2 ;;
    --no-tests) tests_too=0; shift ;;
    *) echo "scripts/gpu-build.sh: unexpected argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
command -v go >/dev/null || { echo "scripts/gpu-build.sh: needs Go (it runs where the repo is built, not on the GPU machine)" >&2; exit 1; }

ldflags='-s -w'
mkdir -p bin
echo "== go build -o bin/hvdd ./cmd/hvdd"
go build -ldflags "$ldflags" -o bin/hvdd ./cmd/hvdd
rm -f bin/hvdd-base
if [ -n "$baseline" ]; then
  rev=$(git rev-parse --verify "$baseline^{commit}") || { echo "scripts/gpu-build.sh: --baseline $baseline is not a commit" >&2; exit 2; }
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  echo "== go build -o bin/hvdd-base ./cmd/hvdd at ${rev:0:12}"
  git archive "$rev" | tar -x -C "$tmp"
  (cd "$tmp" && go build -ldflags "$ldflags" -o "$OLDPWD/bin/hvdd-base" ./cmd/hvdd)
  echo "$rev" > bin/hvdd-base.rev
fi

# BINARY  PACKAGE  -test.run PATTERN
# A part that adds GPU tests adds its line here.
tests='
nvml.test        gpu/nvml     .
gputest-cuda     gpu/cuda     .
kernels-gpu.test gpu/kernels  .
nccl-engine.test backends/nccl CUDA
daemon-gpu.test  daemon       GPU|CUDA|Cuda|NCCL|Nccl
'
# The Python client's pure dependencies, for a GPU machine whose python3
# lacks them (it has no network). numpy cannot travel this way (its wheels
# are per Python version): torch's installs usually bring it.
rm -rf bin/pylib
pyget() { # pyget DIR PACKAGE...: unpack the py3-none-any wheels into bin/pylib/DIR
  local d; d=$(mktemp -d)
  python3 -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: \
    --platform any --implementation py --python-version 3.9 -d "$d" "${@:2}"
  python3 - "$d" "bin/pylib/$1" <<'PY'
import glob, sys, zipfile
for w in glob.glob(sys.argv[1] + "/*.whl"):
    zipfile.ZipFile(w).extractall(sys.argv[2])
PY
  rm -rf "$d"
}
echo "== bin/pylib: protobuf, pytest (pure-Python wheels from PyPI)"
pyget protobuf protobuf
pyget pytest pytest pluggy iniconfig packaging pygments exceptiongroup tomli typing_extensions

manifest=bin/gpu-tests.txt
: > "$manifest.tmp"
built=() skipped=()
while read -r bin pkg run; do
  [ -n "$bin" ] || continue
  if [ "$tests_too" = 0 ]; then
    skipped+=("$bin (--no-tests)")
    rm -f "bin/$bin"
    continue
  fi
  # Built only where a test the pattern selects exists.
  if ! compgen -G "$pkg/*_test.go" >/dev/null ||
    ! grep -hoE '^func (Test|Example)[A-Za-z0-9_]*' "$pkg"/*_test.go | sed 's/^func //' | grep -qE "$run"; then
    skipped+=("$bin (no test in $pkg matches $run yet)")
    rm -f "bin/$bin"
    continue
  fi
  echo "== go test -c -o bin/$bin ./$pkg"
  go test -c -ldflags "$ldflags" -o "bin/$bin" "./$pkg"
  printf '%s %s %s\n' "$bin" "$pkg" "$run" >> "$manifest.tmp"
  built+=("$bin")
done <<< "$tests"
mv "$manifest.tmp" "$manifest"

echo
echo "built: bin/hvdd ${extra[*]:-} ${built[*]/#/bin/}"
for s in "${skipped[@]}"; do echo "not built: $s"; done
extra=()
[ -f bin/hvdd-base ] && extra=(bin/hvdd-base)
size=$(du -cm bin/hvdd "${extra[@]}" "$manifest" bin/pylib "${built[@]/#/bin/}" | tail -1 | cut -f1)
tree=$(git ls-files -z | du -cm --files0-from=- | tail -1 | cut -f1)
echo "bin/ to carry: ${size} MiB; tracked tree: ${tree} MiB (the device tool takes 64 MiB in all)"
if [ $((size + tree)) -gt 60 ]; then
  echo "warning: close to or over the device tool's 64 MiB" >&2
fi
