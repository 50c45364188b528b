"""Runs the seeds' elastic PyTorch MNIST program (``argv[1]``, its
arguments after it) with one more reset callback, registered after the
program's own, that prints the job's size and the learning rate the
program's callback set: ``RESET size N lr X`` (test_elastic_job.py)."""

from __future__ import annotations

import runpy
import sys
from typing import Any

import hvdd.torch as hvd

_init = hvd.elastic.TorchState.__init__


def _state_init(self: Any, model: Any = None, optimizer: Any = None, **kwargs: Any) -> None:
    _init(self, model, optimizer, **kwargs)
    register = self.register_reset_callbacks

    def show() -> None:
        print(f"RESET size {hvd.size()} lr {optimizer.param_groups[0]['lr']:g}", flush=True)

    def register_then_show(callbacks: list) -> None:
        register(callbacks)
        register([show])

    self.register_reset_callbacks = register_then_show


hvd.elastic.TorchState.__init__ = _state_init
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
