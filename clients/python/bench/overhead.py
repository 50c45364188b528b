#!/usr/bin/env python3
"""Per-op overhead of the Python client: the median latency of N 4-byte
allreduces through ``hvdd.torch`` on 2 ranks, next to the same through the Go
client (bench/goclient) when Go is available. The difference is what the Python
client adds per op.

Usage (from the repository root, after ``go build -o bin/hvdd ./cmd/hvdd``)::

    .venv/bin/python clients/python/bench/overhead.py [-n 5000] [--np 2]

It starts its own daemon on a temporary socket. As a worker (under ``hvdd run``
or with HVDD_SOCKET set) use ``--worker``; with HVDD_BENCH_IMPL=horovod the
worker measures horovod.torch instead (under horovodrun, see bench/horovod/).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from types import ModuleType

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", "..", ".."))


def import_hvd() -> ModuleType:
    """hvdd.torch, or horovod.torch when HVDD_BENCH_IMPL=horovod (bench/horovod/run.sh)."""
    impl = os.environ.get("HVDD_BENCH_IMPL", "hvdd")
    if impl == "horovod":
        import horovod.torch as hvd
    elif impl == "hvdd":
        import hvdd.torch as hvd
    else:
        raise SystemExit(f"HVDD_BENCH_IMPL must be hvdd or horovod, not {impl!r}")
    return hvd


def worker(n: int, warmup: int) -> None:
    import torch

    hvd = import_hvd()

    hvd.init()
    t = torch.ones(1, dtype=torch.float32)
    lat = []
    for i in range(warmup + n):
        t0 = time.perf_counter()
        hvd.allreduce_(t, name="bench", op=hvd.Sum)
        if i >= warmup:
            lat.append((time.perf_counter() - t0) * 1e6)
    # Also the out-of-place, autograd-wrapped form most scripts use.
    lat2 = []
    for i in range(n):
        t0 = time.perf_counter()
        hvd.allreduce(t, name="bench2", op=hvd.Sum)
        lat2.append((time.perf_counter() - t0) * 1e6)
    if hvd.rank() == 0:
        sys.stdout.write(
            f"python median_us={statistics.median(lat):.1f} (allreduce_) "
            f"{statistics.median(lat2):.1f} (allreduce) n={n}\n"
        )
    hvd.shutdown()


def tf_worker(n: int, warmup: int) -> None:
    """The same blocking 4-byte allreduce through hvdd.tensorflow, eagerly."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    import hvdd.tensorflow as hvd

    hvd.init()
    t = tf.ones([1], dtype=tf.float32)
    lat = []
    for i in range(warmup + n):
        t0 = time.perf_counter()
        hvd.allreduce(t, name="bench", op=hvd.Sum)
        if i >= warmup:
            lat.append((time.perf_counter() - t0) * 1e6)
    # A variable: one read more.
    v = tf.Variable(t)
    lat_v = []
    for i in range(n):
        t0 = time.perf_counter()
        hvd.allreduce(v, name="bench_var", op=hvd.Sum)
        lat_v.append((time.perf_counter() - t0) * 1e6)
    if hvd.rank() == 0:
        sys.stdout.write(
            f"tensorflow median_us={statistics.median(lat):.1f} (eager allreduce) "
            f"{statistics.median(lat_v):.1f} (of a tf.Variable) n={n}\n"
        )
    hvd.shutdown()


def run_job(np_: int, cmd: list[str], sock: str, env_extra: dict[str, str]) -> str:
    procs = []
    for r in range(np_):
        env = dict(os.environ, HVDD_SOCKET=sock, HVDD_LOCAL_RANK=str(r), HVDD_RANK=str(r), HVDD_SIZE=str(np_))
        env.update(env_extra)
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, text=True))
    out = ""
    for p in procs:
        o, _ = p.communicate(timeout=300)
        if p.returncode != 0:
            raise SystemExit(f"worker failed ({p.returncode}): {' '.join(cmd)}")
        out += o
    return out.strip()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-n", type=int, default=5000, help="timed allreduces per run")
    ap.add_argument("--warmup", type=int, default=500)
    ap.add_argument("--np", type=int, default=2, help="ranks")
    ap.add_argument("--hvdd", default=os.path.join(ROOT, "bin", "hvdd"), help="daemon binary")
    ap.add_argument("--worker", action="store_true", help="run as one rank (internal)")
    ap.add_argument("--tf-worker", action="store_true", help="run as one TensorFlow rank (internal)")
    ap.add_argument(
        "--tf",
        type=int,
        default=0,
        metavar="ROUNDS",
        help="also time hvdd.tensorflow's eager allreduce: ROUNDS alternated torch/TF runs, with their ratios",
    )
    args = ap.parse_args()
    if args.worker:
        worker(args.n, args.warmup)
        return
    if args.tf_worker:
        tf_worker(args.n, args.warmup)
        return

    tmp = tempfile.mkdtemp(prefix="hvdd-bench-")
    sock = os.path.join(tmp, "hvdd.sock")
    daemon = subprocess.Popen(
        [args.hvdd, "serve", "--slots", str(args.np), "--socket", sock, "--log-level", "warning"],
    )
    try:
        py = run_job(
            args.np,
            [sys.executable, os.path.abspath(__file__), "--worker", "-n", str(args.n), "--warmup", str(args.warmup)],
            sock,
            {},
        )
        print(py)
        me = [sys.executable, os.path.abspath(__file__), "-n", str(args.n), "--warmup", str(args.warmup)]
        for rnd in range(args.tf):
            torch_out = py if rnd == 0 else run_job(args.np, me + ["--worker"], sock, {})
            tf_out = run_job(args.np, me + ["--tf-worker"], sock, {})
            # The same call: torch's out-of-place hvd.allreduce (the second median).
            t_us = float(torch_out.split("(allreduce_) ")[1].split()[0])
            f_us = float(tf_out.split("median_us=")[1].split()[0])
            if rnd:
                print(torch_out)
            print(tf_out)
            print(f"round {rnd + 1}: tf/torch allreduce = {f_us / t_us:.2f} ({f_us:.1f} / {t_us:.1f} us, medians)")
        gobin = None
        if shutil.which("go"):
            gobin = os.path.join(tmp, "goclient")
            subprocess.run(
                ["go", "build", "-o", gobin, "."],
                cwd=os.path.join(HERE, "goclient"),
                check=True,
                env=dict(os.environ, GOFLAGS="-mod=mod"),
            )
        if gobin:
            go = run_job(args.np, [gobin, "-n", str(args.n), "-warmup", str(args.warmup)], sock, {})
            print(go)
            p = float(py.split("median_us=")[1].split()[0])
            g = float(go.split("median_us=")[1].split()[0])
            print(f"overhead_us={p - g:.1f} (python allreduce_ minus go Allreduce, medians)")
    finally:
        daemon.terminate()
        daemon.wait()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
