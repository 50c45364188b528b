"""The client side of the GPU path, framework-neutral: device tensors handed
to the daemon as CUDA IPC memory handles, with no copy through host memory.

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
A framework registers its own (``hvdd/torch/_cuda_export.py``:
``TorchCudaExporter``, the real one); the tests put an exporter of
memfd-backed tensors before it (``tests/fake_cuda.py``), whose handles the
daemon's fake CUDA driver (``HVDD_GPU_DRIVER=fake``) opens. Everything
above the seam is the same for both. The modules, by concern:

- :mod:`._staging`: the staging warning, hvdd.tensorflow's device strings;
- :mod:`._exporter`: the seam (:class:`Exporter`, :class:`Export`), which
  exporter claims a tensor;
- :mod:`._handles`: the forms of UUIDs, torch's handles and allocator
  settings (pure);
- :mod:`._driver`: the libcuda calls the frameworks do not offer (ctypes);
- :mod:`._pool`: the pools of out-of-place ops and their slots;
- :mod:`._session`: :class:`DeviceSession`, a connection's GPU path.

The decisions per op (CUDA IPC or staging, in place or in a slot, the
DeviceBuffer and the read of a device output) are :mod:`hvdd.ops`'s
(``submit_device``), through the session and the exporter. Nothing here
imports a framework (tests/test_import_graph.py checks it).
"""

from __future__ import annotations

from ._driver import Driver, _Driver
from ._exporter import (
    Export,
    Exporter,
    ExportUnavailable,
    exporter_for,
    has_exporters,
    install_exporter,
    register_framework_exporter,
    remove_exporter,
)
from ._handles import IPC_HANDLE_SIZE, allocator_problem, format_uuid, parse_torch_handle
from ._pool import POOL_ALIGN, Slot, SlotAllocator
from ._session import DeviceSession, session
from ._staging import HvddStagingWarning, note_tf_device, reset_warnings, staged_device

__all__ = [
    "HvddStagingWarning",
    "ExportUnavailable",
    "Export",
    "Exporter",
    "DeviceSession",
    "Driver",
    "SlotAllocator",
    "Slot",
    "IPC_HANDLE_SIZE",
    "POOL_ALIGN",
    "format_uuid",
    "allocator_problem",
    "parse_torch_handle",
    "install_exporter",
    "remove_exporter",
    "register_framework_exporter",
    "exporter_for",
    "has_exporters",
    "session",
    "reset_warnings",
    "staged_device",
    "note_tf_device",
]
