"""Elastic training that grows: a worker started while an elastic PyTorch
job runs on a real daemon waits in ``init()``; the daemon notifies rank 0,
every rank raises ``HostsUpdatedInterrupt`` at the same commit and resets,
the next epoch takes the new worker in after the old ranks, and it receives
rank 0's state in ``state.sync()``."""

from __future__ import annotations

import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "elastic_join_worker.py")


def test_worker_joins_running_job(hvdd_bin, tmp_path):
    sock = str(tmp_path / "hvdd.sock")
    daemon = subprocess.Popen([hvdd_bin, "serve", "--slots", "2", "--socket", sock], stderr=subprocess.PIPE, text=True)
    procs = []
    try:
        env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", HOROVOD_ELASTIC="1", HVDD_SOCKET=sock)

        def start(local_rank: int) -> subprocess.Popen:
            e = dict(env, HVDD_LOCAL_RANK=str(local_rank))
            return subprocess.Popen(
                [sys.executable, WORKER, "3", "5"], env=e, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
            )

        procs = [start(0), start(1)]
        first = procs[0].stdout
        assert first is not None
        seen = []
        for line in first:
            seen.append(line)
            if line.startswith("TRAINING"):
                break
        assert seen and seen[-1].startswith("TRAINING"), "".join(seen)
        procs.append(start(-1))
        outs = []
        for i, p in enumerate(procs):
            out, _ = p.communicate(timeout=120)
            out = ("".join(seen) if i == 0 else "") + out
            outs.append(out)
            assert p.returncode == 0, out
        results = [
            json.loads(l.split("RESULT ", 1)[1]) for o in outs for l in o.splitlines() if l.startswith("RESULT ")
        ]
        assert sorted(r["rank"] for r in results) == [0, 1, 2], outs
        assert all(r["size"] == 3 for r in results), results
        # The old ranks reset once, into the grown job; the joiner never did.
        assert [r["resets"] for r in results[:2]] == [[3], [3]] and results[2]["resets"] == [], results
        # The joiner synced rank 0's state: everyone ends on the same step
        # and the same weights.
        assert len({r["step"] for r in results}) == 1, results
        w0 = results[0]["w"]
        for r in results[1:]:
            assert max(abs(a - b) for a, b in zip(r["w"], w0)) < 1e-12, results
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        daemon.terminate()
        daemon.wait(timeout=10)
