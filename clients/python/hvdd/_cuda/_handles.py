"""The forms of what the GPU path names: a GPU's UUID as the daemon's Welcome
writes it, the allocator settings under which legacy CUDA IPC cannot share
torch's memory, and torch's form of an IPC handle. Pure functions on
strings and bytes (a framework's exporter calls them with what its framework
returned): nothing here imports a framework.
"""

from __future__ import annotations

from typing import Any, Dict, Optional

from ._exporter import ExportUnavailable

__all__ = ["IPC_HANDLE_SIZE", "format_uuid", "allocator_problem", "parse_torch_handle"]

#: cuIpcGetMemHandle's and cuIpcGetEventHandle's handle size.
IPC_HANDLE_SIZE = 64


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
