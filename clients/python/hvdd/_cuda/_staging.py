"""Why a device tensor goes through host memory: the warning (one per process
and reason), and hvdd.tensorflow's device strings (TensorFlow offers no CUDA
IPC handle of a tensor's memory, so its GPU tensors are always staged).

A leaf of the GPU path: nothing of hvdd, no framework.
"""

from __future__ import annotations

import logging
import threading
import warnings
from typing import Optional, Set

__all__ = ["HvddStagingWarning", "reset_warnings", "staged_device", "note_tf_device"]

log = logging.getLogger("hvdd._cuda")


class HvddStagingWarning(UserWarning):
    """A device tensor goes through host memory instead of CUDA IPC (slower;
    the message says why and how to avoid it). Issued once per process and
    reason."""


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
