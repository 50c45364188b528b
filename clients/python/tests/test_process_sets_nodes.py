"""Process sets across nodes with hvdd.torch: the process_sets scenario of
workers.py (static sets from init, every collective in a set against
references over its members, errors, dynamic add/remove) under hvdd run over
two "hosts" (two loopback addresses of this machine: a daemon per host, the
tcp engine between them)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from conftest import WORKERS


@pytest.mark.parametrize(
    "hosts",
    [
        # Sets [0, 2] and [1, 2, 3] both span the two nodes.
        "127.0.0.1:2,127.0.0.2:2",
        # [0, 2] spans them; [1, 2, 3] lies on the second node only.
        "127.0.0.1:1,127.0.0.2:3",
    ],
)
def test_process_sets_across_nodes(hvdd_bin, tmp_path, hosts):
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", HVDD_START_TIMEOUT="60")
    p = subprocess.run(
        [hvdd_bin, "run", "-np", "4", "-H", hosts, "--", sys.executable, WORKERS, "process_sets"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    out = p.stdout + p.stderr
    assert p.returncode == 0, out
    for r in range(4):
        assert f"[{r}]<stdout>:OK" in out, out
