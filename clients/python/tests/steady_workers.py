"""Worker scenarios of the GPU path's steady state without a GPU (``python
steady_workers.py NAME``), on tests/fake_cuda.py's fake device memory and a
daemon running the fake CUDA driver (``HVDD_GPU_DRIVER=fake``), as
gpu_workers.py's (whose helpers and staging counters these use).

After a warm-up, a training loop's ops cost nothing but the work: no
allocation of the pools, no export, no ReleaseDeviceMemory, no device
output mapped or unmapped per op, while every result stays right.
"""

from __future__ import annotations

import os
import sys
import time
import warnings
from typing import Dict, List

import torch

import hvdd.torch as hvd
from hvdd import _cuda

from gpu_workers import _device, staged
from workers import expect_equal


def _values(k: int, i: int, shape: tuple, dtype: torch.dtype) -> torch.Tensor:
    """Rank k's input at op i: small integers, exact in every dtype used
    (bfloat16 too) and in their sums over a few ranks."""
    n = 1
    for d in shape:
        n *= d
    v = (torch.arange(n, dtype=torch.int64) * 7 + 3 * k + i) % 23
    return v.to(dtype).view(shape)


def _sum(i: int, shape: tuple, dtype: torch.dtype, n: int) -> torch.Tensor:
    return sum(_values(k, i, shape, torch.int64) for k in range(n)).to(dtype)


def _counts(s: _cuda.DeviceSession, dev) -> Dict[str, int]:
    """What the session and the fake device did to device memory so far."""
    s.flush()
    return {
        "exports": s.exports,
        "releases": len(s.released),
        "output opens": s.output_opens,
        "output closes": s.output_closes,
        "outputs mapped": s.outputs_mapped(),
        "pools made": s.pools_made,
        "device exports": dev.exports,
        "device output opens": dev.output_opens,
        "device output closes": dev.output_closes,
    }


