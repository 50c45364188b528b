"""Horovod's ``horovod/tensorflow/functions.py``: broadcasting variables and
Python objects. Objects travel as pickled bytes through ``hvdd.ops``, in any
mode: no graph or session is needed, so ``session=`` is accepted and
unused."""

from __future__ import annotations

from typing import Any, Callable, List, Optional

import tensorflow as tf

from .. import ops as _ops
from ..basics import ProcessSet, global_process_set
from .mpi_ops import _broadcast_many, _executing_eagerly

__all__ = [
    "broadcast_variables",
    "broadcast_global_variables",
    "broadcast_object",
    "broadcast_object_fn",
    "allgather_object",
]


def broadcast_variables(
    variables: Any, root_rank: int, process_set: ProcessSet = global_process_set, inplace: bool = False
) -> Any:
    """Broadcasts variables from root rank to all other processes in a
    process set (defaults to all Horovod processes).

    The variables travel together, in one step to the daemon.

    Arguments:
        variables: variables for broadcast
        root_rank: rank of the process from which global variables will be
                   broadcasted to all other processes.
        process_set: Process set object to limit this operation to a subset of
                     Horovod processes. Default is the global process set.
        inplace: whether to use inplace broadcast (the same here)

    Returns:
        In a graph, the op that assigns the root's values (run it); in eager
        mode the assignment is done and None is returned.
    """
    variables = list(variables)
    if not variables:
        return None if _executing_eagerly() else tf.no_op()
    values = _broadcast_many(variables, root_rank, None, False, process_set)
    assigns = [v.assign(x) for v, x in zip(variables, values)]
    if _executing_eagerly():
        return None
    return tf.group(*assigns)


def broadcast_global_variables(root_rank: int) -> Any:
    """Broadcasts all global variables from root rank to all other processes.

    **NOTE:** deprecated in TensorFlow 2.0.

    Arguments:
        root_rank: rank of the process from which global variables will be
                   broadcasted to all other processes.

    Returns:
        The op that assigns root's values to every global variable (run it).
    """
    if _executing_eagerly():
        raise RuntimeError(
            "hvd.broadcast_global_variables() does not support eager execution. "
            "Please use `hvd.broadcast_variables(<model/optimizer variables>)` instead."
        )
    return broadcast_variables(tf.compat.v1.global_variables(), root_rank)


def broadcast_object(
    obj: Any,
    root_rank: int = 0,
    session: Any = None,
    name: Optional[str] = None,
    process_set: ProcessSet = global_process_set,
) -> Any:
    """Serializes and broadcasts an object from root rank to all other
    processes.

    Arguments:
        obj: An object capable of being serialized without losing any context.
        root_rank: The rank of the process from which parameters will be
                   broadcasted to all other processes.
        session: Session for TensorFlow v1 compatibility (unused).
        name: Optional name to use during broadcast; by default one counted
              per call, the same on every rank whatever the object (not
              the object's type, as in Horovod).
        process_set: Process set object to limit this operation to a subset of
                     Horovod processes. Default is the global process set.

    Returns:
        The object that was broadcast from the `root_rank`.
    """
    return _ops.broadcast_object(obj, root_rank, name, process_set)


def broadcast_object_fn(
    root_rank: int = 0, session: Any = None, name: Optional[str] = None, process_set: ProcessSet = global_process_set
) -> Callable[[Any], Any]:
    """Returns a function that broadcasts an object from root_rank (Horovod's
    form that builds its graph once for TF1 sessions)."""

    def _bcast(obj: Any) -> Any:
        return _ops.broadcast_object(obj, root_rank, name, process_set)

    return _bcast


def allgather_object(
    obj: Any, session: Any = None, name: Optional[str] = None, process_set: ProcessSet = global_process_set
) -> List[Any]:
    """Serializes and allgathers an object from all other processes.

    Returns:
        The list of objects that were allgathered across all ranks, in rank
        order.
    """
    return _ops.allgather_object(obj, name, process_set)
