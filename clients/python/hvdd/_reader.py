"""The receiving side of the connection to the daemon: reading its frames
from the socket and the shared-memory channel, completing the handles they
answer, failing them all when the connection dies, and waiting.

Who reads when: whichever thread holds the read lock. A thread that waits
for a handle (:meth:`Reader.wait`, from ``Client.complete``) takes it and
reads inline: it polls the channel's ring for its spin window (50 µs by
default, adapting), then raises the channel's asleep flag and sleeps in a
blocking read of the socket until the daemon's next frame or Wake (without a
channel, it just reads the socket). The Done wakes the waiting thread itself,
with no hand-off between threads (which costs more than the rest of a small
op in CPython). While no thread waits, the background thread ``hvdd-reader``
holds the lock: it drains the ring, then sleeps in ``select`` on the socket
and a wake-up pipe (a second at a time), so that handles still complete for
``poll`` and a lost daemon is noticed. A waiter that finds it there writes to
the pipe, and takes the lock when it lets go.

The reader's state (the handle table ``pending`` and ``names``, ``failed``,
``closed``, the granted regions, the socket and channel it reads) is
written only here: the client reads it, and changes it through the
reader's methods (:meth:`Reader.expect` adds a handle, under ``lock``,
before the request is sent; :meth:`Reader.forget` takes it back when the
send fails; :meth:`Reader.attach`, :meth:`Reader.begin_close`,
:meth:`Reader.shut`).
"""

from __future__ import annotations

import _thread
import errno
import logging
import os
import socket
import struct
import threading
import time
from typing import Any, Callable, Optional

from ._channel import Channel, ChannelError, fence
from ._proto import hvdd_pb2 as pb
from ._shm import Region, Staging
from ._wire import (
    ANC_SIZE,
    DONE_OK,
    DUPLICATE_NAME_ERROR,
    HEADER,
    HEADER_SIZE,
    KIND_SERVER,
    KIND_WAKE,
    MAX_BODY,
    error_for,
)
from ._notifications import HostUpdateResult, notification_manager
from .exceptions import HvddInternalError

__all__ = ["Handle", "Reader"]

log = logging.getLogger(__name__)


def _adapt_spin(cur: float, base: float, slept: float) -> float:
    """The next spin window after sleeping ``slept`` seconds: an answer that
    came a little after the window widens it (to twice the gap, averaged, at
    most ten times the base), a long sleep restores the base. As Go's
    ``ipc.AdaptSpin``."""
    hi = 10 * base
    if slept < hi:
        return max(base, min(hi, (cur + 2 * slept) / 2))
    return base


class Handle:
    """One collective in flight. ``lock`` is held until the Done arrives."""

    __slots__ = (
        "id",
        "name",
        "lock",
        "done",
        "error",
        "region",
        "offset",
        "finish",
        "members",
        "free_on_done",
        "__weakref__",
    )

    def __init__(self, hid: int, name: str) -> None:
        self.id = hid
        self.name = name
        self.lock = _thread.allocate_lock()
        self.lock.acquire()
        self.done: Optional[Any] = None  # pb.Done, or None for a plain OK
        self.error: Optional[Exception] = None
        self.region: Optional[Region] = None  # staging allocation to free
        self.offset = -1
        # finish(handle) -> result, run once by the waiter on success.
        self.finish: Optional[Callable[["Handle"], Any]] = None
        self.members: Optional[list["Handle"]] = None  # grouped ops
        # Input staging that is not the result (allgather, alltoall,
        # reducescatter put theirs in a daemon region): freed at the Done, by
        # which the daemon has read every rank's input.
        self.free_on_done = False

    def poll(self) -> bool:
        if self.members is not None:
            return all(not m.lock.locked() for m in self.members)
        return not self.lock.locked()


