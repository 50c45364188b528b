"""Framework-neutral collectives on numpy arrays, shared by ``hvdd.torch`` and
``hvdd.tensorflow`` (as Horovod shares ``horovod/common``).

A framework module turns its tensors into numpy arrays (views of their
memory where it can), and this module does the rest: it stages the bytes in
the client's shared-memory arena, names the collective, sends the Enqueue and
turns the daemon's answer back into an array. The handles it hands out are
Horovod's integer handles, for ``poll`` and ``synchronize``; the result of a
handle is the array (or list, or tuple) its ``finish`` makes, which the
framework module converts.

Every collective of every framework reaches the client through here, host
or device tensor: a device tensor that the daemon takes through CUDA IPC is
sent by :func:`submit_device`, with its DeviceBuffer (:mod:`hvdd._cuda`) in
place of staged bytes: it decides, for every framework, between CUDA IPC and
staging, in place or in a slot of the session's pool.

Names follow Horovod: ``"<op>.<name>"`` when the caller names the
collective, else ``"<op>.noname.<n>"``, so unnamed collectives match
across ranks by the order in which each rank issued them: n counts the
unnamed collectives since ``init()``, so that after an elastic reset the
survivors and a worker that just joined count alike.

Nothing here imports a framework; importing ``hvdd.tensorflow`` does not
import torch, nor the reverse.
"""

from __future__ import annotations

import io
import itertools
import pickle
import warnings
from typing import Any, Callable, List, Optional, Sequence, Tuple

import numpy as np

from . import _cuda
from . import basics as _basics
from ._client import Client, Handle
from ._proto import hvdd_pb2 as pb
from .basics import Average, ProcessSet, ReduceOp, Sum, global_process_set

try:  # Horovod pickles with cloudpickle; use it when present (lambdas, closures).
    import cloudpickle as _pickle  # type: ignore[import-not-found]
except ImportError:  # pragma: no cover - depends on the environment
    _pickle = pickle  # type: ignore[assignment]

__all__ = [
    "wire_dtype",
    "reduce_op",
    "process_set_for",
    "check_root",
    "alltoall_splits",
    "check_splits_type",
    "handle_average_backwards_compatibility",
    "collective_name",
    "next_handle",
    "register",
    "poll",
    "synchronize",
    "submit_allreduce",
    "submit_broadcast",
    "submit_output",
    "submit_device",
    "group",
    "allreduce",
    "grouped_allreduce",
    "allgather",
    "broadcast",
    "alltoall",
    "reducescatter",
    "join",
    "barrier",
    "broadcast_object",
    "allgather_object",
    "object_name",
]

# numpy dtype name -> wire dtype. bfloat16 is ml_dtypes' (what TensorFlow's
# .numpy() returns); torch hands its bfloat16 bits over as int16 and names
# the wire dtype itself.
_WIRE = {
    "uint8": pb.DTYPE_UINT8,
    "int8": pb.DTYPE_INT8,
    "uint16": pb.DTYPE_UINT16,
    "int16": pb.DTYPE_INT16,
    "int32": pb.DTYPE_INT32,
    "int64": pb.DTYPE_INT64,
    "float16": pb.DTYPE_FLOAT16,
    "bfloat16": pb.DTYPE_BFLOAT16,
    "float32": pb.DTYPE_FLOAT32,
    "float64": pb.DTYPE_FLOAT64,
    "bool": pb.DTYPE_BOOL,
}

# Public handles, as Horovod's handle manager hands them out.
_handle_map: dict[int, Tuple[Client, Handle]] = {}
_handles = itertools.count(1)
_groups = itertools.count(1)
_nonames = itertools.count(1)


# Unnamed broadcast_object/allgather_object calls so far: (kind, process set
# id) -> count (see object_name).
_object_calls: dict = {}


def reset_names() -> None:
    """Restarts the count of unnamed collectives (at every ``init()``)."""
    global _nonames
    _nonames = itertools.count(1)
    _object_calls.clear()


_basics._on_init.append(reset_names)


def wire_dtype(dtype: Any) -> int:
    """The wire dtype of a numpy dtype; ValueError for one the daemon does not
    reduce (as Horovod's ``Tensor type ... is not supported``)."""
    w = _wire_cache.get(dtype)
    if w is None:
        w = _WIRE.get(np.dtype(dtype).name)
        if w is None:
            raise ValueError(f"Tensor type {np.dtype(dtype).name} is not supported.")
        if isinstance(dtype, np.dtype):
            _wire_cache[dtype] = w
    return w


