"""Elastic Keras (Horovod's ``horovod/_keras/elastic.py`` and the
``elastic`` modules of ``horovod.tensorflow.keras`` and ``horovod.keras``),
written once: the callbacks' ``*Impl`` mixins, and
:func:`bind`, which makes ``KerasState`` (on ``hvdd.tensorflow.elastic``'s
``TensorFlowKerasState``, where Horovod has it) and the callbacks for one
Keras module. ``run`` is ``hvdd.tensorflow.elastic``'s."""

from __future__ import annotations

from typing import Any, Dict, Optional

from ..tensorflow.elastic import TensorFlowKerasState, run

__all__ = ["TensorFlowKerasState", "bind", "PUBLIC"]

PUBLIC = ["KerasState", "CommitStateCallback", "UpdateBatchStateCallback", "UpdateEpochStateCallback", "run"]


class CommitStateCallbackImpl:
    """Commits the state every ``batches_per_commit`` batches and at the end
    of every epoch."""

    def __init__(self, backend: Any, state: Any, batches_per_commit: int, *args: Any) -> None:
        super().__init__(*args)
        self.backend = backend
        self.state = state
        self.batches_per_commit = batches_per_commit
        self.batches_remaining = batches_per_commit

    def on_train_begin(self, logs: Optional[Dict[str, Any]] = None) -> None:
        # Reset this for every sync event to ensure consistency across ranks
        self.batches_remaining = self.batches_per_commit

    def on_batch_end(self, batch: int, logs: Optional[Dict[str, Any]] = None) -> None:
        self.batches_remaining -= 1
        if self.batches_remaining == 0:
            self.commit()
            self.batches_remaining = self.batches_per_commit

    def on_epoch_end(self, epoch: int, logs: Optional[Dict[str, Any]] = None) -> None:
        self.commit()

    def commit(self) -> None:
        self.state.commit()


class UpdateBatchStateCallbackImpl:
    """Keeps ``state.batch`` at the batch just finished (0 after an epoch),
    and shortens the first epoch after a reset by the batches already done in
    the callbacks' ``params["steps"]`` (what progress bars show).

    As with Horovod's, that is all: Keras 3's and tf_keras's ``fit`` take the
    epoch's length from ``steps_per_epoch`` and never read ``params``, so the
    first epoch after a reset runs all its steps."""

    def __init__(self, backend: Any, state: Any, *args: Any) -> None:
        super().__init__(*args)
        self.backend = backend
        self.state = state
        self.steps_per_epoch: Optional[int] = None

    def on_train_begin(self, logs: Optional[Dict[str, Any]] = None) -> None:
        # Reset this for every sync event to ensure consistency across ranks
        self.steps_per_epoch = None

    def on_epoch_begin(self, epoch: int, logs: Optional[Dict[str, Any]] = None) -> None:
        if self.params.get("steps"):
            if self.steps_per_epoch is None:
                self.steps_per_epoch = self.params.get("steps")
            self.params["steps"] = self.steps_per_epoch - self.state.batch

    def on_batch_end(self, batch: int, logs: Optional[Dict[str, Any]] = None) -> None:
        self.state.batch = batch

    def on_epoch_end(self, epoch: int, logs: Optional[Dict[str, Any]] = None) -> None:
        self.state.batch = 0


class UpdateEpochStateCallbackImpl:
    """Keeps ``state.epoch`` at the global epoch number across resets."""

    def __init__(self, backend: Any, state: Any, *args: Any) -> None:
        super().__init__(*args)
        self.backend = backend
        self.state = state

        # The `epoch` number tracked by Keras always starts at 0,
        # but we want to track the global number of epochs (across
        # resets) in the state.
        self.initial_epoch = self.state.epoch

    def on_train_begin(self, logs: Optional[Dict[str, Any]] = None) -> None:
        self.initial_epoch = self.state.epoch

    def on_epoch_end(self, epoch: int, logs: Optional[Dict[str, Any]] = None) -> None:
        # Offset the epoch number by our starting epoch when training
        # began (carried over from previous reset events).
        #
        # We also want to offset by 1 to avoid repeating the previous
        # epoch if a reset occurs after `state.batch` is set back to 0.
        self.state.epoch = self.initial_epoch + epoch + 1


def bind(keras: Any, module: str) -> Dict[str, Any]:
    """The public names of the ``elastic`` module ``module`` of a Keras
    package of hvdd, for the Keras module ``keras``."""

    class KerasState(TensorFlowKerasState):
        """State representation of a `keras` model and optimizer.

        Args:
            model: Keras model.
            optimizer: Optional optimizer, can be compiled into model instead.
            kwargs: Additional properties to sync, will be exposed as attributes of the object.
        """

        def __init__(self, model: Any, optimizer: Any = None, **kwargs: Any) -> None:
            super().__init__(model, optimizer=optimizer, backend=keras.backend, **kwargs)

    class CommitStateCallback(CommitStateCallbackImpl, keras.callbacks.Callback):
        """
        Keras Callback that will commit the `state` object every `batches_per_commit`
        batches at the end of each batch.
        """

        def __init__(self, state: Any, batches_per_commit: int = 1) -> None:
            """
            Constructs a new CommitStateCallback.

            Args:
                state: `hvdd.elastic.State` object to be committed.
                batches_per_commit: Number of batches to complete between each commit (default: 1).
            """
            super().__init__(keras.backend, state, batches_per_commit)

    class UpdateBatchStateCallback(UpdateBatchStateCallbackImpl, keras.callbacks.Callback):
        """
        Keras Callback that will update the value of `state.batch` with the current batch number at
        the end of each batch. Batch will reset to 0 at the end of each epoch.

        If `steps_per_epoch` is set, then this callback will also ensure that the number of steps
        in the first epoch following a reset is shortened by the number of batches already processed,
        in the callbacks' `params["steps"]`; `model.fit` itself still runs `steps_per_epoch` steps.
        """

        def __init__(self, state: Any) -> None:
            """
            Constructs a new UpdateBatchStateCallback.

            Args:
                state: `hvdd.elastic.State` object to be updated.
            """
            super().__init__(keras.backend, state)

    class UpdateEpochStateCallback(UpdateEpochStateCallbackImpl, keras.callbacks.Callback):
        """
        Keras Callback that will update the value of `state.epoch` with the current epoch number at
        the end of each epoch.
        """

        def __init__(self, state: Any) -> None:
            """
            Constructs a new UpdateEpochStateCallback.

            Args:
                state: `hvdd.elastic.State` object to be updated.
            """
            super().__init__(keras.backend, state)

    names = {k: v for k, v in locals().items() if k in PUBLIC}
    for k, v in names.items():
        v.__module__, v.__qualname__ = module, k
    names["run"] = run
    return names
