"""Horovod's ``horovod/tensorflow/mpi_ops.py`` on hvdd: collectives on
TensorFlow tensors, in eager mode, inside ``tf.function`` and in TF1 graphs.

There is no compiled op library. Each collective is a Python function over
numpy arrays (``hvdd.ops``); in eager mode it runs at once on the tensors'
values, and in a graph it becomes one node that runs it when the graph runs.
Gradients are registered with ``tf.custom_gradient``, as Horovod registers
them for its ops: an allreduce's gradient is the allreduce of the gradient,
an allgather's is this rank's slice of the gradient averaged over the ranks
(Horovod 0.28.1's; older Horovod summed), a broadcast's is the gradient
averaged over the ranks on the root and zero elsewhere.

A graph collective must not hold one of TensorFlow's inter-op threads while
it waits for the other ranks. A TF1 ``Session.run`` that fetches independent
collectives runs them in a different order on every rank; if each waiting
collective held a thread, every rank could fill its few threads (as many as
cores, by default) with collectives the others have not started, and the
step would never end. Horovod's kernels are asynchronous and let go of the
thread; a ``tf.numpy_function`` cannot. So the node (:func:`_graph_call`) is
a ``DatasetToSingleElement`` of a one-element dataset whose map function is
the ``numpy_function``: that kernel is asynchronous and runs the dataset on
a thread of its own, and the map function, built with
``use_inter_op_parallelism=False``, runs inline on that thread. Every
collective a rank's graph can run is therefore submitted, whatever the
executor's order and thread count. (``tf.function`` also chains stateful
nodes in program order, so its collectives are submitted in the same order
on every rank.)

GPU tensors are staged through host memory: TensorFlow offers no CUDA IPC
handle of a tensor's device memory (no counterpart of torch's storage
sharing), so the daemon cannot take a GPU tensor in place. Their values are
copied to the host (``numpy()``; in a graph, TensorFlow copies a
``numpy_function``'s inputs to the host) and the results come back as new
tensors. The first GPU tensor warns once per process
(:class:`hvdd._cuda.HvddStagingWarning`), chosen by the tensor's device
string (:func:`hvdd._cuda.staged_device`).

Names: a graph collective is named after its input tensor (Horovod's
``HorovodAllreduce_<tensor name>``), which is the same on every rank running
the same program; in eager mode an unnamed collective is named by call order,
as ``hvdd.torch`` names them.
"""

from __future__ import annotations

import re
import threading
import time
import warnings
from typing import Any, Callable, List, Optional, Sequence

import numpy as np
import tensorflow as tf

from .. import _cuda, _env
from .. import basics as _basics
from .. import ops as _ops
from .._proto import hvdd_pb2 as pb
from ..basics import Adasum, Average, ProcessSet, Sum, global_process_set
from .compression import Compression

try:
    from tensorflow.python.eager.context import context as _context
    from tensorflow.python.framework.ops import EagerTensor as _EagerTensor
except ImportError:  # pragma: no cover - a TensorFlow without these: no fast path

    class _EagerTensor:  # type: ignore[no-redef]
        pass


__all__ = [
    "allreduce",
    "grouped_allreduce",
    "allgather",
    "grouped_allgather",
    "broadcast",
    "broadcast_",
    "alltoall",
    "reducescatter",
    "grouped_reducescatter",
    "join",
    "barrier",
    "size_op",
    "local_size_op",
    "rank_op",
    "local_rank_op",
    "process_set_included_op",
    "handle_average_backwards_compatibility",
]

handle_average_backwards_compatibility = _ops.handle_average_backwards_compatibility


def _executing_eagerly() -> bool:
    return tf.executing_eagerly()


def _normalize_name(name: str) -> str:
    """Normalizes operation name to TensorFlow rules."""
    return re.sub("[^a-zA-Z0-9_]", "_", name)


_supported: dict = {}  # tf.DType -> bool


def _check_dtype(dtype: tf.DType) -> None:
    ok = _supported.get(dtype)
    if ok is None:
        try:
            _ops.wire_dtype(np.dtype(dtype.as_numpy_dtype))
            ok = True
        except (TypeError, ValueError):
            ok = False
        _supported[dtype] = ok
    if not ok:
        raise ValueError(f"Tensor type {dtype.name} is not supported.")


def _name(kind: str, prefix: str, tensor: Any, name: Optional[str], ignore_name_scope: bool) -> str:
    """The collective's name (see the module doc); prefix is Horovod's op type
    (HorovodAllreduce, ...)."""
    if _executing_eagerly():
        return _ops.collective_name(kind, name)
    if name is None:
        name = f"{prefix}_{_normalize_name(tensor.name)}"
    # Unique in the graph, as TensorFlow makes node names (x, x_1, ...): two
    # collectives of one tensor in one graph do not share a name.
    g = tf.compat.v1.get_default_graph()
    if ignore_name_scope:
        with g.name_scope(None):
            return f"{kind}.{g.unique_name(name)}"
    return f"{kind}.{g.unique_name(name)}"


