"""The client's GPU path against a real daemon, without a GPU: the daemon runs
the fake CUDA driver (``HVDD_GPU_DRIVER=fake``), whose device memory and IPC
handles are memfds, and the workers (gpu_workers.py) hand it tensors of
tests/fake_cuda.py's fake device memory as DeviceBuffers."""

from __future__ import annotations

import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
GPU_WORKERS = os.path.join(HERE, "gpu_workers.py")


def _run(job, scenario: str, np: int = 2, env=None):
    return job.run(scenario, np=np, cmd=[sys.executable, GPU_WORKERS, scenario], env=env)


@pytest.fixture
def fake_gpus(monkeypatch):
    """The daemons the test starts run the fake CUDA driver."""
    monkeypatch.setenv("HVDD_GPU_DRIVER", "fake")


@pytest.mark.parametrize("np", [2, 3])
def test_ipc_collectives(job, fake_gpus, np):
    res = _run(job, "ipc_collectives", np)
    for o in res.outputs:
        assert o.rstrip().endswith("OK"), o


def test_ipc_collectives_daemon_on_host(job, fake_gpus, monkeypatch):
    """The same through a daemon that reduces GPU tensors in host memory
    (HOROVOD_GPU_ALLREDUCE=GLOO: --gpu-allreduce host): it still takes them
    through CUDA IPC and writes the results in place."""
    monkeypatch.setenv("HOROVOD_GPU_ALLREDUCE", "GLOO")
    _run(job, "ipc_collectives", 2)


def test_ipc_collectives_across_gpus(job, fake_gpus, monkeypatch):
    """Each rank's tensors on a GPU of its own (two fake GPUs, the daemon's
    NCCL between them)."""
    monkeypatch.setenv("HVDD_FAKE_GPUS", "2")
    _run(job, "ipc_collectives", 2, env={"HVDD_FAKE_GPU_PER_RANK": "1"})


@pytest.mark.parametrize("np", [2, 3])
def test_mixed_device_and_host_tensors(job, fake_gpus, np):
    _run(job, "mixed", np)


@pytest.mark.parametrize("np", [2, 3])
def test_torch_distributed_device_tensors(job, fake_gpus, np):
    """torch.distributed's backend hvdd takes device tensors as device
    memory (CUDA IPC), not staged through host memory: gpu_workers.py's
    pg_collectives."""
    _run(job, "pg_collectives", np)


def test_ipc_release(job, fake_gpus):
    _run(job, "ipc_release")


def test_ipc_event_wait(job, fake_gpus):
    _run(job, "ipc_event_wait")


@pytest.mark.parametrize(
    "reason,text",
    [
        ("other-gpu", "does not serve that GPU"),
        ("allocator", "expandable_segments"),
        ("export", "received from another process"),
    ],
)
def test_staging_fallbacks(job, fake_gpus, reason, text):
    res = _run(job, "staging_fallbacks", env={"HVDD_FAKE_REASON": reason})
    for o in res.outputs:
        assert o.count("WARNING: hvdd:") == 1 and text in o, o


def test_staging_cpu_only_daemon(job, monkeypatch):
    monkeypatch.delenv("HVDD_GPU_DRIVER", raising=False)
    res = _run(job, "staging_fallbacks", env={"HVDD_FAKE_REASON": "cpu-only"})
    for o in res.outputs:
        assert o.count("WARNING: hvdd:") == 1 and "CPU-only" in o, o
