"""Horovod's ``horovod/torch/elastic/state.py``: ``TorchState`` and the
handlers that save, restore and sync what it tracks."""

from __future__ import annotations

import copy
from typing import Any, Dict, List, Optional, Tuple, Type

import torch

from ...basics import rank
from ...elastic import ObjectState
from ..functions import broadcast_object, broadcast_optimizer_state, broadcast_parameters
from .sampler import ElasticSampler

__all__ = [
    "TorchState",
    "StateHandler",
    "ModelStateHandler",
    "OptimizerStateHandler",
    "SamplerStateHandler",
    "get_handler_registry",
    "set_handler_registry",
]


class TorchState(ObjectState):
    """State representation of a PyTorch training process.

    Multiple models and optimizers are supported by providing them as
    kwargs. During initialization, `TorchState` will assign attributes
    for every keyword argument, and handle its state synchronization.

    Args:
        model: Optional PyTorch model.
        optimizer: Optional PyTorch optimizer.
        kwargs: Attributes sync, will be exposed as attributes of the object. If a handler exists
                for the attribute type, it will be used to sync the object, otherwise it will be
                handled an ordinary Python object.
    """

    def __init__(
        self, model: Optional[torch.nn.Module] = None, optimizer: Optional[torch.optim.Optimizer] = None, **kwargs: Any
    ) -> None:
        kwargs.update(dict(model=model, optimizer=optimizer))
        self._handlers, kwargs = _get_handlers(kwargs)
        for name, handler in self._handlers.items():
            setattr(self, name, handler.value)
        super().__init__(bcast_object=broadcast_object, get_rank=rank, **kwargs)

    def save(self) -> None:
        for handler in self._handlers.values():
            handler.save()
        super().save()

    def restore(self) -> None:
        for handler in self._handlers.values():
            handler.restore()
        super().restore()

    def sync(self) -> None:
        for handler in self._handlers.values():
            handler.sync()
        super().sync()

    def reset(self) -> None:
        """After every reset (``state.on_reset``, before the reset callbacks
        and before the sync if there is one), each handler re-reads what
        depends on the job's ranks: an :class:`ElasticSampler` repartitions
        the rest of its epoch over the new ``size()`` and ``rank()``. A host
        removal resets without a restore or a sync (``skip_sync``), so this
        is the only place where its sampler learns the new size."""
        for handler in self._handlers.values():
            reset = getattr(handler, "reset", None)  # a handler of Horovod's interface has none
            if reset is not None:
                reset()
        super().reset()

    def __setattr__(self, name: str, value: Any) -> None:
        # Assigning a new model, optimizer or sampler replaces the handler's
        # value and saves it.
        if hasattr(self, name) and name in self._handlers:
            self._handlers[name].set_value(value)
        super().__setattr__(name, value)


class StateHandler:
    """Saves, restores and syncs one kind of object for TorchState."""

    def __init__(self, value: Any) -> None:
        self.value = value

    def save(self) -> None:
        raise NotImplementedError()

    def restore(self) -> None:
        raise NotImplementedError()

    def sync(self) -> None:
        raise NotImplementedError()

    def reset(self) -> None:
        """Follows a reset of the job (rank and size may have changed);
        nothing to do for most objects."""

    def set_value(self, value: Any) -> None:
        self.value = value
        self.save()


class _StateDictHandler(StateHandler):
    """A handler for an object with ``state_dict`` / ``load_state_dict``:
    saves a deep copy of the state dict and loads it back."""

    def __init__(self, value: Any) -> None:
        super().__init__(value)
        self._saved_state = copy.deepcopy(self.value.state_dict())

    def save(self) -> None:
        self._saved_state = copy.deepcopy(self.value.state_dict())

    def restore(self) -> None:
        self.value.load_state_dict(self._saved_state)


class ModelStateHandler(_StateDictHandler):
    """A ``torch.nn.Module``: synced with ``broadcast_parameters`` of its
    state dict from rank 0."""

    def sync(self) -> None:
        broadcast_parameters(self.value.state_dict(), root_rank=0)


class OptimizerStateHandler(_StateDictHandler):
    """A ``torch.optim.Optimizer``: synced with ``broadcast_optimizer_state``
    from rank 0."""

    def sync(self) -> None:
        broadcast_optimizer_state(self.value, root_rank=0)


class SamplerStateHandler(_StateDictHandler):
    """An :class:`ElasticSampler`: rank 0's epoch and processed count are
    broadcast and loaded, which repartitions what is left of the epoch over
    the current ranks; a reset repartitions it too, synced or not."""

    def sync(self) -> None:
        self.value.load_state_dict(broadcast_object(self.value.state_dict()))

    def reset(self) -> None:
        self.value.reset()


_handler_registry: List[Tuple[Type[Any], Type[StateHandler]]] = [
    (torch.nn.Module, ModelStateHandler),
    (torch.optim.Optimizer, OptimizerStateHandler),
    (ElasticSampler, SamplerStateHandler),
]


def get_handler_registry() -> List[Tuple[Type[Any], Type[StateHandler]]]:
    """The (type, handler class) pairs TorchState tries, in order."""
    return _handler_registry


def set_handler_registry(registry: List[Tuple[Type[Any], Type[StateHandler]]]) -> None:
    """Replaces the (type, handler class) pairs TorchState tries."""
    global _handler_registry
    _handler_registry = registry


def _get_handler(v: Any) -> Optional[StateHandler]:
    for handler_type, handler_cls in _handler_registry:
        if isinstance(v, handler_type):
            return handler_cls(v)
    return None


def _get_handlers(kwargs: Dict[str, Any]) -> Tuple[Dict[str, StateHandler], Dict[str, Any]]:
    handlers = {}
    remainder = {}
    for k, v in kwargs.items():
        handler = _get_handler(v)
        if handler:
            handlers[k] = handler
        else:
            remainder[k] = v
    return handlers, remainder
