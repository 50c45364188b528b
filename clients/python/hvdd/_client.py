"""The connection to the node's hvdd daemon.

One :class:`Client` per process speaks ``ipc/PROTOCOL.md``: it sends Hello,
registers a sparse memfd staging region, waits for Welcome, registers a
shared-memory channel, then enqueues collectives whose tensors it stages in
shared memory. The client holds no collective logic: names, dtypes and
shapes go to the daemon, which matches them across ranks and reports
disagreements.

The Client sends; it composes the rest:

- :mod:`hvdd._wire`: the frame format and the hand-encoded Enqueue (pure).
- :class:`hvdd._shm.Staging`: the staging regions and their allocation.
- :mod:`hvdd._env`: its settings from the environment (socket, job, local
  rank, timeouts, arena and ring sizes, timeline and autotuning).
- :class:`hvdd._reader.Reader`: the receiving side. There is no dedicated
  reader thread on the per-op path: the thread that waits for a handle
  (:meth:`Client.complete`) reads the daemon's answers itself, polling the
  channel's ring (``HVDD_SPIN_US``, adapting) and then sleeping on the
  socket; only while no thread waits does the background thread
  ``hvdd-reader`` read, so that handles still complete and a lost daemon is
  noticed.

Requests go through the channel's ring, or on the socket when they carry a
descriptor (RegisterRegion, RegisterChannel), when the ring is too small for
them, and before the channel is registered (``HVDD_CHANNEL=0``: always).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from typing import Any, Callable, Optional, Sequence

import numpy as np

from . import _env
from ._channel import DEFAULT_RING, Channel, channel_bytes, fence
from ._env import (
    autotune_env,
    default_socket_path,
    default_start_timeout,
    elastic_requested,
)  # noqa: F401 (their home before _env)
from ._proto import hvdd_pb2 as pb
from ._reader import Handle, Reader
from ._shm import Region, Staging
from ._wire import HEADER, KIND_CLIENT, PROTOCOL_VERSION, WAKE, encode_enqueue, error_for
from .exceptions import HvddInternalError

__all__ = ["Client", "Handle", "PROTOCOL_VERSION", "default_socket_path"]

log = logging.getLogger(__name__)


class Client:
    """A connection to the local hvdd daemon."""

    def __init__(
        self,
        socket_path: Optional[str] = None,
        local_rank: Optional[int] = None,
        arena_size: Optional[int] = None,
        start_timeout: Optional[float] = None,
        client_name: str = "python",
        job: Optional[str] = None,
        local_size: Optional[int] = None,
    ) -> None:
        self.socket_path = socket_path or _env.default_socket_path()
        self.requested_local_rank = _env.requested_local_rank() if local_rank is None else local_rank
        # The daemon runs several jobs at once: processes of one uid that
        # give the same job name (HVDD_JOB, hvdd run --job; the launcher's job
        # id under mpirun or srun) form one job of local_size processes here.
        self.job = _env.job() if job is None else job
        self.local_size = _env.job_local_size() if local_size is None else local_size
        if arena_size is None:
            arena_size = _env.arena_size()
        self.arena_size = arena_size
        if start_timeout is None:
            start_timeout = _env.default_start_timeout()
        self.start_timeout = start_timeout
        self.client_name = client_name
        self.welcome: Any = None
        self._sock: Optional[socket.socket] = None
        self._wlock = threading.Lock()  # serialises writes
        # Guards _next_id, the staging and the reader's handle table and state
        # (which only the reader writes: the client calls its methods).
        self._lock = threading.Lock()
        self._next_id = 0
        self._staging = Staging(arena_size, self._register_region)
        # Spin-then-sleep while waiting: the window starts at HVDD_SPIN_US
        # and adapts (see _reader._adapt_spin).
        spin = _env.spin_seconds()
        self._rx = Reader(self._lock, self._staging, spin)
        # The shared-memory channel (ipc/PROTOCOL.md, "Channel"): sending
        # under _wlock here, receiving in the reader.
        self._ch: Optional[Channel] = None
        # The GPU path's state (hvdd._cuda.DeviceSession), by exporter.
        self.device_sessions: dict = {}
        self._gpu_uuids: Optional[frozenset] = None

    # ------------------------------------------------------------------ setup

    def connect(self) -> None:
        """Connects, registers the arena and waits for the whole job to form."""
        deadline = time.monotonic() + self.start_timeout
        rx = self._rx
        sock = self._dial(deadline)
        self._sock = sock
        rx.attach(sock=sock)
        try:
            hello = pb.ClientMessage()
            h = hello.hello
            h.version = PROTOCOL_VERSION
            h.pid = os.getpid()
            h.local_rank = self.requested_local_rank
            h.job = self.job
            h.local_size = self.local_size
            h.worker = _env.worker()
            h.client = self.client_name
            h.elastic = _env.elastic_requested()
            timeline = _env.timeline()
            if timeline and timeline != "DYNAMIC":
                # The daemon starts it as the job forms (global rank 0's
                # counts), in its own working directory: the path goes absolute.
                h.timeline.file_path = os.path.abspath(timeline)
                h.timeline.mark_cycles = _env.timeline_mark_cycles()
            h.autotune_env.extend(_env.autotune_env())
            try:
                self._write(0, hello.SerializeToString())
                self._staging.add(self.arena_size)
            except OSError:
                self._raise_refusal()
                raise
            sock.settimeout(max(0.001, deadline - time.monotonic()))
            while True:
                try:
                    fid, body = rx.read_frame()
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
                    rx.grant(m.grant_region)
                    continue
                raise HvddInternalError(f"hvdd: unexpected {kind} before Welcome")
            sock.settimeout(None)
            if _env.channel_enabled():
                self._open_channel()
        except BaseException:
            self._teardown()
            raise
        rx.start()
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
            except PermissionError as e:
                # Waiting will not help: the socket's mode or group keeps us out.
                s.close()
                raise HvddInternalError(
                    f"hvdd: permission denied on the daemon's socket {self.socket_path}: this user may not use "
                    "that daemon; ask for the socket's group (a service daemon's is hvdd: usermod -aG hvdd USER, "
                    "then log in again), or set HVDD_SOCKET to a daemon of your own"
                ) from e
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
        ring = _env.ring_bytes(DEFAULT_RING)
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
        self._rx.attach(ch=ch)

    def _raise_refusal(self) -> None:
        """Raises the daemon's reason for refusing this process, if it sent one
        before closing the connection: a write of the handshake that fails
        because the daemon has closed the connection races with reading its
        Fatal, which waits unread in the socket. Returns when there is none."""
        assert self._sock is not None
        self._sock.settimeout(1.0)  # the daemon has closed: data or EOF at once
        while True:
            try:
                _, body = self._rx.read_frame()
            except (OSError, EOFError, HvddInternalError):
                return
            m = pb.ServerMessage()
            m.ParseFromString(body)
            if m.WhichOneof("msg") == "fatal":
                raise error_for(m.fatal.code, f"hvdd: the daemon refused this process: {m.fatal.error}") from None

    def _register_region(self, r: Region) -> None:
        """Registers a staging region with the daemon (Staging's callback).
        Runs under _lock, or in connect before the reader starts."""
        m = pb.ClientMessage()
        m.register_region.region = r.id
        m.register_region.size = r.size
        self._write(0, m.SerializeToString(), fd=r.fd)

    # ---------------------------------------------------------------- sending

    def _write(self, fid: int, body: bytes, fd: int = -1) -> None:
        data = HEADER.pack(b"HV", KIND_CLIENT, 0, fid, len(body)) + body
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
                sock.sendall(WAKE)
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

    # ------------------------------------------------------------- operations

    def stage(self, nbytes: int) -> tuple[Region, int]:
        """Reserves ``nbytes`` of shared memory; returns (region, offset)."""
        with self._lock:
            self._rx.check()
            for region, arena in self._staging.regions:  # first fit (Staging's, inline: the per-op path)
                off = arena.alloc(nbytes)
                if off >= 0:
                    return region, off
            return self._staging.grow(nbytes)

    def unstage(self, region: Region, offset: int) -> None:
        with self._lock:
            self._staging.free(region, offset)

    def view(self, region: Region, offset: int, nbytes: int) -> np.ndarray:
        """A uint8 view of nbytes of a staging region."""
        return region.array[offset : offset + nbytes]

    def output(self, buf: Any) -> np.ndarray:
        """A uint8 view of a daemon output buffer (a Done's ``output``)."""
        if buf.length == 0:
            return np.empty(0, dtype=np.uint8)
        with self._lock:
            r = self._rx.region(buf.region)
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
        device: bytes = b"",
        peer_rank: int = 0,
        tag: int = 0,
    ) -> Handle:
        """Sends one Enqueue. On failure to send, the staging is freed (when
        ``owns_staging``) and the error raised. ``device`` is an encoded
        DeviceBuffer (a GPU tensor shared through CUDA IPC, :mod:`hvdd._cuda`),
        sent instead of a staged buffer. ``peer_rank`` and ``tag`` are a send's
        or recv's (OP_SEND, OP_RECV: the other rank, global, and the tag)."""
        rx = self._rx
        with self._lock:
            self._next_id = fid = (self._next_id + 1) & 0xFFFFFFFF or 1
            h = Handle(fid, name)
            try:
                rx.expect(h)  # raises the connection's failure, or a duplicate name's error
            except BaseException:
                if owns_staging and region is not None:
                    self._staging.free(region, offset)
                raise
            if owns_staging and region is not None:
                h.region, h.offset = region, offset
                h.free_on_done = op == pb.OP_ALLGATHER or op == pb.OP_ALLTOALL or op == pb.OP_REDUCESCATTER
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
                device,
                peer_rank,
                tag,
            )
            with self._wlock:  # the frame is _write's, inline: this is the per-op path
                self._send_locked(HEADER.pack(b"HV", KIND_CLIENT, 0, fid, len(body)) + body)
        except BaseException as ex:
            with self._lock:
                rx.forget(h)
                if h.region is not None:
                    self._staging.free(h.region, h.offset)
                    h.region = None
            if isinstance(ex, OSError):
                raise HvddInternalError(f"hvdd: enqueue {name!r}: {ex}", pb.CODE_SHUT_DOWN) from ex
            raise
        return h

    def release_device_output(self, mem_handle: bytes) -> None:
        """Tells the daemon a device output (Done.device_output) has been
        read: it frees the memory."""
        if not mem_handle:
            return
        m = pb.ClientMessage()
        m.release.device_output = mem_handle
        try:
            self._write(0, m.SerializeToString())
        except (OSError, HvddInternalError):
            pass

    def release_device_memory(self, mem_handles: Sequence[bytes]) -> None:
        """Tells the daemon that the device allocations of these IPC handles
        (sent in DeviceBuffers before) are freed: it closes its mappings.
        Nothing answers; a closed connection is ignored (the daemon closes
        every mapping of a connection it loses)."""
        if not mem_handles:
            return
        m = pb.ClientMessage()
        m.release_device_memory.mem_handles.extend(mem_handles)
        try:
            self._write(0, m.SerializeToString())
        except (OSError, HvddInternalError):
            pass

    def gpu_uuids(self) -> frozenset:
        """The GPUs (UUIDs) whose memory the daemon takes through CUDA IPC
        (Welcome.gpu_uuids); empty for a CPU-only daemon."""
        g = self._gpu_uuids
        if g is None:
            w = self.welcome
            if w is None:
                return frozenset()
            g = self._gpu_uuids = frozenset(w.gpu_uuids)
        return g

    def call(self, m: Any) -> Any:
        """Sends a request the daemon answers with one Done (process set
        registration and removal), waits for it and returns the Done (None
        for a plain OK). Raises the daemon's error."""
        rx = self._rx
        with self._lock:
            rx.check()
            self._next_id = fid = (self._next_id + 1) & 0xFFFFFFFF or 1
            h = Handle(fid, "")
            rx.expect(h)
        try:
            self._write(fid, m.SerializeToString())
        except BaseException as ex:
            with self._lock:
                rx.forget(h)
            if isinstance(ex, OSError):
                raise HvddInternalError(f"hvdd: request failed: {ex}", pb.CODE_SHUT_DOWN) from ex
            raise
        self.complete(h)
        return h.done

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
            self._rx.wait(h)
        try:
            if h.error is not None:
                raise h.error
            fin = h.finish
            return fin(h) if fin is not None else None
        finally:
            if h.region is not None:
                with self._lock:
                    self._staging.free(h.region, h.offset)
                h.region = None

    # ---------------------------------------------------------------- closing

    def close(self, elastic_reset: bool = False, exiting: bool = False) -> None:
        """Says Goodbye (an orderly shutdown), closes the connection and
        releases the shared memory. Pending collectives fail. With
        elastic_reset the rank re-initialises at once into its elastic job's
        next epoch (the daemon ends the epoch for every rank). With exiting
        the process exits (the shutdown at exit): in an elastic job that
        still runs, the other ranks reset and go on without this one."""
        with self._lock:
            if not self._rx.begin_close():
                return
        # The daemon frees its output buffers once the connection closes:
        # no mapping of them may outlive it.
        for s in list(self.device_sessions.values()):
            s.unmap_outputs()
        sock = self._sock
        if sock is not None:
            try:
                m = pb.ClientMessage()
                m.goodbye.SetInParent()
                m.goodbye.elastic_reset = elastic_reset
                m.goodbye.exiting = exiting
                self._write(0, m.SerializeToString())
            except OSError:
                pass
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self._rx.stop()  # the reader ends; anything still pending fails as shut down
        for s in list(self.device_sessions.values()):
            s.close()
        self._teardown()

    def _teardown(self) -> None:
        rx = self._rx
        if self._sock is not None:
            try:
                self._sock.close()
            except OSError:
                pass
        ch, self._ch = self._ch, None
        rx.detach_channel()
        if ch is not None:
            ch.close()
            ch.region.close()
        with self._lock:
            self._staging.close()
            rx.shut(HvddInternalError("hvdd: client closed", pb.CODE_SHUT_DOWN))
        rx.close()
