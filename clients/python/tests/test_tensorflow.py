"""End-to-end tests of hvdd.tensorflow: a real daemon and real TensorFlow
worker processes (see tf_workers.py), in eager mode, inside tf.function and
in TF1 graphs."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest
from conftest import run_batch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", "..", ".."))
TF_WORKERS = os.path.join(HERE, "tf_workers.py")
ENV = {"TF_CPP_MIN_LOG_LEVEL": "2"}


def tf_job(job, scenario: str, mode: str = "eager", np: int = 2, **kw):
    return job.run(scenario, np=np, cmd=[sys.executable, TF_WORKERS, scenario, mode], env=ENV, timeout=180, **kw)


# "eager,function": both modes, one after the other, in one job; a TF1 graph
# disables eager execution for its process, so "graph" is a job of its own.
MODES = ["eager,function", "graph"]

# The scenarios that need no job of their own run in one job per mode and
# rank count (module-scoped fixtures), one after the other: each rank
# imports TensorFlow (about 4 CPU-seconds) once for all of them. A failure
# ends that job; its later scenarios fail as not reached. "errors" goes last:
# it fails collectives on purpose.
BATCHES = {
    "eager,function": "ops,grads,allgather_grads,adasum,tape@eager,errors",
    "graph": "ops,grads,adasum,tf1_optimizer,errors",
}


@pytest.fixture(scope="module")
def batches(hvdd_bin: str):
    """The batch jobs, each run once, when a test first asks for it."""
    done: dict = {}

    def get(mode: str, np: int = 2):
        key = (mode, np)
        if key not in done:
            names = BATCHES[mode] if np == 2 else "ops,adasum"
            done[key] = run_batch(hvdd_bin, [sys.executable, TF_WORKERS, names, mode], np=np, env=ENV)
        return done[key]

    return get


def said_by_all(res, what: str, mode: str) -> bool:
    """Whether every rank printed WHAT for each of MODE's modes."""
    return all(f"{m} {what}" in o for o in res.outputs for m in mode.split(","))


def shown(res) -> str:
    """A batch job's exit codes, outputs' tails and daemon log, for a failure."""
    outs = "".join(
        f"\n--- rank {r} exited {rc}:\n{o[-6000:]}" for r, (rc, o) in enumerate(zip(res.returncodes, res.outputs))
    )
    return outs + f"\n--- daemon log ---\n{res.daemon_log[-3000:]}"


@pytest.mark.parametrize("mode", MODES)
def test_ops(batches, mode):
    res = batches(mode)
    assert said_by_all(res, "ops ok", mode), shown(res)


def test_ops_three_ranks(batches):
    # Eager: three ranks (an odd count, uneven allgathers) test the daemon,
    # the same in every mode; test_ops traces the ops in tf.function.
    res = batches("eager", 3)
    assert said_by_all(res, "ops ok", "eager"), shown(res)


@pytest.mark.parametrize("mode", MODES)
def test_gradients(batches, mode):
    res = batches(mode)
    assert said_by_all(res, "grads ok", mode), shown(res)


def test_allgather_gradient_averaged(batches):
    """allgather's and grouped_allgather's gradients are Horovod 0.28.1's:
    the upstream gradient averaged over the ranks, this rank's rows (not
    summed, which is N times too large), with first dimensions that differ
    per rank; at 2 ranks here, at 4 below."""
    res = batches("eager,function")
    assert said_by_all(res, "allgather grads ok", "eager,function"), shown(res)


def test_allgather_gradient_averaged_four_ranks(job):
    res = tf_job(job, "allgather_grads", "eager,function", np=4)
    assert said_by_all(res, "allgather grads ok", "eager,function"), res.outputs


def test_distributed_gradient_tape(batches):
    res = batches("eager,function")
    assert all("tape ok" in o for o in res.outputs), shown(res)


def test_tf1_distributed_optimizer_and_hook(batches):
    res = batches("graph")
    assert all("tf1 optimizer ok" in o for o in res.outputs), shown(res)


