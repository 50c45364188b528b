"""Start-up of the ``hvdd`` torch.distributed backend: the process's one
connection to the node's daemon, made when the default process group is
created and closed when it is destroyed.

Where the daemon comes from:

- under ``hvdd run``: the job's daemon, as for any hvdd program
  (``HVDD_SOCKET``, ``HVDD_RANK``, ... in the environment);
- ``HVDD_SOCKET`` set by the user: the daemon listening there;
- otherwise the node's daemon on its default socket, or, when none
  listens, one that the job's processes on this host start for the job (the
  first of them to take a lock beside the socket), as a job under
  ``mpirun`` does (:func:`hvdd._launcher.ensure_daemon`).

torch's store tells the ranks what the launcher does not: a name for the
job, unique to this ``init_process_group`` (rank 0 draws it), and every
rank's host (under torchrun, its agent's: ``GROUP_RANK``), from which each
rank's local rank and the host's process count follow. hvdd's ranks are
node-major; the backend requires torch's rank to be hvdd's and says so when
they differ.

Across hosts (``torchrun --nnodes N``), each host's ranks start that host's
daemon for the job (``hvdd serve --nodes N --node-rank I``) and the daemons
meet at a rendezvous on rank 0's host: ``HVDD_RENDEZVOUS`` where set, else a
free port on ``MASTER_ADDR`` that rank 0 picks; their shared secret is
``HVDD_SECRET`` where set, else one rank 0 draws. Both pass through torch's
store, which anyone who can reach it can read: on a network that is not
trusted, set ``HVDD_SECRET`` on every rank.

``hvdd run`` sets torch's ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
``LOCAL_WORLD_SIZE``, ``GROUP_RANK``, ``MASTER_ADDR`` and ``MASTER_PORT``
itself (``hvdd run --help``), so that torch's own ``env://`` rendezvous
works before torch loads the backend through its entry point (which it
does only after the rendezvous). Where they are missing (an elastic job
that the driver runs has no ``MASTER_ADDR``; a user may unset them),
importing the backend sets the first four from hvdd run's variables, and
its ``env://`` handler, when ``MASTER_ADDR`` or ``MASTER_PORT`` is unset,
has global rank 0 open the store on a free port and broadcasts that port
over the daemon.
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
import threading
import uuid
from datetime import timedelta
from typing import Any, Dict, Iterator, Optional, Tuple

import numpy as np

from ... import _env, _launcher
from ... import basics as _basics
from ... import ops as _ops
from ..._client import Client
from ...basics import ProcessSet

log = logging.getLogger(__name__)

# How many default process groups this process has created: part of the
# store keys of start-up, so that a second init_process_group on a store
# that lives on (torchrun's agent store) does not read the first's keys.
_inits = 0


class Connection:
    """The process's connection to the daemon for torch.distributed, and the
    hvdd process sets of its process groups (by their sorted global ranks)."""

    def __init__(self, client: Client, owned: bool) -> None:
        self.client = client
        self.owned = owned  # made by the backend (closed at destroy), not by hvd.init()
        self.rank = int(client.welcome.rank)
        self.size = int(client.welcome.size)
        self.host = socket.gethostname()
        self.sets: Dict[Tuple[int, ...], int] = {}  # ranks -> process set id
        self.lock = threading.Lock()

    def process_set(self, ranks: Tuple[int, ...]) -> int:
        """The process set id of a group of these (sorted) global ranks:
        0 for every rank; else the one registered as torch created the group
        (:func:`register_group`)."""
        if list(ranks) == list(range(self.size)):
            return 0
        with self.lock:
            pid = self.sets.get(ranks)
        if pid is None:
            raise RuntimeError(
                f"hvdd: no process set for the group of ranks {list(ranks)}: the group must be made by "
                "torch.distributed.new_group (and the like), called on every rank of the job in the same order, "
                "or on the group's members with use_local_synchronization=True"
            )
        return pid

    def register_group(self, ranks: Tuple[int, ...], local: bool = False) -> None:
        """Registers the process set of a new group on every rank (a collective
        over the whole job, as new_group is), or with ``local`` among its
        members only (new_group(use_local_synchronization=True)); a group of
        ranks already registered keeps its set."""
        if list(ranks) == list(range(self.size)):
            return
        with self.lock:
            if ranks in self.sets:
                return
        ps = ProcessSet(list(ranks))
        _basics._register(self.client, ps, local=local)
        with self.lock:
            self.sets[ranks] = int(ps.process_set_id or 0)

    def close(self) -> None:
        """Closes the connection if the backend made it (a later
        init_process_group makes a new one)."""
        if self.owned:
            _basics.shutdown()


_conn: Optional[Connection] = None
_conn_lock = threading.Lock()


def connection() -> Connection:
    """The open connection (RuntimeError when there is none)."""
    c = _conn
    if c is None:
        raise RuntimeError("hvdd: the hvdd process group is not initialised (call init_process_group('hvdd'))")
    return c


def current() -> Optional[Connection]:
    return _conn


def _under_hvdd_run() -> bool:
    env = _env.environ()
    return bool(env.get("HVDD_RANK") is not None and env.get("HVDD_SOCKET"))


def _seconds(timeout: Optional[timedelta]) -> float:
    if timeout is None:
        return _env.default_start_timeout()
    return max(1.0, timeout.total_seconds())


def _key(name: str) -> str:
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    return f"hvdd/r{restart}/i{_inits}/{name}"


def _host_key() -> str:
    """This process's host as the job's placement sees it: the host name, and
    under torchrun its node's group rank too (``GROUP_RANK``, one per
    torchrun agent: ``--node-rank``), so that the nodes of a job that share a
    host name (agents in containers, or several on one machine) stay apart."""
    host = socket.gethostname()
    if os.environ.get("TORCHELASTIC_RUN_ID") and os.environ.get("GROUP_RANK", "").isdigit():
        return f"{host}/node{os.environ['GROUP_RANK']}"
    return host


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def _placement(store: Any, rank: int, size: int, timeout: timedelta) -> _launcher.Placement:
    """This rank's place (as a launcher's, ``_launcher.Placement``), from every rank's host in the store, and, for a
    job across hosts, the daemons' rendezvous and secret: ``HVDD_RENDEZVOUS``
    and ``HVDD_SECRET`` where set, else a free port on rank 0's host
    (``MASTER_ADDR``, torch's own rendezvous host) and a random secret that
    rank 0 draws and passes through the store. RuntimeError when the ranks
    are not placed host by host."""
    host = _host_key()
    if rank == 0:
        store.set(_key("job"), uuid.uuid4().hex)
        addr = os.environ.get("MASTER_ADDR") or socket.getfqdn()
        store.set(_key("rendezvous"), f"[{addr}]:{_free_port()}" if ":" in addr else f"{addr}:{_free_port()}")
        store.set(_key("secret"), secrets.token_hex(32))
    store.set(_key(f"host/{rank}"), host)
    keys = [_key("job"), _key("rendezvous"), _key("secret")] + [_key(f"host/{r}") for r in range(size)]
    try:
        store.wait(keys, timeout)
    except Exception as e:
        missing = [r for r in range(size) if not store.check([_key(f"host/{r}")])]
        raise RuntimeError(
            f"hvdd: init_process_group: rank(s) {missing or [0]} of {size} did not arrive within "
            f"{timeout.total_seconds():g} s (init_process_group's timeout): {e}"
        ) from e
    job = store.get(_key("job")).decode()
    hosts = [store.get(_key(f"host/{r}")).decode() for r in range(size)]
    order: list = []
    for h in hosts:
        if not order or order[-1] != h:
            if h in order:
                raise RuntimeError(
                    f"hvdd: the ranks of host {h} are not consecutive (hosts by rank: {hosts}); hvdd places ranks "
                    "host by host (torchrun does: --node-rank orders the hosts)"
                )
            order.append(h)
    first = hosts.index(host)
    rdv = secret = src = ""
    if len(order) > 1:
        rdv, src = os.environ.get("HVDD_RENDEZVOUS", ""), "HVDD_RENDEZVOUS"
        if not rdv:
            rdv = store.get(_key("rendezvous")).decode()
            src = "a free port on rank 0's host (MASTER_ADDR), through torch's store"
        secret = os.environ.get("HVDD_SECRET", "") or store.get(_key("secret")).decode()
    return _launcher.Placement(
        "torch.distributed",
        rank,
        size,
        rank - first,
        hosts.count(host),
        len(order),
        order.index(host),
        f"torch-{job}",
        host,
        rdv,
        secret,
        src,
    )


def connect(store: Any, rank: int, size: int, timeout: Optional[timedelta]) -> Connection:
    """Connects this process (torch's global ``rank`` of ``size``) to the
    daemon for a new default process group, or adopts the connection that
    ``hvd.init()`` (or this backend's ``env://`` handler under hvdd run) made.
    Blocks until the job has formed, at most ``timeout``."""
    global _conn, _inits
    with _conn_lock:
        if _conn is not None and not _basics.is_initialized():
            _conn = None  # shut down under us (hvd.shutdown())
        if _conn is None:
            if _basics.is_initialized():
                c, owned = _basics.client(), False
            else:
                c, owned = _open(store, rank, size, timeout), True
            _inits += 1
            _conn = Connection(c, owned)
        conn = _conn
    if conn.rank != rank or conn.size != size:
        bad = conn
        release()
        bad.close()
        raise RuntimeError(
            f"hvdd: torch.distributed made this process rank {rank} of {size}, but the hvdd daemon's job "
            f"gave it rank {bad.rank} of {bad.size}: hvdd places ranks host by host, in local-rank order "
            "(start the job with torchrun, or with hvdd run, whose ranks are torch's)"
        )
    return conn


def _open(store: Any, rank: int, size: int, timeout: Optional[timedelta]) -> Client:
    seconds = _seconds(timeout)
    if _under_hvdd_run():
        c = Client(start_timeout=seconds, client_name="python-torch.distributed")
    else:
        p = _placement(store, rank, size, timeout or timedelta(seconds=seconds))
        sock = _env.socket_override()
        if not sock:
            sock = _launcher.ensure_daemon(p, _env.default_socket_path(), _basics._hvdd_binary(), seconds)
        lrank, lsize, job = p.local_rank, p.local_size, p.job
        c = Client(
            socket_path=sock,
            local_rank=lrank,
            job=job,
            local_size=lsize,
            start_timeout=seconds,
            client_name="python-torch.distributed",
        )
    try:
        c.connect()
    except BaseException as e:
        raise RuntimeError(f"hvdd: init_process_group: {e}") from e
    _install(c)
    return c


def _install(c: Client) -> None:
    """Makes c the process's hvdd connection, as ``hvd.init()`` would, so
    that hvdd.torch's functions run on the same job."""
    with _basics._state_lock:
        _basics._client = c
        for hook in _basics._on_init:
            hook()
        if not _basics._atexit_registered:
            import atexit

            atexit.register(_basics._shutdown_at_exit)
            _basics._atexit_registered = True


def release() -> Optional[Connection]:
    """Forgets the connection (the default process group is being destroyed);
    returns it for the caller to close."""
    global _conn
    with _conn_lock:
        c, _conn = _conn, None
    return c


# ---------------------------------------------------------- hvdd run's env://


def set_hvdd_run_env() -> None:
    """Under hvdd run, sets torch's rank variables (RANK, WORLD_SIZE,
    LOCAL_RANK, LOCAL_WORLD_SIZE) from hvdd run's, where they are unset
    (hvdd run sets them itself; this serves when they are not)."""
    if not _under_hvdd_run():
        return
    env = os.environ
    for torch_name, hvdd_name in (
        ("RANK", "HVDD_RANK"),
        ("WORLD_SIZE", "HVDD_SIZE"),
        ("LOCAL_RANK", "HOROVOD_LOCAL_RANK"),
        ("LOCAL_WORLD_SIZE", "HVDD_LOCAL_SIZE"),
    ):
        if torch_name not in env and env.get(hvdd_name):
            env[torch_name] = env[hvdd_name]


def install_env_rendezvous() -> None:
    """Wraps torch's ``env://`` handler: under hvdd run with MASTER_ADDR or
    MASTER_PORT unset, the store is found through the daemon; otherwise
    torch's handler runs unchanged."""
    import importlib

    rdv = importlib.import_module("torch.distributed.rendezvous")  # the module, not dist.rendezvous()
    handlers = rdv._rendezvous_handlers
    orig = handlers.get("env")
    if orig is None or getattr(orig, "_hvdd", False):
        return

    def env_handler(url: str, timeout: timedelta = timedelta(minutes=30), **kwargs: Any) -> Iterator[Any]:
        if _under_hvdd_run() and not (os.environ.get("MASTER_ADDR") and os.environ.get("MASTER_PORT")):
            yield _hvdd_run_store(timeout)
            raise RuntimeError("Unable to perform re-rendezvous using env:// method")
        yield from orig(url, timeout=timeout, **kwargs)

    env_handler._hvdd = True  # type: ignore[attr-defined]
    handlers["env"] = env_handler


def _hvdd_run_store(timeout: timedelta) -> Tuple[Any, int, int]:
    """(store, rank, world size) of a job under hvdd run: global rank 0
    serves a TCPStore on a free port, which it broadcasts over the daemon."""
    import torch.distributed as dist

    global _conn, _inits
    with _conn_lock:
        if not _basics.is_initialized():
            c = Client(start_timeout=_seconds(timeout), client_name="python-torch.distributed")
            try:
                c.connect()
            except BaseException as e:
                raise RuntimeError(f"hvdd: init_process_group: {e}") from e
            _install(c)
            _inits += 1
            _conn = Connection(c, True)
    rank, size = _basics.rank(), _basics.size()
    single = not os.environ.get("HVDD_CROSS_SIZE")
    host = "127.0.0.1" if single else socket.gethostname()
    store = None
    if rank == 0:
        store = dist.TCPStore(host, 0, size, True, timeout=timeout, wait_for_workers=False)
        addr = np.frombuffer(f"{host}:{store.port}".encode().ljust(256), dtype=np.uint8).copy()
    else:
        addr = np.zeros(256, dtype=np.uint8)
    got = _ops.broadcast(addr, 0, full_name=f"torch.distributed.store.{_inits}")
    h, _, port = got.tobytes().decode().strip().rpartition(":")
    if store is None:
        store = dist.TCPStore(h, int(port), size, False, timeout=timeout)
    return store, rank, size
