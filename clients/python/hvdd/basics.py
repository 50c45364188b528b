"""Horovod's common basics (``horovod/common/basics.py``) on top of the daemon:
init, shutdown, rank and size queries, capability flags, reduce ops and
process sets. ``hvdd`` and the framework packages re-export its ``__all__``.
"""

from __future__ import annotations

import atexit
import enum
import logging
import os
import threading
from typing import Any, Optional, Sequence, Union

from . import _env, _launcher
from ._client import Client
from ._proto import hvdd_pb2 as _pb
from .exceptions import HvddInternalError

__all__ = [
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
]
"""Horovod's common basics: what ``hvdd`` and every framework package
re-export with ``from hvdd.basics import *``. ``client`` and
``daemon_backends`` are hvdd's own, for its framework modules, and stay out."""

log = logging.getLogger(__name__)

NOT_INITIALIZED = "Horovod has not been initialized; use hvd.init()."
_DYNAMIC_DISABLED = (
    'Horovod: dynamic process sets are not enabled: call hvd.init(process_sets="dynamic") '
    "or set HOROVOD_DYNAMIC_PROCESS_SETS=1"
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
_dynamic = False  # init(process_sets="dynamic")
_registered: list["ProcessSet"] = []  # sets this process registered, invalidated at shutdown
_atexit_registered = False


def client() -> Client:
    """The initialised connection to the daemon (raises before ``init()``)."""
    c = _client
    if c is None:
        raise ValueError(NOT_INITIALIZED)
    return c


class ProcessSet:
    """A subset of the job's ranks that collectives can run on, as in Horovod:
    pass the sets to ``init(process_sets=[...])``, or with dynamic process
    sets register them later with ``add_process_set``; then give
    ``process_set=`` to collectives, which only the set's members call.
    Broadcast roots stay global ranks. On one node or across nodes.
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
    """The wire id of a registered process set."""
    if process_set is global_process_set:
        return 0
    pid = process_set.process_set_id
    if pid is None:
        raise ValueError("Process set provided does not exist, or has not been registered.")
    return pid


def _register(c: Client, ps: ProcessSet, local: bool = False) -> None:
    """Registers ps with the daemon (a collective over every rank; with
    ``local``, over ps's members only, which alone call it)."""
    if ps.ranks is None:
        raise NotImplementedError("hvdd: process sets from an MPI communicator are not supported; give the ranks")
    m = _pb.ClientMessage()
    m.add_process_set.ranks.extend(ps.ranks)
    m.add_process_set.local = local
    try:
        done = c.call(m)
    except HvddInternalError as e:
        raise ValueError(str(e)) from e
    ps.process_set_id = done.process_set_id
    _registered.append(ps)


def _dynamic_enabled() -> bool:
    return _dynamic or _env.dynamic_process_sets()


def add_process_set(process_set: Union[ProcessSet, Sequence[int]]) -> ProcessSet:
    """Registers a process set while the job runs (dynamic process sets). A
    collective: every rank must call it with the same set, in the same order
    of calls. Returns the registered ProcessSet."""
    c = client()
    if not _dynamic_enabled():
        raise ValueError(_DYNAMIC_DISABLED)
    ps = process_set if isinstance(process_set, ProcessSet) else ProcessSet(process_set)
    if ps.process_set_id is not None:
        raise ValueError(f"Attempted to add a duplicate process set: {ps} is already registered")
    _register(c, ps)
    return ps


def remove_process_set(process_set: ProcessSet) -> bool:
    """Removes a registered process set (dynamic process sets; collective like
    ``add_process_set``). Returns False for the global set or one that is
    not registered."""
    c = client()
    if not _dynamic_enabled():
        raise ValueError(_DYNAMIC_DISABLED)
    pid = process_set.process_set_id
    if pid is None or pid == 0:
        return False
    m = _pb.ClientMessage()
    m.remove_process_set.process_set = pid
    try:
        c.call(m)
    except HvddInternalError as e:
        raise ValueError(str(e)) from e
    process_set._invalidate()
    return True


# Called after every successful init(), under the state lock: what a new
# job (or elastic epoch) starts afresh (ops.reset_names).
_on_init: list = []


def init(comm: Optional[Any] = None, process_sets: Optional[Any] = None) -> None:
    """Initialises hvdd: connects to the node's daemon (``$HVDD_SOCKET``) and
    blocks until every rank of the job has arrived. Idempotent; ``shutdown()``
    runs at exit; ``init()`` after ``shutdown()`` joins a new job.

    Under mpirun, mpiexec or srun without ``hvdd run``, the rank, size and
    local rank are the launcher's, and with no daemon on the node's default
    socket the job's processes on each host start one for the job
    (``hvdd._launcher``).

    Args:
        comm: Horovod's sub-world selection (list of ranks or mpi4py comm).
            hvdd supports only the default, None (all ranks).
        process_sets: Horovod's static process sets (a list of
            ``ProcessSet``, registered here on every rank, in the same order),
            or ``"dynamic"`` to allow ``add_process_set`` and
            ``remove_process_set`` later.
    """
    global _client, _atexit_registered, _dynamic
    if comm is not None:
        raise NotImplementedError(
            "hvdd: init(comm=...) is not supported; every process the daemon's job holds takes part "
            "(choose them with `hvdd run -np N` or the daemon's --slots)"
        )
    sets: list[ProcessSet] = []
    if process_sets == "dynamic":
        _dynamic = True
    elif process_sets:
        sets = list(process_sets)
        for i, ps in enumerate(sets):
            for j in range(i):
                if sets[j].ranks is not None and sets[j].ranks == ps.ranks:
                    raise ValueError(
                        f"Horovod could not be initialized: process_sets entry number {i} is a duplicate "
                        f"of entry number {j}"
                    )
    with _state_lock:
        if _client is not None:
            return
        where = _launcher.detect()
        sock = None
        if where is not None and not _env.socket_override():
            # Started by mpirun or srun without hvdd run: join the node's
            # daemon, or the one the job's processes here start for it.
            sock = _launcher.ensure_daemon(
                where, _env.default_socket_path(), _hvdd_binary(), _env.default_start_timeout()
            )
        c = Client(
            socket_path=sock,
            local_rank=None if where is None else where.local_rank,
            job=None if where is None or _env.job() else f"{where.launcher}:{where.job}",
            local_size=None if where is None else where.local_size,
        )
        try:
            c.connect()
        except HvddInternalError as e:
            hint = ""
            if sock is not None and sock != _env.default_socket_path():
                hint = f" (the log of the job's daemon on this host: {_launcher.job_files(where, os.path.dirname(sock))[2]})"
            raise ValueError(f"Horovod initialization failed: {e}{hint}") from e
        if where is not None:
            try:
                _launcher.check_welcome(where, int(c.welcome.rank), int(c.welcome.size), c.socket_path)
            except _launcher.LauncherError:
                c.close()
                raise
        try:
            for ps in sets:
                _register(c, ps)
        except ValueError as e:
            c.close()
            raise ValueError(f"Horovod could not be initialized: {e}") from e
        except BaseException:  # e.g. NotImplementedError for an MPI communicator's set
            c.close()
            raise
        _client = c
        for hook in _on_init:
            hook()
        if not _atexit_registered:
            atexit.register(_shutdown_at_exit)
            _atexit_registered = True


def _hvdd_binary() -> Optional[str]:
    """The hvdd binary a job started by mpirun or srun runs its daemon with:
    $HVDD_BIN, else hvdd on PATH, else the bin/hvdd of the source tree this
    package was installed from (pip install -e)."""
    if _env.hvdd_bin():
        return _env.hvdd_bin()
    found = _env.hvdd_on_path()
    if found:
        return found
    tree = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "bin", "hvdd")
    return os.path.normpath(tree) if os.access(tree, os.X_OK) else None


def shutdown(_elastic_reset: bool = False, _exiting: bool = False) -> None:
    """Says goodbye to the daemon and closes the connection. Collectives still in
    flight fail with HorovodInternalError. A later ``init()`` starts afresh.
    (``hvdd.elastic.reset`` passes ``_elastic_reset``: the rank re-initialises
    at once into its elastic job's next epoch.)"""
    global _client, _dynamic
    with _state_lock:
        c = _client
        _client = None
        _dynamic = False
        for ps in _registered:
            ps._invalidate()
        _registered.clear()
    if c is not None:
        c.close(_elastic_reset, _exiting)


def _shutdown_at_exit() -> None:
    """``shutdown()`` as the process exits (atexit). The daemon is told that
    the process exits: in an elastic job that still runs, its other ranks
    reset and go on without this one (Horovod's workers see a worker that
    leaves, by an exception or not, as lost), and ``hvdd run`` judges the
    exit by its status. (A process that dies by a signal or ``os._exit``
    runs no atexit: its connection just closes, which the daemon takes as a
    lost rank.)"""
    shutdown(_exiting=True)


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
    """Creates a timeline file at ``file_path`` and starts recording the
    job's collectives into it (Horovod's dynamic timeline; the daemon writes
    the file, a Chrome trace for chrome://tracing or Perfetto). As in
    Horovod, ``HOROVOD_TIMELINE`` must be set (``DYNAMIC``, or a file) in the
    environment of the ranks, and only rank 0's call counts; a running
    timeline moves to the new file.

    Args:
        file_path: the file to write; relative to this process's directory.
        mark_cycles: mark every cycle of the daemon's loop (CYCLE_START).
    """
    c = client()
    if not _env.timeline():
        raise ValueError("Set HOROVOD_TIMELINE=DYNAMIC to enable dynamic timeline usage.")
    m = _pb.ClientMessage()
    m.timeline.file_path = os.path.abspath(file_path)
    m.timeline.mark_cycles = bool(mark_cycles)
    try:
        c.call(m)
    except HvddInternalError as e:
        raise ValueError(f"Horovod timeline: {e}") from e


def stop_timeline() -> None:
    """Stops the timeline and returns once its file is complete. Stopping a
    stopped timeline does nothing."""
    c = client()
    m = _pb.ClientMessage()
    m.timeline.SetInParent()
    try:
        c.call(m)
    except HvddInternalError as e:
        raise ValueError(f"Horovod timeline: {e}") from e
