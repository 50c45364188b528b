"""The elastic Keras MNIST example (examples/tensorflow2_keras_mnist_elastic.py,
Horovod's with only its import changed) end to end: as a plain job, and as an
elastic job under ``hvdd run --min-np`` that loses a worker to SIGKILL in its
first epoch and finishes on the survivors."""

from __future__ import annotations

import os
import re
import subprocess
import sys

from elastic_helpers import run_acting, run_killing

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", "..", ".."))
SCRIPT = os.path.join(ROOT, "examples", "tensorflow2_keras_mnist_elastic.py")

# Rank 0's line at the end of an epoch (state.epoch counts across resets).
EPOCH = re.compile(r"^\[0\]<stdout>:Epoch (\d+): loss=(\d+\.\d+) accuracy=\S+ \((\d+) ranks\)$", re.M)


def _cmd(hvdd_bin: str, tmp, np: int, *extra: str) -> list:
    return [
        hvdd_bin, "run", "-np", str(np), *extra, "--socket", str(tmp / "hvdd.sock"), "--",
        sys.executable, SCRIPT, "--epochs", "2", "--steps", "160", "--batch-size", "32", "--lr", "0.0005",
        "--synthetic-size", "2048", "--log-interval", "5", "--checkpoint-dir", str(tmp / "ckpt"),
    ]  # fmt: skip


def _env(tmp) -> dict:
    # HOME: no cached MNIST, so the synthetic stand-in.
    return dict(
        os.environ,
        HOME=str(tmp),
        PYTHONUNBUFFERED="1",
        OMP_NUM_THREADS="1",
        TF_CPP_MIN_LOG_LEVEL="2",
        HVDD_START_TIMEOUT="60",
    )


def _epochs(out: str) -> list:
    """[(epoch, loss, ranks)] from rank 0's epoch lines."""
    return [(int(e), float(loss), int(n)) for e, loss, n in EPOCH.findall(out)]


def test_example_plain_job(hvdd_bin, tmp_path):
    p = subprocess.run(
        _cmd(hvdd_bin, tmp_path, 2), env=_env(tmp_path), cwd=str(tmp_path), capture_output=True, text=True, timeout=240
    )
    out = p.stdout + p.stderr
    assert p.returncode == 0, out[-6000:]
    assert "MNIST: synthetic stand-in" in out, out[-3000:]
    epochs = _epochs(out)
    assert [(e, n) for e, _, n in epochs] == [(1, 2), (2, 2)], out[-3000:]
    assert epochs[1][1] < 0.95 * epochs[0][1], epochs
    assert "done: 2 epochs on 2 ranks" in out, out[-3000:]
    assert sorted(os.listdir(tmp_path / "ckpt")) == ["checkpoint-1.keras", "checkpoint-2.keras"]


def test_example_survives_kill(hvdd_bin, tmp_path):
    # Rank 2 is killed with SIGKILL once rank 0 has logged two loss lines of
    # the first epoch; the survivors restore their last commit, re-form as 2
    # ranks and finish both epochs.
    rc, out, killed = run_killing(
        _cmd(hvdd_bin, tmp_path, 3, "--min-np", "2"),
        _env(tmp_path),
        str(tmp_path),
        lambda lines: sum(l.startswith("[0]<stdout>:Train Epoch: 1 ") for l in lines) == 2,
        2,
        240,
    )
    assert killed, out[-6000:]
    assert rc == 0, out[-6000:]
    assert "rank 2 (pid" in out and "was killed by SIGKILL; the elastic job goes on with 2 ranks" in out, out[-6000:]
    # Both epochs end on the 2 survivors, the first from its last commit.
    epochs = _epochs(out)
    assert [(e, n) for e, _, n in epochs] == [(1, 2), (2, 2)], out[-6000:]
    assert epochs[1][1] < epochs[0][1], epochs
    assert "done: 2 epochs on 2 ranks" in out, out[-6000:]
    assert sorted(os.listdir(tmp_path / "ckpt")) == ["checkpoint-1.keras", "checkpoint-2.keras"]


def test_example_grows_by_a_host(hvdd_bin, tmp_path):
    # Under hvdd run's elastic driver with a host discovery script: one host
    # (127.0.0.4, 2 slots) at first; once rank 0 trains, a second host
    # (127.0.0.5, 1 slot) appears. Its worker waits in init(), the running
    # ranks raise HostsUpdatedInterrupt at a commit (CommitStateCallback),
    # and the later epochs run on 3 ranks.
    hosts = tmp_path / "hosts"
    hosts.write_text("127.0.0.4:2\n")
    discover = tmp_path / "discover.sh"
    discover.write_text(f"#!/bin/sh\ncat {hosts}\n")
    discover.chmod(0o755)
    cmd = _cmd(hvdd_bin, tmp_path, 2, "--max-np", "3", "--host-discovery-script", str(discover))
    i = cmd.index("--socket")
    del cmd[i : i + 2]
    cmd[cmd.index("--epochs") + 1] = "3"

    def add_host(_: int) -> None:
        (tmp_path / "hosts.new").write_text("127.0.0.4:2\n127.0.0.5:1\n")
        os.replace(tmp_path / "hosts.new", hosts)

    rc, out, added = run_acting(
        cmd,
        _env(tmp_path),
        str(tmp_path),
        lambda lines: any(l.startswith("[0]<stdout>:Train Epoch: 1 ") for l in lines),
        add_host,
        300,
    )
    assert added, out[-6000:]
    assert rc == 0, out[-6000:]
    epochs = _epochs(out)
    assert [e for e, _, _ in epochs] == [1, 2, 3] and epochs[-1][2] == 3, out[-6000:]
