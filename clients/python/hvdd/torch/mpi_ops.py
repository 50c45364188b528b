"""Horovod's ``horovod/torch/mpi_ops.py`` on hvdd: collectives on torch tensors.

Every collective exists as a blocking call and an ``_async`` one returning an
integer handle for :func:`poll` and :func:`synchronize`; functions ending in
``_`` write their result into the input tensor. Tensors are copied once into
the client's shared-memory arena and results once out of it; the daemon does
the rest. Tensors are matched across ranks by name: ``"<op>.<name>"`` when a
name is given, else ``"<op>.noname.<handle>"`` (so unnamed ops match by issue
order, as in Horovod).
"""

from __future__ import annotations

from typing import Any, Callable, List, Optional, Sequence, Tuple, Union

import numpy as np
import torch

from .. import basics as _basics
from .. import ops as _ops
from .._client import Client, Handle
from .._proto import hvdd_pb2 as pb
from ..basics import Average, ProcessSet, global_process_set
from ..basics import process_set_id as _ps_id
from ..ops import handle_average_backwards_compatibility, poll, synchronize  # noqa: F401 (re-exported)
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

# torch dtype -> (wire dtype, numpy dtype of the same bits).
_DTYPES = {
    torch.uint8: (pb.DTYPE_UINT8, np.uint8),
    torch.int8: (pb.DTYPE_INT8, np.int8),
    torch.int16: (pb.DTYPE_INT16, np.int16),
    torch.int32: (pb.DTYPE_INT32, np.int32),
    torch.int64: (pb.DTYPE_INT64, np.int64),
    torch.float16: (pb.DTYPE_FLOAT16, np.float16),
    torch.bfloat16: (pb.DTYPE_BFLOAT16, np.int16),  # bits, viewed as int16
    torch.float32: (pb.DTYPE_FLOAT32, np.float32),
    torch.float64: (pb.DTYPE_FLOAT64, np.float64),
    torch.bool: (pb.DTYPE_BOOL, np.bool_),
}

_reduce_op = _ops.reduce_op
_name = _ops.collective_name


def _check(tensor: torch.Tensor) -> Tuple[int, Any]:
    """Validates a tensor as Horovod's _check_function does; returns its
    (wire dtype, numpy dtype)."""
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"expected a torch.Tensor, got {type(tensor).__name__}")
    dt = _DTYPES.get(tensor.dtype)
    if dt is None or tensor.is_sparse:
        raise ValueError("Tensor type %s is not supported." % tensor.type())
    if not tensor.is_contiguous():
        raise ValueError("Tensor is required to be contiguous.")
    return dt


def _array(tensor: torch.Tensor) -> np.ndarray:
    """A numpy view of a contiguous tensor's values (a CPU copy of a device
    tensor's); bfloat16 as its int16 bits, which the wire dtype names."""
    t = tensor.detach()
    if not t.is_cpu:
        t = t.cpu()
    if t.dtype is torch.bfloat16:
        t = t.view(torch.int16)
    return t.numpy()


def _to_torch(dtype: torch.dtype) -> Callable[[np.ndarray], torch.Tensor]:
    """Converts a result array (which the caller owns) to a tensor of dtype."""
    if dtype is torch.bfloat16:
        return lambda a: torch.from_numpy(a).view(torch.bfloat16)
    return torch.from_numpy


def _into(output: torch.Tensor) -> Tuple[Optional[np.ndarray], Callable[[np.ndarray], torch.Tensor]]:
    """The (out, convert) pair that makes an in-place result land in output:
    a CPU tensor's own bytes take it directly; a device tensor is copied to."""
    if output.is_cpu:
        return _array(output), lambda _: output

    def copy(a: np.ndarray) -> torch.Tensor:
        with torch.no_grad():
            output.copy_(_to_torch(output.dtype)(a))
        return output

    return None, copy


def _register(handle: int, h: Handle) -> int:
    return _ops.register(handle, h)


def _allreduce_submit(
    c: Client,
    tensor: torch.Tensor,
    output: Optional[torch.Tensor],
    full_name: str,
    op: int,
    prescale_factor: float,
    postscale_factor: float,
    ps: int,
    group: int = 0,
    group_size: int = 0,
) -> Handle:
    wire_dt = _check(tensor)[0]
    out, convert = _into(output) if output is not None else (None, _to_torch(tensor.dtype))
    return _ops.submit_allreduce(
        c,
        _array(tensor),
        full_name,
        op,
        prescale_factor,
        postscale_factor,
        ps,
        out=out,
        wire=wire_dt,
        group=group,
        group_size=group_size,
        convert=convert,
    )


