"""Scenarios of test_torch_p2p.py, run on every rank under torchrun
(``python torch_p2p_workers.py NAME``): torch.distributed's point-to-point
calls (send, recv, isend, irecv, batch_isend_irecv) on the ``hvdd`` backend
and, as the reference, the same calls on a gloo group of the same ranks in
the same process. Each exits non-zero on the first difference and prints
``OK <scenario> <rank>`` at the end.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from datetime import timedelta
from typing import Any, Callable, Optional

import torch
import torch.distributed as dist

from torch_distributed_workers import ALL_DTYPES, data, init, say, same


def _both(gloo: Any, fn: Callable[[Optional[Any]], torch.Tensor], what: str) -> torch.Tensor:
    """fn(group) on the hvdd default group (None) and on gloo: the results
    must be the same; returns hvdd's."""
    got = fn(None)
    want = fn(gloo)
    if got.is_complex():
        got, want = torch.view_as_real(got), torch.view_as_real(want)
    same(got, want, f"{what} (hvdd against gloo)")
    return got


def _ring(group: Optional[Any], dt: torch.dtype, shape: Any = (5, 3), seed: int = 0) -> torch.Tensor:
    """isend to the next rank, irecv from the previous, then wait both."""
    n, me = dist.get_world_size(), dist.get_rank()
    out = data(me, dt, shape, seed)
    into = torch.zeros(shape, dtype=dt)
    r = dist.irecv(into, (me - 1) % n, group=group)
    s = dist.isend(out, (me + 1) % n, group=group)
    assert s.wait() and r.wait()
    return into