# Graph collectives waiting now: id -> [start, name, warned]. A watchdog
# thread warns about one that waits longer than HVDD_GRAPH_WAIT_WARN seconds
# (default 60), naming it in the rank's own output (the daemon's stall
# warning goes to the daemon's log).
_waiting: dict = {}
_watchdog: Optional[threading.Thread] = None
_WAIT_WARNING = (
    "hvdd: the graph collective {name!r} has waited {secs:.0f} s for other ranks: another rank may not "
    "run it (a different graph or fetches there, or a rank that stopped before it)."
)


def _watch() -> None:
    limit = _env.graph_wait_warn()
    while True:
        time.sleep(min(5.0, limit / 2))
        now = time.monotonic()
        for entry in list(_waiting.values()):
            if not entry[2] and now - entry[0] > limit:
                entry[2] = True
                warnings.warn(_WAIT_WARNING.format(name=entry[1], secs=now - entry[0]), RuntimeWarning, stacklevel=1)


def _watched(fn: Callable[..., Any], name: str) -> Callable[..., Any]:
    """fn, registered with the watchdog while it runs."""

    def run(*arrays: np.ndarray) -> Any:
        global _watchdog
        if _watchdog is None:
            _watchdog = threading.Thread(target=_watch, name="hvdd-graph-watchdog", daemon=True)
            _watchdog.start()
        entry = [time.monotonic(), name, False]
        _waiting[id(entry)] = entry
        try:
            return fn(*arrays)
        finally:
            del _waiting[id(entry)]

    return run


_XLA_ERROR = (
    "hvdd: a collective cannot run inside XLA-compiled code (tf.function(jit_compile=True), or Keras' "
    "model.compile with jit_compile=True, its default when a GPU is present): pass jit_compile=False"
)


def _check_not_xla() -> None:
    """Raises ValueError when the graph being built will be compiled by XLA,
    which cannot run a numpy_function (TensorFlow's own error would say only
    that no PyFunc kernel is registered for XLA)."""
    if _in_xla(tf.compat.v1.get_default_graph()):
        raise ValueError(_XLA_ERROR)


try:
    from tensorflow.python.ops.control_flow_util import GraphOrParentsInXlaContext as _in_xla
except ImportError:  # pragma: no cover - older TensorFlow

    def _in_xla(graph: Any) -> bool:
        return False


def _run(
    fn: Callable[..., Sequence[np.ndarray]],
    inputs: Sequence[tf.Tensor],
    touts: Sequence[tf.DType],
    shapes: Sequence[Any],
    name: str,
) -> List[tf.Tensor]:
    """Runs fn over the inputs' values: now in eager mode, else as one graph
    node. fn takes numpy arrays and returns a list of arrays."""
    for t in inputs:
        _note_device(t)
    if _executing_eagerly():
        outs = fn(*[t.numpy() for t in inputs])
        return [tf.convert_to_tensor(o) for o in outs]
    outs = _graph_call(fn, list(inputs), list(touts), name)
    for o, s in zip(outs, shapes):
        o.set_shape(s)
    return outs


try:  # TensorFlow >= 2.13; before, dataset_ops.MapDataset
    from tensorflow.python.data.ops.map_op import _MapDataset
except ImportError:  # pragma: no cover - older TensorFlow
    try:
        from tensorflow.python.data.ops.dataset_ops import MapDataset as _MapDataset
    except ImportError:
        _MapDataset = None


def _graph_call(fn: Callable[..., Any], inputs: List[tf.Tensor], touts: List[tf.DType], name: str) -> List[tf.Tensor]:
    """fn(*input arrays) as a graph node that does not hold an inter-op thread
    while fn waits for the other ranks (see the module doc): a
    ``numpy_function`` in the map function of a one-element dataset, run by
    ``DatasetToSingleElement`` (an asynchronous kernel that runs the dataset
    on a thread of its own), with ``use_inter_op_parallelism=False`` (the
    function runs inline on that thread, not on the inter-op pool)."""
    _check_not_xla()
    watched = _watched(fn, name)
    node = _normalize_name(name)[:200]
    if not node[:1].isalnum():  # a TF1 name scope starts so
        node = "hvdd" + node
    if _MapDataset is None:  # pragma: no cover - older TensorFlow: a thread held
        outs = tf.numpy_function(watched, inputs, touts, stateful=True, name=node)
        return list(outs) if isinstance(outs, (list, tuple)) else [outs]
    if not inputs:  # a dataset element needs a component
        inputs, f = [tf.zeros([0], tf.int8)], lambda _: watched()
    else:
        f = watched

    def call(*xs: tf.Tensor) -> Any:
        outs = tf.numpy_function(f, list(xs), touts, stateful=True, name=node)
        return tuple(outs) if isinstance(outs, (list, tuple)) else (outs,)

    # tf.data has CPU kernels only: placed there under any device scope
    # (TensorFlow copies a GPU tensor's value to the host, as it does for a
    # numpy_function's inputs).
    with tf.name_scope(node), tf.device("/device:CPU:0"):
        ds = _MapDataset(tf.data.Dataset.from_tensors(tuple(inputs)), call, use_inter_op_parallelism=False)
        return list(ds.get_single_element())