def _allreduce_async(
    tensor: torch.Tensor,
    output: Optional[torch.Tensor],
    name: Optional[str],
    op: int,
    prescale_factor: float,
    postscale_factor: float,
    process_set: ProcessSet,
) -> int:
    c = _basics.client()
    op = _reduce_op(op)
    ps = _ps_id(process_set)
    handle = _ops.next_handle()
    h = _allreduce_submit(
        c, tensor, output, _name("allreduce", name, handle), op, prescale_factor, postscale_factor, ps
    )
    return _register(handle, h)


def allreduce_async(
    tensor: torch.Tensor,
    average: Optional[bool] = None,
    name: Optional[str] = None,
    op: Optional[int] = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
) -> int:
    """A function that performs asynchronous averaging or summation of the input
    tensor over all the Horovod processes. The input tensor is not modified.

    The reduction operation is keyed by the name. If name is not provided, an
    incremented auto-generated name is used. The tensor type and shape must be
    the same on all Horovod processes for a given name. The reduction will not
    start until all processes are ready to send and receive the tensor.

    Arguments:
        tensor: A tensor to reduce.
        average: .. warning:: .. deprecated:: 0.19.0 Use `op` instead.
        name: A name of the reduction operation.
        op: The reduction operation to combine tensors across different ranks.
            Defaults to Average if None is given.
        prescale_factor: Multiplicative factor to scale tensor before allreduce.
        postscale_factor: Multiplicative factor to scale tensor after allreduce.
        process_set: Process set object to limit this operation to a subset of
            Horovod processes. Default is the global process set.

    Returns:
        A handle to the allreduce operation that can be used with `poll()` or
        `synchronize()`.
    """
    op = handle_average_backwards_compatibility(op, average)
    return _allreduce_async(tensor, None, name, op, prescale_factor, postscale_factor, process_set)


def allreduce_async_(
    tensor: torch.Tensor,
    average: Optional[bool] = None,
    name: Optional[str] = None,
    op: Optional[int] = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
) -> int:
    """A function that performs asynchronous in-place averaging or summation of
    the input tensor over all the Horovod processes. The reduction is keyed by
    name; after `synchronize()` the input tensor holds the result.

    Returns:
        A handle to the allreduce operation that can be used with `poll()` or
        `synchronize()`.
    """
    op = handle_average_backwards_compatibility(op, average)
    return _allreduce_async(tensor, tensor, name, op, prescale_factor, postscale_factor, process_set)


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


def _grouped_allreduce_async(
    tensors: Sequence[torch.Tensor],
    outputs: Optional[Sequence[torch.Tensor]],
    name: Optional[str],
    op: int,
    prescale_factor: float,
    postscale_factor: float,
    process_set: ProcessSet,
) -> int:
    c = _basics.client()
    op = _reduce_op(op)
    ps = _ps_id(process_set)
    tensors = list(tensors)
    for t in tensors:
        _check(t)
    if len({t.device for t in tensors}) > 1:
        raise ValueError("Tensors in list must be on same device.")
    handle = _ops.next_handle()

    def sub(nm: str, i: int, gid: int, n: int) -> Handle:
        out = outputs[i] if outputs is not None else None
        return _allreduce_submit(c, tensors[i], out, nm, op, prescale_factor, postscale_factor, ps, gid, n)

    return _register(handle, _ops.group(_name("grouped_allreduce", name, handle), sub, len(tensors)))


def grouped_allreduce_async(
    tensors: Sequence[torch.Tensor],
    average: Optional[bool] = None,
    name: Optional[str] = None,
    op: Optional[int] = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
) -> int:
    """Asynchronous grouped allreduce: the tensors are negotiated (and fused)
    as one unit, none runs before all are ready on every rank. Inputs are not
    modified; `synchronize()` returns the list of results."""
    op = handle_average_backwards_compatibility(op, average)
    return _grouped_allreduce_async(tensors, None, name, op, prescale_factor, postscale_factor, process_set)


def grouped_allreduce_async_(
    tensors: Sequence[torch.Tensor],
    average: Optional[bool] = None,
    name: Optional[str] = None,
    op: Optional[int] = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
) -> int:
    """In-place asynchronous grouped allreduce."""
    op = handle_average_backwards_compatibility(op, average)
    return _grouped_allreduce_async(tensors, tensors, name, op, prescale_factor, postscale_factor, process_set)


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


