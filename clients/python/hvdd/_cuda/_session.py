"""The client side of the GPU path: device tensors handed to the daemon as
CUDA IPC memory handles, with no copy through host memory.

A tensor on a GPU the daemon serves (``Welcome.gpu_uuids``) travels as a
``DeviceBuffer`` (``ipc/ipcpb/hvdd.proto``): the IPC handle of the device
allocation it lies in, the allocation's size, the tensor's offset and length
in it, and the handle of an interprocess event recorded on the producing
stream just before the Enqueue. The daemon's stream waits for that event
before it reads; its Done comes once its device work on the tensor has
completed, so the result is in place when the handle completes.

What does not travel that way is staged through host memory, as CPU tensors
are, with one warning per process and reason (:class:`HvddStagingWarning`):

- the daemon runs CPU-only (no GPUs in its Welcome), or the tensor's GPU is
  not one of its GPUs;
- the memory cannot be shared with legacy CUDA IPC: torch's
  ``cudaMallocAsync`` allocator backend, ``expandable_segments:True`` in
  ``PYTORCH_CUDA_ALLOC_CONF`` (or ``PYTORCH_ALLOC_CONF``), or any error
  exporting a handle (a tensor received from another process, memory torch
  did not allocate).

The seam is :class:`Exporter`: it names a tensor's GPU, exports its
allocation (handle, size, the storage's offset in it) and records the event.
:class:`TorchCudaExporter` is the real one; the tests put an exporter of
memfd-backed tensors in its place (``tests/fake_cuda.py``), whose handles the
daemon's fake CUDA driver (``HVDD_GPU_DRIVER=fake``) opens. Everything
above the seam, :class:`DeviceSession`, is the same for both.

Caching. A storage is exported once: its export is kept under the storage's
address and size while the storage lives (a weakref finalizer on the
storage, and a liveness check at every lookup, retire it). The daemon maps
an allocation once per connection and keeps the mapping under the handle's
bytes; when the last exported storage of an allocation is freed, the
session sends ``ReleaseDeviceMemory`` for its handle with the next request,
so the daemon closes its mapping (the next export of that allocation opens
it again).

Device outputs. The daemon lends its results (allgather, alltoall,
reducescatter) in buffers of a pool it keeps per connection, so the same
handles come back op after op. The session keeps each one it has mapped
open under the handle's bytes (an LRU of :attr:`DeviceSession.output_cache`,
and none idle for over :attr:`DeviceSession.output_idle` reads), so that a
steady state opens and closes nothing; each read still copies and waits
before the Release, after which the daemon may reuse the buffer.

Out-of-place ops. An op whose result is a new tensor (allreduce,
broadcast) reduces a copy of its input in a slot of a pool of exporter
memory the session keeps per stream (:meth:`DeviceSession.slot`): the pool
is exported once, so a steady state exports nothing where a new tensor per
op would export (and, once freed, release) its memory every op. The result
is copied out of the slot into a new tensor of the framework's own (never
exported) when the op completes, and the slot is reused.

Nothing here imports a framework at import time.
"""

from __future__ import annotations

import bisect
import collections
import ctypes
import logging
import queue
import threading
import warnings
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Hashable, List, Optional, Set, Tuple

from . import _env
from ._wire import encode_device_buffer

__all__ = [
    "HvddStagingWarning",
    "ExportUnavailable",
    "Export",
    "Exporter",
    "TorchCudaExporter",
    "DeviceSession",
    "SlotAllocator",
    "Slot",
    "format_uuid",
    "allocator_problem",
    "parse_torch_handle",
    "install_exporter",
    "remove_exporter",
    "exporter_for",
    "session",
    "reset_warnings",
    "staged_device",
    "note_tf_device",
]

log = logging.getLogger(__name__)

#: cuIpcGetMemHandle's and cuIpcGetEventHandle's handle size.
IPC_HANDLE_SIZE = 64

#: The alignment of a slot in a pool (cudaMalloc's is 256 bytes).
POOL_ALIGN = 256


class HvddStagingWarning(UserWarning):
    """A device tensor goes through host memory instead of CUDA IPC (slower;
    the message says why and how to avoid it). Issued once per process and
    reason."""


class ExportUnavailable(Exception):
    """The exporter cannot share this memory through legacy CUDA IPC; the
    message says why and how to avoid it."""


@dataclass
class Export:
    """One exported storage: what a DeviceBuffer needs of its allocation."""

    #: The allocation's IPC handle (64 bytes).
    mem_handle: bytes
    #: The allocation's size in bytes.
    alloc_size: int
    #: Where the storage starts in the allocation, in bytes.
    storage_offset: int
    #: False once the storage has been freed (None: no check).
    alive: Optional[Callable[[], bool]] = None


