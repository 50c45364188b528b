"""Latency of a small blocking allreduce on CUDA tensors: hvdd.torch (through
the daemon and CUDA IPC) against torch.distributed's NCCL, under the same
launcher. Issue 17 asks hvdd to stay within 2x of NCCL's latency.

    hvdd run -np 2 python clients/python/tests/gpu/bench_latency.py [--bytes 4096] [--iters 2000]

Each rank uses cuda:(local_rank % device_count). NCCL refuses two ranks on
one GPU, so with fewer GPUs than local ranks only hvdd is timed (and the
reason printed). torch.distributed starts with init_method env:// from
hvdd's rank and size (MASTER_ADDR: 127.0.0.1 on one node, else rank 0's
host, unless set; MASTER_PORT: a free port rank 0 picks, unless set). Rank 0
prints the medians (and 10th/90th percentiles) in microseconds, and the
ratio. A "blocking" op returns once the result is in device memory: each
op, hvdd's and NCCL's, is followed by a synchronisation of the current
stream (hvdd's allreduce_ returns at the daemon's Done, which, with the
daemon's --gpu-completion stream, only orders the stream after the
daemon's work).

--json PATH: rank 0 also writes the figures there as one JSON object
(scripts/gpu-bench.sh reads it). --parts: also where the time goes (the
submit and the wait timed apart; a stream sync instead of the event). Without torch or a CUDA device every rank
exits 3 before hvd.init(), saying why (gpu-bench.sh's SKIP).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import time

import torch
import torch.distributed as dist

import hvdd.torch as hvd


def _times(fn, iters: int, warmup: int) -> list[float]:
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def _summary(ts: list[float]) -> str:
    q = statistics.quantiles(ts, n=10)
    return f"median {statistics.median(ts) * 1e6:8.1f} us  (p10 {q[0] * 1e6:.1f}, p90 {q[-1] * 1e6:.1f})"


def _parts(x: torch.Tensor, a: argparse.Namespace, results: dict) -> None:
    """Where a CUDA allreduce_'s time goes (GPU-PATH.md D11): the submit
    (allreduce_async_ returning: the Python work, the event record, the
    send) and the wait (synchronize: the daemon's work and its Done) timed
    apart; then the whole op with the client's stream synchronised before
    each op instead of an interprocess event recorded (the daemon then waits
    for no event of the client's: the cost of the event and of the
    client's context staying busy), by telling the exporter this stream has
    no interprocess event, as it does where torch cannot make one."""
    sub, wait = [], []
    for i in range(a.warmup + a.iters):
        t0 = time.perf_counter()
        h = hvd.allreduce_async_(x, op=hvd.Sum, name="latparts")
        t1 = time.perf_counter()
        hvd.synchronize(h)
        torch.cuda.current_stream(x.device).synchronize()
        t2 = time.perf_counter()
        if i >= a.warmup:
            sub.append(t1 - t0)
            wait.append(t2 - t1)
    results["hvdd submit (async_)"] = sub
    results["hvdd wait (synchronize)"] = wait
    from hvdd import _cuda

    ex = _cuda.exporter_for(x)
    events = getattr(ex, "_events", None)
    if events is None:
        return
    cur = torch.cuda.current_stream(x.device)
    stream = cur.cuda_stream
    kept = events.get(stream)
    events[stream] = (None, b"", cur)  # (event, its handle, the stream): no event, a sync
    try:
        results["hvdd, stream sync, no event"] = _times(
            lambda: (hvd.allreduce_(x, op=hvd.Sum, name="latsync"), cur.synchronize()), a.iters, a.warmup
        )
    finally:
        if kept is None:
            events.pop(stream, None)
        else:
            events[stream] = kept


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bytes", type=int, default=4096, help="tensor size (float32 elements x 4)")
    ap.add_argument("--iters", type=int, default=2000)
    ap.add_argument("--warmup", type=int, default=200)
    ap.add_argument("--no-nccl", action="store_true", help="time hvdd only")
    ap.add_argument("--json", help="rank 0 also writes the medians (us) to this file as JSON")
    ap.add_argument(
        "--parts",
        action="store_true",
        help="also time the submit and the wait apart, and the op with a stream sync instead of an event",
    )
    a = ap.parse_args()

    if not torch.cuda.is_available():
        print(
            f"no CUDA device: torch {torch.__version__} sees none (torch.cuda.is_available() is False)", file=sys.stderr
        )
        sys.exit(3)
    hvd.init()
    r, n, lr, ls = hvd.rank(), hvd.size(), hvd.local_rank(), hvd.local_size()
    ngpu = torch.cuda.device_count()
    dev = torch.device("cuda", lr % ngpu)
    torch.cuda.set_device(dev)
    x = torch.ones(max(1, a.bytes // 4), dtype=torch.float32, device=dev)
    results = {}

    cur = torch.cuda.current_stream(dev)

    def hvdd_op() -> None:
        hvd.allreduce_(x, op=hvd.Sum, name="lat")
        cur.synchronize()

    results["hvdd (CUDA IPC)"] = _times(hvdd_op, a.iters, a.warmup)
    xc = torch.ones_like(x, device="cpu")
    results["hvdd (CPU tensor)"] = _times(lambda: hvd.allreduce_(xc, op=hvd.Sum, name="latcpu"), a.iters, a.warmup)
    if a.parts:
        _parts(x, a, results)

    why = ""
    if a.no_nccl:
        why = "--no-nccl"
    elif ngpu < ls:
        why = f"NCCL refuses two ranks on one GPU ({ls} local ranks, {ngpu} GPU(s))"
    if not why:
        if "MASTER_PORT" not in os.environ:
            port = 0
            if r == 0:
                with socket.socket() as s:
                    s.bind(("", 0))
                    port = s.getsockname()[1]
            os.environ["MASTER_PORT"] = str(hvd.broadcast_object(port, 0, name="bench.port"))
        if "MASTER_ADDR" not in os.environ:
            addr = "127.0.0.1" if n == ls else socket.gethostbyname(socket.gethostname())
            os.environ["MASTER_ADDR"] = hvd.broadcast_object(addr, 0, name="bench.addr")
        os.environ["RANK"], os.environ["WORLD_SIZE"], os.environ["LOCAL_RANK"] = str(r), str(n), str(lr)
        dist.init_process_group("nccl", init_method="env://")
        y = torch.ones_like(x)

        def nccl() -> None:
            dist.all_reduce(y)
            torch.cuda.current_stream().synchronize()

        results["torch.distributed nccl"] = _times(nccl, a.iters, a.warmup)
        dist.destroy_process_group()

    if r == 0:
        print(f"allreduce of {x.numel() * 4} bytes, {n} ranks ({ls} per node), {torch.cuda.get_device_name(dev)}")
        for k, ts in results.items():
            print(f"  {k:24s} {_summary(ts)}")
        if "torch.distributed nccl" in results:
            ratio = statistics.median(results["hvdd (CUDA IPC)"]) / statistics.median(results["torch.distributed nccl"])
            print(f"  ratio hvdd / nccl: {ratio:.2f} (issue 17 asks <= 2)")
        else:
            print(f"  nccl: not timed: {why}")
        if a.json:
            figures = {
                k: {
                    "median_us": statistics.median(ts) * 1e6,
                    "p10_us": statistics.quantiles(ts, n=10)[0] * 1e6,
                    "p90_us": statistics.quantiles(ts, n=10)[-1] * 1e6,
                }
                for k, ts in results.items()
            }
            with open(a.json, "w") as f:
                json.dump(
                    {
                        "measure": "bench_latency",
                        "bytes": x.numel() * 4,
                        "ranks": n,
                        "local_size": ls,
                        "device": torch.cuda.get_device_name(dev),
                        "iters": a.iters,
                        "results": figures,
                        "nccl_not_timed": why,
                        "mps": bool(os.environ.get("CUDA_MPS_PIPE_DIRECTORY")),
                        "torch": torch.__version__,
                    },
                    f,
                    sort_keys=True,
                )
                f.write("\n")
    hvd.shutdown()


if __name__ == "__main__":
    main()
