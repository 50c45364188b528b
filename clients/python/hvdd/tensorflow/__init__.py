"""``hvdd.tensorflow``: Horovod's ``horovod.tensorflow`` API on the hvdd daemon.

Use it as ``import hvdd.tensorflow as hvd``; every name of
``horovod.tensorflow`` that hvdd implements has the same signature and
meaning, in eager mode, inside ``tf.function`` and in TF1 graphs
(``tf.compat.v1``). It is pure Python: nothing to rebuild when TensorFlow
changes. Importing it does not import torch.
"""

from __future__ import annotations

import sys
from typing import Any, List, Optional

import tensorflow as tf

from .. import basics as _basics
from ..basics import *  # noqa: F401,F403 (Horovod's common basics: basics.__all__)
from ..basics import Adasum, Average, ProcessSet, global_process_set
from ..exceptions import HorovodInternalError, HostsUpdatedInterrupt, HvddInternalError
from . import _keras_optimizer, elastic
from .compression import Compression
from .functions import (
    allgather_object,
    broadcast_global_variables,
    broadcast_object,
    broadcast_object_fn,
    broadcast_variables,
)
from .gradient_aggregation import LocalGradientAggregationHelper, check_optimizer_args, make_allreduce_grads_fn, var_ids
from .mpi_ops import __all__ as _COLLECTIVES
from .mpi_ops import (
    allgather,
    allreduce,
    alltoall,
    barrier,
    broadcast,
    broadcast_,
    grouped_allgather,
    grouped_allreduce,
    grouped_reducescatter,
    handle_average_backwards_compatibility,
    join,
    local_rank_op,
    local_size_op,
    process_set_included_op,
    rank_op,
    reducescatter,
    size_op,
)

__all__ = [
    *_basics.__all__,
    "HorovodInternalError",
    "HvddInternalError",
    "HostsUpdatedInterrupt",
    *_COLLECTIVES,
    "Compression",
    "broadcast_variables",
    "broadcast_object",
    "broadcast_object_fn",
    "allgather_object",
    "broadcast_global_variables",
    "BroadcastGlobalVariablesHook",
    "DistributedOptimizer",
    "DistributedGradientTape",
    "PartialDistributedGradientTape",
    "elastic",
]


class BroadcastGlobalVariablesHook(tf.compat.v1.train.SessionRunHook):
    """SessionRunHook that will broadcast all global variables from root rank
    to all other processes during initialization.

    This is necessary to ensure consistent initialization of all workers when
    training is started with random weights or restored from a checkpoint.
    """

    def __init__(self, root_rank: int, device: str = "") -> None:
        """Construct a new BroadcastGlobalVariablesHook that will broadcast all
        global variables from root rank to all other processes during
        initialization.

        Args:
          root_rank:
            Rank that will send data, other ranks will receive data.
          device:
            Device to be used for broadcasting (unused: the daemon does it).
        """
        super().__init__()
        self.root_rank = root_rank
        self.bcast_op: Any = None
        self.device = device

    def begin(self) -> None:
        if not self.bcast_op or self.bcast_op.graph != tf.compat.v1.get_default_graph():
            self.bcast_op = broadcast_global_variables(self.root_rank)

    def after_create_session(self, session: Any, coord: Any) -> None:
        session.run(self.bcast_op)


