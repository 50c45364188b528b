"""The Keras optimizer wrapper (Horovod's ``horovod/_keras``
``create_distributed_optimizer``): what ``DistributedOptimizer`` of
``hvdd.tensorflow.keras`` and ``hvdd.keras`` returns, and what
``hvdd.tensorflow.DistributedOptimizer`` returns for a Keras optimizer, as
Horovod's does. It lies here, under ``hvdd.tensorflow``, rather than in
``hvdd._keras`` (which re-exports it), so that ``hvdd.tensorflow`` needs
nothing from the Keras layers above it. The caller passes the ``keras``
module it works on; nothing here imports a Keras package by itself.

Where the gradients are reduced (exactly once per applied step):

* Keras 3 (TensorFlow backend): ``Model.fit``'s train step calls
  ``optimizer.apply_gradients(zip(grads, vars))``, which calls
  ``optimizer.apply(grads, vars)``. The wrapper overrides ``apply``, so both
  entry points (and custom loops calling either) reduce once.
* tf_keras (legacy Keras 2): ``Model.fit`` calls ``optimizer.minimize``,
  which computes the gradients and calls ``apply_gradients``; the wrapper
  overrides ``apply_gradients``. ``get_gradients`` (the TF1-graph training
  path of the legacy ``OptimizerV2``) reduces as in Horovod and marks its
  results, so the ``apply_gradients`` that follows does not reduce them again.

A step's dense gradients go to the daemon in one ``grouped_allreduce`` (one per
group when ``groups`` is given); ``tf.IndexedSlices`` gradients are allgathered
unless ``sparse_as_dense``. With ``backward_passes_per_step=N`` the gradients
are summed locally into untracked accumulator variables and reduced and applied
on every N-th pass only (a ``tf.cond``, so it works inside ``Model.fit``'s
``tf.function``); the other passes only advance the optimizer's iteration
counter, as Horovod's ``LocalGradientAggregationHelper`` does.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence

import tensorflow as tf

from ..basics import Average, ProcessSet, Sum, global_process_set
from .compression import Compression
from .gradient_aggregation import check_optimizer_args, make_allreduce_grads_fn, var_ids

__all__ = ["create_distributed_optimizer", "distributed_optimizer_class", "is_distributed_optimizer"]


class _State:
    """The wrapper's own state, kept in a plain object so that neither Keras
    nor TensorFlow tracking sees it (the accumulators are not saved with the
    optimizer, and a saved model loads into the unwrapped optimizer)."""

    def __init__(self, passes: int) -> None:
        self.passes = passes
        self.local_ids: set = set()
        self.counter: Optional[tf.Variable] = None
        self.accumulators: Dict[int, tf.Variable] = {}
        self.reduced: List[Any] = []  # tensors get_gradients already reduced

    def ensure(self, variables: Iterable[Any]) -> None:
        """Creates the counter and one accumulator per variable (outside any
        function being traced)."""
        missing = [v for v in variables if v is not None and id(_base_var(v)) not in self.accumulators]
        if self.counter is not None and not missing:
            return
        with tf.init_scope():
            if self.counter is None:
                self.counter = tf.Variable(0, dtype=tf.int64, trainable=False, name="hvdd_aggregation_counter")
            for v in missing:
                base = _base_var(v)
                dtype = tf.as_dtype(v.dtype)
                self.accumulators[id(base)] = tf.Variable(
                    tf.zeros(v.shape, dtype=dtype), trainable=False, name="hvdd_aggregated_grad"
                )

    def accumulator(self, v: Any) -> tf.Variable:
        return self.accumulators[id(_base_var(v))]


def _base_var(v: Any) -> Any:
    inner = getattr(v, "value", None)
    return inner if isinstance(inner, tf.Variable) else v


def _mro_modules(cls: type) -> List[str]:
    return [f"{c.__module__}.{c.__name__}" for c in cls.__mro__]


def _is_keras3(cls: type) -> bool:
    return any(m.startswith("keras.src.optimizers.base_optimizer.") for m in _mro_modules(cls))


def _is_legacy_v2(cls: type) -> bool:
    return any(m.endswith(".OptimizerV2") for m in _mro_modules(cls))


def distributed_optimizer_class(
    keras: Any,
    base: type,
    name: Optional[str] = None,
    device_dense: str = "",
    device_sparse: str = "",
    compression: Any = Compression.none,
    sparse_as_dense: bool = False,
    gradient_predivide_factor: float = 1.0,
    op: int = Average,
    backward_passes_per_step: int = 1,
    average_aggregated_gradients: bool = False,
    groups: Any = None,
    process_set: ProcessSet = global_process_set,
    scale_local_gradients: bool = True,
) -> type:
    """A subclass of the optimizer class ``base`` that reduces gradients across
    ranks before applying them. It has ``base``'s name and module, so that
    ``isinstance``, ``get_config`` and saving keep working and a saved model
    loads without hvdd. Its constructor takes ``base``'s arguments."""
    check_optimizer_args(op, gradient_predivide_factor, average_aggregated_gradients, 0, None, backward_passes_per_step)
    if getattr(base, "_HVDD_DISTRIBUTED", False):
        raise ValueError(f"{base.__name__} is already a DistributedOptimizer")
    keras3 = _is_keras3(base)
    legacy = _is_legacy_v2(base)
    passes = backward_passes_per_step

    class _DistributedOptimizer(base):  # type: ignore[misc, valid-type]
        _HVDD_DISTRIBUTED = True
        _HAS_AGGREGATE_GRAD = True

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._hvdd_name = name or f"Distributed{base.__name__}"
            self._hvdd_state = _State(passes)
            self._allreduce_grads = make_allreduce_grads_fn(
                None,
                compression,
                sparse_as_dense,
                op,
                gradient_predivide_factor,
                groups,
                process_set,
                scale_local_gradients,
                self._hvdd_state.local_ids,
            )
            self._aggregated_gradients = False

        def register_local_var(self, var: Any) -> None:
            """Registers a source/variable as worker local. Horovod will not
            perform any global operations on gradients corresponding to these
            sources and will instead return the local gradient."""
            self._hvdd_state.local_ids.update(var_ids(var))

        def _allreduce(self, grads: Sequence[Any], variables: Sequence[Any]) -> List[Any]:
            self._aggregated_gradients = True
            with tf.name_scope(self._hvdd_name + "_Allreduce"):
                return self._allreduce_grads(list(grads), list(variables))

        def _hvdd_skip_pass(self) -> Any:
            it = getattr(self, "_iterations", None)
            if it is None:
                it = self.iterations
            it.assign_add(1)
            return tf.constant(False)

        def _hvdd_aggregate(
            self, grads: Sequence[Any], variables: Sequence[Any], apply: Callable[[List[Any]], Any]
        ) -> Any:
            """Adds this pass's gradients to the accumulators; on every N-th
            pass reduces the sums (divided by N if average_aggregated_gradients)
            and applies them with ``apply``, then clears the accumulators."""
            state = self._hvdd_state
            state.ensure(variables)
            updates = []
            for g, v in zip(grads, variables):
                if g is None:
                    continue
                acc = state.accumulator(v)
                if isinstance(g, tf.IndexedSlices):
                    g = tf.convert_to_tensor(g)
                updates.append(acc.assign_add(tf.cast(g, acc.dtype)))
            assert state.counter is not None
            with tf.control_dependencies(updates):
                count = state.counter.assign_add(1)
            present = [i for i, g in enumerate(grads) if g is not None]

            def do_apply() -> Any:
                sums: List[Any] = [None] * len(grads)
                for i in present:
                    s = state.accumulator(variables[i]).read_value()
                    if average_aggregated_gradients:
                        s = s / tf.cast(passes, s.dtype)
                    sums[i] = s
                reduced = self._allreduce(sums, variables)
                reduced = [None if r is None else tf.cast(r, grads[i].dtype) for i, r in enumerate(reduced)]
                result = apply(reduced)
                deps = []
                if not tf.executing_eagerly() and isinstance(result, (tf.Operation, tf.Tensor, tf.Variable)):
                    deps = [result]
                with tf.control_dependencies(deps):
                    clears = [a.assign(tf.zeros_like(a)) for a in state.accumulators.values()]
                with tf.control_dependencies(clears):
                    return tf.constant(True)

            with tf.control_dependencies([count]):
                return tf.cond(tf.equal(count % passes, 0), do_apply, self._hvdd_skip_pass)

        if keras3:

            def build(self, variables: Sequence[Any]) -> None:
                super().build(variables)
                if self._hvdd_state.passes > 1:
                    self._hvdd_state.ensure(variables)

            def apply(self, grads: Sequence[Any], trainable_variables: Optional[Sequence[Any]] = None) -> Any:
                """Reduces the gradients across ranks (aggregating them locally
                first when backward_passes_per_step > 1), then applies them."""
                grads = list(grads)
                if not grads:
                    return super().apply(grads, trainable_variables)
                if trainable_variables is None:
                    variables = list(self._trainable_variables)
                else:
                    variables = list(trainable_variables)
                    if not self.built:
                        with keras.name_scope(self.name, caller=self):
                            self.build(variables)
                if self._hvdd_state.passes == 1:
                    return super().apply(self._allreduce(grads, variables), trainable_variables)
                parent_apply = super().apply
                return self._hvdd_aggregate(grads, variables, lambda red: parent_apply(red, trainable_variables))

        else:
            if legacy:

                def get_gradients(self, loss: Any, params: Sequence[Any]) -> List[Any]:
                    """Compute gradients of all trainable variables.

                    See Optimizer.get_gradients() for more info.

                    In DistributedOptimizer, get_gradients() is overriden to also
                    allreduce the gradients before returning them.
                    """
                    gradients = super().get_gradients(loss, params)
                    if self._hvdd_state.passes > 1:
                        return gradients  # apply_gradients aggregates and reduces
                    reduced = self._allreduce(gradients, params)
                    self._hvdd_state.reduced = [g for g in reduced if g is not None]
                    return reduced

            def apply_gradients(self, grads_and_vars: Any, *args: Any, **kwargs: Any) -> Any:
                """Reduces the gradients across ranks (aggregating them locally
                first when backward_passes_per_step > 1), then applies them."""
                pairs = list(grads_and_vars)
                parent_apply = super().apply_gradients
                if not pairs:
                    return parent_apply(pairs, *args, **kwargs)
                grads = [g for g, _ in pairs]
                variables = [v for _, v in pairs]
                state = self._hvdd_state
                marked = {id(t) for t in state.reduced}
                state.reduced = []
                if marked and all(g is None or id(g) in marked for g in grads):
                    return parent_apply(pairs, *args, **kwargs)
                if state.passes == 1:
                    reduced = self._allreduce(grads, variables)
                    return parent_apply(list(zip(reduced, variables)), *args, **kwargs)
                # Create the optimizer's slots before the branch that applies.
                with tf.init_scope():
                    if legacy:
                        self._create_all_weights(variables)
                    elif hasattr(self, "build"):
                        self.build(variables)
                return self._hvdd_aggregate(
                    grads, variables, lambda red: parent_apply(list(zip(red, variables)), *args, **kwargs)
                )

    cls = _DistributedOptimizer
    cls.__name__ = base.__name__
    cls.__qualname__ = base.__qualname__
    cls.__module__ = base.__module__
    cls.__doc__ = base.__doc__
    return cls