def steady() -> None:
    """HVDD_STEADY_OPS (1000) ops of each kind after HVDD_STEADY_WARM (20)
    of warm-up, on inputs whose storages live across ops, as a training
    loop's do: allreduce_ in place, allreduce out of place (the autograd
    function's path), three allreduce_async in flight at once, a grouped
    allreduce, allgather, alltoall, reducescatter and broadcast out of
    place; each result checked. The counts must not move after the
    warm-up."""
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    dev, s = _device()
    ops = int(os.environ.get("HVDD_STEADY_OPS", "1000"))
    warm = int(os.environ.get("HVDD_STEADY_WARM", "20"))
    f32 = torch.float32

    # The autograd function: forward through the pool, backward (the
    # gradient is host memory here) staged, as it is today.
    xg = dev.tensor(_values(r, 0, (8,), f32)).requires_grad_()
    yg = hvd.allreduce(xg, op=hvd.Sum, name="steady.autograd")
    assert dev.claims(yg) and not yg.is_leaf
    expect_equal(yg.detach(), _sum(0, (8,), f32, n), "autograd forward")
    yg.sum().backward()
    expect_equal(xg.grad, torch.full((8,), float(n)), "autograd backward")
    del xg, yg
    staged["n"] = 0

    a = dev.empty((300,), f32)  # allreduce_
    x = dev.empty((300,), f32)  # allreduce
    ys = [dev.empty((64 * (j + 1),), f32) for j in range(3)]  # allreduce_async x3
    gshapes = [((5,), f32), ((4, 6), torch.float64), ((100,), torch.int32)]
    gx = [dev.empty(sh, dt) for sh, dt in gshapes]  # grouped_allreduce
    ag = dev.empty((r + 1, 3), f32)  # allgather
    at = dev.empty((2 * n, 4), torch.int64)  # alltoall
    rows = 2 * n + 1
    rs = dev.empty((rows, 3), f32)  # reducescatter
    lo = sum(3 if k == 0 else 2 for k in range(r))  # the first d0 % n ranks get one row more
    bc = dev.empty((50,), torch.bfloat16)  # broadcast

    before: Dict[str, int] = {}
    t0 = 0.0
    with warnings.catch_warnings():
        warnings.simplefilter("error", _cuda.HvddStagingWarning)
        for i in range(warm + ops):
            if i == warm:
                before = _counts(s, dev)
                t0 = time.monotonic()
            a.copy_(_values(r, i, (300,), f32))
            assert hvd.allreduce_(a, op=hvd.Sum, name="steady.ar_") is a
            expect_equal(a, _sum(i, (300,), f32, n), f"op {i}: allreduce_")

            x.copy_(_values(r, i, (300,), f32))
            got = hvd.allreduce(x, op=hvd.Sum, name="steady.ar")
            assert dev.claims(got) and got is not x, f"op {i}: allreduce's result"
            expect_equal(got, _sum(i, (300,), f32, n), f"op {i}: allreduce")
            expect_equal(x, _values(r, i, (300,), f32), f"op {i}: allreduce's input untouched")

            hs = []
            for j, y in enumerate(ys):
                y.copy_(_values(r, i + j, tuple(y.shape), f32))
                hs.append(hvd.allreduce_async(y, op=hvd.Sum, name=f"steady.async.{j}"))
            for j, h in enumerate(hs):
                expect_equal(hvd.synchronize(h), _sum(i + j, tuple(ys[j].shape), f32, n), f"op {i}: async {j}")

            for t, (sh, dt) in zip(gx, gshapes):
                t.copy_(_values(r, i, sh, dt))
            outs = hvd.grouped_allreduce(gx, op=hvd.Sum, name="steady.grouped")
            for j, (sh, dt) in enumerate(gshapes):
                expect_equal(outs[j], _sum(i, sh, dt, n), f"op {i}: grouped[{j}]")

            ag.copy_(_values(r, i, (r + 1, 3), f32))
            got = hvd.allgather(ag, name="steady.ag")
            assert dev.claims(got)
            want = torch.cat([_values(k, i, (k + 1, 3), f32) for k in range(n)])
            expect_equal(got, want, f"op {i}: allgather")

            at.copy_(_values(r, i, (2 * n, 4), torch.int64))
            got = hvd.alltoall(at, name="steady.a2a")
            want = torch.cat([_values(k, i, (2 * n, 4), torch.int64)[2 * r : 2 * r + 2] for k in range(n)])
            expect_equal(got, want, f"op {i}: alltoall")

            rs.copy_(_values(r, i, (rows, 3), f32))
            got = hvd.reducescatter(rs, op=hvd.Sum, name="steady.rs")
            expect_equal(got, _sum(i, (rows, 3), f32, n)[lo : lo + (3 if r == 0 else 2)], f"op {i}: reducescatter")

            root = i % n
            bc.copy_(_values(r, i, (50,), torch.bfloat16))
            got = hvd.broadcast(bc, root, name="steady.bc")
            assert dev.claims(got) and got is not bc
            expect_equal(got, _values(root, i, (50,), torch.bfloat16), f"op {i}: broadcast")
            expect_equal(bc, _values(r, i, (50,), torch.bfloat16), f"op {i}: broadcast's input untouched")
    took = time.monotonic() - t0
    after = _counts(s, dev)
    print(f"rank {r}: {ops} ops of each of 8 kinds after {warm} in {took:.1f} s; counts {after}")
    moved: List[str] = [f"{k} {before[k]} -> {after[k]}" for k in before if after[k] != before[k]]
    assert not moved, f"rank {r}: after the warm-up, per op: {'; '.join(moved)}"
    assert staged["n"] == 0, f"{staged['n']} device ops were staged through host memory"
    # Every slot is back; one pool (the first stream's), exported once.
    stats = s.pool_stats()
    assert all(busy == 0 for pools in stats.values() for _, busy, _ in pools), stats
    assert s.pools_made >= 1 and len(stats) == 1, stats
    hvd.shutdown()
    # The session's mappings of device outputs are closed with it.
    assert s.outputs_mapped() == 0 and s.output_closes == s.output_opens, (s.output_opens, s.output_closes)
    assert dev.output_closes == dev.output_opens


def burst() -> None:
    """More device outputs in flight at once than the daemon's pool keeps
    (it frees the buffers beyond its bound when they come back, so their
    handles never come back): results stay right, and the session keeps at
    most output_cache mappings, closing the ones idle for output_idle
    reads."""
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    dev, s = _device()
    s.output_cache, s.output_idle = 16, 64
    f32 = torch.float32
    ins = [dev.empty((r + 1, 2 + j), f32) for j in range(12)]
    for i in range(40):
        hs = []
        for j, t in enumerate(ins):
            t.copy_(_values(r, i + j, (r + 1, 2 + j), f32))
            hs.append(hvd.allgather_async(t, name=f"burst.{j}"))
        for j, h in enumerate(hs):
            got = hvd.synchronize(h)
            want = torch.cat([_values(k, i + j, (k + 1, 2 + j), f32) for k in range(n)])
            expect_equal(got, want, f"round {i}: allgather {j}")
        assert s.outputs_mapped() <= 16, s.outputs_mapped()
    print(f"rank {r}: output opens {s.output_opens} closes {s.output_closes} mapped {s.outputs_mapped()}")
    assert s.output_opens - s.output_closes == s.outputs_mapped()
    assert staged["n"] == 0
    hvd.shutdown()
    assert s.outputs_mapped() == 0 and dev.output_closes == dev.output_opens


SCENARIOS = {f.__name__: f for f in (steady, burst)}

if __name__ == "__main__":
    SCENARIOS[sys.argv[1]]()
    sys.stdout.write("OK\n")
