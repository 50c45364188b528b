"""torch's CUDA tensors through CUDA IPC: the exporter of hvdd.torch
(:class:`TorchCudaExporter`), registered with :mod:`hvdd._cuda` when this
module is imported (by :mod:`hvdd.torch._async_ops`), made at the first CUDA
tensor.

This is the only module of the GPU path that imports torch; the session,
the pools, the driver binding and the seam (:mod:`hvdd._cuda`) are
framework-neutral.

Per op (GPU-PATH D10) it calls torch for the current stream's raw handle
(``torch._C._cuda_getCurrentRawStream``, an int: no ``torch.cuda.Stream``
object made per op) and records the stream's interprocess event, kept with
a ``torch.cuda.Stream`` made once per stream; the GPU's UUID is kept per
device, the storage accessor chosen once.
"""

from __future__ import annotations

import logging
import weakref
from typing import Any, Callable, Dict, Hashable, Optional, Tuple

import torch

from .. import _cuda, _env
from .._cuda import Export, Exporter, ExportUnavailable, allocator_problem, format_uuid, parse_torch_handle

__all__ = ["TorchCudaExporter", "storage_of"]

log = logging.getLogger("hvdd._cuda")


def _storage_new(tensor: Any) -> Any:
    return tensor.untyped_storage()


def _storage_old(tensor: Any) -> Any:  # torch < 2.0
    s = tensor.storage()
    return s._untyped() if hasattr(s, "_untyped") else s.untyped()


#: A tensor's untyped storage (the accessor this torch has).
storage_of: Callable[[Any], Any] = _storage_new if hasattr(torch.Tensor, "untyped_storage") else _storage_old

_raw_stream: Optional[Callable[[int], int]] = getattr(torch._C, "_cuda_getCurrentRawStream", None)


