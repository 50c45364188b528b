"""The end-to-end torch CUDA job of scripts/gpu-check.sh (its torch-npN
steps):

    bin/hvdd run -np N -- python3 clients/python/tests/gpu/torch_cuda_job.py

Every local rank on cuda:0 ($HVDD_TEST_CUDA_DEVICE): the collectives and
the DistributedOptimizer checks of cuda_workers.py in one job, through CUDA
IPC, then a short latency measurement of a small blocking allreduce (hvdd
only; bench_latency.py compares with NCCL where it can). Exits non-zero on
the first wrong result; prints "OK" at the end.
"""

from __future__ import annotations

import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

import cuda_workers as w  # noqa: E402
import hvdd.torch as hvd  # noqa: E402


def main() -> None:
    r, n = w._init()
    w.collectives_body(r, n)
    w.optimizer_body(r, n)
    x = torch.ones(1024, device=w.DEV)
    for _ in range(100):
        hvd.allreduce_(x, op=hvd.Sum, name="lat")
    ts = []
    for _ in range(1000):
        t0 = time.perf_counter()
        hvd.allreduce_(x, op=hvd.Sum, name="lat")
        ts.append(time.perf_counter() - t0)
    if r == 0:
        print(
            f"4 KiB allreduce on {torch.cuda.get_device_name(w.DEV)}, {n} ranks: "
            f"median {statistics.median(ts) * 1e6:.1f} us through CUDA IPC"
        )
    hvd.shutdown()
    print("OK")


if __name__ == "__main__":
    main()