@pytest.mark.parametrize("mode", MODES)
def test_adasum(batches, mode):
    """op=Adasum on 2 ranks: allreduce, DistributedGradientTape and the TF1
    delta optimizer match the Adasum formula; Keras refuses it."""
    res = batches(mode)
    assert said_by_all(res, "adasum ok", mode), shown(res)


def test_adasum_three_ranks_refused(batches):
    res = batches("eager", 3)
    assert all("adasum refused on 3 ranks" in o for o in res.outputs), shown(res)


@pytest.mark.parametrize("mode", MODES)
def test_errors(batches, mode):
    res = batches(mode)
    assert said_by_all(res, "errors ok", mode), shown(res)


@pytest.mark.parametrize("mode", ["eager", "function", "graph"])
def test_killed_rank(job, mode):
    res = tf_job(job, "victim", mode, np=3, expect=lambda r: (-9,) if r == 2 else (0,))
    assert sum("lost rank reported" in o for o in res.outputs) == 2, res.outputs


def _job_stats(daemon_log: str) -> dict:
    line = [l for l in daemon_log.splitlines() if 'msg="job ended"' in l][-1]
    return {k: int(line.split(f" {k}=")[1].split()[0]) for k in ("batches", "responses", "tensors")}


@pytest.mark.parametrize("groups", [0, 2])
def test_gradients_fused_per_step(job, groups):
    # The daemon's counters: a step's six gradients reach it together and run
    # as one batch (one fused response); with two groups, at most two.
    steps = 6
    res = job.run(
        "fusion",
        np=2,
        cmd=[sys.executable, TF_WORKERS, "fusion", "function", str(groups)],
        env={**ENV, "STEPS": str(steps)},
        timeout=180,
    )
    st = _job_stats(res.daemon_log)
    assert st["tensors"] == 6 * steps, st
    if groups == 0:
        assert st["batches"] == steps and st["responses"] == steps, st
    else:
        assert steps <= st["batches"] <= 2 * steps and st["responses"] <= 2 * steps, st


def test_graph_wait_warning(job):
    res = job.run(
        "late_rank",
        np=2,
        cmd=[sys.executable, TF_WORKERS, "late_rank", "graph"],
        env={**ENV, "HVDD_GRAPH_WAIT_WARN": "1"},
    )
    assert "has waited" in res.outputs[0] and "allreduce.late" in res.outputs[0], res.outputs[0]
    assert "has waited" not in res.outputs[1], res.outputs[1]


def test_imports_are_separate():
    # hvdd.tensorflow must not import torch, nor hvdd.torch tensorflow.
    for mod, other in (("hvdd.tensorflow", "torch"), ("hvdd.torch", "tensorflow")):
        code = f"import sys, {mod}; assert {other!r} not in sys.modules, sorted(m for m in sys.modules if m.startswith({other!r}))"
        p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env={**os.environ, **ENV})
        assert p.returncode == 0, p.stderr


