"""The seam between the protocol and a framework's device memory
(:class:`Exporter`), what an export is (:class:`Export`), and which exporter
claims a tensor.

Exporters come from two places: a framework registers its own when its
hvdd module is imported (:func:`register_framework_exporter`: hvdd.torch's
torch CUDA one, ``hvdd/torch/_cuda_export.py``), made at first use; tests
install others before them (:func:`install_exporter`: the fake device of
``tests/fake_cuda.py``).

Framework-neutral: nothing here imports a framework.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Hashable, List, Optional, Tuple

__all__ = [
    "ExportUnavailable",
    "Export",
    "Exporter",
    "install_exporter",
    "remove_exporter",
    "register_framework_exporter",
    "exporter_for",
    "has_exporters",
]


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

    def copy(self, dst: Any, src: Any) -> None:
        """Copies src's values into dst (contiguous, in memory of this
        exporter's, of src's dtype and shape), ordered on the current stream
        and recorded by no autograd: an out-of-place op's input into its
        slot, or into the output an in-place form was given."""
        dst.copy_(src.detach())

    def fits(self, out: Any, like: Any) -> bool:
        """Whether out (memory of this exporter's) can take the result of an
        op on like in place: contiguous, and of like's dtype."""
        return bool(out.is_contiguous()) and out.dtype == like.dtype

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

    #: Whether :meth:`wait_event` works: the session then tells the daemon
    #: that this client orders its use of results after the daemon's
    #: completion event (DeviceBuffer.client_waits), and a daemon run with
    #: ``--gpu-completion stream`` answers without waiting for the GPU.
    can_wait = False

    def wait_event(self, handle: bytes, tensor: Any) -> None:
        """Orders what the current stream of tensor's device runs next after
        the last record of the daemon's interprocess event named by handle
        (Done.device_event; the same handle op after op: open it once), as
        ProcessGroupNCCL's work.wait() orders the current stream."""
        raise NotImplementedError


# ------------------------------------------------------------- exporters

_exporters: List[Exporter] = []


class _Framework:
    """A framework's exporter, made at its first tensor."""

    __slots__ = ("claims", "make", "ex")

    def __init__(self, claims: Callable[[Any], bool], make: Callable[[], Exporter]) -> None:
        self.claims = claims
        self.make = make
        self.ex: Optional[Exporter] = None

    def get(self) -> Exporter:
        ex = self.ex
        if ex is None:
            ex = self.ex = self.make()
        return ex


_frameworks: List[_Framework] = []


def install_exporter(ex: Exporter) -> None:
    """Puts ex before the others (tests put a fake device's here)."""
    _exporters.insert(0, ex)


def remove_exporter(ex: Exporter) -> None:
    if ex in _exporters:
        _exporters.remove(ex)


def register_framework_exporter(claims: Callable[[Any], bool], make: Callable[[], Exporter]) -> None:
    """A framework's exporter of its device tensors: make() makes it at the
    first tensor claims() is true of (a cheap test, such as torch's
    ``is_cuda``). Registered once per framework module (again: ignored)."""
    for f in _frameworks:
        if f.make is make:
            return
    _frameworks.append(_Framework(claims, make))


def exporter_for(tensor: Any) -> Optional[Exporter]:
    """The exporter whose device memory tensor is, or None (a CPU tensor):
    the installed ones first, then the frameworks'."""
    for ex in _exporters:
        if ex.claims(tensor):
            return ex
    for f in _frameworks:
        if f.claims(tensor):
            return f.get()
    return None


def has_exporters() -> bool:
    """Whether exporters other than the frameworks' are installed."""
    return bool(_exporters)
