"""The asynchronous collectives on torch tensors (every ``*_async`` function of
``horovod.torch``), with the helpers that validate tensors, view them as numpy
arrays and turn results back into tensors.

This is the layer under :mod:`hvdd.torch._autograd` (whose functions run
these in their forward and backward passes) and :mod:`hvdd.torch.mpi_ops`
(the public module, which re-exports them next to the blocking, in-place and
differentiable forms). It imports neither.

CUDA tensors go to :func:`hvdd.ops.submit_device`, which decides (through
:mod:`hvdd._cuda` and this package's exporter, :mod:`._cuda_export`)
whether the daemon takes them through CUDA IPC and how: allreduce, grouped
allreduce and broadcast in place on the device, an out-of-place op on a
device copy of its input in a slot of the session's pool; allgather,
alltoall and reducescatter with their output in daemon device memory,
copied into a new tensor on the input's device. Where that cannot be (a
CPU-only daemon, another GPU, an allocator legacy CUDA IPC cannot share)
it returns None, and they are staged through host memory as CPU tensors
are, with one warning. This module only adapts torch tensors: dtypes,
numpy views, results back into tensors.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Sequence, Tuple

import numpy as np
import torch

from .. import _cuda
from .. import basics as _basics
from . import _cuda_export  # noqa: F401 (registers torch's CUDA exporter)
from .. import ops as _ops
from .._client import Client, Handle
from .._proto import hvdd_pb2 as pb
from ..basics import Average, ProcessSet, global_process_set
from ..ops import handle_average_backwards_compatibility, process_set_for, synchronize

__all__ = [
    "allreduce_async",
    "allreduce_async_",
    "grouped_allreduce_async",
    "grouped_allreduce_async_",
    "sparse_allreduce_async",
    "allgather_async",
    "grouped_allgather_async",
    "broadcast_async",
    "broadcast_async_",
    "alltoall_async",
    "reducescatter_async",
    "grouped_reducescatter_async",
]

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
    tensor's); bfloat16 as its int16 bits, which the wire dtype names.

    A CPU tensor's own memory is viewed through DLPack where numpy gives a
    writable view (numpy 2), not through ``.numpy()``, which makes the
    tensor's storage unresizable for good (FSDP and DDP's hooks resize
    storages)."""
    t = tensor.detach()
    own = not t.is_cpu
    if own:
        t = t.cpu()
    if t.dtype is torch.bfloat16:
        t = t.view(torch.int16)
    if not own:
        try:
            a = np.from_dlpack(t)
        except (AttributeError, TypeError, BufferError, RuntimeError):
            a = None
        if a is not None and a.flags.writeable:
            return a
    return t.numpy()


def _to_torch(dtype: torch.dtype) -> Callable[[np.ndarray], torch.Tensor]:
    """Converts a result array (which the caller owns) to a tensor of dtype."""
    if dtype is torch.bfloat16:
        return lambda a: torch.from_numpy(a).view(torch.bfloat16)
    return torch.from_numpy


def _from_host(a: np.ndarray, like: torch.Tensor) -> torch.Tensor:
    """A device op's result the daemon answered in host memory: a tensor on
    like's device (``ops.submit_device``'s from_host)."""
    return _to_torch(like.dtype)(a).to(like.device)


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


def _prologue(
    kind: str,
    process_set: ProcessSet,
    op: Optional[int] = None,
    tensors: Optional[Sequence[torch.Tensor]] = None,
    resolve: Optional[Callable[[], Any]] = None,
) -> Tuple[Client, Any, Any]:
    """The prologue of every ``*_async``: what it checks before it sends
    anything, in Horovod's order (its Python checks the tensors and the op,
    then its C++ enqueue the process set). The client (ValueError before
    ``init()``); each of ``tensors`` (:func:`_check`; allreduce, allgather
    and reducescatter check their one tensor as they send it); the reduction
    op, when given (with Adasum's rules for an allreduce); then the process
    set, for a collective of ``kind`` (``ops.process_set_for``), or by
    ``resolve()`` where the collective checks it its own way (a broadcast's
    root, an alltoall's splits). Returns (client, op, what the process set's
    check returned). The public handle comes from :func:`_register`, once the
    collective is sent."""
    c = _basics.client()
    if tensors is not None:
        for t in tensors:
            _check(t)
    if op is not None:
        op = _reduce_op(op)
        if kind == "Allreduce":
            _ops.check_adasum(op, process_set)
    ps = resolve() if resolve is not None else process_set_for(kind, process_set)
    return c, op, ps