# numpy dtype -> wire dtype, for the dtypes seen (the name lookup costs more
# than a small collective's other client work).
_wire_cache: dict = {}


def reduce_op(op: Any) -> int:
    """Validates a reduction op (hvd.Average, Sum, Adasum, Min, Max, Product)."""
    try:
        r = _reduce_ops.get(op)  # the per-op path: a lookup, not an enum's call
    except TypeError:  # unhashable: the enum's error below
        r = None
    if r is not None:
        return r
    try:
        return int(ReduceOp(op))
    except ValueError:
        raise ValueError(f"Unknown reduction op {op!r}: use hvd.Average, Sum, Adasum, Min, Max or Product") from None


# every op's value (and member: IntEnum members hash as their values) -> int
_reduce_ops: dict = {int(m): int(m) for m in ReduceOp}


def check_adasum(op: int, process_set: ProcessSet) -> None:
    """Horovod's client-side rules for a dense op=Adasum allreduce: the global
    process set only, and a power-of-two number of ranks. (Horovod's GPU path,
    NCCL within a node, has other rules; hvdd's daemon reduces Adasum of
    device tensors in host memory, as CPU tensors.) The daemon checks the
    same, and the dtype."""
    if op != _basics.Adasum:
        return
    if process_set is not global_process_set and process_set.process_set_id != 0:
        raise NotImplementedError("Adasum does not support non-global process sets yet.")
    n = _basics.size()
    if n & (n - 1) != 0:
        raise NotImplementedError("Running Adasum with non-power of 2 ranks is not supported yet.")


# ------------------------------------------------------- Horovod's enqueue checks
#
# Horovod checks a collective's arguments as it enqueues it
# (horovod/common/operations.cc, EnqueueTensor*) and torch raises ValueError
# for what fails (Status::InvalidArgument), before anything is sent: so the
# job goes on, and the next collective works. These checks are Horovod's, in
# its order and with its texts; every framework module runs them. The daemon
# checks the same again, for clients that do not.


def _set_id(kind: str, process_set: ProcessSet) -> int:
    """The wire id of a registered process set (ValueError if not)."""
    if process_set is global_process_set:
        return 0
    pid = process_set.process_set_id
    if pid is None:
        raise ValueError(f"{kind}: Process set provided does not exist, or has not been registered.")
    return pid


def _check_member(kind: str, process_set: ProcessSet) -> None:
    """ValueError when this rank is not a member of process_set."""
    if process_set is global_process_set or process_set.process_set_id == 0 or process_set.ranks is None:
        return
    r = _basics.rank()
    if r not in process_set.ranks:
        raise ValueError(f"{kind}: Rank {r} is not a member of the provided process set.")


def process_set_for(kind: str, process_set: ProcessSet) -> int:
    """The wire id of process_set for a collective of kind (Horovod's name:
    ``Allreduce``, ``Allgather``, ``Broadcast``, ``Alltoall``,
    ``Reducescatter``, ``Barrier``). ValueError, with Horovod's text, when the
    set is not registered or this rank is not one of its members."""
    if process_set is global_process_set:
        return 0
    pid = _set_id(kind, process_set)
    _check_member(kind, process_set)
    return pid


def _set_size(process_set: ProcessSet) -> int:
    if process_set is global_process_set or process_set.process_set_id == 0:
        return _basics.size()
    return len(process_set.ranks or ())


def check_root(root_rank: int, process_set: ProcessSet) -> int:
    """A broadcast's checks: the root (a global rank) must be a member of the
    set, then this rank must be; returns the set's wire id."""
    pid = _set_id("Broadcast", process_set)
    if process_set is global_process_set or pid == 0:
        members_ok = 0 <= root_rank < _basics.size()
    else:
        members_ok = root_rank in (process_set.ranks or ())
    if not members_ok:
        raise ValueError(f"broadcast received invalid root rank {root_rank} for provided process set")
    _check_member("Broadcast", process_set)
    return pid


