#!/usr/bin/env bash
# PyTorch as users install it: the newest from PyPI, in a venv of its own
# (.venv-torch, without Debian's packages, which would shadow it), with the
# numpy, protobuf and pytest PyPI gives beside it and the hvdd client.
# scripts/test.sh runs the torch tests under both venvs. torch brings its
# CUDA wheels (about 5 GB); it imports and runs on CPUs without a GPU.
# scripts/setup.sh calls this; it skips what is already there.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=/usr/bin/python3
if [ ! -x .venv-torch/bin/python ]; then
  "$PY" -m venv .venv-torch
fi
if ! .venv-torch/bin/python -c 'import torch, numpy, google.protobuf, pytest' 2>/dev/null; then
  echo "setup: installing torch, numpy, protobuf and pytest from PyPI into .venv-torch" >&2
  .venv-torch/bin/pip install -q --disable-pip-version-check torch numpy protobuf pytest
fi
if ! .venv-torch/bin/python -c 'import hvdd' 2>/dev/null; then
  .venv-torch/bin/pip install -q --disable-pip-version-check --no-deps -e clients/python
fi
