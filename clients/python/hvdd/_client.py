"""The connection to the node's hvdd daemon: framing, regions, handles.

One :class:`Client` per process speaks ``ipc/PROTOCOL.md``: it sends Hello,
registers a sparse memfd arena, waits for Welcome, then enqueues collectives
whose tensors it stages in the arena. A single reader thread receives every
server frame and completes the matching :class:`Handle`. The client holds no
collective logic: names, dtypes and shapes go to the daemon, which matches them
across ranks and reports disagreements.
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
from typing import Any, Callable, Optional, Sequence

import numpy as np

from ._channel import DEFAULT_RING, Channel, ChannelError, channel_bytes, fence
from ._proto import hvdd_pb2 as pb
from ._shm import Arena, Region
from .exceptions import HvddInternalError, HvddUnimplementedError

__all__ = ["Client", "Handle", "PROTOCOL_VERSION", "default_socket_path"]

log = logging.getLogger(__name__)

PROTOCOL_VERSION = 1
_HEADER = struct.Struct("<2sBBII")
_HEADER_SIZE = 12
_MAX_BODY = 4 << 20
_MAX_FDS = 16
_KIND_CLIENT = 1
_KIND_SERVER = 2
_KIND_WAKE = 3
_WAKE = _HEADER.pack(b"HV", _KIND_WAKE, 0, 0, 0)
_GRANTED_BASE = 0x80000000
_ANC_SIZE = socket.CMSG_SPACE(_MAX_FDS * 4)
_DONE_OK = b"\x1a\x00"  # ServerMessage{done: Done{}}: the common reply, parsed without protobuf.

OP_NAMES = {
    pb.OP_ALLREDUCE: "allreduce",
    pb.OP_ALLGATHER: "allgather",
    pb.OP_BROADCAST: "broadcast",
    pb.OP_ALLTOALL: "alltoall",
    pb.OP_REDUCESCATTER: "reducescatter",
    pb.OP_BARRIER: "barrier",
    pb.OP_JOIN: "join",
}

DUPLICATE_NAME_ERROR = (
    "Requested to allreduce, allgather, or broadcast a tensor with the same name as another tensor "
    "that is currently being processed.  If you want to request another tensor, use a different tensor name."
)


_F64 = struct.Struct("<d")
_SMALL = [bytes((i,)) for i in range(0x80)]


def _varint(v: int) -> bytes:
    """Protobuf base-128 varint of v (negative int32/int64 as 64-bit two's
    complement, as protobuf encodes them)."""
    if 0 <= v < 0x80:
        return _SMALL[v]
    if v < 0:
        v += 1 << 64
    out = bytearray()
    while v >= 0x80:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)
    return bytes(out)


def encode_enqueue(
    op: int,
    name: str,
    dtype: int,
    shape: Sequence[int],
    region: int,
    offset: int,
    nbytes: int,
    reduce_op: int,
    prescale: float,
    postscale: float,
    root_rank: int,
    splits: Optional[Sequence[int]],
    group: int,
    group_size: int,
    process_set: int,
) -> bytes:
    """The body of ``ClientMessage{enqueue: Enqueue{...}}``, encoded by hand:
    the same bytes protobuf writes (fields in number order, defaults left
    out), at a third of the cost of filling a message in Python. Checked
    against the generated code in tests/test_units.py. A training loop sends
    the same tensors every step: the fields around the buffer are cached."""
    v = _varint
    key = (
        op,
        name,
        dtype,
        tuple(shape),
        reduce_op,
        prescale,
        postscale,
        root_rank,
        tuple(splits) if splits else None,
        group,
        group_size,
        process_set,
    )
    cached = _enqueue_cache.get(key)
    if cached is None:
        cached = _enqueue_fields(*key)
        if len(_enqueue_cache) >= 4096:
            _enqueue_cache.clear()
        _enqueue_cache[key] = cached
    head, tail = cached
    if nbytes:
        buf = (b"\x08" + v(region) if region else b"") + (b"\x10" + v(offset) if offset else b"") + b"\x18" + v(nbytes)
        e = b"".join((head, b"\x2a", v(len(buf)), buf, tail))
    else:
        e = head + tail
    return b"\x22" + v(len(e)) + e


_enqueue_cache: dict[tuple, tuple[bytes, bytes]] = {}


def _enqueue_fields(
    op: int,
    name: str,
    dtype: int,
    shape: Sequence[int],
    reduce_op: int,
    prescale: float,
    postscale: float,
    root_rank: int,
    splits: Optional[Sequence[int]],
    group: int,
    group_size: int,
    process_set: int,
) -> tuple[bytes, bytes]:
    """The Enqueue fields before the buffer (1-4) and after it (6-13)."""
    v = _varint
    parts = []
    if name:
        b = name.encode()
        parts += (b"\x0a", v(len(b)), b)
    if op:
        parts += (b"\x10", v(op))
    if dtype:
        parts += (b"\x18", v(dtype))
    if shape:
        p = b"".join([v(d) for d in shape])
        parts += (b"\x22", v(len(p)), p)
    head = b"".join(parts)
    parts = []
    if reduce_op:
        parts += (b"\x30", v(reduce_op))
    if prescale != 1.0 and prescale != 0.0:
        parts += (b"\x39", _F64.pack(prescale))
    if postscale != 1.0 and postscale != 0.0:
        parts += (b"\x41", _F64.pack(postscale))
    if root_rank:
        parts += (b"\x48", v(root_rank))
    if splits:
        p = b"".join([v(s) for s in splits])
        parts += (b"\x52", v(len(p)), p)
    if group:
        parts += (b"\x58", v(group), b"\x60", v(group_size))
    if process_set:
        parts += (b"\x68", v(process_set))
    return head, b"".join(parts)


def _adapt_spin(cur: float, base: float, slept: float) -> float:
    """The next spin window after sleeping ``slept`` seconds: an answer that
    came a little after the window widens it (to twice the gap, averaged, at
    most ten times the base), a long sleep restores the base. As the daemon's
    ``adaptSpin``."""
    hi = 10 * base
    if slept < hi:
        return max(base, min(hi, (cur + 2 * slept) / 2))
    return base


def default_socket_path() -> str:
    """$HVDD_SOCKET, else the daemon's default (as ``ipc.SocketPath``)."""
    s = os.environ.get("HVDD_SOCKET")
    if s:
        return s
    if os.geteuid() == 0:
        return "/run/hvdd/hvdd.sock"
    d = os.environ.get("XDG_RUNTIME_DIR")
    if d:
        return os.path.join(d, "hvdd.sock")
    import tempfile

    return os.path.join(tempfile.gettempdir(), f"hvdd-{os.getuid()}", "hvdd.sock")