def check_splits_type(ndim: Optional[int], dtype: Any) -> None:
    """An alltoall's splits must be a 1-D (or scalar) tensor of int32: the
    checks a framework can make on a splits tensor whose values it does not
    have yet (ndim None: unknown)."""
    if ndim is not None and ndim > 1:
        raise ValueError("alltoall expects a 1D splits tensor")
    if np.dtype(dtype) != np.int32:
        raise ValueError("alltoall expects splits to contain 32-bit integer elements.")


def alltoall_splits(
    splits: Optional[np.ndarray], shape: Sequence[int], process_set: ProcessSet
) -> Tuple[int, Optional[List[int]]]:
    """Horovod's checks of an alltoall of a tensor of shape with splits (an
    array, as the framework gave it, or None): (the set's wire id, the splits
    to send, None for equal parts). Empty splits mean equal parts, as in
    Horovod. A rank-zero tensor is left to the daemon, which refuses it."""
    pid = _set_id("Alltoall", process_set)
    if splits is not None:
        check_splits_type(splits.ndim, splits.dtype)
    _check_member("Alltoall", process_set)
    sp = [] if splits is None else [int(x) for x in splits.reshape(-1)]
    if not len(shape):
        return pid, sp or None
    n, dim0 = _set_size(process_set), int(shape[0])
    if len(sp) == n:
        if sum(sp) > dim0:
            raise ValueError("Sum of splits entries is greater than the first dimension of tensor.")
        if any(x < 0 for x in sp):  # not checked by Horovod; the daemon's text
            raise ValueError("Splits entries must be non-negative.")
        return pid, sp
    if not sp:
        if dim0 % n != 0:
            raise ValueError(
                "splits not provided, but first dimension of tensor is not an even multiple of the number of workers."
            )
        return pid, None
    raise ValueError("Number of entries in splits does not equal number of workers.")


def handle_average_backwards_compatibility(op: Optional[int], average: Optional[bool]) -> int:
    """Resolves Horovod's deprecated ``average=`` against ``op=``."""
    if op is not None:
        if average is not None:
            raise ValueError("The op parameter supersedes average. Please provide only one of them.")
        return op
    if average is not None:
        warnings.warn(
            "Parameter `average` has been replaced with `op` and will be removed in v1.0",
            DeprecationWarning,
            stacklevel=3,
        )
        return Average if average else Sum
    return Average


def collective_name(kind: str, name: Optional[str]) -> str:
    """The name the daemon matches across ranks (see the module doc)."""
    return f"{kind}.{name}" if name is not None else f"{kind}.noname.{next(_nonames)}"


def next_handle() -> int:
    """A fresh public handle number."""
    return next(_handles)


def register(handle: int, h: Handle) -> int:
    """Makes h reachable through the public handle number; returns it."""
    _handle_map[handle] = (_basics.client(), h)
    return handle


def poll(handle: int) -> bool:
    """Polls an allreduce, allgather, alltoall, broadcast, or reducescatter
    handle to determine whether underlying asynchronous operation has
    completed. After `poll()` returns `True`, `synchronize()` will return
    without blocking.

    Returns:
        A flag indicating whether the operation has completed.
    """
    e = _handle_map.get(handle)
    if e is None:
        raise ValueError(f"Handle {handle} was not created or has been cleared.")
    return e[1].poll()


def synchronize(handle: int) -> Any:
    """Waits for a handle and returns its result (the framework's value that
    its ``finish`` made); None for a handle already synchronized. Raises
    HorovodInternalError if the collective failed."""
    e = _handle_map.pop(handle, None)
    if e is None:
        return None
    return e[0].complete(e[1])


# ------------------------------------------------------------------ submission


def _stage(c: Client, flat: np.ndarray) -> Tuple[Any, int, int]:
    """Copies a flat uint8 array into the arena: (region, offset, nbytes)."""
    nbytes = flat.size
    if nbytes == 0:
        return None, 0, 0
    region, off = c.stage(nbytes)
    region.array[off : off + nbytes] = flat
    return region, off, nbytes


def _bytes(a: np.ndarray) -> np.ndarray:
    """A flat uint8 view of a C-contiguous array's bytes (a copy when the
    array is not contiguous)."""
    return np.ascontiguousarray(a).reshape(-1).view(np.uint8)


def _new_array(b: np.ndarray, dtype: Any, shape: Sequence[int]) -> np.ndarray:
    """A new array owning a copy of the bytes b."""
    return b.copy().view(dtype).reshape(tuple(shape))


