"""Exception types raised by hvdd, under hvdd's names and under Horovod's."""

from __future__ import annotations

__all__ = [
    "HvddInternalError",
    "HorovodInternalError",
    "HvddUnimplementedError",
    "HostsUpdatedInterrupt",
    "HorovodVersionMismatchError",
]


class HvddInternalError(RuntimeError):
    """A collective failed: ranks disagreed about a tensor, a rank was lost, or
    the job shut down. The message is the daemon's and names the tensor and the
    ranks involved. Elastic training treats it as recoverable, as in Horovod.

    ``code`` is the protocol's error code (``hvdd.ipc.v1.Code``), 0 if unknown.
    """

    def __init__(self, message: str, code: int = 0) -> None:
        super().__init__(message)
        self.code = code


#: Horovod's name for :class:`HvddInternalError`, so unchanged scripts catch it.
HorovodInternalError = HvddInternalError


class HvddUnimplementedError(HvddInternalError, NotImplementedError):
    """The daemon does not implement this feature of Horovod (yet)."""


class HostsUpdatedInterrupt(RuntimeError):
    """Elastic training: the set of hosts changed. ``skip_sync`` says whether the
    state needs no re-synchronisation (only hosts were added)."""

    def __init__(self, skip_sync: bool) -> None:
        super().__init__()
        self.skip_sync = skip_sync


class HorovodVersionMismatchError(ImportError):
    """Kept for Horovod compatibility; hvdd has no compiled extension, so it is
    never raised."""

    def __init__(self, name: str, version: str, framework_version: str) -> None:
        super().__init__(f"Framework {name} installed with version {framework_version} but found version {version}.")
        self.name = name
        self.version = version
        self.framework_version = framework_version
