"""Horovod's common basics (``horovod/common/basics.py``) on top of the daemon:
init, shutdown, rank and size queries, capability flags, reduce ops and
process sets. Framework packages (``hvdd.torch``) re-export all of it.
"""

from __future__ import annotations

import atexit
import enum
import logging
import os
import threading
from typing import Any, Optional, Sequence, Union

from ._client import Client
from .exceptions import HvddInternalError

PUBLIC = (
    "init",
    "shutdown",
    "is_initialized",
    "size",
    "rank",
    "local_size",
    "local_rank",
    "cross_size",
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
    "start_timeline",
    "stop_timeline",
    "ReduceOp",
    "Average",
    "Sum",
    "Adasum",
    "Min",
    "Max",
    "Product",
    "ProcessSet",
    "global_process_set",
    "add_process_set",
    "remove_process_set",
)
"""The names hvdd and hvdd.torch re-export: Horovod's common basics."""

__all__ = [*PUBLIC, "client", "daemon_backends"]

log = logging.getLogger(__name__)

NOT_INITIALIZED = "Horovod has not been initialized; use hvd.init()."
_PROCESS_SETS_UNSUPPORTED = (
    "hvdd supports only the global process set so far; process sets other than "
    "hvd.global_process_set are not implemented yet"
)


class ReduceOp(enum.IntEnum):
    """Reduction operations, numbered as in Horovod (and the wire protocol)."""

    AVERAGE = 0
    SUM = 1
    ADASUM = 2
    MIN = 3
    MAX = 4
    PRODUCT = 5


Average = ReduceOp.AVERAGE
Sum = ReduceOp.SUM
Adasum = ReduceOp.ADASUM
Min = ReduceOp.MIN
Max = ReduceOp.MAX
Product = ReduceOp.PRODUCT

_state_lock = threading.RLock()
_client: Optional[Client] = None
_atexit_registered = False


def client() -> Client:
    """The initialised connection to the daemon (raises before ``init()``)."""
    c = _client
    if c is None:
        raise ValueError(NOT_INITIALIZED)
    return c


class ProcessSet:
    """A subset of the job's ranks that collectives can run on, as in Horovod.

    hvdd implements only the global set (``global_process_set``) so far; other
    sets can be described but not registered.
    """

    def __init__(self, ranks_or_comm: Union[Sequence[int], Any]) -> None:
        self.process_set_id: Optional[int] = None
        self.mpi_comm = None
        if isinstance(ranks_or_comm, (list, tuple, range)):
            self.ranks: Optional[list[int]] = sorted(int(r) for r in ranks_or_comm)
        elif ranks_or_comm is None:
            self.ranks = None
        else:
            self.ranks = None
            self.mpi_comm = ranks_or_comm

    def _invalidate(self) -> None:
        self.process_set_id = None

    def size(self) -> Optional[int]:
        """Number of ranks in the set (None if not initialised)."""
        if self.process_set_id == 0:
            return size()
        if self.process_set_id is None:
            return None
        return len(self.ranks or [])

    def rank(self) -> Optional[int]:
        """This process's rank within the set (None if not initialised)."""
        if self.process_set_id == 0:
            return rank()
        if self.process_set_id is None or self.ranks is None:
            return None
        r = rank()
        return self.ranks.index(r) if r in self.ranks else -1

    def included(self) -> Optional[bool]:
        """Whether this process belongs to the set (None if not initialised)."""
        if self.process_set_id == 0:
            return True
        if self.process_set_id is None or self.ranks is None:
            return None
        return rank() in self.ranks

    def __str__(self) -> str:
        return f"ProcessSet(process_set_id={self.process_set_id}, ranks={self.ranks}, mpi_comm={self.mpi_comm})"

    __repr__ = __str__


class _GlobalProcessSet(ProcessSet):
    def __init__(self) -> None:
        super().__init__(None)
        self.process_set_id = 0

    @property  # type: ignore[override]
    def ranks(self) -> Optional[list[int]]:  # type: ignore[override]
        return list(range(size())) if _client is not None else None

    @ranks.setter
    def ranks(self, value: Any) -> None:
        pass


#: The set of every rank (id 0); the default ``process_set`` of every collective.
global_process_set: ProcessSet = _GlobalProcessSet()


def process_set_id(process_set: ProcessSet) -> int:
    """The wire id of a process set; only the global one is supported."""
    if process_set is global_process_set or process_set.process_set_id == 0:
        return 0
    raise NotImplementedError(_PROCESS_SETS_UNSUPPORTED)


def add_process_set(process_set: Union[ProcessSet, Sequence[int]]) -> ProcessSet:
    """Horovod's dynamic process sets; not implemented by hvdd yet."""
    raise NotImplementedError(_PROCESS_SETS_UNSUPPORTED)


def remove_process_set(process_set: ProcessSet) -> bool:
    """Horovod's dynamic process sets; not implemented by hvdd yet."""
    raise NotImplementedError(_PROCESS_SETS_UNSUPPORTED)