def submit_allreduce(
    c: Client,
    a: np.ndarray,
    name: str,
    op: int,
    prescale: float = 1.0,
    postscale: float = 1.0,
    ps: int = 0,
    out: Optional[np.ndarray] = None,
    wire: Optional[int] = None,
    group: int = 0,
    group_size: int = 0,
    convert: Optional[Callable[[np.ndarray], Any]] = None,
) -> Handle:
    """Sends an allreduce of a (reduced in the arena, in place). The handle's
    result is ``out`` with the result copied into its bytes (an array of a's
    bytes, e.g. a view of the caller's tensor), else a new array of a's dtype
    and shape, passed through ``convert`` when given."""
    return _submit_in_arena(
        c,
        pb.OP_ALLREDUCE,
        a,
        name,
        out,
        wire,
        convert,
        reduce_op=op,
        prescale=float(prescale),
        postscale=float(postscale),
        process_set=ps,
        group=group,
        group_size=group_size,
    )


def submit_broadcast(
    c: Client,
    a: np.ndarray,
    name: str,
    root_rank: int,
    ps: int = 0,
    out: Optional[np.ndarray] = None,
    wire: Optional[int] = None,
    convert: Optional[Callable[[np.ndarray], Any]] = None,
) -> Handle:
    """Sends a broadcast of a from the global rank root_rank; the result is as
    :func:`submit_allreduce`'s."""
    return _submit_in_arena(c, pb.OP_BROADCAST, a, name, out, wire, convert, root_rank=int(root_rank), process_set=ps)


def submit_send(
    c: Client, a: np.ndarray, name: str, peer: int, tag: int = 0, ps: int = 0, wire: Optional[int] = None
) -> Handle:
    """Sends a point-to-point send of a to the global rank ``peer``: a is
    staged now (the caller may change it at once); the handle's result is
    None once ``peer`` has received it (the matching recv: this rank as its
    source, the same tag and process set). The name plays no part in
    matching; it only has to be unique among the client's ops in flight."""
    if wire is None:
        wire = wire_dtype(a.dtype)
    region, off, nbytes = _stage(c, _bytes(a))
    return c.submit(
        pb.OP_SEND, name, wire, a.shape, region, off, nbytes, process_set=ps, peer_rank=int(peer), tag=int(tag)
    )


def submit_recv(
    c: Client,
    a: np.ndarray,
    name: str,
    peer: int,
    tag: int = 0,
    ps: int = 0,
    out: Optional[np.ndarray] = None,
    wire: Optional[int] = None,
) -> Handle:
    """Sends a point-to-point recv, from the global rank ``peer``, of a
    tensor of a's dtype and size (what peer sends must agree, else both
    fail with a mismatch); a's values are not read. The daemon writes the
    bytes into staging; the handle's result is as
    :func:`submit_allreduce`'s (``out`` with them copied in, else a new
    array)."""
    if wire is None:
        wire = wire_dtype(a.dtype)
    nbytes = a.nbytes
    region, off = c.stage(nbytes) if nbytes else (None, 0)
    h = c.submit(
        pb.OP_RECV, name, wire, a.shape, region, off, nbytes, process_set=ps, peer_rank=int(peer), tag=int(tag)
    )
    dtype, shape = a.dtype, a.shape

    def finish(h: Handle) -> Any:
        if out is not None:
            if h.region is not None:
                out.reshape(-1).view(np.uint8)[:] = h.region.array[h.offset : h.offset + nbytes]
            return out
        if h.region is None:
            return np.empty(shape, dtype=dtype)
        return _new_array(h.region.array[h.offset : h.offset + nbytes], dtype, shape)

    h.finish = finish
    return h


