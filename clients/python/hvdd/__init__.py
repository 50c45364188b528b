"""hvdd: Horovod's API, served by a per-node daemon.

``import hvdd.torch as hvd`` is the drop-in replacement for
``import horovod.torch as hvd``. This package holds the framework-independent
basics (init, rank, size, reduce ops, process sets, errors) that every
framework module re-exports.
"""

from __future__ import annotations

import logging

from .basics import (
    PUBLIC as _BASICS,
    Adasum,
    Average,
    Max,
    Min,
    ProcessSet,
    Product,
    ReduceOp,
    Sum,
    add_process_set,
    ccl_built,
    cross_rank,
    cross_size,
    cuda_built,
    ddl_built,
    global_process_set,
    gloo_built,
    gloo_enabled,
    init,
    is_homogeneous,
    is_initialized,
    local_rank,
    local_size,
    mpi_built,
    mpi_enabled,
    mpi_threads_supported,
    nccl_built,
    rank,
    remove_process_set,
    rocm_built,
    shutdown,
    size,
    start_timeline,
    stop_timeline,
)
from .exceptions import (
    HorovodInternalError,
    HorovodVersionMismatchError,
    HostsUpdatedInterrupt,
    HvddInternalError,
    HvddUnimplementedError,
)

__version__ = "0.1.0"

__all__ = [
    *_BASICS,
    "HvddInternalError",
    "HorovodInternalError",
    "HvddUnimplementedError",
    "HostsUpdatedInterrupt",
    "HorovodVersionMismatchError",
    "__version__",
]

logging.getLogger(__name__).addHandler(logging.NullHandler())