class _DistributedOptimizer(tf.compat.v1.train.Optimizer):
    """An optimizer that wraps another tf.Optimizer, using an allreduce to
    combine gradient values before applying gradients to model weights."""

    def __init__(
        self,
        optimizer: Any,
        name: Optional[str],
        use_locking: bool,
        compression: Any,
        sparse_as_dense: bool,
        op: int,
        gradient_predivide_factor: float,
        backward_passes_per_step: int,
        average_aggregated_gradients: bool,
        groups: Any,
        process_set: ProcessSet,
    ) -> None:
        if name is None:
            name = f"Distributed{type(optimizer).__name__}"
        super().__init__(name=name, use_locking=use_locking)
        self._optimizer = optimizer
        self._allreduce_grads = make_allreduce_grads_fn(
            None, compression, sparse_as_dense, op, gradient_predivide_factor, groups, process_set
        )
        self._agg_helper: Optional[LocalGradientAggregationHelper] = None
        if backward_passes_per_step > 1:
            self._agg_helper = LocalGradientAggregationHelper(
                backward_passes_per_step, self._allreduce_grads, sparse_as_dense, average_aggregated_gradients
            )

    def compute_gradients(self, *args: Any, **kwargs: Any) -> List[Any]:
        """Compute gradients of all trainable variables.

        See Optimizer.compute_gradients() for more info.

        In DistributedOptimizer, compute_gradients() is overriden to also
        allreduce the gradients before returning them.
        """
        gradients = self._optimizer.compute_gradients(*args, **kwargs)
        if not gradients:
            return gradients
        grads, variables = zip(*gradients)
        if self._agg_helper is not None:
            avg_grads = self._agg_helper.compute_gradients(grads, variables)
        else:
            avg_grads = self._allreduce_grads(grads, variables)
        return list(zip(avg_grads, variables))

    def apply_gradients(self, *args: Any, **kwargs: Any) -> Any:
        """Calls this same method on the underlying optimizer (on the last of
        ``backward_passes_per_step`` passes only)."""
        if self._agg_helper is not None:
            return self._agg_helper.apply_gradients(lambda: self._optimizer.apply_gradients(*args, **kwargs))
        return self._optimizer.apply_gradients(*args, **kwargs)

    def get_slot(self, *args: Any, **kwargs: Any) -> Any:
        """Calls this same method on the underlying optimizer."""
        return self._optimizer.get_slot(*args, **kwargs)

    def get_slot_names(self, *args: Any, **kwargs: Any) -> Any:
        """Calls this same method on the underlying optimizer."""
        return self._optimizer.get_slot_names(*args, **kwargs)

    def variables(self, *args: Any, **kwargs: Any) -> Any:
        """Calls this same method on the underlying optimizer."""
        return self._optimizer.variables(*args, **kwargs)


class _DistributedAdasumOptimizer(tf.compat.v1.train.Optimizer):
    """Horovod's delta optimizer for op=Adasum (made by
    :func:`DistributedOptimizer`): every rank applies its own gradients with
    the wrapped optimizer; on every ``backward_passes_per_step``-th step the
    change of each variable since the last such step (its delta) is
    Adasum-allreduced, added to the value it started from and becomes the
    variable's new value. Horovod 0.28.1's class holds this logic in
    ``_apply_dense`` hooks that its ``apply_gradients`` (which calls the
    wrapped optimizer directly) never reaches; hvdd runs it."""

    def __init__(
        self,
        optimizer: Any,
        name: Optional[str] = None,
        use_locking: bool = False,
        compression: Any = Compression.none,
        backward_passes_per_step: int = 1,
    ) -> None:
        if name is None:
            name = "DistributedDelta{}".format(type(optimizer).__name__)
        super().__init__(name=name, use_locking=use_locking)
        self._optimizer = optimizer
        self._compression = compression
        self._backward_passes_per_step = backward_passes_per_step
        self._step_count: Optional[tf.Variable] = None
        self._starts: dict = {}

    def _state(self, name: str, initial: Any, dtype: Any) -> tf.Variable:
        with tf.init_scope():
            if tf.executing_eagerly():
                return tf.Variable(initial, trainable=False, name=name, dtype=dtype)
            return tf.compat.v1.Variable(initial, trainable=False, name=name, dtype=dtype, use_resource=True)

    def _start(self, var: Any) -> tf.Variable:
        start = self._starts.get(id(var))
        if start is None:
            base = getattr(var, "name", "var").split(":")[0]
            with tf.init_scope():
                start = self._state(
                    f"{self._name}/{base}/delta_start", tf.zeros(var.shape, var.dtype.base_dtype), var.dtype.base_dtype
                )
            self._starts[id(var)] = start
        return start

    def compute_gradients(self, *args: Any, **kwargs: Any) -> List[Any]:
        """Compute gradients of all trainable variables (the wrapped
        optimizer's, not reduced). See Optimizer.compute_gradients()."""
        return self._optimizer.compute_gradients(*args, **kwargs)

    def apply_gradients(self, grads_and_vars: Any, global_step: Any = None, name: Optional[str] = None) -> Any:
        """Applies the gradients with the wrapped optimizer, then, on a
        communication step, replaces each variable by its start plus the
        Adasum of the ranks' deltas."""
        grads_and_vars = list(grads_and_vars)
        variables = [v for g, v in grads_and_vars if g is not None]
        if self._step_count is None:
            self._step_count = self._state(f"{self._name}/step_count", 0, tf.int64)
        step = self._step_count
        starts = [self._start(v) for v in variables]
        passes = self._backward_passes_per_step
        is_first = tf.equal(step.read_value(), 0)
        is_comm = tf.equal(step.read_value() % passes, passes - 1)

        def init_starts() -> Any:
            return tf.group(*[s.assign(v, use_locking=self._use_locking) for s, v in zip(starts, variables)])

        init = tf.cond(is_first, init_starts, tf.no_op)
        with tf.control_dependencies([init]):
            update = self._optimizer.apply_gradients(grads_and_vars, global_step=global_step, name=name)
        deps = [update] if update is not None and not tf.executing_eagerly() else []

        def communicate() -> Any:
            deltas = [tf.convert_to_tensor(v) - s.read_value() for s, v in zip(starts, variables)]
            reduced = grouped_allreduce(deltas, compression=self._compression, op=Adasum)
            assigns = []
            for s, v, r in zip(starts, variables, reduced):
                new_start = s.assign_add(r, use_locking=self._use_locking)
                assigns.append(v.assign(new_start, use_locking=self._use_locking))
            return tf.group(*assigns)

        with tf.control_dependencies(deps):
            comm = tf.cond(is_comm, communicate, tf.no_op)
        if tf.executing_eagerly():
            return step.assign_add(1, use_locking=self._use_locking)
        with tf.control_dependencies([comm]):
            return step.assign_add(1, use_locking=self._use_locking).op

    def get_slot(self, *args: Any, **kwargs: Any) -> Any:
        """Calls this same method on the underlying optimizer."""
        return self._optimizer.get_slot(*args, **kwargs)

    def get_slot_names(self, *args: Any, **kwargs: Any) -> Any:
        """Calls this same method on the underlying optimizer."""
        return self._optimizer.get_slot_names(*args, **kwargs)

    def variables(self, *args: Any, **kwargs: Any) -> Any:
        """Calls this same method on the underlying optimizer."""
        return self._optimizer.variables(*args, **kwargs)


