"""Autotuning as Horovod users turn it on: `hvdd run --autotune` (horovodrun's
flags) and HOROVOD_AUTOTUNE=1 in the ranks' environment with a daemon that
was started without it. The job trains through hvdd.torch while the daemon
tunes; the CSV log lists every configuration scored and the best last."""

from __future__ import annotations

import csv
import os
import subprocess
import sys

import pytest

from conftest import ROOT

BENCH = os.path.join(ROOT, "examples", "pytorch_synthetic_benchmark.py")
# A short run: 2 + 6*5 = 32 steps, about twice the 15 that 3 configurations
# of one step per sample need (5 samples each, no warm-up). (With 3
# iterations, 17 steps, a loaded CI machine once ended the job after two
# configurations.)
ARGS = ["--num-iters", "6", "--width", "8", "--image-size", "32", "--batch-size", "4"]
KNOBS = ["fusion_threshold_mb", "cycle_time_ms", "spin_us"]


def _check_log(path: str, samples: int, knobs: list[str]) -> None:
    with open(path) as f:
        rows = list(csv.reader(f))
    assert rows[0] == knobs + ["score"], rows[0]
    body = [[float(v) for v in r] for r in rows[1:]]
    assert len(body) == samples + 1, rows  # each configuration, then the best
    assert all(r[-1] > 0 for r in body), rows
    assert body[-1] == max(body[:-1], key=lambda r: r[-1]), rows


@pytest.mark.parametrize("how", ["hvdd run --autotune", "HOROVOD_AUTOTUNE in the environment"])
def test_autotune_trains(hvdd_bin, tmp_path, how):
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", "HVDD_SOCKET": str(tmp_path / "hvdd.sock")}
    for k in list(env):
        if k.startswith("HOROVOD_AUTOTUNE"):
            del env[k]
    details = {"warmup-samples": "0", "steps-per-sample": "1", "bayes-opt-max-samples": "3"}
    cmd = [hvdd_bin, "run", "-np", "2"]
    if how.startswith("hvdd run"):
        # A relative log path: hvdd run makes it absolute for the daemon.
        cmd += ["--autotune", "--autotune-log-file", "tune.csv"]
        cmd += [a for k, v in details.items() for a in (f"--autotune-{k}", v)]
    else:
        # The node's daemon runs already, without autotuning, in another
        # directory (a service): rank 0's variables turn it on for the job,
        # and its client makes the log's relative path absolute.
        elsewhere = tmp_path / "daemon"
        elsewhere.mkdir()
        daemon = subprocess.Popen(
            [hvdd_bin, "serve", "--slots", "2", "--socket", env["HVDD_SOCKET"], "--log-level", "info"],
            env=dict(env),
            cwd=elsewhere,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert daemon.stderr is not None
        for line in daemon.stderr:  # until it listens; EOF if it exits
            if "hvdd daemon listening" in line:
                break
        env["HOROVOD_AUTOTUNE"] = "1"
        env["HOROVOD_AUTOTUNE_LOG"] = "tune.csv"
        for k, v in details.items():
            env["HOROVOD_AUTOTUNE_" + k.upper().replace("-", "_")] = v
    try:
        p = subprocess.run(
            cmd + ["--", sys.executable, BENCH] + ARGS,
            capture_output=True,
            text=True,
            timeout=300,
            env=env,
            cwd=tmp_path,
        )
    finally:
        if not how.startswith("hvdd run"):
            daemon.terminate()
            _, daemon_log = daemon.communicate(timeout=30)
            assert "autotune: done" in daemon_log, daemon_log
    out = p.stdout + p.stderr
    assert p.returncode == 0, out
    assert "Img/sec per rank" in out or "img/sec per rank" in out.lower(), out
    _check_log(str(tmp_path / "tune.csv"), 3, KNOBS)