class TorchCudaExporter(Exporter):
    """torch's CUDA tensors: the handle from the storage's ``_share_cuda_()``
    (whose tuple is (device, handle, storage size bytes, storage offset
    bytes in the allocation, ref counter handle, ref counter offset, event
    handle, event sync required)), the allocation's size from the driver's
    cuMemGetAddressRange, and one interprocess ``torch.cuda.Event`` per
    stream, recorded on the current stream before each op.

    The daemon's device outputs are mapped with cuIpcOpenMemHandle in the
    context of the output tensor's device and read with cuMemcpyDtoDAsync on
    its current stream, synchronised. Pools of out-of-place ops are uint8
    tensors of torch's caching allocator, one set per stream
    (``torch.cuda.Stream`` compares by stream and device); a result is
    copied out of its slot on the current stream, and the slot's stream is
    made to wait for that copy where it is another.

    ``_share_cuda_()`` puts the storage behind torch's IPC reference count
    (for torch consumers, which decrement it when they let go); no torch
    process consumes it here, so the count is given back at once, or torch
    would keep the storage's memory in its IPC limbo after it is freed."""

    name = "torch CUDA"

    def __init__(self) -> None:
        self._torch = torch
        self._uuids: Dict[int, str] = {}
        # raw stream -> (interprocess event or None (the stream is
        # synchronised instead), its IPC handle or b"", the stream)
        self._events: Dict[int, Tuple[Any, bytes, Any]] = {}
        # raw stream -> its torch.cuda.Stream, made once
        self._streams: Dict[int, Any] = {}
        # (device index, the daemon's completion event's handle) -> the
        # event opened here (wait_event), once
        self._done: Dict[Tuple[int, bytes], Any] = {}
        self._driver: Optional[_cuda.Driver] = None
        self._problem: Optional[Tuple[Optional[str]]] = None
        try:
            from torch.multiprocessing.reductions import StorageWeakRef

            self._weakref: Any = StorageWeakRef
        except ImportError:  # pragma: no cover - every torch 1.x/2.x has it
            self._weakref = None

    # ------------------------------------------------------------ streams

    def _stream(self, index: int) -> Tuple[int, Any]:
        """(raw handle, torch.cuda.Stream) of device index's current stream;
        the Stream made once per stream (torch's pooled streams live as long
        as the process, an external stream's handle is its identity)."""
        if _raw_stream is not None:
            raw = _raw_stream(index)
            s = self._streams.get(raw)
            if s is None:
                s = self._streams[raw] = torch.cuda.current_stream(index)
            return raw, s
        s = torch.cuda.current_stream(index)
        return s.cuda_stream, s

    @staticmethod
    def _index(tensor: Any) -> int:
        i = tensor.get_device()
        return i if i >= 0 else torch.cuda.current_device()

    # ----------------------------------------------------------- exporter

    def claims(self, tensor: Any) -> bool:
        return bool(tensor.is_cuda)

    def device_uuid(self, tensor: Any) -> str:
        i = tensor.get_device()
        u = self._uuids.get(i)
        if u is None:
            u = self._uuids[i] = format_uuid(torch.cuda.get_device_properties(self._index(tensor)).uuid)
        return u

    def problem(self) -> Optional[str]:
        if self._problem is None:
            try:
                backend = torch.cuda.get_allocator_backend()
            except (AttributeError, RuntimeError):
                backend = "native"
            self._problem = (allocator_problem(backend, _env.torch_allocator_conf()),)
        return self._problem[0]

    #: The storage of a tensor (tests' fake device uses it too).
    _storage = staticmethod(storage_of)

    def storage_key(self, tensor: Any) -> Tuple[int, int]:
        s = storage_of(tensor)
        return s.data_ptr(), s.nbytes()

    def export(self, tensor: Any) -> Export:
        s = storage_of(tensor)
        try:
            _dev, handle, size_bytes, offset_bytes, rc_handle, rc_offset, _ev, _sync = s._share_cuda_()
        except Exception as e:  # noqa: BLE001 - any refusal means: stage
            raise ExportUnavailable(
                f"torch could not export the tensor's CUDA memory for IPC ({e}); tensors received from another "
                "process, and memory torch did not allocate, cannot be shared"
            ) from e
        try:
            torch.UntypedStorage._release_ipc_counter_cuda(rc_handle, rc_offset)
        except (AttributeError, RuntimeError, TypeError):
            try:
                torch.UntypedStorage._release_ipc_counter(rc_handle, rc_offset, device=tensor.device)
            except Exception:  # noqa: BLE001 - best effort, as torch's own consumers
                log.debug("hvdd: could not give back torch's IPC reference count", exc_info=True)
        mem = parse_torch_handle(handle)
        offset_bytes, size_bytes = int(offset_bytes), int(size_bytes)
        base = s.data_ptr() - offset_bytes
        r = self._drv().address_range(base)
        if r is not None and r[0] == base:
            alloc = r[1]
        else:
            alloc = self._segment_size(base, offset_bytes + size_bytes)
        return Export(mem, alloc, offset_bytes, self._alive(s))

    def _alive(self, s: Any) -> Optional[Callable[[], bool]]:
        """Whether storage s still lives, asked at every op on it: torch's
        weak reference to it, checked by the C call StorageWeakRef.expired
        makes (two Python calls fewer per op), the reference held."""
        if self._weakref is None:
            return None
        ref = self._weakref(s)
        expired = getattr(torch.UntypedStorage, "_expired", None)
        cdata = getattr(ref, "cdata", None)
        if expired is None or cdata is None:
            return lambda: not ref.expired()
        return lambda ref=ref: not expired(cdata)

    def _segment_size(self, base: int, at_least: int) -> int:
        """The caching allocator's segment at base, from its snapshot (when
        the driver could not say); at_least when not found."""
        try:
            for seg in torch.cuda.memory_snapshot():
                if int(seg.get("address", -1)) == base:
                    return max(int(seg["total_size"]), at_least)
        except Exception:  # noqa: BLE001
            pass
        return at_least

    def on_free(self, tensor: Any, fn: Callable[[], None]) -> bool:
        s = storage_of(tensor)
        # torch >= 2 keeps one Python object per storage while it lives; then
        # a finalizer on it runs when the storage is freed.
        if s is not storage_of(tensor):
            return False
        weakref.finalize(s, fn)
        return True

    def empty_like(self, tensor: Any) -> Any:
        return torch.empty_like(tensor, memory_format=torch.contiguous_format)

    def new_empty(self, like: Any, shape: Tuple[int, ...]) -> Any:
        return torch.empty(shape, dtype=like.dtype, device=like.device)

    def copy(self, dst: Any, src: Any) -> None:
        with torch.no_grad():
            dst.copy_(src)

    def _drv(self) -> _cuda.Driver:
        if self._driver is None:
            self._driver = _cuda.Driver()
        return self._driver

    def open_output(self, out: Any, mem_handle: bytes, alloc_size: int) -> Any:
        # Opened in the context of out's device, which the copies and the
        # close use too (the thread's current device may be another).
        with torch.cuda.device(out.device):
            return out.device, self._drv().open_ipc(mem_handle)

    def copy_output(self, out: Any, mapping: Any, offset: int, length: int) -> None:
        dev, ptr = mapping
        with torch.cuda.device(dev):
            raw, _ = self._stream(self._index(out))
            self._drv().copy_sync(out.data_ptr(), ptr + offset, length, raw)

    def close_output(self, mapping: Any) -> None:
        dev, ptr = mapping
        with torch.cuda.device(dev):
            self._drv().close_ipc(ptr)

    def pool_key(self, tensor: Any) -> Optional[Hashable]:
        # torch's Stream compares and hashes by (stream, device); the same
        # object for a stream op after op
        return self._stream(self._index(tensor))[1]

    def new_pool(self, like: Any, nbytes: int) -> Any:
        return torch.empty(nbytes, dtype=torch.uint8, device=like.device)

    def copy_out(self, view: Any, stream: Any) -> Any:
        _, cur = self._stream(self._index(view))
        out = torch.empty_like(view, memory_format=torch.contiguous_format)
        out.copy_(view)
        if cur is not stream and cur != stream:
            # The slot's next use (stream's next op copies into it) after
            # this read of it on another stream.
            stream.wait_stream(cur)
        return out

    def record_event(self, tensor: Any) -> bytes:
        # One event per stream: threads submitting from different streams
        # (autograd's) must not re-record each other's event, or a daemon's
        # wait for one op would follow the other stream.
        raw, stream = self._stream(self._index(tensor))
        e = self._events.get(raw)
        if e is None:
            try:
                ev = torch.cuda.Event(interprocess=True)
                ev.record(stream)
                h = bytes(ev.ipc_handle())
            except RuntimeError as ex:
                log.debug("hvdd: no interprocess event (%s); synchronising the stream instead", ex)
                self._events[raw] = (None, b"", stream)
                stream.synchronize()
                return b""
            self._events[raw] = (ev, h, stream)
            return h
        ev, h, stream = e
        if ev is None:
            stream.synchronize()
            return b""
        ev.record(stream)
        return h

    can_wait = True

    def wait_event(self, handle: bytes, tensor: Any) -> None:
        i = self._index(tensor)
        ev = self._done.get((i, handle))
        if ev is None:
            ev = self._done[(i, handle)] = torch.cuda.Event.from_ipc_handle(i, handle)
        ev.wait(self._stream(i)[1])


_cuda.register_framework_exporter(lambda t: getattr(t, "is_cuda", False), TorchCudaExporter)