def _submit_in_arena(
    c: Client,
    kind: int,
    a: np.ndarray,
    name: str,
    out: Optional[np.ndarray],
    wire: Optional[int],
    convert: Optional[Callable[[np.ndarray], Any]],
    **kw: Any,
) -> Handle:
    """Stages a and sends a collective whose result the daemon writes over the
    staged bytes (allreduce, broadcast). The handle's result is those bytes
    copied into out's bytes, or into a new array of a's dtype and shape,
    passed through convert."""
    if wire is None:
        wire = wire_dtype(a.dtype)  # before staging: an unsupported dtype stages nothing
    region, off, nbytes = _stage(c, _bytes(a))
    h = c.submit(kind, name, wire, a.shape, region, off, nbytes, **kw)
    dtype, shape = a.dtype, a.shape
    if out is not None:
        out_flat = out.reshape(-1).view(np.uint8)

        def finish(h: Handle) -> Any:
            if h.region is not None:
                out_flat[:] = h.region.array[h.offset : h.offset + nbytes]
            return convert(out) if convert is not None else out

    else:

        def finish(h: Handle) -> Any:
            if h.region is None:
                r = np.empty(shape, dtype=dtype)
            else:
                r = _new_array(h.region.array[h.offset : h.offset + nbytes], dtype, shape)
            return convert(r) if convert is not None else r

    h.finish = finish
    return h


def submit_output(
    c: Client,
    kind: int,
    a: np.ndarray,
    name: str,
    ps: int = 0,
    with_splits: bool = False,
    wire: Optional[int] = None,
    convert: Optional[Callable[[np.ndarray], Any]] = None,
    convert_splits: Optional[Callable[[np.ndarray], Any]] = None,
    **kw: Any,
) -> Handle:
    """Sends a collective whose result the daemon allocates (allgather,
    alltoall, reducescatter; ``kw`` carries splits, reduce_op, scales, group).
    The result is a new array (converted), or (array, received splits as
    int32) when with_splits."""
    if wire is None:
        wire = wire_dtype(a.dtype)
    region, off, nbytes = _stage(c, _bytes(a))
    h = c.submit(kind, name, wire, a.shape, region, off, nbytes, process_set=ps, **kw)
    dtype = a.dtype
    rest = tuple(a.shape[1:])

    def finish(h: Handle) -> Any:
        d = h.done
        if d is None or not d.HasField("output") or d.output.length == 0:
            shape = tuple(d.output_shape) if d is not None and len(d.output_shape) else (0,) + rest
            r = np.empty(shape, dtype=dtype)
        else:
            try:
                r = _new_array(c.output(d.output), dtype, tuple(d.output_shape))
            finally:
                c.release(d.output)
        if convert is not None:
            r = convert(r)
        if with_splits:
            rs = np.array(list(d.received_splits) if d is not None else [], dtype=np.int32)
            return r, (convert_splits(rs) if convert_splits is not None else rs)
        return r

    h.finish = finish
    return h


# ------------------------------------------------------------ device tensors
#
# A device tensor the daemon takes in place travels as an encoded
# DeviceBuffer (hvdd._cuda.DeviceSession.buffer: a CUDA IPC handle of its
# memory, not its bytes) instead of staged bytes. submit_device decides,
# through the tensor's exporter and the connection's session (hvdd._cuda),
# whether it can and how; a framework module only adapts its tensors, and
# stages what submit_device hands back (None) as it stages host tensors.


def submit_device(
    c: Client,
    kind: int,
    tensor: Any,
    name: str,
    wire: int,
    output: Any = None,
    dtype: Any = None,
    from_host: Optional[Callable[[np.ndarray, Any], Any]] = None,
    with_splits: bool = False,
    convert_splits: Optional[Callable[[np.ndarray], Any]] = None,
    **kw: Any,
) -> Optional[Handle]:
    """Sends a collective of kind on a device tensor through CUDA IPC, or
    returns None: the tensor is not device memory an exporter claims, is
    empty, or must be staged (hvdd._cuda warned why), and the caller stages
    it. ``kw`` as for :meth:`Client.submit` (reduce_op, scales, root_rank,
    splits, group, process_set).

    Allreduce and broadcast run in place: on ``output`` (tensor itself for
    the in-place forms; another tensor of the exporter's takes a copy of
    tensor first), or, out of place (output None), on a copy of tensor in a
    slot of the session's pool (``DeviceSession.slot``), copied out into a
    new tensor, the result, when the op completes; where no slot serves, on
    a device copy of tensor of its own that becomes the result.

    Allgather, alltoall and reducescatter get their output as the daemon's
    device memory (``Done.device_output``), copied into a new tensor like
    tensor in the exporter's memory; should the daemon answer in host
    memory, an array of numpy ``dtype``, which ``from_host(array, tensor)``
    makes a tensor on tensor's device. Their result is that tensor, or (tensor, received
    splits as int32, through ``convert_splits``) when with_splits."""
    ex = _cuda.exporter_for(tensor)
    if ex is None or ex.nbytes(tensor) == 0:
        return None
    s = _cuda.session(c, ex)
    if not s.usable(tensor):
        return None
    if kind == pb.OP_ALLREDUCE or kind == pb.OP_BROADCAST:
        return _device_in_place(c, s, kind, tensor, output, name, wire, kw)
    dev = s.buffer(tensor)
    if dev is None:
        return None
    return _device_output(c, s, kind, tensor, dev, name, wire, dtype, from_host, with_splits, convert_splits, kw)


