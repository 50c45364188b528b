#!/usr/bin/env python3
"""One rank of the torch.distributed benchmark (bench/torchdist.sh): the
same program on backend ``hvdd`` and on ``gloo``, launched the same way
(``hvdd run``, which sets torch's RANK, WORLD_SIZE, MASTER_ADDR and
MASTER_PORT as torchrun does). Rank 0 prints one JSON line per figure:

- ``allreduce_4B``: a 4-byte float32 ``all_reduce``, median seconds per op
  over ``--reps`` timed loops (latency);
- ``allreduce_64MiB``: a 64 MiB float32 ``all_reduce`` (bandwidth: algbw
  and busbw in GB/s, NCCL's definitions);
- ``ddp_img_s``: DistributedDataParallel training of
  examples/pytorch_synthetic_benchmark.py's SmallResNet on synthetic data,
  total images per second over the ranks (median of the timed iterations).

Usage: torchdist_worker.py --backend {hvdd,gloo} [--what lat,bw,ddp] [--reps 5]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import time
from typing import Callable

import torch
import torch.distributed as dist
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))


def timed(step: Callable[[], None], iters: int, reps: int) -> float:
    """Median seconds per step over reps loops of iters steps, after a
    warm-up; every loop starts at a barrier."""
    for _ in range(max(1, iters // 10)):
        step()
    per = []
    for _ in range(reps):
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(iters):
            step()
        per.append((time.perf_counter() - t0) / iters)
    return statistics.median(per)


def small_resnet() -> torch.nn.Module:
    """examples/pytorch_synthetic_benchmark.py's model, loaded from the file
    (its argument parser runs only under its __main__)."""
    path = os.path.join(HERE, "..", "examples", "pytorch_synthetic_benchmark.py")
    spec = importlib.util.spec_from_file_location("pytorch_synthetic_benchmark", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.SmallResNet(32)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backend", choices=["hvdd", "gloo"], required=True)
    ap.add_argument("--what", default="lat,bw,ddp", help="comma-separated: lat, bw, ddp")
    ap.add_argument("--reps", type=int, default=5, help="timed loops per figure (the median is reported)")
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--image-size", type=int, default=64)
    ap.add_argument(
        "--gloo-ifname",
        help="gloo's GLOO_SOCKET_IFNAME (the namespaces' link: a namespace's host name resolves to loopback)",
    )
    a = ap.parse_args()
    if a.gloo_ifname:
        os.environ["GLOO_SOCKET_IFNAME"] = a.gloo_ifname
    what = set(a.what.split(","))
    torch.set_num_threads(1)
    if a.backend == "hvdd":
        import hvdd.torch.distributed  # noqa: F401  (registers the backend)
    dist.init_process_group(a.backend)
    rank, n = dist.get_rank(), dist.get_world_size()
    out = []
    base = {"backend": a.backend, "world": n}
    if "lat" in what:
        t = torch.ones(1)
        s = timed(lambda: dist.all_reduce(t), 300, a.reps)
        out.append(dict(base, figure="allreduce_4B", median_us=s * 1e6))
    if "bw" in what:
        t = torch.ones(16 << 20)
        s = timed(lambda: dist.all_reduce(t), 3, a.reps)
        algbw = (64 << 20) / s / 1e9
        out.append(
            dict(
                base, figure="allreduce_64MiB", median_us=s * 1e6, algbw_gbps=algbw, busbw_gbps=algbw * 2 * (n - 1) / n
            )
        )
    if "ddp" in what:
        torch.manual_seed(42)
        model = torch.nn.parallel.DistributedDataParallel(small_resnet())
        opt = torch.optim.SGD(model.parameters(), lr=0.01 * n)
        data = torch.randn(a.batch_size, 3, a.image_size, a.image_size)
        target = torch.randint(0, 1000, (a.batch_size,))

        def step() -> None:
            opt.zero_grad()
            F.cross_entropy(model(data), target).backward()
            opt.step()

        s = timed(step, 5, a.reps)
        out.append(dict(base, figure="ddp_img_s", img_s=n * a.batch_size / s, step_ms=s * 1e3))
    if rank == 0:
        for o in out:
            print("RESULT " + json.dumps(o), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