def create_distributed_optimizer(
    keras: Any,
    optimizer: Any,
    name: Optional[str],
    device_dense: str,
    device_sparse: str,
    compression: Any,
    sparse_as_dense: bool,
    gradient_predivide_factor: float,
    op: int,
    backward_passes_per_step: int = 1,
    average_aggregated_gradients: bool = False,
    groups: Any = None,
    process_set: ProcessSet = global_process_set,
    scale_local_gradients: bool = True,
    num_groups: int = 0,
) -> Any:
    """Wraps a Keras optimizer instance: returns a new instance of a dynamic
    subclass of its class (same name, same config) whose gradient step
    allreduces the gradients across ranks before applying them (see the
    module doc). The arguments are checked as Horovod's DistributedOptimizer
    checks them. The wrapped instance's state is not carried over (as in
    Horovod, the new optimizer is made from ``optimizer.get_config()``)."""
    groups = check_optimizer_args(
        op, gradient_predivide_factor, average_aggregated_gradients, num_groups, groups, backward_passes_per_step
    )
    if op != Average and op != Sum:
        raise ValueError("op currently only supports Average and Sum")
    if getattr(type(optimizer), "_HVDD_DISTRIBUTED", False):
        raise ValueError("The optimizer is already a DistributedOptimizer")
    cls = distributed_optimizer_class(
        keras,
        type(optimizer),
        name=name,
        device_dense=device_dense,
        device_sparse=device_sparse,
        compression=compression,
        sparse_as_dense=sparse_as_dense,
        gradient_predivide_factor=gradient_predivide_factor,
        op=op,
        backward_passes_per_step=backward_passes_per_step,
        average_aggregated_gradients=average_aggregated_gradients,
        groups=groups,
        process_set=process_set,
        scale_local_gradients=scale_local_gradients,
    )
    return cls.from_config(optimizer.get_config())


def is_distributed_optimizer(optimizer: Any) -> bool:
    """Whether optimizer was made by DistributedOptimizer (or load_model)."""
    return bool(getattr(type(optimizer), "_HVDD_DISTRIBUTED", False))
