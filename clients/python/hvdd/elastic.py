"""Elastic training, framework-neutral (Horovod's ``horovod/common/elastic.py``).

The framework packages build on this: ``hvdd.torch.elastic`` (``TorchState``,
``ElasticSampler``), ``hvdd.tensorflow.elastic`` (``TensorFlowKerasState``,
``TensorFlowState``) and the Keras packages' ``elastic``. Their ``run`` is
:func:`run_fn` with :func:`reset`.

What it does: :func:`run_fn` wraps a training function ``func(state, ...)``.
It synchronises ``state`` from rank 0 and calls ``func``; when a collective
fails (``HorovodInternalError``: a rank was lost) it restores the last
committed state, re-forms the job (:func:`reset`: ``shutdown()`` then
``init()``, which reads the new rank and size from the daemon) and starts
again; when the hosts changed (``HostsUpdatedInterrupt``, raised by
``State.commit``) it re-forms without restoring.

A job started as elastic (``HOROVOD_ELASTIC=1``, what ``hvdd run --min-np``
sets) re-forms on one node or across nodes: the daemons form its next epoch
from the ranks that reset. Workers started while the job runs (``hvdd run``
with a host discovery script, or a freed slot refilled) wait in ``init()``;
the daemons then send global rank 0 a host-update notification
(:data:`notification_manager`), and ``State.check_host_updates`` turns it
into a ``HostsUpdatedInterrupt`` on every rank at the same commit, as
Horovod does: every rank resets, and the next epoch takes the new workers
in, which receive rank 0's state in ``state.sync()``.

A job not started as elastic re-forms too, as Horovod's does: a
``HorovodInternalError`` raised on every rank (by the user's code, or a
collective that failed everywhere) restores the last commit, re-initialises
the same job and goes on. One that says a rank or the daemon was lost
(``CODE_ABORTED``, ``CODE_SHUT_DOWN``) propagates there: the lost rank is not
coming back, and ``init()`` would wait for it until its start timeout.
"""

from __future__ import annotations

import functools
import logging
import queue
from typing import Any, Callable, List, Optional

import numpy as np

from . import basics as _basics
from . import ops as _ops
from ._env import elastic_requested
from ._notifications import HostUpdateResult, WorkerNotificationManager, notification_manager
from ._proto import hvdd_pb2 as _pb
from .exceptions import HorovodInternalError, HostsUpdatedInterrupt

__all__ = [
    "State",
    "ObjectState",
    "run_fn",
    "reset",
    "HostUpdateResult",
    "WorkerNotificationManager",
    "notification_manager",
]

log = logging.getLogger(__name__)


def _broadcast_object(obj: Any) -> Any:
    return _ops.broadcast_object(obj, 0)


class State:
    """State representation used for tracking in memory state across workers.

    Args:
        bcast_object: Function used to broadcast a variable from rank 0 to the
            other workers (default: hvdd's ``broadcast_object``).
        get_rank: Function that returns the current rank of this worker
            (default: ``hvdd.rank``).
    """

    def __init__(
        self, bcast_object: Optional[Callable[[Any], Any]] = None, get_rank: Optional[Callable[[], int]] = None
    ) -> None:
        self._bcast_object = bcast_object or _broadcast_object
        self._rank = get_rank or _basics.rank
        self._host_messages: queue.Queue = queue.Queue()
        self._last_updated_timestamp = 0
        self._reset_callbacks: List[Callable[[], None]] = []

    def register_reset_callbacks(self, callbacks: List[Callable[[], None]]) -> None:
        """Register callbacks that will be invoked following a reset event
        (worker added or removed).

        For example, a common use of a reset callback would be to update the
        learning rate scale with the new number of workers.

        Args:
            callbacks: list of functions to execute.
        """
        self._reset_callbacks.extend(callbacks)

    def on_reset(self) -> None:
        self._host_messages = queue.Queue()
        self.reset()
        for callback in self._reset_callbacks:
            callback()

    def on_hosts_updated(self, timestamp: int, update_res: HostUpdateResult) -> None:
        self._host_messages.put((timestamp, update_res))

    def commit(self) -> None:
        """Commits all modifications to state tracked by this object to host
        memory.

        This call will also check for any changes to known hosts, and raise a
        `HostsUpdatedInterrupt` if any were detected.

        Because commits are a heavy operation involving data copy (potentially
        from GPU to host), it is recommended to consider committing less
        frequently than once per batch. This allows users to tradeoff between
        per-batch execution time and lost training steps in the event of a
        worker failure.
        """
        self.save()
        self.check_host_updates()

    def check_host_updates(self) -> None:
        """Checks that a notification has been sent indicating that hosts can
        be added or will be removed.

        Raises a `HostsUpdatedInterrupt` if such a notification has been
        received. Rank 0's view is broadcast, so every rank raises at the same
        commit (a collective: every rank calls it).
        """
        # The newest notification since the last check, and what changed.
        last_updated_timestamp = prev_timestamp = self._last_updated_timestamp
        all_update = HostUpdateResult.no_update
        while not self._host_messages.empty():
            timestamp, update = self._host_messages.get()
            if timestamp > last_updated_timestamp:
                last_updated_timestamp = timestamp
                all_update |= update

        # Rank 0 decides for every rank, so that all raise at the same time.
        prev_timestamp, self._last_updated_timestamp, all_update = self._bcast_object(
            (prev_timestamp, last_updated_timestamp, all_update)
        )

        if self._last_updated_timestamp > prev_timestamp:
            # Only removals: the survivors hold the same state, no sync needed.
            raise HostsUpdatedInterrupt(all_update == HostUpdateResult.removed)

    def save(self) -> None:
        """Saves state to host memory."""
        raise NotImplementedError()

    def restore(self) -> None:
        """Restores the last committed state, undoing any uncommitted
        modifications."""
        raise NotImplementedError()

    def sync(self) -> None:
        """Synchronize state across workers."""
        raise NotImplementedError()

    def reset(self) -> None:
        """Reset objects and variables following a reset event (before
        synchronization)."""


