"""Horovod's ``horovod/torch/mpi_ops.py`` on hvdd: collectives on torch tensors.

Every collective exists as a blocking call and an ``_async`` one returning an
integer handle for :func:`poll` and :func:`synchronize`; functions ending in
``_`` write their result into the input tensor. Tensors are copied once into
the client's shared-memory arena and results once out of it; the daemon does
the rest. Tensors are matched across ranks by name: ``"<op>.<name>"`` when a
name is given, else ``"<op>.noname.<n>"``, n counting the unnamed ops since
``init()`` (so unnamed ops match by issue order, as in Horovod, and after an
elastic reset too).

The ``_async`` functions are :mod:`hvdd.torch._async_ops`' and the autograd
functions behind the differentiable ones :mod:`hvdd.torch._autograd`'s (which
runs the first): this module re-exports the first and wraps the second.
"""

from __future__ import annotations

from typing import Any, List, Optional, Sequence, Tuple, Union

import torch

from .. import ops as _ops
from ..basics import Average, ProcessSet, global_process_set
from ..ops import handle_average_backwards_compatibility, poll, synchronize  # noqa: F401 (re-exported)
from ._async_ops import (  # noqa: F401 (re-exported)
    allgather_async,
    allreduce_async,
    allreduce_async_,
    alltoall_async,
    broadcast_async,
    broadcast_async_,
    grouped_allgather_async,
    grouped_allreduce_async,
    grouped_allreduce_async_,
    grouped_reducescatter_async,
    reducescatter_async,
    sparse_allreduce_async,
)
from ._autograd import (
    HorovodAllgather,
    HorovodAllreduce,
    HorovodAlltoall,
    HorovodBroadcast,
    HorovodGroupedAllgather,
    HorovodGroupedAllreduce,
    HorovodGroupedReducescatter,
    HorovodReducescatter,
)
from .compression import Compression

# The collectives hvdd.torch exports, as horovod.torch does.
COLLECTIVES = [
    "allreduce",
    "allreduce_",
    "allreduce_async",
    "allreduce_async_",
    "grouped_allreduce",
    "grouped_allreduce_",
    "grouped_allreduce_async",
    "grouped_allreduce_async_",
    "sparse_allreduce_async",
    "allgather",
    "allgather_async",
    "grouped_allgather",
    "grouped_allgather_async",
    "broadcast",
    "broadcast_",
    "broadcast_async",
    "broadcast_async_",
    "alltoall",
    "alltoall_async",
    "reducescatter",
    "reducescatter_async",
    "grouped_reducescatter",
    "grouped_reducescatter_async",
    "join",
    "barrier",
    "poll",
    "synchronize",
]

__all__ = [*COLLECTIVES, "handle_average_backwards_compatibility"]


def allreduce(
    tensor: torch.Tensor,
    average: Optional[bool] = None,
    name: Optional[str] = None,
    compression: Any = Compression.none,
    op: Optional[int] = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
) -> torch.Tensor:
    """A function that performs averaging or summation of the input tensor over
    all the Horovod processes. The input tensor is not modified.

    This acts as a thin wrapper around an autograd function. If your input
    tensor requires gradients, then calling this function will allow gradients
    to be computed and backpropagated.

    Arguments:
        tensor: A tensor to reduce.
        average: .. warning:: .. deprecated:: 0.19.0 Use `op` instead.
        name: A name of the reduction operation.
        compression: Compression algorithm used during allreduce to reduce the
            amount of data sent during each parameter update step.
        op: The reduction operation (Average if None).
        prescale_factor: Multiplicative factor to scale tensor before allreduce.
        postscale_factor: Multiplicative factor to scale tensor after allreduce.
        process_set: Process set object to limit this operation to a subset of
            Horovod processes. Default is the global process set.

    Returns:
        A tensor of the same shape and type as `tensor`, averaged or summed
        across all processes.
    """

    tensor_compressed, ctx = compression.compress(tensor)
    summed = HorovodAllreduce.apply(
        tensor_compressed, average, name, op, prescale_factor, postscale_factor, process_set
    )
    return compression.decompress(summed, ctx)


def allreduce_(
    tensor: torch.Tensor,
    average: Optional[bool] = None,
    name: Optional[str] = None,
    op: Optional[int] = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
) -> torch.Tensor:
    """In-place :func:`allreduce`: the input tensor holds the result, which is
    also returned."""
    handle = allreduce_async_(tensor, average, name, op, prescale_factor, postscale_factor, process_set)
    return synchronize(handle)


def grouped_allreduce(
    tensors: Sequence[torch.Tensor],
    average: Optional[bool] = None,
    name: Optional[str] = None,
    compression: Any = Compression.none,
    op: Optional[int] = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
) -> List[torch.Tensor]:
    """Grouped allreduce (differentiable): returns a list of reduced tensors."""

    compressed, ctxs = zip(*[compression.compress(t) for t in tensors]) if tensors else ((), ())
    summed = HorovodGroupedAllreduce.apply(
        average, name, op, prescale_factor, postscale_factor, process_set, *compressed
    )
    return [compression.decompress(t, ctx) for t, ctx in zip(summed, ctxs)]


