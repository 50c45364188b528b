#!/usr/bin/env python3
"""One rank of the Adasum benchmark (bench/horovod/run_adasum.sh): timed
out-of-place ``hvd.allreduce(x, op=hvd.Adasum)`` of a float32 tensor, the
same script through hvdd.torch or, with HVDD_BENCH_IMPL=horovod, through
horovod.torch (whose CPU Adasum needs its MPI build, under mpirun). Rank 0
prints the median time of one allreduce and a checksum of the result (the
two implementations must agree on it)."""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "clients", "python", "bench"))
from overhead import import_hvd  # noqa: E402  (HVDD_BENCH_IMPL switch)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--mib", type=float, default=64, help="tensor size in MiB (default 64)")
    ap.add_argument("-n", type=int, default=10, help="timed allreduces (default 10)")
    ap.add_argument("--warmup", type=int, default=3, help="untimed allreduces first (default 3)")
    args = ap.parse_args()

    import torch

    hvd = import_hvd()
    hvd.init()
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(1234 + hvd.rank())
    x = torch.randn(int(args.mib * (1 << 20)) // 4, generator=g, dtype=torch.float32)
    times = []
    y = x
    for i in range(args.warmup + args.n):
        t0 = time.perf_counter()
        y = hvd.allreduce(x, op=hvd.Adasum, name="adasum")
        if i >= args.warmup:
            times.append(time.perf_counter() - t0)
    if hvd.rank() == 0:
        med = statistics.median(times)
        print(
            f"impl={os.environ.get('HVDD_BENCH_IMPL', 'hvdd')} np={hvd.size()} mib={args.mib:g} "
            f"median_ms={med * 1e3:.2f} min_ms={min(times) * 1e3:.2f} max_ms={max(times) * 1e3:.2f} "
            f"GBps={x.numel() * 4 / med / 1e9:.3f} checksum={float(y.double().sum()):.6e}",
            flush=True,
        )
    hvd.shutdown()


if __name__ == "__main__":
    main()
