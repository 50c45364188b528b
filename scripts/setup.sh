#!/usr/bin/env bash
# Installs everything hvdd needs to build, test and run its demo on a fresh
# Debian 12 machine: system packages (apt), Go modules, the hvdd binary in
# bin/, and a Python virtualenv in .venv with the hvdd client installed.
# Safe to run again; it skips what is already there.
set -euo pipefail
cd "$(dirname "$0")/.."

# prometheus: daemon's TestMetricsPrometheus starts its own /usr/bin/prometheus
# (the package's own service, where systemd runs one, is not used).
need_apt=()
have() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; }
for p in python3-torch python3-numpy python3-protobuf python3-pytest python3-venv \
         openmpi-bin libopenmpi-dev mpich libmpich-dev gcc pkg-config iproute2 iperf3 protobuf-compiler black \
         openssh-server openssh-client prometheus; do
  have "$p" || need_apt+=("$p")
done
if ((${#need_apt[@]})); then
  echo "setup: installing ${need_apt[*]}" >&2
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
fi

if ! command -v go >/dev/null; then
  if [ -x /usr/local/go/bin/go ]; then export PATH=$PATH:/usr/local/go/bin
  else
    echo "setup: Go is missing; installing Debian's golang (needs Go >= 1.24)" >&2
    apt-get install -y -qq golang-go >/dev/null
  fi
fi
go mod download
mkdir -p bin
go build -o bin/hvdd ./cmd/hvdd

# Debian's python has torch, numpy and protobuf; the venv sees them.
PY=/usr/bin/python3
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv --system-site-packages .venv
fi
# TensorFlow and Keras as users install them: the newest from PyPI
# (tensorflow, which tf_keras requires by that name), with tf_keras for TF_USE_LEGACY_KERAS=1. numpy stays below 2 for
# Debian's torch, which was built against numpy 1.x; TF brings a newer
# protobuf runtime, which reads hvdd's generated messages too.
if ! .venv/bin/python -c 'import tensorflow, keras, tf_keras' 2>/dev/null; then
  echo "setup: installing tensorflow, keras and tf-keras from PyPI into .venv" >&2
  .venv/bin/pip install -q --disable-pip-version-check tensorflow keras tf-keras "numpy<2"
fi
if ! .venv/bin/python -c 'import hvdd' 2>/dev/null; then
  .venv/bin/pip install -q --no-deps --no-build-isolation -e clients/python 2>/dev/null \
    || .venv/bin/pip install -q --no-deps -e clients/python
fi

# ptxas from NVIDIA's nvidia-cuda-nvcc-cu12 wheel (no CUDA toolkit, no GPU):
# gpu/kernels/gen's test assembles the daemon's generated PTX kernels with
# it. Only ptxas is taken from the wheel, into .tools/ (ignored by git).
if [ ! -x .tools/ptxas/nvidia/cuda_nvcc/bin/ptxas ]; then
  echo "setup: fetching ptxas (the nvidia-cuda-nvcc-cu12 wheel from PyPI) into .tools/ptxas" >&2
  tmp=$(mktemp -d)
  .venv/bin/pip download -q --disable-pip-version-check --no-deps -d "$tmp" "nvidia-cuda-nvcc-cu12==12.9.86"
  .venv/bin/python - "$tmp" <<'PY'
import glob, os, sys, zipfile
whl = glob.glob(os.path.join(sys.argv[1], "*.whl"))[0]
name = "nvidia/cuda_nvcc/bin/ptxas"
with zipfile.ZipFile(whl) as z:
    z.extract(name, ".tools/ptxas")
os.chmod(os.path.join(".tools/ptxas", name), 0o755)
PY
  rm -rf "$tmp"
fi

# PyTorch as users install it: the newest from PyPI, in .venv-torch
# (scripts/setup-torch.sh). scripts/test.sh defers it
# (HVDD_SETUP_TORCH=later) and installs it while the Go tests run.
if [ "${HVDD_SETUP_TORCH:-}" != later ]; then
  ./scripts/setup-torch.sh
fi
echo "setup: ok (bin/hvdd, .venv$([ "${HVDD_SETUP_TORCH:-}" = later ] || echo ", .venv-torch"))" >&2
