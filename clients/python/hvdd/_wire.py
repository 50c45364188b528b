"""The wire format of ``ipc/PROTOCOL.md`` as the Python client speaks it:
frame headers, the hand-encoded Enqueue, and the protocol's error codes as
the exceptions Horovod raises.

Pure: no sockets, no shared memory, no locks. :mod:`hvdd._client` writes the
frames, :mod:`hvdd._reader` and :mod:`hvdd._channel` read them.
"""

from __future__ import annotations

import socket
import struct
from typing import Optional, Sequence

from ._proto import hvdd_pb2 as pb
from .exceptions import HvddInternalError, HvddUnimplementedError

__all__ = [
    "PROTOCOL_VERSION",
    "HEADER",
    "HEADER_SIZE",
    "MAX_BODY",
    "MAX_FDS",
    "ANC_SIZE",
    "KIND_CLIENT",
    "KIND_SERVER",
    "KIND_WAKE",
    "WAKE",
    "GRANTED_BASE",
    "DONE_OK",
    "OP_NAMES",
    "DUPLICATE_NAME_ERROR",
    "encode_enqueue",
    "encode_device_buffer",
    "error_for",
]

PROTOCOL_VERSION = 1

#: A frame header: magic ``HV``, kind, flags (0), frame id, body length.
HEADER = struct.Struct("<2sBBII")
HEADER_SIZE = 12
#: The largest body either side sends or accepts.
MAX_BODY = 4 << 20
#: The most descriptors one message from the daemon carries.
MAX_FDS = 16
#: The ancillary buffer for MAX_FDS descriptors (recvmsg).
ANC_SIZE = socket.CMSG_SPACE(MAX_FDS * 4)

KIND_CLIENT = 1
KIND_SERVER = 2
KIND_WAKE = 3
#: The doorbell: a Wake frame (no body) on the socket for a peer asleep on it.
WAKE = HEADER.pack(b"HV", KIND_WAKE, 0, 0, 0)
#: Region ids from here up are the daemon's (granted to the client).
GRANTED_BASE = 0x80000000
#: ServerMessage{done: Done{}}: the common reply, recognised without protobuf.
DONE_OK = b"\x1a\x00"

OP_NAMES = {
    pb.OP_ALLREDUCE: "allreduce",
    pb.OP_ALLGATHER: "allgather",
    pb.OP_BROADCAST: "broadcast",
    pb.OP_ALLTOALL: "alltoall",
    pb.OP_REDUCESCATTER: "reducescatter",
    pb.OP_BARRIER: "barrier",
    pb.OP_JOIN: "join",
    pb.OP_SEND: "send",
    pb.OP_RECV: "recv",
}

DUPLICATE_NAME_ERROR = (
    "Requested to allreduce, allgather, or broadcast a tensor with the same name as another tensor "
    "that is currently being processed.  If you want to request another tensor, use a different tensor name."
)


def error_for(code: int, message: str) -> Exception:
    """Maps a protocol error code to the exception Horovod would raise."""
    if code == pb.CODE_DUPLICATE_NAME:
        return ValueError(message or DUPLICATE_NAME_ERROR)
    if code == pb.CODE_UNIMPLEMENTED:
        return HvddUnimplementedError(message, code)
    return HvddInternalError(message, code)


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
    device: bytes = b"",
    peer_rank: int = 0,
    tag: int = 0,
) -> bytes:
    """The body of ``ClientMessage{enqueue: Enqueue{...}}``, encoded by hand:
    the same bytes protobuf writes (fields in number order, defaults left
    out), at a third of the cost of filling a message in Python. Checked
    against the generated code in tests/test_units.py. A training loop sends
    the same tensors every step: the fields around the buffer are cached.
    ``device`` is an encoded DeviceBuffer (:func:`encode_device_buffer`) for
    a GPU tensor, sent instead of a buffer (nbytes 0). ``peer_rank`` and
    ``tag`` are a send's or recv's (fields 15 and 16, after the device
    buffer)."""
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
    if device:
        e = b"".join((e, b"\x72", v(len(device)), device))
    if peer_rank:
        e += b"\x78" + v(peer_rank)
    if tag:
        e += b"\x80\x01" + v(tag)
    return b"\x22" + v(len(e)) + e


def encode_device_buffer(
    device_uuid: str,
    mem_handle: bytes,
    alloc_size: int,
    offset: int,
    length: int,
    event_handle: bytes,
    client_waits: bool = False,
) -> bytes:
    """The bytes of a ``DeviceBuffer`` message (Enqueue field 14), by hand as
    :func:`encode_enqueue`: fields in number order, defaults left out."""
    v = _varint
    u = device_uuid.encode()
    parts = []
    if u:
        parts += (b"\x0a", v(len(u)), u)
    if mem_handle:
        parts += (b"\x12", v(len(mem_handle)), mem_handle)
    if alloc_size:
        parts += (b"\x18", v(alloc_size))
    if offset:
        parts += (b"\x20", v(offset))
    if length:
        parts += (b"\x28", v(length))
    if event_handle:
        parts += (b"\x32", v(len(event_handle)), event_handle)
    if client_waits:
        parts.append(b"\x38\x01")
    return b"".join(parts)


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
