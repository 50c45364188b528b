"""Scenarios of test_torch_distributed.py, run on every rank
(``python torch_distributed_workers.py NAME [ARGS]``, under torchrun or
started by the test with torch's rank variables).

Each scenario runs torch.distributed's collectives on the ``hvdd`` backend
and, as the reference, the same calls on a gloo group of the same ranks in
the same process (``new_group(backend="gloo")``), plus a reference computed
here from every rank's deterministic inputs where gloo has no such op. It
exits non-zero on the first difference and prints ``OK <scenario>`` at the
end.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from datetime import timedelta
from typing import Any, Callable, List, Optional

import torch
import torch.distributed as dist

import hvdd.torch.distributed  # noqa: F401 (registers the backend)

R = dist.ReduceOp

INT_DTYPES = [torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64]
FLOAT_DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
ALL_DTYPES = INT_DTYPES + FLOAT_DTYPES + [torch.bool]


def say(msg: str) -> None:
    """Writes one line in one write(2), whole even when the ranks share a pipe
    (print writes the line and its newline apart)."""
    os.write(1, (msg + "\n").encode())


def log(*a: Any) -> None:
    say(" ".join([f"[rank {os.environ.get('RANK', '?')}]", *map(str, a)]))


def data(rank: int, dtype: torch.dtype, shape=(5, 3), seed: int = 0) -> torch.Tensor:
    """Rank-specific deterministic input with small values (no overflow of
    a product over 4 ranks)."""
    g = torch.Generator().manual_seed(1000 * seed + 17 * rank + 3)
    if dtype is torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    if dtype.is_floating_point:
        return (torch.randint(-6, 7, shape, generator=g).double() / 4).to(dtype)
    lo = 0 if dtype is torch.uint8 else -3
    return torch.randint(lo, 4, shape, generator=g).to(dtype)


def tol(dt: torch.dtype) -> float:
    return {torch.float16: 1e-2, torch.bfloat16: 5e-2, torch.float32: 1e-5, torch.float64: 1e-12}.get(dt, 0.0)


def same(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    if got.dtype != want.dtype or tuple(got.shape) != tuple(want.shape):
        raise AssertionError(f"{what}: {got.dtype}{tuple(got.shape)}, want {want.dtype}{tuple(want.shape)}")
    if got.dtype.is_floating_point or got.dtype.is_complex:
        ok = torch.allclose(got.double(), want.double(), atol=tol(got.dtype), rtol=tol(got.dtype))
    else:
        ok = torch.equal(got, want)
    if not ok:
        raise AssertionError(f"{what}: got\n{got}\nwant\n{want}")


def local_reduce(ts: List[torch.Tensor], op: Any, factor: float = 1.0) -> torch.Tensor:
    """The reduction of ts by op, computed here (the reference where gloo has none)."""
    dt = ts[0].dtype
    if op in (R.BAND, R.BOR, R.BXOR):
        f = {R.BAND: torch.bitwise_and, R.BOR: torch.bitwise_or, R.BXOR: torch.bitwise_xor}[op]
        acc = ts[0].clone()
        for t in ts[1:]:
            acc = f(acc, t)
        return acc
    if dt is torch.bool:
        st = torch.stack(ts)
        return st.any(0) if op in (R.SUM, R.MAX) else st.all(0)
    x = [t.double() for t in ts]
    if op == R.SUM:
        r = sum(x[1:], x[0])
    elif op == R.AVG:
        r = sum(x[1:], x[0]) / len(x)
    elif op == R.PREMUL_SUM:
        r = sum(x[1:], x[0]) * factor
    elif op == R.MIN:
        r = torch.stack(x).min(0).values
    elif op == R.MAX:
        r = torch.stack(x).max(0).values
    else:
        r = x[0]
        for t in x[1:]:
            r = r * t
    if not dt.is_floating_point:
        r = r.trunc()
    return r.to(dt)


def gloo_supports(fn: Callable[[], Any]) -> bool:
    """Runs fn() (a call on the gloo group); False where gloo refuses it (an
    op or dtype it does not have), which leaves nothing to compare."""
    try:
        fn()
        return True
    except (RuntimeError, ValueError, TypeError, NotImplementedError) as e:
        log(f"gloo refuses: {type(e).__name__}: {str(e).splitlines()[0][:120]}")
        return False


def init(**kw: Any) -> Any:
    dist.init_process_group("hvdd", **kw)
    assert dist.get_backend() == "hvdd", dist.get_backend()
    return dist.new_group(backend="gloo")


# ------------------------------------------------------------- all_reduce


def allreduce_matrix() -> None:
    gloo = init()
    n, me = dist.get_world_size(), dist.get_rank()
    checked_gloo = 0
    for dt in ALL_DTYPES:
        ops = [R.SUM, R.MIN, R.MAX, R.PRODUCT]
        if not dt.is_floating_point:
            ops += [R.BAND, R.BOR, R.BXOR]
        if dt.is_floating_point:
            ops += [R.AVG]
        for op in ops:
            inputs = [data(r, dt, seed=int(op)) for r in range(n)]
            want = local_reduce(inputs, op)
            t = inputs[me].clone()
            dist.all_reduce(t, op=op)
            same(t, want, f"all_reduce {dt} {op}")
            g = inputs[me].clone()
            if gloo_supports(lambda: dist.all_reduce(g, op=op, group=gloo)):
                same(t, g, f"all_reduce {dt} {op} against gloo")
                checked_gloo += 1
    # PREMUL_SUM (NCCL's; gloo has none): the local reference.
    for dt in (torch.float32, torch.float64, torch.bfloat16):
        inputs = [data(r, dt, seed=9) for r in range(n)]
        t = inputs[me].clone()
        dist.all_reduce(t, op=torch.distributed._make_nccl_premul_sum(0.5))
        same(t, local_reduce(inputs, R.PREMUL_SUM, 0.5), f"all_reduce {dt} PREMUL_SUM(0.5)")
    # Complex: as torch views it, pairs of reals.
    zs = [torch.complex(data(r, torch.float32), data(r, torch.float32, seed=1)) for r in range(n)]
    z = zs[me].clone()
    dist.all_reduce(z)
    zg = zs[me].clone()
    dist.all_reduce(zg, group=gloo)
    assert torch.allclose(z, zg), (z, zg)
    # Non-contiguous tensors, and an empty one.
    base = data(me, torch.float32, shape=(4, 6))
    nc = base.t()
    want = nc.clone()
    dist.all_reduce(want, group=gloo)
    dist.all_reduce(nc)
    same(base.t(), want, "all_reduce of a transposed tensor")
    e = torch.empty(0)
    dist.all_reduce(e)
    # all_reduce_coalesced
    ts = [data(me, torch.float32, shape=(k + 1,), seed=k) for k in range(4)]
    gs = [t.clone() for t in ts]
    dist.all_reduce_coalesced(ts)
    dist.all_reduce_coalesced(gs, group=gloo)
    for k, (a, b) in enumerate(zip(ts, gs)):
        same(a, b, f"all_reduce_coalesced[{k}]")
    assert checked_gloo > 20, f"only {checked_gloo} combinations checked against gloo"
    log(f"checked {checked_gloo} dtype x op combinations against gloo")
    dist.destroy_process_group()
    say(f"OK allreduce_matrix {me}")


# ---------------------------------------------------------- the others


def collectives() -> None:
    gloo = init()
    n, me = dist.get_world_size(), dist.get_rank()
    from hvdd.torch.distributed import _startup

    w = _startup.current().client.welcome  # the daemon's placement of this rank
    say(f"PLACE {me} nodes {w.cross_size} local {w.local_rank}/{w.local_size}")
    assert n >= 2
    for dt in (torch.float32, torch.bfloat16, torch.float16, torch.int64, torch.uint8):
        x = data(me, dt)
        # broadcast
        for src in range(n):
            a, b = x.clone(), x.clone()
            dist.broadcast(a, src)
            dist.broadcast(b, src, group=gloo)
            same(a, b, f"broadcast {dt} from {src}")
            same(a, data(src, dt), f"broadcast {dt} from {src} (reference)")
        # reduce
        for dst in range(n):
            a, b = x.clone(), x.clone()
            dist.reduce(a, dst, op=R.SUM)
            dist.reduce(b, dst, op=R.SUM, group=gloo)
            if me == dst:
                same(a, b, f"reduce {dt} to {dst}")
                same(a, local_reduce([data(r, dt) for r in range(n)], R.SUM), f"reduce {dt} to {dst} (reference)")
        # all_gather, all_gather_into_tensor
        outs = [torch.empty_like(x) for _ in range(n)]
        gouts = [torch.empty_like(x) for _ in range(n)]
        dist.all_gather(outs, x)
        dist.all_gather(gouts, x, group=gloo)
        for r in range(n):
            same(outs[r], gouts[r], f"all_gather {dt}[{r}]")
            same(outs[r], data(r, dt), f"all_gather {dt}[{r}] (reference)")
        big = torch.empty((n * x.shape[0],) + tuple(x.shape[1:]), dtype=dt)
        gbig = torch.empty_like(big)
        dist.all_gather_into_tensor(big, x)
        dist.all_gather_into_tensor(gbig, x, group=gloo)
        same(big, gbig, f"all_gather_into_tensor {dt}")
        # gather, scatter
        for root in range(n):
            gl = [torch.empty_like(x) for _ in range(n)] if me == root else None
            ggl = [torch.empty_like(x) for _ in range(n)] if me == root else None
            dist.gather(x, gl, dst=root)
            dist.gather(x, ggl, dst=root, group=gloo)
            if me == root:
                for r in range(n):
                    same(gl[r], ggl[r], f"gather {dt} to {root} [{r}]")
            pieces = [data(r, dt, seed=root + 5) for r in range(n)] if me == root else None
            a, b = torch.empty_like(x), torch.empty_like(x)
            dist.scatter(a, pieces, src=root)
            dist.scatter(b, [p.clone() for p in pieces] if pieces else None, src=root, group=gloo)
            same(a, b, f"scatter {dt} from {root}")
            same(a, data(me, dt, seed=root + 5), f"scatter {dt} from {root} (reference)")
        # all_to_all: tensors of different sizes between each pair of ranks
        ins = [data(me, dt, shape=(me + r + 1, 2), seed=r) for r in range(n)]
        outs = [torch.empty((r + me + 1, 2), dtype=dt) for r in range(n)]
        gouts = [torch.empty_like(o) for o in outs]
        dist.all_to_all(outs, ins)
        gloo_a2a = gloo_supports(lambda: dist.all_to_all(gouts, [i.clone() for i in ins], group=gloo))
        for r in range(n):
            same(outs[r], data(r, dt, shape=(r + me + 1, 2), seed=me), f"all_to_all {dt}[{r}] (reference)")
            if gloo_a2a:
                same(outs[r], gouts[r], f"all_to_all {dt}[{r}]")
        # all_to_all_single with uneven splits: rank s sends s+r+1 rows to rank r
        in_splits = [me + r + 1 for r in range(n)]
        out_splits = [r + me + 1 for r in range(n)]
        inp = data(me, dt, shape=(sum(in_splits), 3), seed=7)
        out = torch.empty((sum(out_splits), 3), dtype=dt)
        gout = torch.empty_like(out)
        dist.all_to_all_single(out, inp, out_splits, in_splits)
        dist.all_to_all_single(gout, inp.clone(), out_splits, in_splits, group=gloo)
        same(out, gout, f"all_to_all_single {dt} (uneven)")
        # and even
        inp = data(me, dt, shape=(2 * n, 3), seed=8)
        out, gout = torch.empty_like(inp), torch.empty_like(inp)
        dist.all_to_all_single(out, inp)
        dist.all_to_all_single(gout, inp.clone(), group=gloo)
        same(out, gout, f"all_to_all_single {dt} (even)")
        if dt is not torch.uint8:
            # reduce_scatter, reduce_scatter_tensor
            rs_in = [data(me, dt, seed=10 + r) for r in range(n)]
            a = torch.empty_like(x)
            dist.reduce_scatter(a, [t.clone() for t in rs_in])
            want = local_reduce([data(r, dt, seed=10 + me) for r in range(n)], R.SUM)
            same(a, want, f"reduce_scatter {dt} (reference)")
            b = torch.empty_like(x)
            if gloo_supports(lambda: dist.reduce_scatter(b, [t.clone() for t in rs_in], group=gloo)):
                same(a, b, f"reduce_scatter {dt}")
            big = torch.cat(rs_in)
            a = torch.empty_like(x)
            dist.reduce_scatter_tensor(a, big.clone())
            same(a, want, f"reduce_scatter_tensor {dt} (reference)")
            for op in (R.MAX, R.MIN) + ((R.BOR,) if not dt.is_floating_point else ()):
                a = torch.empty_like(x)
                dist.reduce_scatter_tensor(a, big.clone(), op=op)
                same(a, local_reduce([data(r, dt, seed=10 + me) for r in range(n)], op), f"reduce_scatter {dt} {op}")
    # objects
    objs: List[Any] = [None] * n
    dist.all_gather_object(objs, {"rank": me, "s": "x" * me})
    assert objs == [{"rank": r, "s": "x" * r} for r in range(n)], objs
    got = [None] * n if me == 0 else None
    dist.gather_object(("g", me), got, dst=0)
    if me == 0:
        assert got == [("g", r) for r in range(n)], got
    lst = [f"b{k}" for k in range(3)] if me == 1 else [None] * 3
    dist.broadcast_object_list(lst, src=1)
    assert lst == ["b0", "b1", "b2"], lst
    out_l: List[Any] = [None]
    dist.scatter_object_list(out_l, [{"to": r} for r in range(n)] if me == 0 else None, src=0)
    assert out_l == [{"to": me}], out_l
    # barrier, monitored_barrier
    dist.barrier()
    dist.monitored_barrier(timeout=timedelta(seconds=30))
    dist.monitored_barrier(timeout=timedelta(seconds=30), wait_all_ranks=True)
    dist.destroy_process_group()
    say(f"OK collectives {me}")


def async_ops() -> None:
    gloo = init()
    n, me = dist.get_world_size(), dist.get_rank()
    ts = [data(me, torch.float32, seed=k) for k in range(6)]
    works = [dist.all_reduce(t, async_op=True) for t in ts]
    assert all(isinstance(w, dist.Work) for w in works)
    # Waited for in reverse order; every future holds the reduced tensor.
    for k in reversed(range(6)):
        assert works[k].wait() is True
        assert works[k].is_completed()
        assert works[k].is_success()
        fut = works[k].get_future()
        assert fut.done()
        v = fut.wait()
        assert isinstance(v, list) and v[0] is ts[k], v
        same(ts[k], local_reduce([data(r, torch.float32, seed=k) for r in range(n)], R.SUM), f"async all_reduce {k}")
    # A chained future, as DDP's hooks chain them.
    t = data(me, torch.float32, seed=1)
    fut = dist.all_reduce(t, async_op=True).get_future().then(lambda f: f.value()[0] * 2)
    same(fut.wait(), 2 * local_reduce([data(r, torch.float32, seed=1) for r in range(n)], R.SUM), "then")
    # The other collectives' works.
    outs = [torch.empty(5, 3) for _ in range(n)]
    w = dist.all_gather(outs, data(me, torch.float32), async_op=True)
    w.wait()
    assert w.is_completed()
    b = data(me, torch.float32)
    w = dist.broadcast(b, 1, async_op=True)
    w.wait()
    same(b, data(1, torch.float32), "async broadcast")
    w = dist.barrier(async_op=True)
    w.wait()
    assert w.is_completed()
    # A work that cannot complete yet is not completed: rank 0's all_reduce
    # waits for the others, which first wait for a gloo barrier that rank 0
    # enters after checking.
    x = torch.ones(1)
    if me == 0:
        w = dist.all_reduce(x, async_op=True)
        assert not w.is_completed(), "completed before the other ranks called all_reduce"
        dist.barrier(group=gloo)
        w.wait()
    else:
        dist.barrier(group=gloo)
        dist.all_reduce(x)
    assert x.item() == n, x
    dist.destroy_process_group()
    say(f"OK async_ops {me}")


def subgroups() -> None:
    init()
    n, me = dist.get_world_size(), dist.get_rank()
    assert n == 3
    g02 = dist.new_group([0, 2])
    g1 = dist.new_group([1])
    g02_gloo = dist.new_group([0, 2], backend="gloo")
    g12 = dist.new_group([2, 1])  # torch sorts the ranks
    if me in (0, 2):
        assert dist.get_rank(g02) == (0 if me == 0 else 1)
        assert dist.get_world_size(g02) == 2
        t = data(me, torch.float32)
        dist.all_reduce(t, group=g02)
        same(t, data(0, torch.float32) + data(2, torch.float32), "all_reduce on [0, 2]")
        g = data(me, torch.float32)
        dist.all_reduce(g, group=g02_gloo)
        same(t, g, "all_reduce on [0, 2] against gloo")
        b = data(me, torch.int64)
        dist.broadcast(b, src=2, group=g02)  # global rank 2
        same(b, data(2, torch.int64), "broadcast from 2 on [0, 2]")
        outs = [torch.empty(5, 3) for _ in range(2)]
        dist.all_gather(outs, data(me, torch.float32), group=g02)
        same(outs[1], data(2, torch.float32), "all_gather on [0, 2]")
        objs: List[Any] = [None, None]
        dist.all_gather_object(objs, me, group=g02)
        assert objs == [0, 2], objs
        dist.barrier(group=g02)
    else:
        t = torch.ones(2)
        dist.all_reduce(t, group=g1)
        same(t, torch.ones(2), "all_reduce on [1]")
    if me in (1, 2):
        t = torch.full((3,), float(me))
        dist.all_reduce(t, group=g12)
        same(t, torch.full((3,), 3.0), "all_reduce on [1, 2]")
        assert dist.get_process_group_ranks(g12) == [1, 2]
    # The whole world again, after the subgroups' ops.
    t = torch.ones(1)
    dist.all_reduce(t)
    assert t.item() == n
    dist.destroy_process_group()
    say(f"OK subgroups {me}")


def local_groups() -> None:
    """new_group(use_local_synchronization=True): only a group's members
    call it; the daemon registers each group's process set among its
    members, and their collectives match gloo's groups made the same way.
    Each rank makes its pair's group ([0, 1] or [2, 3], the two pairs' at
    once), then ranks 1 and 2 alone make [1, 2]: the other two never call
    new_group for it. (Torch names such a group from the members' count of
    groups made so far, so members must have made as many before it.)"""
    init()
    n, me = dist.get_world_size(), dist.get_rank()
    assert n == 4
    order = [[0, 1] if me < 2 else [2, 3]] + ([[1, 2]] if me in (1, 2) else [])
    groups = {}
    for ranks in order:
        groups[tuple(ranks)] = (
            dist.new_group(ranks, use_local_synchronization=True),
            dist.new_group(ranks, backend="gloo", use_local_synchronization=True),
        )
    for ranks, (g, ref) in groups.items():
        assert dist.get_world_size(g) == len(ranks) and dist.get_rank(g) == ranks.index(me), (ranks, me)
        for dt in (torch.float32, torch.int64):
            t, r = data(me, dt, seed=len(ranks) + ranks[0]), data(me, dt, seed=len(ranks) + ranks[0])
            dist.all_reduce(t, group=g)
            dist.all_reduce(r, group=ref)
            same(t, r, f"all_reduce {dt} on local group {list(ranks)} against gloo")
        b = data(me, torch.float32, seed=9)
        dist.broadcast(b, src=ranks[-1], group=g)
        same(b, data(ranks[-1], torch.float32, seed=9), f"broadcast from {ranks[-1]} on local group {list(ranks)}")
        outs = [torch.empty(5, 3) for _ in ranks]
        dist.all_gather(outs, data(me, torch.float32), group=g)
        for k, o in zip(ranks, outs):
            same(o, data(k, torch.float32), f"all_gather on local group {list(ranks)}: rank {k}'s part")
    # The world, after every group's ops.
    t = torch.ones(1)
    dist.all_reduce(t)
    assert t.item() == n
    dist.destroy_process_group()
    say(f"OK local_groups {me}")


# ------------------------------------------------------------------ DDP


class Net(torch.nn.Module):
    def __init__(self, unused: bool = False) -> None:
        super().__init__()
        self.a = torch.nn.Linear(10, 32)
        self.b = torch.nn.Linear(32, 32)
        self.c = torch.nn.Linear(32, 4)
        self.unused = torch.nn.Linear(32, 32) if unused else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c(torch.relu(self.b(torch.relu(self.a(x)))))


def _train(pg: Any, variant: str, steps: int = 6) -> List[float]:
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    me = dist.get_rank()
    torch.manual_seed(1234 + me)  # different initial weights per rank: DDP broadcasts rank 0's
    model = Net(unused=variant == "find_unused")
    kw: dict = dict(process_group=pg, bucket_cap_mb=0.001)
    if variant == "bucket_view":
        kw["gradient_as_bucket_view"] = True
    if variant == "find_unused":
        kw["find_unused_parameters"] = True
    if variant == "static_graph":
        kw["static_graph"] = True
    ddp = DDP(model, **kw)
    if variant == "allreduce_hook":
        ddp.register_comm_hook(pg, default_hooks.allreduce_hook)
    if variant == "fp16_hook":
        ddp.register_comm_hook(pg, default_hooks.fp16_compress_hook)
    if variant == "bf16_hook":
        ddp.register_comm_hook(pg, default_hooks.bf16_compress_hook)
    if variant == "powersgd":
        from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd

        state = psgd.PowerSGDState(process_group=pg, matrix_approximation_rank=2, start_powerSGD_iter=2)
        ddp.register_comm_hook(state, psgd.powerSGD_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    g = torch.Generator().manual_seed(99 + me)
    losses = []
    for step in range(steps):
        x = torch.randn(8, 10, generator=g)
        y = torch.randn(8, 4, generator=g)
        opt.zero_grad()
        if variant == "no_sync":
            with ddp.no_sync():
                torch.nn.functional.mse_loss(ddp(x), y).backward()
            x2 = torch.randn(8, 10, generator=g)
            y2 = torch.randn(8, 4, generator=g)
            loss = torch.nn.functional.mse_loss(ddp(x2), y2)
        else:
            loss = torch.nn.functional.mse_loss(ddp(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    params = torch.cat([p.detach().reshape(-1) for p in ddp.parameters()])
    return losses + [float(params.sum()), float(params.abs().sum())]


def ddp() -> None:
    gloo = init()
    me = dist.get_rank()
    variants = sys.argv[2].split(",") if len(sys.argv) > 2 else ["default"]
    for v in variants:
        ours = _train(dist.group.WORLD, v)
        ref = _train(gloo, v)
        t = {"fp16_hook": 1e-3, "bf16_hook": 1e-2, "powersgd": 1e-4}.get(v, 1e-5)
        for k, (a, b) in enumerate(zip(ours, ref)):
            if abs(a - b) > t * max(1.0, abs(b)):
                raise AssertionError(f"DDP {v}: value {k} is {a} on hvdd, {b} on gloo\nhvdd {ours}\ngloo {ref}")
        # The ranks' models agree after training (rank 0's broadcast, then the same averaged steps).
        objs: List[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(objs, ours[-2:])
        assert all(abs(o[0] - objs[0][0]) < 1e-5 for o in objs), objs
        log(f"DDP {v}: losses {[round(x, 5) for x in ours[:-2]]} match gloo's")
    dist.destroy_process_group()
    say(f"OK ddp {me}")


# ------------------------------------------------------------ start-up


def reinit() -> None:
    me = int(os.environ["RANK"])
    for k in range(2):
        dist.init_process_group("hvdd", timeout=timedelta(seconds=60))
        n = dist.get_world_size()
        t = torch.full((2,), float(me + k))
        dist.all_reduce(t)
        same(t, torch.full((2,), float(sum(range(n)) + n * k)), f"all_reduce in init {k}")
        g = dist.new_group(list(range(n))[1:] or [0])
        if me in dist.get_process_group_ranks(g):
            dist.all_reduce(torch.ones(1), group=g)
        dist.destroy_process_group()
        assert not dist.is_initialized()
    say(f"OK reinit {me}")


def launched(mode: str, rank: int, size: int, where: str) -> None:
    """Started by the test (no torchrun): init_method tcp:// or file://, or an
    explicit store."""
    t0 = time.monotonic()
    if mode == "tcp":
        dist.init_process_group("hvdd", init_method=f"tcp://{where}", rank=rank, world_size=size)
    elif mode == "file":
        dist.init_process_group("hvdd", init_method=f"file://{where}", rank=rank, world_size=size)
    elif mode == "store":
        host, port = where.rsplit(":", 1)
        store = dist.TCPStore(host, int(port), size, rank == 0, timeout=timedelta(seconds=60))
        dist.init_process_group("hvdd", store=store, rank=rank, world_size=size)
    else:
        raise SystemExit(f"unknown mode {mode}")
    assert dist.get_rank() == rank and dist.get_world_size() == size
    t = torch.full((4,), float(rank))
    dist.all_reduce(t)
    same(t, torch.full((4,), float(sum(range(size)))), f"all_reduce after {mode} init")
    dist.destroy_process_group()
    say(f"OK launched {mode} {rank} ({time.monotonic() - t0:.2f} s)")


def hvdd_run() -> None:
    """Under hvdd run: torch's ranks come from hvdd run's."""
    dist.init_process_group("hvdd")
    me, n = dist.get_rank(), dist.get_world_size()
    assert me == int(os.environ["HVDD_RANK"]) and n == int(os.environ["HVDD_SIZE"]), (me, n)
    t = torch.full((3,), float(me + 1))
    dist.all_reduce(t)
    same(t, torch.full((3,), float(n * (n + 1) // 2)), "all_reduce under hvdd run")
    objs: List[Any] = [None] * n
    dist.all_gather_object(objs, me)
    assert objs == list(range(n))
    dist.destroy_process_group()
    say(f"OK hvdd_run {me}")


def init_timeout(where: str, seconds: str) -> None:
    """Rank 0 of 2 whose peer never comes: init_process_group raises after
    the timeout, naming rank 1."""
    t0 = time.monotonic()
    try:
        dist.init_process_group(
            "hvdd", init_method=f"file://{where}", rank=0, world_size=2, timeout=timedelta(seconds=float(seconds))
        )
    except Exception as e:
        say(f"RAISED after {time.monotonic() - t0:.2f} s: {type(e).__name__}: {e}")
        return
    raise AssertionError("init_process_group did not raise")


def op_timeout() -> None:
    """A collective that rank 1 joins late: rank 0's fails after the group's
    timeout (init_process_group's, 3 s), then rank 1 comes."""
    dist.init_process_group("hvdd", timeout=timedelta(seconds=3))
    me = dist.get_rank()
    store = dist.distributed_c10d._get_default_store()
    if me == 0:
        t0 = time.monotonic()
        try:
            dist.all_reduce(torch.ones(2))
        except Exception as e:
            say(f"RAISED after {time.monotonic() - t0:.2f} s: {type(e).__name__}: {e}")
        else:
            raise AssertionError("all_reduce did not time out")
        store.set("op_timeout/raised", "1")
    else:
        store.wait(["op_timeout/raised"], timedelta(seconds=60))
        dist.all_reduce(torch.ones(2))  # completes the daemon's op, whose work rank 0 gave up on
    say(f"OK op_timeout {me}")
    os._exit(0)


# --------------------------------------------------------------- failures


def fault(how: str) -> None:
    """Rank 1 dies (kill: SIGKILL; raise: an exception) while the others are
    in an all_reduce: theirs raises, naming rank 1, long before the timeout."""
    dist.init_process_group("hvdd", timeout=timedelta(seconds=300))
    me = dist.get_rank()
    t = torch.ones(4)
    dist.all_reduce(t)  # the job works
    if me == 1:
        if how == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        raise RuntimeError("rank 1 fails on purpose")
    t0 = time.monotonic()
    try:
        w = dist.all_reduce(torch.ones(1 << 16), async_op=True)
        w.wait()
    except Exception as e:
        say(f"RAISED after {time.monotonic() - t0:.2f} s: {type(e).__name__}: {e}")
        # The next collective raises too.
        try:
            dist.all_reduce(torch.ones(1))
        except Exception as e2:
            say(f"NEXT RAISED: {type(e2).__name__}: {e2}")
        os._exit(0)
    raise AssertionError("all_reduce did not raise")


def mismatch() -> None:
    """Ranks that disagree on a tensor's shape: every rank raises, naming it."""
    dist.init_process_group("hvdd", timeout=timedelta(seconds=300))
    me = dist.get_rank()
    try:
        dist.all_reduce(torch.ones(3 + me))
    except Exception as e:
        say(f"RAISED: {type(e).__name__}: {e}")
    else:
        raise AssertionError("all_reduce of different shapes did not raise")
    try:
        if me == 0:
            dist.all_reduce(torch.ones(2))
        else:
            dist.broadcast(torch.ones(2), 0)
    except Exception as e:
        say(f"RAISED OP: {type(e).__name__}: {e}")
    else:
        raise AssertionError("all_reduce against broadcast did not raise")
    os._exit(0)


def restart() -> None:
    """Under torchrun --max-restarts: in the first attempt rank 1 raises after
    one all_reduce; torchrun restarts every worker, and the second attempt's
    group forms and computes. Each rank prints the daemon it joined."""
    attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    dist.init_process_group("hvdd", timeout=timedelta(seconds=120))
    from hvdd.torch.distributed import _startup

    me, n = dist.get_rank(), dist.get_world_size()
    t = torch.full((3,), float(me + attempt))
    dist.all_reduce(t)
    same(t, torch.full((3,), float(sum(range(n)) + n * attempt)), f"all_reduce in attempt {attempt}")
    c = _startup.current().client
    say(f"ATTEMPT {attempt} rank {me} job {c.job} socket {c.socket_path}")
    if attempt == 0 and me == 1:
        raise RuntimeError("rank 1 fails in the first attempt, on purpose")
    if attempt == 0:
        try:
            dist.all_reduce(torch.ones(4))  # raises: rank 1 is gone
        except Exception as e:
            say(f"ATTEMPT 0 rank {me} raised: {type(e).__name__}")
        signal.pause()  # until torchrun stops this worker to restart the group
    dist.destroy_process_group()
    say(f"OK restart {me}")


SCENARIOS = {
    "restart": restart,
    "allreduce_matrix": allreduce_matrix,
    "collectives": collectives,
    "async_ops": async_ops,
    "subgroups": subgroups,
    "local_groups": local_groups,
    "ddp": ddp,
    "reinit": reinit,
    "hvdd_run": hvdd_run,
    "mismatch": mismatch,
    "op_timeout": op_timeout,
}

if __name__ == "__main__":
    name = sys.argv[1]
    if name == "launched":
        launched(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5])
    elif name == "init_timeout":
        init_timeout(sys.argv[2], sys.argv[3])
    elif name == "fault":
        fault(sys.argv[2])
    else:
        SCENARIOS[name]()