def _register(h: Handle) -> int:
    """The public handle (the next number) of a collective just sent."""
    return _ops.register(_ops.next_handle(), h)


# ------------------------------------------------------------------- allreduce


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
    if not tensor.is_cpu or _cuda.has_exporters():
        h = _ops.submit_device(
            c,
            pb.OP_ALLREDUCE,
            tensor,
            full_name,
            wire_dt,
            output,
            reduce_op=op,
            prescale=float(prescale_factor),
            postscale=float(postscale_factor),
            process_set=ps,
            group=group,
            group_size=group_size,
        )
        if h is not None:
            return h
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
    c, op, ps = _prologue("Allreduce", process_set, op)
    h = _allreduce_submit(c, tensor, output, _name("allreduce", name), op, prescale_factor, postscale_factor, ps)
    return _register(h)


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


def _grouped_allreduce_async(
    tensors: Sequence[torch.Tensor],
    outputs: Optional[Sequence[torch.Tensor]],
    name: Optional[str],
    op: int,
    prescale_factor: float,
    postscale_factor: float,
    process_set: ProcessSet,
) -> int:
    tensors = list(tensors)
    c, op, ps = _prologue("Allreduce", process_set, op, tensors)
    if len({t.device for t in tensors}) > 1:
        raise ValueError("Tensors in list must be on same device.")

    def sub(nm: str, i: int, gid: int, n: int) -> Handle:
        out = outputs[i] if outputs is not None else None
        return _allreduce_submit(c, tensors[i], out, nm, op, prescale_factor, postscale_factor, ps, gid, n)

    return _register(_ops.group(_name("grouped_allreduce", name), sub, len(tensors)))


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


# The gathered indices come from valid sparse tensors: no invariant checks,
# said explicitly where torch (>= 2.0) warns when it is not told.
try:
    torch.sparse_coo_tensor(torch.zeros(1, 0, dtype=torch.int64), torch.zeros(0), (1,), check_invariants=False)
    _COO_KW: dict = {"check_invariants": False}
except TypeError:  # torch < 2.0: no such argument
    _COO_KW = {}


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
        return torch.sparse_coo_tensor(indices.transpose(0, 1), values, t.size(), **_COO_KW)

    return handle


# ------------------------------------------------------------------- allgather


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
    if not tensor.is_cpu or _cuda.has_exporters():
        h = _ops.submit_device(
            c,
            kind,
            tensor,
            full_name,
            wire_dt,
            dtype=_DTYPES[tensor.dtype][1],
            from_host=_from_host,
            with_splits=with_splits,
            convert_splits=torch.from_numpy,
            process_set=ps,
            **kw,
        )
        if h is not None:
            return h
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
    c, _, ps = _prologue("Allgather", process_set)
    return _register(_output_submit(c, pb.OP_ALLGATHER, tensor, _name("allgather", name), ps))


def grouped_allgather_async(
    tensors: Sequence[torch.Tensor], name: Optional[str] = None, process_set: ProcessSet = global_process_set
) -> int:
    """Asynchronous grouped allgather; `synchronize()` returns a list."""
    tensors = list(tensors)
    c, _, ps = _prologue("Allgather", process_set, tensors=tensors)

    def sub(nm: str, i: int, gid: int, n: int) -> Handle:
        return _output_submit(c, pb.OP_ALLGATHER, tensors[i], nm, ps, group=gid, group_size=n)

    return _register(_ops.group(_name("grouped_allgather", name), sub, len(tensors)))


# ------------------------------------------------------------------- broadcast


