"""The public API of ``hvdd.tensorflow.keras`` and ``hvdd.keras``
(``horovod.tensorflow.keras`` and ``horovod.keras``), written once:
:func:`bind` makes it for one Keras module (``tf.keras`` or ``keras``), and
each public package takes its names from there."""

from __future__ import annotations

from typing import Any, Dict, Optional, Sequence

from .. import _keras as _impl
from .. import basics as _basics
from ..basics import __all__ as _BASICS
from ..basics import Average, ProcessSet, global_process_set
from ..exceptions import HorovodInternalError, HostsUpdatedInterrupt  # noqa: F401 (re-exported)
from ..tensorflow.compression import Compression


PUBLIC = [
    "init",
    "shutdown",
    "is_initialized",
    "start_timeline",
    "stop_timeline",
    "size",
    "local_size",
    "cross_size",
    "rank",
    "local_rank",
    "cross_rank",
    "is_homogeneous",
    "mpi_threads_supported",
    "mpi_enabled",
    "mpi_built",
    "gloo_enabled",
    "gloo_built",
    "nccl_built",
    "ddl_built",
    "ccl_built",
    "cuda_built",
    "rocm_built",
    "ProcessSet",
    "global_process_set",
    "add_process_set",
    "remove_process_set",
    "Average",
    "Sum",
    "Adasum",
    "Min",
    "Max",
    "Product",
    "HorovodInternalError",
    "HostsUpdatedInterrupt",
    "Compression",
    "DistributedOptimizer",
    "PartialDistributedOptimizer",
    "broadcast_global_variables",
    "allreduce",
    "allgather",
    "broadcast",
    "reducescatter",
    "load_model",
    "callbacks",
]