def sparse_allreduce_async(
    tensor: torch.Tensor, name: str, op: int, process_set: ProcessSet = global_process_set
) -> Callable[[], torch.Tensor]:
    """Allreduce of a sparse COO tensor as two allgathers (indices and values),
    as Horovod does. Returns a callable that waits and returns the result."""
    t = tensor
    indices_handle = allgather_async(
        t._indices().transpose(0, 1).contiguous(), name=f"{name}.indices", process_set=process_set
    )
    values_handle = allgather_async(t._values().contiguous(), name=f"{name}.values", process_set=process_set)

    def handle() -> torch.Tensor:
        values = synchronize(values_handle)
        indices = synchronize(indices_handle)
        values = (values / process_set.size()) if op == Average else values
        if indices.dim() == 0 or values.dim() == 0:
            return t.new().resize_as_(t)
        return torch.sparse_coo_tensor(indices.transpose(0, 1), values, t.size())

    return handle


# ------------------------------------------------------------------ allgather


def _output_submit(
    c: Client,
    kind: int,
    tensor: torch.Tensor,
    full_name: str,
    ps: int,
    with_splits: bool = False,
    **kw: Any,
) -> Handle:
    """Submits a collective whose result the daemon allocates (allgather,
    alltoall, reducescatter)."""
    wire_dt = _check(tensor)[0]
    return _ops.submit_output(
        c,
        kind,
        _array(tensor),
        full_name,
        ps,
        with_splits=with_splits,
        wire=wire_dt,
        convert=_to_torch(tensor.dtype),
        convert_splits=torch.from_numpy,
        **kw,
    )


def allgather_async(
    tensor: torch.Tensor, name: Optional[str] = None, process_set: ProcessSet = global_process_set
) -> int:
    """A function that asynchronously concatenates the input tensor with the same
    input tensor on all other Horovod processes. The input tensor is not
    modified. The concatenation is done on the first dimension, so the input
    tensors on the different processes must have the same rank and shape,
    except for the first dimension, which is allowed to be different.

    Returns:
        A handle to the allgather operation that can be used with `poll()` or
        `synchronize()`.
    """
    c = _basics.client()
    ps = _ps_id(process_set)
    handle = _ops.next_handle()
    return _register(handle, _output_submit(c, pb.OP_ALLGATHER, tensor, _name("allgather", name, handle), ps))


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


def grouped_allgather_async(
    tensors: Sequence[torch.Tensor], name: Optional[str] = None, process_set: ProcessSet = global_process_set
) -> int:
    """Asynchronous grouped allgather; `synchronize()` returns a list."""
    c = _basics.client()
    ps = _ps_id(process_set)
    tensors = list(tensors)
    for t in tensors:
        _check(t)
    handle = _ops.next_handle()

    def sub(nm: str, i: int, gid: int, n: int) -> Handle:
        return _output_submit(c, pb.OP_ALLGATHER, tensors[i], nm, ps, group=gid, group_size=n)

    return _register(handle, _ops.group(_name("grouped_allgather", name, handle), sub, len(tensors)))


def grouped_allgather(
    tensors: Sequence[torch.Tensor], name: Optional[str] = None, process_set: ProcessSet = global_process_set
) -> List[torch.Tensor]:
    """Grouped allgather: returns the list of gathered tensors."""
    return synchronize(grouped_allgather_async(tensors, name, process_set))


# ------------------------------------------------------------------ broadcast


def _broadcast_async(
    tensor: torch.Tensor, output: Optional[torch.Tensor], root_rank: int, name: Optional[str], process_set: ProcessSet
) -> int:
    c = _basics.client()
    ps = _ps_id(process_set)
    wire_dt = _check(tensor)[0]
    handle = _ops.next_handle()
    out, convert = _into(output) if output is not None else (None, _to_torch(tensor.dtype))
    h = _ops.submit_broadcast(
        c, _array(tensor), _name("broadcast", name, handle), root_rank, ps, out=out, wire=wire_dt, convert=convert
    )
    return _register(handle, h)


def broadcast_async(
    tensor: torch.Tensor, root_rank: int, name: Optional[str] = None, process_set: ProcessSet = global_process_set
) -> int:
    """A function that asynchronously broadcasts the input tensor on root rank to
    the same input tensor on all other Horovod processes. The input tensor is
    not modified. `root_rank` is a global rank.

    Returns:
        A handle to the broadcast operation that can be used with `poll()` or
        `synchronize()`.
    """
    return _broadcast_async(tensor, None, root_rank, name, process_set)