class Exporter:
    """The seam between the protocol and a framework's device memory. The
    methods are called from the thread that submits the op."""

    #: Shown in warnings ("torch CUDA").
    name = "device"

    def claims(self, tensor: Any) -> bool:
        """Whether tensor is device memory of this exporter's."""
        raise NotImplementedError

    def device_uuid(self, tensor: Any) -> str:
        """The UUID ("GPU-...", as nvidia-smi writes it) of tensor's GPU."""
        raise NotImplementedError

    def problem(self) -> Optional[str]:
        """Why this process's device memory cannot be shared at all (its
        allocator's settings), with the way out; None when it can."""
        return None

    def storage_key(self, tensor: Any) -> Tuple[int, int]:
        """The identity of tensor's storage while it lives: (address, bytes)."""
        raise NotImplementedError

    def export(self, tensor: Any) -> Export:
        """Exports the allocation tensor's storage lies in (raises
        ExportUnavailable)."""
        raise NotImplementedError

    def on_free(self, tensor: Any, fn: Callable[[], None]) -> bool:
        """Arranges for fn() to run when tensor's storage is freed; False when
        it cannot (then the session checks ``Export.alive``). fn may run in
        any thread, during garbage collection: it must only queue work."""
        return False

    def element_offset(self, tensor: Any) -> int:
        """The tensor's offset in its storage, in bytes."""
        return int(tensor.storage_offset()) * int(tensor.element_size())

    def nbytes(self, tensor: Any) -> int:
        return int(tensor.numel()) * int(tensor.element_size())

    def empty_like(self, tensor: Any) -> Any:
        """A new contiguous tensor in memory of this exporter's, like tensor."""
        raise NotImplementedError

    def new_empty(self, like: Any, shape: Tuple[int, ...]) -> Any:
        """A new contiguous tensor of shape, of like's dtype, on like's device
        (in memory of this exporter's)."""
        raise NotImplementedError

    def open_output(self, out: Any, mem_handle: bytes, alloc_size: int) -> Any:
        """Maps another process's exported allocation of alloc_size bytes
        (the daemon's ``Done.device_output``) for reading into tensors like
        out (on out's device); returns the mapping, which
        :meth:`DeviceSession.read_output` keeps under the handle's bytes
        until :meth:`close_output`."""
        raise NotImplementedError

    def copy_output(self, out: Any, mapping: Any, offset: int, length: int) -> None:
        """Copies length bytes at offset of an :meth:`open_output` mapping
        into the contiguous tensor out (of this exporter's memory, length
        bytes). Blocks until the copy is done: the daemon may reuse the
        memory once it is released."""
        raise NotImplementedError

    def close_output(self, mapping: Any) -> None:
        """Unmaps an :meth:`open_output` mapping."""
        raise NotImplementedError

    def read_output(self, out: Any, mem_handle: bytes, alloc_size: int, offset: int, length: int) -> None:
        """Copies length bytes at offset of another process's exported
        allocation into the contiguous tensor out, and closes the mapping
        again (no cache: :meth:`DeviceSession.read_output` keeps mappings)."""
        m = self.open_output(out, mem_handle, alloc_size)
        try:
            self.copy_output(out, m, offset, length)
        finally:
            self.close_output(m)

    # The pool of out-of-place ops (DeviceSession.slot).

    def pool_key(self, tensor: Any) -> Optional[Hashable]:
        """The stream an op on tensor is ordered on now (its device's current
        stream), which keys the session's pools: work on one stream runs in
        order, so a slot freed on it may be reused by its next op at once.
        None when this exporter keeps no pool (out-of-place ops then copy
        into a new tensor of their own, exported each op)."""
        return None

    def new_pool(self, like: Any, nbytes: int) -> Any:
        """A new contiguous uint8 tensor of nbytes in memory of this
        exporter's on like's device, made on like's current stream."""
        raise NotImplementedError

    def slot_view(self, pool: Any, offset: int, like: Any) -> Any:
        """The bytes at offset of a pool as a contiguous tensor of like's
        dtype and shape (a view: the pool's storage, so its export)."""
        v = pool.narrow(0, offset, self.nbytes(like))
        if v.dtype != like.dtype:
            v = v.view(like.dtype)
        return v.view(like.shape)

    def copy_out(self, view: Any, stream: Any) -> Any:
        """A new tensor with the values of view (a slot of the pool of
        stream, which the daemon has written), in memory of the framework's
        own that is never exported, ordered on the current stream. Work that
        stream runs next (the slot's next use) must come after the copy."""
        raise NotImplementedError

    def record_event(self, tensor: Any) -> bytes:
        """Records this process's interprocess event on the stream that
        produces tensor and returns the event's IPC handle (cached: one event
        per device, re-recorded), or b"" after synchronising the stream
        instead."""
        raise NotImplementedError


# ------------------------------------------------------------------ warnings

_warned: Set[str] = set()
_warn_lock = threading.Lock()


def _warn_once(key: str, message: str) -> None:
    with _warn_lock:
        if key in _warned:
            return
        _warned.add(key)
    log.warning("%s", message)
    warnings.warn(message, HvddStagingWarning, stacklevel=4)


def reset_warnings() -> None:
    """Forgets which warnings were issued (tests)."""
    with _warn_lock:
        _warned.clear()


# --------------------------------------------------------------- TensorFlow


def staged_device(device: str) -> Optional[str]:
    """The GPU a TensorFlow device string names ("GPU:0" for
    "/job:localhost/replica:0/task:0/device:GPU:0", "/device:GPU:0", "GPU:0",
    "/gpu:0"), whose tensors hvdd.tensorflow stages through host memory;
    None for a CPU, and for no placement yet (a graph tensor before
    placement: an empty string)."""
    if not device:
        return None
    last = device.rsplit("/", 1)[-1]
    if last.lower().startswith("device:"):
        last = last[len("device:") :]
    kind, _, index = last.partition(":")
    if kind.upper() == "GPU":
        return f"GPU:{index or 0}"
    return None


def note_tf_device(device: str) -> None:
    """Warns once per process when a TensorFlow tensor on a GPU is staged
    through host memory (TensorFlow offers no CUDA IPC handle of a
    tensor's memory)."""
    g = staged_device(device)
    if g is not None:
        _warn_once(
            "tensorflow-gpu",
            f"hvdd: TensorFlow tensors on {g} are staged through host memory: TensorFlow offers no CUDA IPC "
            "handle of a tensor's device memory, so hvdd.tensorflow copies GPU tensors to the host and back "
            "(hvdd.torch hands CUDA tensors to the daemon without a copy)",
        )


# ------------------------------------------------------------- torch's CUDA


def format_uuid(uuid: Any) -> str:
    """A GPU's UUID as nvidia-smi and NVML write it ("GPU-" and the 16
    bytes as 8-4-4-4-12 hex digits), from torch's ``_CUuuid`` (its
    ``bytes``), 16 raw bytes, or a string with or without the prefix."""
    raw = getattr(uuid, "bytes", uuid)
    if isinstance(raw, (bytes, bytearray, list, tuple)) and len(raw) == 16:
        h = bytes(raw).hex()
        return f"GPU-{h[0:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"
    s = str(uuid)
    if s.startswith(("GPU-", "MIG-")):
        return s
    return "GPU-" + s


