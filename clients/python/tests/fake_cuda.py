"""A fake CUDA device for the client's GPU path, without a GPU: an
:class:`hvdd._cuda.Exporter` whose "device memory" is memfd-backed host
memory that the daemon's fake CUDA driver (``HVDD_GPU_DRIVER=fake``, gpu/fake)
opens through ``/proc/<pid>/fd/<fd>``, as the real driver opens a CUDA IPC
handle.

Tensors made by :meth:`FakeDevice.empty` (or ``tensor()``) are CPU torch
tensors whose bytes lie in a segment: one memfd standing for one cudaMalloc
block, tensors bump-allocated in it at 256-byte offsets, as torch's caching
allocator places several storages in one block. The daemon reads and writes
them in place, so a result appears in the tensor with no copy, and a missed
wait for the event shows as wrong data.

The handles follow the fake driver's layout (64 bytes each):

- memory: ``b"HVDDFAKE"``, pid uint32 LE, fd int32 LE, size uint64 LE,
  allocation id uint64 LE, zero padding;
- event: ``b"HVDDFEVT"``, pid uint32 LE, fd int32 LE of a 16-byte memfd
  holding [recorded seq uint64 LE][completed seq uint64 LE], zero padding.

The event is this process's one interprocess event: each op records it
(recorded += 1); it completes at once (completed = recorded) unless
``hold_events`` is set, when the test completes it with :meth:`complete`.

The daemon's device outputs are read through ``/proc/<pid>/fd/<fd>`` of the
handle, opened once per mapping (``output_opens``, ``output_closes``). The
pools of out-of-place ops are segments of their own, one per "stream"
(``stream``, which a test may change); an op's result is copied out of its
slot into a new tensor of this device's memory (never exported).
"""

from __future__ import annotations

import mmap
import os
import struct
import threading
import time
import weakref
from typing import Any, Callable, List, Optional, Tuple

import numpy as np
import torch

from hvdd import _cuda

SEGMENT = 1 << 20
ALIGN = 256

_NP = {
    torch.uint8: np.uint8,
    torch.int8: np.int8,
    torch.int16: np.int16,
    torch.int32: np.int32,
    torch.int64: np.int64,
    torch.float16: np.float16,
    torch.bfloat16: np.int16,
    torch.float32: np.float32,
    torch.float64: np.float64,
    torch.bool: np.bool_,
}


def mem_handle(pid: int, fd: int, size: int, alloc_id: int) -> bytes:
    h = b"HVDDFAKE" + struct.pack("<IiQQ", pid, fd, size, alloc_id)
    return h + bytes(64 - len(h))


def event_handle(pid: int, fd: int) -> bytes:
    h = b"HVDDFEVT" + struct.pack("<Ii", pid, fd)
    return h + bytes(64 - len(h))


class Segment:
    """One memfd "allocation"."""

    _ids = iter(range(1, 1 << 62))

    def __init__(self, size: int) -> None:
        self.size = size
        self.id = next(Segment._ids)
        # The name the fake driver checks against the handle's pid and id.
        self.fd = os.memfd_create(f"hvdd-fake-mem-{os.getpid()}-{self.id}", os.MFD_CLOEXEC)
        os.ftruncate(self.fd, size)
        self.map = mmap.mmap(self.fd, size)
        self.bytes = np.frombuffer(self.map, dtype=np.uint8)
        self.base = self.bytes.ctypes.data
        self.used = 0
        self.handle = mem_handle(os.getpid(), self.fd, size, self.id)

    def alloc(self, nbytes: int) -> Optional[int]:
        off = (self.used + ALIGN - 1) // ALIGN * ALIGN
        if off + nbytes > self.size:
            return None
        self.used = off + nbytes
        return off


