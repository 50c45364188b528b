"""``ProcessGroupHvdd``: a ``torch.distributed.ProcessGroup`` whose collectives
run on the hvdd daemon.

torch matches a group's collectives by their order on each rank; the daemon
matches them by name. Each group names its collectives from its own
sequence counter, ``pt.<group>.<n>`` (parts of one collective add
``.<i>``), taken as the collective is called, so that the n-th collective of
a group has the same name on every rank. The name carries no kind: ranks
that call different collectives at the same point get the daemon's mismatch
error instead of a hang.

Each collective is sent to the daemon when it is called (its input staged
in shared memory then), and completed by the group's completion thread,
which waits for the group's collectives in their order, writes their
results into torch's output tensors and completes the :class:`Work`'s
future (DDP's reducer and communication hooks chain on it). A collective
that has not completed within the group's timeout (``init_process_group``'s
``timeout=``, or the op's own) fails its work. A failed collective (a rank
lost, tensors that differ across ranks) raises
``torch.distributed.DistBackendError`` with the daemon's message, which
names the rank.

Collectives called by a future's callbacks (PowerSGD's communication hook
calls them, and waits for them, in the callbacks it chains with ``then``)
run on whichever thread completes the future, the completion thread or, when
the future was already done, the caller's; their place in the group's order
would differ between ranks. Such a collective is named after the work whose
future's callback calls it instead, ``<that work's name>.c<i>`` for the i-th
call of the callbacks chained on it (:class:`_Future` keeps the work along its
``then`` chain), the same on every rank whichever thread runs it. A callback
that waits for a collective on the completion thread hands the thread's
role to a new thread first (:meth:`_Completer.hand_off`), which completes
the group's later collectives, the awaited one among them, while the old
thread finishes the callback and ends.

What the daemon has no op for is made of those it has: ``reduce`` is an
allreduce whose result only the root keeps; ``gather`` and ``scatter`` are
alltoalls with every rank's data going to or coming from the root; the
bitwise reductions (BAND, BOR, BXOR) allgather and reduce on each rank;
``barrier`` is a one-byte allreduce. Tensors go flat through the daemon
(``all_gather`` and the like then take tensors of any shapes); device tensors
are staged through host memory.

Point-to-point transfers (``send``, ``recv``, their ``i`` forms and
``batch_isend_irecv``) take no place in the group's order (only two ranks
make one): they are named ``pt.<group>.p2p.<n>`` from a counter of their
own, which only has to keep the names unique, and the daemon matches them by
channel (peer, tag, group) and order. Each channel's works complete in their
order on a thread of the channel's own (:class:`_Channel`), apart from the
group's collectives: a recv posted before a collective does not hold it up.
"""

from __future__ import annotations

import inspect
import itertools
import logging
import sys
import threading
import time
from collections import deque
from datetime import timedelta
from typing import Any, Callable, List, Optional, Sequence, Tuple

import numpy as np
import torch
import torch.distributed as dist

from ... import _cuda
from ... import ops as _ops
from ..._client import Client, Handle
from ..._proto import hvdd_pb2 as pb
from ...basics import Average, Max, Min, Product, Sum
from ...exceptions import HvddInternalError
from .._async_ops import _DTYPES, _from_host
from . import _startup

log = logging.getLogger(__name__)

__all__ = ["ProcessGroupHvdd", "create_process_group"]

_RedOpType = dist.ReduceOp.RedOpType

# torch's reduction -> the daemon's (PREMUL_SUM is a Sum with a prescale).
_HVDD_OPS = {
    _RedOpType.SUM: Sum,
    _RedOpType.AVG: Average,
    _RedOpType.MIN: Min,
    _RedOpType.MAX: Max,
    _RedOpType.PRODUCT: Product,
    _RedOpType.PREMUL_SUM: Sum,
}

# The reductions the daemon has no op for, done on each rank after an allgather.
_LOCAL_OPS: dict = {
    _RedOpType.BAND: torch.bitwise_and,
    _RedOpType.BOR: torch.bitwise_or,
    _RedOpType.BXOR: torch.bitwise_xor,
}

# Every reduction done on each rank: the bitwise ones (all collectives), and
# those the daemon's reducescatter lacks (it has Sum and Average).
_LOCAL_FNS: dict = {
    **_LOCAL_OPS,
    _RedOpType.MIN: torch.minimum,
    _RedOpType.MAX: torch.maximum,
    _RedOpType.PRODUCT: torch.mul,
}

_BackendError = getattr(dist, "DistBackendError", RuntimeError)


def _error(what: str, e: BaseException) -> BaseException:
    """The exception a failed collective raises in torch: DistBackendError
    with the daemon's message (which names the lost or disagreeing rank)."""
    if isinstance(e, _BackendError):
        return e
    err = _BackendError(f"hvdd: {what} failed: {e}")
    err.__cause__ = e
    return err


def _unset(t: Optional[timedelta]) -> bool:
    """Whether an options object's timeout is torch's "unset" (negative)."""
    return t is None or t.total_seconds() <= 0


# ---------------------------------------------------------------- tensors


