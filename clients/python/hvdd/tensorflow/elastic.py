"""``hvdd.tensorflow.elastic``: Horovod's ``horovod.tensorflow.elastic``.

``run`` is :func:`hvdd.elastic.run_fn` with hvdd's reset, and also treats the
``tf.errors.UnknownError`` that a failed collective becomes inside a graph
(``tf.function``, ``model.fit``) as the ``HorovodInternalError`` it wraps.
``TensorFlowState`` tracks a list of variables, ``TensorFlowKerasState`` a
Keras model and its optimizer; both are :class:`hvdd.elastic.ObjectState`,
so other keyword arguments are plain synced values. Eagerly (TF2) the saved
state is a copy of the variables' values; in a TF1 graph they are read and
loaded through the session. Importing this does not import torch.

``TensorFlowKerasState`` lives here, where Horovod has it; the Keras layer
(``hvdd._keras.elastic``) builds its ``KerasState`` on it.
"""

from __future__ import annotations

from typing import Any, Callable, List, Optional

import tensorflow as tf

from ..basics import rank
from ..elastic import ObjectState, State, reset, run_fn
from ..exceptions import HorovodInternalError
from .functions import broadcast_object, broadcast_variables
from ._session import _session
from .mpi_ops import _executing_eagerly

__all__ = ["run", "TensorFlowKerasState", "TensorFlowState", "State", "ObjectState"]


def run(func: Callable[..., Any]) -> Callable[..., Any]:
    """Decorator used to run the elastic training process ``func(state, ...)``
    (see ``hvdd.torch.elastic.run`` and :func:`hvdd.elastic.run_fn`): the
    state is synced from rank 0 first; after a failed collective or a host
    update the job is re-formed and ``func`` runs again from the last commit.
    Collectives must not be called before ``func`` is entered.
    """

    def wrapper(state: State, *args: Any, **kwargs: Any) -> Any:
        try:
            return func(state, *args, **kwargs)
        except tf.errors.UnknownError as e:
            # A graph wraps the collective's HvddInternalError (the name is in
            # the message); anything else is not ours to retry.
            if "HvddInternalError" in (e.message or ""):
                raise HorovodInternalError(e.message) from e
            raise

    return run_fn(wrapper, reset)


def _global_variables() -> List[Any]:
    return tf.compat.v1.global_variables()


def _default_session() -> Any:
    return None if _executing_eagerly() else tf.compat.v1.get_default_session()


def _optimizer_variables(optimizer: Any) -> List[Any]:
    # Keras 3 has a property, tf_keras and TF2 optimizers a method.
    v = getattr(optimizer, "variables", None) if optimizer is not None else None
    return list((v() if callable(v) else v) or [])


def _snapshot(variables: List[Any], session: Any) -> List[Any]:
    """The variables' current values: copies eagerly, numpy arrays read
    through ``session`` in a graph."""
    if _executing_eagerly():
        return [tf.identity(v) for v in variables]
    return session.run(list(variables)) if variables else []


def _load(variables: List[Any], values: List[Any], session: Any) -> None:
    if _executing_eagerly():
        for var, value in zip(variables, values):
            var.assign(value)
    else:
        for var, value in zip(variables, values):
            var.load(value, session)


def _model_built(model: Any) -> bool:
    return model.built if hasattr(model, "build") else True


class _VariablesState(ObjectState):
    """What both states share: ``save`` and ``restore`` keep a copy of the
    variables' values (``_save_model`` / ``_load_model``); ``sync`` broadcasts
    them from rank 0 (``_broadcast``) and keeps what arrived."""

    def save(self) -> None:
        self._save_model()
        super().save()

    def restore(self) -> None:
        self._load_model()
        super().restore()

    def sync(self) -> None:
        self._broadcast()
        self._save_model()
        super().sync()

    def _broadcast(self) -> None:
        raise NotImplementedError()

    def _save_model(self) -> None:
        raise NotImplementedError()

    def _load_model(self) -> None:
        raise NotImplementedError()


class TensorFlowState(_VariablesState):
    """State representation of a list of TensorFlow variables.

    Supports both TensorFlow v1 and v2. For TensorFlow v2, can only be used when eager execution is enabled.

    Args:
        variables: List of `tf.Variable` objects to track (default: `tf.global_variables()`).
        session: For TensorFlow v1, session used to materialize variables (default: `ops.get_default_session()`).
        kwargs: Additional properties to sync, will be exposed as attributes of the object.
    """

    def __init__(self, variables: Optional[List[Any]] = None, session: Any = None, **kwargs: Any) -> None:
        self.variables = list(variables or _global_variables())
        self.session = session or _default_session()
        # In a graph the broadcast op is built once; eagerly sync broadcasts.
        self._bcast_op = None if _executing_eagerly() else broadcast_variables(self.variables, root_rank=0)
        self._save_model()
        super().__init__(bcast_object=broadcast_object, get_rank=rank, **kwargs)

    def _broadcast(self) -> None:
        if self._bcast_op is None:
            broadcast_variables(self.variables, root_rank=0)
        elif self.session is not None:
            self.session.run(self._bcast_op)

    def _save_model(self) -> None:
        self._values = _snapshot(self.variables, self.session)

    def _load_model(self) -> None:
        _load(self.variables, self._values, self.session)


class TensorFlowKerasState(_VariablesState):
    """State representation of a TensorFlow Keras model and optimizer.

    Supports TensorFlow 2 models and optimizers, as well as `keras` and `tf.keras`.

    Args:
        model: TensorFlow Keras model.
        optimizer: Optional optimizer, can be compiled into model instead.
        backend: For TensorFlow v1, backend used by Keras for obtaining the session.
        kwargs: Additional properties to sync, will be exposed as attributes of the object.
    """

    def __init__(self, model: Any, optimizer: Any = None, backend: Any = None, **kwargs: Any) -> None:
        self.model = model
        if not _model_built(model):
            raise ValueError("Model must be built first. Run `model.build(input_shape)`.")

        self.optimizer = optimizer or getattr(model, "optimizer", None)
        self.backend = backend
        self._bcast_op = None
        if backend is not None and not _executing_eagerly():
            # TF1: one broadcast op, built once and run in the Keras session.
            self._bcast_op = broadcast_variables(_global_variables(), root_rank=0)
        self._save_model()
        super().__init__(bcast_object=broadcast_object, get_rank=rank, **kwargs)

    def _broadcast(self) -> None:
        if self._bcast_op is not None:
            self._session().run(self._bcast_op)
        elif _executing_eagerly():
            # The model's and the optimizer's variables, in one broadcast.
            broadcast_variables(self._model_variables() + _optimizer_variables(self.optimizer), root_rank=0)
        else:
            self._session().run(broadcast_variables(_global_variables(), root_rank=0))

    def _session(self) -> Any:
        if self.backend is None:
            return tf.compat.v1.get_default_session() or tf.compat.v1.keras.backend.get_session()
        return _session(self.backend)

    def _model_variables(self) -> List[Any]:
        return list(self.model.variables)

    def _save_model(self) -> None:
        session = None if _executing_eagerly() else self._session()
        self._saved_model_state = _snapshot(self._model_variables(), session)
        self._saved_optimizer_state = _snapshot(_optimizer_variables(self.optimizer), session)

    def _load_model(self) -> None:
        session = None if _executing_eagerly() else self._session()
        _load(self._model_variables(), self._saved_model_state, session)
        _load(_optimizer_variables(self.optimizer), self._saved_optimizer_state, session)
