"""The peers and the limit that scripts/gpu-bench.sh sets hvdd's figures
against (issue 26), each a subcommand that writes one JSON object:

    python3 clients/python/tests/gpu/peer_bench.py copy  --json B.json
    python3 clients/python/tests/gpu/peer_bench.py nccl1 --json nccl1.json
    python3 clients/python/tests/gpu/peer_bench.py gloo --np 2 --json gloo-np2.json

copy   B, the GPU's device-to-device copy rate: a large tensor copy_ (1 GiB
       by default) timed with CUDA events, median of --reps; bytes read and
       written both counted (B = 2 x bytes / time), as the busbw ceiling
       B(N-1)/N^2 of ranks sharing the GPU wants it.
nccl1  torch.distributed NCCL at world size 1 (a file:// store): a blocking
       allreduce_ of 4 KiB (torch.cuda.synchronize after each; median over
       --iters) and of 64 MiB (algbw = bytes / median time; busbw is
       algbw x 2(n-1)/n, so 0 at n = 1).
gloo   torch.distributed gloo with CUDA tensors, --np processes sharing
       cuda:0 (this script started --np times, a file:// store): the same
       4 KiB and 64 MiB measures; the 4 KiB latency is rank 0's median, the
       64 MiB time the largest of the ranks' medians.

Every subcommand exits 3, saying why, where torch or a CUDA device is
missing (gpu-bench.sh counts that as SKIP). --device cpu runs the same code
on CPU tensors (copy and gloo only; the figures mean nothing): for checking
the script on a machine without GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import timedelta

NO_DEVICE = 3  # gpu-bench.sh: SKIP


def _torch(device: str):
    """torch, or exit NO_DEVICE with the reason."""
    try:
        import torch
    except ImportError as e:
        print(f"no torch in {sys.executable}: {e}", file=sys.stderr)
        sys.exit(NO_DEVICE)
    if device == "cuda" and not torch.cuda.is_available():
        print(
            f"no CUDA device: torch {torch.__version__} (CUDA {torch.version.cuda}) sees none "
            "(torch.cuda.is_available() is False)",
            file=sys.stderr,
        )
        sys.exit(NO_DEVICE)
    return torch


def _dev(torch, device: str):
    if device == "cpu":
        return torch.device("cpu")
    d = torch.device("cuda", int(os.environ.get("HVDD_TEST_CUDA_DEVICE", "0")))
    torch.cuda.set_device(d)
    return d


def _sync(torch, device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def _gpu_name(torch, device: str) -> str:
    if device == "cpu":
        return "cpu"
    return torch.cuda.get_device_name(torch.cuda.current_device())


def _write(path: str | None, obj: dict) -> None:
    s = json.dumps(obj, sort_keys=True)
    print(s)
    if path:
        with open(path, "w") as f:
            f.write(s + "\n")


def _mps() -> bool:
    """Whether this process was pointed at an MPS control daemon (gpu-bench.sh
    exports CUDA_MPS_PIPE_DIRECTORY while MPS runs)."""
    return bool(os.environ.get("CUDA_MPS_PIPE_DIRECTORY"))


def _times(torch, device: str, fn, iters: int, warmup: int) -> list[float]:
    """Seconds of each of iters blocking calls of fn (the device synchronised
    after each), after warmup untimed ones."""
    for _ in range(warmup):
        fn()
        _sync(torch, device)
    out = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        _sync(torch, device)
        out.append(time.perf_counter() - t0)
    return out


def _pct(ts: list[float], q: int) -> float:
    if len(ts) < 2:
        return ts[0]
    return statistics.quantiles(ts, n=10)[q]


# ----------------------------------------------------------------------- copy


def cmd_copy(a: argparse.Namespace) -> int:
    torch = _torch(a.device)
    dev = _dev(torch, a.device)
    n = a.bytes // 4
    x = torch.ones(n, dtype=torch.float32, device=dev)
    y = torch.empty_like(x)
    secs = []
    if a.device == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        for i in range(a.warmup + a.reps):
            start.record()
            y.copy_(x)
            end.record()
            end.synchronize()
            if i >= a.warmup:
                secs.append(start.elapsed_time(end) / 1e3)
    else:
        for i in range(a.warmup + a.reps):
            t0 = time.perf_counter()
            y.copy_(x)
            if i >= a.warmup:
                secs.append(time.perf_counter() - t0)
    assert bool((y[:1024] == 1).all()), "copy_ wrote something else"
    med = statistics.median(secs)
    moved = 2 * n * 4
    _write(
        a.json,
        {
            "measure": "B",
            "device": _gpu_name(torch, a.device),
            "bytes": n * 4,
            "reps": a.reps,
            "median_s": med,
            "min_s": min(secs),
            "B_GBps": moved / med / 1e9,
            "B_best_GBps": moved / min(secs) / 1e9,
            "counted": "bytes read + bytes written",
            "mps": _mps(),
            "torch": torch.__version__,
        },
    )
    return 0


# ---------------------------------------------------------------------- nccl1


def _collective_figures(torch, device, dist, n: int, small: int, large: int, a) -> dict:
    """The 4 KiB (small) latency and the 64 MiB (large) time of a blocking
    all_reduce on this rank."""
    dev = _dev(torch, device)
    x = torch.ones(max(1, small // 4), dtype=torch.float32, device=dev)
    dist.barrier()
    lat = _times(torch, device, lambda: dist.all_reduce(x), a.iters, a.warmup)
    y = torch.ones(max(1, large // 4), dtype=torch.float32, device=dev)
    dist.barrier()
    big = _times(torch, device, lambda: dist.all_reduce(y), a.large_iters, 2)
    return {
        "small_bytes": x.numel() * 4,
        "small_median_us": statistics.median(lat) * 1e6,
        "small_p10_us": _pct(lat, 0) * 1e6,
        "small_p90_us": _pct(lat, -1) * 1e6,
        "large_bytes": y.numel() * 4,
        "large_median_s": statistics.median(big),
        "large_iters": len(big),
    }


def cmd_nccl1(a: argparse.Namespace) -> int:
    torch = _torch("cuda")
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_nccl_available():
        print(f"no NCCL in torch {torch.__version__}: torch.distributed.is_nccl_available() is False", file=sys.stderr)
        return NO_DEVICE
    d = tempfile.mkdtemp(prefix="peer-nccl1-")
    try:
        dev = _dev(torch, "cuda")
        kw = dict(init_method="file://" + os.path.join(d, "store"), rank=0, world_size=1, timeout=timedelta(seconds=60))
        try:  # device_id (torch >= 2.3) binds the communicator, so barrier() knows its GPU
            dist.init_process_group("nccl", device_id=dev, **kw)
        except TypeError:
            dist.init_process_group("nccl", **kw)
        f = _collective_figures(torch, "cuda", dist, 1, a.small_bytes, a.large_bytes, a)
        try:
            v = torch.cuda.nccl.version()
            nccl = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
        except Exception as e:  # noqa: BLE001 (a figure of the record only)
            nccl = f"? ({e})"
        dist.destroy_process_group()
    finally:
        shutil.rmtree(d, ignore_errors=True)
    algbw = f["large_bytes"] / f["large_median_s"] / 1e9
    _write(
        a.json,
        {
            "measure": "nccl-world1",
            "device": _gpu_name(torch, "cuda"),
            "ranks": 1,
            **f,
            "large_algbw_GBps": algbw,
            "large_busbw_GBps": 0.0,
            "nccl": nccl,
            "mps": _mps(),
            "torch": torch.__version__,
        },
    )
    return 0


# ----------------------------------------------------------------------- gloo


def cmd_gloo(a: argparse.Namespace) -> int:
    """Starts --np copies of this script (gloo-rank) and waits for them."""
    _torch(a.device)  # exit NO_DEVICE here rather than in every rank
    d = tempfile.mkdtemp(prefix="peer-gloo-")
    procs = []
    try:
        for r in range(a.np):
            cmd = [
                sys.executable,
                os.path.abspath(__file__),
                "gloo-rank",
                "--rank",
                str(r),
                "--np",
                str(a.np),
                "--store",
                os.path.join(d, "store"),
                "--device",
                a.device,
                "--iters",
                str(a.iters),
                "--warmup",
                str(a.warmup),
                "--large-iters",
                str(a.large_iters),
                "--small-bytes",
                str(a.small_bytes),
                "--large-bytes",
                str(a.large_bytes),
            ]
            if a.json and r == 0:
                cmd += ["--json", a.json]
            procs.append(subprocess.Popen(cmd))
        deadline = time.monotonic() + a.timeout
        rcs = []
        for p in procs:
            try:
                rcs.append(p.wait(timeout=max(1.0, deadline - time.monotonic())))
            except subprocess.TimeoutExpired:
                print(f"gloo: rank timed out after {a.timeout}s", file=sys.stderr)
                rcs.append(124)
                break
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        shutil.rmtree(d, ignore_errors=True)
    if any(rc == NO_DEVICE for rc in rcs):
        return NO_DEVICE
    bad = [rc for rc in rcs if rc != 0]
    return bad[0] if bad else 0


def cmd_gloo_rank(a: argparse.Namespace) -> int:
    torch = _torch(a.device)
    import torch.distributed as dist

    _dev(torch, a.device)
    dist.init_process_group(
        "gloo", init_method="file://" + a.store, rank=a.rank, world_size=a.np, timeout=timedelta(seconds=60)
    )
    f = _collective_figures(torch, a.device, dist, a.np, a.small_bytes, a.large_bytes, a)
    every = [None] * a.np
    dist.all_gather_object(every, f)
    dist.destroy_process_group()
    if a.rank == 0:
        n = a.np
        large_s = max(e["large_median_s"] for e in every)
        algbw = f["large_bytes"] / large_s / 1e9
        _write(
            a.json,
            {
                "measure": "gloo",
                "device": _gpu_name(torch, a.device),
                "tensors": a.device,
                "ranks": n,
                **f,
                "large_median_s": large_s,
                "small_median_us_per_rank": [e["small_median_us"] for e in every],
                "large_median_s_per_rank": [e["large_median_s"] for e in every],
                "large_algbw_GBps": algbw,
                "large_busbw_GBps": algbw * 2 * (n - 1) / n,
                "mps": _mps(),
                "torch": torch.__version__,
            },
        )
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = ap.add_subparsers(dest="cmd", required=True)

    def common(p: argparse.ArgumentParser, device: bool = True) -> None:
        p.add_argument("--json", help="also write the JSON object to this file")
        if device:
            p.add_argument(
                "--device",
                choices=("cuda", "cpu"),
                default="cuda",
                help="cpu: the same code on CPU tensors, to check the script (default cuda)",
            )

    p = sub.add_parser("copy", help="B: the device-to-device copy rate, read + written")
    common(p)
    p.add_argument("--bytes", type=int, default=1 << 30, help="bytes copied (default 1 GiB)")
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.set_defaults(fn=cmd_copy)

    for name, helptext in (
        ("nccl1", "torch.distributed NCCL, world size 1"),
        ("gloo", "torch.distributed gloo with CUDA tensors, --np ranks on one GPU"),
        ("gloo-rank", "one rank of gloo (started by gloo)"),
    ):
        p = sub.add_parser(name, help=helptext)
        common(p, device=name != "nccl1")
        p.add_argument("--iters", type=int, default=2000, help="timed iterations at --small-bytes")
        p.add_argument("--warmup", type=int, default=200)
        p.add_argument("--large-iters", type=int, default=30, help="timed iterations at --large-bytes")
        p.add_argument("--small-bytes", type=int, default=4096)
        p.add_argument("--large-bytes", type=int, default=64 << 20)
        if name != "nccl1":
            p.add_argument("--np", type=int, default=2)
        if name == "gloo":
            p.add_argument("--timeout", type=float, default=150, help="seconds the ranks may take in all")
        if name == "gloo-rank":
            p.add_argument("--rank", type=int, required=True)
            p.add_argument("--store", required=True)
        p.set_defaults(fn={"nccl1": cmd_nccl1, "gloo": cmd_gloo, "gloo-rank": cmd_gloo_rank}[name])
    a = ap.parse_args(argv)
    return a.fn(a)


if __name__ == "__main__":
    sys.exit(main())
