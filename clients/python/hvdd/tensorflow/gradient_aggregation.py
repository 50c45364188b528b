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
from typing import Any, Callable, List, Optional, Sequence

import tensorflow as tf

from ..basics import Adasum, Average, ProcessSet, global_process_set
from .compression import Compression
from .mpi_ops import _executing_eagerly, _grouped_allreduce, _sparse_allreduce

__all__ = ["check_optimizer_args", "make_allreduce_grads_fn", "LocalGradientAggregationHelper"]


def check_optimizer_args(
    op: int, gradient_predivide_factor: float, average_aggregated_gradients: bool, num_groups: int, groups: Any
) -> Any:
    """Validates a DistributedOptimizer's arguments as Horovod does; returns the
    groups to use (``num_groups`` is the deprecated spelling of ``groups``)."""
    if gradient_predivide_factor != 1.0 and op != Average:
        raise ValueError("gradient_predivide_factor not supported with op != Average")
    if op == Adasum and average_aggregated_gradients:
        raise ValueError("Adasum does not support average_aggregated_gradients == True")
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


def _group_indices(groups: Any, variables: Sequence[Any], dense: Sequence[int]) -> Optional[List[List[int]]]:
    """Splits the dense gradients' positions into allreduce groups: None (one
    group), N (N nearly equal groups, in order) or lists of variables (each
    list a group; the other variables one more group)."""
    if groups is None:
        return None
    if isinstance(groups, int):
        n = min(groups, len(dense)) or 1
        k, r = divmod(len(dense), n)
        out, start = [], 0
        for i in range(n):
            size = k + (1 if i < r else 0)
            out.append(list(dense[start : start + size]))
            start += size
        return out
    where = {id(v): i for i, v in enumerate(variables)}
    dense_set = set(dense)
    out, seen = [], set()
    for g in groups:
        idx = [where[id(v)] for v in g if id(v) in where and where[id(v)] in dense_set]
        seen.update(idx)
        if idx:
            out.append(idx)
    rest = [i for i in dense if i not in seen]
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
) -> Callable[[Sequence[Any], Sequence[Any]], List[Any]]:
    """Returns ``allreduce_grads(grads, variables)``: the gradients reduced
    across ranks (None stays None), the dense ones in one node."""
    if op == Average:
        # The daemon divides by the set's size for Average; the predivide factor
        # splits that division around the sum.
        prescale, postscale = 1.0 / gradient_predivide_factor, gradient_predivide_factor
    else:
        prescale = postscale = 1.0

    def allreduce_grads(grads: Sequence[Any], variables: Sequence[Any]) -> List[Any]:
        grads = list(grads)
        if sparse_as_dense:
            grads = [tf.convert_to_tensor(g) if isinstance(g, tf.IndexedSlices) else g for g in grads]
        out: List[Any] = [None] * len(grads)
        dense = [i for i, g in enumerate(grads) if g is not None and not isinstance(g, tf.IndexedSlices)]
        for i, g in enumerate(grads):
            if isinstance(g, tf.IndexedSlices):
                out[i] = _sparse_allreduce(g, None if name is None else f"{name}.{i}", op, False, process_set)
        if dense:
            compressed, ctxs = zip(*[compression.compress(grads[i]) for i in dense])
            idx = _group_indices(groups, variables, dense)
            if idx is not None:
                pos = {j: k for k, j in enumerate(dense)}
                idx = [[pos[j] for j in g] for g in idx]
            reduced = _grouped_allreduce(list(compressed), name, op, prescale, postscale, False, process_set, idx)
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