class Reader:
    """Reads one connection's server frames and completes its handles.

    ``lock`` (the client's) guards ``pending``, ``names``, ``failed``,
    ``closed``, ``granted`` and the staging. ``sock`` and ``ch`` are set by
    the client once connected (and the channel registered). Reading happens
    under the read lock (see the module doc); :meth:`read_frame` and
    :meth:`grant` run without it only before :meth:`start`.
    """

    def __init__(self, lock: threading.Lock, staging: Staging, spin: float) -> None:
        self.lock = lock
        self.pending: dict[int, Handle] = {}  # by frame id
        self.names: set[str] = set()  # of the pending handles
        self.failed: Optional[Exception] = None  # once set, every request raises it
        self.closed = False  # the client called close()
        self.granted: dict[int, Region] = {}  # the daemon's regions, by id
        self.sock: Optional[socket.socket] = None
        self.ch: Optional[Channel] = None  # receiving under _rlock
        self.sock_dead = False
        self._staging = staging
        self._thread: Optional[threading.Thread] = None
        self._rlock = threading.Lock()  # held by the thread reading the socket
        self._waiters = 0  # threads in wait(), under lock
        self._wake_r, self._wake_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        self._rbuf = bytearray()
        self._rview = memoryview(bytearray(1 << 16))  # recvmsg_into target, reused
        self._rbufs = [self._rview]
        self._fds: list[int] = []
        self._sock_in = 0  # counted socket frames read since the channel
        # Spin-then-sleep while waiting: the window starts at spin seconds
        # and adapts (see _adapt_spin).
        self._spin_base = spin
        self._spin = spin

    # ------------------------------------------------- the client's requests

    def attach(self, sock: Optional[socket.socket] = None, ch: Optional[Channel] = None) -> None:
        """What the client connected: the socket (before :meth:`start`), then
        the channel once registered."""
        if sock is not None:
            self.sock = sock
        if ch is not None:
            self.ch = ch

    def detach_channel(self) -> None:
        """The client closes the channel: nothing reads it any more."""
        self.ch = None

    def check(self) -> None:
        """Raises the connection's failure, if any (caller holds lock)."""
        if self.failed is not None:
            raise self.failed

    def expect(self, h: Handle) -> None:
        """Adds h to the handle table before its request is sent (caller holds
        lock): its Done completes it. Raises instead the connection's
        failure, or Horovod's duplicate-name ValueError when a pending
        handle has h's name."""
        err = self.failed
        name = h.name
        if err is None and name and name in self.names:
            err = ValueError(DUPLICATE_NAME_ERROR + f" (tensor {name!r})")
        if err is not None:
            raise err
        self.pending[h.id] = h
        if name:
            self.names.add(name)

    def forget(self, h: Handle) -> None:
        """Takes h back out of the table: its request could not be sent
        (caller holds lock). Nothing when it is gone already (failed)."""
        if self.pending.pop(h.id, None) is not None and h.name:
            self.names.discard(h.name)

    def region(self, rid: int) -> Optional[Region]:
        """The granted region rid, or None (caller holds lock)."""
        return self.granted.get(rid)

    def begin_close(self) -> bool:
        """Marks the connection closed by the client (caller holds lock):
        what is pending then fails as shut down. False when it was already."""
        if self.closed:
            return False
        self.closed = True
        return True

    def shut(self, err: Exception) -> None:
        """The client tore the connection down: every later request raises
        err, unless a failure was recorded before (caller holds lock)."""
        if self.failed is None:
            self.failed = err

    # ------------------------------------------------------------ the socket

    def _fill(self, nowait: bool = False) -> bool:
        """Reads more bytes from the socket; with nowait, returns False when
        none are there instead of blocking."""
        assert self.sock is not None
        try:
            n, anc, flags, _ = self.sock.recvmsg_into(self._rbufs, ANC_SIZE, socket.MSG_DONTWAIT if nowait else 0)
        except BlockingIOError:
            return False
        if anc:
            for level, typ, cdata in anc:
                if level == socket.SOL_SOCKET and typ == socket.SCM_RIGHTS:
                    k = len(cdata) - len(cdata) % 4
                    self._fds.extend(struct.unpack(f"{k // 4}i", cdata[:k]))
        if flags & socket.MSG_CTRUNC:
            raise HvddInternalError("hvdd: too many descriptors in one message from the daemon", pb.CODE_PROTOCOL)
        if not n:
            raise EOFError
        self._rbuf += self._rview[:n]
        return True

    def read_frame(self) -> tuple[int, bytes]:
        """Reads one frame from the socket (blocking): (id, body), the body
        empty for a Wake."""
        buf = self._rbuf
        while len(buf) < HEADER_SIZE:
            self._fill()
            buf = self._rbuf
        magic, kind, flags, fid, n = HEADER.unpack_from(buf)
        if magic != b"HV" or kind not in (KIND_SERVER, KIND_WAKE) or flags != 0 or n > MAX_BODY:
            raise HvddInternalError(
                f"hvdd: protocol error: bad frame header from the daemon ({bytes(buf[:HEADER_SIZE])!r})",
                pb.CODE_PROTOCOL,
            )
        total = HEADER_SIZE + n
        while len(buf) < total:
            self._fill()
            buf = self._rbuf
        body = bytes(buf[HEADER_SIZE:total]) if kind == KIND_SERVER else b""
        del buf[:total]
        return fid, body

    def grant(self, g: Any) -> None:
        """Maps a region the daemon granted (GrantRegion), with the descriptor
        that came with it."""
        if not self._fds:
            raise HvddInternalError("hvdd: protocol error: GrantRegion without a descriptor", pb.CODE_PROTOCOL)
        fd = self._fds.pop(0)
        r = Region.open(g.region, g.size, fd)
        r.close_fd()
        with self.lock:
            self.granted[g.region] = r

    # ------------------------------------------------------------ dispatching

    def _dispatch(self, fid: int, body: bytes) -> None:
        """Handles one server frame read after Welcome."""
        if body == DONE_OK:
            done = None
        else:
            m = pb.ServerMessage()
            m.ParseFromString(body)
            kind = m.WhichOneof("msg")
            if kind == "grant_region":
                self.grant(m.grant_region)
                return
            if kind == "fatal":
                raise error_for(m.fatal.code, m.fatal.error or "hvdd: the daemon closed the connection")
            if kind == "hosts_updated":
                u = m.hosts_updated
                notification_manager.handle_hosts_updated(u.timestamp, HostUpdateResult(u.result))
                return
            if kind != "done":
                log.warning("hvdd: ignoring unexpected %s from the daemon", kind)
                return
            done = m.done
        ok = done is None or done.code == pb.CODE_OK
        with self.lock:
            h = self.pending.pop(fid, None)
            if h is not None:
                self.names.discard(h.name)
                if h.free_on_done and h.region is not None:
                    self._staging.free(h.region, h.offset)
                    h.region = None
        if h is None:
            log.warning("hvdd: Done for unknown handle %d", fid)
            return
        if not ok:
            h.error = error_for(done.code, done.error)  # type: ignore[union-attr]
        h.done = done
        h.lock.release()

    def _dispatch_sock(self, fid: int, body: bytes) -> None:
        """Handles a frame read from the socket: a Wake (empty body) only
        wakes; others count for the channel's order."""
        if not body:
            return
        self._sock_in += 1
        self._dispatch(fid, body)

    def _dispatch_buffered(self) -> bool:
        """Dispatches every complete frame already in the read buffer."""
        buf = self._rbuf
        got = False
        while len(buf) >= HEADER_SIZE:
            n = HEADER.unpack_from(buf)[4]
            if len(buf) < HEADER_SIZE + n:
                break
            fid, body = self.read_frame()
            self._dispatch_sock(fid, body)
            got = True
        return got

    def _take(self) -> bool:
        """Dispatches what the channel holds, after the socket frames the
        daemon counted before it (already in the socket: read blocking).
        Caller holds _rlock."""
        ch = self.ch
        if ch is None:
            return False
        got = False
        want = ch.snapshot()
        while self._sock_in < want:
            fid, body = self.read_frame()
            self._dispatch_sock(fid, body)
            got = True
        while True:
            f = ch.next()
            if f is None:
                return got
            kind, fid, body = f
            if kind == KIND_SERVER:
                self._dispatch(fid, body)
            got = True

    def _sleep_ok(self) -> bool:
        """Raises the asleep flag and tells whether sleeping on the socket is
        safe (nothing arrived on the ring meanwhile); lowers it if not."""
        ch = self.ch
        if ch is None:
            return True
        ch.set_asleep(True)
        fence()  # the flag's store before the head's load
        if ch.pending():
            ch.set_asleep(False)
            return False
        return True

    # ---------------------------------------------------------------- failure

    def fail(self, e: BaseException) -> None:
        """The connection is unusable: fails every pending handle, once."""
        with self.lock:
            if self.failed is not None and not self.pending:
                return
            if self.closed:
                err: Exception = HvddInternalError(
                    "Horovod has been shut down: this process called shutdown() while collectives were in flight.",
                    pb.CODE_SHUT_DOWN,
                )
            elif isinstance(e, EOFError):
                err = HvddInternalError("hvdd: the daemon closed the connection (did it exit?)", pb.CODE_SHUT_DOWN)
            elif isinstance(e, ChannelError):
                err = HvddInternalError(f"hvdd: protocol error: {e}", pb.CODE_PROTOCOL)
            elif isinstance(e, OSError):
                err = HvddInternalError(f"hvdd: connection to the daemon failed: {e}", pb.CODE_SHUT_DOWN)
            elif isinstance(e, Exception):
                err = (
                    e
                    if isinstance(e, (HvddInternalError, ValueError))
                    else HvddInternalError(f"hvdd: reader failed: {e!r}")
                )
            else:
                err = HvddInternalError(f"hvdd: reader interrupted: {e!r}")
            if self.failed is None:
                self.failed = err
            err = self.failed
            pend = list(self.pending.values())
            self.pending.clear()
            self.names.clear()
        if pend:
            log.debug("hvdd: failing %d pending collectives: %s", len(pend), err)
        for h in pend:
            h.error = err
            h.lock.release()

    # ---------------------------------------------------------------- waiting

    def wait(self, h: Handle) -> None:
        """Blocks until h's Done has been dispatched, reading the socket in this
        thread whenever no other thread is."""
        with self.lock:
            self._waiters += 1
        try:
            rlock = self._rlock
            while h.lock.locked():
                if not rlock.acquire(blocking=False):
                    # The background reader (or another waiter) is reading:
                    # make the background reader let go, then queue for it.
                    os.write(self._wake_w, b"x")
                    while not rlock.acquire(timeout=1.0):
                        if not h.lock.locked():
                            return
                try:
                    ch = self.ch
                    spin = self._spin
                    end = time.perf_counter() + spin
                    while h.lock.locked():
                        if self.failed is not None and self.sock_dead:
                            self.fail(EOFError())
                            break
                        try:
                            if ch is None:
                                fid, body = self.read_frame()
                                self._dispatch(fid, body)
                                continue
                            if self._take() or self._dispatch_buffered():
                                end = time.perf_counter() + spin
                                continue
                            if time.perf_counter() < end:
                                os.sched_yield()
                                continue
                            if not self._sleep_ok():
                                continue
                            slept = time.perf_counter()
                            try:
                                fid, body = self.read_frame()
                            finally:
                                ch.set_asleep(False)
                            self._spin = spin = _adapt_spin(spin, self._spin_base, time.perf_counter() - slept)
                            self._dispatch_sock(fid, body)
                            end = time.perf_counter() + spin
                        except BaseException as e:
                            self.sock_dead = True
                            self.fail(e)
                            if not isinstance(e, Exception):
                                raise
                            break
                finally:
                    rlock.release()
        finally:
            with self.lock:
                self._waiters -= 1

    # ------------------------------------------------- the background reader

    def start(self) -> None:
        """Starts the background reader (once connected)."""
        self._thread = threading.Thread(target=self._background, name="hvdd-reader", daemon=True)
        self._thread.start()

    def _background(self) -> None:
        """Reads while no caller waits; exits once the connection is dead."""
        import select

        sock, wake_r, rlock = self.sock, self._wake_r, self._rlock
        while not self.sock_dead:
            if self._waiters:
                # Callers read for themselves; check back now and then. (A
                # waiter that left does not wake this thread: it would take
                # the read lock, and the next blocking op would have to wake
                # it back out of select with a write to the wake pipe.)
                time.sleep(0.05)
                continue
            if not rlock.acquire(timeout=0.05):
                continue
            try:
                if self._waiters or self.sock_dead:
                    continue
                try:
                    self._dispatch_buffered()
                    if self._take() or not self._sleep_ok():
                        continue
                    try:
                        r, _, _ = select.select([sock, wake_r], [], [], 1.0)
                    finally:
                        if self.ch is not None:
                            self.ch.set_asleep(False)
                    if wake_r in r:
                        os.read(wake_r, 4096)
                    if sock in r:
                        self._fill()
                        self._dispatch_buffered()
                    self._take()
                except BaseException as e:
                    self.sock_dead = True
                    self.fail(e)
            finally:
                rlock.release()

    def stop(self) -> None:
        """After the socket's shutdown: lets the background reader see it and
        waits for it to end (not from the reader itself), then fails what is
        still pending (as shut down, once ``closed`` is set)."""
        try:
            os.write(self._wake_w, b"x")
        except OSError:
            pass
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=10)
        self.sock_dead = True
        self.fail(EOFError())

    def close(self) -> None:
        """Closes the wake-up pipe, the granted regions and descriptors that
        came with no GrantRegion. The socket and channel are the client's."""
        for fd in (self._wake_r, self._wake_w):
            try:
                os.close(fd)
            except OSError:
                pass
        self._wake_r = self._wake_w = -1
        with self.lock:
            for r in self.granted.values():
                r.close()
            self.granted.clear()
        for fd in self._fds:
            try:
                os.close(fd)
            except OSError as e:
                if e.errno != errno.EBADF:
                    raise
        self._fds.clear()