def p2p() -> None:
    gloo = init()
    n, me = dist.get_world_size(), dist.get_rank()
    nxt, prev = (me + 1) % n, (me - 1) % n

    # A ring of isend/irecv in every dtype (complex goes as its real view).
    for dt in ALL_DTYPES + [torch.complex64]:
        got = _both(gloo, lambda g: _ring(g, dt), f"ring of {dt}")
        if dt.is_complex:
            continue
        same(got, data(prev, dt), f"ring of {dt}: rank {prev}'s tensor")
    # Empty, and large (the daemon copies above 1 MiB off its loop).
    _both(gloo, lambda g: _ring(g, torch.float32, (0,)), "ring of an empty tensor")
    _both(gloo, lambda g: _ring(g, torch.float32, (3, 1 << 17), seed=1), "ring of 1.5 MiB")

    # Blocking send/recv in pairs (0->1, 1->0), bfloat16 and float16; on
    # hvdd also non-contiguous tensors (gloo refuses them: "input tensor has
    # to be contiguous"), the received one written in place.
    for dt in (torch.bfloat16, torch.float16, torch.int64):
        for g in (None, gloo):
            if me >= 2:
                continue
            peer = 1 - me
            strided = g is None
            if me == 0:
                dist.send(data(0, dt, (4, 6), seed=2), peer, group=g)
                back = torch.zeros(6, 4, dtype=dt).t() if strided else torch.zeros(4, 6, dtype=dt)
                dist.recv(back, peer, group=g)
                same(back, data(1, dt, (4, 6), seed=3), f"recv of {dt} (strided {strided})")
            else:
                into = torch.zeros(4, 6, dtype=dt)
                assert dist.recv(into, peer, group=g) == peer
                same(into, data(0, dt, (4, 6), seed=2), f"recv of {dt}")
                out = data(1, dt, (4, 6), seed=3)
                dist.send(out.t().contiguous().t() if strided else out, peer, group=g)

    # isend/irecv's works: not done until the other side came, then
    # wait() True, is_completed(), is_success(), the future's result. The
    # sender sends only after gloo's barrier, which the receiver passes
    # with its irecv posted.
    for g in (None, gloo):
        if me == 1:
            into = torch.zeros(7)
            w = dist.irecv(into, 0, group=g)
            assert not w.is_completed(), "irecv completed before rank 0 sent"
            dist.barrier(group=gloo)
            assert w.wait() is True
            assert w.is_completed()
            if g is None:  # gloo's recv work has no future ("not implemented")
                assert w.is_success() and w.exception() is None
                fut = w.get_future().wait()
                assert len(fut) == 1 and fut[0] is into, fut
            same(into, torch.arange(7.0), "irecv's tensor")
        elif me == 0:
            dist.barrier(group=gloo)
            w = dist.isend(torch.arange(7.0), 1, group=g)
            assert w.wait() is True and w.is_completed()
        else:
            dist.barrier(group=gloo)

    # batch_isend_irecv: a ring both ways, in one batch (the order of the
    # ops in the list does not matter), with P2POp's tags.
    def batch(g: Optional[Any]) -> torch.Tensor:
        a, b = torch.zeros(3, 2), torch.zeros(3, 2)
        ops = [
            dist.P2POp(dist.irecv, a, prev, g, tag=4),
            dist.P2POp(dist.isend, data(me, torch.float32, (3, 2), seed=5), nxt, g, tag=4),
            dist.P2POp(dist.isend, data(me, torch.float32, (3, 2), seed=6), prev, g, tag=5),
            dist.P2POp(dist.irecv, b, nxt, g, tag=5),
        ]
        reqs = dist.batch_isend_irecv(ops)
        assert len(reqs) == 4, reqs
        for r in reqs:
            r.wait()
        return torch.cat([a, b])

    got = _both(gloo, batch, "batch_isend_irecv")
    same(got[:3], data(prev, torch.float32, (3, 2), seed=5), "batch_isend_irecv from the previous rank")
    same(got[3:], data(nxt, torch.float32, (3, 2), seed=6), "batch_isend_irecv from the next rank")

    # Tags apart, and order on one channel: rank 0 sends tag 1, tag 2, then
    # three on tag 3; rank 1 receives tag 2 first, then tag 1, then tag 3's
    # in their order.
    def tags(g: Optional[Any]) -> torch.Tensor:
        if me == 0:
            ws = [dist.isend(torch.full((2,), float(k)), 1, group=g, tag=t) for k, t in [(1, 1), (2, 2)]]
            ws += [dist.isend(torch.full((2,), 30.0 + k), 1, group=g, tag=3) for k in range(3)]
            for w in ws:
                w.wait()
            return torch.zeros(0)
        if me == 1:
            got = []
            for t in (2, 1, 3, 3, 3):
                x = torch.zeros(2)
                dist.recv(x, 0, group=g, tag=t)
                got.append(x)
            return torch.cat(got)
        return torch.zeros(0)

    got = _both(gloo, tags, "tags")
    if me == 1:
        same(got, torch.tensor([2.0, 2, 1, 1, 30, 30, 31, 31, 32, 32]), "tags apart, in order on tag 3")

    # A tag per transfer (a step number): the group keeps a bounded number
    # of channels.
    if me < 2:
        for step in range(150):
            x = torch.zeros(1)
            if me == 0:
                dist.send(torch.tensor([float(step)]), 1, tag=1000 + step)
                dist.recv(x, 1, tag=1000 + step)
            else:
                dist.recv(x, 0, tag=1000 + step)
                dist.send(x, 0, tag=1000 + step)
            same(x, torch.tensor([float(step)]), f"a transfer tagged {1000 + step}")
        pg = dist.distributed_c10d._get_default_group()
        assert len(pg._p2p) <= 64, f"{len(pg._p2p)} channels kept"

    # A recv posted before a collective that its sender's send waits for:
    # the collective completes regardless (p2p works complete apart from
    # the group's collectives).
    if me < 2:
        for g in (None, gloo):
            x = torch.zeros(3)
            w = dist.irecv(x, 1 - me, group=g)
            dist.all_reduce(torch.ones(2), group=g if g is not None else None)
            dist.send(torch.full((3,), float(me)), 1 - me, group=g)
            w.wait()
            same(x, torch.full((3,), float(1 - me)), "recv posted before a collective")
    else:
        dist.all_reduce(torch.ones(2))
        dist.all_reduce(torch.ones(2), group=gloo)

    # A subgroup of ranks 0 and n-1: its ranks given as global ranks (dst,
    # src) or as group ranks (group_dst, group_src). Every rank makes it.
    last = n - 1
    sub = dist.new_group([0, last], backend="hvdd")
    gsub = dist.new_group([0, last], backend="gloo")
    for g in (sub, gsub):
        if me == 0:
            dist.send(torch.tensor([1.0, 2.0]), last, group=g)
            dist.send(torch.tensor([3.0, 4.0]), group=g, group_dst=1)
            x = torch.zeros(2, dtype=torch.int32)
            dist.recv(x, group=g, group_src=1)
            same(x, torch.tensor([5, 6], dtype=torch.int32), "recv in a subgroup")
        elif me == last:
            x, y = torch.zeros(2), torch.zeros(2)
            assert dist.recv(x, 0, group=g) == 0
            dist.recv(y, group=g, group_src=0)
            same(torch.cat([x, y]), torch.tensor([1.0, 2, 3, 4]), "recvs in a subgroup")
            dist.send(torch.tensor([5, 6], dtype=torch.int32), 0, group=g)
    dist.barrier()

    # recv from any source: a clear refusal.
    try:
        dist.recv(torch.zeros(1))
    except NotImplementedError as e:
        assert "any source" in str(e) and "src=" in str(e), e
    else:
        raise AssertionError("recv without src did not raise")
    # A bad peer raises at the call.
    try:
        dist.isend(torch.zeros(1), group=dist.group.WORLD, group_dst=n + 3)
    except (ValueError, RuntimeError) as e:
        say(f"bad peer: {type(e).__name__}: {e}")
    else:
        raise AssertionError(f"isend to group rank {n + 3} of {n} did not raise")

    dist.barrier()
    dist.destroy_process_group()
    say(f"OK p2p {me}")


