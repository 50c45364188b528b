"""A minimal ``hvd.elastic`` so that elastic-style scripts run unchanged.

hvdd's daemon does not change a job's membership yet, so ``run`` synchronises
the state from rank 0 once and calls the function; a lost rank fails the job
with HorovodInternalError rather than triggering a reset. ``State`` objects
keep Horovod's commit/restore/sync contract so that the same script works when
membership changes are implemented.
"""

from __future__ import annotations

import copy
import functools
import logging
from typing import Any, Callable, List, Optional

import torch

from ..basics import rank
from .functions import broadcast_object, broadcast_optimizer_state, broadcast_parameters

__all__ = ["run", "State", "ObjectState", "TorchState"]

log = logging.getLogger(__name__)


class State:
    """State representation used for tracking in memory state across workers."""

    def __init__(self, bcast_object: Callable[..., Any] = broadcast_object, get_rank: Callable[[], int] = rank) -> None:
        self._bcast_object = bcast_object
        self._rank = get_rank
        self._host_messages: List[Any] = []
        self._last_updated_timestamp = 0
        self._reset_callbacks: List[Callable[[], None]] = []

    def register_reset_callbacks(self, callbacks: List[Callable[[], None]]) -> None:
        """Register callbacks that will be invoked following a reset event
        (worker added or removed)."""
        self._reset_callbacks.extend(callbacks)

    def on_reset(self) -> None:
        self.reset()
        for callback in self._reset_callbacks:
            callback()

    def on_hosts_updated(self, timestamp: int, update_res: Any) -> None:
        self._host_messages.append((timestamp, update_res))

    def commit(self) -> None:
        """Commits all modifications to state tracked by this object to host
        memory, and checks for host updates (none in hvdd yet)."""
        self.save()
        self.check_host_updates()

    def check_host_updates(self) -> None:
        """Membership changes are not supported by hvdd yet: nothing to do."""

    def save(self) -> None:
        raise NotImplementedError()

    def restore(self) -> None:
        raise NotImplementedError()

    def sync(self) -> None:
        raise NotImplementedError()

    def reset(self) -> None:
        pass


class ObjectState(State):
    """State for simple Python objects, synchronised with broadcast_object."""

    def __init__(
        self, bcast_object: Callable[..., Any] = broadcast_object, get_rank: Callable[[], int] = rank, **kwargs: Any
    ) -> None:
        self._saved_state = kwargs
        self._set_attrs()
        super().__init__(bcast_object=bcast_object, get_rank=get_rank)

    def save(self) -> None:
        new_state = {}
        for attr in self._saved_state.keys():
            new_state[attr] = getattr(self, attr)
        self._saved_state = new_state

    def restore(self) -> None:
        self._set_attrs()

    def sync(self) -> None:
        if self._saved_state:
            self._saved_state = self._bcast_object(self._saved_state, name="elastic.object_state")
            self._set_attrs()

    def _set_attrs(self) -> None:
        for attr, value in self._saved_state.items():
            setattr(self, attr, value)


class TorchState(ObjectState):
    """State representation of a PyTorch training process: the model, the
    optimizer and any picklable attributes (``epoch=1, batch=0``)."""

    def __init__(
        self, model: Optional[torch.nn.Module] = None, optimizer: Optional[torch.optim.Optimizer] = None, **kwargs: Any
    ) -> None:
        self.model = model
        self.optimizer = optimizer
        self._saved_model_state = copy.deepcopy(model.state_dict()) if model is not None else None
        self._saved_optimizer_state = copy.deepcopy(optimizer.state_dict()) if optimizer is not None else None
        super().__init__(**kwargs)

    def save(self) -> None:
        if self.model is not None:
            self._saved_model_state = copy.deepcopy(self.model.state_dict())
        if self.optimizer is not None:
            self._saved_optimizer_state = copy.deepcopy(self.optimizer.state_dict())
        super().save()

    def restore(self) -> None:
        if self.model is not None and self._saved_model_state is not None:
            self.model.load_state_dict(self._saved_model_state)
        if self.optimizer is not None and self._saved_optimizer_state is not None:
            self.optimizer.load_state_dict(self._saved_optimizer_state)
        super().restore()

    def sync(self) -> None:
        if self.model is not None:
            broadcast_parameters(self.model.state_dict(), root_rank=0)
        if self.optimizer is not None:
            broadcast_optimizer_state(self.optimizer, root_rank=0)
        super().sync()


def run(func: Callable[..., Any]) -> Callable[..., Any]:
    """Decorator for an elastic training function ``func(state, ...)``: the
    state is synchronised from rank 0, then ``func`` runs. hvdd does not
    re-form jobs yet, so errors propagate instead of triggering a reset."""

    @functools.wraps(func)
    def wrapper(state: State, *args: Any, **kwargs: Any) -> Any:
        state.sync()
        return func(state, *args, **kwargs)

    return wrapper
