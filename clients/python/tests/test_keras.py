"""End-to-end tests of hvdd.tensorflow.keras / hvdd.keras: a real daemon and
real worker processes running the scenarios of keras_workers.py."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
from conftest import run_batch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", "..", ".."))
KERAS_WORKERS = os.path.join(HERE, "keras_workers.py")
ENV = {"TF_CPP_MIN_LOG_LEVEL": "2"}


def run(job, scenario: str, np: int = 2, env: dict | None = None, timeout: float = 240):
    return job.run(
        scenario, np=np, cmd=[sys.executable, KERAS_WORKERS, scenario], env={**ENV, **(env or {})}, timeout=timeout
    )


def result(res, scenario: str) -> dict:
    """The RESULT line rank 0 printed in scenario."""
    lines = res.outputs[0].splitlines()
    start = lines.index(f"BEGIN {scenario}") if f"BEGIN {scenario}" in lines else len(lines)
    for line in lines[start:]:
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT ") :])
        if line.startswith("SCENARIO "):
            break
    raise AssertionError(f"no RESULT line in {scenario}:\n" + res.outputs[0][-6000:])


# The scenarios that need no process of their own (no environment of their
# own, no failure on purpose) run in one 2-rank job, one after the other:
# each rank imports TensorFlow once instead of once per scenario. Each test
# checks its scenario's "SCENARIO NAME OK" line on every rank; a failure
# ends the job, and the scenarios after it fail as not reached.
BATCH = [
    "optimizer",
    "aggregation",
    "sparse",
    "compression",
    "broadcast",
    "metric_average",
    "lr_schedule",
    "lr_warmup",
    "checkpoint",
    "load_model",
    "keras_package",
]


@pytest.fixture(scope="module")
def batch(hvdd_bin: str):
    return run_batch(hvdd_bin, [sys.executable, KERAS_WORKERS, ",".join(BATCH)], env=ENV)


def passed(res, scenario: str):
    """Asserts that every rank of the batch job finished scenario."""
    for r, out in enumerate(res.outputs):
        assert f"SCENARIO {scenario} OK" in out.splitlines(), (
            f"rank {r} (exit {res.returncodes[r]}) did not finish {scenario}:\n{out[-8000:]}\n"
            f"--- daemon log ---\n{res.daemon_log[-4000:]}"
        )
    return res


def test_import_does_not_import_torch():
    code = "import sys, hvdd.tensorflow.keras, hvdd.keras; assert 'torch' not in sys.modules, 'torch imported'"
    p = subprocess.run([sys.executable, "-c", code], env={**os.environ, **ENV}, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr[-3000:]


def test_distributed_optimizer_matches_reference(batch):
    # model.fit on 2 ranks == plain Keras on both ranks' batches; also
    # predivide, groups, op=Sum, a custom apply_gradients loop, argument checks.
    passed(batch, "optimizer")


def test_backward_passes_per_step(batch):
    passed(batch, "aggregation")


def test_sparse_gradients(batch):
    # Embedding: IndexedSlices (allgather) and sparse_as_dense (allreduce).
    passed(batch, "sparse")


def test_fp16_compression(batch):
    passed(batch, "compression")


def test_broadcast_callback_and_value_helpers(batch):
    passed(batch, "broadcast")


def test_metric_average_callback(batch):
    passed(batch, "metric_average")


def test_learning_rate_schedule_callback(batch):
    out = result(passed(batch, "lr_schedule"), "lr_schedule")
    steps = 4
    # staircase: compile lr 0.3 until start_epoch=1, then 0.1 * 0.5**(epoch-1)
    # until end_epoch=3 (exclusive), then unchanged; momentum 0.9 scaled by
    # new/old lr for the first batch of an adjusted epoch only.
    want_lr, want_mom = [], []
    lr = 0.3
    for epoch in range(4):
        for batch in range(steps):
            mom = 0.9
            if 1 <= epoch < 3 and batch == 0:
                new = 0.1 * 0.5 ** (epoch - 1)
                mom = 0.9 * new / lr
                lr = new
            want_lr.append(lr)
            want_mom.append(mom)
    got = out["staircase"]
    assert [b for b, _, _ in got] == list(range(steps)) * 4
    assert [pytest.approx(x, rel=1e-6) for x in want_lr] == [x for _, x, _ in got]
    assert [pytest.approx(x, rel=1e-6) for x in want_mom] == [x for _, _, x in got]
    assert out["staircase_logs"] == [pytest.approx(x, rel=1e-6) for x in (0.3, 0.1, 0.05, 0.05)]
    # smooth: lr = 0.2 * 1 / (1 + epoch + batch / steps) at every batch.
    want = [0.2 / (1 + e + b / steps) for e in range(2) for b in range(steps)]
    assert [x for _, x, _ in out["smooth"]] == [pytest.approx(x, rel=1e-6) for x in want]


def test_learning_rate_warmup_callback(batch):
    res = passed(batch, "lr_warmup")
    out = result(res, "lr_warmup")
    size, steps, warmup, lr0 = 2, 4, 2, 0.2
    want = []
    for e in range(3):
        for b in range(steps):
            if e < warmup:
                epoch = e + b / steps + 1 / steps
                want.append(lr0 / size * (epoch * (size - 1) / warmup + 1))
            else:
                want.append(want[-1])
    assert [x for _, x, _ in out["batches"]] == [pytest.approx(x, rel=1e-6) for x in want]
    assert want[warmup * steps - 1] == pytest.approx(lr0)
    # momentum correction: 0.5 * new / old for the adjusted batch
    old = [lr0] + want[:-1]
    want_mom = [0.5 * n / o if i < warmup * steps else 0.5 for i, (n, o) in enumerate(zip(want, old))]
    assert [x for _, _, x in out["batches"]] == [pytest.approx(x, rel=1e-6) for x in want_mom]
    assert out["logs"] == [pytest.approx(x, rel=1e-6) for x in (want[3], want[7], want[11])]
    assert "Epoch 2: finished gradual learning rate warmup to 0.2." in res.outputs[0]
    assert "finished gradual" not in res.outputs[1]


def test_best_model_checkpoint(batch):
    passed(batch, "checkpoint")


def test_load_model(batch):
    passed(batch, "load_model")


def test_legacy_tf_keras(job):
    run(job, "legacy", env={"TF_USE_LEGACY_KERAS": "1"})


def test_mismatched_models_raise_on_every_rank(job):
    res = run(job, "mismatch")
    for out in res.outputs:
        assert "ERROR HvddInternalError: Mismatched ALLREDUCE tensor shapes" in out, out


def test_killed_rank_during_fit(job):
    res = job.run(
        "victim",
        np=3,
        cmd=[sys.executable, KERAS_WORKERS, "victim"],
        env=ENV,
        timeout=240,
        expect=lambda r: (-9,) if r == 2 else (0,),
    )
    assert sum("LOST " in o for o in res.outputs) == 2, res.outputs


def test_keras_package(batch):
    passed(batch, "keras_package")


def test_elastic(job):
    run(job, "elastic", env={"HOROVOD_ELASTIC": "1"})


def test_mnist_example(hvdd_bin, tmp_path):
    tmp = str(tmp_path)
    sock = os.path.join(tmp, "hvdd.sock")
    cmd = [
        hvdd_bin,
        "run",
        "-np",
        "2",
        "--socket",
        sock,
        "--",
        sys.executable,
        os.path.join(ROOT, "examples", "tensorflow2_keras_mnist.py"),
        "--epochs",
        "2",
        "--steps",
        "120",
        "--batch-size",
        "128",
        "--lr",
        "0.002",
        "--warmup-epochs",
        "1",
        "--synthetic-size",
        "2000",
        "--checkpoint-dir",
        os.path.join(tmp, "ckpt"),
    ]
    env = {**os.environ, **ENV, "HOME": tmp}  # no cached MNIST: the synthetic stand-in
    p = subprocess.run(cmd, env=env, cwd=tmp, capture_output=True, text=True, timeout=400)
    out = p.stdout + p.stderr
    assert p.returncode == 0, out[-6000:]
    assert "MNIST: synthetic stand-in" in out, out[-3000:]
    m = re.search(r"loss (\d+\.\d+) -> (\d+\.\d+)", out)
    assert m, out[-3000:]
    first, last = float(m.group(1)), float(m.group(2))
    assert last < 0.9 * first, (first, last)
    assert sorted(os.listdir(os.path.join(tmp, "ckpt"))) == ["checkpoint-1.keras", "checkpoint-2.keras"]