def broadcast_async_(
    tensor: torch.Tensor, root_rank: int, name: Optional[str] = None, process_set: ProcessSet = global_process_set
) -> int:
    """In-place asynchronous broadcast: after `synchronize()` the input tensor
    holds the root's values."""
    return _broadcast_async(tensor, tensor, root_rank, name, process_set)


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


def _splits_list(splits: Any) -> Optional[List[int]]:
    if splits is None:
        return None
    if isinstance(splits, torch.Tensor):
        return [int(x) for x in splits.reshape(-1).tolist()]
    return [int(x) for x in splits]


def alltoall_async(
    tensor: torch.Tensor,
    splits: Any = None,
    name: Optional[str] = None,
    process_set: ProcessSet = global_process_set,
) -> int:
    """A function that scatters slices of the input tensor to all other Horovod
    processes and returns a tensor of gathered slices from all other Horovod
    processes. The slicing is done on the first dimension; `splits` (a list or
    int32 tensor with one entry per process) says how many rows go to each.
    Without splits the first dimension is divided equally.

    Returns:
        A handle to the alltoall operation that can be used with `poll()` or
        `synchronize()`; `synchronize()` returns (output, received_splits).
    """
    c = _basics.client()
    ps = _ps_id(process_set)
    handle = _ops.next_handle()
    sp = _splits_list(splits)
    h = _output_submit(c, pb.OP_ALLTOALL, tensor, _name("alltoall", name, handle), ps, with_splits=True, splits=sp)
    return _register(handle, h)


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


def reducescatter_async(
    tensor: torch.Tensor,
    name: Optional[str] = None,
    op: int = Average,
    process_set: ProcessSet = global_process_set,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> int:
    """A function that performs asynchronous reduction of the input tensor over
    all the Horovod processes, then scatters the results across all Horovod
    processes along the first dimension (the first d0 % size processes get one
    row more). The input tensor is not modified. `op` is Average or Sum.

    Returns:
        A handle to the reducescatter operation that can be used with `poll()`
        or `synchronize()`.
    """
    c = _basics.client()
    ps = _ps_id(process_set)
    op = _reduce_op(op)
    handle = _ops.next_handle()
    h = _output_submit(
        c,
        pb.OP_REDUCESCATTER,
        tensor,
        _name("reducescatter", name, handle),
        ps,
        reduce_op=op,
        prescale=float(prescale_factor),
        postscale=float(postscale_factor),
    )
    return _register(handle, h)


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
    Differentiable.

    Returns:
        A tensor of the same rank and type as `tensor`, with this process's
        block of rows of the reduction.
    """

    tensor_compressed, ctx = compression.compress(tensor)
    out = HorovodReducescatter.apply(tensor_compressed, name, op, process_set, prescale_factor, postscale_factor)
    return compression.decompress(out, ctx)


def grouped_reducescatter_async(
    tensors: Sequence[torch.Tensor],
    name: Optional[str] = None,
    op: int = Average,
    process_set: ProcessSet = global_process_set,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> int:
    """Asynchronous grouped reducescatter; `synchronize()` returns a list."""
    c = _basics.client()
    ps = _ps_id(process_set)
    op = _reduce_op(op)
    tensors = list(tensors)
    for t in tensors:
        _check(t)
    handle = _ops.next_handle()

    def sub(nm: str, i: int, gid: int, n: int) -> Handle:
        return _output_submit(
            c,
            pb.OP_REDUCESCATTER,
            tensors[i],
            nm,
            ps,
            reduce_op=op,
            prescale=float(prescale_factor),
            postscale=float(postscale_factor),
            group=gid,
            group_size=n,
        )

    return _register(handle, _ops.group(_name("grouped_reducescatter", name, handle), sub, len(tensors)))


def grouped_reducescatter(
    tensors: Sequence[torch.Tensor],
    name: Optional[str] = None,
    compression: Any = Compression.none,
    op: int = Average,
    process_set: ProcessSet = global_process_set,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> List[torch.Tensor]:
    """Grouped reducescatter: returns a list of this process's blocks."""
    compressed, ctxs = zip(*[compression.compress(t) for t in tensors]) if tensors else ((), ())
    outs = synchronize(
        grouped_reducescatter_async(compressed, name, op, process_set, prescale_factor, postscale_factor)
    )
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


# At the end: _autograd imports this module.
from ._autograd import (  # noqa: E402
    HorovodAllgather,
    HorovodAllreduce,
    HorovodAlltoall,
    HorovodBroadcast,
    HorovodGroupedAllreduce,
    HorovodReducescatter,
)
