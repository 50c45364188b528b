#!/usr/bin/env python3
"""Elastic recovery time on one node: from a worker's SIGKILL to the first
training step the survivors complete at the new size (detection, the
survivors' restore and reset, the daemon re-forming the job, the state sync
from rank 0 and one step's allreduce included).

Each run is ``hvdd run -np N --min-np N-1`` of tests/elastic_job_worker.py
on a private daemon: the last rank kills itself at step 3, and the survivors
print when their step 3 completed at the new size. The recovery of a run is
the latest survivor's time minus the kill's.

Usage (from the repository root, after ``go build -o bin/hvdd ./cmd/hvdd``)::

    .venv/bin/python clients/python/bench/elastic_recovery.py [--runs 5] [--np 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", "..", ".."))
WORKER = os.path.join(ROOT, "clients", "python", "tests", "elastic_job_worker.py")


def one_run(hvdd: str, np: int) -> float:
    with tempfile.TemporaryDirectory(prefix="hvdd-elastic-bench-") as tmp:
        env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
        p = subprocess.run(
            [hvdd, "run", "-np", str(np), "--min-np", str(np - 1), "--socket", os.path.join(tmp, "hvdd.sock"), "--",
             sys.executable, WORKER, "6", "3"],
            env=env, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        if p.returncode != 0:
            raise SystemExit(f"elastic run failed ({p.returncode}):\n{p.stdout}\n{p.stderr}")
        kill = [float(l.split("KILL ")[1]) for l in p.stdout.splitlines() if "KILL " in l]
        rec = [float(l.split("RECOVERED ")[1].split()[0]) for l in p.stdout.splitlines() if "RECOVERED " in l]
        if len(kill) != 1 or len(rec) != np - 1:
            raise SystemExit(f"unexpected output:\n{p.stdout}")
        return max(rec) - kill[0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=5, help="elastic jobs to run")
    ap.add_argument("--np", type=int, default=3, help="ranks at the start (one is killed)")
    ap.add_argument("--hvdd", default=os.path.join(ROOT, "bin", "hvdd"), help="hvdd binary")
    a = ap.parse_args()
    times = []
    for i in range(a.runs):
        t = one_run(a.hvdd, a.np)
        times.append(t)
        print(f"run {i + 1}: recovery {t * 1000:.0f} ms", flush=True)
    print(f"median recovery {statistics.median(times) * 1000:.0f} ms over {a.runs} runs (np {a.np} -> {a.np - 1})")


if __name__ == "__main__":
    main()