def _broadcast_async(
    tensor: torch.Tensor, output: Optional[torch.Tensor], root_rank: int, name: Optional[str], process_set: ProcessSet
) -> int:
    c, _, ps = _prologue(
        "Broadcast", process_set, tensors=[tensor], resolve=lambda: _ops.check_root(root_rank, process_set)
    )
    wire_dt = _DTYPES[tensor.dtype][0]
    full_name = _name("broadcast", name)
    if not tensor.is_cpu or _cuda.has_exporters():
        h = _ops.submit_device(
            c, pb.OP_BROADCAST, tensor, full_name, wire_dt, output, root_rank=int(root_rank), process_set=ps
        )
        if h is not None:
            return _register(h)
    out, convert = _into(output) if output is not None else (None, _to_torch(tensor.dtype))
    h = _ops.submit_broadcast(c, _array(tensor), full_name, root_rank, ps, out=out, wire=wire_dt, convert=convert)
    return _register(h)


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


# -------------------------------------------------------------------- alltoall


def _splits_array(splits: Any) -> Optional[np.ndarray]:
    """splits as Horovod's alltoall takes them: a tensor as it is (its dtype
    and shape are checked: int32, 1-D), anything else as
    ``torch.tensor(splits, dtype=torch.int32)`` makes it."""
    if splits is None:
        return None
    if isinstance(splits, torch.Tensor):
        return _array(splits.contiguous())
    return np.asarray(splits, dtype=np.int32)


def alltoall_async(
    tensor: torch.Tensor,
    splits: Any = None,
    name: Optional[str] = None,
    process_set: ProcessSet = global_process_set,
) -> int:
    """A function that scatters slices of the input tensor to all other Horovod
    processes and returns a tensor of gathered slices from all other Horovod
    processes. The input tensor is not modified.

    The slicing is done on the first dimension, so the input tensors on
    the different processes must have the same rank and shape, except for the
    first dimension, which is allowed to be different.

    Arguments:
        tensor: A tensor to distribute with alltoall.
        splits: A tensor of integers in rank order describing how many
            elements in `tensor` to send to each worker (an int32 tensor, or
            a list). Splitting is applied along the first dimension of
            `tensor`. If `splits` is not provided, the first dimension is
            split equally by the number of Horovod processes.
        name: A name of the alltoall operation.
        process_set: Process set object to limit this operation to a subset of
            Horovod processes. Default is the global process set.

    Raises:
        ValueError: before anything is sent, with Horovod's messages, when the
            splits are not a 1-D int32 tensor, do not have one entry per
            process of the set, add up to more than the first dimension, or
            when there are no splits and the first dimension does not divide
            equally; or when this rank is not in the process set.

    Returns:
        A handle to the alltoall operation that can be used with `poll()` or
        `synchronize()`; `synchronize()` returns (output, received_splits).
    """
    c, _, (ps, sp) = _prologue(
        "Alltoall",
        process_set,
        tensors=[tensor],
        resolve=lambda: _ops.alltoall_splits(_splits_array(splits), tensor.shape, process_set),
    )
    h = _output_submit(c, pb.OP_ALLTOALL, tensor, _name("alltoall", name), ps, with_splits=True, splits=sp)
    return _register(h)


# --------------------------------------------------------------- reducescatter


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
    c, op, ps = _prologue("Reducescatter", process_set, op)
    h = _output_submit(
        c,
        pb.OP_REDUCESCATTER,
        tensor,
        _name("reducescatter", name),
        ps,
        reduce_op=op,
        prescale=float(prescale_factor),
        postscale=float(postscale_factor),
    )
    return _register(h)


def grouped_reducescatter_async(
    tensors: Sequence[torch.Tensor],
    name: Optional[str] = None,
    op: int = Average,
    process_set: ProcessSet = global_process_set,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> int:
    """Asynchronous grouped reducescatter; `synchronize()` returns a list."""
    tensors = list(tensors)
    c, op, ps = _prologue("Reducescatter", process_set, op, tensors)

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

    return _register(_ops.group(_name("grouped_reducescatter", name), sub, len(tensors)))
