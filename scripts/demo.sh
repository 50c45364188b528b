#!/usr/bin/env bash
# The main demo: installs everything (scripts/setup.sh), then trains the PyTorch
# MNIST example on 2 processes through a local hvdd daemon started by `hvdd run`.
# MNIST is read from --data-dir when present; otherwise a synthetic stand-in is
# generated (nothing is downloaded). Extra arguments go to the training script.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
export HVDD_SOCKET="${HVDD_SOCKET:-${TMPDIR:-/tmp}/hvdd-demo-$$.sock}"
exec bin/hvdd run -np "${NP:-2}" -- .venv/bin/python examples/pytorch_mnist.py --epochs "${EPOCHS:-3}" "$@"