def DistributedOptimizer(
    optimizer: Any,
    name: Optional[str] = None,
    use_locking: bool = False,
    device_dense: str = "",
    device_sparse: str = "",
    compression: Any = Compression.none,
    sparse_as_dense: bool = False,
    backward_passes_per_step: int = 1,
    op: int = Average,
    gradient_predivide_factor: float = 1.0,
    average_aggregated_gradients: bool = False,
    num_groups: int = 0,
    groups: Any = None,
    process_set: ProcessSet = global_process_set,
    scale_local_gradients: bool = True,
) -> Any:
    """Construct a new DistributedOptimizer, which uses another optimizer
    under the hood for computing single-process gradient values and
    applying gradient updates after the gradient values have been combined
    across all the Horovod ranks.

    Args:
      optimizer:
        Optimizer to use for computing gradients and applying updates: a
        ``tf.compat.v1.train.Optimizer``, or a Keras optimizer (then the
        result is ``hvdd.tensorflow.keras.DistributedOptimizer``'s).
      name:
        Optional name prefix for the operations created when applying
        gradients. Defaults to "Distributed" followed by the provided
        optimizer type.
      use_locking:
        Whether to use locking when updating variables.
        See Optimizer.__init__ for more info.
      device_dense, device_sparse:
        Devices for the allreduces (unused: the daemon does them).
      compression:
        Compression algorithm used during allreduce to reduce the amount
        of data sent during each parameter update step.  Defaults to
        not using compression.
      sparse_as_dense:
        Treat all sparse gradients as dense tensors.  This can help improve
        performance and memory utilization if the original sparse gradient
        has high density.  Defaults to false.
      backward_passes_per_step:
        Number of backward passes to perform before calling hvd.allreduce.
        This allows accumulating updates over multiple mini-batches before
        reducing and applying them.
      op:
        The reduction operation to use when combining gradients across
        different ranks.
      gradient_predivide_factor:
        If op == Average, gradient_predivide_factor splits the averaging
        before and after the sum. Gradients are scaled by
        1.0 / gradient_predivide_factor before the sum and
        gradient_predivide_factor / size after the sum.
      average_aggregated_gradients:
        Whether to average the aggregated gradients that have been accumulated
        over multiple mini-batches. If true divides gradients updates by
        backward_passes_per_step. Only applicable for
        backward_passes_per_step > 1.
      num_groups:
        Number of groups to assign gradient allreduce ops to for explicit
        grouping. Defaults to no explicit groups.
      groups:
        The parameter to group the gradient allreduce ops. Accept values is a
        non-negative integer or a list of list of tf.Variable.
        If groups is a non-negative integer, it is the number of groups to
        assign gradient allreduce ops to for explicit grouping.
        If groups is a list of list of tf.Variable. Variables in the same
        inner list will be assigned to the same group, while parameter that
        does not appear in any list will form a group itself.
        Defaults as None, which is no explicit groups.
      process_set:
        Gradients will only be reduced over Horovod processes belonging
        to this process set. Defaults to the global process set.
      scale_local_gradients:
        Whether to scale the gradients of local variables (Keras only).
    """
    groups = check_optimizer_args(
        op, gradient_predivide_factor, average_aggregated_gradients, num_groups, groups, backward_passes_per_step
    )
    if isinstance(optimizer, tf.compat.v1.train.Optimizer):
        if op == Adasum:
            if process_set.process_set_id != 0:
                raise NotImplementedError("Adasum does not support process sets yet")
            return _DistributedAdasumOptimizer(optimizer, name, use_locking, compression, backward_passes_per_step)
        return _DistributedOptimizer(
            optimizer,
            name,
            use_locking,
            compression,
            sparse_as_dense,
            op,
            gradient_predivide_factor,
            backward_passes_per_step,
            average_aggregated_gradients,
            groups,
            process_set,
        )
    if _is_keras_optimizer(optimizer):
        if op == Adasum:
            raise ValueError("op == Adasum is not supported yet with Keras")
        # What hvdd.tensorflow.keras.DistributedOptimizer returns (Horovod
        # hands the optimizer to horovod.tensorflow.keras), on tf.keras.
        from tensorflow import keras

        return _keras_optimizer.create_distributed_optimizer(
            keras,
            optimizer,
            name,
            device_dense,
            device_sparse,
            compression,
            sparse_as_dense,
            gradient_predivide_factor,
            op,
            backward_passes_per_step=backward_passes_per_step,
            average_aggregated_gradients=average_aggregated_gradients,
            groups=groups,
            process_set=process_set,
            scale_local_gradients=scale_local_gradients,
            num_groups=0,
        )
    raise ValueError(
        "Provided optimizer doesn't inherit from either legacy TensorFlow or Keras optimizer: %s" % optimizer
    )


