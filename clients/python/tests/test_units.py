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


def test_encode_enqueue_matches_protobuf():
    """The hand encoder writes what the generated code writes, for every field
    and for values that need multi-byte and negative varints."""
    import random

    from hvdd._proto import hvdd_pb2 as pb
    from hvdd._wire import encode_enqueue

    rnd = random.Random(7)
    for i in range(2000):
        kw = dict(
            op=rnd.choice([1, 2, 3, 4, 5, 6, 7]),
            name=rnd.choice(["", "w", "allreduce.noname.%d" % i, "ü" * rnd.randint(1, 200)]),
            dtype=rnd.randint(0, 11),
            shape=[rnd.choice([0, 1, 127, 128, 300, 1 << 40]) for _ in range(rnd.randint(0, 5))],
            region=rnd.choice([0, 1, 0x7FFFFFFF]),
            offset=rnd.choice([0, 64, 1 << 33]),
            nbytes=rnd.choice([0, 4, 1 << 30]),
            reduce_op=rnd.randint(0, 5),
            prescale=rnd.choice([1.0, 0.5, -3.25]),
            postscale=rnd.choice([1.0, 1 / 3]),
            root_rank=rnd.choice([0, 1, 200]),
            splits=rnd.choice([None, [], [1, 2, 300], [0, 0]]),
            group=rnd.choice([0, 5, 1 << 60]),
            group_size=rnd.choice([2, 161]),
            process_set=rnd.choice([0, 3, -1]),
        )
        m = pb.ClientMessage()
        e = m.enqueue
        e.op = kw["op"]
        if kw["name"]:
            e.name = kw["name"]
        e.dtype = kw["dtype"]
        e.shape.extend(kw["shape"])
        if kw["nbytes"]:
            e.buffer.region = kw["region"]
            e.buffer.offset = kw["offset"]
            e.buffer.length = kw["nbytes"]
        e.reduce_op = kw["reduce_op"]
        if kw["prescale"] != 1.0:
            e.prescale = kw["prescale"]
        if kw["postscale"] != 1.0:
            e.postscale = kw["postscale"]
        e.root_rank = kw["root_rank"]
        if kw["splits"]:
            e.splits.extend(kw["splits"])
        if kw["group"]:
            e.group = kw["group"]
            e.group_size = kw["group_size"]
        e.process_set = kw["process_set"]
        got = encode_enqueue(**kw)
        assert pb.ClientMessage.FromString(got) == m, kw
        assert got == m.SerializeToString(), kw


def _client_over(monkeypatch, sock):
    """A client whose connection to the daemon is sock (the test plays the
    daemon at the other end)."""
    from hvdd._client import Client

    c = Client(socket_path="/nonexistent", local_rank=0, arena_size=1 << 20, start_timeout=5)
    monkeypatch.setattr(c, "_dial", lambda deadline: sock)
    return c


def test_refusal_before_hello(monkeypatch):
    """The daemon refused this process (a Fatal, then the connection closed)
    before its handshake wrote anything: the write fails, and connect must
    raise the daemon's reason, not the broken pipe (the two raced in CI)."""
    import socket

    from hvdd._proto import hvdd_pb2 as pb
    from hvdd._wire import HEADER, KIND_SERVER
    from hvdd.exceptions import HvddInternalError

    ours, daemons = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    m = pb.ServerMessage()
    m.fatal.code = pb.CODE_ABORTED
    m.fatal.error = "node 1 could not join the job: authentication failed"
    body = m.SerializeToString()
    daemons.sendall(HEADER.pack(b"HV", KIND_SERVER, 0, 0, len(body)) + body)
    daemons.close()
    c = _client_over(monkeypatch, ours)
    with pytest.raises(
        HvddInternalError, match="refused this process: node 1 could not join the job: authentication failed"
    ):
        c.connect()


def test_closed_before_hello(monkeypatch):
    """A daemon that closed the connection without a Fatal: connect raises
    the broken pipe itself."""
    import socket

    ours, daemons = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    daemons.close()
    c = _client_over(monkeypatch, ours)
    with pytest.raises(BrokenPipeError):
        c.connect()
