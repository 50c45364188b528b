"""Horovod's ``horovod/torch/functions.py``: broadcasting model parameters,
optimizer state and arbitrary picklable objects."""

from __future__ import annotations

import collections
from typing import Any, Iterable, List, Optional

import torch

from .. import ops as _ops
from ..basics import ProcessSet, global_process_set
from .mpi_ops import broadcast_async_, synchronize

__all__ = ["broadcast_parameters", "broadcast_optimizer_state", "broadcast_object", "allgather_object"]


def broadcast_parameters(params: Any, root_rank: int, process_set: ProcessSet = global_process_set) -> None:
    """Broadcasts the parameters from root rank to all other processes.
    Typical usage is to broadcast the ``model.state_dict()``,
    ``model.named_parameters()``, or ``model.parameters()``.

    Arguments:
        params: One of the following:
            - list of parameters to broadcast
            - dict of parameters to broadcast (sorted by key, as in Horovod)
        root_rank: The rank of the process from which parameters will be
            broadcasted to all other processes.
        process_set: Process set object to limit this operation to a subset of
            Horovod processes. Default is the global process set.
    """
    if isinstance(params, dict):
        params = sorted(params.items())
    elif isinstance(params, list):
        # support both named_parameters() and regular parameters()
        params = [p if isinstance(p, tuple) else (None, p) for p in params]
    elif isinstance(params, Iterable) and not isinstance(params, torch.Tensor):
        params = [p if isinstance(p, tuple) else (None, p) for p in params]
    else:
        raise ValueError("invalid params of type: %s" % type(params))

    # Run asynchronous broadcasts.
    handles = []
    for name, p in params:
        handles.append(broadcast_async_(p, root_rank, name, process_set=process_set))

    # Wait for completion.
    for handle in handles:
        synchronize(handle)


def broadcast_optimizer_state(
    optimizer: torch.optim.Optimizer,
    root_rank: int,
    model: Any = None,
    process_set: ProcessSet = global_process_set,
) -> None:
    """Broadcasts an optimizer state from root rank to all other processes.

    Arguments:
        optimizer: An optimizer (plain or DistributedOptimizer).
        root_rank: The rank of the process from which the optimizer will be
            broadcasted to all other processes.
        model: Unused; kept for Horovod compatibility.
        process_set: Process set object to limit this operation to a subset of
            Horovod processes. Default is the global process set.
    """
    if isinstance(optimizer, torch.optim.LBFGS):
        # TODO(travis): L-BFGS cannot be easily supported without serializing
        #  the entire state_dict, as its structure is deeply nested and contains
        #  None type parameter values
        raise ValueError("cannot broadcast torch.optim.LBFGS state")

    state_dict = optimizer.state_dict()

    # Newly created optimizers will not have their state initialized, so
    # do that initialization here
    if len(state_dict["state"]) == 0:
        for group in optimizer.param_groups:
            for p in group["params"]:
                if p.requires_grad and id(p) not in state_dict["state"]:
                    p.grad = p.data.new(p.size()).zero_()
                    if isinstance(optimizer, torch.optim.SparseAdam):
                        p.grad = p.grad.to_sparse()
        # This function accepts a torch.optim.Optimizer or a DistributedOptimizer
        # wrapped around a torch optimizer. Calling step() with a DistributedOptimizer
        # forces allreduce on all model parameters, which will result in deadlock
        # unless every rank calls step(). Therefore, to finish state initialization
        # only call optimizer.step() with a torch.optim.Optimizer.
        if getattr(optimizer, "_hvdd_distributed", False):
            super(optimizer.__class__, optimizer).step()  # type: ignore[misc]
        else:
            optimizer.step()
        state_dict = optimizer.state_dict()

    # If the state_dict is still empty after initialization, then
    # the optimizer is stateless, and there is nothing to broadcast.
    if len(state_dict["state"]) == 0:
        return

    # Tensors are broadcast in place (the state dict shares them with the
    # optimizer); everything else (scalars, options) travels in one pickle.
    params: List[tuple] = []
    scalars: dict = {}
    occurrences: collections.defaultdict = collections.defaultdict(int)
    all_params = [p for g in optimizer.param_groups for p in g["params"]]

    for index, group in enumerate(state_dict["param_groups"]):
        # Options like the learning rate
        for option_key, option_value in group.items():
            if option_key == "params":
                continue
            scalars[("option", index, option_key)] = option_value

        # The params list here is ordered by the layers in the model
        for pid in group["params"]:
            if pid not in state_dict["state"]:
                # The param has not set requires_grad, so skip broadcast
                continue
            param_state = state_dict["state"][pid]
            for name, p in param_state.items():
                # Some parameter names may appear more than once, in which
                # case we ensure they have a unique identifier defined by
                # their order
                occurrences[name] += 1
                key = "%s.%d" % (str(name), occurrences[name])
                if torch.is_tensor(p):
                    params.append((key, p))
                else:
                    scalars[("state", pid, name)] = p

    scalars = broadcast_object(scalars, root_rank, name="optimizer.scalars", process_set=process_set)
    for (kind, index, key), value in scalars.items():
        if kind == "option":
            optimizer.param_groups[index][key] = value
        else:
            optimizer.state[all_params[index]][key] = value

    # Synchronized broadcast of all tensors
    broadcast_parameters(params, root_rank, process_set=process_set)


def broadcast_object(
    obj: Any, root_rank: int = 0, name: Optional[str] = None, process_set: ProcessSet = global_process_set
) -> Any:
    """Serializes and broadcasts an object from root rank to all other processes.
    Typical usage is to broadcast the `optimizer.state_dict()`, for example:

    .. code-block:: python

        state_dict = broadcast_object(optimizer.state_dict(), 0)
        if hvd.rank() > 0:
            optimizer.load_state_dict(state_dict)

    Arguments:
        obj: An object capable of being serialized without losing any context.
        root_rank: The rank of the process from which parameters will be
            broadcasted to all other processes.
        name: Optional name to use during broadcast; by default one counted
            per call, the same on every rank whatever the object (not
            the object's type, as in Horovod).
        process_set: Process set object to limit this operation to a subset of
            Horovod processes. Default is the global process set.

    Returns:
        The object that was broadcast from the `root_rank`.
    """
    return _ops.broadcast_object(obj, root_rank, name, process_set)


def allgather_object(obj: Any, name: Optional[str] = None, process_set: ProcessSet = global_process_set) -> List[Any]:
    """Serializes and allgathers an object from all other processes.

    Arguments:
        obj: An object capable of being serialized without losing any context.
        name: Optional name to use during allgather; by default one counted
            per call, the same on every rank whatever the object (not
            the object's type, as in Horovod).
        process_set: Process set object to limit this operation to a subset of
            Horovod processes. Default is the global process set.

    Returns:
        The list of objects that were allgathered across all ranks.
    """
    return _ops.allgather_object(obj, name, process_set)
