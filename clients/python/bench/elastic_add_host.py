#!/usr/bin/env python3
"""Elastic growth time: from the host discovery script listing a new host
to the first training step completed on it with the others (hvdd run's
discovery interval, the new host's daemon and worker starting, Python and
torch importing, the worker waiting in init(), rank 0's notification, the
commit at which every rank resets, the next epoch forming across both hosts
with its data engine, the state sync from rank 0 and one step's allreduce).

Each run is ``hvdd run -np 2 --min-np 2 --max-np 3
--host-discovery-script`` of tests/elastic_join_worker.py on two "hosts"
(daemons on 127.0.0.2 and 127.0.0.3, this machine's loopback addresses):
the script first lists 127.0.0.2:2; once rank 0 trains, the bench adds
127.0.0.3:1 to the file the script prints, and the figure of the run is the
latest rank's first step at size 3 minus that moment.

Usage (from the repository root, after ``go build -o bin/hvdd ./cmd/hvdd``)::

    .venv/bin/python clients/python/bench/elastic_add_host.py [--runs 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", "..", ".."))
WORKER = os.path.join(ROOT, "clients", "python", "tests", "elastic_join_worker.py")


def one_run(hvdd: str) -> float:
    with tempfile.TemporaryDirectory(prefix="hvdd-add-host-bench-") as tmp:
        hosts = os.path.join(tmp, "hosts")
        with open(hosts, "w") as f:
            f.write("127.0.0.2:2\n")
        script = os.path.join(tmp, "discover.sh")
        with open(script, "w") as f:
            f.write(f"#!/bin/sh\ncat {hosts}\n")
        os.chmod(script, 0o755)
        env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
        cmd = [hvdd, "run", "-np", "2", "--min-np", "2", "--max-np", "3", "--host-discovery-script", script, "--",
               sys.executable, WORKER, "3", "5"]  # fmt: skip
        p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=tmp)
        lines = []
        added = 0.0
        assert p.stdout is not None
        for line in p.stdout:
            lines.append(line)
            if not added and "<stdout>:TRAINING" in line:
                with open(hosts + ".new", "w") as f:
                    f.write("127.0.0.2:2\n127.0.0.3:1\n")
                added = time.time()
                os.replace(hosts + ".new", hosts)
        p.wait(timeout=300)
        out = "".join(lines)
        grew = [float(l.split("GREW ")[1].split()[0]) for l in lines if "GREW " in l]
        if p.returncode != 0 or not added or len(grew) != 3:
            raise SystemExit(f"elastic run failed ({p.returncode}):\n{out}")
        return max(grew) - added


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=5, help="elastic jobs to run")
    ap.add_argument("--hvdd", default=os.path.join(ROOT, "bin", "hvdd"), help="hvdd binary")
    a = ap.parse_args()
    times = []
    for i in range(a.runs):
        t = one_run(a.hvdd)
        times.append(t)
        print(f"run {i + 1}: host added to first step on it {t * 1000:.0f} ms", flush=True)
    print(f"median {statistics.median(times) * 1000:.0f} ms over {a.runs} runs (2 ranks on one host -> 3 on two)")


if __name__ == "__main__":
    main()