def _device_in_place(
    c: Client, s: Any, kind: int, tensor: Any, output: Any, name: str, wire: int, kw: dict
) -> Optional[Handle]:
    """submit_device's allreduce and broadcast."""
    ex = s.exporter
    if output is None:
        slot = s.slot(tensor)
        if slot is not None:
            h = _slot_submit(c, s, slot, kind, tensor, name, wire, kw)
            if h is not None:
                return h
        buf = ex.empty_like(tensor)  # a copy of its own, as without a pool
        ex.copy(buf, tensor)
    elif output is tensor:
        buf = tensor
    elif ex.claims(output) and ex.fits(output, tensor):
        ex.copy(output, tensor)
        buf = output
    else:
        return None
    dev = s.buffer(buf)
    if dev is None:
        return None
    h = c.submit(kind, name, wire, tensor.shape, device=dev, **kw)

    def finish(h: Handle) -> Any:
        s.wait_done(h, buf)  # GPU-ordered completion: the current stream after the daemon's work
        return buf  # the tensor whose memory the buffer is, held until the Done

    h.finish = finish
    return h


def _slot_submit(
    c: Client, s: Any, slot: Any, kind: int, tensor: Any, name: str, wire: int, kw: dict
) -> Optional[Handle]:
    """Sends an out-of-place collective on a copy of tensor in slot; the
    result is copied out of it when the op completes. None (the slot freed,
    the session's pools off) when the pool's memory cannot be exported
    (warned once)."""
    try:
        s.exporter.copy(slot.view, tensor)
        dev = s.buffer(slot.view)
        if dev is None:
            s.pool_refused()
            slot.free()
            return None
        h = c.submit(kind, name, wire, tensor.shape, device=dev, **kw)
    except BaseException:
        slot.free()
        raise
    # The slot is the daemon's until the Done: freed by the result's copy,
    # or, should the op fail (no finish runs), once its handle is gone.
    slot.lend(h)

    def finish(h: Handle, slot: Any = slot) -> Any:
        s.wait_done(h, slot.view)  # before the copy out of the slot
        return slot.result()

    h.finish = finish
    return h


def _device_output(
    c: Client,
    s: Any,
    kind: int,
    source: Any,
    device: bytes,
    name: str,
    wire: int,
    dtype: Any,
    from_host: Optional[Callable[[np.ndarray, Any], Any]],
    with_splits: bool,
    convert_splits: Optional[Callable[[np.ndarray], Any]],
    kw: dict,
) -> Handle:
    """submit_device's allgather, alltoall and reducescatter: source sent as
    device (its encoded DeviceBuffer), held by the handle until the Done.
    The session keeps the daemon's output buffers mapped: they come back op
    after op; each is released once copied."""
    h = c.submit(kind, name, wire, source.shape, device=device, **kw)
    rest = tuple(source.shape[1:])
    ex = s.exporter

    def finish(h: Handle) -> Any:
        d = h.done
        shape = tuple(d.output_shape) if d is not None and len(d.output_shape) else (0,) + rest
        if d is not None and d.HasField("device_output") and d.device_output.length:
            o = d.device_output
            try:
                out = ex.new_empty(source, shape)
                s.read_output(out, o.mem_handle, o.alloc_size, o.offset, o.length)
            finally:
                c.release_device_output(o.mem_handle)
        elif d is not None and d.HasField("output") and d.output.length:
            try:
                a = _new_array(c.output(d.output), dtype, shape)
            finally:
                c.release(d.output)
            out = from_host(a, source) if from_host is not None else a
            if not ex.claims(out):
                o2 = ex.new_empty(source, shape)
                ex.copy(o2, out)
                out = o2
        else:
            out = ex.new_empty(source, shape)
        if with_splits:
            rs = np.array(list(d.received_splits) if d is not None else [], dtype=np.int32)
            return out, (convert_splits(rs) if convert_splits is not None else rs)
        return out

    h.finish = finish
    return h


