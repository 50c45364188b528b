"""The Keras implementation shared by ``hvdd.tensorflow.keras`` (``tf.keras``:
Keras 3, or tf_keras when ``TF_USE_LEGACY_KERAS=1``) and ``hvdd.keras`` (the
``keras`` package), as Horovod's ``horovod/_keras`` is shared by
``horovod.tensorflow.keras`` and ``horovod.keras``.

The public modules pass in the ``keras`` module they work on; nothing here
imports a Keras package by itself, and nothing imports torch.

It sits above ``hvdd.tensorflow``'s modules and imports them one by one
(``mpi_ops``, ``functions``, the optimizer wrapper), never the
``hvdd.tensorflow`` package itself. The optimizer wrapper
(:func:`create_distributed_optimizer`, re-exported here) lives in
``hvdd.tensorflow._keras_optimizer``, whose docstring says where the
gradients are reduced: ``hvdd.tensorflow.DistributedOptimizer`` returns it
too, for a Keras optimizer.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Sequence

import tensorflow as tf

from ..tensorflow import functions as _functions
from ..tensorflow import mpi_ops as _mpi_ops
from ..tensorflow._keras_optimizer import (
    create_distributed_optimizer,
    distributed_optimizer_class,
    is_distributed_optimizer,
)
from ..tensorflow._session import _session
from .callbacks import (
    BestModelCheckpointImpl,
    BroadcastGlobalVariablesCallbackImpl,
    LearningRateScheduleCallbackImpl,
    LearningRateWarmupCallbackImpl,
    MetricAverageCallbackImpl,
)

__all__ = [
    "create_distributed_optimizer",
    "distributed_optimizer_class",
    "is_distributed_optimizer",
    "local_layers",
    "broadcast_global_variables",
    "allreduce",
    "allgather",
    "broadcast",
    "reducescatter",
    "load_model",
    "optimizer_classes",
    "BroadcastGlobalVariablesCallbackImpl",
    "MetricAverageCallbackImpl",
    "LearningRateScheduleCallbackImpl",
    "LearningRateWarmupCallbackImpl",
    "BestModelCheckpointImpl",
]


# ----------------------------------------------------------------------------- the optimizer


def local_layers(keras: Any, layers: Any) -> List[Any]:
    """PartialDistributedOptimizer's local_layers as a list, checked."""
    if layers is None:
        return []
    if isinstance(layers, keras.layers.Layer):
        return [layers]
    layers = list(layers)
    if not all(isinstance(layer, keras.layers.Layer) for layer in layers):
        raise ValueError("All local layers must be of tf.keras.layers.Layer type.")
    return layers


# ----------------------------------------------------------------------------- value helpers


def _eval(backend: Any, x: Any) -> Any:
    """x's value: at once in eager mode, by running it in the Keras session in a
    TF1 graph."""
    if tf.executing_eagerly():
        return x.numpy() if hasattr(x, "numpy") else x
    return _session(backend).run(x)


def _as_tensor(value: Any, name: Optional[str]) -> tf.Tensor:
    if isinstance(value, (tf.Tensor, tf.Variable)) or hasattr(value, "__tf_tensor__"):
        return tf.convert_to_tensor(value)
    return tf.constant(value, name=name)


def broadcast_global_variables(backend: Any, root_rank: int) -> Any:
    """Broadcasts all global variables from root rank (TF1 graph mode only)."""
    if tf.executing_eagerly():
        raise RuntimeError(
            "broadcast_global_variables() does not support eager execution (TensorFlow 2 / Keras 3). "
            "Use the callback `hvd.callbacks.BroadcastGlobalVariablesCallback(root_rank)` in model.fit, "
            "or `hvd.broadcast_variables(model.variables, root_rank)` (and the optimizer's variables) instead."
        )
    return _eval(backend, _functions.broadcast_global_variables(root_rank))


def allreduce(
    backend: Any,
    value: Any,
    name: Optional[str],
    average: Optional[bool],
    prescale_factor: float,
    postscale_factor: float,
    op: Optional[int],
    compression: Any,
) -> Any:
    """The reduction of value across ranks, as a numpy value."""
    return _eval(
        backend,
        _mpi_ops.allreduce(
            _as_tensor(value, name),
            average=average,
            prescale_factor=prescale_factor,
            postscale_factor=postscale_factor,
            op=op,
            compression=compression,
        ),
    )


def allgather(backend: Any, value: Any, name: Optional[str]) -> Any:
    """Every rank's value concatenated on the first dimension, as numpy."""
    return _eval(backend, _mpi_ops.allgather(_as_tensor(value, name)))


def broadcast(backend: Any, value: Any, root_rank: int, name: Optional[str]) -> Any:
    """root_rank's value, as numpy."""
    return _eval(backend, _mpi_ops.broadcast(_as_tensor(value, name), root_rank))


def reducescatter(backend: Any, value: Any, name: Optional[str], op: int) -> Any:
    """This rank's slice of the reduction of value across ranks, as numpy."""
    return _eval(backend, _mpi_ops.reducescatter(_as_tensor(value, name), op=op))


# ----------------------------------------------------------------------------- load_model


def optimizer_classes(keras: Any, legacy_opts: bool = False) -> List[type]:
    """The stock optimizer classes of a Keras module (its ``optimizers``, or
    ``optimizers.legacy`` when legacy_opts)."""
    mod = keras.optimizers
    if legacy_opts:
        mod = getattr(mod, "legacy", None)
        if mod is None:
            raise ValueError("legacy_opts=True needs a Keras with keras.optimizers.legacy (tf_keras)")
    base = getattr(mod, "Optimizer", None)
    out = []
    for obj in vars(mod).values():
        if isinstance(obj, type) and base is not None and issubclass(obj, base) and obj is not base:
            out.append(obj)
    return out


def load_model(
    keras: Any,
    wrap_optimizer: Callable[[type], Any],
    filepath: Any,
    custom_optimizers: Optional[Sequence[type]],
    custom_objects: Optional[Dict[str, Any]],
    legacy_opts: bool = False,
) -> Any:
    """Loads a saved model with ``keras.models.load_model``, its optimizer
    re-created as ``wrap_optimizer(cls)`` (a DistributedOptimizer class) for
    every stock optimizer class and every class in custom_optimizers."""
    objects: Dict[str, Any] = {}
    for cls in optimizer_classes(keras, legacy_opts):
        wrapped = wrap_optimizer(cls)
        objects[cls.__name__] = wrapped
        objects[cls.__name__.lower()] = wrapped
    for cls in custom_optimizers or ():
        objects[cls.__name__] = wrap_optimizer(cls)
    if custom_objects is not None:
        objects.update(custom_objects)
    return keras.models.load_model(filepath, custom_objects=objects)
