"""The GPU path end to end on a real GPU (scripts/gpu-check.sh): 2 and 4
local ranks sharing cuda:0, torch CUDA tensors handed to a daemon that
serves the GPU through CUDA IPC (cuda_workers.py has the scenarios).
Skipped where torch sees no CUDA device."""

from __future__ import annotations

import os
import sys

import pytest

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available(),
    reason="no CUDA device (torch.cuda.is_available() is False): a GPU machine runs these",
)

HERE = os.path.dirname(os.path.abspath(__file__))
WORKERS = os.path.join(HERE, "cuda_workers.py")


def _run(job, scenario: str, np: int, env=None):
    return job.run(scenario, np=np, timeout=300, cmd=[sys.executable, WORKERS, scenario], env=env)


@pytest.mark.parametrize("np", [2, 4])
def test_cuda_collectives(job, np):
    _run(job, "collectives", np)


@pytest.mark.parametrize("np", [2, 4])
def test_cuda_distributed_optimizer(job, np):
    _run(job, "optimizer", np)


def test_cuda_expandable_segments_staged(job):
    res = _run(job, "expandable", 2, env={"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"})
    for o in res.outputs:
        assert o.count("WARNING: hvdd:") == 1, o