def group(base: str, submit: Callable[[str, int, int, int], Handle], n: int) -> Handle:
    """A grouped collective: ``submit(name, index, group, n)`` sends member
    index; members are named ``<base>_<i>of<n>`` and negotiated as one unit.
    The handle's result is the list of the members' results."""
    gid = next(_groups)
    g = Handle(0, base)
    g.members = [submit(f"{base}_{i + 1}of{n}", i, gid, n) for i in range(n)]
    return g


# --------------------------------------------------- blocking array collectives
#
# Each takes arrays and returns arrays; the name is the full collective name
# when given (``full_name``), else made from ``name`` (collective_name).


def _full(kind: str, name: Optional[str], full_name: Optional[str]) -> str:
    return full_name if full_name is not None else collective_name(kind, name)


def allreduce(
    a: np.ndarray,
    op: int = Average,
    name: Optional[str] = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
    full_name: Optional[str] = None,
) -> np.ndarray:
    """Allreduce of one array; returns a new array."""
    c = _basics.client()
    h = submit_allreduce(
        c,
        a,
        _full("allreduce", name, full_name),
        reduce_op(op),
        prescale_factor,
        postscale_factor,
        process_set_for("Allreduce", process_set),
    )
    return c.complete(h)


def grouped_allreduce(
    arrays: Sequence[np.ndarray],
    op: int = Average,
    name: Optional[str] = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
    full_name: Optional[str] = None,
    groups: Optional[Sequence[Sequence[int]]] = None,
) -> List[np.ndarray]:
    """Allreduce of several arrays, sent together and negotiated as one group
    (or as the given groups of indices, each its own group, all sent before
    any is waited for) so that the daemon fuses them. Returns new arrays in
    the input order."""
    c = _basics.client()
    op = reduce_op(op)
    ps = process_set_for("Allreduce", process_set)
    arrays = list(arrays)
    if not arrays:
        return []
    base = _full("grouped_allreduce", name, full_name)
    parts = [list(range(len(arrays)))] if groups is None else [list(g) for g in groups if len(g)]
    handles = []
    for k, idx in enumerate(parts):
        gname = base if len(parts) == 1 else f"{base}.g{k}"

        def sub(nm: str, i: int, gid: int, n: int, idx: list[int] = idx) -> Handle:
            return submit_allreduce(
                c, arrays[idx[i]], nm, op, prescale_factor, postscale_factor, ps, group=gid, group_size=n
            )

        handles.append((idx, group(gname, sub, len(idx))))
    out: List[Any] = [None] * len(arrays)
    first: Optional[BaseException] = None
    for idx, h in handles:  # wait for every group before raising
        try:
            for i, r in zip(idx, c.complete(h)):
                out[i] = r
        except BaseException as e:
            first = first or e
    if first is not None:
        raise first
    return out


def allgather(
    a: np.ndarray,
    name: Optional[str] = None,
    process_set: ProcessSet = global_process_set,
    full_name: Optional[str] = None,
) -> np.ndarray:
    """Allgather along the first dimension (which may differ per rank)."""
    c = _basics.client()
    h = submit_output(
        c, pb.OP_ALLGATHER, a, _full("allgather", name, full_name), process_set_for("Allgather", process_set)
    )
    return c.complete(h)


def broadcast(
    a: np.ndarray,
    root_rank: int,
    name: Optional[str] = None,
    process_set: ProcessSet = global_process_set,
    full_name: Optional[str] = None,
) -> np.ndarray:
    """Broadcast from the global rank root_rank; returns a new array."""
    c = _basics.client()
    h = submit_broadcast(c, a, _full("broadcast", name, full_name), root_rank, check_root(root_rank, process_set))
    return c.complete(h)


