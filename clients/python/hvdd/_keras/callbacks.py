"""The Keras callbacks' implementations shared by ``hvdd.tensorflow.keras`` and
``hvdd.keras`` (Horovod's ``horovod/_keras/callbacks.py``).

Each ``*Impl`` class is a mixin: the public modules combine it with their
Keras's ``Callback`` (or ``ModelCheckpoint``) and pass their ``keras`` module as
``backend``. They work with Keras 3 and with tf_keras, eagerly (TF2) and, where
Horovod did, in TF1 graphs through the Keras session.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Optional, Sequence, Union

import numpy as np
import tensorflow as tf

from .. import basics as _basics
from ..tensorflow import functions as _functions
from ..tensorflow import mpi_ops as _mpi_ops
from ..tensorflow._session import _session

__all__ = [
    "BroadcastGlobalVariablesCallbackImpl",
    "MetricAverageCallbackImpl",
    "LearningRateScheduleCallbackImpl",
    "LearningRateWarmupCallbackImpl",
    "BestModelCheckpointImpl",
]


def _value(backend: Any, x: Any) -> float:
    """A float from a Python number, a tensor or a variable."""
    if isinstance(x, (int, float, np.number)):
        return float(x)
    if tf.executing_eagerly() or not isinstance(x, (tf.Tensor, tf.Variable)):
        if hasattr(x, "numpy"):
            return float(np.asarray(x.numpy()))
        return float(np.asarray(x))
    return float(_session(backend).run(x))


def _optimizer_variables(optimizer: Any) -> list:
    if optimizer is None:
        return []
    v = getattr(optimizer, "variables", None)
    if callable(v):
        v = v()
    return list(v or [])


def _var_keys(v: Any) -> set:
    keys = {id(v)}
    inner = getattr(v, "value", None)
    if isinstance(inner, tf.Variable):
        keys.add(id(inner))
    return keys


class BroadcastGlobalVariablesCallbackImpl:
    """Broadcasts the model's and the optimizer's variables from root_rank at
    the end of the first batch (when the optimizer's variables exist), once."""

    def __init__(
        self,
        backend: Any,
        root_rank: int,
        device: str = "",
        local_variables: Optional[Sequence[Any]] = None,
        *args: Any,
    ) -> None:
        super().__init__(*args)
        self.backend = backend
        self.root_rank = root_rank
        self.device = device
        self.broadcast_done = False
        self.local_variables = set()
        for v in local_variables or ():
            self.local_variables |= _var_keys(v)

    def _is_local(self, v: Any) -> bool:
        return bool(_var_keys(v) & self.local_variables)

    def on_batch_end(self, batch: int, logs: Optional[Dict[str, Any]] = None) -> None:
        if self.broadcast_done:
            return
        with tf.device(self.device):
            if tf.executing_eagerly() and hasattr(self.model, "variables"):
                # TensorFlow 2 / Keras 3: the model's and the optimizer's
                # variables in one broadcast.
                variables = [v for v in self.model.variables if not self._is_local(v)]
                variables += [v for v in _optimizer_variables(self.model.optimizer) if not self._is_local(v)]
                _functions.broadcast_variables(variables, root_rank=self.root_rank)
            else:
                _session(self.backend).run(_functions.broadcast_global_variables(self.root_rank))
        self.broadcast_done = True


class MetricAverageCallbackImpl:
    """At the end of every epoch, replaces every metric in ``logs`` by its
    average over all ranks (one allreduce for all of them, in name order)."""

    def __init__(self, backend: Any, device: str = "", *args: Any) -> None:
        super().__init__(*args)
        self.backend = backend
        self.device = device

    def _average_metrics_in_place(self, logs: Optional[Dict[str, Any]]) -> None:
        if not logs:
            return
        names = sorted(logs)
        values = []
        for metric in names:
            a = np.asarray(logs[metric])
            if not (np.issubdtype(a.dtype, np.floating) or np.issubdtype(a.dtype, np.integer)):
                raise TypeError(f"MetricAverageCallback: metric {metric!r} is not numeric: {logs[metric]!r}")
            values.append(tf.constant(a.astype(np.float64), name=metric.replace("/", "_")))
        with tf.device(self.device):
            reduced = _mpi_ops.grouped_allreduce(values, op=_basics.Average, name="MetricAverageCallback")
        for metric, r in zip(names, reduced):
            r = np.asarray(r.numpy() if tf.executing_eagerly() else _session(self.backend).run(r))
            logs[metric] = float(r) if r.ndim == 0 else r

    def on_epoch_end(self, epoch: int, logs: Optional[Dict[str, Any]] = None) -> None:
        self._average_metrics_in_place(logs)


class LearningRateScheduleCallbackImpl:
    """Sets the learning rate to ``initial_lr * multiplier(epoch)`` from
    start_epoch to end_epoch (per epoch when staircase, else per batch with a
    fractional epoch), with momentum correction (Goyal et al.)."""

    def __init__(
        self,
        backend: Any,
        initial_lr: float,
        multiplier: Union[float, Callable[[float], float]],
        start_epoch: int = 0,
        end_epoch: Optional[int] = None,
        staircase: bool = True,
        momentum_correction: bool = True,
        steps_per_epoch: Optional[int] = None,
        *args: Any,
    ) -> None:
        super().__init__(*args)
        self.backend = backend
        self.start_epoch = start_epoch
        self.end_epoch = end_epoch
        self.staircase = staircase
        self.momentum_correction = momentum_correction
        self.initial_lr = initial_lr
        self.restore_momentum: Optional[float] = None
        self.steps_per_epoch = steps_per_epoch
        self.current_epoch: Optional[int] = None

        if not callable(multiplier):
            # A constant multiplier is an exponential decay.
            m = multiplier
            self.multiplier: Callable[[float], float] = lambda epoch: m ** (epoch - start_epoch)
        else:
            self.multiplier = multiplier

        if self.initial_lr is None:
            raise ValueError("Parameter `initial_lr` is required")

    def _autodetect_steps_per_epoch(self) -> int:
        if self.params.get("steps"):
            return self.params["steps"]
        if self.params.get("samples") and self.params.get("batch_size"):
            return self.params["samples"] // self.params["batch_size"]
        raise ValueError(
            "Could not autodetect the number of steps per epoch. Please specify the steps_per_epoch "
            "parameter to the %s() or upgrade to the latest version of Keras." % self.__class__.__name__
        )

    def _get_lr(self) -> float:
        return _value(self.backend, self.model.optimizer.learning_rate)

    def _set_lr(self, lr: float) -> None:
        self.model.optimizer.learning_rate = lr

    def _adjust_learning_rate(self, epoch: float) -> None:
        old_lr = self._get_lr()
        new_lr = self.initial_lr * self.multiplier(epoch)
        self._set_lr(new_lr)

        opt = self.model.optimizer
        if hasattr(opt, "momentum") and self.momentum_correction and old_lr:
            # Momentum correction (Goyal et al.): scale the momentum by the
            # change of the learning rate for one batch. It takes effect where
            # the optimizer reads momentum at run time (tf_keras' legacy
            # optimizers, or run_eagerly=True).
            self.restore_momentum = _value(self.backend, opt.momentum)
            opt.momentum = self.restore_momentum * new_lr / old_lr

    def _restore_momentum_if_needed(self) -> None:
        if self.restore_momentum:
            self.model.optimizer.momentum = self.restore_momentum
            self.restore_momentum = None

    def on_train_begin(self, logs: Optional[Dict[str, Any]] = None) -> None:
        if self.initial_lr is None:
            self.initial_lr = self._get_lr()
        if not self.staircase and not self.steps_per_epoch:
            self.steps_per_epoch = self._autodetect_steps_per_epoch()

    def on_epoch_begin(self, epoch: int, logs: Optional[Dict[str, Any]] = None) -> None:
        self.current_epoch = epoch

    def on_batch_begin(self, batch: int, logs: Optional[Dict[str, Any]] = None) -> None:
        assert self.current_epoch is not None
        if self.current_epoch < self.start_epoch or (
            self.end_epoch is not None and self.current_epoch >= self.end_epoch
        ):
            return  # outside of the adjustment scope
        if self.staircase and batch == 0:
            self._adjust_learning_rate(self.current_epoch)
        elif not self.staircase:
            assert self.steps_per_epoch
            self._adjust_learning_rate(self.current_epoch + float(batch) / self.steps_per_epoch)

    def on_batch_end(self, batch: int, logs: Optional[Dict[str, Any]] = None) -> None:
        self._restore_momentum_if_needed()

    def on_epoch_end(self, epoch: int, logs: Optional[Dict[str, Any]] = None) -> None:
        if logs is not None:
            logs["lr"] = self._get_lr()


class LearningRateWarmupCallbackImpl(LearningRateScheduleCallbackImpl):
    """Gradual warmup (Goyal et al.): from initial_lr / size to initial_lr over
    warmup_epochs, adjusted every batch."""

    def __init__(
        self,
        backend: Any,
        initial_lr: float,
        warmup_epochs: int = 5,
        momentum_correction: bool = True,
        steps_per_epoch: Optional[int] = None,
        verbose: int = 0,
        *args: Any,
    ) -> None:
        def multiplier(epoch: float) -> float:
            # Shift by one batch so that each epoch ends on a round value.
            epoch += 1.0 / self.steps_per_epoch
            return 1.0 / _basics.size() * (epoch * (_basics.size() - 1) / warmup_epochs + 1)

        super().__init__(
            backend,
            initial_lr,
            multiplier,
            0,
            warmup_epochs,
            False,
            momentum_correction,
            steps_per_epoch,
            *args,
        )
        self.verbose = verbose

    def on_epoch_end(self, epoch: int, logs: Optional[Dict[str, Any]] = None) -> None:
        super().on_epoch_end(epoch, logs)
        if epoch == self.end_epoch - 1 and self.verbose > 0 and _basics.rank() == 0:
            print("\nEpoch %d: finished gradual learning rate warmup to %g." % (epoch + 1, self._get_lr()))


class BestModelCheckpointImpl:
    """A ModelCheckpoint that saves the model only when it is the best so far
    (save_best_only=True). As in Horovod the path may be left out and set later
    (``callback.filepath = ...``) before training."""

    _PLACEHOLDER = "hvdd_best_model.keras"

    def __init__(
        self,
        backend: Any,
        monitor: str = "val_loss",
        verbose: int = 0,
        mode: str = "auto",
        save_freq: Union[str, int] = "epoch",
        filepath: Optional[str] = None,
    ) -> None:
        super().__init__(
            filepath if filepath is not None else self._PLACEHOLDER,
            monitor=monitor,
            verbose=verbose,
            save_best_only=True,
            save_weights_only=False,
            mode=mode,
            save_freq=save_freq,
        )
        self.backend = backend
        if filepath is None:
            self.filepath = None

    def on_train_begin(self, logs: Optional[Dict[str, Any]] = None) -> None:
        if self.filepath is None:
            raise ValueError(
                "BestModelCheckpoint has no filepath: pass filepath= or set `callback.filepath` before training"
            )
        parent = getattr(super(), "on_train_begin", None)
        if parent is not None:
            parent(logs)