def p2p_mismatch() -> None:
    """Rank 0's send and rank 1's recv differ in size, then in dtype: both
    sides raise, naming the problem; the job goes on."""
    dist.init_process_group("hvdd", timeout=timedelta(seconds=300))
    me = dist.get_rank()
    for what, send, recv in [
        ("size", torch.ones(4), torch.zeros(8)),
        ("dtype", torch.ones(4), torch.zeros(4, dtype=torch.int32)),
    ]:
        try:
            if me == 0:
                dist.send(send, 1)
            else:
                dist.recv(recv, 0)
        except Exception as e:
            say(f"RAISED {what}: {type(e).__name__}: {e}")
        else:
            raise AssertionError(f"send/recv of a different {what} did not raise")
    t = torch.ones(2)
    dist.all_reduce(t)
    same(t, torch.full((2,), 2.0), "all_reduce after the mismatches")
    dist.destroy_process_group()
    say(f"OK p2p_mismatch {me}")


def p2p_fault() -> None:
    """Rank 2 of 3 is killed while rank 0 waits in a recv from it and rank 1
    in a send to it: both raise, naming rank 2, long before the timeout."""
    dist.init_process_group("hvdd", timeout=timedelta(seconds=300))
    gloo = dist.new_group(backend="gloo")
    me = dist.get_rank()
    dist.all_reduce(torch.ones(1))  # the job works
    if me == 2:
        dist.barrier(group=gloo)
        os.kill(os.getpid(), signal.SIGKILL)
    w = dist.irecv(torch.zeros(4), 2) if me == 0 else dist.isend(torch.ones(4), 2)
    dist.barrier(group=gloo)  # rank 2 dies after this, with both posted
    t0 = time.monotonic()
    try:
        w.wait()
    except Exception as e:
        say(f"RAISED after {time.monotonic() - t0:.2f} s: {type(e).__name__}: {e}")
        os._exit(0)
    raise AssertionError("the transfer with the killed rank did not raise")


def p2p_nodes() -> None:
    """Under hvdd run on 2 nodes of 2 ranks (0, 1 | 2, 3): transfers
    across nodes (rank r with r+2) and on one node, against each rank's
    deterministic data: isend/irecv of several dtypes, batch_isend_irecv,
    tags apart, a subgroup across the nodes, a size mismatch raising on
    both sides."""
    dist.init_process_group("hvdd")
    n, me = dist.get_world_size(), dist.get_rank()
    assert n == 4, n
    # Two ranks on each of two nodes, node-major.
    where = (os.environ.get("HVDD_CROSS_RANK"), os.environ.get("HVDD_CROSS_SIZE"), os.environ.get("HVDD_LOCAL_SIZE"))
    assert where == (str(me // 2), "2", "2"), where
    far, mate = (me + 2) % n, me ^ 1
    for dt in (torch.float32, torch.bfloat16, torch.float16, torch.int64, torch.bool):
        for peer in (far, mate):
            into = torch.zeros(5, 3, dtype=dt)
            r = dist.irecv(into, peer)
            dist.isend(data(me, dt, seed=7), peer).wait()
            r.wait()
            same(into, data(peer, dt, seed=7), f"irecv of {dt} from rank {peer}")
    a, b = torch.zeros(1 << 18), torch.zeros(3)
    reqs = dist.batch_isend_irecv(
        [
            dist.P2POp(dist.irecv, a, far),
            dist.P2POp(dist.isend, torch.full((1 << 18,), float(me)), far),
            dist.P2POp(dist.isend, torch.full((3,), float(me)), mate, tag=2),
            dist.P2POp(dist.irecv, b, mate, tag=2),
        ]
    )
    for w in reqs:
        w.wait()
    same(a, torch.full((1 << 18,), float(far)), "batch_isend_irecv across nodes (1 MiB)")
    same(b, torch.full((3,), float(mate)), "batch_isend_irecv on the node")
    if me in (0, 2):
        w1 = dist.isend(torch.tensor([1.0]), far, tag=1)
        w2 = dist.isend(torch.tensor([2.0]), far, tag=2)
        x2, x1 = torch.zeros(1), torch.zeros(1)
        dist.recv(x2, far, tag=2)
        dist.recv(x1, far, tag=1)
        w1.wait()
        w2.wait()
        same(torch.cat([x1, x2]), torch.tensor([1.0, 2.0]), "tags apart across nodes")
    sub = dist.new_group([1, 2], backend="hvdd")
    if me in (1, 2):
        other = 3 - me
        x = torch.zeros(4, dtype=torch.int32)
        r = dist.irecv(x, other, group=sub)
        dist.send(torch.arange(4, dtype=torch.int32) + me, other, group=sub)
        r.wait()
        same(x, torch.arange(4, dtype=torch.int32) + other, "recv in a subgroup across nodes")
    try:
        if me == 0:
            dist.send(torch.ones(4), 2, tag=9)
        elif me == 2:
            dist.recv(torch.zeros(8), 0, tag=9)
    except Exception as e:
        say(f"RAISED {me}: {type(e).__name__}: {e}")
    else:
        if me in (0, 2):
            raise AssertionError("a send and recv of different sizes across nodes did not raise")
    dist.barrier()
    dist.destroy_process_group()
    say(f"OK p2p_nodes {me}")


SCENARIOS = {"p2p": p2p, "p2p_mismatch": p2p_mismatch, "p2p_fault": p2p_fault, "p2p_nodes": p2p_nodes}

if __name__ == "__main__":
    SCENARIOS[sys.argv[1]]()