def alltoall(
    a: np.ndarray,
    splits: Optional[Sequence[int]] = None,
    name: Optional[str] = None,
    process_set: ProcessSet = global_process_set,
    full_name: Optional[str] = None,
) -> Tuple[np.ndarray, np.ndarray]:
    """Alltoall along the first dimension: (output, received splits). splits
    is an int32 array, or a sequence of ints (see :func:`alltoall_splits`)."""
    c = _basics.client()
    if splits is not None and not isinstance(splits, np.ndarray):
        splits = np.asarray(splits, dtype=np.int32)
    ps, sp = alltoall_splits(splits, a.shape, process_set)
    h = submit_output(c, pb.OP_ALLTOALL, a, _full("alltoall", name, full_name), ps, with_splits=True, splits=sp)
    return c.complete(h)


def reducescatter(
    a: np.ndarray,
    op: int = Average,
    name: Optional[str] = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
    full_name: Optional[str] = None,
) -> np.ndarray:
    """Reduce, then this rank's block of rows (the first d0 % n ranks get one
    more)."""
    c = _basics.client()
    h = submit_output(
        c,
        pb.OP_REDUCESCATTER,
        a,
        _full("reducescatter", name, full_name),
        process_set_for("Reducescatter", process_set),
        reduce_op=reduce_op(op),
        prescale=float(prescale_factor),
        postscale=float(postscale_factor),
    )
    return c.complete(h)


def join() -> int:
    """Marks this rank as out of data and blocks until every rank has joined;
    meanwhile it takes part in the others' allreduces with zeros. Returns the
    rank that joined last."""
    c = _basics.client()
    h = c.submit(pb.OP_JOIN, "")
    c.complete(h)
    return int(h.done.last_joined_rank) if h.done is not None else 0


def barrier(process_set: ProcessSet = global_process_set) -> None:
    """Blocks until every rank of the process set has reached it."""
    c = _basics.client()
    c.complete(c.submit(pb.OP_BARRIER, "", process_set=process_set_for("Barrier", process_set)))


# ------------------------------------------------------------ Python objects


def object_name(kind: str, process_set: ProcessSet) -> str:
    """The name of an unnamed object collective: its kind, its process set and
    the count of such calls on that set since ``init()``, the same on every
    member of the set whatever its object. (Horovod names it after the
    object's type, which differs between ranks in the commonest idiom,
    ``broadcast_object(obj if hvd.rank() == 0 else None)``: Horovod's eager
    TensorFlow ops match by submission order and do not mind; hvdd matches by
    name, as Horovod's torch ops do.)"""
    pid = 0 if process_set is global_process_set else process_set.process_set_id
    n = _object_calls.get((kind, pid), 0) + 1
    _object_calls[(kind, pid)] = n
    return f"{kind}.noname.{pid}.{n}"


def broadcast_object(
    obj: Any, root_rank: int = 0, name: Optional[str] = None, process_set: ProcessSet = global_process_set
) -> Any:
    """Pickles obj on the root and returns it unpickled on every rank: its size
    is broadcast as ``<name>.sz``, then its bytes as ``<name>.t``, as Horovod
    does (name defaults to :func:`object_name`'s)."""
    if name is None:
        name = object_name("broadcast_object", process_set)
    if _basics.rank() == root_rank:
        b = io.BytesIO()
        _pickle.dump(obj, b)
        data = np.frombuffer(b.getvalue(), dtype=np.uint8)
        broadcast(np.array([data.size], dtype=np.int32), root_rank, name + ".sz", process_set)
        broadcast(data, root_rank, name + ".t", process_set)
        return obj
    sz = broadcast(np.zeros(1, dtype=np.int32), root_rank, name + ".sz", process_set)
    data = broadcast(np.zeros(int(sz[0]), dtype=np.uint8), root_rank, name + ".t", process_set)
    return _pickle.loads(data.tobytes())


def allgather_object(obj: Any, name: Optional[str] = None, process_set: ProcessSet = global_process_set) -> List[Any]:
    """Pickles obj on every rank and returns the list of every rank's object,
    in rank order (sizes gathered as ``<name>.sz``, bytes as ``<name>.t``;
    name defaults to :func:`object_name`'s)."""
    if name is None:
        name = object_name("allgather_object", process_set)
    data = np.frombuffer(_pickle.dumps(obj), dtype=np.uint8)
    sizes = allgather(np.array([data.size], dtype=np.int32), name + ".sz", process_set)
    gathered = allgather(data, name + ".t", process_set)
    offs = np.concatenate([[0], np.cumsum(sizes)])
    return [_pickle.loads(gathered[offs[i] : offs[i + 1]].tobytes()) for i in range(len(sizes))]