def allocator_problem(backend: str, env: Dict[str, str]) -> Optional[str]:
    """Why torch's CUDA memory cannot go through legacy CUDA IPC, from the
    allocator backend (``torch.cuda.get_allocator_backend()``) and the
    environment, with the way out; None when it can."""
    if backend == "cudaMallocAsync":
        return (
            "torch's CUDA allocator is cudaMallocAsync (backend:cudaMallocAsync in PYTORCH_CUDA_ALLOC_CONF), "
            "whose pool memory legacy CUDA IPC cannot share; use the native allocator (drop "
            "backend:cudaMallocAsync) for zero-copy GPU collectives"
        )
    for var in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"):
        conf = env.get(var, "")
        for item in conf.split(","):
            k, _, v = item.partition(":")
            if k.strip() == "expandable_segments" and v.strip().lower() in ("true", "1"):
                return (
                    f"{var} sets expandable_segments:True, whose memory (CUDA virtual memory management) "
                    "legacy CUDA IPC cannot share; unset it (or set expandable_segments:False) for zero-copy "
                    "GPU collectives"
                )
    return None


def parse_torch_handle(handle: bytes) -> bytes:
    """The 64-byte cudaIpcMemHandle_t in the handle torch's
    ``_share_cuda_()`` returns: the raw 64 bytes (torch before 2.2), or
    torch's versioned form (a version byte, the type byte 'c' for a
    cudaMalloc block, the 64 bytes). An expandable segment's handle (type
    'e') raises ExportUnavailable."""
    if len(handle) == IPC_HANDLE_SIZE:
        return bytes(handle)
    if len(handle) >= 2 + IPC_HANDLE_SIZE and handle[1:2] == b"c":
        return bytes(handle[2 : 2 + IPC_HANDLE_SIZE])
    if len(handle) >= 2 and handle[1:2] == b"e":
        raise ExportUnavailable(
            "the tensor lies in an expandable segment (PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True), "
            "which legacy CUDA IPC cannot share; unset expandable_segments for zero-copy GPU collectives"
        )
    raise ExportUnavailable(f"torch returned an IPC handle of a form hvdd does not know ({len(handle)} bytes)")


class _IpcHandle(ctypes.Structure):
    """CUipcMemHandle, passed by value."""

    _fields_ = [("reserved", ctypes.c_char * IPC_HANDLE_SIZE)]