try:  # TensorFlow >= 2.13
    from tensorflow.python.eager.record import could_possibly_record as _could_record
except ImportError:  # pragma: no cover - older TensorFlow

    def _could_record() -> bool:
        return True


def _differentiable(forward: Callable[..., Any], grad: Callable[..., Any], xs: Sequence[tf.Tensor]) -> Any:
    """forward(*xs) with ``grad(ys, *dys)`` as its gradient; in eager mode with
    no tape recording, just forward(*xs) (custom_gradient costs more than a
    small collective)."""
    if _executing_eagerly() and not _could_record():
        return forward(*xs)

    @tf.custom_gradient
    def f(*xs: tf.Tensor) -> Any:
        ys = forward(*xs)
        return ys, lambda *dys: grad(ys, *dys)

    return f(*xs)


def _tensor(x: Any) -> tf.Tensor:
    """A tensor of x's value (variables read), so that custom gradients see a
    plain input."""
    if isinstance(x, tf.Tensor):
        return x
    if isinstance(x, tf.Variable):
        return x.read_value() if not _executing_eagerly() else tf.convert_to_tensor(x)
    return tf.convert_to_tensor(x)


def _zeros_for_none(dys: Sequence[Any], ys: Sequence[tf.Tensor]) -> List[tf.Tensor]:
    return [tf.zeros_like(y) if dy is None else dy for dy, y in zip(dys, ys)]


def _set_size(process_set: ProcessSet) -> int:
    n = process_set.size()
    if n is None:
        raise ValueError("Process set provided does not exist, or has not been registered.")
    return n


# ------------------------------------------------------------------ allreduce


def _allreduce(
    tensor: Any,
    name: Optional[str] = None,
    op: int = Sum,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    ignore_name_scope: bool = False,
    process_set: ProcessSet = global_process_set,
) -> tf.Tensor:
    """An op which reduces an input tensor over all the Horovod processes. The
    default reduction is a sum. Differentiable: the gradient is the allreduce
    of the gradient with the same op and scale factors."""
    return _grouped_allreduce(
        [tensor], name, op, prescale_factor, postscale_factor, ignore_name_scope, process_set, single=True
    )[0]


def _grouped_allreduce(
    tensors: Sequence[Any],
    name: Optional[str] = None,
    op: int = Sum,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    ignore_name_scope: bool = False,
    process_set: ProcessSet = global_process_set,
    groups: Optional[Sequence[Sequence[int]]] = None,
    single: bool = False,
) -> List[tf.Tensor]:
    """Allreduce of a list of tensors as one graph node (one group, or the
    given groups of indices), differentiable."""
    op = _ops.reduce_op(op)
    ps_id = _ops.process_set_for("Allreduce", process_set)
    xs = [_tensor(t) for t in tensors]
    if not xs:
        return []
    for x in xs:
        _check_dtype(x.dtype)
    if single:
        full = _name("allreduce", "HorovodAllreduce", xs[0], name, ignore_name_scope)
    else:
        full = _name("grouped_allreduce", "HorovodGroupedAllreduce", xs[0], name, ignore_name_scope)
    pre, post = float(prescale_factor), float(postscale_factor)

    def fn(*arrays: np.ndarray) -> List[np.ndarray]:
        c = _basics.client()
        if single:
            return [c.complete(_ops.submit_allreduce(c, arrays[0], full, op, pre, post, ps_id))]
        return _ops.grouped_allreduce(arrays, op, None, pre, post, process_set, full_name=full, groups=groups)

    def forward(*xs: tf.Tensor) -> List[tf.Tensor]:
        return _run(fn, xs, [x.dtype for x in xs], [x.shape for x in xs], full)

    def grad(ys: List[tf.Tensor], *dys: tf.Tensor) -> Any:
        dys = _zeros_for_none(dys, ys)
        return _grouped_allreduce(
            dys, None, op, pre, post, ignore_name_scope, process_set, groups=groups, single=single
        )

    return list(_differentiable(forward, grad, xs))


