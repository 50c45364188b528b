#!/usr/bin/env bash
# Build Horovod 0.28.1 from its PyPI source package (PyTorch + Gloo, CPU only)
# into a virtualenv of its own, so that the project's .venv is left alone.
# Idempotent: a venv that already holds a working build is only re-checked.
#
#   bench/horovod/setup.sh                     # venv at ../hvd-venv (beside the repo)
#   HOROVOD_VENV=/path/to/venv bench/horovod/setup.sh
#
# Environment:
#   HOROVOD_VENV       the virtualenv (default: <repo>/../hvd-venv)
#   HOROVOD_BUILD_LOG  pip's verbose build log (default: /tmp/horovod-build.log)
#   HOROVOD_VERSION    default 0.28.1
#   HOROVOD_REBUILD=1  rebuild even if the venv already has a working build
#   HOROVOD_MPI=1      build with MPI too (Open MPI from Debian), into
#                      <repo>/../hvd-mpi-venv by default: Horovod's CPU Adasum
#                      runs only over MPI (bench/horovod/run_adasum.sh)
#
# Needs: Debian's python3 (3.11) with python3-venv, python3-dev and python3-torch
# (torch 1.13, reached through --system-site-packages), cmake, g++, make, and
# the headers Horovod's torch extension compiles against: libtorch-dev
# (torch/extension.h; Debian's python3-torch only links to them) and
# pybind11-dev (pybind11/pybind11.h).
# Missing Debian packages are installed with apt-get when running as root.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
MPI="${HOROVOD_MPI:-0}"
if [ "$MPI" = 1 ]; then
  VENV="${HOROVOD_VENV:-$(dirname "$REPO")/hvd-mpi-venv}"
  BUILD_FLAGS=(HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITH_MPI=1
               HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1)
else
  VENV="${HOROVOD_VENV:-$(dirname "$REPO")/hvd-venv}"
  BUILD_FLAGS=(HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1
               HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1 HOROVOD_CPU_OPERATIONS=gloo)
fi
LOG="${HOROVOD_BUILD_LOG:-/tmp/horovod-build.log}"
VERSION="${HOROVOD_VERSION:-0.28.1}"
PY=/usr/bin/python3

say() { printf '[horovod-setup] %s\n' "$*"; }
die() { printf '[horovod-setup] FAILED: %s\n' "$*" >&2; exit 1; }

# 1. System prerequisites.
. "$REPO/bench/horovod/common.sh"

# missing_torch_headers prints the Debian packages that hold the C++ headers
# Horovod's torch extension includes, where neither torch's own include
# directories (torch.utils.cpp_extension.include_paths(); in Debian's
# python3-torch, links into /usr/include) nor /usr/include have them.
missing_torch_headers() {
  "$PY" - <<'EOF' 2>/dev/null || printf '%s\n' libtorch-dev pybind11-dev
import os
try:
    from torch.utils.cpp_extension import include_paths
    dirs = include_paths()
except Exception:  # no torch yet: python3-torch comes with the same apt-get
    dirs = []
dirs.append("/usr/include")
for header, pkg in (("torch/extension.h", "libtorch-dev"), ("pybind11/pybind11.h", "pybind11-dev")):
    if not any(os.path.exists(os.path.join(d, header)) for d in dirs):
        print(pkg)
EOF
}

extra=()
command -v cmake >/dev/null || extra+=(cmake)
if [ "$MPI" = 1 ]; then command -v mpicxx >/dev/null || extra+=(openmpi-bin libopenmpi-dev); fi
"$PY" -c 'import torch' 2>/dev/null || extra+=(python3-torch)
mapfile -t -O "${#extra[@]}" extra < <(missing_torch_headers)
ensure_build_prereqs "${extra[@]}"

# 2. The virtualenv, seeing Debian's torch through the system site-packages.
if [ ! -x "$VENV/bin/python" ]; then
  say "creating $VENV"
  "$PY" -m venv --system-site-packages "$VENV" || die "python3 -m venv $VENV"
fi
"$VENV/bin/python" -c 'import torch' || die "torch is not importable in $VENV (python3-torch missing?)"

# 3. Build, unless a working build of the same version is already there.
built_ok() {
  local out
  out="$(cd /tmp && "$VENV/bin/horovodrun" --check-build 2>&1)" || return 1
  grep -q "Horovod v$VERSION:" <<<"$out" && grep -q '\[X\] PyTorch' <<<"$out" && grep -q '\[X\] Gloo' <<<"$out" \
    && { [ "$MPI" != 1 ] || grep -q '\[X\] MPI' <<<"$out"; }
}
if [ "${HOROVOD_REBUILD:-0}" != 1 ] && [ -x "$VENV/bin/horovodrun" ] && built_ok; then
  say "horovod $VERSION already built in $VENV"
else
  say "building horovod $VERSION from source (about 5 minutes on 2 cores); log: $LOG"
  "$VENV/bin/pip" uninstall -y -q horovod >/dev/null 2>&1 || true
  # cd /tmp: keep pip and setup.py away from any horovod/ directory in the current one.
  if ! (cd /tmp && env "${BUILD_FLAGS[@]}" MAKEFLAGS="-j$(nproc)" \
        "$VENV/bin/pip" install -v --no-cache-dir --no-binary horovod "horovod==$VERSION" >"$LOG" 2>&1); then
    tail -n 40 "$LOG" >&2
    die "pip could not build horovod $VERSION (full log: $LOG)"
  fi
fi

# 4. Check the build, then one 2-rank allreduce through horovodrun --gloo.
built_ok || { (cd /tmp && "$VENV/bin/horovodrun" --check-build) >&2 || true;
              die "horovodrun --check-build does not show v$VERSION with PyTorch and Gloo (and MPI with HOROVOD_MPI=1)"; }
(cd /tmp && "$VENV/bin/horovodrun" --check-build)
say "smoke test: 2 ranks, horovodrun --gloo"
out="$(cd /tmp && timeout 120 "$VENV/bin/horovodrun" -np 2 -H localhost:2 --gloo "$VENV/bin/python" -c \
  'import horovod.torch as hvd, torch; hvd.init(); print("rank", hvd.rank(), "sum", hvd.allreduce(torch.ones(3), op=hvd.Sum).tolist())' 2>&1)" \
  || { printf '%s\n' "$out" >&2; die "2-rank horovodrun --gloo smoke test"; }
printf '%s\n' "$out"
[ "$(grep -c 'sum \[2.0, 2.0, 2.0\]' <<<"$out")" = 2 ] || die "2-rank allreduce gave a wrong result"
say "OK: horovod $VERSION in $VENV (horovodrun: $VENV/bin/horovodrun)"