class _Driver:
    """The few CUDA driver calls torch does not offer, through ctypes on the
    libcuda that torch has loaded. ``opens`` and ``closes`` count the IPC
    mappings opened and closed."""

    def __init__(self) -> None:
        self.lib: Any = None
        self.opens = 0
        self.closes = 0
        self._fns: Dict[str, Any] = {}
        try:
            self.lib = ctypes.CDLL("libcuda.so.1")
            f = self.lib.cuMemGetAddressRange_v2
            f.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_size_t), ctypes.c_uint64]
            f.restype = ctypes.c_int
            self._range = f
        except (OSError, AttributeError):
            self.lib = None

    def _fn(self, names: Tuple[str, ...], argtypes: List[Any]) -> Any:
        f = self._fns.get(names[0])
        if f is not None:
            return f
        if self.lib is None:
            raise RuntimeError("hvdd: libcuda.so.1 is not loaded")
        for n in names:
            f = getattr(self.lib, n, None)
            if f is not None:
                f.argtypes = argtypes
                f.restype = ctypes.c_int
                self._fns[names[0]] = f
                return f
        raise OSError(f"libcuda has none of {names}")

    def _check(self, call: str, rc: int) -> None:
        if rc != 0:
            raise RuntimeError(f"hvdd: {call} failed: CUDA error {rc}")

    def open_ipc(self, handle: bytes) -> int:
        """Maps another process's allocation by its IPC handle in the current
        context; returns its address here."""
        u64 = ctypes.c_uint64
        open_ = self._fn(
            ("cuIpcOpenMemHandle_v2", "cuIpcOpenMemHandle"), [ctypes.POINTER(u64), _IpcHandle, ctypes.c_uint]
        )
        h = _IpcHandle()
        ctypes.memmove(ctypes.byref(h), handle, IPC_HANDLE_SIZE)
        p = u64(0)
        self._check("cuIpcOpenMemHandle", open_(ctypes.byref(p), h, 1))  # CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS
        self.opens += 1
        return int(p.value)

    def close_ipc(self, ptr: int) -> None:
        """Unmaps an :meth:`open_ipc` mapping."""
        close = self._fn(("cuIpcCloseMemHandle",), [ctypes.c_uint64])
        self.closes += 1
        self._check("cuIpcCloseMemHandle", close(ctypes.c_uint64(ptr)))

    def copy_sync(self, dst: int, src: int, length: int, stream: int) -> None:
        """Copies length bytes from src to dst on stream and waits for it."""
        u64 = ctypes.c_uint64
        copy = self._fn(("cuMemcpyDtoDAsync_v2", "cuMemcpyDtoDAsync"), [u64, u64, ctypes.c_size_t, ctypes.c_void_p])
        sync = self._fn(("cuStreamSynchronize",), [ctypes.c_void_p])
        self._check("cuMemcpyDtoDAsync", copy(u64(dst), u64(src), length, ctypes.c_void_p(stream)))
        self._check("cuStreamSynchronize", sync(ctypes.c_void_p(stream)))

    def copy_from_ipc(self, handle: bytes, offset: int, dst: int, length: int, stream: int) -> None:
        """Opens another process's allocation by its IPC handle, copies
        length bytes at offset to dst on stream, waits, and closes it."""
        p = self.open_ipc(handle)
        try:
            self.copy_sync(dst, p + offset, length, stream)
        finally:
            self.close_ipc(p)

    def address_range(self, ptr: int) -> Optional[Tuple[int, int]]:
        """(base, size) of the allocation ptr lies in, or None."""
        if self.lib is None:
            return None
        base, size = ctypes.c_uint64(0), ctypes.c_size_t(0)
        if self._range(ctypes.byref(base), ctypes.byref(size), ctypes.c_uint64(ptr)) != 0:
            return None
        return int(base.value), int(size.value)


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
        import torch

        self._torch = torch
        self._uuids: Dict[int, str] = {}
        self._events: Dict[int, Tuple[Any, bytes]] = {}  # by stream
        self._driver: Optional[_Driver] = None
        self._problem: Optional[Tuple[Optional[str]]] = None
        try:
            from torch.multiprocessing.reductions import StorageWeakRef

            self._weakref: Any = StorageWeakRef
        except ImportError:  # pragma: no cover - every torch 1.x/2.x has it
            self._weakref = None

    def claims(self, tensor: Any) -> bool:
        return bool(tensor.is_cuda)

    def device_uuid(self, tensor: Any) -> str:
        i = tensor.device.index
        if i is None:
            i = self._torch.cuda.current_device()
        u = self._uuids.get(i)
        if u is None:
            u = self._uuids[i] = format_uuid(self._torch.cuda.get_device_properties(i).uuid)
        return u

    def problem(self) -> Optional[str]:
        if self._problem is None:
            try:
                backend = self._torch.cuda.get_allocator_backend()
            except (AttributeError, RuntimeError):
                backend = "native"
            self._problem = (allocator_problem(backend, _env.torch_allocator_conf()),)
        return self._problem[0]

    @staticmethod
    def _storage(tensor: Any) -> Any:
        if hasattr(tensor, "untyped_storage"):
            return tensor.untyped_storage()
        s = tensor.storage()  # torch < 2.0
        return s._untyped() if hasattr(s, "_untyped") else s.untyped()

    def storage_key(self, tensor: Any) -> Tuple[int, int]:
        s = self._storage(tensor)
        return s.data_ptr(), s.nbytes()

    def export(self, tensor: Any) -> Export:
        s = self._storage(tensor)
        try:
            _dev, handle, size_bytes, offset_bytes, rc_handle, rc_offset, _ev, _sync = s._share_cuda_()
        except Exception as e:  # noqa: BLE001 - any refusal means: stage
            raise ExportUnavailable(
                f"torch could not export the tensor's CUDA memory for IPC ({e}); tensors received from another "
                "process, and memory torch did not allocate, cannot be shared"
            ) from e
        try:
            self._torch.UntypedStorage._release_ipc_counter_cuda(rc_handle, rc_offset)
        except (AttributeError, RuntimeError, TypeError):
            try:
                self._torch.UntypedStorage._release_ipc_counter(rc_handle, rc_offset, device=tensor.device)
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
        ref = self._weakref(s) if self._weakref is not None else None
        alive = (lambda: not ref.expired()) if ref is not None else None
        return Export(mem, alloc, offset_bytes, alive)

    def _segment_size(self, base: int, at_least: int) -> int:
        """The caching allocator's segment at base, from its snapshot (when
        the driver could not say); at_least when not found."""
        try:
            for seg in self._torch.cuda.memory_snapshot():
                if int(seg.get("address", -1)) == base:
                    return max(int(seg["total_size"]), at_least)
        except Exception:  # noqa: BLE001
            pass
        return at_least

    def on_free(self, tensor: Any, fn: Callable[[], None]) -> bool:
        s = self._storage(tensor)
        # torch >= 2 keeps one Python object per storage while it lives; then
        # a finalizer on it runs when the storage is freed.
        if s is not self._storage(tensor):
            return False
        import weakref

        weakref.finalize(s, fn)
        return True

    def empty_like(self, tensor: Any) -> Any:
        return self._torch.empty_like(tensor, memory_format=self._torch.contiguous_format)

    def new_empty(self, like: Any, shape: Tuple[int, ...]) -> Any:
        return self._torch.empty(shape, dtype=like.dtype, device=like.device)

    def _drv(self) -> _Driver:
        if self._driver is None:
            self._driver = _Driver()
        return self._driver

    def open_output(self, out: Any, mem_handle: bytes, alloc_size: int) -> Any:
        # Opened in the context of out's device, which the copies and the
        # close use too (the thread's current device may be another).
        with self._torch.cuda.device(out.device):
            return out.device, self._drv().open_ipc(mem_handle)

    def copy_output(self, out: Any, mapping: Any, offset: int, length: int) -> None:
        dev, ptr = mapping
        torch = self._torch
        with torch.cuda.device(dev):
            stream = torch.cuda.current_stream(dev)
            self._drv().copy_sync(out.data_ptr(), ptr + offset, length, stream.cuda_stream)

    def close_output(self, mapping: Any) -> None:
        dev, ptr = mapping
        with self._torch.cuda.device(dev):
            self._drv().close_ipc(ptr)

    def pool_key(self, tensor: Any) -> Optional[Hashable]:
        # torch's Stream compares and hashes by (stream, device)
        return self._torch.cuda.current_stream(tensor.device)

    def new_pool(self, like: Any, nbytes: int) -> Any:
        return self._torch.empty(nbytes, dtype=self._torch.uint8, device=like.device)

    def copy_out(self, view: Any, stream: Any) -> Any:
        torch = self._torch
        cur = torch.cuda.current_stream(view.device)
        out = torch.empty_like(view, memory_format=torch.contiguous_format)
        out.copy_(view)
        if cur != stream:
            # The slot's next use (stream's next op copies into it) after
            # this read of it on another stream.
            stream.wait_stream(cur)
        return out

    def record_event(self, tensor: Any) -> bytes:
        torch = self._torch
        dev = tensor.device
        stream = torch.cuda.current_stream(dev)
        # One event per stream: threads submitting from different streams
        # (autograd's) must not re-record each other's event, or a daemon's
        # wait for one op would follow the other stream.
        i = stream.cuda_stream
        e = self._events.get(i)
        if e is None:
            try:
                ev = torch.cuda.Event(interprocess=True)
                ev.record(stream)
                h = bytes(ev.ipc_handle())
            except RuntimeError as ex:
                log.debug("hvdd: no interprocess event (%s); synchronising the stream instead", ex)
                self._events[i] = (None, b"")
                stream.synchronize()
                return b""
            self._events[i] = (ev, h)
            return h
        ev, h = e
        if ev is None:
            stream.synchronize()
            return b""
        ev.record(stream)
        return h