def _eager_allreduce(
    tensor: Any,
    value: np.ndarray,
    name: Optional[str],
    op: int,
    prescale: float,
    postscale: float,
    process_set: ProcessSet,
) -> tf.Tensor:
    """allreduce's path for the commonest eager call (a tensor or variable
    whose value is ``value``, no compression, no tape recording): the same
    collective as
    :func:`_grouped_allreduce` without the TensorFlow conversions around it,
    which cost more than a small collective itself."""
    op = _ops.reduce_op(op)
    _check_dtype(tensor.dtype)
    _note_device(tensor)
    c = _basics.client()
    h = _ops.submit_allreduce(
        c,
        value,
        _ops.collective_name("allreduce", name),
        op,
        float(prescale),
        float(postscale),
        _ops.process_set_for("Allreduce", process_set),
        convert=_to_eager,
    )
    return c.complete(h)


def _note_device(t: Any) -> None:
    """Warns once when t lives on a GPU (staged through host memory: see the
    module doc)."""
    try:
        d = t.device
    except (AttributeError, RuntimeError, ValueError):
        return
    if d and "PU:" in d.upper() and "CPU:" not in d.upper():
        _cuda.note_tf_device(d)


def _to_eager(a: np.ndarray) -> tf.Tensor:
    """A new eager tensor of a, on the current device (what
    tf.convert_to_tensor makes, without its dispatch)."""
    ctx = _context()
    ctx.ensure_initialized()
    return _EagerTensor(a, ctx.device_name, None)


def _sparse_allreduce(
    tensor: tf.IndexedSlices, name: Optional[str], op: int, ignore_name_scope: bool, process_set: ProcessSet
) -> tf.IndexedSlices:
    """Allreduce of IndexedSlices as two allgathers, as Horovod does."""
    if op == Adasum:
        raise NotImplementedError(
            "The Adasum reduction does not currently support sparse tensors. As a "
            "workaround please pass sparse_as_dense=True to DistributedOptimizer"
        )
    if op not in (Average, Sum):
        raise NotImplementedError("Only Sum and Average ops are supported with tf.IndexedSlices")
    base = name if name is not None else None
    values = allgather(
        tensor.values,
        name=None if base is None else f"{base}.values",
        ignore_name_scope=ignore_name_scope,
        process_set=process_set,
    )
    indices = allgather(
        tensor.indices,
        name=None if base is None else f"{base}.indices",
        ignore_name_scope=ignore_name_scope,
        process_set=process_set,
    )
    if op == Average:
        n = tf.cast(_set_size(process_set), values.dtype)
        values = values / n
    return tf.IndexedSlices(values, indices, dense_shape=tensor.dense_shape)


def allreduce(
    tensor: Any,
    average: Optional[bool] = None,
    device_dense: str = "",
    device_sparse: str = "",
    compression: Any = Compression.none,
    op: Optional[int] = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    name: Optional[str] = None,
    process_set: ProcessSet = global_process_set,
    ignore_name_scope: bool = False,
) -> Any:
    """Perform an allreduce on a tf.Tensor or tf.IndexedSlices.

    This function performs a bandwidth-optimal ring allreduce on the input
    tensor. If the input is an tf.IndexedSlices, the function instead does an
    allgather on the values and the indices, effectively doing an allreduce on
    the represented tensor.

    Arguments:
        tensor: tf.Tensor, tf.Variable, or tf.IndexedSlices to reduce.
                The shape of the input must be identical across all ranks.
        average:
            .. warning:: .. deprecated:: 0.19.0

                Use `op` instead. Will be removed in v1.0.

        device_dense: Device to be used for dense tensors (unused: hvdd's
                      daemon does the reduction).
        device_sparse: Device to be used for sparse tensors (unused).
        compression: Compression algorithm used to reduce the amount of data
                     sent and received by each worker node.  Defaults to not
                     using compression.
        op: The reduction operation to combine tensors across different ranks.
            Defaults to Average if None is given.
        prescale_factor: Multiplicative factor to scale tensor before allreduce.
        postscale_factor: Multiplicative factor to scale tensor after allreduce.
        name: A name of the allreduce operation.
        process_set: Process set object to limit this operation to a subset of
                     Horovod processes. Default is the global process set.
        ignore_name_scope: If True, ignores any outer name scope applied by
                           TensorFlow in the name used by the Horovod operation.

    Returns:
        A tensor of the same shape and type as `tensor`, summed across all
        processes.
    """
    op = handle_average_backwards_compatibility(op, average)
    if not isinstance(tensor, tf.IndexedSlices):
        _ops.check_adasum(op, process_set)
    if compression is Compression.none and not _could_record():
        if type(tensor) is _EagerTensor:
            return _eager_allreduce(tensor, tensor._numpy(), name, op, prescale_factor, postscale_factor, process_set)
        if isinstance(tensor, tf.Variable) and _executing_eagerly():
            return _eager_allreduce(
                tensor, tensor.value()._numpy(), name, op, prescale_factor, postscale_factor, process_set
            )
    if isinstance(tensor, tf.IndexedSlices):
        if prescale_factor != 1.0 or postscale_factor != 1.0:
            raise NotImplementedError("Pre/postscale_factor are not supported with tf.IndexedSlices")
        return _sparse_allreduce(tensor, name, op, ignore_name_scope, process_set)
    tensor_compressed, ctx = compression.compress(_tensor(tensor))
    summed = _allreduce(
        tensor_compressed,
        name=name,
        op=op,
        prescale_factor=prescale_factor,
        postscale_factor=postscale_factor,
        ignore_name_scope=ignore_name_scope,
        process_set=process_set,
    )
    return compression.decompress(summed, ctx)


