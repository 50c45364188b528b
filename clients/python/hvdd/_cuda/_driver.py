"""The few CUDA driver calls the frameworks do not offer, through ctypes on
libcuda.so.1 (the one the framework has loaded, or loads): mapping another
process's allocation by its IPC handle, a device-to-device copy waited for,
an allocation's address range. No framework, no compiled extension.
"""

from __future__ import annotations

import ctypes
from typing import Any, Dict, List, Optional, Tuple

from ._handles import IPC_HANDLE_SIZE

__all__ = ["Driver"]


class _IpcHandle(ctypes.Structure):
    """CUipcMemHandle, passed by value."""

    _fields_ = [("reserved", ctypes.c_char * IPC_HANDLE_SIZE)]


class Driver:
    """libcuda's calls, bound at first use. ``opens`` and ``closes`` count
    the IPC mappings opened and closed; ``calls`` every call into libcuda
    by name (the per-op figures of docs/BENCHMARKS.md, issue 33 item 5)."""

    calls: Optional[Dict[str, int]] = None  # (None: a Driver made without __init__, in tests)

    def __init__(self) -> None:
        self.lib: Any = None
        self.opens = 0
        self.closes = 0
        self.calls = {}
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
        c = self.calls
        if c is not None:
            c[call] = c.get(call, 0) + 1
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
        rc = self._range(ctypes.byref(base), ctypes.byref(size), ctypes.c_uint64(ptr))
        c = self.calls
        if c is not None:
            c["cuMemGetAddressRange"] = c.get("cuMemGetAddressRange", 0) + 1
        if rc != 0:
            return None
        return int(base.value), int(size.value)


#: The name it had in hvdd._cuda (tests).
_Driver = Driver