class ObjectState(State):
    """State for simple Python objects.

    Every object is specified as a keyword argument, and will be assigned as an
    attribute.

    Args:
        bcast_object: Function used to sync the state dictionary from rank 0
            (default: hvdd's ``broadcast_object``).
        get_rank: Function that returns this process's rank (default:
            ``hvdd.rank``).
        kwargs: Properties to sync, will be exposed as attributes of the object.
    """

    def __init__(
        self,
        bcast_object: Optional[Callable[[Any], Any]] = None,
        get_rank: Optional[Callable[[], int]] = None,
        **kwargs: Any,
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
            self._saved_state = self._bcast_object(self._saved_state)
            self._set_attrs()

    def _set_attrs(self) -> None:
        for attr, value in self._saved_state.items():
            setattr(self, attr, value)


def reset() -> None:
    """Re-forms the job after a failure or a host update (Horovod's
    ``_reset``): ``shutdown()`` then ``init()``; rank, size and the rest are
    then the new job's, from the daemon's Welcome. The shutdown tells the
    daemon the rank re-initialises at once: after a host update, the first
    rank's reset ends the epoch for all, and the next one takes in the
    workers waiting to join."""
    _basics.shutdown(_elastic_reset=True)
    _basics.init()


def _all_skip_sync(skip_sync: bool) -> bool:
    """Whether every rank skips the state sync: only if all of them would.
    A worker that joined at this reset syncs, so the survivors of a removal
    must sync with it (Horovod's elastic deadlock, horovod#3494, came from
    deciding this per rank)."""
    flag = np.array([1 if skip_sync else 0], dtype=np.int32)
    return bool(_ops.allreduce(flag, op=_basics.Min, name="hvdd.elastic.skip_sync")[0])


def _recoverable(e: HorovodInternalError) -> bool:
    """Whether a reset can re-form the job after ``e``. An elastic job always
    can: its daemons form the next epoch from the ranks that reset. A static
    one can when every rank is still there to re-initialise, that is unless
    the daemon says a rank or node was lost or it shut down."""
    if elastic_requested():
        return True
    return getattr(e, "code", 0) not in (_pb.CODE_ABORTED, _pb.CODE_SHUT_DOWN)


def run_fn(func: Callable[..., Any], reset: Callable[[], None]) -> Callable[..., Any]:
    """Wraps ``func(state, ...)`` in Horovod's elastic retry loop, with
    ``reset`` re-forming the job (see the module doc).

    A ``HorovodInternalError`` restores the last committed state and syncs it
    again after the reset; a ``HostsUpdatedInterrupt`` keeps the state and
    skips the sync when its ``skip_sync`` says the survivors already agree.
    Either way ``state.on_reset()`` then runs ``state.reset()`` (a
    ``TorchState``'s ``ElasticSampler`` repartitions its epoch's rest over the
    new ranks there) and the reset callbacks. In
    a job that is not elastic (``HOROVOD_ELASTIC`` unset) the same job
    re-forms, unless the error says it lost a rank (:func:`_recoverable`).
    """

    @functools.wraps(func)
    def wrapper(state: State, *args: Any, **kwargs: Any) -> Any:
        notification_manager.init()
        notification_manager.register_listener(state)
        skip_sync = False
        try:
            while True:
                try:
                    if not _all_skip_sync(skip_sync):
                        state.sync()
                    return func(state, *args, **kwargs)
                except HorovodInternalError as e:
                    if not _recoverable(e):
                        raise
                    log.warning("hvdd elastic: a collective failed; restoring the last commit and re-forming the job")
                    state.restore()
                    skip_sync = False
                except HostsUpdatedInterrupt as e:
                    log.info("hvdd elastic: hosts updated; re-forming the job")
                    skip_sync = e.skip_sync

                reset()
                state.on_reset()
        finally:
            notification_manager.remove_listener(state)

    return wrapper