def grouped_allreduce_(
    tensors: Sequence[torch.Tensor],
    average: Optional[bool] = None,
    name: Optional[str] = None,
    op: Optional[int] = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
) -> List[torch.Tensor]:
    """In-place grouped allreduce."""
    handle = grouped_allreduce_async_(tensors, average, name, op, prescale_factor, postscale_factor, process_set)
    return synchronize(handle)


# ------------------------------------------------------------------ allgather


def allgather(
    tensor: torch.Tensor, name: Optional[str] = None, process_set: ProcessSet = global_process_set
) -> torch.Tensor:
    """A function that concatenates the input tensor with the same input tensor
    on all other Horovod processes, along the first dimension (whose size may
    differ between processes). Differentiable.

    Returns:
        A tensor of the same type as `tensor`, concatenated on dimension zero
        across all processes. The shape is identical to the input shape, except
        for the first dimension, which may be greater and is the sum of all
        first dimensions of the tensors in different Horovod processes.
    """

    return HorovodAllgather.apply(tensor, name, process_set)


def grouped_allgather(
    tensors: Sequence[torch.Tensor], name: Optional[str] = None, process_set: ProcessSet = global_process_set
) -> List[torch.Tensor]:
    """Grouped allgather: returns the list of gathered tensors, negotiated as
    one unit. Differentiable, as :func:`allgather`."""
    if not tensors:
        return []
    return list(HorovodGroupedAllgather.apply(name, process_set, *tensors))


# ------------------------------------------------------------------ broadcast


def broadcast(
    tensor: torch.Tensor, root_rank: int, name: Optional[str] = None, process_set: ProcessSet = global_process_set
) -> torch.Tensor:
    """A function that broadcasts the input tensor on root rank to the same input
    tensor on all other Horovod processes. The input tensor is not modified.
    Differentiable: the gradient is averaged across ranks and kept on the root.

    Returns:
        A tensor of the same shape and type as `tensor`, with the value
        broadcasted from root rank.
    """

    return HorovodBroadcast.apply(tensor, root_rank, name, process_set)


def broadcast_(
    tensor: torch.Tensor, root_rank: int, name: Optional[str] = None, process_set: ProcessSet = global_process_set
) -> torch.Tensor:
    """In-place broadcast: the input tensor holds the root's values, and is
    returned."""
    return synchronize(broadcast_async_(tensor, root_rank, name, process_set))


# ------------------------------------------------------------------- alltoall


def alltoall(
    tensor: torch.Tensor,
    splits: Any = None,
    name: Optional[str] = None,
    process_set: ProcessSet = global_process_set,
) -> Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]:
    """A function that scatters slices of the input tensor to all other Horovod
    processes and returns a tensor of gathered slices from all other Horovod
    processes. Differentiable.

    Returns:
        1) A tensor containing the gathered tensor data from all workers.
        2) If `splits` has been provided: A tensor of integers in rank order
           describing how many elements in the output tensor have been received
           from each worker.
    """

    return HorovodAlltoall.apply(tensor, splits, name, process_set)


# -------------------------------------------------------------- reducescatter


def reducescatter(
    tensor: torch.Tensor,
    name: Optional[str] = None,
    compression: Any = Compression.none,
    op: int = Average,
    process_set: ProcessSet = global_process_set,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> torch.Tensor:
    """A function that performs reduction of the input tensor over all the
    Horovod processes, then scatters the results across all Horovod processes.
    Differentiable, with Horovod's gradient: the upstream gradient multiplied
    by the set's size for Sum and by the prescale and postscale factors, then
    allgathered.

    Returns:
        A tensor of the same rank and type as `tensor`, with this process's
        block of rows of the reduction.
    """

    tensor_compressed, ctx = compression.compress(tensor)
    out = HorovodReducescatter.apply(tensor_compressed, name, op, process_set, prescale_factor, postscale_factor)
    return compression.decompress(out, ctx)


def grouped_reducescatter(
    tensors: Sequence[torch.Tensor],
    name: Optional[str] = None,
    compression: Any = Compression.none,
    op: int = Average,
    process_set: ProcessSet = global_process_set,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> List[torch.Tensor]:
    """Grouped reducescatter: returns a list of this process's blocks,
    negotiated as one unit. Differentiable, as :func:`reducescatter`."""
    if not tensors:
        return []
    compressed, ctxs = zip(*[compression.compress(t) for t in tensors])
    outs = HorovodGroupedReducescatter.apply(name, op, process_set, prescale_factor, postscale_factor, *compressed)
    return [compression.decompress(t, ctx) for t, ctx in zip(outs, ctxs)]


# ------------------------------------------------------- barrier, join, waits


def join(device: int = -1) -> int:
    """A function that indicates that the rank finished processing data.

    All ranks that did not call join() continue to process allreduce
    operations; this rank takes part in them with zeros. This function blocks
    Python thread until all ranks join.

    Arguments:
        device: An id of the device to create temprorary zero tensors (unused:
            the daemon supplies the zeros).

    Returns:
        Id of the rank that joined last.
    """
    return _ops.join()


def barrier(process_set: ProcessSet = global_process_set) -> None:
    """A function that acts as a simple sychronization point for ranks specified
    in the given process group (default: all ranks)."""
    _ops.barrier(process_set)