def grouped_allreduce(
    tensors: Sequence[Any],
    average: Optional[bool] = None,
    device_dense: str = "",
    device_sparse: str = "",
    compression: Any = Compression.none,
    op: Optional[int] = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
    ignore_name_scope: bool = False,
    name: Optional[str] = None,
) -> List[Any]:
    """Perform grouped allreduces on a sequence of tf.Tensor or
    tf.IndexedSlices: the dense tensors go to the daemon together, in one
    step, and are negotiated and fused as one unit; IndexedSlices are
    allgathered.

    Returns:
        A list of tensors of the same shapes and types as `tensors`, reduced
        across all processes.
    """
    op = handle_average_backwards_compatibility(op, average)
    tensors = list(tensors)
    dense_idx = [i for i, t in enumerate(tensors) if not isinstance(t, tf.IndexedSlices)]
    out: List[Any] = [None] * len(tensors)
    for i, t in enumerate(tensors):
        if isinstance(t, tf.IndexedSlices):
            if prescale_factor != 1.0 or postscale_factor != 1.0:
                raise NotImplementedError("Pre/postscale_factor are not supported with tf.IndexedSlices")
            out[i] = _sparse_allreduce(t, None if name is None else f"{name}.{i}", op, ignore_name_scope, process_set)
    if dense_idx:
        _ops.check_adasum(op, process_set)
        compressed, ctxs = zip(*[compression.compress(_tensor(tensors[i])) for i in dense_idx])
        summed = _grouped_allreduce(
            list(compressed), name, op, prescale_factor, postscale_factor, ignore_name_scope, process_set
        )
        for i, s, ctx in zip(dense_idx, summed, ctxs):
            out[i] = compression.decompress(s, ctx)
    return out


# ------------------------------------------------------------------ allgather


def _allgather_splits(x: tf.Tensor, process_set: ProcessSet, ignore_name_scope: bool) -> tf.Tensor:
    """Every rank's first dimension, in rank order."""
    d = tf.reshape(tf.shape(x, out_type=tf.int32)[0], [1])
    return allgather(d, ignore_name_scope=ignore_name_scope, process_set=process_set)


def allgather(
    tensor: Any,
    name: Optional[str] = None,
    ignore_name_scope: bool = False,
    process_set: ProcessSet = global_process_set,
) -> tf.Tensor:
    """An op which concatenates the input tensor with the same input tensor on
    all other Horovod processes.

    The concatenation is done on the first dimension, so the input tensors on
    the different processes must have the same rank and shape, except for the
    first dimension, which is allowed to be different.

    Returns:
      A tensor of the same type as `tensor`, concatenated on dimension zero
      across all processes. The shape is identical to the input shape, except
      for the first dimension, which may be greater and is the sum of all first
      dimensions of the tensors in different Horovod processes.
    """
    return grouped_allgather([tensor], name, ignore_name_scope, process_set, _single=True)[0]


