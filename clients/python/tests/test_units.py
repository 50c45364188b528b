"""Unit tests that need no daemon: the arena, framing helpers, API surface."""

from __future__ import annotations

import random

import pytest

import hvdd
import hvdd.torch as hvd
from hvdd._shm import ALIGN, Arena, Region


def test_arena_alloc_free_coalesces():
    a = Arena(1 << 16)
    rng = random.Random(1)
    live = {}
    for _ in range(2000):
        if live and rng.random() < 0.5:
            off = rng.choice(list(live))
            a.free(off)
            del live[off]
        else:
            n = rng.randint(1, 3000)
            off = a.alloc(n)
            if off < 0:
                continue
            assert off % ALIGN == 0
            for o, m in live.items():
                assert off + n <= o or o + m <= off, "overlap"
            live[off] = n
    for off in list(live):
        a.free(off)
    assert a.alloc(1 << 16) == 0  # fully coalesced


def test_region_is_sealed_memfd():
    import fcntl

    r = Region.create(0, 1 << 20)
    seals = fcntl.fcntl(r.fd, fcntl.F_GET_SEALS)
    assert seals & fcntl.F_SEAL_SHRINK
    r.array[:4] = 7
    r.close()


def test_api_surface_matches_horovod_torch():
    names = """init shutdown is_initialized size rank local_size local_rank cross_size cross_rank
    is_homogeneous mpi_threads_supported mpi_enabled mpi_built gloo_enabled gloo_built nccl_built ddl_built
    ccl_built cuda_built rocm_built start_timeline stop_timeline Average Sum Adasum Min Max Product ProcessSet
    global_process_set add_process_set remove_process_set HorovodInternalError HostsUpdatedInterrupt
    allreduce allreduce_ allreduce_async allreduce_async_ grouped_allreduce grouped_allreduce_
    grouped_allreduce_async grouped_allreduce_async_ sparse_allreduce_async allgather allgather_async
    grouped_allgather grouped_allgather_async broadcast broadcast_ broadcast_async broadcast_async_ alltoall
    alltoall_async reducescatter reducescatter_async grouped_reducescatter grouped_reducescatter_async join
    barrier poll synchronize Compression DistributedOptimizer broadcast_parameters broadcast_optimizer_state
    broadcast_object allgather_object SyncBatchNorm elastic""".split()
    missing = [n for n in names if not hasattr(hvd, n)]
    assert not missing
    assert set(hvd.__all__) <= set(dir(hvd))
    assert set(hvdd.__all__) <= set(dir(hvdd))


def test_not_initialized_errors():
    assert not hvd.is_initialized()
    with pytest.raises(ValueError, match=r"^Horovod has not been initialized; use hvd.init\(\).$"):
        hvd.size()
