#!/usr/bin/env python3
"""One rank of a PyTorch gloo allreduce benchmark between two hosts (used by
bench/netbench.sh across network namespaces): 4-byte latency and 64 MiB float32
allreduce, median over timed loops, printed by rank 0 as one JSON line each.

Usage: gloo_net.py --rank R --world 2 --addr HOST0 [--port 29600] [--reps 5]
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
import torch.distributed as dist


def timed(t: torch.Tensor, iters: int, reps: int) -> float:
    for _ in range(max(1, iters // 10)):
        dist.all_reduce(t)
    per = []
    for _ in range(reps):
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(t)
        per.append((time.perf_counter() - t0) / iters)
    return statistics.median(per)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--addr", required=True)
    ap.add_argument("--port", type=int, default=29600)
    ap.add_argument("--reps", type=int, default=5)
    a = ap.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://{a.addr}:{a.port}", rank=a.rank, world_size=a.world)
    lat = timed(torch.ones(1), 500, a.reps)
    big = timed(torch.ones(16 << 20), 3, a.reps)
    if a.rank == 0:
        n = a.world
        print(json.dumps({"peer": "gloo", "bytes": 4, "median_us": lat * 1e6}))
        algbw = (64 << 20) / big / 1e9
        print(
            json.dumps(
                {
                    "peer": "gloo",
                    "bytes": 64 << 20,
                    "median_us": big * 1e6,
                    "algbw_gbps": algbw,
                    "busbw_gbps": algbw * 2 * (n - 1) / n,
                }
            )
        )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