def grouped_allgather(
    tensors: Sequence[Any],
    name: Optional[str] = None,
    ignore_name_scope: bool = False,
    process_set: ProcessSet = global_process_set,
    _single: bool = False,
) -> List[tf.Tensor]:
    """Grouped allgather: the tensors are gathered as one unit; returns the
    list of gathered tensors. Differentiable."""
    ps_id = _ops.process_set_for("Allgather", process_set)
    xs = [_tensor(t) for t in tensors]
    if not xs:
        return []
    for x in xs:
        _check_dtype(x.dtype)
        if x.shape.rank == 0:
            raise ValueError("Rank-zero tensors cannot be allgathered: reshape them to [1].")
    kind, prefix = ("allgather", "HorovodAllgather") if _single else ("grouped_allgather", "HorovodGroupedAllgather")
    full = _name(kind, prefix, xs[0], name, ignore_name_scope)

    def fn(*arrays: np.ndarray) -> List[np.ndarray]:
        c = _basics.client()
        if _single:
            return [c.complete(_ops.submit_output(c, pb.OP_ALLGATHER, arrays[0], full, ps_id))]

        def sub(nm: str, i: int, gid: int, n: int) -> Any:
            return _ops.submit_output(c, pb.OP_ALLGATHER, arrays[i], nm, ps_id, group=gid, group_size=n)

        return c.complete(_ops.group(full, sub, len(arrays)))

    def forward(*xs: tf.Tensor) -> List[tf.Tensor]:
        shapes = [tf.TensorShape([None]).concatenate(x.shape[1:]) for x in xs]
        return _run(fn, xs, [x.dtype for x in xs], shapes, full)

    def grad(ys: List[tf.Tensor], *dys: tf.Tensor) -> Any:
        # Horovod 0.28.1's _allgather_grad / _grouped_allgather_grad: the
        # upstream gradient averaged over the set, then this rank's rows
        dys = _zeros_for_none(dys, ys)
        averaged = _grouped_allreduce(dys, None, Average, 1.0, 1.0, ignore_name_scope, process_set)
        r = process_set.rank() if process_set is not global_process_set else _basics.rank()
        out = []
        for x, g in zip(xs, averaged):
            splits = _allgather_splits(x, process_set, ignore_name_scope)
            start = tf.reduce_sum(splits[:r])
            out.append(g[start : start + splits[r]])
        return out

    return list(_differentiable(forward, grad, xs))


# ------------------------------------------------------------------ broadcast


def broadcast(
    tensor: Any,
    root_rank: int,
    name: Optional[str] = None,
    ignore_name_scope: bool = False,
    process_set: ProcessSet = global_process_set,
) -> tf.Tensor:
    """An op which broadcasts the input tensor on root rank to the same input
    tensor on all other Horovod processes.

    The broadcast operation is keyed by the name of the op. The tensor type and
    shape must be the same on all Horovod processes for a given name. The
    broadcast will not start until all processes are ready to send and receive
    the tensor.

    Returns:
      A tensor of the same shape and type as `tensor`, with the value
      broadcasted from root rank.
    """
    return _broadcast_many([tensor], root_rank, name, ignore_name_scope, process_set, single=True)[0]


def _broadcast_many(
    tensors: Sequence[Any],
    root_rank: int,
    name: Optional[str],
    ignore_name_scope: bool,
    process_set: ProcessSet,
    single: bool = False,
) -> List[tf.Tensor]:
    """Broadcasts of several tensors sent together as one graph node.
    Differentiable, with Horovod's gradient: the upstream gradient averaged
    across ranks on the root, zero elsewhere."""
    root = int(root_rank)
    ps_id = _ops.check_root(root, process_set)
    xs = [_tensor(t) for t in tensors]
    if not xs:
        return []
    for x in xs:
        _check_dtype(x.dtype)
    full = _name("broadcast", "HorovodBroadcast", xs[0], name, ignore_name_scope)

    def fn(*arrays: np.ndarray) -> List[np.ndarray]:
        c = _basics.client()
        if single:
            return [c.complete(_ops.submit_broadcast(c, arrays[0], full, root, ps_id))]
        hs = [_ops.submit_broadcast(c, a, f"{full}_{i + 1}of{len(arrays)}", root, ps_id) for i, a in enumerate(arrays)]
        return _complete_all(c, hs)

    def forward(*xs: tf.Tensor) -> List[tf.Tensor]:
        return _run(fn, xs, [x.dtype for x in xs], [x.shape for x in xs], full)

    def grad(ys: List[tf.Tensor], *dys: tf.Tensor) -> Any:
        dys = _zeros_for_none(dys, ys)
        # Horovod's: the upstream gradient averaged over the set, on the root
        averaged = _grouped_allreduce(dys, None, Average, 1.0, 1.0, ignore_name_scope, process_set)
        if _basics.rank() != root:
            return [g * 0 for g in averaged]
        return averaged

    return list(_differentiable(forward, grad, xs))


def _complete_all(c: Any, handles: Sequence[Any]) -> List[Any]:
    """Waits for every handle, then raises the first error, if any."""
    out, first = [], None
    for h in handles:
        try:
            out.append(c.complete(h))
        except BaseException as e:
            first = first or e
    if first is not None:
        raise first
    return out


def broadcast_(
    variables: Any, root_rank: int, name: Optional[str] = None, process_set: ProcessSet = global_process_set
) -> Any:
    """An op which in-place broadcasts the input variables from the root rank
    to the same input variables on all other Horovod processes.

    Returns:
      The tensor values of the updated `variables` as broadcasted from root
      rank (a list when given a list).
    """
    single = isinstance(variables, tf.Variable)
    vs = [variables] if single else list(variables)
    values = _broadcast_many(vs, root_rank, name, False, process_set)
    assigned = [v.assign(x) for v, x in zip(vs, values)]
    return assigned[0] if single else assigned