def _host(t: torch.Tensor) -> Tuple[torch.Tensor, np.ndarray, int]:
    """(a contiguous CPU tensor with t's values, its numpy view, its wire
    dtype). It is t itself (sharing its memory) when t is a contiguous CPU
    tensor; complex tensors as their real view, bfloat16 as its bits.

    The view of t's own memory is made through DLPack, not ``.numpy()``,
    which makes the storage unresizable for good (batched_powerSGD_hook
    resizes the bucket's buffer that DDP's allreduces ran on)."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"hvdd: expected a torch.Tensor, got {type(t).__name__}")
    x = t.detach()
    if x.is_complex():
        x = torch.view_as_real(x)
    own = False  # whether x is a copy of hvdd's own
    if not x.is_cpu:
        x, own = x.cpu(), True
    if not x.is_contiguous():
        x, own = x.contiguous(), True
    dt = _DTYPES.get(x.dtype)
    if dt is None or x.is_sparse:
        raise ValueError(f"hvdd: tensors of dtype {t.dtype} are not supported")
    bits = x.view(torch.int16) if x.dtype is torch.bfloat16 else x
    a = bits.numpy() if own else np.from_dlpack(bits)
    return x, a, dt[0]


def _device_wire(t: torch.Tensor) -> Optional[int]:
    """t's wire dtype where the daemon may take t as device memory, through
    CUDA IPC (``ops.submit_device``: a CUDA tensor, or one an installed
    exporter claims, as the tests' fake GPU); None where it goes through host
    memory: a CPU tensor, a complex, sparse or non-contiguous one."""
    if t.is_cpu and not _cuda.has_exporters():
        return None
    if t.is_complex() or t.is_sparse or not t.is_contiguous():
        return None
    dt = _DTYPES.get(t.dtype)
    return None if dt is None else dt[0]


def _device_output(c: Client, kind: int, t: torch.Tensor, name: str, ps: int, **kw: Any) -> Optional[Handle]:
    """A collective whose output the daemon allocates (allgather,
    reducescatter), on t flattened, as device memory; its result is a
    tensor on t's device. None: stage it."""
    wire = _device_wire(t)
    if wire is None:
        return None
    x = t.detach().reshape(-1)
    return _ops.submit_device(
        c, kind, x, name, wire, dtype=_DTYPES[x.dtype][1], from_host=_from_host, process_set=ps, **kw
    )


def _shares(x: torch.Tensor, t: torch.Tensor) -> bool:
    """Whether the host tensor x (from _host(t)) is t's own memory."""
    return t.is_cpu and x.data_ptr() == t.data_ptr() and t.is_contiguous()


def _write(dst: torch.Tensor, src: Any) -> None:
    """Copies src (an array or tensor of dst's bits, any shape of dst's
    element count) into dst."""
    if isinstance(src, np.ndarray):
        src = torch.from_numpy(src)
    d = dst.detach()
    if d.is_complex():
        d = torch.view_as_real(d)
    if d.dtype is torch.bfloat16 and src.dtype is not torch.bfloat16:
        src = src.view(torch.bfloat16)
    with torch.no_grad():
        d.copy_(src.reshape(d.shape))


def _tensor(a: np.ndarray, like: torch.Tensor) -> torch.Tensor:
    """A result array as a tensor of like's dtype (bfloat16 arrives as its
    int16 bits; complex as pairs of reals)."""
    t = torch.from_numpy(a)
    real = like.real.dtype if like.is_complex() else like.dtype
    return t.view(torch.bfloat16) if real is torch.bfloat16 else t


def _flat(t: torch.Tensor) -> Tuple[np.ndarray, int]:
    """t's values as a flat array (a view when t is contiguous on the CPU)
    and its wire dtype."""
    _, a, wire = _host(t)
    return a.reshape(-1), wire


def _elems(t: torch.Tensor) -> int:
    """t's element count as the daemon sees it (complex: twice)."""
    return t.numel() * (2 if t.is_complex() else 1)


def _empty_like_flat(t: torch.Tensor) -> Tuple[np.ndarray, int]:
    """An empty flat array of t's dtype (what a rank without data sends)."""
    _, a, wire = _host(t.detach().reshape(-1)[:0])
    return a, wire


# ------------------------------------------------------------------- Work


# The thread's state: ``ctx``, the stack of _Contexts of the callbacks
# running on it; ``completer``, the _Completer whose thread it is (or was).
_tls = threading.local()


class _Context:
    """Names the collectives that the callbacks chained on one work's future
    call: ``<the work's name>.c<i>``, in the order they call them (callbacks
    of one chain run one after another), whichever thread runs them."""

    def __init__(self, base: str) -> None:
        self.base = base
        self._n = itertools.count()

    def name(self) -> str:
        return f"{self.base}.c{next(self._n)}"

    def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        stack = _tls.__dict__.setdefault("ctx", [])
        stack.append(self)
        try:
            return fn(*args)
        finally:
            stack.pop()


def _context() -> Optional[_Context]:
    """The context of the callback running on this thread, if any."""
    stack = getattr(_tls, "ctx", None)
    return stack[-1] if stack else None


def _before_blocking() -> None:
    """Called before a wait for a collective: on a completion thread (in a
    callback of a future it completes), hands its role to a new thread, which
    completes the collective waited for (this thread would never)."""
    c = getattr(_tls, "completer", None)
    if c is not None:
        c.hand_off()


class _Future(torch.futures.Future):
    """A work's future, and the futures chained on it with ``then``: their
    callbacks run in the work's :class:`_Context` (the collectives they call
    are named after the work), and their ``wait()`` on a completion thread
    hands the thread's role over first (:func:`_before_blocking`)."""

    def __init__(self, ctx: _Context) -> None:
        super().__init__()
        self._ctx = ctx

    def then(self, callback: Callable[["torch.futures.Future"], Any]) -> "torch.futures.Future":  # type: ignore[override]
        child = _Future(self._ctx)

        def run(_: Any) -> None:
            try:
                value = self._ctx.run(callback, self)
            except BaseException as e:
                child.set_exception(e)
            else:
                child.set_result(value)

        super().add_done_callback(run)
        return child

    def add_done_callback(self, callback: Callable[["torch.futures.Future"], None]) -> None:
        super().add_done_callback(lambda _: self._ctx.run(callback, self))

    def wait(self) -> Any:
        if not self.done():
            _before_blocking()
        return super().wait()


class Work(dist.Work):
    """The work of one collective: done once its results are in torch's
    output tensors. ``wait()`` raises the collective's error;
    ``get_future()`` is completed with the output tensors (DDP's reducer and
    communication hooks chain on it)."""

    def __init__(self, what: str, name: str, result: List[torch.Tensor], deadline: float) -> None:
        super().__init__()
        self.what = what
        self._result = result
        self._fut: torch.futures.Future = _Future(_Context(name))
        self._event = threading.Event()
        self._lock = threading.Lock()
        self._error: Optional[BaseException] = None
        self._settled = False
        self.deadline = deadline

    def _settle(self, error: Optional[BaseException]) -> bool:
        """Completes the work (once): with its result, or its error."""
        with self._lock:
            if self._settled:
                return False
            self._settled = True
            self._error = error
        # The future first: once wait() returns, get_future() is done (and
        # the callbacks chained on it have run, as torch's works do).
        if error is None:
            self._fut.set_result(self._result)
        else:
            self._fut.set_exception(error)
        self._event.set()
        return True

    def wait(self, timeout: Optional[timedelta] = None) -> bool:
        """Blocks until the collective is done (at most ``timeout``) and raises
        its error, if any. Returns True."""
        if not self._event.is_set():
            _before_blocking()
        if _unset(timeout):
            self._event.wait()
        elif not self._event.wait(timeout.total_seconds()):  # type: ignore[union-attr]
            raise _BackendError(f"hvdd: {self.what}: not done within {timeout} (Work.wait)")
        if self._error is not None:
            raise self._error
        return True

    def is_completed(self) -> bool:
        """Whether the collective is done (successfully or not)."""
        return self._event.is_set()

    def is_success(self) -> bool:
        """Whether the collective is done without error."""
        return self._event.is_set() and self._error is None

    def exception(self) -> Optional[BaseException]:
        """The collective's error, None while running or after success."""
        return self._error

    def get_future(self) -> torch.futures.Future:
        """A future completed with the output tensors when the collective is done."""
        return self._fut

    def result(self) -> List[torch.Tensor]:
        """The output tensors (after ``wait()``)."""
        return self._result

    def synchronize(self) -> None:
        """Nothing to do: the results are in host memory when the work is done."""

    def source_rank(self) -> int:
        raise RuntimeError("hvdd: source_rank() is only for the work of recv from any source")


class _Pending:
    """A collective sent to the daemon: its work, its handles and what to do
    with their results (write them into torch's outputs)."""

    __slots__ = ("work", "handles", "finish")

    def __init__(self, work: Work, handles: List[Handle], finish: Optional[Callable[[List[Any]], None]]) -> None:
        self.work = work
        self.handles = handles
        self.finish = finish


class _Completer:
    """A group's completion thread: completes the group's collectives in their
    order. A collective past its deadline fails its work (the daemon's op
    stays pending; later ones wait behind it)."""

    def __init__(self, client: Client, name: str) -> None:
        self.client = client
        self.name = name
        self.queue: deque = deque()
        self.cond = threading.Condition()
        self.closed = False
        self.handoffs = 0
        # The thread that completes the group's collectives now (another
        # takes over when a callback on it waits: hand_off).
        self.thread = threading.Thread(target=self._run, name=f"hvdd-pg-{name}", daemon=True)
        self.thread.start()
        _watchdog.add(self)

    def put(self, p: _Pending) -> None:
        with self.cond:
            self.queue.append(p)
            self.cond.notify_all()

    def hand_off(self) -> None:
        """Called on this completer's thread by a callback about to wait for
        a collective: a new thread takes over completing the group's
        collectives; this one ends once its callback returns."""
        with self.cond:
            if self.thread is not threading.current_thread():
                return
            self.handoffs += 1
            t = threading.Thread(target=self._run, name=f"hvdd-pg-{self.name}-{self.handoffs}", daemon=True)
            self.thread = t
            self.cond.notify_all()
        t.start()

    def _run(self) -> None:
        _tls.completer = self
        me = threading.current_thread()
        while True:
            with self.cond:
                while not self.queue and not self.closed and self.thread is me:
                    self.cond.wait()
                if not self.queue or self.thread is not me:
                    return
                p = self.queue[0]
            err: Optional[BaseException] = None
            results: List[Any] = []
            for h in p.handles:
                try:
                    results.append(self.client.complete(h))
                except BaseException as e:  # wait for every part before failing
                    err = err or e
            if err is None and p.finish is not None:
                try:
                    p.finish(results)
                except BaseException as e:
                    err = e
            with self.cond:
                self.queue.popleft()
            p.work._settle(None if err is None else _error(p.work.what, err))

    def expired(self, now: float) -> None:
        with self.cond:
            late = [p.work for p in self.queue if p.work.deadline < now and not p.work.is_completed()]
        for w in late:
            w._settle(_BackendError(f"hvdd: {w.what} did not complete within the process group's timeout"))

    def close(self) -> None:
        with self.cond:
            self.closed = True
            self.cond.notify_all()
        _watchdog.remove(self)

    def join(self, timeout: float) -> None:
        """Waits, at most timeout seconds, for the closed completer's thread
        to end. A daemon thread still inside torch's C++ code (completing a
        future) when the interpreter exits is ended there by the
        interpreter, which aborts the process ("terminate called without an
        active exception"); destroy_process_group joins it first."""
        t = self.thread
        if t is not threading.current_thread() and t.is_alive():
            t.join(timeout)


class _Watchdog:
    """One thread that fails the works of every group that overrun their
    deadline."""

    def __init__(self) -> None:
        self.completers: set = set()
        self.lock = threading.Lock()
        self.thread: Optional[threading.Thread] = None

    def add(self, c: _Completer) -> None:
        with self.lock:
            self.completers.add(c)
            if self.thread is None:
                self.thread = threading.Thread(target=self._run, name="hvdd-pg-watchdog", daemon=True)
                self.thread.start()

    def remove(self, c: _Completer) -> None:
        with self.lock:
            self.completers.discard(c)

    def _run(self) -> None:
        while True:
            time.sleep(0.05)
            with self.lock:
                cs = list(self.completers)
            now = time.monotonic()
            for c in cs:
                c.expired(now)


_watchdog = _Watchdog()


class _Channel:
    """The point-to-point works of one channel of a group (a direction, a
    peer, a tag), completed in their order on a thread of the channel's own
    while any is in flight (it ends when none is). The daemon matches a
    channel's sends and recvs in their order, so waiting for them in that
    order holds none up; works of other channels, and the group's
    collectives, complete on their own threads: a recv posted before a
    collective whose completion the sender waits for does not hold that
    collective up. A work past its deadline fails (the watchdog)."""

    def __init__(self, client: Client, name: str) -> None:
        self.client = client
        self.name = name
        self.queue: deque = deque()
        self.lock = threading.Lock()
        self.running = False

    def put(self, p: _Pending) -> None:
        with self.lock:
            self.queue.append(p)
            if self.running:
                return
            self.running = True
        threading.Thread(target=self._run, name=f"hvdd-p2p-{self.name}", daemon=True).start()

    def _run(self) -> None:
        while True:
            with self.lock:
                if not self.queue:
                    self.running = False
                    return
                p = self.queue[0]
            err: Optional[BaseException] = None
            try:
                results = [self.client.complete(h) for h in p.handles]
                if p.finish is not None:
                    p.finish(results)
            except BaseException as e:
                err = e
            with self.lock:
                self.queue.popleft()
            p.work._settle(None if err is None else _error(p.work.what, err))

    def expired(self, now: float) -> None:
        with self.lock:
            late = [p.work for p in self.queue if p.work.deadline < now and not p.work.is_completed()]
        for w in late:
            w._settle(_BackendError(f"hvdd: {w.what} did not complete within the process group's timeout"))


# ---------------------------------------------------------- the group


class _NoCoalescing:
    """What batch_isend_irecv sees as an hvdd group's backend: one that does
    not coalesce, so that it sends the batch's ops one by one (the daemon
    matches each on its own; their order in the batch does not matter)."""

    supports_coalescing = False


_NO_COALESCING = _NoCoalescing()

# A group prunes its idle point-to-point channels when it has this many.
_P2P_CHANNELS = 64


class ProcessGroupHvdd(dist.ProcessGroup):
    """A process group whose collectives the hvdd daemon runs. Made by
    ``init_process_group("hvdd")`` and ``new_group(..., backend="hvdd")``
    (:func:`create_process_group`), not directly.

    ``rank``/``size`` are the group's; ``global_ranks`` the job's ranks of
    its members, in group-rank order; ``process_set`` the daemon's id of the
    set of those ranks (0: every rank)."""

    def __init__(
        self,
        conn: "_startup.Connection",
        store: Any,
        rank: int,
        size: int,
        global_ranks: Sequence[int],
        group_id: str,
        timeout: timedelta,
        process_set: int,
        is_default: bool,
    ) -> None:
        super().__init__(rank, size)
        self._conn = conn
        self._client = conn.client
        self._store = store
        self._rank = rank
        self._size = size
        self.global_ranks = list(global_ranks)
        self._gid = group_id
        self._timeout = timeout
        self._ps = process_set
        self._is_default = is_default
        self._seq = itertools.count()
        self._submit_lock = threading.Lock()
        self._completer = _Completer(self._client, group_id)
        self._group_name = group_id
        self._group_desc = "undefined"
        self._barriers = itertools.count()
        self._closed = False
        # Point to point: the channels (recv?, global peer, tag) -> _Channel,
        # and the names of their ops (unique among the client's in flight;
        # the daemon matches sends and recvs by channel and order, not name).
        self._p2p: dict = {}
        self._p2p_seq = itertools.count()
        self._p2p_lock = threading.Lock()

    # ------------------------------------------------------------ identity

    def getBackendName(self) -> str:
        return "hvdd"

    def name(self) -> str:
        return "hvdd"

    def size(self) -> int:
        return self._size

    def getSize(self) -> int:
        return self._size

    def rank(self) -> int:
        return self._rank

    def getRank(self) -> int:
        return self._rank

    # The group's name and description stay on the Python side: the C++
    # getters look for a C++ backend, which a Python group does not have.
    def _set_group_name(self, name: str) -> None:
        self._group_name = name

    def setGroupName(self, name: str) -> None:
        self._group_name = name

    def getGroupName(self) -> str:
        return self._group_name

    @property
    def group_name(self) -> str:  # type: ignore[override]
        return self._group_name

    def _set_group_desc(self, desc: str) -> None:
        self._group_desc = desc

    def setGroupDesc(self, desc: str) -> None:
        self._group_desc = desc

    def getGroupDesc(self) -> str:
        return self._group_desc

    @property
    def group_desc(self) -> str:  # type: ignore[override]
        return self._group_desc

    @property
    def _device_types(self) -> List[torch.device]:  # type: ignore[override]
        # torch reads a group's device types to find its C++ backends, which a
        # Python group has none of (empty: "a ProcessGroup subclass", skipped),
        # except monitored_barrier, which wants a CPU-capable group.
        if sys._getframe(1).f_code.co_name == "monitored_barrier":
            return [torch.device("cpu"), torch.device("cuda")]
        return []

    def _get_backend(self, device: Any) -> Any:  # type: ignore[override]
        # A Python group has no C++ backend for torch to find (see
        # _device_types); batch_isend_irecv only asks whether it coalesces
        # (no: each op is sent as it comes, which is all a batch needs).
        try:
            return super()._get_backend(device)
        except RuntimeError:
            if sys._getframe(1).f_code.co_name == "batch_isend_irecv":
                return _NO_COALESCING
            raise

    def set_timeout(self, timeout: timedelta) -> None:
        """The timeout of the group's later collectives (torch's _set_pg_timeout)."""
        self._timeout = timeout

    def __repr__(self) -> str:
        return f"ProcessGroupHvdd(rank={self._rank}, size={self._size}, ranks={self.global_ranks})"

    # ------------------------------------------------------------ plumbing

    def _deadline(self, opts: Any) -> float:
        t = getattr(opts, "timeout", None)
        if _unset(t):
            t = self._timeout
        return time.monotonic() + t.total_seconds()

    def _run(
        self,
        what: str,
        opts: Any,
        result: List[torch.Tensor],
        submit: Callable[[str], List[Handle]],
        finish: Optional[Callable[[List[Any]], None]] = None,
    ) -> Work:
        """Names and sends one collective (``submit(name)`` sends its parts and
        returns their handles) and queues its completion. A collective that
        cannot be sent (the job failed, bad arguments) raises here."""
        if self._closed:
            raise RuntimeError(f"hvdd: {what} on a destroyed process group")
        ctx = _context()
        with self._submit_lock:
            # In a future's callback: named after that future's work, not by
            # the group's order, which the callback's thread does not keep.
            name = ctx.name() if ctx is not None else f"pt.{self._gid}.{next(self._seq)}"
            work = Work(f"{what} {name!r}", name, result, self._deadline(opts))
            try:
                handles = submit(name)
            except HvddInternalError as e:
                raise _error(work.what, e) from e
            self._completer.put(_Pending(work, handles, finish))
        return work

    def _run_parts(
        self, what: str, opts: Any, result: List[torch.Tensor], n: int, part: Callable[[str, int], Tuple[Handle, Any]]
    ) -> Work:
        """A collective of n parts sent together: ``part(name, i)`` sends part
        i (named name when n is 1, else name.i) and returns its handle and
        the function that takes its result."""
        fins: List[Callable] = []

        def submit(name: str) -> List[Handle]:
            hs = []
            for i in range(n):
                h, f = part(name if n == 1 else f"{name}.{i}", i)
                hs.append(h)
                fins.append(f)
            return hs

        def finish(results: List[Any]) -> None:
            for f, r in zip(fins, results):
                f(r)

        return self._run(what, opts, result, submit, finish)

    def _root(self, group_rank: int) -> int:
        if not 0 <= group_rank < self._size:
            raise ValueError(f"hvdd: invalid root rank {group_rank} for a group of {self._size}")
        return self.global_ranks[group_rank]

    @staticmethod
    def _op(opts: Any) -> Tuple[Any, Optional[int], float]:
        """(torch's RedOpType, the daemon's op or None for a local one, prescale)."""
        red = opts.reduceOp
        kind = red.op if hasattr(red, "op") else red
        if kind == _RedOpType.PREMUL_SUM:
            f = red.factor if hasattr(red, "factor") else 1.0
            if isinstance(f, torch.Tensor):
                f = float(f.item())
            return kind, Sum, float(f)
        if kind in _LOCAL_OPS:
            return kind, None, 1.0
        if kind not in _HVDD_OPS:
            raise ValueError(f"hvdd: reduction {kind} is not supported")
        return kind, _HVDD_OPS[kind], 1.0

    def _allreduce_parts(self, name: str, tensors: Sequence[torch.Tensor], opts: Any, keep: Sequence[bool]):
        """Sends the allreduce of tensors (in place; only those with keep
        take the result); returns (handles, finish)."""
        kind, op, pre = self._op(opts)
        c = self._client
        if op is None:  # bitwise: allgather, reduce here
            handles, fins = [], []
            for i, t in enumerate(tensors):
                a, wire = _flat(t)
                handles.append(_ops.submit_output(c, pb.OP_ALLGATHER, a, f"{name}.{i}", self._ps, wire=wire))
            fn = _LOCAL_OPS[kind]

            def finish(results: List[Any]) -> None:
                for t, k, r in zip(tensors, keep, results):
                    if not k:
                        continue
                    x = _tensor(r, t).reshape(self._size, -1)
                    acc = x[0].clone()
                    for j in range(1, self._size):
                        acc = fn(acc, x[j])
                    _write(t, acc)

            return handles, finish
        handles = []
        copies = []
        n = len(tensors)
        gid = next(_ops._groups) if n > 1 else 0
        for i, (t, k) in enumerate(zip(tensors, keep)):
            nm = name if n == 1 else f"{name}_{i + 1}of{n}"
            wire = _device_wire(t)
            if wire is not None:
                # In place on t's device memory; a rank that keeps nothing
                # (reduce's others) sends a copy, whose result it drops.
                d = t.detach()
                h = _ops.submit_device(
                    c,
                    pb.OP_ALLREDUCE,
                    d,
                    nm,
                    wire,
                    d if k else None,
                    reduce_op=int(op),
                    prescale=pre,
                    postscale=1.0,
                    process_set=self._ps,
                    group=gid,
                    group_size=n if n > 1 else 0,
                )
                if h is not None:
                    handles.append(h)
                    copies.append(False)
                    continue
            x, a, wire = _host(t)
            own = k and _shares(x, t)
            handles.append(
                _ops.submit_allreduce(
                    c,
                    a,
                    nm,
                    int(op),
                    pre,
                    1.0,
                    self._ps,
                    out=a if own else None,
                    wire=wire,
                    group=gid,
                    group_size=n if n > 1 else 0,
                )
            )
            copies.append(k and not own)

        def finish(results: List[Any]) -> None:
            for t, cp, r in zip(tensors, copies, results):
                if cp:
                    _write(t, r)

        return handles, finish

    # --------------------------------------------------------- allreduce

    def allreduce(self, tensors: List[torch.Tensor], opts: Any = None) -> Work:
        """``torch.distributed.all_reduce``: every tensor reduced in place."""
        opts = opts if opts is not None else dist.AllreduceOptions()
        tensors = list(tensors) if isinstance(tensors, (list, tuple)) else [tensors]
        state: dict = {}

        def submit(name: str) -> List[Handle]:
            h, state["finish"] = self._allreduce_parts(name, tensors, opts, [True] * len(tensors))
            return h

        return self._run("all_reduce", opts, tensors, submit, lambda r: state["finish"](r))

    def allreduce_coalesced(self, tensors: List[torch.Tensor], opts: Any = None) -> Work:
        """``torch.distributed.all_reduce_coalesced``: the tensors reduced as one
        unit (the daemon fuses them)."""
        opts = opts if opts is not None else dist.AllreduceCoalescedOptions()
        return self.allreduce(list(tensors), opts)

    def reduce(self, tensors: List[torch.Tensor], opts: Any = None) -> Work:
        """``torch.distributed.reduce``: the root's tensor gets the reduction;
        the others' stay as they are."""
        opts = opts if opts is not None else dist.ReduceOptions()
        tensors = list(tensors)
        root = opts.rootRank
        self._root(root)
        state: dict = {}

        def submit(name: str) -> List[Handle]:
            keep = [self._rank == root] * len(tensors)
            h, state["finish"] = self._allreduce_parts(name, tensors, opts, keep)
            return h

        return self._run("reduce", opts, tensors, submit, lambda r: state["finish"](r))

    # --------------------------------------------------------- broadcast

    def broadcast(self, tensors: List[torch.Tensor], opts: Any = None) -> Work:
        """``torch.distributed.broadcast``: every rank's tensors get the root's."""
        opts = opts if opts is not None else dist.BroadcastOptions()
        tensors = list(tensors) if isinstance(tensors, (list, tuple)) else [tensors]
        root = self._root(opts.rootRank)
        copies: List[bool] = []

        def submit(name: str) -> List[Handle]:
            hs = []
            for i, t in enumerate(tensors):
                nm = name if len(tensors) == 1 else f"{name}.{i}"
                wire = _device_wire(t)
                if wire is not None:
                    d = t.detach()
                    h = _ops.submit_device(
                        self._client, pb.OP_BROADCAST, d, nm, wire, d, root_rank=root, process_set=self._ps
                    )
                    if h is not None:  # in place on t's device memory
                        hs.append(h)
                        copies.append(False)
                        continue
                x, a, wire = _host(t)
                own = _shares(x, t)
                hs.append(_ops.submit_broadcast(self._client, a, nm, root, self._ps, out=a if own else None, wire=wire))
                copies.append(not own)
            return hs

        def finish(results: List[Any]) -> None:
            for t, cp, r in zip(tensors, copies, results):
                if cp:
                    _write(t, r)

        return self._run("broadcast", opts, tensors, submit, finish)

    # --------------------------------------------------------- allgather

    def _allgather_into(self, name: str, inp: torch.Tensor, outs: List[torch.Tensor]) -> Tuple[Handle, Callable]:
        h = _device_output(self._client, pb.OP_ALLGATHER, inp, name, self._ps)
        if h is None:
            a, wire = _flat(inp)
            h = _ops.submit_output(self._client, pb.OP_ALLGATHER, a, name, self._ps, wire=wire)

        def finish(r: Any) -> None:
            # r: an array of host memory, or a flat tensor on inp's device
            want = sum(_elems(o) for o in outs)
            if int(r.numel() if isinstance(r, torch.Tensor) else r.size) != want:
                raise ValueError(
                    f"the ranks' tensors have {r.size} elements in all, the output tensors {want} "
                    "(all_gather: every rank's input must have the size of its output tensor)"
                )
            off = 0
            for o in outs:
                n = _elems(o)
                _write(o, r[off : off + n])
                off += n

        return h, finish

    def allgather(
        self, output_tensors: List[List[torch.Tensor]], input_tensors: List[torch.Tensor], opts: Any = None
    ) -> Work:
        """``torch.distributed.all_gather``: output_tensors[i][r] gets rank r's
        input_tensors[i]."""
        opts = opts if opts is not None else dist.AllgatherOptions()
        if isinstance(input_tensors, torch.Tensor):
            input_tensors, output_tensors = [input_tensors], [output_tensors]  # type: ignore[list-item]
        if len(output_tensors) != len(input_tensors):
            raise ValueError("hvdd: all_gather: one list of outputs per input tensor")
        for outs in output_tensors:
            if len(outs) != self._size:
                raise ValueError(
                    f"hvdd: all_gather: the output list has {len(outs)} tensors, the group {self._size} ranks"
                )
        flat = [o for outs in output_tensors for o in outs]
        return self._run_parts(
            "all_gather",
            opts,
            flat,
            len(input_tensors),
            lambda name, i: self._allgather_into(name, input_tensors[i], output_tensors[i]),
        )

    def allgather_coalesced(
        self, output_lists: List[List[torch.Tensor]], input_list: List[torch.Tensor], opts: Any = None
    ) -> Work:
        """``torch.distributed.all_gather_coalesced``."""
        return self.allgather(output_lists, input_list, opts)

    def all_gather_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> Work:
        """``torch.distributed.all_gather_into_tensor``: output holds every
        rank's input, concatenated in rank order."""
        return self.all_gather_single_coalesced([output], [input], opts)

    _allgather_base = all_gather_single

    def all_gather_single_coalesced(
        self, outputs: List[torch.Tensor], inputs: List[torch.Tensor], opts: Any = None
    ) -> Work:
        """Several ``all_gather_into_tensor`` as one collective."""
        opts = opts if opts is not None else dist.AllgatherOptions()
        return self._run_parts(
            "all_gather_into_tensor",
            opts,
            list(outputs),
            len(inputs),
            lambda name, i: self._allgather_into(name, inputs[i], [outputs[i]]),
        )

    allgather_into_tensor_coalesced = all_gather_single_coalesced

    # ------------------------------------------------------ gather, scatter

    def _to_root(self, name: str, inp: torch.Tensor, root: int) -> Handle:
        """An alltoall in which every rank sends all of inp to the group rank root."""
        a, wire = _flat(inp)
        splits = [0] * self._size
        splits[root] = a.size
        return _ops.submit_output(
            self._client, pb.OP_ALLTOALL, a, name, self._ps, with_splits=True, wire=wire, splits=splits
        )

    def gather(
        self, output_tensors: List[List[torch.Tensor]], input_tensors: List[torch.Tensor], opts: Any = None
    ) -> Work:
        """``torch.distributed.gather``: on the root, output_tensors[0][r] gets
        rank r's tensor."""
        opts = opts if opts is not None else dist.GatherOptions()
        root = opts.rootRank
        self._root(root)
        outs = list(output_tensors[0]) if self._rank == root and output_tensors else []
        if self._rank == root and len(outs) != self._size:
            raise ValueError(
                f"hvdd: gather: the root's output list has {len(outs)} tensors, the group {self._size} ranks"
            )

        def submit(name: str) -> List[Handle]:
            return [self._to_root(name, input_tensors[0], root)]

        def finish(results: List[Any]) -> None:
            r, splits = results[0]
            if self._rank != root:
                return
            off = 0
            for o, n in zip(outs, splits):
                if int(n) != _elems(o):
                    raise ValueError(f"gather: a rank sent {int(n)} elements for an output tensor of {_elems(o)}")
                _write(o, r[off : off + int(n)])
                off += int(n)

        return self._run("gather", opts, outs, submit, finish)

    def gather_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> Work:
        """``torch.distributed.gather`` into one tensor on the root."""
        opts = opts if opts is not None else dist.GatherOptions()
        root = opts.rootRank
        self._root(root)

        def submit(name: str) -> List[Handle]:
            return [self._to_root(name, input, root)]

        def finish(results: List[Any]) -> None:
            r, _ = results[0]
            if self._rank == root:
                if r.size != _elems(output):
                    raise ValueError(f"gather: the ranks sent {r.size} elements for an output of {_elems(output)}")
                _write(output, r)

        return self._run("gather", opts, [output], submit, finish)

    gather_into_tensor = gather_single

    def scatter(
        self, output_tensors: List[torch.Tensor], input_tensors: List[List[torch.Tensor]], opts: Any = None
    ) -> Work:
        """``torch.distributed.scatter``: rank r's output_tensors[0] gets the
        root's input_tensors[0][r]."""
        opts = opts if opts is not None else dist.ScatterOptions()
        root = opts.rootRank
        self._root(root)
        out = output_tensors[0]

        def submit(name: str) -> List[Handle]:
            if self._rank == root:
                ins = list(input_tensors[0])
                if len(ins) != self._size:
                    raise ValueError(f"hvdd: scatter: {len(ins)} input tensors for a group of {self._size} ranks")
                parts = [_flat(t) for t in ins]
                a = np.concatenate([p[0] for p in parts]) if parts else np.empty(0)
                wire = parts[0][1]
                splits = [p[0].size for p in parts]
            else:
                a, wire = _empty_like_flat(out)
                splits = [0] * self._size
            return [
                _ops.submit_output(
                    self._client, pb.OP_ALLTOALL, a, name, self._ps, with_splits=True, wire=wire, splits=splits
                )
            ]

        def finish(results: List[Any]) -> None:
            r, _ = results[0]
            if r.size != _elems(out):
                raise ValueError(f"scatter: the root sent {r.size} elements for an output of {_elems(out)}")
            _write(out, r)

        return self._run("scatter", opts, [out], submit, finish)

    # -------------------------------------------------------- reduce_scatter

    def _reduce_scatter_parts(self, name: str, out: torch.Tensor, ins: Sequence[torch.Tensor], opts: Any):
        kind, op, pre = self._op(opts)
        c = self._client
        parts = [_flat(t) for t in ins]
        if len(parts) != self._size:
            raise ValueError(f"hvdd: reduce_scatter: {len(parts)} input tensors for a group of {self._size} ranks")
        n = _elems(out)
        if any(p[0].size != n for p in parts):
            raise ValueError("hvdd: reduce_scatter: every input tensor must have the output's size")
        a = np.concatenate([p[0] for p in parts]) if n else parts[0][0]
        wire = parts[0][1]
        if op is not None and kind not in _LOCAL_FNS:
            h = _ops.submit_output(
                c, pb.OP_REDUCESCATTER, a, name, self._ps, wire=wire, reduce_op=int(op), prescale=pre, postscale=1.0
            )

            def finish(r: Any) -> None:
                _write(out, r)

            return h, finish
        h = _ops.submit_output(
            c, pb.OP_ALLTOALL, a, name, self._ps, with_splits=True, wire=wire, splits=[n] * self._size
        )
        fn = _LOCAL_FNS[kind]

        def finish_local(r: Any) -> None:
            x = _tensor(r[0], out).reshape(self._size, -1)
            acc = x[0].clone()
            for j in range(1, self._size):
                acc = fn(acc, x[j])
            _write(out, acc)

        return h, finish_local

    def reduce_scatter(
        self, output_tensors: List[torch.Tensor], input_tensors: List[List[torch.Tensor]], opts: Any = None
    ) -> Work:
        """``torch.distributed.reduce_scatter``: rank r's output gets the
        reduction of every rank's input_tensors[0][r]."""
        opts = opts if opts is not None else dist.ReduceScatterOptions()
        return self._run_parts(
            "reduce_scatter",
            opts,
            list(output_tensors),
            len(output_tensors),
            lambda name, i: self._reduce_scatter_parts(name, output_tensors[i], input_tensors[i], opts),
        )

    def reduce_scatter_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> Work:
        """``torch.distributed.reduce_scatter_tensor``: rank r's output gets the
        reduction of the r-th block of every rank's input."""
        return self.reduce_scatter_single_coalesced([output], [input], opts)

    _reduce_scatter_base = reduce_scatter_single

    def reduce_scatter_single_coalesced(
        self, outputs: List[torch.Tensor], inputs: List[torch.Tensor], opts: Any = None
    ) -> Work:
        """Several ``reduce_scatter_tensor`` as one collective."""
        opts = opts if opts is not None else dist.ReduceScatterOptions()
        for o, i in zip(outputs, inputs):
            if _elems(i) != _elems(o) * self._size:
                raise ValueError(
                    f"hvdd: reduce_scatter_tensor: the input has {i.numel()} elements, not the group's size "
                    f"({self._size}) times the output's ({o.numel()})"
                )
        kind, op, _ = self._op(opts)
        if op is not None and kind not in _LOCAL_FNS and all(_device_wire(i) is not None for i in inputs):
            return self._reduce_scatter_device(outputs, inputs, opts)
        return self.reduce_scatter(
            list(outputs), [list(i.detach().reshape(self._size, -1).unbind(0)) for i in inputs], opts
        )

    def _reduce_scatter_device(self, outputs: List[torch.Tensor], inputs: List[torch.Tensor], opts: Any) -> Work:
        """``reduce_scatter_tensor`` of device tensors with a reduction the
        daemon's reducescatter has: each input, flat, goes as device memory
        (its n equal blocks, one per rank), and this rank's block of the
        result is copied into the output on the device; an input the daemon
        cannot take so goes through host memory."""
        _, op, pre = self._op(opts)

        def part(name: str, i: int) -> Tuple[Handle, Any]:
            o, inp = outputs[i], inputs[i]
            h = _device_output(
                self._client, pb.OP_REDUCESCATTER, inp, name, self._ps, reduce_op=int(op), prescale=pre, postscale=1.0
            )
            if h is None:
                return self._reduce_scatter_parts(name, o, list(inp.detach().reshape(self._size, -1).unbind(0)), opts)
            return h, lambda r: _write(o, r)

        return self._run_parts("reduce_scatter_tensor", opts, list(outputs), len(inputs), part)

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

    # --------------------------------------------------------------- alltoall

    def alltoall(self, output_tensors: List[torch.Tensor], input_tensors: List[torch.Tensor], opts: Any = None) -> Work:
        """``torch.distributed.all_to_all``: rank r's output_tensors[s] gets
        rank s's input_tensors[r]."""
        opts = opts if opts is not None else dist.AllToAllOptions()
        outs, ins = list(output_tensors), list(input_tensors)
        if len(outs) != self._size or len(ins) != self._size:
            raise ValueError(f"hvdd: all_to_all: {len(ins)} inputs and {len(outs)} outputs for {self._size} ranks")

        def submit(name: str) -> List[Handle]:
            parts = [_flat(t) for t in ins]
            a = np.concatenate([p[0] for p in parts])
            return [
                _ops.submit_output(
                    self._client,
                    pb.OP_ALLTOALL,
                    a,
                    name,
                    self._ps,
                    with_splits=True,
                    wire=parts[0][1],
                    splits=[p[0].size for p in parts],
                )
            ]

        def finish(results: List[Any]) -> None:
            r, splits = results[0]
            off = 0
            for o, n in zip(outs, splits):
                if int(n) != _elems(o):
                    raise ValueError(f"all_to_all: a rank sent {int(n)} elements for an output tensor of {_elems(o)}")
                _write(o, r[off : off + int(n)])
                off += int(n)

        return self._run("all_to_all", opts, outs, submit, finish)

    def all_to_all_single(
        self,
        output: torch.Tensor,
        input: torch.Tensor,
        output_split_sizes: List[int],
        input_split_sizes: List[int],
        opts: Any = None,
    ) -> Work:
        """``torch.distributed.all_to_all_single``: the rows of input go to the
        ranks in input_split_sizes (equal parts when empty); output gets every
        rank's rows for this one, in rank order."""
        opts = opts if opts is not None else dist.AllToAllOptions()
        in_splits = [int(s) for s in input_split_sizes] if input_split_sizes else None
        out_splits = [int(s) for s in output_split_sizes] if output_split_sizes else None

        def submit(name: str) -> List[Handle]:
            x, a, wire = _host(input)
            if a.ndim == 0:
                a = a.reshape(1)
            if in_splits is None and a.shape[0] % self._size:
                raise ValueError(
                    f"hvdd: all_to_all_single: the input's {a.shape[0]} rows do not split evenly among {self._size} ranks"
                )
            return [
                _ops.submit_output(
                    self._client, pb.OP_ALLTOALL, a, name, self._ps, with_splits=True, wire=wire, splits=in_splits
                )
            ]

        def finish(results: List[Any]) -> None:
            r, splits = results[0]
            if out_splits is not None and [int(s) for s in splits] != out_splits:
                raise ValueError(
                    f"all_to_all_single: received {[int(s) for s in splits]} rows, output_split_sizes is {out_splits}"
                )
            if r.size != _elems(output):
                raise ValueError(f"all_to_all_single: received {r.size} elements for an output of {_elems(output)}")
            _write(output, r)

        return self._run("all_to_all_single", opts, [output], submit, finish)

    alltoall_base = all_to_all_single

    # ---------------------------------------------------------------- barrier

    def barrier(self, opts: Any = None) -> Work:
        """``torch.distributed.barrier``: done once every rank of the group has
        called it (a one-byte allreduce, so that a rank calling another
        collective instead is reported, not waited for)."""
        opts = opts if opts is not None else dist.BarrierOptions()
        one = np.ones(1, dtype=np.uint8)

        def submit(name: str) -> List[Handle]:
            return [_ops.submit_allreduce(self._client, one, name, int(Sum), ps=self._ps)]

        return self._run("barrier", opts, [], submit)

    def monitored_barrier(self, timeout: Optional[timedelta] = None, wait_all_ranks: bool = False) -> None:
        """``torch.distributed.monitored_barrier``: rank 0 waits for every other
        rank to arrive within timeout and raises naming the first (or with
        wait_all_ranks, every) rank that did not; the others wait for rank
        0's release. Through the store, as gloo's goes through its pairs."""
        t = timeout if not _unset(timeout) else self._timeout
        k = next(self._barriers)
        key = f"hvdd/monitored_barrier/{k}"
        self._store.set(f"{key}/arrived/{self._rank}", "1")
        start = time.monotonic()
        if self._rank == 0:
            missing = []
            for r in range(1, self._size):
                left = max(0.001, t.total_seconds() - (time.monotonic() - start))
                try:
                    self._store.wait([f"{key}/arrived/{r}"], timedelta(seconds=left))
                except Exception:
                    missing.append(r)
                    if not wait_all_ranks:
                        break
            ms = int(t.total_seconds() * 1000)
            if missing:
                if wait_all_ranks:
                    raise _BackendError(
                        f"hvdd: Ranks {', '.join(map(str, missing))} failed to pass monitoredBarrier in {ms} ms"
                    )
                raise _BackendError(f"hvdd: Rank {missing[0]} failed to pass monitoredBarrier in {ms} ms")
            self._store.set(f"{key}/released", "1")
            return None
        try:
            self._store.wait([f"{key}/released"], t)
        except Exception as e:
            raise _BackendError(
                f"hvdd: Rank {self._rank} was not released by rank 0 from monitoredBarrier within "
                f"{int(t.total_seconds() * 1000)} ms: {e}"
            ) from e
        return None

    # ---------------------------------------------------------- point to point

    def _p2p_work(self, what: str, tensors: Any, group_peer: int, tag: int, recv: bool) -> Work:
        """Sends one send or recv (``what``) of the group's rank group_peer
        and queues its completion on its channel (:class:`_Channel`). Bad
        arguments and a failed job raise here; the daemon's refusals (a send
        to this rank itself) and failures (the two tensors differ in dtype or
        size, the peer was lost) fail the work. The peer may be on another
        node."""
        if self._closed:
            raise RuntimeError(f"hvdd: {what} on a destroyed process group")
        tensors = list(tensors) if isinstance(tensors, (list, tuple)) else [tensors]
        if len(tensors) != 1:
            raise ValueError(f"hvdd: {what} takes one tensor, got {len(tensors)}")
        if not 0 <= group_peer < self._size:
            raise ValueError(
                f"hvdd: {what}: invalid peer rank {group_peer} for a group of {self._size} "
                f"(group ranks are 0..{self._size - 1})"
            )
        t = tensors[0]
        peer = self.global_ranks[group_peer]
        x, a, wire = _host(t)
        name = f"pt.{self._gid}.p2p.{next(self._p2p_seq)}"
        where = f"rank {peer}" if self._ps == 0 else f"group rank {group_peer} (global rank {peer})"
        desc = f"{what} {name!r} {'from' if recv else 'to'} {where}, tag {tag}"
        work = Work(desc, name, tensors, self._deadline(None))
        c = self._client
        with self._p2p_lock:
            key = (recv, peer, int(tag))
            ch = self._p2p.get(key)
            if ch is None:
                if len(self._p2p) >= _P2P_CHANNELS:
                    self._prune_p2p()
                ch = self._p2p[key] = _Channel(c, f"{self._gid}-{'r' if recv else 's'}{peer}-{tag}")
                _watchdog.add(ch)
            try:
                if recv:
                    own = _shares(x, t)
                    h = _ops.submit_recv(c, a, name, peer, tag, self._ps, out=a if own else None, wire=wire)
                    finish = None if own else (lambda r: _write(t, r[0]))
                else:
                    h = _ops.submit_send(c, a, name, peer, tag, self._ps, wire=wire)
                    finish = None
            except HvddInternalError as e:
                raise _error(desc, e) from e
            ch.put(_Pending(work, [h], finish))
        return work

    def send(self, tensors: List[torch.Tensor], dstRank: int, tag: int = 0) -> Work:
        """``torch.distributed.send``/``isend``: the tensor to the group's
        rank dstRank, matched there with the recv from this rank of the same
        tag, in their order. The tensor is copied when this is called; the
        work is done once the peer has it."""
        return self._p2p_work("send", tensors, dstRank, tag, recv=False)

    def recv(self, tensors: List[torch.Tensor], srcRank: int, tag: int = 0) -> Work:
        """``torch.distributed.recv``/``irecv``: the tensor filled in place with
        what the group's rank srcRank sends with the same tag (the same dtype
        and size, else both sides fail)."""
        return self._p2p_work("recv", tensors, srcRank, tag, recv=True)

    def recv_anysource(self, tensors: List[torch.Tensor], tag: int = 0) -> Work:
        """A recv from any source: not supported. torch learns the sender
        from the work's C++ ``sourceRank()``, and the holder torch wraps a
        Python backend's work in (``PyProcessGroup::PyWorkHolder``, torch
        2.15) forwards only ``wait`` and ``get_future``: a pure-Python
        backend cannot tell torch which rank sent."""
        raise NotImplementedError(
            "hvdd: recv/irecv from any source (without src=) is not supported: name the sending rank with src="
        )

    # --------------------------------------------------------------- shutdown

    def shutdown(self) -> None:
        """Ends the group (destroy_process_group): its completion thread stops;
        the default group's waits for every rank to destroy it (a barrier,
        at most the group's timeout) and closes the connection to the
        daemon, if the backend made it."""
        if self._closed:
            return
        if self._is_default and self._conn.owned:
            # The daemon ends the job when a rank leaves it: wait until every
            # rank has come to destroy_process_group, so that a rank's last
            # collectives on its subgroups are not cut short by another
            # leaving first (a rank that is lost or gone ends the wait).
            try:
                self.barrier().wait(self._timeout)
            except Exception as e:  # the job failed already: nothing to wait for
                log.debug("hvdd: the barrier of destroy_process_group: %s", e)
        self._closed = True
        self._completer.close()
        self._close_p2p()
        if self._is_default:
            conn = _startup.release()
            if conn is not None:
                conn.close()
        self._completer.join(5.0)

    def abort(self) -> None:
        """Ends the group at once: pending collectives fail."""
        self._closed = True
        self._completer.close()
        self._close_p2p()
        if self._is_default:
            conn = _startup.release()
            if conn is not None:
                conn.close()

    def _prune_p2p(self) -> None:
        """Drops the idle channels (nothing in flight, their thread gone),
        under _p2p_lock: a program that gives every transfer a tag of its
        own (a step number) keeps a bounded number (a later transfer on a
        dropped channel makes it anew)."""
        for key, ch in list(self._p2p.items()):
            with ch.lock:
                idle = not ch.running and not ch.queue
            if idle:
                del self._p2p[key]
                _watchdog.remove(ch)

    def _close_p2p(self) -> None:
        """Takes the group's point-to-point channels off the watchdog (works
        still in flight fail as the connection closes)."""
        with self._p2p_lock:
            for ch in self._p2p.values():
                _watchdog.remove(ch)
            self._p2p.clear()

    def _wait_for_pending_works(self) -> None:
        pass


# ------------------------------------------------------------- creating


def create_process_group(dist_backend_opts: Any, backend_options: Any = None) -> ProcessGroupHvdd:
    """torch's creator of ``hvdd`` groups (``register_backend(...,
    extended_api=True)``): the default group connects to the daemon; a
    subgroup runs on the process set registered for its ranks."""
    o = dist_backend_opts
    store, rank, size, timeout = o.store, int(o.group_rank), int(o.group_size), o.timeout
    ranks = [int(r) for r in (o.global_ranks_in_group or [])]
    is_default = not ranks
    if is_default:
        conn = _startup.connect(store, rank, size, timeout)
        ranks = list(range(size))
        ps = 0
    else:
        conn = _startup.connection()
        ps = conn.process_set(tuple(sorted(ranks)))
    return ProcessGroupHvdd(conn, store, rank, size, ranks, str(o.group_id), timeout, ps, is_default)


def register_subgroups() -> None:
    """Makes torch's new_group register the daemon's process set of an hvdd
    group on every rank, members or not (the daemon registers sets in a
    collective over the whole job, while torch makes a subgroup's backend
    on its members only)."""
    c10d = dist.distributed_c10d
    orig = c10d._new_process_group_helper
    if getattr(orig, "_hvdd", False):
        return

    def helper(group_size: int, group_rank: Any, global_ranks_in_group: List[int], backend: Any, *args: Any, **kw: Any):
        conn = _startup.current()
        if global_ranks_in_group and conn is not None and "hvdd" in str(backend).lower():
            local = bool(getattr(_local_sync, "on", False))
            conn.register_group(tuple(sorted(int(r) for r in global_ranks_in_group)), local=local)
        return orig(group_size, group_rank, global_ranks_in_group, backend, *args, **kw)

    helper._hvdd = True  # type: ignore[attr-defined]
    helper.__wrapped__ = orig  # type: ignore[attr-defined]
    c10d._new_process_group_helper = helper

    # new_group(use_local_synchronization=True) calls the helper on the
    # group's members only: they register the set among themselves.
    with_tag = c10d._new_group_with_tag
    sig = inspect.signature(with_tag)

    def new_group_with_tag(*args: Any, **kw: Any) -> Any:
        try:
            local = bool(sig.bind_partial(*args, **kw).arguments.get("use_local_synchronization", False))
        except TypeError:
            local = False  # torch reports the bad call itself
        before = getattr(_local_sync, "on", False)
        _local_sync.on = local
        try:
            return with_tag(*args, **kw)
        finally:
            _local_sync.on = before

    new_group_with_tag.__wrapped__ = with_tag  # type: ignore[attr-defined]
    c10d._new_group_with_tag = new_group_with_tag


# Whether the new_group running on this thread synchronises its members only
# (use_local_synchronization=True): register_subgroups.
_local_sync = threading.local()
