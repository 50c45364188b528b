"""``hvdd.torch``: Horovod's ``horovod.torch`` API on the hvdd daemon.

Use it as ``import hvdd.torch as hvd``; every name of ``horovod.torch`` that
hvdd implements has the same signature and meaning.
"""

from __future__ import annotations

from .. import basics as _basics
from ..basics import *  # noqa: F401,F403 (Horovod's common basics: basics.__all__)
from ..exceptions import HorovodInternalError, HostsUpdatedInterrupt, HvddInternalError
from . import elastic
from .compression import Compression
from .functions import allgather_object, broadcast_object, broadcast_optimizer_state, broadcast_parameters
from .mpi_ops import COLLECTIVES as _COLLECTIVES
from .mpi_ops import (
    allgather,
    allgather_async,
    allreduce,
    allreduce_,
    allreduce_async,
    allreduce_async_,
    alltoall,
    alltoall_async,
    barrier,
    broadcast,
    broadcast_,
    broadcast_async,
    broadcast_async_,
    grouped_allgather,
    grouped_allgather_async,
    grouped_allreduce,
    grouped_allreduce_,
    grouped_allreduce_async,
    grouped_allreduce_async_,
    grouped_reducescatter,
    grouped_reducescatter_async,
    join,
    poll,
    reducescatter,
    reducescatter_async,
    sparse_allreduce_async,
    synchronize,
)
from .optimizer import DistributedOptimizer
from .sync_batch_norm import SyncBatchNorm

__all__ = [
    # basics
    *_basics.__all__,
    "HorovodInternalError",
    "HvddInternalError",
    "HostsUpdatedInterrupt",
    # collectives
    *_COLLECTIVES,
    # training helpers
    "Compression",
    "DistributedOptimizer",
    "broadcast_parameters",
    "broadcast_optimizer_state",
    "broadcast_object",
    "allgather_object",
    "SyncBatchNorm",
    "elastic",
]