# ------------------------------------------------------------------- alltoall


def alltoall(
    tensor: Any,
    splits: Any = None,
    name: Optional[str] = None,
    ignore_name_scope: bool = False,
    process_set: ProcessSet = global_process_set,
) -> Any:
    """An op that scatters slices of the input tensor to all other Horovod
    processes and returns a tensor of gathered slices from all other Horovod
    processes.

    The slicing is done on the first dimension, so the input tensors on the
    different processes must have the same rank and shape, except for the
    first dimension, which is allowed to be different.

    Arguments:
      tensor: A tensor to distribute with alltoall.
      splits: A tensor of integers in rank order describing how many elements
              in `tensor` to send to each worker. Splitting is applied along
              the first dimension of `tensor`. If `splits` is not provided, the
              first dimension is split equally by the number of Horovod
              processes.

    Returns:
      A tensor containing the gathered tensor data from all workers, and, if
      `splits` has been provided, a tensor of integers in rank order describing
      how many elements in the output tensor have been received from each
      worker.
    """
    x = _tensor(tensor)
    _check_dtype(x.dtype)
    # Horovod's checks (hvdd.ops.alltoall_splits): the splits' type and the
    # set's membership now; the splits' values where they are known, at the
    # call eagerly, when the graph runs otherwise (ValueError, which a graph
    # raises as InvalidArgumentError).
    if splits is None:
        sp = tf.zeros([0], dtype=tf.int32)
    else:
        sp = tf.convert_to_tensor(splits)
        _ops.check_splits_type(sp.shape.rank, sp.dtype.as_numpy_dtype)
    _ops.process_set_for("Alltoall", process_set)
    full = _name("alltoall", "HorovodAlltoall", x, name, ignore_name_scope)
    n = _set_size(process_set)

    def fn(a: np.ndarray, s: np.ndarray) -> List[np.ndarray]:
        c = _basics.client()
        ps_id, spl = _ops.alltoall_splits(s, a.shape, process_set)
        h = _ops.submit_output(c, pb.OP_ALLTOALL, a, full, ps_id, with_splits=True, splits=spl)
        out, rs = c.complete(h)
        return [out, rs]

    def forward(x: tf.Tensor) -> Any:
        out, rs = _run(fn, [x, sp], [x.dtype, tf.int32], [tf.TensorShape([None]).concatenate(x.shape[1:]), [n]], full)
        return out, rs

    def grad(ys: Any, dy: tf.Tensor, drs: Any = None) -> Any:
        out, rs = ys
        dy = tf.zeros_like(out) if dy is None else dy
        g, _ = alltoall(dy, splits=rs, ignore_name_scope=ignore_name_scope, process_set=process_set)
        return g

    out, rs = _differentiable(forward, grad, [x])
    if splits is None:
        return out
    return out, rs


# -------------------------------------------------------------- reducescatter


