#!/usr/bin/env bash
# Build Horovod 0.28.1 from its PyPI source package with TensorFlow (CPU, Gloo)
# into a virtualenv of its own, so that the project's .venv is left alone.
# Idempotent: a venv that already holds a working build is only re-checked.
#
#   bench/horovod/setup_tf.sh                       # venv at ../hvd-tf-venv (beside the repo)
#   HOROVOD_TF_VENV=/path/to/venv bench/horovod/setup_tf.sh
#
# Environment:
#   HOROVOD_TF_VENV       the virtualenv (default: <repo>/../hvd-tf-venv)
#   HOROVOD_TF_BUILD_LOG  pip's verbose build log (default: /tmp/horovod-tf-build.log)
#   HOROVOD_VERSION       default 0.28.1
#   TF_PACKAGE            default tensorflow-cpu==2.15.1 (Horovod 0.28.1 predates TF 2.16 and Keras 3)
#   HOROVOD_REBUILD=1     rebuild even if the venv already has a working build
#
# The venv is a plain `python3 -m venv` (no system site packages), so Debian's
# torch and numpy stay out of it; TF 2.15 needs numpy<2, which it pins itself.
# Needs: Debian's python3 (3.11) with python3-venv and python3-dev, g++, make.
# cmake comes from PyPI into the venv, pinned below 4 (CMake 4 refuses the
# cmake_minimum_required of the Gloo copy that Horovod 0.28.1 ships).
# Missing Debian packages are installed with apt-get when running as root.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
VENV="${HOROVOD_TF_VENV:-$(dirname "$REPO")/hvd-tf-venv}"
LOG="${HOROVOD_TF_BUILD_LOG:-/tmp/horovod-tf-build.log}"
VERSION="${HOROVOD_VERSION:-0.28.1}"
TF_PACKAGE="${TF_PACKAGE:-tensorflow-cpu==2.15.1}"
PY=/usr/bin/python3

say() { printf '[horovod-tf-setup] %s\n' "$*"; }
die() { printf '[horovod-tf-setup] FAILED: %s\n' "$*" >&2; exit 1; }

# 1. System prerequisites.
. "$REPO/bench/horovod/common.sh"
ensure_build_prereqs

# 2. The virtualenv (isolated), with TensorFlow and the build dependencies.
if [ ! -x "$VENV/bin/python" ]; then
  say "creating $VENV"
  "$PY" -m venv "$VENV" || die "python3 -m venv $VENV"
fi
PIP=("$VENV/bin/pip" install -q --disable-pip-version-check)
if ! "$VENV/bin/python" -c 'import tensorflow' >/dev/null 2>&1; then
  say "installing $TF_PACKAGE into $VENV"
  (cd /tmp && "${PIP[@]}" "$TF_PACKAGE" 'numpy<2') || die "pip install $TF_PACKAGE"
fi
# Build dependencies for --no-build-isolation, and Horovod's runtime requirements.
(cd /tmp && "${PIP[@]}" 'cmake>=3.13,<4' setuptools wheel packaging cffi cloudpickle psutil pyyaml 'numpy<2') \
  || die "pip install of the build dependencies"
"$VENV/bin/python" -c 'import tensorflow as tf; assert tf.__version__' >/dev/null 2>&1 \
  || die "tensorflow is not importable in $VENV"

# 3. Build, unless a working build of the same version is already there.
built_ok() {
  local out
  out="$(cd /tmp && TF_CPP_MIN_LOG_LEVEL=2 "$VENV/bin/horovodrun" --check-build 2>&1)" || return 1
  grep -q "Horovod v$VERSION:" <<<"$out" && grep -q '\[X\] TensorFlow' <<<"$out" && grep -q '\[X\] Gloo' <<<"$out"
}
if [ "${HOROVOD_REBUILD:-0}" != 1 ] && [ -x "$VENV/bin/horovodrun" ] && built_ok; then
  say "horovod $VERSION with TensorFlow already built in $VENV"
else
  say "building horovod $VERSION with TensorFlow from source (about 7 minutes on 2 cores); log: $LOG"
  "$VENV/bin/pip" uninstall -y -q horovod >/dev/null 2>&1 || true
  # cd /tmp: keep pip and setup.py away from any horovod/ directory in the current one.
  # PATH: the venv's cmake first. --no-build-isolation: build against the venv's TF.
  if ! (cd /tmp && env PATH="$VENV/bin:$PATH" \
        HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_PYTORCH=1 \
        HOROVOD_WITHOUT_MPI=1 HOROVOD_WITHOUT_MXNET=1 HOROVOD_CPU_OPERATIONS=gloo \
        MAKEFLAGS="-j$(nproc)" \
        "$VENV/bin/pip" install -v --no-cache-dir --no-build-isolation --no-binary horovod \
          "horovod==$VERSION" >"$LOG" 2>&1); then
    tail -n 40 "$LOG" >&2
    die "pip could not build horovod $VERSION with TensorFlow (full log: $LOG)"
  fi
fi

# 4. Check the build, then one 2-rank allreduce through horovodrun --gloo.
built_ok || { (cd /tmp && TF_CPP_MIN_LOG_LEVEL=2 "$VENV/bin/horovodrun" --check-build) >&2 || true;
              die "horovodrun --check-build does not show v$VERSION with TensorFlow and Gloo"; }
(cd /tmp && TF_CPP_MIN_LOG_LEVEL=2 "$VENV/bin/horovodrun" --check-build)
say "smoke test: 2 ranks, horovodrun --gloo"
out="$(cd /tmp && TF_CPP_MIN_LOG_LEVEL=2 timeout 180 "$VENV/bin/horovodrun" -np 2 -H localhost:2 --gloo "$VENV/bin/python" -c \
  'import horovod.tensorflow as hvd, tensorflow as tf; hvd.init(); print("rank", hvd.rank(), "sum", hvd.allreduce(tf.ones(3), op=hvd.Sum).numpy().tolist())' 2>&1)" \
  || { printf '%s\n' "$out" >&2; die "2-rank horovodrun --gloo smoke test"; }
printf '%s\n' "$out" | grep -E 'rank [01] sum' || true
[ "$(grep -c 'sum \[2.0, 2.0, 2.0\]' <<<"$out")" = 2 ] || { printf '%s\n' "$out" >&2; die "2-rank allreduce gave a wrong result"; }
"$VENV/bin/python" - <<'EOF'
import importlib.metadata as md
import platform
print("[horovod-tf-setup] versions: python %s, %s" % (platform.python_version(), ", ".join(
    "%s %s" % (p, md.version(p)) for p in ("horovod", "tensorflow-cpu", "keras", "numpy", "cmake"))))
EOF
say "OK: horovod $VERSION with TensorFlow in $VENV (horovodrun: $VENV/bin/horovodrun)"