def bind(keras: Any, module: str) -> Dict[str, Any]:
    """The public names of a Keras package of hvdd for the Keras module
    ``keras``; functions are given the package's name as their module."""

    def DistributedOptimizer(
        optimizer: Any,
        name: Optional[str] = None,
        device_dense: str = "",
        device_sparse: str = "",
        compression: Any = Compression.none,
        sparse_as_dense: bool = False,
        gradient_predivide_factor: float = 1.0,
        op: int = Average,
        backward_passes_per_step: int = 1,
        average_aggregated_gradients: bool = False,
        num_groups: int = 0,
        groups: Any = None,
        process_set: ProcessSet = global_process_set,
        scale_local_gradients: bool = True,
    ) -> Any:
        """
        An optimizer that wraps another keras.optimizers.Optimizer, using an allreduce to
        average gradient values before applying gradients to model weights.

        Args:
            optimizer: Optimizer to use for computing gradients and applying updates.
            name: Optional name prefix for the operations created when applying
                  gradients. Defaults to "Distributed" followed by the provided
                  optimizer type.
            device_dense: Device to be used for dense tensors (unused: the hvdd
                          daemon does the reduction).
            device_sparse: Device to be used for sparse tensors (unused).
            compression: Compression algorithm used to reduce the amount of data
                         sent and received by each worker node.  Defaults to not
                         using compression.
            sparse_as_dense: Treat all sparse gradients as dense tensors.  This can
                             help improve performance and memory utilization if
                             the original sparse gradient has high density.
                             Defaults to false.
            gradient_predivide_factor: gradient_predivide_factor splits the averaging
                                       before and after the sum. Gradients are scaled by
                                       1.0 / gradient_predivide_factor before the sum and
                                       gradient_predivide_factor / size after the sum.
            op: The reduction operation to use when combining gradients across
                different ranks. Defaults to Average.
            backward_passes_per_step: Number of backward passes to perform before calling
                                      hvd.allreduce. This allows accumulating updates over
                                      multiple mini-batches before reducing and applying them.
            average_aggregated_gradients: Whether to average the aggregated gradients that
                                          have been accumulated over multiple mini-batches.
                                          If true divides gradient updates by
                                          backward_passes_per_step.
                                          Only applicable for backward_passes_per_step > 1.
            num_groups: Number of groups to assign gradient allreduce ops to for explicit
                        grouping. Defaults to no explicit groups.
            groups: The parameter to group the gradient allreduce ops. Accept values is a
                    non-negative integer or a list of list of tf.Variable.
                    If groups is a non-negative integer, it is the number of groups to assign
                    gradient allreduce ops to for explicit grouping.
                    If groups is a list of list of tf.Variable. Variables in the same
                    inner list will be assigned to the same group, while parameter that does
                    not appear in any list will form a group itself.
                    Defaults as None, which is no explicit groups.
            process_set: Gradients will only be reduced over Horovod processes belonging
                       to this process set. Defaults to the global process set.
            scale_local_gradients: Whether to scale the gradients of local variables. Default is set to True.
        """
        return _impl.create_distributed_optimizer(
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
            num_groups=num_groups,
        )

    def PartialDistributedOptimizer(
        optimizer: Any,
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
        local_layers: Any = None,
        scale_local_gradients: bool = True,
    ) -> Any:
        """
        An optimizer that wraps another keras.optimizers.Optimizer, using an allreduce to
        average gradient values before applying gradients to model weights, except
        for the trainable variables of ``local_layers``, whose gradients stay local
        (divided by the number of ranks when ``scale_local_gradients``).

        Args:
            local_layers: A collection of type tf.keras.layers.Layer local layers
                          whose gradients will not be allreduced.
            (the other arguments are DistributedOptimizer's)
        """
        layers = _impl.local_layers(keras, local_layers)
        opt = DistributedOptimizer(
            optimizer,
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
        for layer in layers:
            for var in layer.trainable_weights:
                opt.register_local_var(var)
        return opt

    def broadcast_global_variables(root_rank: int) -> Any:
        """Broadcasts all global variables from root rank to all other processes.

        Only in TF1 graph mode; with TensorFlow 2 / Keras 3 (eager) it raises and
        points to ``callbacks.BroadcastGlobalVariablesCallback`` and
        ``hvdd.tensorflow.broadcast_variables``.

        Arguments:
            root_rank: Rank of the process from which global variables will be broadcasted
                       to all other processes.
        """
        return _impl.broadcast_global_variables(keras.backend, root_rank)

    def allreduce(
        value: Any,
        name: Optional[str] = None,
        average: Optional[bool] = None,
        prescale_factor: float = 1.0,
        postscale_factor: float = 1.0,
        op: Optional[int] = None,
        compression: Any = Compression.none,
    ) -> Any:
        """
        Perform an allreduce on a tensor-compatible value.

        Arguments:
            value: A tensor-compatible value to reduce.
                   The shape of the input must be identical across all ranks.
            name: Optional name for the constants created by this operation.
            average:
                .. warning:: .. deprecated:: 0.19.0

                   Use `op` instead. Will be removed in v0.21.0.

            prescale_factor: Multiplicative factor to scale tensor before allreduce.
            postscale_factor: Multiplicative factor to scale tensor after allreduce.
            op: The reduction operation to combine tensors across different ranks.
                Defaults to Average if None is given.
            compression: Compression algorithm used to reduce the amount of data
                         sent and received by each worker node.  Defaults to not
                         using compression.

        Returns:
            The reduced value, as a numpy value.
        """
        return _impl.allreduce(keras.backend, value, name, average, prescale_factor, postscale_factor, op, compression)

    def allgather(value: Any, name: Optional[str] = None) -> Any:
        """
        Perform an allgather on a tensor-compatible value.

        The concatenation is done on the first dimension, so the input values on the
        different processes must have the same rank and shape, except for the first
        dimension, which is allowed to be different.

        Arguments:
            value: A tensor-compatible value to gather.
            name: Optional name prefix for the constants created by this operation.
        """
        return _impl.allgather(keras.backend, value, name)

    def broadcast(value: Any, root_rank: int, name: Optional[str] = None) -> Any:
        """
        Perform a broadcast on a tensor-compatible value.

        Arguments:
            value: A tensor-compatible value to reduce.
                   The shape of the input must be identical across all ranks.
            root_rank: Rank of the process from which global variables will be
                       broadcasted to all other processes.
            name: Optional name for the constants created by this operation.
        """
        return _impl.broadcast(keras.backend, value, root_rank, name)

    def reducescatter(value: Any, name: Optional[str] = None, op: int = Average) -> Any:
        """
        Perform a reducescatter on a tensor-compatible value.

        Arguments:
            value: A tensor-compatible value to reduce and scatter.
                   The shape of the input must be identical across all ranks.
            name: Optional name for the constants created by this operation.
            op: The reduction operation to combine tensors across different ranks.
                Defaults to Average.
        """
        return _impl.reducescatter(keras.backend, value, name, op)

    def load_model(
        filepath: Any,
        custom_optimizers: Optional[Sequence[type]] = None,
        custom_objects: Optional[Dict[str, Any]] = None,
        compression: Any = Compression.none,
        legacy_opts: bool = False,
    ) -> Any:
        """
        Loads a saved Keras model with a Horovod DistributedOptimizer.

        The DistributedOptimizer will wrap the underlying optimizer used to train
        the saved model, so that the optimizer state (params and weights) will
        be picked up for retraining.

        By default, all optimizers in the module `keras.optimizers` will be loaded
        and wrapped without needing to specify any `custom_optimizers` or
        `custom_objects`.

        Arguments:
            filepath: One of the following:
                - string, path to the saved model (``.keras``; ``.h5``), or
                - h5py.File object from which to load the model
            custom_optimizers: Optional list of Optimizer subclasses to support
                during loading.
            custom_objects: Optional dictionary mapping names (strings) to custom
                classes or functions to be considered during deserialization.
            compression: Compression algorithm used to reduce the amount of data
                         sent and received by each worker node.  Defaults to not
                         using compression.
            legacy_opts: If True, the optimizers of `keras.optimizers.legacy`
                         (tf_keras) are the ones wrapped.

        Returns:
            A Keras model instance.

        Raises:
            ImportError: If h5py is not available.
            ValueError: In case of an invalid savefile.
        """

        def wrap_optimizer(cls: type) -> type:
            return _impl.distributed_optimizer_class(keras, cls, compression=compression)

        return _impl.load_model(keras, wrap_optimizer, filepath, custom_optimizers, custom_objects, legacy_opts)

    basics = {n: getattr(_basics, n) for n in _BASICS}
    names = {k: v for k, v in {**basics, **globals(), **locals()}.items() if k in PUBLIC}
    for k, v in names.items():
        if callable(v) and getattr(v, "__module__", None) == __name__:
            v.__module__, v.__qualname__ = module, k
    return names