def reducescatter(
    tensor: Any,
    device_dense: str = "",
    compression: Any = Compression.none,
    op: int = Average,
    name: Optional[str] = None,
    process_set: ProcessSet = global_process_set,
    ignore_name_scope: bool = False,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> tf.Tensor:
    """Perform a reducescatter on a tf.Tensor: the tensor is reduced (Average or
    Sum) across ranks and this rank keeps its block of rows of the result
    (the first d0 % size ranks get one row more).

    Returns:
        A tensor of the same rank and type as `tensor`, with this process's
        rows of the reduction.
    """
    return grouped_reducescatter(
        [tensor],
        device_dense,
        compression,
        op,
        name,
        process_set,
        ignore_name_scope,
        prescale_factor,
        postscale_factor,
        _single=True,
    )[0]


def grouped_reducescatter(
    tensors: Sequence[Any],
    device_dense: str = "",
    compression: Any = Compression.none,
    op: int = Average,
    name: Optional[str] = None,
    process_set: ProcessSet = global_process_set,
    ignore_name_scope: bool = False,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    _single: bool = False,
) -> List[tf.Tensor]:
    """Grouped reducescatter: returns the list of this rank's blocks.
    Differentiable, with Horovod's gradient: the upstream gradient times the
    set's size for Sum and times the prescale and postscale factors,
    allgathered."""
    op = _ops.reduce_op(op)
    if op not in (Average, Sum):
        raise ValueError("Reducescatter only supports the Average and Sum ops.")
    ps_id = _ops.process_set_for("Reducescatter", process_set)
    comp = [compression.compress(_tensor(t)) for t in tensors]
    xs = [c for c, _ in comp]
    if not xs:
        return []
    for x in xs:
        _check_dtype(x.dtype)
        if x.shape.rank == 0:
            raise ValueError("Rank-zero tensors cannot be reducescattered: reshape them to [1].")
    kind, prefix = (
        ("reducescatter", "HorovodReducescatter")
        if _single
        else ("grouped_reducescatter", "HorovodGroupedReducescatter")
    )
    full = _name(kind, prefix, xs[0], name, ignore_name_scope)
    pre, post = float(prescale_factor), float(postscale_factor)
    kw = dict(reduce_op=op, prescale=pre, postscale=post)

    def fn(*arrays: np.ndarray) -> List[np.ndarray]:
        c = _basics.client()
        if _single:
            return [c.complete(_ops.submit_output(c, pb.OP_REDUCESCATTER, arrays[0], full, ps_id, **kw))]

        def sub(nm: str, i: int, gid: int, n: int) -> Any:
            return _ops.submit_output(c, pb.OP_REDUCESCATTER, arrays[i], nm, ps_id, group=gid, group_size=n, **kw)

        return c.complete(_ops.group(full, sub, len(arrays)))

    def forward(*xs: tf.Tensor) -> List[tf.Tensor]:
        shapes = [tf.TensorShape([None]).concatenate(x.shape[1:]) for x in xs]
        return _run(fn, xs, [x.dtype for x in xs], shapes, full)

    def grad(ys: List[tf.Tensor], *dys: tf.Tensor) -> Any:
        dys = _zeros_for_none(dys, ys)
        gathered = grouped_allgather(dys, None, ignore_name_scope, process_set)
        # Horovod's: times the size for Sum, times the scale factors
        scale = pre * post * (_set_size(process_set) if op == Sum else 1)
        return [g * tf.cast(scale, g.dtype) if scale != 1.0 else g for g in gathered]

    ys = _differentiable(forward, grad, xs)
    return [compression.decompress(y, ctx) for y, (_, ctx) in zip(ys, comp)]


# ------------------------------------------------------- join, barrier, sizes


def join() -> tf.Tensor:
    """An op to indicate that the rank finished processing data.

    All ranks that did not call join() continue to process allreduce
    operations; this rank takes part in them with zeros. This op blocks until
    all ranks join.

    Returns:
      The rank of the last process that joined, as an int32 scalar tensor.
    """
    return _scalar_op(lambda: _ops.join(), "HorovodJoin")


def barrier(process_set: ProcessSet = global_process_set) -> Any:
    """An op which blocks until every rank of the process set reaches it."""
    out = _scalar_op(lambda: _ops.barrier(process_set) or 0, "HorovodBarrier")
    return None if _executing_eagerly() else out.op


def _scalar_op(value: Callable[[], Any], name: str) -> tf.Tensor:
    """An int32 scalar computed when the op runs (now, in eager mode): join,
    barrier and the ``*_op`` queries."""

    def fn() -> np.ndarray:
        return np.int32(value())

    if _executing_eagerly():
        return tf.constant(fn(), dtype=tf.int32)
    out = _graph_call(fn, [], [tf.int32], name)[0]
    out.set_shape([])
    return out


def size_op(process_set_id: int = 0, name: Optional[str] = None) -> tf.Tensor:
    """An op that returns the number of Horovod processes (of the process
    set), evaluated when it runs rather than when the graph is built."""
    return _scalar_op(
        lambda: _basics.size() if process_set_id == 0 else _set_by_id(process_set_id).size(), name or "HorovodInfo"
    )


def local_size_op(name: Optional[str] = None) -> tf.Tensor:
    """An op that returns the number of Horovod processes within the node the
    current process is running on."""
    return _scalar_op(_basics.local_size, name or "HorovodInfo")


def rank_op(process_set_id: int = 0, name: Optional[str] = None) -> tf.Tensor:
    """An op that returns the Horovod rank of the calling process (within the
    process set)."""
    return _scalar_op(
        lambda: _basics.rank() if process_set_id == 0 else _set_by_id(process_set_id).rank(), name or "HorovodInfo"
    )


def local_rank_op(name: Optional[str] = None) -> tf.Tensor:
    """An op that returns the local Horovod rank of the calling process, within
    the node that it is running on."""
    return _scalar_op(_basics.local_rank, name or "HorovodInfo")


def process_set_included_op(process_set_id: int = 0, name: Optional[str] = None) -> tf.Tensor:
    """An op that returns 1 if the calling process is in the process set, else
    0."""
    return _scalar_op(
        lambda: 1 if process_set_id == 0 else int(bool(_set_by_id(process_set_id).included())), name or "HorovodInfo"
    )


def _set_by_id(process_set_id: int) -> ProcessSet:
    for ps in _basics._registered:
        if ps.process_set_id == process_set_id:
            return ps
    raise ValueError(f"Process set {process_set_id} does not exist, or has not been registered.")
