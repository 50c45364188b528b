"""The client side of a shared-memory channel (``ipc/PROTOCOL.md``, "Channel").

Two single-producer single-consumer byte rings in one memfd carry the same
frames as the socket, without a system call per frame. The receiver polls the
ring while it spins; before sleeping on the socket it raises its asleep flag
and looks once more, and a sender that finds the peer's flag raised rings the
doorbell (a 12-byte Wake frame on the socket).

Loads and stores of the counters are aligned 8-byte (and 4-byte) accesses
through a ``memoryview``, single instructions on x86-64, whose memory model
keeps stores in order and loads in order. The two places where a store must
be seen before a later load (publish-then-check-flag, flag-then-recheck) go
through :func:`fence`, a locked read-modify-write.
"""

from __future__ import annotations

import threading
from typing import Optional

from ._shm import Region
from ._wire import HEADER as _FRAME
from ._wire import HEADER_SIZE as _FRAME_SIZE
from ._wire import MAX_BODY as _MAX_BODY

__all__ = ["Channel", "HEADER", "DEFAULT_RING", "channel_bytes", "fence"]

HEADER = 4096
DEFAULT_RING = 128 << 10

# Word indexes into the header (see the layout table in PROTOCOL.md).
_C2D_HEAD, _C2D_SOCK, _C2D_TAIL = 0, 1, 8  # u64 words
_D2C_HEAD, _D2C_SOCK, _D2C_TAIL = 16, 17, 24
_DAEMON_ASLEEP, _CLIENT_ASLEEP = 64, 80  # u32 words

_fence_lock = threading.Lock()


def fence() -> None:
    """A full memory barrier: acquiring and releasing a lock is a locked
    read-modify-write on x86-64, which orders every earlier store before every
    later load."""
    _fence_lock.acquire()
    _fence_lock.release()


def channel_bytes(ring: int) -> int:
    """The region size of a channel with rings of ``ring`` bytes."""
    return HEADER + 2 * ring


class ChannelError(Exception):
    """The daemon's side of the channel is inconsistent (a protocol error)."""


class Channel:
    """The client's view of a channel region. Sending (``send``,
    ``socket_sent``) must be serialised by the caller, and so must receiving
    (``snapshot``, ``next``)."""

    def __init__(self, region: Region, ring: int) -> None:
        if ring < 4096 or ring & (ring - 1) or region.size != channel_bytes(ring):
            raise ValueError(
                f"channel: rings must be a power of two >= 4096 bytes in a region of {HEADER} + 2 x ring bytes"
            )
        self.region = region
        self.ring = ring
        self.max_frame = ring // 2
        mv = memoryview(region.mm)
        self._q = mv[:HEADER].cast("Q")
        self._l = mv[:HEADER].cast("I")
        self._tx = mv[HEADER : HEADER + ring]
        self._rx = mv[HEADER + ring : HEADER + 2 * ring]
        self._tx_head = 0
        self._rx_tail = 0
        self._limit = 0
        self._sent = 0

    # ---------------------------------------------------------------- sending

    def send(self, frame: bytes) -> bool:
        """Publishes one encoded frame; False (nothing written) when it is over
        ``max_frame`` or the ring lacks room."""
        n = len(frame)
        if n > self.max_frame:
            return False
        head = self._tx_head
        tail = self._q[_C2D_TAIL]
        used = head - tail
        if used < 0 or used > self.ring:
            raise ChannelError(
                f"channel: the daemon moved the ring's tail to {tail}, outside [{head - self.ring}, {head}]"
            )
        if self.ring - used < n:
            return False
        at = head & (self.ring - 1)
        first = min(n, self.ring - at)
        self._tx[at : at + first] = frame[:first]
        if first < n:
            self._tx[: n - first] = frame[first:]
        self._tx_head = head + n
        self._q[_C2D_HEAD] = self._tx_head
        return True

    def room(self, n: int) -> bool:
        """Whether a frame of n bytes fits now."""
        return self.ring - (self._tx_head - self._q[_C2D_TAIL]) >= n

    def empty(self) -> bool:
        """Whether the daemon has taken everything sent."""
        return self._q[_C2D_TAIL] == self._tx_head

    def socket_sent(self, n: int = 1) -> None:
        """Records n counted frames written to the socket (after the write)."""
        self._sent += n
        self._q[_C2D_SOCK] = self._sent

    def daemon_asleep(self) -> bool:
        """Whether the daemon asked for a doorbell. Call after fence()."""
        return self._l[_DAEMON_ASLEEP] != 0

    # -------------------------------------------------------------- receiving

    def set_asleep(self, v: bool) -> None:
        """Tells the daemon this client sleeps on the socket (then fence() and
        look at ``pending`` once more before sleeping)."""
        self._l[_CLIENT_ASLEEP] = 1 if v else 0

    def pending(self) -> bool:
        """Whether unread frames wait in the ring."""
        return self._q[_D2C_HEAD] != self._rx_tail

    def snapshot(self) -> int:
        """Fixes how far ``next`` may read and returns the daemon's count of
        socket frames sent before that point."""
        self._limit = self._q[_D2C_HEAD]
        return self._q[_D2C_SOCK]

    def next(self) -> Optional[tuple[int, int, bytes]]:
        """The next frame up to the last snapshot as (kind, id, body), or None."""
        tail = self._rx_tail
        avail = self._limit - tail
        if avail == 0:
            return None
        if avail < 0 or avail > self.ring:
            raise ChannelError(
                f"channel: the daemon moved the ring's head to {self._limit}, outside [{tail}, {tail + self.ring}]"
            )
        if avail < _FRAME_SIZE:
            raise ChannelError(f"channel: {avail} bytes published, less than a frame header")
        hdr = self._read(tail, _FRAME_SIZE)
        magic, kind, flags, fid, n = _FRAME.unpack(hdr)
        if magic != b"HV" or flags != 0 or n > _MAX_BODY or _FRAME_SIZE + n > avail:
            raise ChannelError(f"channel: bad frame header {hdr!r} with {avail} bytes published")
        body = self._read(tail + _FRAME_SIZE, n)
        self._rx_tail = tail + _FRAME_SIZE + n
        self._q[_D2C_TAIL] = self._rx_tail
        return kind, fid, body

    def _read(self, pos: int, n: int) -> bytes:
        at = pos & (self.ring - 1)
        end = at + n
        if end <= self.ring:
            return bytes(self._rx[at:end])
        return bytes(self._rx[at:]) + bytes(self._rx[: end - self.ring])

    def close(self) -> None:
        """Drops the views so that the mapping can be unmapped."""
        for v in (self._q, self._l, self._tx, self._rx):
            v.release()
