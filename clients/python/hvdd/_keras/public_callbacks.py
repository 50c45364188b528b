"""Horovod's Keras callbacks (``horovod/keras/callbacks.py``), written once
for ``hvdd.tensorflow.keras.callbacks`` and ``hvdd.keras.callbacks``:
:func:`bind` makes the classes on one Keras module's ``Callback``."""

from __future__ import annotations

from typing import Any, Callable, Dict, Optional, Sequence, Union

from . import callbacks as _impl

PUBLIC = [
    "BroadcastGlobalVariablesCallback",
    "MetricAverageCallback",
    "LearningRateScheduleCallback",
    "LearningRateWarmupCallback",
    "BestModelCheckpoint",
]


def bind(keras: Any, module: str) -> Dict[str, Any]:
    """The callback classes for the Keras module ``keras``, as the callbacks
    module ``module`` exports them."""

    class BroadcastGlobalVariablesCallback(_impl.BroadcastGlobalVariablesCallbackImpl, keras.callbacks.Callback):
        """
        Keras Callback that will broadcast all global variables from root rank
        to all other processes during initialization.

        This is necessary to ensure consistent initialization of all workers when
        training is started with random weights or restored from a checkpoint.

        The broadcast happens at the end of the first batch, when the optimizer's
        variables exist; it covers the model's variables (except local_variables)
        and the optimizer's.
        """

        def __init__(self, root_rank: int, device: str = "", local_variables: Optional[Sequence[Any]] = None) -> None:
            """
            Construct a new BroadcastGlobalVariablesCallback that will broadcast all
            global variables from root rank to all other processes during initialization.

            Args:
                root_rank: Rank that will send data, other ranks will receive data.
                device: Device to be used for broadcasting (unused by hvdd).
                local_variables: A collection of variables that need not to be
                                 broadcasted.
            """
            super().__init__(keras.backend, root_rank, device, local_variables)

    class MetricAverageCallback(_impl.MetricAverageCallbackImpl, keras.callbacks.Callback):
        """
        Keras Callback that will average metrics across all processes at the
        end of the epoch. Useful in conjuction with ReduceLROnPlateau,
        TensorBoard and other metrics-based callbacks.

        Note, this callback must be added to the callback list before the
        ReduceLROnPlateau, TensorBoard or other metrics-based callbacks.
        """

        def __init__(self, device: str = "") -> None:
            """
            Construct a new MetricAverageCallback that will average metrics
            across all processes at the end of the epoch.

            Args:
                device: Device to be used for allreduce (unused by hvdd).
            """
            super().__init__(keras.backend, device)

    class LearningRateScheduleCallback(_impl.LearningRateScheduleCallbackImpl, keras.callbacks.Callback):
        """
        LearningRateScheduleCallback sets learning rate between epochs `start_epoch` and
        `end_epoch` to be `initial_lr * multiplier`.  `multiplier` can be a constant or
        a function `f(epoch) = lr'`.

        If `multiplier` is a function and `staircase=True`, learning rate adjustment will
        happen at the beginning of each epoch and the epoch passed to the `multiplier`
        function will be an integer.

        If `multiplier` is a function and `staircase=False`, learning rate adjustment will
        happen at the beginning of each batch and the epoch passed to the `multiplier`
        function will be a floating number: `epoch' = epoch + batch / steps_per_epoch`.
        This functionality is useful for smooth learning rate adjustment schedulers, such
        as `LearningRateWarmupCallback`.

        `initial_lr` is the learning rate of the model optimizer at the start of the training.
        """

        def __init__(
            self,
            initial_lr: float,
            multiplier: Union[float, Callable[[float], float]],
            start_epoch: int = 0,
            end_epoch: Optional[int] = None,
            staircase: bool = True,
            momentum_correction: bool = True,
            steps_per_epoch: Optional[int] = None,
        ) -> None:
            """
            Construct a new LearningRateScheduleCallback.

            Args:
                initial_lr: Initial learning rate at the start of training.
                multiplier: A constant multiplier or a function `f(epoch) = lr'`
                start_epoch: The first epoch this adjustment will be applied to. Defaults to 0.
                end_epoch: The epoch this adjustment will stop applying (exclusive end).
                           Defaults to None.
                staircase: Whether to adjust learning rate at the start of epoch (`staircase=True`)
                           or at the start of every batch (`staircase=False`).
                momentum_correction: Apply momentum correction to optimizers that have momentum.
                                     Defaults to True.
                steps_per_epoch: The callback will attempt to autodetect number of batches per
                                 epoch with Keras >= 2.0.0. Provide this value if you have an older
                                 version of Keras.
            """
            super().__init__(
                keras.backend,
                initial_lr,
                multiplier,
                start_epoch,
                end_epoch,
                staircase,
                momentum_correction,
                steps_per_epoch,
            )

    class LearningRateWarmupCallback(_impl.LearningRateWarmupCallbackImpl, keras.callbacks.Callback):
        """
        Implements gradual learning rate warmup:

            `lr = initial_lr / hvd.size()` ---> `lr = initial_lr`

        `initial_lr` is the learning rate of the model optimizer at the start of the training.

        This technique was described in the paper "Accurate, Large Minibatch SGD: Training
        ImageNet in 1 Hour". See https://arxiv.org/pdf/1706.02677.pdf for details.

        Math recap:
                                                     batch
            epoch               = full_epochs + ---------------
                                                steps_per_epoch

                                   lr     size - 1
            lr'(epoch)          = ---- * (-------- * epoch + 1)
                                  size     warmup

                                   lr
            lr'(epoch = 0)      = ----
                                  size

            lr'(epoch = warmup) = lr
        """

        def __init__(
            self,
            initial_lr: float,
            warmup_epochs: int = 5,
            momentum_correction: bool = True,
            steps_per_epoch: Optional[int] = None,
            verbose: int = 0,
        ) -> None:
            """
            Construct a new LearningRateWarmupCallback that will gradually warm up the learning rate.

            Args:
                initial_lr: Initial learning rate at the start of training.
                warmup_epochs: The number of epochs of the warmup phase. Defaults to 5.
                momentum_correction: Apply momentum correction to optimizers that have momentum.
                                     Defaults to True.
                steps_per_epoch: The callback will attempt to autodetect number of batches per
                                 epoch with Keras >= 2.0.0. Provide this value if you have an older
                                 version of Keras.
                verbose: verbosity mode, 0 or 1.
            """
            super().__init__(keras.backend, initial_lr, warmup_epochs, momentum_correction, steps_per_epoch, verbose)

    class BestModelCheckpoint(_impl.BestModelCheckpointImpl, keras.callbacks.ModelCheckpoint):
        """
        Save the model with the best performance. Save it only on rank 0, as for
        any checkpoint (``if hvd.rank() == 0: callbacks.append(...)``).

        Args:
            monitor: The metric name to monitor.
            verbose: verbosity mode, 0 or 1.
            mode: one of {'auto', 'min', 'max'}. The decision to overwrite the
                  current save file is made based on either the maximization or
                  the minimization of the monitored quantity. For `val_acc`, this
                  should be `max`, for `val_loss` this should be `min`, etc. In
                  `auto` mode, the direction is automatically inferred from the
                  name of the monitored quantity.
            save_freq: `'epoch'` or integer. When using `'epoch'`, the callback
                       saves the model after each epoch. When using integer, the
                       callback saves the model at end of this many batches.
            filepath: Where to save (``.keras`` for Keras 3). As in Horovod it may
                      be left out and set later (``callback.filepath = ...``).
        """

        def __init__(
            self,
            monitor: str = "val_loss",
            verbose: int = 0,
            mode: str = "auto",
            save_freq: Union[str, int] = "epoch",
            filepath: Optional[str] = None,
        ) -> None:
            super().__init__(keras.backend, monitor, verbose, mode, save_freq, filepath)

    names = {k: v for k, v in locals().items() if k in PUBLIC}
    for k, v in names.items():
        v.__module__, v.__qualname__ = module, k
    return names
