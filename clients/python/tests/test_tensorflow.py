"""End-to-end tests of hvdd.tensorflow: a real daemon and real TensorFlow
worker processes (see tf_workers.py), in eager mode, inside tf.function and
in TF1 graphs."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", "..", ".."))
TF_WORKERS = os.path.join(HERE, "tf_workers.py")
ENV = {"TF_CPP_MIN_LOG_LEVEL": "2"}

pytest.importorskip("tensorflow", reason="hvdd.tensorflow needs TensorFlow: scripts/setup.sh installs it")


def tf_job(job, scenario: str, mode: str = "eager", np: int = 2, **kw):
    return job.run(scenario, np=np, cmd=[sys.executable, TF_WORKERS, scenario, mode], env=ENV, timeout=180, **kw)


@pytest.mark.parametrize("mode", ["eager", "function", "graph"])
def test_ops(job, mode):
    res = tf_job(job, "ops", mode)
    assert all(f"{mode} ops ok" in o for o in res.outputs), res.outputs


def test_ops_three_ranks(job):
    tf_job(job, "ops", "function", np=3)


@pytest.mark.parametrize("mode", ["eager", "function", "graph"])
def test_gradients(job, mode):
    tf_job(job, "grads", mode)


def test_distributed_gradient_tape(job):
    tf_job(job, "tape")


def test_tf1_distributed_optimizer_and_hook(job):
    tf_job(job, "tf1_optimizer", "graph")


@pytest.mark.parametrize("mode", ["eager", "function", "graph"])
def test_errors(job, mode):
    tf_job(job, "errors", mode)


@pytest.mark.parametrize("mode", ["eager", "function", "graph"])
def test_killed_rank(job, mode):
    res = tf_job(job, "victim", mode, np=3, expect=lambda r: (-9,) if r == 2 else (0,))
    assert sum("lost rank reported" in o for o in res.outputs) == 2, res.outputs


def test_imports_are_separate():
    # hvdd.tensorflow must not import torch, nor hvdd.torch tensorflow.
    for mod, other in (("hvdd.tensorflow", "torch"), ("hvdd.torch", "tensorflow")):
        code = f"import sys, {mod}; assert {other!r} not in sys.modules, sorted(m for m in sys.modules if m.startswith({other!r}))"
        p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env={**os.environ, **ENV})
        assert p.returncode == 0, p.stderr