def _is_keras_optimizer(optimizer: Any) -> bool:
    """Whether optimizer is a Keras one (Keras 3, tf_keras or its legacy
    optimizers), looking only at Keras packages already imported."""
    for mod in ("keras", "tf_keras"):
        optimizers = getattr(sys.modules.get(mod), "optimizers", None)
        bases = (
            getattr(optimizers, "Optimizer", None),
            getattr(getattr(optimizers, "legacy", None), "Optimizer", None),
        )
        if any(b is not None and isinstance(optimizer, b) for b in bases):
            return True
    return False


class _DistributedGradientTape(tf.GradientTape):
    """A tape whose ``gradient()`` returns the gradients reduced across ranks
    (made by :func:`DistributedGradientTape`)."""

    def __init__(
        self,
        tape: Any,
        compression: Any,
        sparse_as_dense: bool,
        op: int,
        gradient_predivide_factor: float,
        groups: Any,
        persistent: bool = False,
        watch_accessed_variables: bool = True,
        process_set: ProcessSet = global_process_set,
        local_sources: Optional[List[Any]] = None,
        scale_local_gradients: bool = True,
    ) -> None:
        super(self.__class__, self).__init__(persistent, watch_accessed_variables)
        self._tape = tape
        local_ids = {k for v in (local_sources or []) for k in var_ids(v)}
        self._allreduce_grads = make_allreduce_grads_fn(
            "DistributedGradientTape_Allreduce",
            compression,
            sparse_as_dense,
            op,
            gradient_predivide_factor,
            groups,
            process_set,
            scale_local_gradients,
            local_ids,
        )

    def gradient(self, target: Any, sources: Any, output_gradients: Any = None, **kwargs: Any) -> Any:
        """Computes the gradients as ``tf.GradientTape.gradient`` does, then
        reduces them across ranks (local sources of a partial tape stay
        local, scaled by 1/size when ``scale_local_gradients``)."""
        grads = super(self.__class__, self).gradient(target, sources, output_gradients, **kwargs)
        flat_sources = tf.nest.flatten(sources)
        reduced = self._allreduce_grads(tf.nest.flatten(grads), flat_sources)
        return tf.nest.pack_sequence_as(grads, reduced)


