"""Host-update notifications (Horovod's ``WorkerNotificationManager``): a leaf
of the client, so that the reader thread (``_reader``) can deliver what the
daemon sends without importing ``elastic``, which sits above it.
``hvdd.elastic`` re-exports both names."""

from __future__ import annotations

import enum
import threading
from typing import Any

__all__ = ["HostUpdateResult", "WorkerNotificationManager", "notification_manager"]


class HostUpdateResult(enum.IntFlag):
    """What changed in the job's hosts (Horovod's
    ``horovod.runner.elastic.worker.HostUpdateResult``)."""

    no_update = 0
    removed = 1
    added = 2
    mixed = removed | added


class WorkerNotificationManager:
    """Passes host-update notifications to the states that
    :func:`run_fn` is running (Horovod's ``WorkerNotificationManager``). In
    Horovod the driver posts them to every worker's HTTP service; in hvdd the
    daemons send them to global rank 0 with the replies to its collectives
    when workers wait to join the job, and ``State.check_host_updates``
    broadcasts rank 0's view at the next commit."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._listeners: set = set()

    def init(self) -> None:
        """Starts receiving notifications; nothing to start yet."""

    def register_listener(self, listener: Any) -> None:
        with self._lock:
            self._listeners.add(listener)

    def remove_listener(self, listener: Any) -> None:
        with self._lock:
            self._listeners.discard(listener)

    def handle_hosts_updated(self, timestamp: int, update_res: HostUpdateResult) -> None:
        """Delivers a notification (the launcher's time of the change, and
        what changed) to every registered state."""
        with self._lock:
            listeners = list(self._listeners)
        for listener in listeners:
            listener.on_hosts_updated(timestamp, update_res)


notification_manager = WorkerNotificationManager()