class FakeDevice(_cuda.Exporter):
    """The fake GPU ``uuid`` (one the daemon lists, e.g. its Welcome's
    first) as an exporter. ``exports`` counts export() calls."""

    name = "fake CUDA"

    def __init__(self, uuid: str) -> None:
        self.uuid = uuid
        self.segments: List[Segment] = []
        self.exports = 0
        self.outputs_read = 0
        self.output_opens = 0
        self.output_closes = 0
        self.stream: Any = 0  # the "current stream" (pool_key)
        self.hold_events = False
        self.problem_text: Optional[str] = None
        self.refuse: Optional[str] = None  # export() raises ExportUnavailable with it
        efd = os.memfd_create(f"hvdd-fake-event-{os.getpid()}-1", os.MFD_CLOEXEC)
        os.ftruncate(efd, 16)
        self._efd = efd
        self._emap = mmap.mmap(efd, 16)
        self._seq = np.frombuffer(self._emap, dtype=np.uint64)
        self._ehandle = event_handle(os.getpid(), efd)
        self._lock = threading.Lock()
        # The daemon's completion events (wait_event), mapped once each.
        self._done: dict = {}
        self.event_waits = 0
        # wait_event off: the daemon then always waits for the GPU itself.
        self.can_wait = True

    # ---------------------------------------------------------- allocation

    def empty(self, shape: Tuple[int, ...], dtype: torch.dtype, new_segment: bool = False) -> torch.Tensor:
        n = int(np.prod(shape)) if len(shape) else 1
        itemsize = torch.empty((), dtype=dtype).element_size()
        nbytes = n * itemsize
        seg = None if new_segment or not self.segments else self.segments[-1]
        off = seg.alloc(nbytes) if seg is not None else None
        if off is None:
            seg = Segment(max(SEGMENT, nbytes))
            self.segments.append(seg)
            off = seg.alloc(nbytes)
            assert off is not None
        a = np.frombuffer(self.map_of(seg), dtype=_NP[dtype], count=n, offset=off)
        t = torch.from_numpy(a)
        if dtype is torch.bfloat16:
            t = t.view(torch.bfloat16)
        return t.view(shape)

    @staticmethod
    def map_of(seg: Segment) -> Any:
        return seg.map

    def tensor(self, values: torch.Tensor, new_segment: bool = False) -> torch.Tensor:
        t = self.empty(tuple(values.shape), values.dtype, new_segment)
        with torch.no_grad():
            t.copy_(values)
        return t

    def _segment(self, ptr: int) -> Optional[Segment]:
        for s in self.segments:
            if s.base <= ptr < s.base + s.size:
                return s
        return None

    # ------------------------------------------------------------ exporter

    def claims(self, tensor: Any) -> bool:
        if not isinstance(tensor, torch.Tensor) or not tensor.is_cpu or tensor.numel() == 0:
            return False
        return self._segment(tensor.data_ptr()) is not None

    def device_uuid(self, tensor: Any) -> str:
        return self.uuid

    def problem(self) -> Optional[str]:
        return self.problem_text

    @staticmethod
    def _storage(tensor: torch.Tensor) -> Any:
        return tensor.untyped_storage()

    def storage_key(self, tensor: Any) -> Tuple[int, int]:
        s = self._storage(tensor)
        return s.data_ptr(), s.nbytes()

    def export(self, tensor: Any) -> _cuda.Export:
        if self.refuse is not None:
            raise _cuda.ExportUnavailable(self.refuse)
        s = self._storage(tensor)
        seg = self._segment(s.data_ptr())
        assert seg is not None
        self.exports += 1
        from torch.multiprocessing.reductions import StorageWeakRef

        ref = StorageWeakRef(s)
        return _cuda.Export(seg.handle, seg.size, s.data_ptr() - seg.base, lambda: not ref.expired())

    def on_free(self, tensor: Any, fn: Callable[[], None]) -> bool:
        s = self._storage(tensor)
        if s is not self._storage(tensor):
            return False  # torch < 2: no one Python object per storage
        weakref.finalize(s, fn)
        return True

    def empty_like(self, tensor: Any) -> Any:
        return self.empty(tuple(tensor.shape), tensor.dtype)

    def new_empty(self, like: Any, shape: Tuple[int, ...]) -> Any:
        return self.empty(tuple(shape), like.dtype)

    def open_output(self, out: Any, mem_handle: bytes, alloc_size: int) -> Any:
        """Opens the daemon's fake device memory: its memfd, through
        /proc/<pid>/fd/<fd> as the fake driver opens handles (checking the
        fd is still that allocation's, as the driver does)."""
        assert mem_handle[:8] == b"HVDDFAKE", mem_handle[:8]
        pid, fd, size, alloc_id = struct.unpack("<IiQQ", mem_handle[8:32])
        assert size == alloc_size, (size, alloc_size)
        path = f"/proc/{pid}/fd/{fd}"
        f = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        name = os.readlink(f"/proc/self/fd/{f}")
        if f"hvdd-fake-mem-{pid}-{alloc_id}" not in name:
            os.close(f)
            raise RuntimeError(f"fake: {path} is {name}, not allocation {pid}-{alloc_id} (freed)")
        self.output_opens += 1
        return f, size

    def copy_output(self, out: Any, mapping: Any, offset: int, length: int) -> None:
        f, size = mapping
        assert offset + length <= size, (size, offset, length)
        data = os.pread(f, length, offset)
        assert len(data) == length
        self.outputs_read += 1
        dst = self._storage(out)
        seg = self._segment(dst.data_ptr())
        assert seg is not None and out.is_contiguous()
        off = out.data_ptr() - seg.base
        seg.bytes[off : off + length] = np.frombuffer(data, dtype=np.uint8)

    def close_output(self, mapping: Any) -> None:
        os.close(mapping[0])
        self.output_closes += 1

    def pool_key(self, tensor: Any) -> Any:
        return self.stream

    def new_pool(self, like: Any, nbytes: int) -> Any:
        return self.empty((nbytes,), torch.uint8, new_segment=True)

    def copy_out(self, view: Any, stream: Any) -> Any:
        out = self.empty(tuple(view.shape), view.dtype)
        out.copy_(view)
        return out

    def record_event(self, tensor: Any) -> bytes:
        with self._lock:
            self._seq[0] += np.uint64(1)
            if not self.hold_events:
                self._seq[1] = self._seq[0]
        return self._ehandle

    def wait_event(self, handle: bytes, tensor: Any) -> None:
        """The "stream" waits for the daemon's event's last record: here the
        host, since this device's work runs on the host (the fake driver's
        words: [recorded][completed], completed raised as its stream runs)."""
        words = self._done.get(handle)
        if words is None:
            if handle[:8] != b"HVDDFEVT":
                raise RuntimeError(f"not a fake event handle: {handle[:8]!r}")
            pid, fd = struct.unpack("<Ii", handle[8:16])
            efd = os.open(f"/proc/{pid}/fd/{fd}", os.O_RDWR)
            try:
                m = mmap.mmap(efd, 16)
            finally:
                os.close(efd)
            words = self._done[handle] = np.frombuffer(m, dtype=np.uint64)
        self.event_waits += 1
        want = int(words[0])
        pause = 1e-5
        while int(words[1]) < want:
            time.sleep(pause)
            pause = min(pause * 2, 1e-3)

    def complete(self) -> None:
        """Completes the event's last record (the producer's work is done)."""
        with self._lock:
            self._seq[1] = self._seq[0]

    def recorded(self) -> int:
        return int(self._seq[0])