def DistributedGradientTape(
    gradtape: tf.GradientTape,
    device_dense: str = "",
    device_sparse: str = "",
    compression: Any = Compression.none,
    sparse_as_dense: bool = False,
    op: int = Average,
    gradient_predivide_factor: float = 1.0,
    num_groups: int = 0,
    groups: Any = None,
    process_set: ProcessSet = global_process_set,
    scale_local_gradients: bool = True,
) -> tf.GradientTape:
    """A tape that wraps another tf.GradientTape, using an allreduce to
    combine gradient values before applying gradients to model weights.

    Args:
      gradtape:
        GradientTape to use for computing gradients and applying updates.
      device_dense, device_sparse:
        Devices for the allreduces (unused: the daemon does them).
      compression:
        Compression algorithm used during allreduce to reduce the amount
        of data sent during each parameter update step.  Defaults to
        not using compression.
      sparse_as_dense:
        Treat all sparse gradients as dense tensors.  This can help improve
        performance and memory utilization if the original sparse gradient
        has high density.  Defaults to false.
      op:
        The reduction operation to use when combining gradients across
        different ranks.
      gradient_predivide_factor:
        If op == Average, gradient_predivide_factor splits the averaging
        before and after the sum. Gradients are scaled by
        1.0 / gradient_predivide_factor before the sum and
        gradient_predivide_factor / size after the sum.
      num_groups:
        Number of groups to assign gradient allreduce ops to for explicit
        grouping. Defaults to no explicit groups.
      groups:
        The parameter to group the gradient allreduce ops: a positive
        integer (that many groups) or a list of lists of tf.Variable.
      process_set:
        Gradients will only be reduced over Horovod processes belonging
        to this process set. Defaults to the global process set.
      scale_local_gradients:
        Whether to scale the gradients of local variables (partial tapes).
    """
    return _make_tape(
        gradtape,
        compression,
        sparse_as_dense,
        op,
        gradient_predivide_factor,
        num_groups,
        groups,
        process_set,
        None,
        scale_local_gradients,
    )


def PartialDistributedGradientTape(
    gradtape: tf.GradientTape,
    device_dense: str = "",
    device_sparse: str = "",
    compression: Any = Compression.none,
    sparse_as_dense: bool = False,
    op: int = Average,
    gradient_predivide_factor: float = 1.0,
    num_groups: int = 0,
    groups: Any = None,
    process_set: ProcessSet = global_process_set,
    local_layers: Any = None,
    scale_local_gradients: bool = True,
) -> tf.GradientTape:
    """A tape that wraps another tf.GradientTape, using an allreduce to
    combine gradient values before applying gradients to model weights,
    similar to DistributedGradientTape, except that the gradients of the
    ``local_layers`` (a Keras layer or a list of them) are not reduced: each
    rank keeps its own, scaled by 1/size when ``scale_local_gradients``."""
    if local_layers is None:
        local_layers = []
    elif not isinstance(local_layers, (list, tuple)):
        local_layers = [local_layers]
    local_vars = [v for layer in local_layers for v in layer.trainable_weights]
    return _make_tape(
        gradtape,
        compression,
        sparse_as_dense,
        op,
        gradient_predivide_factor,
        num_groups,
        groups,
        process_set,
        local_vars,
        scale_local_gradients,
    )


def _make_tape(
    gradtape: tf.GradientTape,
    compression: Any,
    sparse_as_dense: bool,
    op: int,
    gradient_predivide_factor: float,
    num_groups: int,
    groups: Any,
    process_set: ProcessSet,
    local_sources: Optional[List[Any]],
    scale_local_gradients: bool,
) -> tf.GradientTape:
    groups = check_optimizer_args(op, gradient_predivide_factor, False, num_groups, groups)
    # A subclass of the tape's own class, as Horovod makes, sharing its recording.
    cls = type(gradtape.__class__.__name__, (gradtape.__class__,), dict(_DistributedGradientTape.__dict__))
    return cls(
        gradtape._tape,
        compression,
        sparse_as_dense,
        op,
        gradient_predivide_factor,
        groups,
        gradtape._persistent,
        getattr(gradtape, "_watch_accessed_variables", True),
        process_set,
        local_sources,
        scale_local_gradients,
    )