# ------------------------------------------------------------------- pools


def _aligned(n: int, align: int = POOL_ALIGN) -> int:
    return max(align, (n + align - 1) // align * align)


class SlotAllocator:
    """First-fit allocation of slots in [0, size): each slot's offset and
    length are multiples of align, and freeing one joins it with the free
    space around it. Not thread-safe (the session's pool lock guards it).

    The free space is a list of holes (offset, length), sorted by offset,
    none adjacent to another: first fit takes the front of the first hole
    that is large enough, so that slots freed and taken again in the same
    order (a training step's) land where they were."""

    def __init__(self, size: int, align: int = POOL_ALIGN) -> None:
        if size <= 0 or size % align:
            raise ValueError(f"a pool's size must be a positive multiple of {align}, not {size}")
        self.size = size
        self.align = align
        self._offs: List[int] = [0]  # the holes' offsets, sorted
        self._lens: List[int] = [size]  # and their lengths
        self._slots: Dict[int, int] = {}  # offset -> length of each slot taken
        #: The bytes in slots taken.
        self.used = 0

    @property
    def busy(self) -> int:
        """The number of slots taken."""
        return len(self._slots)

    def alloc(self, nbytes: int) -> Optional[int]:
        """The offset of a new slot of at least nbytes (one alignment unit
        at least), or None when no hole is large enough."""
        need = _aligned(nbytes, self.align)
        for i, n in enumerate(self._lens):
            if n >= need:
                off = self._offs[i]
                if n == need:
                    del self._offs[i], self._lens[i]
                else:
                    self._offs[i] = off + need
                    self._lens[i] = n - need
                self._slots[off] = need
                self.used += need
                return off
        return None

    def free(self, offset: int) -> None:
        """Gives back the slot at offset (ValueError for none taken there)."""
        n = self._slots.pop(offset, None)
        if n is None:
            raise ValueError(f"no slot at offset {offset}")
        self.used -= n
        i = bisect.bisect_left(self._offs, offset)
        joins_prev = i > 0 and self._offs[i - 1] + self._lens[i - 1] == offset
        joins_next = i < len(self._offs) and offset + n == self._offs[i]
        if joins_prev and joins_next:
            self._lens[i - 1] += n + self._lens[i]
            del self._offs[i], self._lens[i]
        elif joins_prev:
            self._lens[i - 1] += n
        elif joins_next:
            self._offs[i] = offset
            self._lens[i] += n
        else:
            self._offs.insert(i, offset)
            self._lens.insert(i, n)

    def holes(self) -> List[Tuple[int, int]]:
        """The free space as (offset, length) pairs, in order (tests)."""
        return list(zip(self._offs, self._lens))


@dataclass
class _Pool:
    """One pool: a uint8 tensor of exporter memory, exported once (the
    session's cache keeps its storage's export), and its slots."""

    tensor: Any
    slots: SlotAllocator


@dataclass
class _StreamPools:
    """The pools of one stream: the last is the one slots are taken from;
    the others (outgrown) are dropped once their last slot is freed."""

    stream: Any
    pools: List[_Pool] = field(default_factory=list)


class Slot:
    """A slot of a session's pool lent to one op: ``view`` is the op's
    tensor in it (the input's dtype and shape) until :meth:`free`.

    A slot is freed exactly once: by :meth:`result` (the op succeeded), by
    :meth:`free`, or, when lent to a handle (:meth:`lend`), once the handle
    is gone (the op failed: its finish never runs). Freeing only queues the
    slot (it may run in a finalizer); the session takes it back at its next
    :meth:`DeviceSession.slot`."""

    __slots__ = ("view", "stream", "_session", "_sp", "_pool", "_offset", "_fin", "_freed")

    def __init__(self, session: "DeviceSession", sp: _StreamPools, pool: _Pool, offset: int, view: Any) -> None:
        self.view = view
        self.stream = sp.stream
        self._session = session
        self._sp = sp
        self._pool = pool
        self._offset = offset
        self._fin: Optional[weakref.finalize] = None
        self._freed = False

    def lend(self, owner: Any) -> None:
        """Frees the slot when owner (the op's handle) is gone, should the
        slot not have been freed before."""
        if not self._freed and self._fin is None:
            self._fin = weakref.finalize(
                owner, Slot._give_back, self._session._slots_freed, self._sp, self._pool, self._offset
            )

    @staticmethod
    def _give_back(
        q: "queue.SimpleQueue[Tuple[_StreamPools, _Pool, int]]", sp: _StreamPools, pool: _Pool, off: int
    ) -> None:
        q.put((sp, pool, off))

    def free(self) -> None:
        """Gives the slot back (once; later calls do nothing)."""
        if self._fin is not None:
            self._fin()  # a finalizer runs once: neither a later call nor the handle's going runs it again
        elif not self._freed:
            self._freed = True
            Slot._give_back(self._session._slots_freed, self._sp, self._pool, self._offset)

    def result(self) -> Any:
        """The op's result: a new tensor of the framework's own with the
        slot's values (``Exporter.copy_out``); the slot is freed."""
        try:
            return self._session.exporter.copy_out(self.view, self.stream)
        finally:
            self.free()


@dataclass
class _Mapping:
    """A device output's allocation mapped here (``Exporter.open_output``)."""

    mapping: Any
    size: int
    last: int = 0  # the read count at its last use
    pins: int = 0  # reads copying from it now
    stale: bool = False  # dropped from the cache: closed at its last unpin


# ---------------------------------------------------------------- sessions


@dataclass
class _Entry:
    export: Export
    key: Tuple[int, int]
    # a finalizer retires it when its storage is freed (no liveness checks)
    watched: bool = False


@dataclass
class DeviceSession:
    """The GPU path of one connection to the daemon, for one exporter: it
    decides, per tensor, between CUDA IPC and staging, and keeps the exports
    and the handles the daemon has mapped, the daemon's device outputs
    mapped here, and the pools of out-of-place ops.

    ``exports`` counts the allocations exported (a cache miss each);
    ``released`` lists the handles sent in ReleaseDeviceMemory, in order;
    ``output_opens`` and ``output_closes`` count the device outputs' mappings
    opened and closed; ``pools_made`` counts the pools allocated."""

    client: Any
    exporter: Exporter
    exports: int = 0
    released: List[bytes] = field(default_factory=list)
    output_opens: int = 0
    output_closes: int = 0
    pools_made: int = 0
    #: The device outputs kept mapped, at most (least recently used first
    #: out), and the reads after which one unused is closed (the daemon
    #: frees the buffers its pool holds beyond its bound: their handles
    #: never come back).
    output_cache: int = 64
    output_idle: int = 1024
    #: A stream's first pool's size, and the largest a pool grows to (a
    #: tensor that fits in none takes a copy of its own, exported per op).
    pool_min: int = 1 << 20
    pool_max: int = 256 << 20
    #: The streams whose pools are kept while idle, at most (the least
    #: recently used idle ones go beyond it).
    pool_streams: int = 8
    _cache: Dict[Tuple[int, int], _Entry] = field(default_factory=dict)
    # handle bytes -> live cached storages in that allocation
    _refs: Dict[bytes, int] = field(default_factory=dict)
    # Freed storages, queued by their finalizers (SimpleQueue.put is safe
    # there: a finalizer may run inside a send, holding the client's write
    # lock) for the releaser thread, or for flush().
    _freed: "queue.SimpleQueue[Optional[Tuple[Tuple[int, int], _Entry]]]" = field(default_factory=queue.SimpleQueue)
    _releaser: Optional[threading.Thread] = None
    # held while retiring, so that flush() returns after a retirement the
    # releaser thread has begun
    _flush_lock: threading.Lock = field(default_factory=threading.Lock)
    # handle bytes -> the allocation size sent with it (the daemon refuses
    # a handle again with another size)
    _sizes: Dict[bytes, int] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _ops: int = 0
    # Some export has no finalizer (torch < 2): flush() then checks every
    # cached export's liveness.
    _unwatched: bool = False
    # handle bytes -> the device output mapped, least recently used first
    _outputs: "collections.OrderedDict[bytes, _Mapping]" = field(default_factory=collections.OrderedDict)
    _out_lock: threading.Lock = field(default_factory=threading.Lock)
    _reads: int = 0
    # stream -> its pools; slots freed, queued until the next slot()
    _pools: "collections.OrderedDict[Any, _StreamPools]" = field(default_factory=collections.OrderedDict)
    _pool_lock: threading.Lock = field(default_factory=threading.Lock)
    _slots_freed: "queue.SimpleQueue[Tuple[_StreamPools, _Pool, int]]" = field(default_factory=queue.SimpleQueue)
    _pool_off: bool = False

    def usable(self, tensor: Any) -> bool:
        """Whether tensor can go through CUDA IPC as far as the daemon's GPUs
        and this process's allocator go (it warns once when not)."""
        uuids = self.client.gpu_uuids()
        if not uuids:
            _warn_once(
                "no-gpus",
                f"hvdd: {self.exporter.name} tensors are staged through host memory: the daemon runs CPU-only "
                "(it found no GPU, or no CUDA driver: see `hvdd gpus` and its log); run the daemon on a node "
                "with the GPUs for zero-copy GPU collectives",
            )
            return False
        uuid = self.exporter.device_uuid(tensor)
        if uuid not in uuids:
            _warn_once(
                "gpu-not-served:" + uuid,
                f"hvdd: {self.exporter.name} tensors on {uuid} are staged through host memory: the daemon does not "
                f"serve that GPU (it serves {', '.join(sorted(uuids))}); check CUDA_VISIBLE_DEVICES of the daemon",
            )
            return False
        p = self.exporter.problem()
        if p is not None:
            _warn_once("allocator", f"hvdd: {self.exporter.name} tensors are staged through host memory: {p}")
            return False
        return True

    def buffer(self, tensor: Any) -> Optional[bytes]:
        """The encoded DeviceBuffer for a contiguous tensor the exporter
        claims (the event recorded), or None to stage it (warned once)."""
        uuid = self.exporter.device_uuid(tensor)
        ex = self.exporter
        key = ex.storage_key(tensor)
        self._ops += 1
        if (self._ops & 255) == 0:
            self.flush(wait=False)
        e = self._cache.get(key)
        # Checked even where a finalizer watches the storage: a storage freed
        # and another made at its address before the releaser thread ran
        # must not reuse the old export (the block may be another one).
        if e is not None and e.export.alive is not None and not e.export.alive():
            self._retire(key, e)
            e = None
        if e is None:
            # A miss: first retire what was freed (where no finalizer says so,
            # the liveness checks find it), so that a freed allocation is
            # released before new memory goes out.
            self.flush(wait=False)
            try:
                exp = ex.export(tensor)
            except ExportUnavailable as err:
                _warn_once("export", f"hvdd: {ex.name} tensors are staged through host memory: {err}")
                return None
            self.exports += 1
            sent = self._sizes.get(exp.mem_handle)
            if sent is not None and sent != exp.alloc_size:
                # An allocation whose size the exporter could only bound
                # (no driver call): keep the size the daemon has.
                exp.alloc_size = sent
            e = _Entry(exp, key)
            with self._lock:
                self._cache[key] = e
                self._refs[exp.mem_handle] = self._refs.get(exp.mem_handle, 0) + 1
                self._sizes[exp.mem_handle] = exp.alloc_size
            e.watched = ex.on_free(tensor, lambda k=key, e=e: self._freed.put((k, e)))
            if not e.watched:
                self._unwatched = True
            elif self._releaser is None:
                self._releaser = threading.Thread(target=self._release_loop, name="hvdd-gpu-release", daemon=True)
                self._releaser.start()
        exp = e.export
        offset = exp.storage_offset + ex.element_offset(tensor)
        length = ex.nbytes(tensor)
        if offset + length > exp.alloc_size:
            _warn_once(
                "bounds",
                f"hvdd: {ex.name} tensors are staged through host memory: a tensor at offset {offset} + {length} "
                f"bytes lies outside the allocation size {exp.alloc_size} known for its IPC handle",
            )
            return None
        ev = ex.record_event(tensor)
        return encode_device_buffer(uuid, exp.mem_handle, exp.alloc_size, offset, length, ev)

    def _retire(self, key: Tuple[int, int], entry: Optional[_Entry] = None) -> Optional[bytes]:
        """Drops a storage's export (the cache's entry for key, if it is
        still entry), and releases its allocation's handle when it was the
        last one (returned)."""
        with self._lock:
            e = self._cache.get(key)
            if e is None or (entry is not None and e is not entry):
                return None
            del self._cache[key]
            h = e.export.mem_handle
            n = self._refs.get(h, 0) - 1
            if n > 0:
                self._refs[h] = n
                return None
            self._refs.pop(h, None)
            self._sizes.pop(h, None)
        self.released.append(h)
        self.client.release_device_memory([h])
        return h

    def _release_loop(self) -> None:
        """The releaser thread: retires storages as their finalizers queue
        them, so that the daemon closes a freed allocation's mapping at once
        (CUDA leaves freeing memory another process has mapped undefined,
        and torch's caching allocator may free a segment once its storages
        are gone)."""
        while True:
            item = self._freed.get()
            if item is None:
                return
            if isinstance(item, threading.Event):
                item.set()  # flush(wait=True)'s marker: everything before it is done
                continue
            with self._flush_lock:
                self._retire(*item)

    def flush(self, wait: bool = True) -> None:
        """Retires the exports of freed storages (finalizers queued them, or
        their liveness check fails) and releases the allocations no live
        export uses. With wait, also what the releaser thread has taken
        and not yet finished."""
        r = self._releaser
        if wait and r is not None and r.is_alive():
            done = threading.Event()
            self._freed.put(done)  # type: ignore[arg-type]
            done.wait(10)  # bounded: a closed session's thread has ended
        with self._flush_lock:
            while True:
                try:
                    item = self._freed.get_nowait()
                except queue.Empty:
                    break
                if isinstance(item, threading.Event):
                    item.set()
                elif item is not None:
                    self._retire(*item)
                else:
                    self._freed.put(None)  # close()'s: leave it for the thread
                    break
            if not self._unwatched:
                return
            for k, e in list(self._cache.items()):
                if e.export.alive is not None and not e.export.alive():
                    self._retire(k, e)

    # ----------------------------------------------------- device outputs

    def read_output(self, out: Any, mem_handle: bytes, alloc_size: int, offset: int, length: int) -> None:
        """Copies length bytes at offset of the daemon's device output of
        handle mem_handle (of alloc_size bytes) into the contiguous tensor
        out, and waits for the copy. The allocation stays mapped under the
        handle's bytes for the next output the daemon lends in it."""
        ex = self.exporter
        close: List[Any] = []
        try:
            with self._out_lock:
                self._reads += 1
                e = self._outputs.get(mem_handle)
                if e is not None and e.size != alloc_size:  # not the allocation mapped before
                    self._drop_output(mem_handle, e, close)
                    e = None
                if e is None:
                    try:
                        m = ex.open_output(out, mem_handle, alloc_size)
                    except NotImplementedError:
                        m = None
                    if m is not None:
                        self.output_opens += 1
                        e = self._outputs[mem_handle] = _Mapping(m, alloc_size)
                else:
                    self._outputs.move_to_end(mem_handle)
                if e is not None:
                    e.pins += 1
                    e.last = self._reads
                self._evict_outputs(close)
        finally:
            self._close_outputs(close)
        if e is None:  # an exporter that maps nothing for longer than a read
            ex.read_output(out, mem_handle, alloc_size, offset, length)
            return
        try:
            ex.copy_output(out, e.mapping, offset, length)
        finally:
            with self._out_lock:
                e.pins -= 1
                if e.stale and e.pins == 0:
                    close.append(e.mapping)
            self._close_outputs(close)

    def _drop_output(self, h: bytes, e: _Mapping, close: List[Any]) -> None:
        """Takes e out of the cache: closed now, or at its last unpin."""
        del self._outputs[h]
        if e.pins:
            e.stale = True
        else:
            close.append(e.mapping)

    def _evict_outputs(self, close: List[Any]) -> None:
        """Drops the least recently used mappings beyond output_cache, and
        those idle for over output_idle reads (_out_lock held)."""
        while self._outputs:
            h, e = next(iter(self._outputs.items()))
            if len(self._outputs) <= self.output_cache and self._reads - e.last <= self.output_idle:
                return
            if e.pins:
                return  # in use now: dropped by a later read
            self._drop_output(h, e, close)

    def _close_outputs(self, close: List[Any]) -> None:
        while close:
            m = close.pop()
            self.output_closes += 1
            try:
                self.exporter.close_output(m)
            except Exception:  # noqa: BLE001 - a closing process may have lost its context
                log.debug("hvdd: closing a device output's mapping failed", exc_info=True)

    def outputs_mapped(self) -> int:
        """The device outputs' allocations mapped now."""
        return len(self._outputs)

    # --------------------------------------------------- out-of-place pool

    def slot(self, tensor: Any) -> Optional[Slot]:
        """A slot for an out-of-place op on tensor (contiguous, device memory
        the session takes): the input's dtype and shape in a pool of the
        current stream, its memory exported once. None where no pool serves
        (the exporter keeps none, the tensor is larger than pool_max, the
        pool is full at pool_max, or memory for a pool ran out): the op then
        copies into a tensor of its own."""
        if self._pool_off:
            return None
        ex = self.exporter
        key = ex.pool_key(tensor)
        if key is None:
            return None
        nbytes = ex.nbytes(tensor)
        if _aligned(nbytes) > self.pool_max:
            return None
        with self._pool_lock:
            self._take_back_slots()
            sp = self._pools.get(key)
            if sp is None:
                sp = self._pools[key] = _StreamPools(key)
                self._forget_streams()
            else:
                self._pools.move_to_end(key)
            pool = sp.pools[-1] if sp.pools else None
            off = pool.slots.alloc(nbytes) if pool is not None else None
            if off is None:
                pool = self._grow(sp, tensor, nbytes)
                if pool is None:
                    return None
                off = pool.slots.alloc(nbytes)
                assert off is not None
        return Slot(self, sp, pool, off, ex.slot_view(pool.tensor, off, tensor))

    def _grow(self, sp: _StreamPools, like: Any, nbytes: int) -> Optional[_Pool]:
        """A new pool for sp, twice the last one's size (at least pool_min,
        and large enough for nbytes), which slots are taken from from now
        on; the older ones go once their slots are free (_pool_lock held)."""
        last = sp.pools[-1].slots.size if sp.pools else 0
        if last >= self.pool_max:
            return None
        size = max(self.pool_min, 2 * last)
        while size < nbytes:
            size *= 2
        size = _aligned(min(size, self.pool_max))
        try:
            t = self.exporter.new_pool(like, size)
        except Exception as e:  # noqa: BLE001 - out of memory, or no pools: a copy of its own
            log.debug("hvdd: no pool of %d bytes for out-of-place ops (%s)", size, e)
            return None
        self.pools_made += 1
        pool = _Pool(t, SlotAllocator(size))
        sp.pools = [p for p in sp.pools if p.slots.busy] + [pool]
        return pool

    def _forget_streams(self) -> None:
        """Drops the pools of the least recently used streams beyond
        pool_streams whose slots are all free (_pool_lock held): a job that
        makes streams as it goes must not keep a pool for each."""
        over = len(self._pools) - self.pool_streams
        for k in list(self._pools)[:-1]:  # not the stream just added
            if over <= 0:
                return
            sp = self._pools[k]
            if not any(p.slots.busy for p in sp.pools):
                sp.pools = []
                del self._pools[k]
                over -= 1

    def _take_back_slots(self) -> None:
        """Frees the slots queued by Slot.free, and drops outgrown pools
        whose last slot that was (_pool_lock held)."""
        while True:
            try:
                sp, pool, off = self._slots_freed.get_nowait()
            except queue.Empty:
                return
            pool.slots.free(off)
            if pool.slots.busy == 0 and sp.pools and pool is not sp.pools[-1]:
                sp.pools = [p for p in sp.pools if p is not pool]

    def pool_refused(self) -> None:
        """The pools' memory cannot go through CUDA IPC (its export failed):
        out-of-place ops copy into tensors of their own from now on."""
        with self._pool_lock:
            self._pool_off = True
            self._drop_pools()

    def _drop_pools(self) -> None:
        """Drops every pool (_pool_lock held): a slot lent still holds its
        pool's memory until it is freed."""
        self._take_back_slots()
        for sp in self._pools.values():
            sp.pools = []
        self._pools.clear()

    def pool_stats(self) -> Dict[Any, List[Tuple[int, int, int]]]:
        """stream -> (size, slots taken, bytes in them) of each of its pools,
        once the slots freed are taken back (tests)."""
        with self._pool_lock:
            self._take_back_slots()
            return {k: [(p.slots.size, p.slots.busy, p.slots.used) for p in sp.pools] for k, sp in self._pools.items()}

    def unmap_outputs(self) -> None:
        """Closes the device outputs mapped here. The client calls it before
        it says Goodbye: the daemon frees its output buffers when the
        connection closes, and CUDA leaves freeing memory another process
        still maps undefined."""
        close: List[Any] = []
        with self._out_lock:
            for h, e in list(self._outputs.items()):
                self._drop_output(h, e, close)
        self._close_outputs(close)

    def close(self) -> None:
        """Ends the releaser thread (the connection is closing: the daemon
        closes every mapping of a connection it loses), closes the device
        outputs still mapped here and drops the pools."""
        if self._releaser is not None:
            self._freed.put(None)
        self.unmap_outputs()
        with self._pool_lock:
            self._drop_pools()


# ------------------------------------------------------------- exporters

_exporters: List[Exporter] = []
_torch_exporter: Optional[Exporter] = None


def install_exporter(ex: Exporter) -> None:
    """Puts ex before the others (tests put a fake device's here)."""
    _exporters.insert(0, ex)


def remove_exporter(ex: Exporter) -> None:
    if ex in _exporters:
        _exporters.remove(ex)


def exporter_for(tensor: Any) -> Optional[Exporter]:
    """The exporter whose device memory tensor is, or None (a CPU tensor)."""
    for ex in _exporters:
        if ex.claims(tensor):
            return ex
    if getattr(tensor, "is_cuda", False):
        global _torch_exporter
        if _torch_exporter is None:
            _torch_exporter = TorchCudaExporter()
        return _torch_exporter
    return None


def has_exporters() -> bool:
    """Whether exporters other than torch's CUDA one are installed."""
    return bool(_exporters)


def session(client: Any, ex: Exporter) -> DeviceSession:
    """The client's session for ex (one per connection and exporter)."""
    sessions = client.device_sessions
    s = sessions.get(id(ex))
    if s is None or s.exporter is not ex:
        s = sessions[id(ex)] = DeviceSession(client, ex)
    return s