def init(comm: Optional[Any] = None, process_sets: Optional[Any] = None) -> None:
    """Initialises hvdd: connects to the node's daemon (``$HVDD_SOCKET``) and
    blocks until every rank of the job has arrived. Idempotent; ``shutdown()``
    runs at exit; ``init()`` after ``shutdown()`` joins a new job.

    Args:
        comm: Horovod's sub-world selection (list of ranks or mpi4py comm).
            hvdd supports only the default, None (all ranks).
        process_sets: Horovod's static process sets; hvdd supports only None
            or an empty list (the global set alone).
    """
    global _client, _atexit_registered
    if comm is not None:
        raise NotImplementedError(
            "hvdd: init(comm=...) is not supported; every process the daemon's job holds takes part "
            "(choose them with `hvdd run -np N` or the daemon's --slots)"
        )
    if process_sets == "dynamic":
        raise NotImplementedError(_PROCESS_SETS_UNSUPPORTED)
    if process_sets:
        sets = list(process_sets)
        for i, ps in enumerate(sets):
            for j in range(i):
                if sets[j].ranks is not None and sets[j].ranks == ps.ranks:
                    raise ValueError(
                        f"Horovod could not be initialized: process_sets entry number {i} is a duplicate "
                        f"of entry number {j}"
                    )
        raise NotImplementedError(_PROCESS_SETS_UNSUPPORTED)
    with _state_lock:
        if _client is not None:
            return
        c = Client()
        try:
            c.connect()
        except HvddInternalError as e:
            raise ValueError(
                f"Horovod initialization failed: {e}"
            ) from e
        _client = c
        if not _atexit_registered:
            atexit.register(shutdown)
            _atexit_registered = True


def shutdown() -> None:
    """Says goodbye to the daemon and closes the connection. Collectives still in
    flight fail with HorovodInternalError. A later ``init()`` starts afresh."""
    global _client
    with _state_lock:
        c = _client
        _client = None
    if c is not None:
        c.close()


def is_initialized() -> bool:
    """Whether ``init()`` has been called (and not undone by ``shutdown()``)."""
    return _client is not None


def _welcome() -> Any:
    c = _client
    if c is None:
        raise ValueError(NOT_INITIALIZED)
    return c.welcome


def size() -> int:
    """The number of processes in the job."""
    return int(_welcome().size)


def rank() -> int:
    """This process's global rank, 0 .. size()-1."""
    return int(_welcome().rank)


def local_size() -> int:
    """The number of processes on this node."""
    return int(_welcome().local_size)


def local_rank() -> int:
    """This process's index among the processes on its node."""
    return int(_welcome().local_rank)


def cross_size() -> int:
    """The number of nodes that have a process with this local rank."""
    return int(_welcome().cross_size)


def cross_rank() -> int:
    """This node's index among the nodes that have a process with this local rank."""
    return int(_welcome().cross_rank)


def is_homogeneous() -> bool:
    """Whether every node runs the same number of processes."""
    return bool(_welcome().is_homogeneous)


def daemon_backends() -> list[str]:
    """The engines the daemon reports (Welcome.backends), e.g. ["tcp"]."""
    return list(_welcome().backends)


def _has_backend(name: str) -> bool:
    c = _client
    return c is not None and name in c.welcome.backends


def mpi_threads_supported() -> bool:
    """Whether MPI runs with MPI_THREAD_MULTIPLE; raises as Horovod does when MPI
    is not in use (hvdd's daemon does not use MPI unless it reports it)."""
    _welcome()
    if not _has_backend("mpi"):
        raise ValueError("Horovod MPI is not enabled; mpi_threads_supported() is not available.")
    return True


def mpi_enabled() -> bool:
    """Whether the daemon runs its collectives over MPI."""
    return _has_backend("mpi")


def mpi_built() -> bool:
    """Whether the daemon was built with MPI."""
    return _has_backend("mpi")


def gloo_enabled() -> bool:
    """Whether the daemon runs its collectives over Gloo."""
    return _has_backend("gloo")


def gloo_built() -> bool:
    """Whether the daemon was built with Gloo."""
    return _has_backend("gloo")


def nccl_built() -> int:
    """The NCCL version the daemon uses, 0 when none (CPU-only daemon)."""
    return 1 if _has_backend("nccl") else 0


def ddl_built() -> bool:
    """IBM DDL support: never."""
    return False


def ccl_built() -> bool:
    """oneCCL support: never."""
    return False


def cuda_built() -> bool:
    """Whether the daemon handles CUDA tensors."""
    return _has_backend("nccl") or _has_backend("cuda")


def rocm_built() -> bool:
    """Whether the daemon handles ROCm tensors."""
    return _has_backend("rocm")


def start_timeline(file_path: str, mark_cycles: bool = False) -> None:
    """Horovod's dynamic timeline; hvdd's daemon does not write one yet."""
    client()
    raise ValueError("Set HOROVOD_TIMELINE=DYNAMIC to enable dynamic timeline usage.")


def stop_timeline() -> None:
    """Horovod's dynamic timeline; hvdd's daemon does not write one yet."""
    client()
    raise ValueError("Set HOROVOD_TIMELINE=DYNAMIC to enable dynamic timeline usage.")
