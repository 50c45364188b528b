"""Allreducing a training step's gradients, and aggregating them locally over
several backward passes before one allreduce (Horovod's
``horovod/tensorflow/gradient_aggregation.py``). Shared by
``DistributedGradientTape``, the TF1 ``DistributedOptimizer`` and the Keras
optimizer wrapper.

A step's dense gradients cross into the client once, as one node (one
grouped allreduce per group), so that the daemon sees them together and fuses
them; IndexedSlices gradients are allgathered unless ``sparse_as_dense``.
"""

from __future__ import annotations

import warnings
from typing import Any, Callable, Dict, List, Optional, Sequence

import tensorflow as tf

from .. import ops as _ops
from ..basics import Adasum, Average, ProcessSet, global_process_set
from .compression import Compression
from .mpi_ops import _executing_eagerly, _grouped_allreduce, _sparse_allreduce

__all__ = [
    "check_optimizer_args",
    "var_ids",
    "split_groups",
    "make_allreduce_grads_fn",
    "LocalGradientAggregationHelper",
]


def check_optimizer_args(
    op: int,
    gradient_predivide_factor: float,
    average_aggregated_gradients: bool,
    num_groups: int,
    groups: Any,
    backward_passes_per_step: int = 1,
) -> Any:
    """Validates a DistributedOptimizer's arguments as Horovod does; returns the
    groups to use (``num_groups`` is the deprecated spelling of ``groups``)."""
    if gradient_predivide_factor != 1.0 and op != Average:
        raise ValueError("gradient_predivide_factor not supported with op != Average")
    if op == Adasum and average_aggregated_gradients:
        raise ValueError("Adasum does not support average_aggregated_gradients == True")
    if backward_passes_per_step <= 0:
        raise ValueError("backward_passes_per_step must be > 0")
    if num_groups != 0:
        warnings.warn(
            "Parameter `num_groups` has been replaced by `groups` and will be removed in v0.23.0.",
            DeprecationWarning,
            stacklevel=3,
        )
        if groups is None:
            groups = num_groups
    if groups is not None:
        if not (isinstance(groups, list) or (isinstance(groups, int) and groups > 0)):
            raise ValueError("groups should be a non-negative integer or a list of list of tf.Variable.")
    return groups


def var_ids(v: Any) -> List[int]:
    """Identities under which a variable may be seen: itself and, for a Keras 3
    variable, the tf.Variable it wraps."""
    ids = [id(v)]
    inner = getattr(v, "value", None)
    if isinstance(inner, tf.Variable) and inner is not v:
        ids.append(id(inner))
    return ids


def split_groups(groups: Any, variables: Sequence[Any], idx: Sequence[int]) -> List[List[int]]:
    """The positions idx (dense gradients to reduce) split into allreduce
    groups: one group when groups is None; N contiguous, nearly equal groups
    when it is an int; else one group per list of variables, plus one for the
    variables no list names."""
    idx = list(idx)
    if not idx:
        return []
    if groups is None:
        return [idx]
    if isinstance(groups, int):
        n = max(1, min(groups, len(idx)))
        k, m = divmod(len(idx), n)
        return [idx[i * k + min(i, m) : (i + 1) * k + min(i + 1, m)] for i in range(n)]
    where: Dict[int, int] = {}
    for i in idx:
        for key in var_ids(variables[i]):
            where.setdefault(key, i)
    out: List[List[int]] = []
    seen: set = set()
    for group in groups:
        members = []
        for v in group:
            i = next((where[k] for k in var_ids(v) if k in where), None)
            if i is not None and i not in seen:
                seen.add(i)
                members.append(i)
        if members:
            out.append(sorted(members))
    rest = [i for i in idx if i not in seen]
    if rest:
        out.append(rest)
    return out


def make_allreduce_grads_fn(
    name: Optional[str] = None,
    compression: Any = Compression.none,
    sparse_as_dense: bool = False,
    op: int = Average,
    gradient_predivide_factor: float = 1.0,
    groups: Any = None,
    process_set: ProcessSet = global_process_set,
    scale_local_gradients: bool = True,
    local_ids: Optional[set] = None,
) -> Callable[[Sequence[Any], Sequence[Any]], List[Any]]:
    """Returns ``allreduce_grads(grads, variables)``: the gradients reduced
    across ranks (None stays None), the dense ones in one node (one grouped
    allreduce per group). Gradients of variables whose identity is in
    ``local_ids`` (a set the caller may grow later) are not reduced, and are
    divided by the set's size when ``scale_local_gradients``."""
    if op == Average:
        # The daemon divides by the set's size for Average; the predivide factor
        # splits that division around the sum.
        prescale, postscale = 1.0 / gradient_predivide_factor, gradient_predivide_factor
    else:
        prescale = postscale = 1.0

    def allreduce_grads(grads: Sequence[Any], variables: Sequence[Any]) -> List[Any]:
        out = list(grads)
        if sparse_as_dense:
            out = [tf.convert_to_tensor(g) if isinstance(g, tf.IndexedSlices) else g for g in out]
        n = process_set.size() or 1
        local = set()
        if local_ids:
            local = {i for i, v in enumerate(variables) if any(k in local_ids for k in var_ids(v))}
        if scale_local_gradients and n > 1:
            for i in local:
                g = out[i]
                if isinstance(g, tf.IndexedSlices):
                    out[i] = tf.IndexedSlices(g.values / n, g.indices, g.dense_shape)
                elif g is not None:
                    out[i] = g / tf.cast(n, g.dtype)
        if n == 1:
            # Every reduction over one rank is the identity (the factors cancel).
            return out
        todo = [i for i, g in enumerate(out) if g is not None and i not in local]
        dense = [i for i in todo if not isinstance(out[i], tf.IndexedSlices)]
        for i in todo:
            if isinstance(out[i], tf.IndexedSlices):
                out[i] = _sparse_allreduce(out[i], None if name is None else f"{name}.{i}", op, False, process_set)
        if dense:
            _ops.check_adasum(op, process_set)
            compressed, ctxs = zip(*[compression.compress(out[i]) for i in dense])
            pos = {j: k for k, j in enumerate(dense)}
            idx = [[pos[j] for j in g] for g in split_groups(groups, variables, dense)]
            reduced = _grouped_allreduce(
                list(compressed), name, op, prescale, postscale, False, process_set, idx if len(idx) > 1 else None
            )
            for i, r, ctx in zip(dense, reduced, ctxs):
                out[i] = compression.decompress(r, ctx)
        return out

    return allreduce_grads