def _requested_local_rank() -> int:
    for k in ("HVDD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID"):
        v = os.environ.get(k)
        if v:
            try:
                return int(v)
            except ValueError:
                log.warning("ignoring non-integer %s=%r", k, v)
    return -1


def error_for(code: int, message: str) -> Exception:
    """Maps a protocol error code to the exception Horovod would raise."""
    if code == pb.CODE_DUPLICATE_NAME:
        return ValueError(message or DUPLICATE_NAME_ERROR)
    if code == pb.CODE_UNIMPLEMENTED:
        return HvddUnimplementedError(message, code)
    return HvddInternalError(message, code)


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


class _Staging:
    __slots__ = ("region", "arena")

    def __init__(self, region: Region) -> None:
        self.region = region
        self.arena = Arena(region.size)


class Client:
    """A connection to the local hvdd daemon."""

    def __init__(
        self,
        socket_path: Optional[str] = None,
        local_rank: Optional[int] = None,
        arena_size: Optional[int] = None,
        start_timeout: Optional[float] = None,
        client_name: str = "python",
    ) -> None:
        self.socket_path = socket_path or default_socket_path()
        self.requested_local_rank = _requested_local_rank() if local_rank is None else local_rank
        if arena_size is None:
            arena_size = int(os.environ.get("HVDD_ARENA_SIZE", 256 << 20))
        self.arena_size = arena_size
        if start_timeout is None:
            start_timeout = float(os.environ.get("HVDD_START_TIMEOUT", "120"))
        self.start_timeout = start_timeout
        self.client_name = client_name
        self.welcome: Any = None
        self._sock: Optional[socket.socket] = None
        self._wlock = threading.Lock()  # serialises writes and the cached message
        self._lock = threading.Lock()  # guards what follows
        self._pending: dict[int, Handle] = {}
        self._names: set[str] = set()
        self._next_id = 0
        self._staging: list[_Staging] = []
        self._granted: dict[int, Region] = {}
        self._next_region = 0
        self._failed: Optional[Exception] = None
        self._closed = False
        self._reader: Optional[threading.Thread] = None
        self._rlock = threading.Lock()  # held by the thread reading the socket
        self._waiters = 0  # threads in complete(), under _lock
        self._idle = threading.Event()
        self._sock_dead = False
        self._wake_r, self._wake_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        self._rbuf = bytearray()
        self._rview = memoryview(bytearray(1 << 16))  # recvmsg_into target, reused
        self._rbufs = [self._rview]
        self._fds: list[int] = []
        # The shared-memory channel (ipc/PROTOCOL.md, "Channel"): sending under
        # _wlock, receiving under _rlock.
        self._ch: Optional[Channel] = None
        self._sock_in = 0  # counted socket frames read since the channel
        # Spin-then-sleep while waiting: the window starts at HVDD_SPIN_US
        # and adapts (see _adapt_spin).
        self._spin_base = float(os.environ.get("HVDD_SPIN_US", "50")) * 1e-6
        self._spin = self._spin_base

    # ------------------------------------------------------------------ setup

    def connect(self) -> None:
        """Connects, registers the arena and waits for the whole job to form."""
        deadline = time.monotonic() + self.start_timeout
        sock = self._dial(deadline)
        self._sock = sock
        try:
            hello = pb.ClientMessage()
            h = hello.hello
            h.version = PROTOCOL_VERSION
            h.pid = os.getpid()
            h.local_rank = self.requested_local_rank
            h.client = self.client_name
            try:
                self._write(0, hello.SerializeToString())
                self._add_staging(self.arena_size)
            except OSError:
                self._raise_refusal()
                raise
            sock.settimeout(max(0.001, deadline - time.monotonic()))
            while True:
                try:
                    fid, body = self._read_frame()
                except socket.timeout:
                    raise HvddInternalError(
                        f"hvdd: init: the job did not form within {self.start_timeout:g} s "
                        "(HVDD_START_TIMEOUT): are all ranks started, and is the daemon's --slots right?"
                    ) from None
                m = pb.ServerMessage()
                m.ParseFromString(body)
                kind = m.WhichOneof("msg")
                if kind == "welcome":
                    self.welcome = m.welcome
                    break
                if kind == "fatal":
                    raise error_for(m.fatal.code, f"hvdd: the daemon refused this process: {m.fatal.error}")
                if kind == "grant_region":
                    self._grant(m.grant_region)
                    continue
                raise HvddInternalError(f"hvdd: unexpected {kind} before Welcome")
            sock.settimeout(None)
            if os.environ.get("HVDD_CHANNEL", "1") != "0":
                self._open_channel()
        except BaseException:
            self._teardown()
            raise
        self._reader = threading.Thread(target=self._background_reader, name="hvdd-reader", daemon=True)
        self._reader.start()
        log.debug(
            "hvdd: joined job %d as rank %d of %d (daemon %s)",
            self.welcome.job_id,
            self.welcome.rank,
            self.welcome.size,
            self.welcome.daemon_version,
        )

    def _dial(self, deadline: float) -> socket.socket:
        delay = 0.005
        while True:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
            try:
                s.connect(self.socket_path)
                return s
            except OSError as e:
                s.close()
                if time.monotonic() >= deadline:
                    raise HvddInternalError(
                        f"hvdd: cannot reach the daemon at {self.socket_path}: {e} "
                        "(start one with `hvdd serve --slots N`, run under `hvdd run`, or set HVDD_SOCKET)"
                    ) from e
            time.sleep(delay)
            delay = min(2 * delay, 0.2)

    def _open_channel(self) -> None:
        """Creates and registers the channel. Runs after Welcome and before
        any request, so that the daemon sends nothing on the socket between
        the registration and the first frame it counts."""
        ring = int(os.environ.get("HVDD_RING_BYTES", DEFAULT_RING))
        r = Region.create(-1, channel_bytes(ring), f"hvdd-chan-{os.getpid()}")
        try:
            ch = Channel(r, ring)
            m = pb.ClientMessage()
            m.register_channel.size = r.size
            self._write(0, m.SerializeToString(), fd=r.fd)
        except BaseException:
            r.close()
            raise
        r.close_fd()
        self._ch = ch

    def _raise_refusal(self) -> None:
        """Raises the daemon's reason for refusing this process, if it sent one
        before closing the connection: a write of the handshake that fails
        because the daemon has closed the connection races with reading its
        Fatal, which waits unread in the socket. Returns when there is none."""
        assert self._sock is not None
        self._sock.settimeout(1.0)  # the daemon has closed: data or EOF at once
        while True:
            try:
                _, body = self._read_frame()
            except (OSError, EOFError, HvddInternalError):
                return
            m = pb.ServerMessage()
            m.ParseFromString(body)
            if m.WhichOneof("msg") == "fatal":
                raise error_for(m.fatal.code, f"hvdd: the daemon refused this process: {m.fatal.error}") from None

    def _add_staging(self, size: int) -> _Staging:
        """Creates and registers a staging region. Callers hold _lock (or run
        before the reader starts)."""
        r = Region.create(self._next_region, size, f"hvdd-client-{os.getpid()}")
        self._next_region += 1
        m = pb.ClientMessage()
        m.register_region.region = r.id
        m.register_region.size = size
        try:
            self._write(0, m.SerializeToString(), fd=r.fd)
        except BaseException:
            r.close()
            raise
        r.close_fd()  # the daemon holds its own reference; the mapping stays
        st = _Staging(r)
        self._staging.append(st)
        return st

    # ---------------------------------------------------------------- framing

    def _write(self, fid: int, body: bytes, fd: int = -1) -> None:
        data = _HEADER.pack(b"HV", _KIND_CLIENT, 0, fid, len(body)) + body
        with self._wlock:
            self._send_locked(data, fd)

    def _send_locked(self, data: bytes, fd: int = -1) -> None:
        """Sends one frame, under _wlock: through the channel when there is one
        and the frame carries no descriptor (waiting for room if the ring is
        full), else on the socket once the daemon has drained the ring, so that
        it sees the frames in the order they were sent."""
        sock = self._sock
        if sock is None:
            raise HvddInternalError("hvdd: not connected", pb.CODE_SHUT_DOWN)
        ch = self._ch
        if ch is not None and fd < 0 and len(data) <= ch.max_frame:
            while not ch.send(data):
                self._wait_ring(lambda: ch.room(len(data)))
            fence()  # the head store before the load of the daemon's flag
            if ch.daemon_asleep():
                sock.sendall(_WAKE)
            return
        if ch is not None:
            self._wait_ring(ch.empty)
        if fd >= 0:
            n = socket.send_fds(sock, [data], [fd])
            if n < len(data):
                sock.sendall(data[n:])
        else:
            sock.sendall(data)
        if ch is not None:
            ch.socket_sent()

    def _wait_ring(self, cond: Callable[[], bool]) -> None:
        """Waits until cond holds of the ring the daemon drains: yielding at
        first, then a millisecond at a time while watching for the daemon's
        end of the socket."""
        import select

        i = 0
        while not cond():
            i += 1
            if i < 1000:
                os.sched_yield()
                continue
            p = select.poll()
            p.register(self._sock, select.POLLRDHUP)
            if p.poll(1):
                raise HvddInternalError("hvdd: the daemon closed the connection (did it exit?)", pb.CODE_SHUT_DOWN)

    def _fill(self, nowait: bool = False) -> bool:
        """Reads more bytes from the socket; with nowait, returns False when
        none are there instead of blocking."""
        assert self._sock is not None
        try:
            n, anc, flags, _ = self._sock.recvmsg_into(self._rbufs, _ANC_SIZE, socket.MSG_DONTWAIT if nowait else 0)
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

    def _read_frame(self) -> tuple[int, bytes]:
        buf = self._rbuf
        while len(buf) < _HEADER_SIZE:
            self._fill()
            buf = self._rbuf
        magic, kind, flags, fid, n = _HEADER.unpack_from(buf)
        if magic != b"HV" or kind not in (_KIND_SERVER, _KIND_WAKE) or flags != 0 or n > _MAX_BODY:
            raise HvddInternalError(
                f"hvdd: protocol error: bad frame header from the daemon ({bytes(buf[:_HEADER_SIZE])!r})",
                pb.CODE_PROTOCOL,
            )
        total = _HEADER_SIZE + n
        while len(buf) < total:
            self._fill()
            buf = self._rbuf
        body = bytes(buf[_HEADER_SIZE:total]) if kind == _KIND_SERVER else b""
        del buf[:total]
        return fid, body

    def _grant(self, g: Any) -> None:
        if not self._fds:
            raise HvddInternalError("hvdd: protocol error: GrantRegion without a descriptor", pb.CODE_PROTOCOL)
        fd = self._fds.pop(0)
        r = Region.open(g.region, g.size, fd)
        r.close_fd()
        with self._lock:
            self._granted[g.region] = r

    # ------------------------------------------------------------- reading
    #
    # Whoever holds _rlock reads the socket. A thread waiting for a handle
    # (complete) takes it and reads inline: the Done wakes the waiting thread
    # itself, with no hand-off between threads (which costs more than the rest
    # of a small op in CPython). When nobody waits, the background reader
    # thread holds it, so that handles still complete (poll) and a lost daemon
    # is noticed; a waiter that finds it there pokes it through a pipe.

    def _dispatch(self, fid: int, body: bytes) -> None:
        """Handles one server frame read after Welcome."""
        if body == _DONE_OK:
            done = None
        else:
            m = pb.ServerMessage()
            m.ParseFromString(body)
            kind = m.WhichOneof("msg")
            if kind == "grant_region":
                self._grant(m.grant_region)
                return
            if kind == "fatal":
                raise error_for(m.fatal.code, m.fatal.error or "hvdd: the daemon closed the connection")
            if kind != "done":
                log.warning("hvdd: ignoring unexpected %s from the daemon", kind)
                return
            done = m.done
        ok = done is None or done.code == pb.CODE_OK
        with self._lock:
            h = self._pending.pop(fid, None)
            if h is not None:
                self._names.discard(h.name)
                if h.free_on_done and h.region is not None:
                    self._free_locked(h.region, h.offset)
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
        while len(buf) >= _HEADER_SIZE:
            n = _HEADER.unpack_from(buf)[4]
            if len(buf) < _HEADER_SIZE + n:
                break
            fid, body = self._read_frame()
            self._dispatch_sock(fid, body)
            got = True
        return got

    def _take(self) -> bool:
        """Dispatches what the channel holds, after the socket frames the
        daemon counted before it (already in the socket: read blocking).
        Caller holds _rlock."""
        ch = self._ch
        if ch is None:
            return False
        got = False
        want = ch.snapshot()
        while self._sock_in < want:
            fid, body = self._read_frame()
            self._dispatch_sock(fid, body)
            got = True
        while True:
            f = ch.next()
            if f is None:
                return got
            kind, fid, body = f
            if kind == _KIND_SERVER:
                self._dispatch(fid, body)
            got = True

    def _sleep_ok(self) -> bool:
        """Raises the asleep flag and tells whether sleeping on the socket is
        safe (nothing arrived on the ring meanwhile); lowers it if not."""
        ch = self._ch
        if ch is None:
            return True
        ch.set_asleep(True)
        fence()  # the flag's store before the head's load
        if ch.pending():
            ch.set_asleep(False)
            return False
        return True

    def _fail(self, e: BaseException) -> None:
        """The connection is unusable: fails every pending handle, once."""
        with self._lock:
            if self._failed is not None and not self._pending:
                return
            if self._closed:
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
            if self._failed is None:
                self._failed = err
            err = self._failed
            pend = list(self._pending.values())
            self._pending.clear()
            self._names.clear()
        if pend:
            log.debug("hvdd: failing %d pending collectives: %s", len(pend), err)
        for h in pend:
            h.error = err
            h.lock.release()

    def _wait_inline(self, h: Handle) -> None:
        """Blocks until h's Done has been dispatched, reading the socket in this
        thread whenever no other thread is."""
        with self._lock:
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
                    ch = self._ch
                    spin = self._spin
                    end = time.perf_counter() + spin
                    while h.lock.locked():
                        if self._failed is not None and self._sock_dead:
                            self._fail(EOFError())
                            break
                        try:
                            if ch is None:
                                fid, body = self._read_frame()
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
                                fid, body = self._read_frame()
                            finally:
                                ch.set_asleep(False)
                            self._spin = spin = _adapt_spin(spin, self._spin_base, time.perf_counter() - slept)
                            self._dispatch_sock(fid, body)
                            end = time.perf_counter() + spin
                        except BaseException as e:
                            self._sock_dead = True
                            self._fail(e)
                            if not isinstance(e, Exception):
                                raise
                            break
                finally:
                    rlock.release()
        finally:
            with self._lock:
                self._waiters -= 1

    def _background_reader(self) -> None:
        """Reads while no caller waits; exits once the connection is dead."""
        import select

        sock, wake_r, rlock = self._sock, self._wake_r, self._rlock
        while not self._sock_dead:
            if self._waiters:
                # Callers read for themselves; check back now and then.
                self._idle.wait(0.05)
                self._idle.clear()
                continue
            if not rlock.acquire(timeout=0.05):
                continue
            try:
                if self._waiters or self._sock_dead:
                    continue
                try:
                    self._dispatch_buffered()
                    if self._take() or not self._sleep_ok():
                        continue
                    try:
                        r, _, _ = select.select([sock, wake_r], [], [], 1.0)
                    finally:
                        if self._ch is not None:
                            self._ch.set_asleep(False)
                    if wake_r in r:
                        os.read(wake_r, 4096)
                    if sock in r:
                        self._fill()
                        self._dispatch_buffered()
                    self._take()
                except BaseException as e:
                    self._sock_dead = True
                    self._fail(e)
            finally:
                rlock.release()

    # ------------------------------------------------------------- operations

    def stage(self, nbytes: int) -> tuple[Region, int]:
        """Reserves ``nbytes`` of shared memory; returns (region, offset)."""
        with self._lock:
            if self._failed is not None:
                raise self._failed
            for st in self._staging:
                off = st.arena.alloc(nbytes)
                if off >= 0:
                    return st.region, off
            page = 4096
            size = max(self.arena_size, (nbytes + page - 1) // page * page)
            log.info("hvdd: staging arena full, registering another region of %d bytes", size)
            st = self._add_staging(size)
            off = st.arena.alloc(nbytes)
            return st.region, off

    def unstage(self, region: Region, offset: int) -> None:
        with self._lock:
            for st in self._staging:
                if st.region is region:
                    st.arena.free(offset)
                    return

    def view(self, region: Region, offset: int, nbytes: int) -> np.ndarray:
        """A uint8 view of nbytes of a staging region."""
        return region.array[offset : offset + nbytes]

    def output(self, buf: Any) -> np.ndarray:
        """A uint8 view of a daemon output buffer (a Done's ``output``)."""
        if buf.length == 0:
            return np.empty(0, dtype=np.uint8)
        with self._lock:
            r = self._granted.get(buf.region)
        if r is None:
            raise HvddInternalError(f"hvdd: output in unknown region {buf.region:#x}", pb.CODE_PROTOCOL)
        return r.array[buf.offset : buf.offset + buf.length]

    def release(self, buf: Any) -> None:
        """Tells the daemon an output buffer has been read."""
        if buf.length == 0:
            return
        m = pb.ClientMessage()
        m.release.buffer.CopyFrom(buf)
        try:
            self._write(0, m.SerializeToString())
        except OSError:
            pass  # the connection is gone; the reader reports it

    def submit(
        self,
        op: int,
        name: str,
        dtype: int = 0,
        shape: Sequence[int] = (),
        region: Optional[Region] = None,
        offset: int = 0,
        nbytes: int = 0,
        reduce_op: int = 0,
        prescale: float = 1.0,
        postscale: float = 1.0,
        root_rank: int = 0,
        splits: Optional[Sequence[int]] = None,
        group: int = 0,
        group_size: int = 0,
        process_set: int = 0,
        owns_staging: bool = True,
    ) -> Handle:
        """Sends one Enqueue. On failure to send, the staging is freed (when
        ``owns_staging``) and the error raised."""
        with self._lock:
            err = self._failed
            if err is None and name and name in self._names:
                err = ValueError(DUPLICATE_NAME_ERROR + f" (tensor {name!r})")
            if err is not None:
                if owns_staging and region is not None:
                    self._free_locked(region, offset)
                raise err
            self._next_id = fid = (self._next_id + 1) & 0xFFFFFFFF or 1
            h = Handle(fid, name)
            if owns_staging and region is not None:
                h.region, h.offset = region, offset
                h.free_on_done = op == pb.OP_ALLGATHER or op == pb.OP_ALLTOALL or op == pb.OP_REDUCESCATTER
            self._pending[fid] = h
            if name:
                self._names.add(name)
        try:
            body = encode_enqueue(
                op,
                name,
                dtype,
                shape,
                region.id if region is not None else 0,
                offset,
                nbytes,
                reduce_op,
                prescale,
                postscale,
                root_rank,
                splits,
                group,
                group_size,
                process_set,
            )
            with self._wlock:
                self._send_locked(_HEADER.pack(b"HV", _KIND_CLIENT, 0, fid, len(body)) + body)
        except BaseException as ex:
            with self._lock:
                if self._pending.pop(fid, None) is not None:
                    self._names.discard(name)
                if h.region is not None:
                    self._free_locked(h.region, h.offset)
                    h.region = None
            if isinstance(ex, OSError):
                raise HvddInternalError(f"hvdd: enqueue {name!r}: {ex}", pb.CODE_SHUT_DOWN) from ex
            raise
        return h

    def call(self, m: Any) -> Any:
        """Sends a request the daemon answers with one Done (process set
        registration and removal), waits for it and returns the Done (None
        for a plain OK). Raises the daemon's error."""
        with self._lock:
            if self._failed is not None:
                raise self._failed
            self._next_id = fid = (self._next_id + 1) & 0xFFFFFFFF or 1
            h = Handle(fid, "")
            self._pending[fid] = h
        try:
            self._write(fid, m.SerializeToString())
        except BaseException as ex:
            with self._lock:
                self._pending.pop(fid, None)
            if isinstance(ex, OSError):
                raise HvddInternalError(f"hvdd: request failed: {ex}", pb.CODE_SHUT_DOWN) from ex
            raise
        self.complete(h)
        return h.done

    def _free_locked(self, region: Region, offset: int) -> None:
        for st in self._staging:
            if st.region is region:
                st.arena.free(offset)
                return

    def complete(self, h: Handle) -> Any:
        """Blocks until h (and its members) completes, runs its ``finish`` (which
        copies results out of shared memory), frees its staging and returns
        finish's result (a list for grouped handles). Raises the collective's
        error, if any, after every member has completed."""
        if h.members is not None:
            first: Optional[BaseException] = None
            results = []
            for m in h.members:
                try:
                    results.append(self.complete(m))
                except BaseException as e:  # wait for all before raising
                    if first is None:
                        first = e
            if first is not None:
                raise first
            return h.finish(results) if h.finish is not None else results
        if h.lock.locked():
            self._wait_inline(h)
        try:
            if h.error is not None:
                raise h.error
            fin = h.finish
            return fin(h) if fin is not None else None
        finally:
            if h.region is not None:
                with self._lock:
                    self._free_locked(h.region, h.offset)
                h.region = None

    # ---------------------------------------------------------------- closing

    def close(self) -> None:
        """Says Goodbye (an orderly shutdown), closes the connection and
        releases the shared memory. Pending collectives fail."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        sock = self._sock
        if sock is not None:
            try:
                m = pb.ClientMessage()
                m.goodbye.SetInParent()
                self._write(0, m.SerializeToString())
            except OSError:
                pass
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        try:
            os.write(self._wake_w, b"x")
        except OSError:
            pass
        if self._reader is not None and self._reader is not threading.current_thread():
            self._reader.join(timeout=10)
        self._sock_dead = True
        self._fail(EOFError())  # anything still pending fails as shut down
        self._teardown()

    def _teardown(self) -> None:
        for fd in (self._wake_r, self._wake_w):
            try:
                os.close(fd)
            except OSError:
                pass
        self._wake_r = self._wake_w = -1
        if self._sock is not None:
            try:
                self._sock.close()
            except OSError:
                pass
        ch, self._ch = self._ch, None
        if ch is not None:
            ch.close()
            ch.region.close()
        with self._lock:
            for st in self._staging:
                st.region.close()
            for r in self._granted.values():
                r.close()
            self._staging.clear()
            self._granted.clear()
            if self._failed is None:
                self._failed = HvddInternalError("hvdd: client closed", pb.CODE_SHUT_DOWN)
        for fd in self._fds:
            try:
                os.close(fd)
            except OSError as e:
                if e.errno != errno.EBADF:
                    raise
        self._fds.clear()