def hvdd_run(hvdd_bin, tmp_path, script_args, timeout=240):
    """Runs an example under `hvdd run -np 2` with a daemon of its own (a
    fresh socket); returns rank 0's and rank 1's output lines."""
    env = {**os.environ, **ENV, "HVDD_SOCKET": str(tmp_path / "hvdd.sock")}
    p = subprocess.run(
        [hvdd_bin, "run", "-np", "2", "--", sys.executable, *script_args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=tmp_path,
    )
    out = p.stdout + p.stderr
    assert p.returncode == 0, out
    lines = out.splitlines()
    return [l for l in lines if l.startswith("[0]")], [l for l in lines if l.startswith("[1]")]


def hvdd_run_bounded(hvdd_bin, tmp_path, np, script_args, timeout):
    """Runs `hvdd run -np NP` (a daemon of its own, a fresh socket) in a
    session of its own; past timeout seconds it kills the whole session (the
    launcher, its daemon and workers) and fails: a hang fails, it never
    hangs the suite. Returns the output."""
    env = {**os.environ, **ENV, "HVDD_SOCKET": str(tmp_path / "hvdd.sock")}
    p = subprocess.Popen(
        [hvdd_bin, "run", "-np", str(np), "--", sys.executable, *script_args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        cwd=tmp_path,
        start_new_session=True,
    )
    try:
        out, _ = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, _ = p.communicate()
        pytest.fail(f"hvdd run -np {np} did not end within {timeout} s (a hang):\n{out}")
    assert p.returncode == 0, out
    return out


@pytest.mark.parametrize("np_", [2, 4])
def test_idioms_that_must_not_hang(hvdd_bin, tmp_path, np_):
    """Issue 24: unnamed broadcast_object/allgather_object of objects whose
    type differs per rank, broadcast's gradient (Horovod's average on the
    root), and 16 independent collectives fetched by one TF1 Session.run and
    run by one tf.function, with 2 inter-op threads: one job runs them all
    (tf_workers.idioms)."""
    out = hvdd_run_bounded(hvdd_bin, tmp_path, np_, [TF_WORKERS, "idioms"], timeout=300)
    assert out.count("idioms ok") == np_, out


def test_example_tensorflow2_mnist(hvdd_bin, tmp_path):
    script = os.path.join(ROOT, "examples", "tensorflow2_mnist.py")
    ckpt = tmp_path / "ckpt"
    r0, r1 = hvdd_run(
        hvdd_bin,
        tmp_path,
        # Seeded (Keras's seed too, and deterministic ops: every run the
        # same; before, Keras 3's initial weights were unseeded, and run 9 of
        # the test command saw the plateau last until the last steps), at half
        # the default learning rate: the loss leaves the synthetic data's
        # plateau at 2.30 after about 60 of a rank's 120 steps, ends near 1.13.
        [script, "--steps", "240", "--synthetic-size", "2000", "--checkpoint-dir", str(ckpt), "--seed", "0"]
        + ["--lr", "0.0005"],
    )
    losses = [float(l.split("Loss:")[1]) for l in r0 if "Loss:" in l]
    assert len(losses) == 12 and min(losses[-3:]) < losses[0] - 0.5, r0
    assert os.path.exists(ckpt / "checkpoint"), os.listdir(tmp_path)


def test_example_tensorflow_mnist(hvdd_bin, tmp_path):
    script = os.path.join(ROOT, "examples", "tensorflow_mnist.py")
    ckpt = tmp_path / "ckpt"
    # Seeded (the graph's seed and each rank's batches): with seed 1 the
    # loss leaves the synthetic data's 2.30 plateau after about 40 of a
    # rank's 100 steps and ends near 0.44, the same on every run; unseeded
    # it sometimes stayed on the plateau all along.
    r0, r1 = hvdd_run(
        hvdd_bin,
        tmp_path,
        [script, "--steps", "200", "--synthetic-size", "2000", "--checkpoint-dir", str(ckpt), "--seed", "1"],
    )
    losses = [float(l.split("loss = ")[1].split(",")[0]) for l in r0 if "loss = " in l]
    assert len(losses) == 10 and min(losses[-3:]) < losses[0] - 0.5, r0
    # Checkpoints on rank 0 only: the only checkpoint directory is rank 0's.
    assert os.path.exists(ckpt / "checkpoint"), os.listdir(tmp_path)


def test_example_tensorflow2_synthetic_benchmark(hvdd_bin, tmp_path):
    script = os.path.join(ROOT, "examples", "tensorflow2_synthetic_benchmark.py")
    args = ["--model", "MobileNetV2", "--image-size", "32", "--batch-size", "8", "--num-classes", "10"]
    args += ["--num-warmup-batches", "1", "--num-batches-per-iter", "2", "--num-iters", "2"]
    r0, r1 = hvdd_run(hvdd_bin, tmp_path, [script, *args])
    assert any("Img/sec per rank:" in l for l in r0), r0
    assert not any("Img/sec" in l for l in r1), r1