class LocalGradientAggregationHelper:
    """Sums gradients locally over ``backward_passes_per_step`` passes and
    allreduces the sum on the last pass only; the optimizer applies on that
    pass only. Works in TF1 graphs, in ``tf.function`` and eagerly (the
    decision is a ``tf.cond`` on a counter variable)."""

    def __init__(
        self,
        backward_passes_per_step: int,
        allreduce_func: Callable[[Sequence[Any], Sequence[Any]], List[Any]],
        sparse_as_dense: bool,
        average_aggregated_gradients: bool,
    ) -> None:
        if backward_passes_per_step <= 0:
            raise ValueError("backward_passes_per_step must be > 0")
        self.backward_passes_per_step = backward_passes_per_step
        self.allreduce_func = allreduce_func
        self.sparse_as_dense = sparse_as_dense
        self.average_aggregated_gradients = average_aggregated_gradients
        self.counter: Optional[tf.Variable] = None
        self.accumulators: dict[int, tf.Variable] = {}
        self._last_pass: Any = None  # compute_gradients' decision, for apply_gradients

    def _variable(self, initial: Any, name: str) -> tf.Variable:
        with tf.init_scope():
            if _executing_eagerly():
                return tf.Variable(initial, trainable=False, name=name)
            return tf.compat.v1.Variable(
                initial,
                trainable=False,
                name=name,
                collections=[tf.compat.v1.GraphKeys.LOCAL_VARIABLES],
                use_resource=True,
            )

    def _init(self, grads: Sequence[Any], variables: Sequence[Any]) -> None:
        if self.counter is None:
            self.counter = self._variable(tf.constant(0, tf.int32), "aggregation_counter")
        for i, (g, v) in enumerate(zip(grads, variables)):
            if g is not None and i not in self.accumulators:
                shape = v.shape if v is not None else g.shape
                self.accumulators[i] = self._variable(tf.zeros(shape, dtype=g.dtype), f"aggregated_grad_{i}")

    def _is_last_pass(self) -> tf.Tensor:
        assert self.counter is not None
        return tf.equal(self.counter % self.backward_passes_per_step, 0)

    def compute_gradients(self, grads: Sequence[Any], variables: Sequence[Any]) -> List[Any]:
        """Adds the pass's gradients to the accumulators and returns the
        allreduced sums on the last pass (the local sums otherwise)."""
        grads = [tf.convert_to_tensor(g) if isinstance(g, tf.IndexedSlices) else g for g in grads]
        self._init(grads, variables)
        assert self.counter is not None
        updates = [self.accumulators[i].assign_add(g) for i, g in enumerate(grads) if g is not None]
        with tf.control_dependencies(updates):
            bump = self.counter.assign_add(1)
        idx = [i for i, g in enumerate(grads) if g is not None]
        n = float(self.backward_passes_per_step)

        def reduced() -> List[tf.Tensor]:
            vals = [self.accumulators[i].read_value() for i in idx]
            if self.average_aggregated_gradients:
                vals = [v / tf.cast(n, v.dtype) for v in vals]
            r = self.allreduce_func(vals, [variables[i] for i in idx])
            return [tf.convert_to_tensor(x) for x in r]

        def local() -> List[tf.Tensor]:
            return [tf.identity(self.accumulators[i].read_value()) for i in idx]

        with tf.control_dependencies([bump]):
            # Read after the increment; apply_gradients decides on this value.
            self._last_pass = self._is_last_pass()
            if not idx:
                return list(grads)
            vals = tf.cond(self._last_pass, reduced, local)
        if not isinstance(vals, (list, tuple)):
            vals = [vals]
        out: List[Any] = [None] * len(grads)
        for i, v in zip(idx, vals):
            out[i] = v
        return out

    def apply_gradients(self, apply: Callable[[], Any]) -> Any:
        """Runs ``apply`` (the optimizer's own apply) on the last pass and
        clears the accumulators after it; a no-op on the other passes."""

        def do_apply() -> tf.Tensor:
            op = apply()
            deps = [op] if op is not None and not _executing_eagerly() else []
            with tf.control_dependencies(deps):
                clears = [a.assign(tf.zeros_like(a)) for a in self.accumulators.values()]
            with tf.control_dependencies(clears):
                return tf.constant(True)

        def skip() -> tf.Tensor:
            return tf.constant(False)

        pred = self._last_pass
        if pred is None or (not _executing_eagerly() and pred.graph is not tf.compat.v1.get_default_graph()):
            pred = self._is_last_pass()
        r = tf.cond(pred, do_apply, skip)
        return r if _executing_eagerly() else r.op
