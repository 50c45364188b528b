"""Worker scenarios run on every rank by the tests (``python workers.py NAME``).

Each scenario checks results against references computed locally from every
rank's (deterministic) inputs and exits non-zero on the first failure.
"""

from __future__ import annotations

import math
import os
import signal
import sys
import warnings

import numpy as np
import torch

import hvdd
import hvdd.torch as hvd

DTYPES = [
    torch.uint8,
    torch.int8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.float16,
    torch.bfloat16,
    torch.float32,
    torch.float64,
    torch.bool,
]


def data(rank: int, dtype: torch.dtype, shape=(3, 4), seed: int = 0) -> torch.Tensor:
    """Rank-specific deterministic input with small values (no overflow)."""
    g = torch.Generator().manual_seed(1000 * seed + rank)
    if dtype is torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    if dtype in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
        return (torch.randint(-8, 9, shape, generator=g).double() / 4).to(dtype)
    lo = 0 if dtype is torch.uint8 else -3
    return torch.randint(lo, 4, shape, generator=g).to(dtype)


def expect_equal(got: torch.Tensor, want: torch.Tensor, what: str, tol: float = 0.0) -> None:
    if got.dtype != want.dtype:
        raise AssertionError(f"{what}: dtype {got.dtype}, want {want.dtype}")
    if tuple(got.shape) != tuple(want.shape):
        raise AssertionError(f"{what}: shape {tuple(got.shape)}, want {tuple(want.shape)}")
    if got.dtype is torch.bool or not got.dtype.is_floating_point:
        ok = torch.equal(got, want)
    else:
        ok = torch.allclose(got.double(), want.double(), atol=tol, rtol=tol)
    if not ok:
        raise AssertionError(f"{what}: got\n{got}\nwant\n{want}")


def reference_reduce(ts: list[torch.Tensor], op: int, n: int, pre: float = 1.0, post: float = 1.0) -> torch.Tensor:
    dt = ts[0].dtype
    if dt is torch.bool:
        stack = torch.stack(ts)
        if op in (hvd.Sum, hvd.Max, hvd.Average):
            return stack.any(0)
        return stack.all(0)  # Min, Product
    x = [t.double() * pre for t in ts]
    if op in (hvd.Sum, hvd.Average):
        r = sum(x[1:], x[0])
    elif op == hvd.Min:
        r = torch.stack(x).min(0).values
    elif op == hvd.Max:
        r = torch.stack(x).max(0).values
    else:
        r = x[0]
        for t in x[1:]:
            r = r * t
    f = post / n if op == hvd.Average else post
    r = r * f
    if not dt.is_floating_point:
        r = r.trunc()
    return r.to(dt)


def tol_for(dt: torch.dtype) -> float:
    return {torch.float16: 1e-2, torch.bfloat16: 5e-2, torch.float32: 1e-5, torch.float64: 1e-12}.get(dt, 0.0)


# --------------------------------------------------------------------------- basics


def basics() -> None:
    # The worker runs in the Python environment under test (each venv of
    # scripts/test.sh), with its torch.
    assert sys.prefix == os.environ["HVDD_TEST_PREFIX"], (sys.prefix, os.environ["HVDD_TEST_PREFIX"])
    print(f"rank {os.environ['HVDD_RANK']}: {sys.executable}, torch {torch.__version__}")
    # Before init: Horovod's error text.
    for f in (hvd.rank, hvd.size, hvd.local_rank, hvd.local_size, hvd.cross_rank, hvd.cross_size):
        try:
            f()
        except ValueError as e:
            assert str(e) == "Horovod has not been initialized; use hvd.init().", str(e)
        else:
            raise AssertionError(f"{f.__name__} before init did not raise")
    assert not hvd.is_initialized()
    try:
        hvd.allreduce(torch.ones(1))
    except ValueError:
        pass
    else:
        raise AssertionError("allreduce before init did not raise")
    try:
        hvd.init(comm=[0])
    except NotImplementedError:
        pass
    else:
        raise AssertionError("init(comm=...) did not raise")

    hvd.init()
    hvd.init()  # idempotent
    assert hvd.is_initialized()
    n = int(os.environ["HVDD_SIZE"])
    r = int(os.environ["HVDD_RANK"])
    assert hvd.size() == n and hvd.rank() == r, (hvd.size(), hvd.rank())
    assert hvd.local_size() == n and hvd.local_rank() == r
    assert hvd.cross_size() == 1 and hvd.cross_rank() == 0
    assert hvd.is_homogeneous() is True
    assert hvdd.rank() == r  # the basics are shared
    assert hvd.nccl_built() == 0 and not hvd.cuda_built() and not hvd.rocm_built()
    assert not hvd.mpi_built() and not hvd.gloo_built() and not hvd.ddl_built() and not hvd.ccl_built()
    assert not hvd.mpi_enabled() and not hvd.gloo_enabled()
    try:
        hvd.mpi_threads_supported()
    except ValueError:
        pass
    else:
        raise AssertionError("mpi_threads_supported without MPI did not raise")
    try:
        hvd.start_timeline("/tmp/x.json")
    except ValueError as e:
        assert "HOROVOD_TIMELINE=DYNAMIC" in str(e)
    else:
        raise AssertionError("start_timeline did not raise")
    hvd.stop_timeline()  # no timeline: nothing to stop, as in Horovod
    assert (hvd.Average, hvd.Sum, hvd.Adasum, hvd.Min, hvd.Max, hvd.Product) == (0, 1, 2, 3, 4, 5)
    assert hvd.global_process_set.process_set_id == 0
    assert hvd.global_process_set.size() == n and hvd.global_process_set.rank() == r
    assert hvd.global_process_set.included()
    assert hvd.HorovodInternalError is hvdd.HvddInternalError
    assert issubclass(hvd.HorovodInternalError, RuntimeError)
    # An unregistered set, and dynamic sets without dynamic mode (process_sets
    # covers them in full).
    ps = hvd.ProcessSet([0])
    try:
        hvd.allreduce(torch.ones(1), process_set=ps)
    except ValueError as e:
        assert "not been registered" in str(e), e
    else:
        raise AssertionError("an unregistered process set did not raise")
    try:
        hvd.add_process_set([0])
    except ValueError as e:
        assert "dynamic" in str(e), e
    else:
        raise AssertionError("add_process_set did not raise")

    # shutdown then init again joins a new job.
    expect_equal(hvd.allreduce(torch.ones(2), op=hvd.Sum), torch.full((2,), float(n)), "before reinit")
    hvd.shutdown()
    assert not hvd.is_initialized()
    hvd.shutdown()  # harmless twice
    hvd.init()
    assert hvd.rank() == r
    expect_equal(hvd.allreduce(torch.ones(2), op=hvd.Sum, name="after"), torch.full((2,), float(n)), "after reinit")
    hvd.shutdown()


# --------------------------------------------------------------------------- collectives


def allreduce_ops() -> None:
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    for dt in DTYPES:
        for op in (hvd.Sum, hvd.Average, hvd.Min, hvd.Max, hvd.Product):
            if dt is torch.bool and op == hvd.Average:
                continue
            ins = [data(k, dt, seed=op) for k in range(n)]
            want = reference_reduce(ins, op, n)
            what = f"allreduce {dt} op={op}"
            x = ins[r].clone()
            got = hvd.allreduce(x, op=op, name=f"ar.{dt}.{op}")
            expect_equal(got, want, what, tol_for(dt))
            expect_equal(x, ins[r], what + " (input untouched)")
            # in-place
            y = ins[r].clone()
            out = hvd.allreduce_(y, op=op)
            assert out is y
            expect_equal(y, want, what + " in place", tol_for(dt))
            if int(np.__version__.split(".")[0]) >= 2:
                # hvdd's view of y's memory leaves its storage resizable
                # (numpy 2's DLPack views; .numpy() would not)
                y.untyped_storage().resize_(0)
            # async, both forms, polled then synchronised
            z = ins[r].clone()
            h1 = hvd.allreduce_async(z, op=op, name=f"a1.{dt}.{op}")
            h2 = hvd.allreduce_async_(z, op=op, name=f"a2.{dt}.{op}")
            got1 = hvd.synchronize(h1)
            hvd.synchronize(h2)
            assert hvd.synchronize(h1) is None  # a finished handle is gone, as in Horovod
            expect_equal(got1, want, what + " async", tol_for(dt))
            expect_equal(z, want, what + " async_", tol_for(dt))

    # scale factors, integer truncation, deprecated average=
    ins = [data(k, torch.float64, seed=7) for k in range(n)]
    got = hvd.allreduce(ins[r], op=hvd.Sum, prescale_factor=0.5, postscale_factor=3.0)
    expect_equal(got, reference_reduce(ins, hvd.Sum, n, 0.5, 3.0), "pre/postscale", 1e-12)
    got = hvd.allreduce(ins[r], prescale_factor=2.0)
    expect_equal(got, reference_reduce(ins, hvd.Average, n, 2.0), "average prescale", 1e-12)
    iins = [torch.tensor([r * 3 + 1, 7, -5], dtype=torch.int32) for r in range(n)]
    expect_equal(hvd.allreduce(iins[r]), reference_reduce(iins, hvd.Average, n), "int average truncates")
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        got = hvd.allreduce(ins[r], average=False)
        assert any(issubclass(x.category, DeprecationWarning) for x in w), w
    expect_equal(got, reference_reduce(ins, hvd.Sum, n), "average=False", 1e-12)
    try:
        hvd.allreduce(ins[r], average=True, op=hvd.Sum)
    except ValueError as e:
        assert "supersedes average" in str(e)
    else:
        raise AssertionError("average and op together did not raise")
    try:
        hvd.allreduce(torch.ones(4, 4).t())
    except ValueError as e:
        assert str(e) == "Tensor is required to be contiguous."
    else:
        raise AssertionError("non-contiguous did not raise")
    try:
        hvd.allreduce(torch.ones(2, dtype=torch.complex64))
    except ValueError as e:
        assert "is not supported" in str(e)
    else:
        raise AssertionError("complex did not raise")

    # zero-size and scalar tensors
    expect_equal(hvd.allreduce(torch.empty(0, 3)), torch.empty(0, 3), "empty")
    expect_equal(hvd.allreduce(torch.tensor(2.0), op=hvd.Sum), torch.tensor(2.0 * n), "scalar")

    # grouped
    gins = [[data(k, torch.float32, (2, 2), seed=11), data(k, torch.int64, (5,), seed=12)] for k in range(n)]
    wants = [reference_reduce([g[i] for g in gins], hvd.Sum, n) for i in range(2)]
    outs = hvd.grouped_allreduce([t.clone() for t in gins[r]], op=hvd.Sum, name="grp")
    for o, w_ in zip(outs, wants):
        expect_equal(o, w_, "grouped_allreduce", 1e-6)
    mine = [t.clone() for t in gins[r]]
    hvd.grouped_allreduce_(mine, op=hvd.Sum)
    for o, w_ in zip(mine, wants):
        expect_equal(o, w_, "grouped_allreduce_", 1e-6)
    h = hvd.grouped_allreduce_async([t.clone() for t in gins[r]], op=hvd.Sum)
    for o, w_ in zip(hvd.synchronize(h), wants):
        expect_equal(o, w_, "grouped_allreduce_async", 1e-6)
    mine = [t.clone() for t in gins[r]]
    hvd.synchronize(hvd.grouped_allreduce_async_(mine, op=hvd.Sum))
    for o, w_ in zip(mine, wants):
        expect_equal(o, w_, "grouped_allreduce_async_", 1e-6)

    # fp16 compression round-trips
    ins = [data(k, torch.float32, seed=13) for k in range(n)]
    got = hvd.allreduce(ins[r], op=hvd.Sum, compression=hvd.Compression.fp16)
    assert got.dtype is torch.float32
    expect_equal(got, reference_reduce(ins, hvd.Sum, n), "fp16 compression", 1e-3)
    c, ctx = hvd.Compression.fp16.compress(torch.ones(2, dtype=torch.int32))
    assert c.dtype is torch.int32 and hvd.Compression.fp16.decompress(c, ctx).dtype is torch.int32

    # autograd
    x = data(r, torch.float64, seed=14).requires_grad_()
    y = hvd.allreduce(x, op=hvd.Sum)
    (y * (r + 1)).sum().backward()
    # d/dx_r sum_k (k+1) * sum_j x_j = sum_k (k+1), summed again by backward's allreduce(Sum)
    expect_equal(x.grad, torch.full_like(x, float(sum(k + 1 for k in range(n)))), "allreduce grad")
    x = torch.ones(3, dtype=torch.float64, requires_grad=True)
    hvd.allreduce(x).sum().backward()  # Average: grad = average of ones
    expect_equal(x.grad, torch.ones(3, dtype=torch.float64), "allreduce average grad")
    hvd.shutdown()


def other_ops() -> None:
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    for dt in DTYPES:
        # allgather with uneven first dimensions
        ins = [data(k, dt, (k + 1, 2), seed=20) for k in range(n)]
        want = torch.cat(ins)
        expect_equal(hvd.allgather(ins[r], name=f"ag.{dt}"), want, f"allgather {dt}")
        expect_equal(hvd.synchronize(hvd.allgather_async(ins[r])), want, f"allgather_async {dt}")
        # broadcast from the last rank, all four forms
        root = n - 1
        ins = [data(k, dt, (2, 3), seed=21) for k in range(n)]
        x = ins[r].clone()
        expect_equal(hvd.broadcast(x, root, name=f"bc.{dt}"), ins[root], f"broadcast {dt}")
        expect_equal(x, ins[r], f"broadcast {dt} input untouched")
        expect_equal(hvd.synchronize(hvd.broadcast_async(x, root)), ins[root], f"broadcast_async {dt}")
        y = ins[r].clone()
        assert hvd.broadcast_(y, root) is y
        expect_equal(y, ins[root], f"broadcast_ {dt}")
        y = ins[r].clone()
        hvd.synchronize(hvd.broadcast_async_(y, root))
        expect_equal(y, ins[root], f"broadcast_async_ {dt}")
        # alltoall, equal split: returns just the output
        ins = [data(k, dt, (2 * n, 3), seed=22) for k in range(n)]
        got = hvd.alltoall(ins[r], name=f"a2a.{dt}")
        assert isinstance(got, torch.Tensor)
        want = torch.cat([ins[k][2 * r : 2 * r + 2] for k in range(n)])
        expect_equal(got, want, f"alltoall {dt}")
        if dt is not torch.bool:
            # reducescatter, uneven rows: the first d0 % n ranks get one more
            d0 = 2 * n + 1
            ins = [data(k, dt, (d0, 2), seed=23) for k in range(n)]
            for op in (hvd.Sum, hvd.Average):
                full = reference_reduce(ins, op, n)
                rows = [d0 // n + (1 if k < d0 % n else 0) for k in range(n)]
                start = sum(rows[:r])
                got = hvd.reducescatter(ins[r], op=op, name=f"rs.{dt}.{op}")
                expect_equal(got, full[start : start + rows[r]], f"reducescatter {dt} op={op}", tol_for(dt))
                got = hvd.synchronize(hvd.reducescatter_async(ins[r], op=op))
                expect_equal(got, full[start : start + rows[r]], f"reducescatter_async {dt} op={op}", tol_for(dt))

    # alltoall with explicit splits returns (output, received_splits)
    splits = [[(s + d) % 3 for d in range(n)] for s in range(n)]  # rows rank s sends to rank d
    ins = [torch.arange(sum(splits[s]) * 2, dtype=torch.float32).view(-1, 2) + 100 * s for s in range(n)]
    out, rsplits = hvd.alltoall(ins[r], splits=splits[r])
    parts = []
    for s in range(n):
        off = sum(splits[s][:r])
        parts.append(ins[s][off : off + splits[s][r]])
    expect_equal(out, torch.cat(parts), "alltoall splits")
    expect_equal(rsplits, torch.tensor([splits[s][r] for s in range(n)], dtype=torch.int32), "received_splits")
    out2, rs2 = hvd.synchronize(hvd.alltoall_async(ins[r], splits=torch.tensor(splits[r], dtype=torch.int32)))
    expect_equal(out2, out, "alltoall_async splits tensor")

    # grouped allgather / reducescatter
    gins = [[data(k, torch.float32, (k + 1, 2), seed=30), data(k, torch.int32, (2,), seed=31)] for k in range(n)]
    outs = hvd.grouped_allgather(gins[r])
    for i, o in enumerate(outs):
        expect_equal(o, torch.cat([g[i] for g in gins]), f"grouped_allgather {i}")
    gins = [[data(k, torch.float32, (n, 2), seed=32), data(k, torch.float64, (2 * n,), seed=33)] for k in range(n)]
    outs = hvd.grouped_reducescatter(gins[r], op=hvd.Sum)
    for i, o in enumerate(outs):
        full = reference_reduce([g[i] for g in gins], hvd.Sum, n)
        k = full.shape[0] // n
        expect_equal(o, full[r * k : (r + 1) * k], f"grouped_reducescatter {i}", 1e-6)

    # autograd through broadcast and allgather
    x = torch.ones(4, dtype=torch.float64, requires_grad=True)
    hvd.broadcast(x, 0).sum().backward()
    expect_equal(x.grad, torch.full((4,), 1.0 if r == 0 else 0.0, dtype=torch.float64), "broadcast grad")
    x = torch.ones(r + 1, 2, dtype=torch.float64, requires_grad=True)
    g = hvd.allgather(x)
    (g * torch.arange(g.shape[0], dtype=torch.float64).view(-1, 1)).sum().backward()
    off = sum(k + 1 for k in range(r))
    want = torch.arange(off, off + r + 1, dtype=torch.float64).view(-1, 1).expand(r + 1, 2)
    expect_equal(x.grad, want.contiguous(), "allgather grad", 1e-12)

    # poll, barrier, join
    h = hvd.allreduce_async(torch.ones(1), name="polled")
    hvd.barrier()
    # after a barrier every rank has submitted "polled"; poll turns true without sleeping
    while not hvd.poll(h):
        pass
    hvd.synchronize(h)
    last = hvd.join()
    assert 0 <= last < n, last
    ranks = hvd.allgather(torch.tensor([last]))
    assert len(set(ranks.tolist())) == 1, ranks
    hvd.shutdown()


def errors() -> None:
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    # mismatched shapes: every rank gets HorovodInternalError naming the tensor
    try:
        hvd.allreduce(torch.ones(r + 2), name="mismatch")
    except hvd.HorovodInternalError as e:
        assert "mismatch" in str(e), str(e)
    else:
        raise AssertionError("mismatched shapes did not raise")
    # mismatched dtypes
    try:
        hvd.allreduce(torch.ones(2, dtype=torch.float32 if r == 0 else torch.float64), name="dt")
    except hvd.HorovodInternalError:
        pass
    else:
        raise AssertionError("mismatched dtypes did not raise")
    # duplicate name in flight: ValueError at enqueue
    # (rank 0 checks while the others wait in a broadcast it joins only after,
    # so "dup" cannot have completed yet)
    if r == 0:
        h = hvd.allreduce_async(torch.ones(2), name="dup")
        try:
            hvd.allreduce_async(torch.ones(2), name="dup")
        except ValueError as e:
            assert "same name" in str(e), str(e)
        else:
            raise AssertionError("duplicate name did not raise")
        hvd.broadcast(torch.ones(1), 0, name="go")
    else:
        hvd.broadcast(torch.ones(1), 0, name="go")
        h = hvd.allreduce_async(torch.ones(2), name="dup")
    hvd.synchronize(h)
    # Adasum of integers: every rank hears the daemon's refusal
    try:
        hvd.allreduce(torch.ones(2, dtype=torch.int32), op=hvd.Adasum, name="adasum")
    except hvd.HorovodInternalError as e:
        assert "Unsupported data type" in str(e) and "int32" in str(e), str(e)
    else:
        raise AssertionError("Adasum of int32 did not raise")
    # broadcast with a bad root: ValueError at the call, as Horovod's enqueue
    expect_value_error(
        lambda: hvd.broadcast(torch.ones(1), n + 3, name="badroot"),
        f"broadcast received invalid root rank {n + 3} for provided process set",
        "bad root",
    )
    # the job keeps working after op errors
    expect_equal(hvd.allreduce(torch.ones(2), op=hvd.Sum, name="ok"), torch.full((2,), float(n)), "after errors")
    hvd.shutdown()


def expect_value_error(call, text: str, what: str) -> None:
    """call() raises ValueError whose message is exactly text."""
    try:
        call()
    except ValueError as e:
        if str(e) != text:
            raise AssertionError(f"{what}: ValueError {str(e)!r}, want {text!r}") from e
    else:
        raise AssertionError(f"{what}: no ValueError")


# The collectives that enqueue_errors sends after its refused calls; the test
# finds exactly this many tensors in the daemon's "job ended" line, so none
# of the refused calls reached the daemon.
ENQUEUE_ERRORS_SENT = 3


def enqueue_errors() -> None:
    """Arguments Horovod refuses as it enqueues (ValueError at the call, with
    its texts, before anything is sent): an alltoall's splits, a broadcast's
    root outside the set, any collective on a set this rank is not in; after
    them the job goes on. Ranks: 2 or more; set {0} leaves the others out."""
    only0 = hvd.ProcessSet([0])
    hvd.init(process_sets=[only0])
    r, n = hvd.rank(), hvd.size()
    x = torch.arange(2 * n, dtype=torch.float32).view(2 * n, 1)
    bad_splits = [
        # Horovod's test_horovod_alltoall_splits_error: splits add up to more than the rows
        (
            torch.empty(n - 1),
            torch.ones(n, dtype=torch.int32),
            "Sum of splits entries is greater than the first dimension of tensor.",
        ),
        (x, [3] * n, "Sum of splits entries is greater than the first dimension of tensor."),
        # test_horovod_alltoall_equal_split_length_error: no splits, rows not a multiple of the size
        (
            torch.empty(n + 1),
            None,
            "splits not provided, but first dimension of tensor is not an even multiple of the number of workers.",
        ),
        (
            torch.empty(n + 1, 2),
            [],
            "splits not provided, but first dimension of tensor is not an even multiple of the number of workers.",
        ),
        # test_horovod_alltoall_splits_type_error: splits not int32
        (
            torch.empty(n),
            torch.ones(n, dtype=torch.float32),
            "alltoall expects splits to contain 32-bit integer elements.",
        ),
        (x, torch.ones(n, dtype=torch.int64), "alltoall expects splits to contain 32-bit integer elements."),
        (x, torch.ones(n, dtype=torch.bfloat16), "alltoall expects splits to contain 32-bit integer elements."),
        # a splits tensor that is not 1-D; one entry too many or too few
        (x, torch.ones(1, n, dtype=torch.int32), "alltoall expects a 1D splits tensor"),
        (x, [1] * (n + 1), "Number of entries in splits does not equal number of workers."),
        (x, torch.ones(n - 1, dtype=torch.int32), "Number of entries in splits does not equal number of workers."),
        (x, [-1] + [1] * (n - 1), "Splits entries must be non-negative."),
    ]
    for i, (t, sp, text) in enumerate(bad_splits):
        what = f"alltoall case {i} splits={sp!r}"
        expect_value_error(lambda: hvd.alltoall(t, splits=sp, name=f"bad{i}"), text, what)
        expect_value_error(lambda: hvd.alltoall_async(t, splits=sp), text, what + " async")
    # Broadcast from a root outside the set (every rank), then a set this
    # rank is not in (every rank but 0).
    root_text = f"broadcast received invalid root rank {n} for provided process set"
    expect_value_error(lambda: hvd.broadcast(torch.ones(2), n, name="badroot"), root_text, "root outside the job")
    expect_value_error(lambda: hvd.broadcast_async_(torch.ones(2), n), root_text, "root outside the job, async")
    if r != 0:
        root_text = f"broadcast received invalid root rank {r} for provided process set"
        expect_value_error(
            lambda: hvd.broadcast(torch.ones(2), r, process_set=only0), root_text, "root outside the set"
        )
        t = torch.ones(2, 2)
        for kind, call in (
            ("Allreduce", lambda: hvd.allreduce(t, process_set=only0)),
            ("Allreduce", lambda: hvd.allreduce_async_(t, process_set=only0)),
            ("Allreduce", lambda: hvd.grouped_allreduce([t, t], process_set=only0)),
            ("Allgather", lambda: hvd.allgather(t, process_set=only0)),
            ("Allgather", lambda: hvd.grouped_allgather([t], process_set=only0)),
            ("Broadcast", lambda: hvd.broadcast(t, 0, process_set=only0)),
            ("Broadcast", lambda: hvd.broadcast_(t, 0, process_set=only0)),
            ("Alltoall", lambda: hvd.alltoall(t, process_set=only0)),
            ("Alltoall", lambda: hvd.alltoall(t, splits=[2], process_set=only0)),
            ("Reducescatter", lambda: hvd.reducescatter(t, process_set=only0)),
            ("Reducescatter", lambda: hvd.grouped_reducescatter([t], process_set=only0)),
            ("Barrier", lambda: hvd.barrier(process_set=only0)),
        ):
            text = f"{kind}: Rank {r} is not a member of the provided process set."
            expect_value_error(call, text, f"{kind} outside the set")
        # Horovod checks the splits' type before the membership
        expect_value_error(
            lambda: hvd.alltoall(t, splits=torch.ones(1), process_set=only0),
            "alltoall expects splits to contain 32-bit integer elements.",
            "alltoall outside the set with float splits",
        )
    # The job goes on: ENQUEUE_ERRORS_SENT collectives, each checked.
    ins = [torch.arange(2 * n, dtype=torch.float32).view(2 * n, 1) + 100 * k for k in range(n)]
    out, rsplits = hvd.alltoall(ins[r], splits=[], name="after.equal")  # empty splits: equal parts, as Horovod
    expect_equal(out, torch.cat([ins[k][2 * r : 2 * r + 2] for k in range(n)]), "alltoall after the errors")
    expect_equal(rsplits, torch.full((n,), 2, dtype=torch.int32), "received splits after the errors")
    splits = (
        np.arange(n, dtype=np.int64) % 2 + 1
    )  # a list-like of other ints: converted, as torch.tensor(splits, dtype=int32)
    out, rsplits = hvd.alltoall(torch.ones(int(splits.sum()), 1) * r, splits=splits, name="after.np")
    expect_equal(rsplits, torch.full((n,), int(splits[r]), dtype=torch.int32), "numpy int64 splits")
    expect_equal(hvd.allreduce(torch.ones(3), op=hvd.Sum, name="after"), torch.full((3,), float(n)), "allreduce after")
    hvd.shutdown()


def grads() -> None:
    """Gradients as Horovod's (test/parallel/test_torch.py): its tests with
    ones as the upstream gradient, then each rank a different upstream
    gradient (so that a gradient put back in the wrong rows shows)."""
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    f64 = torch.float64

    # test_horovod_reducescatter_grad and _grad_average: Sum gives size, Average 1
    for dt in (torch.float32, torch.float64):
        for dim in (1, 2, 3):
            for op, want in ((hvd.Sum, float(n)), (hvd.Average, 1.0)):
                t = data(r, dt, [n * 4] * dim, seed=50).requires_grad_()
                hvd.reducescatter(t, op=op).backward(torch.ones([4] + [n * 4] * (dim - 1), dtype=dt))
                expect_equal(t.grad, torch.full_like(t, want), f"reducescatter grad {dt} dim={dim} op={op}")
                # test_horovod_grouped_reducescatter_grad: a backward per output
                ts = [data(r, dt, [n * 4] * dim, seed=51 + i).requires_grad_() for i in range(3)]
                for o in hvd.grouped_reducescatter(ts, op=op):
                    o.backward(torch.ones([4] + [n * 4] * (dim - 1), dtype=dt))
                for i, t in enumerate(ts):
                    expect_equal(t.grad, torch.full_like(t, want), f"grouped reducescatter grad {i} {dt} op={op}")

    # Uneven rows, scale factors, a distinct upstream gradient per rank: the
    # gradient is the upstream one times size (Sum) times pre times post,
    # allgathered in rank order.
    d0 = 2 * n + 1
    rows = [d0 // n + (1 if k < d0 % n else 0) for k in range(n)]
    start = sum(rows[:r])
    for op in (hvd.Sum, hvd.Average):
        for pre, post in ((1.0, 1.0), (0.5, 3.0)):
            what = f"reducescatter op={op} pre={pre} post={post}"
            ins = [data(k, f64, (d0, 2), seed=52) for k in range(n)]
            up = [data(k, f64, (rows[k], 2), seed=53) for k in range(n)]
            scale = pre * post * (n if op == hvd.Sum else 1)
            t = ins[r].clone().requires_grad_()
            out = hvd.reducescatter(t, op=op, prescale_factor=pre, postscale_factor=post)
            full = reference_reduce(ins, op, n, pre, post)
            expect_equal(out.detach(), full[start : start + rows[r]], what, 1e-12)
            out.backward(up[r])
            expect_equal(t.grad, torch.cat(up) * scale, what + " grad", 1e-12)
            ts = [ins[r].clone().requires_grad_(), ins[r][:, :1].clone().requires_grad_()]
            outs = hvd.grouped_reducescatter(ts, op=op, prescale_factor=pre, postscale_factor=post)
            (outs[0] * up[r]).sum().add((outs[1] * up[r][:, :1]).sum()).backward()
            expect_equal(ts[0].grad, torch.cat(up) * scale, what + " grouped grad 0", 1e-12)
            expect_equal(ts[1].grad, torch.cat([u[:, :1] for u in up]) * scale, what + " grouped grad 1", 1e-12)

    # grouped_allgather: as allgather's, the upstream gradients averaged over
    # the ranks, then this rank's rows
    xs = [data(k, f64, (k + 1, 2), seed=54) for k in range(n)]
    ys = [data(k, f64, (2, 3), seed=55) for k in range(n)]
    gx = [data(k, f64, (sum(range(1, n + 1)), 2), seed=56) for k in range(n)]
    gy = [data(k, f64, (2 * n, 3), seed=57) for k in range(n)]
    x, y = xs[r].clone().requires_grad_(), ys[r].clone().requires_grad_()
    ox, oy = hvd.grouped_allgather([x, y])
    expect_equal(ox.detach(), torch.cat(xs), "grouped allgather x")
    expect_equal(oy.detach(), torch.cat(ys), "grouped allgather y")
    ((ox * gx[r]).sum() + (oy * gy[r]).sum()).backward()
    off = sum(range(1, r + 1))
    expect_equal(x.grad, (sum(gx) / n)[off : off + r + 1], "grouped allgather grad x", 1e-12)
    expect_equal(y.grad, (sum(gy) / n)[2 * r : 2 * r + 2], "grouped allgather grad y", 1e-12)

    # test_horovod_alltoall_grad / _equal_split_grad: ones back
    for splits in (torch.tensor([r + 1] * n, dtype=torch.int32), None):
        vals = [float(i) for i in range(n) for _ in range(r + 1)]
        t = torch.tensor(vals, dtype=f64).view(-1, 1).repeat(1, 2).requires_grad_()
        out = hvd.alltoall(t, splits)
        out = out[0] if splits is not None else out
        out.backward(torch.ones_like(out))
        expect_equal(t.grad, torch.ones_like(t), f"alltoall grad splits={splits is not None}")

    # test_horovod_grouped_allreduce_grad: a backward per output, Sum gives size
    ts = [data(r, f64, (17,), seed=58 + i).requires_grad_() for i in range(3)]
    for o in hvd.grouped_allreduce(ts, op=hvd.Sum):
        o.backward(torch.ones(17, dtype=f64))
    for i, t in enumerate(ts):
        expect_equal(t.grad, torch.full_like(t, float(n)), f"grouped allreduce grad {i}")
    hvd.shutdown()


# --------------------------------------------------------------------------- adasum


def adasum_reference(ts: list[torch.Tensor], pre: float = 1.0, post: float = 1.0) -> torch.Tensor:
    """Horovod's Adasum of the ranks' tensors, from the paper's formula: the
    ranks combine pairwise over the tree ((0, 1), (2, 3)), ((01), (23)), ...
    with a' = (1 - a·b/(2‖a‖²))·a + (1 - a·b/(2‖b‖²))·b computed in float64
    (a coefficient stays 1 when its squared norm is below √DBL_MIN), each
    level rounded to the tensor's dtype as Horovod stores it; prescale before
    (in the dtype's precision, float32 for float16), postscale after."""
    dt = ts[0].dtype
    work = torch.float64 if dt is torch.float64 else torch.float32

    def scale(t: torch.Tensor, f: float) -> torch.Tensor:
        return t if f == 1.0 else (t.to(work) * f).to(dt)

    vs = [scale(t, pre).double().flatten() for t in ts]
    tiny = math.sqrt(sys.float_info.min)
    level = 1
    while level < len(vs):
        for i in range(0, len(vs), 2 * level):
            a, b = vs[i], vs[i + level]
            dot, na, nb = float(a @ b), float(a @ a), float(b @ b)
            ca = 1 - dot / (2 * na) if na >= tiny else 1.0
            cb = 1 - dot / (2 * nb) if nb >= tiny else 1.0
            vs[i] = (ca * a + cb * b).to(dt).double()
        level *= 2
    return scale(vs[0].to(dt), post).reshape(ts[0].shape)


def adasum() -> None:
    """allreduce / grouped_allreduce / DistributedOptimizer with op=Adasum,
    checked against adasum_reference of every rank's inputs."""
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    if n & (n - 1):
        # Horovod's client refuses a non-power-of-two job before sending.
        for f in (
            lambda: hvd.allreduce(torch.ones(2), op=hvd.Adasum, name="ada"),
            lambda: hvd.grouped_allreduce([torch.ones(2)], op=hvd.Adasum, name="ada.g"),
        ):
            try:
                f()
            except NotImplementedError as e:
                assert "Running Adasum with non-power of 2 ranks is not supported yet." in str(e), str(e)
            else:
                raise AssertionError("Adasum on a non-power-of-two job did not raise")
        hvd.shutdown()
        return

    for dt in (torch.float16, torch.float32, torch.float64):
        for shape in ((3, 4), (17,), ()):
            ts = [data(k, dt, shape, seed=7) for k in range(n)]
            got = hvd.allreduce(ts[r], op=hvd.Adasum, name=f"ada.{dt}.{shape}")
            expect_equal(got, adasum_reference(ts), f"adasum {dt} {shape}", tol_for(dt))
        ts = [data(k, dt, (5, 3), seed=8) for k in range(n)]
        got = hvd.allreduce(ts[r], op=hvd.Adasum, prescale_factor=0.5, postscale_factor=3.0, name=f"ada.sc.{dt}")
        expect_equal(got, adasum_reference(ts, 0.5, 3.0), f"adasum {dt} with scale factors", tol_for(dt))

    # The exact cases: orthogonal vectors sum, equal vectors stay.
    ortho = torch.zeros(n, 3)
    ortho[r, r % 3] = r + 1.0
    ortho_sum = torch.zeros(n, 3)
    for k in range(n):
        ortho_sum[k, k % 3] = k + 1.0
    same = torch.tensor([1.0, -2.0, 0.5])
    expect_equal(hvd.allreduce(ortho, op=hvd.Adasum, name="ada.ortho"), ortho_sum, "adasum of orthogonal vectors")
    expect_equal(hvd.allreduce(same, op=hvd.Adasum, name="ada.same"), same, "adasum of equal vectors")

    # In place and asynchronous, several at once: the daemon fuses them, and
    # still combines each tensor on its own (per-tensor dot products).
    ts = [[data(k, torch.float32, (4 + i,), seed=10 + i) for k in range(n)] for i in range(3)]
    outs = [t[r].clone() for t in ts]
    handles = [hvd.allreduce_async_(o, op=hvd.Adasum, name=f"ada.async.{i}") for i, o in enumerate(outs)]
    handles.append(hvd.allreduce_async(ortho, op=hvd.Adasum, name="ada.async.ortho"))
    handles.append(hvd.allreduce_async(same, op=hvd.Adasum, name="ada.async.same"))
    for i, h in enumerate(handles[:3]):
        assert hvd.synchronize(h) is outs[i]
        expect_equal(outs[i], adasum_reference(ts[i]), f"async adasum {i}", 1e-5)
    expect_equal(hvd.synchronize(handles[3]), ortho_sum, "async adasum of orthogonal vectors")
    expect_equal(hvd.synchronize(handles[4]), same, "async adasum of equal vectors")

    # Grouped: one response, each tensor its own Adasum. Over the fused
    # buffer the equal vectors would not come back unchanged.
    g = [data(k, torch.float64, (6,), seed=20) for k in range(n)]
    got = hvd.grouped_allreduce([same.double(), ortho.double(), g[r]], op=hvd.Adasum, name="ada.grouped")
    expect_equal(got[0], same.double(), "grouped adasum of equal vectors")
    expect_equal(got[1], ortho_sum.double(), "grouped adasum of orthogonal vectors")
    expect_equal(got[2], adasum_reference(g), "grouped adasum", 1e-12)

    # Autograd: the gradient is Adasum-reduced too (equal ones stay ones).
    x = data(r, torch.float32, (4,), seed=30).requires_grad_()
    hvd.allreduce(x, op=hvd.Adasum, name="ada.grad").sum().backward()
    expect_equal(x.grad, torch.ones(4), "gradient of adasum")

    # A joined rank is a zero vector, which leaves its partner unchanged.
    ts = [data(k, torch.float32, (7,), seed=40) for k in range(n)]
    if r == n - 1:
        hvd.join()
    else:
        got = hvd.allreduce(ts[r], op=hvd.Adasum, name="ada.join")
        expect_equal(got, adasum_reference(ts[:-1] + [torch.zeros(7)]), "adasum with a joined rank", 1e-5)
        hvd.join()

    # What Horovod refuses: integers (the daemon, on every rank), another
    # process set (the client, at once).
    try:
        hvd.allreduce(torch.ones(3, dtype=torch.int64), op=hvd.Adasum, name="ada.int")
    except hvd.HorovodInternalError as e:
        assert "Unsupported data type" in str(e), str(e)
    else:
        raise AssertionError("Adasum of int64 did not raise")
    for f in (
        lambda: hvd.allreduce(torch.ones(2), op=hvd.Adasum, process_set=hvd.ProcessSet([0, 1])),
        lambda: hvd.DistributedOptimizer(
            torch.optim.SGD(_model(1).parameters(), lr=0.1), op=hvd.Adasum, process_set=hvd.ProcessSet([0, 1])
        ),
    ):
        try:
            f()
        except NotImplementedError as e:
            assert "Adasum does not support non-global process sets yet." in str(e), str(e)
        else:
            raise AssertionError("Adasum on another process set did not raise")

    adasum_optimizer()
    hvd.shutdown()


def adasum_optimizer() -> None:
    """DistributedOptimizer(op=Adasum), as Horovod's delta optimizer: every
    rank takes its local SGD step, and the ranks' parameter deltas are
    combined with Adasum and added to the parameters they started from.
    Checked against n local optimizers doing exactly that."""
    r, n = hvd.rank(), hvd.size()
    steps = 3
    mse = torch.nn.functional.mse_loss
    m = _model(1 + r)  # different on purpose: broadcast_parameters must fix it
    opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
    hvd.broadcast_parameters(m.state_dict(), root_rank=0)
    opt = hvd.DistributedOptimizer(opt, named_parameters=m.named_parameters(), op=hvd.Adasum)
    assert type(opt).__name__ == "SGD" and isinstance(opt, torch.optim.SGD)
    for s in range(steps):
        opt.zero_grad()
        x, y = _batch(r, s)
        mse(m(x), y).backward()
        opt.step()

    models = [_model(1) for _ in range(n)]
    opts = [torch.optim.SGD(mk.parameters(), lr=0.1, momentum=0.9) for mk in models]
    for s in range(steps):
        start = [p.detach().clone() for p in models[0].parameters()]
        deltas = []
        for k in range(n):
            opts[k].zero_grad()
            x, y = _batch(k, s)
            mse(models[k](x), y).backward()
            opts[k].step()
            deltas.append([p.detach() - st for p, st in zip(models[k].parameters(), start)])
        for i, st in enumerate(start):
            new = st + adasum_reference([d[i] for d in deltas])
            for mk in models:
                list(mk.parameters())[i].data.copy_(new)
    for got, want in zip(m.parameters(), models[0].parameters()):
        expect_equal(got.detach(), want.detach(), "Adasum DistributedOptimizer", 1e-5)
    # Adasum is not the average: the plain optimizer's parameters differ.
    avg = _model(1)
    avg_opt = torch.optim.SGD(avg.parameters(), lr=0.1, momentum=0.9)
    for s in range(steps):
        avg_opt.zero_grad()
        for k in range(n):
            x, y = _batch(k, s)
            (mse(avg(x), y) / n).backward()
        avg_opt.step()
    assert any(not torch.allclose(a, b, atol=1e-5) for a, b in zip(m.parameters(), avg.parameters()))
    gathered = hvd.allgather_object([p.detach() for p in m.parameters()])
    for other in gathered:
        for a, b in zip(other, gathered[0]):
            expect_equal(a, b, "parameters equal across ranks", 0.0)

    # Horovod's Adasum optimizer has no separate synchronize.
    opt.synchronize()
    try:
        with opt.skip_synchronize():
            pass
    except AssertionError as e:
        assert "not supported when using Adasum" in str(e), str(e)
    else:
        raise AssertionError("skip_synchronize did not raise")


def victim() -> None:
    """The last rank dies (SIGKILL) with a collective pending elsewhere; the
    others must get HorovodInternalError instead of hanging."""
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    hvd.allreduce(torch.ones(1), name="warm")
    if r == n - 1:
        os.kill(os.getpid(), signal.SIGKILL)
    try:
        hvd.allreduce(torch.ones(1), name="never")
    except hvd.HorovodInternalError as e:
        assert "lost" in str(e) or "rank" in str(e), str(e)
    else:
        raise AssertionError("allreduce with a dead rank did not raise")
    # and later ops fail the same way
    try:
        hvd.allreduce(torch.ones(1), name="later")
    except hvd.HorovodInternalError:
        pass
    else:
        raise AssertionError("later op did not raise")
    hvd.shutdown()


# --------------------------------------------------------------------------- training helpers


def _model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))


def _batch(rank: int, step: int, bs: int = 6) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(100 * step + rank)
    return torch.randn(bs, 4, generator=g), torch.randn(bs, 2, generator=g)


class Thing:
    """A user-defined picklable class for the object collectives."""

    def __init__(self, v):
        self.v = v

    def __eq__(self, o):
        return isinstance(o, Thing) and o.v == self.v


def optimizer() -> None:
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    steps = 5

    def reference(passes: int) -> list[torch.Tensor]:
        """One process training on every rank's batches: the mean of the
        per-rank losses (same batch size everywhere) gives the averaged grads."""
        m = _model(1)
        opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
        for s in range(steps):
            opt.zero_grad()
            for p in range(passes):
                for k in range(n):
                    x, y = _batch(k, s * passes + p)
                    (torch.nn.functional.mse_loss(m(x), y) / n).backward()
            opt.step()
        return [p.detach().clone() for p in m.parameters()]

    for passes, compression, tol in (
        (1, hvd.Compression.none, 1e-5),
        (2, hvd.Compression.none, 1e-5),
        (1, hvd.Compression.fp16, 1e-2),
    ):
        m = _model(1 + r)  # different on purpose: broadcast_parameters must fix it
        opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
        opt = hvd.DistributedOptimizer(
            opt, named_parameters=m.named_parameters(), compression=compression, backward_passes_per_step=passes
        )
        hvd.broadcast_parameters(m.state_dict(), root_rank=0)
        hvd.broadcast_optimizer_state(opt, root_rank=0)
        for s in range(steps):
            opt.zero_grad()
            for p in range(passes):
                x, y = _batch(r, s * passes + p)
                torch.nn.functional.mse_loss(m(x), y).backward()
            opt.step()
        want = reference(passes)
        for got, w in zip(m.parameters(), want):
            expect_equal(got.detach(), w, f"DistributedOptimizer passes={passes} {compression.__name__}", tol)
        gathered = hvd.allgather_object([p.detach() for p in m.parameters()])
        for other in gathered:
            for a, b in zip(other, gathered[0]):
                expect_equal(a, b, "parameters equal across ranks", 0.0)

    # too many backward passes
    m = _model(1)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1), named_parameters=m.named_parameters())
    x, y = _batch(r, 0)
    torch.nn.functional.mse_loss(m(x), y).backward()
    try:
        torch.nn.functional.mse_loss(m(x), y).backward()
    except AssertionError as e:
        assert "backward_passes_per_step" in str(e)
    else:
        raise AssertionError("a second backward did not raise")
    opt.synchronize()
    with opt.skip_synchronize():
        opt.step()

    # synchronize + step without skip_synchronize warns
    opt.zero_grad()
    torch.nn.functional.mse_loss(m(x), y).backward()
    opt.synchronize()
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        opt.step()
        assert any("skip_synchronize" in str(x.message) for x in w)

    # validation errors, as Horovod
    m = _model(1)
    for kwargs, text in (
        (dict(named_parameters=[("a", p) for p in m.parameters()]), "must be unique"),
        (dict(named_parameters=list(m.named_parameters())[:1]), "were not named"),
        (dict(named_parameters=[p for p in m.parameters()]), "sequence of tuples"),
        (dict(backward_passes_per_step=0), "backward_passes_per_step must be > 0"),
        (dict(op=hvd.Sum, gradient_predivide_factor=2.0), "gradient_predivide_factor not supported"),
    ):
        try:
            hvd.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1), **kwargs)
        except ValueError as e:
            assert text in str(e), (text, str(e))
        else:
            raise AssertionError(f"{kwargs} did not raise")

    # groups and gradient_predivide_factor give the same result as plain
    for kwargs in (dict(groups=2), dict(gradient_predivide_factor=2.0), dict(op=hvd.Sum)):
        m = _model(1)
        opt = hvd.DistributedOptimizer(
            torch.optim.SGD(m.parameters(), lr=0.1), named_parameters=m.named_parameters(), **kwargs
        )
        opt.zero_grad()
        x, y = _batch(r, 0)
        torch.nn.functional.mse_loss(m(x), y).backward()
        opt.synchronize()
        grads = [p.grad.clone() for p in m.parameters()]
        ref = _model(1)
        for k in range(n):
            xk, yk = _batch(k, 0)
            scale = 1.0 if kwargs.get("op") == hvd.Sum else 1.0 / n
            (torch.nn.functional.mse_loss(ref(xk), yk) * scale).backward()
        for g, p in zip(grads, ref.parameters()):
            expect_equal(g, p.grad, f"grads with {kwargs}", 1e-5)

    # broadcast_optimizer_state makes Adam state and options identical
    m = _model(1)
    opt = torch.optim.Adam(m.parameters(), lr=0.01 * (r + 1), betas=(0.9, 0.99 - 0.01 * r))
    x, y = _batch(r, 3)
    torch.nn.functional.mse_loss(m(x), y).backward()
    opt.step()
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    st = hvd.allgather_object(opt.state_dict())
    for k in range(n):
        assert st[k]["param_groups"] == st[0]["param_groups"], st
        for pid, s in st[k]["state"].items():
            for key, v in s.items():
                expect_equal(torch.as_tensor(v), torch.as_tensor(st[0]["state"][pid][key]), f"adam state {key}")
    assert opt.param_groups[0]["lr"] == 0.01 and isinstance(opt.param_groups[0]["betas"], tuple)
    try:
        hvd.broadcast_optimizer_state(torch.optim.LBFGS(m.parameters()), 0)
    except ValueError as e:
        assert "LBFGS" in str(e)
    else:
        raise AssertionError("LBFGS did not raise")

    # broadcast_object / allgather_object with arbitrary picklable objects
    obj = {"rank": r, "list": [1, 2.5, "x" * (r * 100)], "t": torch.arange(r + 2), "thing": Thing(r)}
    got = hvd.broadcast_object(obj, root_rank=n - 1)
    assert got["rank"] == n - 1 and got["list"][2] == "x" * ((n - 1) * 100) and got["thing"] == Thing(n - 1)
    assert torch.equal(got["t"], torch.arange(n + 1))
    assert hvd.broadcast_object(None) is None
    allg = hvd.allgather_object(obj)
    assert [o["rank"] for o in allg] == list(range(n)) and [o["thing"].v for o in allg] == list(range(n))
    # unnamed, with objects whose type differs per rank (Horovod's default
    # name, the type's, would differ between ranks and hang hvdd): issue 24
    assert hvd.broadcast_object({"k": 1} if r == 0 else None) == {"k": 1}
    assert hvd.allgather_object(r if r % 2 == 0 else str(r)) == [q if q % 2 == 0 else str(q) for q in range(n)]
    hvd.shutdown()


def _lookup_batch(rank: int, step: int, bs: int = 5, vocab: int = 12) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(300 * step + rank)
    return torch.randint(0, vocab, (bs, 3), generator=g), torch.randn(bs, 4, generator=g)


def _lookup_loss(emb: torch.nn.Embedding, idx: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return ((emb(idx).sum(1) - y) ** 2).mean()


def sparse_optimizer() -> None:
    """DistributedOptimizer on sparse gradients (an Embedding(sparse=True)),
    densified (sparse_as_dense=True: allreduced, then sparse again) or not
    (allgathered, Horovod's sparse_allreduce), with SparseAdam and SGD: the
    same weights as one process training on every rank's batches. Then
    explicit groups whose members' hooks do not all fire in a step."""
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    steps = 4

    def embedding(seed: int) -> torch.nn.Embedding:
        torch.manual_seed(seed)
        return torch.nn.Embedding(12, 4, sparse=True)

    def make_opt(emb: torch.nn.Embedding, kind: str) -> torch.optim.Optimizer:
        if kind == "SparseAdam":
            return torch.optim.SparseAdam(list(emb.parameters()), lr=0.05)
        return torch.optim.SGD(emb.parameters(), lr=0.5)

    for kind in ("SparseAdam", "SGD"):
        # The reference: the mean of the ranks' losses (equal batch sizes) in one process.
        ref = embedding(7)
        ref_opt = make_opt(ref, kind)
        for s in range(steps):
            ref_opt.zero_grad()
            for k in range(n):
                (_lookup_loss(ref, *_lookup_batch(k, s)) / n).backward()
            ref_opt.step()
        for sparse_as_dense in (True, False):
            what = f"{kind} sparse_as_dense={sparse_as_dense}"
            emb = embedding(7 + r)  # different on purpose: broadcast_parameters makes them equal
            hvd.broadcast_parameters(emb.state_dict(), root_rank=0)
            opt = hvd.DistributedOptimizer(
                make_opt(emb, kind), named_parameters=emb.named_parameters(), sparse_as_dense=sparse_as_dense
            )
            for s in range(steps):
                opt.zero_grad()
                _lookup_loss(emb, *_lookup_batch(r, s)).backward()
                opt.step()
                assert emb.weight.grad.is_sparse, f"{what}: the gradient is no longer sparse"
            expect_equal(emb.weight.detach(), ref.weight.detach(), what, 1e-5)

    # groups=[[p, q]] where step 0 uses p only: q's hook does not fire, so
    # synchronize reduces both alone and the group must count afresh (else
    # step 1 sends the group when p alone is ready, with q.grad None).
    def params() -> tuple[torch.nn.Parameter, torch.nn.Parameter]:
        return torch.nn.Parameter(torch.ones(3)), torch.nn.Parameter(torch.full((3,), 2.0))

    def group_loss(p: torch.Tensor, q: torch.Tensor, rank: int, s: int) -> torch.Tensor:
        x = torch.arange(3, dtype=torch.float32) + rank + s
        return (p * x).sum() ** 2 + ((q * x).sum() ** 2 if s > 0 else 0.0)

    rp, rq = params()
    ref_opt = torch.optim.SGD([rp, rq], lr=0.01)
    p, q = params()
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD([p, q], lr=0.01), named_parameters=[("p", p), ("q", q)], groups=[[p, q]]
    )
    for s in range(3):
        ref_opt.zero_grad(set_to_none=True)
        for k in range(n):
            (group_loss(rp, rq, k, s) / n).backward()
        ref_opt.step()
        opt.zero_grad(set_to_none=True)
        group_loss(p, q, r, s).backward()
        opt.step()
        expect_equal(p.detach(), rp.detach(), f"groups step {s} p", 1e-5)
        expect_equal(q.detach(), rq.detach(), f"groups step {s} q", 1e-5)
    hvd.shutdown()


def _torch_optimizers() -> list[tuple[str, type]]:
    """torch.optim's optimizers, sorted by name (the same order on every
    rank), without LBFGS and SparseAdam, as Horovod's tests take them; and
    without those that refuse the tests' models (newer torch's Muon takes 2-D
    parameters only), which are named on stdout."""
    found = []
    for c in torch.optim.Optimizer.__subclasses__():
        if not c.__module__.startswith("torch.optim") or c in (torch.optim.LBFGS, torch.optim.SparseAdam):
            continue
        try:
            c(torch.nn.Linear(2, 2).parameters(), lr=0.1)
        except ValueError as e:
            print(f"left out {c.__name__}: {e}")
            continue
        found.append((c.__name__, c))
    return sorted(found)


def _optimizer_args(cls: type, params: dict) -> dict:
    import inspect

    accepted = inspect.signature(cls.__init__).parameters
    return {k: v for k, v in params.items() if k in accepted}


def horovod_tests() -> None:
    """Horovod 0.28.1's torch tests (test/parallel/test_torch.py) that hvdd's
    other scenarios do not already cover, ported: forced allreduce of unused
    gradients, requires_grad turned off and on, optimizer state and options
    broadcast for every torch.optim optimizer, parameters without gradients,
    join with allreduce (and Horovod's refusals of allgather and broadcast
    with a joined rank), duplicate names and mismatches for every
    collective, reinit."""
    import torch.nn.functional as F

    hvd.init()
    r, n = hvd.rank(), hvd.size()
    optimizers = _torch_optimizers()
    assert len(optimizers) >= 10, optimizers
    g = torch.Generator().manual_seed(1234)
    x, y = torch.randn(16, 12, generator=g), torch.randn(16, 4, generator=g)

    def same_on_every_rank(tensors: list, what: str) -> None:
        for other in hvd.allgather_object([t.detach() for t in tensors]):
            for a, b in zip(other, tensors):
                expect_equal(a, b.detach(), what)

    # test_force_allreduce: rank 0's loss leaves fc3 without gradients; step()
    # still reduces every parameter (zeros for the missing), no rank hangs.
    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc1, self.fc2, self.fc3 = torch.nn.Linear(12, 6), torch.nn.Linear(6, 4), torch.nn.Linear(4, 4)

        def forward(self, x_: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            x1 = self.fc2(F.relu(self.fc1(x_)))
            return x1, self.fc3(F.relu(x1))

    for (name, cls), params in (
        (o, p) for o in optimizers for p in (dict(lr=0.2, momentum=0.9, weight_decay=0.1, centered=True), dict(lr=0.2))
    ):
        model = Net()
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        opt = hvd.DistributedOptimizer(
            cls(model.parameters(), **_optimizer_args(cls, params)), named_parameters=model.named_parameters()
        )
        p1, p2 = model(x)
        loss = F.mse_loss(p1 if r == 0 else p2, y, reduction="sum")
        opt.zero_grad()
        loss.backward()
        opt.step()
        same_on_every_rank(list(model.parameters()), f"force_allreduce {name} {params}")

    # test_dynamic_requires_grad: a generator and a discriminator trained in turn
    gen, disc = torch.nn.Conv2d(1, 10, 1), torch.nn.Conv2d(10, 1, 1)
    inp = torch.rand([1, 1, 20, 20], generator=g)
    hvd.broadcast_parameters(list(gen.named_parameters()) + [("d." + k, v) for k, v in disc.named_parameters()], 0)
    gen_opt = hvd.DistributedOptimizer(
        torch.optim.SGD(gen.parameters(), lr=1e-4), named_parameters=gen.named_parameters()
    )
    disc_opt = hvd.DistributedOptimizer(
        torch.optim.SGD(disc.parameters(), lr=1e-4), named_parameters=disc.named_parameters()
    )
    for _ in range(3):
        for train_gen in (True, False):
            for p in gen.parameters():
                p.requires_grad_(train_gen)
            for p in disc.parameters():
                p.requires_grad_(not train_gen)
            gen_opt.zero_grad(set_to_none=False)
            disc_opt.zero_grad(set_to_none=False)
            disc(gen(inp)).sum().backward()
            # the trained part's gradients are not zero, the frozen part's are (or None)
            for part, trained in ((gen, train_gen), (disc, not train_gen)):
                for p in part.parameters():
                    assert trained == (p.grad is not None and bool(p.grad.abs().max() > 0)), (trained, p.grad)
            (gen_opt if train_gen else disc_opt).step()
    same_on_every_rank(list(gen.parameters()) + list(disc.parameters()), "dynamic requires_grad")

    # test_broadcast_state: every optimizer's state, after a step on every
    # rank and a checkpoint loaded on rank 0 only, is rank 0's everywhere.
    def state_values(opt: torch.optim.Optimizer) -> list:
        sd = opt.state_dict()
        out = []
        for group in sd["param_groups"]:
            for pid in group["params"]:
                for k, v in sorted(sd["state"].get(pid, {}).items()):
                    out.append((k, v.clone() if torch.is_tensor(v) else v))
        return out

    for (name, cls), params in (
        (o, p) for o in optimizers for p in (dict(lr=0.2, momentum=0.9, weight_decay=0.1, centered=True), dict(lr=0.2))
    ):
        what = f"broadcast_optimizer_state {name} {params}"
        torch.manual_seed(r)
        model = torch.nn.Sequential(torch.nn.Linear(12, 6), torch.nn.ReLU(), torch.nn.Linear(6, 4))
        opt = hvd.DistributedOptimizer(
            cls(model.parameters(), **_optimizer_args(cls, params)), named_parameters=model.named_parameters()
        )
        F.mse_loss(model(x), y, reduction="sum").backward()
        opt.step()
        saved = hvd.broadcast_object(
            ({k: v.clone() for k, v in model.state_dict().items()}, opt.state_dict()) if r == 0 else None, name="ckpt"
        )
        # a fresh model and optimizer; only rank 0 loads the checkpoint
        model = torch.nn.Sequential(torch.nn.Linear(12, 6), torch.nn.ReLU(), torch.nn.Linear(6, 4))
        opt = hvd.DistributedOptimizer(
            cls(model.parameters(), **_optimizer_args(cls, params)), named_parameters=model.named_parameters()
        )
        if r == 0:
            model.load_state_dict(saved[0])
            opt.load_state_dict(saved[1])
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        for k, v in model.state_dict().items():
            expect_equal(v, saved[0][k], f"{what}: parameter {k}")
        want = hvd.broadcast_object(state_values(opt) if r == 0 else None, name="want")
        hvd.broadcast_optimizer_state(opt, root_rank=0)
        got = state_values(opt)
        assert [k for k, _ in got] == [k for k, _ in want], (what, [k for k, _ in got], [k for k, _ in want])
        for (k, a), (_, b) in zip(got, want):
            assert type(a) is type(b), (what, k, type(a), type(b))
            if torch.is_tensor(a):
                expect_equal(a, b, f"{what}: state {k}")
            else:
                assert a == b, (what, k, a, b)

    # test_broadcast_state_options: rank 0's options, with their types, and a step after
    params_0 = dict(
        lr=0.1,
        momentum=0.8,
        weight_decay=0.2,
        nesterov=True,
        betas=(0.9, 0.999),
        etas=(0.8, 2.4),
        step_sizes=(1e-5, 100),
    )
    params_1 = dict(
        lr=0.2,
        momentum=0.9,
        weight_decay=0.1,
        nesterov=False,
        betas=(0.8, 0.9),
        etas=(0.25, 1.75),
        step_sizes=(1e-7, 5),
    )
    for name, cls in optimizers:
        model = torch.nn.Sequential(torch.nn.Linear(12, 6), torch.nn.ReLU(), torch.nn.Linear(6, 4))
        opt = cls(model.parameters(), **_optimizer_args(cls, params_0 if r == 0 else params_1))
        opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
        F.mse_loss(model(x), y, reduction="sum").backward()
        opt.step()
        hvd.broadcast_optimizer_state(opt, root_rank=0)
        for k, want in _optimizer_args(cls, params_0).items():
            got = opt.param_groups[0][k]
            assert type(got) is type(want), (name, k, type(got), type(want))
            for a, b in zip(got if isinstance(want, tuple) else [got], want if isinstance(want, tuple) else [want]):
                assert type(a) is type(b) and abs(a - b) <= 1e-5 * max(1.0, abs(b)), (name, k, got, want)
        opt.zero_grad()
        F.mse_loss(model(x), y, reduction="sum").backward()
        opt.step()

    # test_broadcast_state_no_grad: a parameter that takes no gradient
    class NoGrad(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = torch.nn.Parameter(torch.tensor([1, 3]).int(), requires_grad=False)
            self.b = torch.nn.Parameter(torch.rand(4, generator=g))

    model = NoGrad()
    opt = torch.optim.SGD(model.parameters(), lr=0.001, weight_decay=1e-6, momentum=0.9, nesterov=True)
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    assert opt.param_groups[0]["params"][0].grad is None
    grad = opt.param_groups[0]["params"][1].grad
    expect_equal(hvd.broadcast(grad, root_rank=0), grad, "no_grad: b's gradient")

    # Duplicate names in flight, for every collective: ValueError at the call
    # (rank 0 tries while the others wait in a broadcast it joins after).
    t = torch.ones(2 * n, 2)
    for kind, call in (
        ("allreduce", lambda nm: hvd.allreduce_async(t, name=nm)),
        ("allgather", lambda nm: hvd.allgather_async(t, name=nm)),
        ("broadcast", lambda nm: hvd.broadcast_async(t, 0, name=nm)),
        ("alltoall", lambda nm: hvd.alltoall_async(t, name=nm)),
        ("reducescatter", lambda nm: hvd.reducescatter_async(t, name=nm)),
    ):
        if r == 0:
            h = call("duplicate_name")
            try:
                call("duplicate_name")
            except ValueError as e:
                assert "same name" in str(e), str(e)
            else:
                raise AssertionError(f"{kind}: a duplicate name in flight did not raise")
            hvd.broadcast(torch.ones(1), 0, name=f"dup.go.{kind}")
        else:
            hvd.broadcast(torch.ones(1), 0, name=f"dup.go.{kind}")
            h = call("duplicate_name")
        hvd.synchronize(h)

    # Mismatches the coordinator finds: HorovodInternalError on every rank, the job goes on
    for what, call in (
        ("broadcast root ranks", lambda: hvd.broadcast(torch.ones(3), r, name="rootmix")),
        (
            "alltoall types",
            lambda: hvd.alltoall(torch.ones(n, dtype=torch.int32 if r % 2 else torch.float32), name="a2atype"),
        ),
        ("alltoall shapes", lambda: hvd.alltoall(torch.ones(2 * n, 10 * (r + 1)), name="a2ashape")),
        ("allgather shapes", lambda: hvd.allgather(torch.ones(3, 10 * (r + 1)), name="agshape")),
        ("reducescatter of a scalar", lambda: hvd.reducescatter(torch.tensor(1.0), name="rsscalar")),
    ):
        try:
            call()
        except hvd.HorovodInternalError:
            pass
        else:
            raise AssertionError(f"mismatched {what}: no HorovodInternalError")

    # test_horovod_join_allreduce: the joined rank adds zeros, Average still divides by the size
    for first in (0, 1):
        for caching in (False, True):
            for dt in (torch.int32, torch.int64, torch.float32, torch.float64):
                a = torch.randint(-100, 100, (5, 5), generator=torch.Generator().manual_seed(1234)).to(dt)
                b = torch.randint(-100, 100, (17,), generator=torch.Generator().manual_seed(4321)).to(dt)
                if caching:
                    hvd.synchronize(hvd.allreduce_async(a, name="tensor_a"))
                    hvd.synchronize(hvd.allreduce_async(b, name="tensor_b"))
                if r == first:
                    last = hvd.join()
                else:
                    ha = hvd.allreduce_async(a, name="tensor_a")
                    hb = hvd.allreduce_async(b, name="tensor_b")
                    got_a, got_b = hvd.synchronize(ha), hvd.synchronize(hb)
                    last = hvd.join()

                    def div(v: torch.Tensor) -> torch.Tensor:
                        v = v * (n - 1)
                        return torch.div(v, n, rounding_mode="trunc") if not dt.is_floating_point else v / n

                    expect_equal(got_a, div(a), f"join allreduce {dt} first={first}", 1e-6)
                    expect_equal(got_b, div(b), f"join allreduce {dt} first={first}", 1e-6)
                lasts = hvd.allgather(torch.tensor([last]))
                assert len(set(lasts.tolist())) == 1 and lasts[0] != first, (lasts, first)

    # test_horovod_join_allgather / _broadcast: refused while a rank has joined
    for what, call in (
        ("allgather", lambda: hvd.allgather(torch.ones(17, 17), name="joined.ag")),
        ("broadcast", lambda: hvd.broadcast(torch.ones(17), 1, name="joined.bc")),
    ):
        if r == 0:
            hvd.join()
        else:
            try:
                call()
            except hvd.HorovodInternalError as e:
                assert "Join" in str(e), str(e)
            else:
                raise AssertionError(f"{what} with a joined rank: no HorovodInternalError")
            hvd.join()

    # test_horovod_reinit, test_horovod_is_initialized
    hvd.shutdown()
    assert not hvd.is_initialized()
    hvd.init()
    assert (hvd.rank(), hvd.size()) == (r, n)
    expect_equal(hvd.allreduce(torch.ones(2), op=hvd.Sum, name="reinit"), torch.full((2,), float(n)), "after reinit")
    hvd.shutdown()


def sync_bn() -> None:
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    torch.manual_seed(5)
    full = torch.randn(4 * n, 3, 5, dtype=torch.float64)
    mine = full[4 * r : 4 * r + 4].clone().requires_grad_()
    bn = hvd.SyncBatchNorm(3).double()
    ref = torch.nn.BatchNorm1d(3).double()
    out = bn(mine)
    whole = full.clone().requires_grad_()
    ref_out = ref(whole)
    expect_equal(out.detach(), ref_out.detach()[4 * r : 4 * r + 4], "SyncBatchNorm forward", 1e-9)
    expect_equal(bn.running_mean, ref.running_mean, "running_mean", 1e-9)
    expect_equal(bn.running_var, ref.running_var, "running_var", 1e-9)
    w = torch.arange(full.numel(), dtype=torch.float64).view_as(full)
    (out * w[4 * r : 4 * r + 4]).sum().backward()
    (ref_out * w).sum().backward()
    expect_equal(mine.grad, whole.grad[4 * r : 4 * r + 4], "SyncBatchNorm input grad", 1e-7)
    # Evaluation normalises locally with the running statistics.
    bn.eval()
    ref.eval()
    with torch.no_grad():
        expect_equal(bn(mine), ref(whole)[4 * r : 4 * r + 4], "SyncBatchNorm eval forward", 1e-9)
    hvd.shutdown()


def process_sets() -> None:
    """4 ranks: static sets [0, 1] and [1, 2, 3] from init, every collective in
    a set against references over its members only, errors, then dynamic
    add/remove."""
    even, odd3 = hvd.ProcessSet([0, 2]), hvd.ProcessSet([1, 2, 3])
    hvd.init(process_sets=[even, odd3])
    r, n = hvd.rank(), hvd.size()
    assert n == 4, n
    assert even.process_set_id == 1 and odd3.process_set_id == 2, (even, odd3)
    assert hvd.global_process_set.process_set_id == 0
    for ps in (even, odd3):
        members = ps.ranks
        if r not in members:
            assert ps.included() is False and ps.rank() == -1
            continue
        assert ps.included() and ps.rank() == members.index(r) and ps.size() == len(members)
        k = len(members)
        tag = ps.process_set_id
        for dt in (torch.float32, torch.int32, torch.float16):
            ins = {m: data(m, dt, (3, 4), seed=40) for m in members}
            for op in (hvd.Sum, hvd.Average, hvd.Max):
                got = hvd.allreduce(ins[r], op=op, name=f"ps{tag}.ar.{dt}.{op}", process_set=ps)
                expect_equal(
                    got,
                    reference_reduce([ins[m] for m in members], op, k),
                    f"set {members} allreduce {dt} {op}",
                    tol_for(dt),
                )
            # allgather with uneven first dimensions, in set order
            ag = {m: data(m, dt, (members.index(m) + 1, 2), seed=41) for m in members}
            expect_equal(
                hvd.allgather(ag[r], name=f"ps{tag}.ag.{dt}", process_set=ps),
                torch.cat([ag[m] for m in members]),
                f"set {members} allgather {dt}",
            )
            # broadcast: the root is a global rank
            root = members[-1]
            expect_equal(
                hvd.broadcast(ins[r], root, name=f"ps{tag}.bc.{dt}", process_set=ps),
                ins[root],
                f"set {members} broadcast {dt}",
            )
            # alltoall with splits over the set's members
            a2 = {m: data(m, dt, (k * (members.index(m) + 1), 2), seed=42) for m in members}
            splits = [members.index(r) + 1] * k
            out, rsplits = hvd.alltoall(a2[r], splits=splits, name=f"ps{tag}.a2a.{dt}", process_set=ps)
            me = members.index(r)
            want = torch.cat([a2[m][me * (members.index(m) + 1) : (me + 1) * (members.index(m) + 1)] for m in members])
            expect_equal(out, want, f"set {members} alltoall {dt}")
            assert rsplits.tolist() == [members.index(m) + 1 for m in members], rsplits
            # reducescatter over the set
            d0 = 2 * k + 1
            rs = {m: data(m, dt, (d0, 2), seed=43) for m in members}
            full = reference_reduce([rs[m] for m in members], hvd.Sum, k)
            rows = [d0 // k + (1 if i < d0 % k else 0) for i in range(k)]
            start = sum(rows[:me])
            expect_equal(
                hvd.reducescatter(rs[r], op=hvd.Sum, name=f"ps{tag}.rs.{dt}", process_set=ps),
                full[start : start + rows[me]],
                f"set {members} reducescatter {dt}",
                tol_for(dt),
            )
        hvd.barrier(process_set=ps)
        # A rank outside the set cannot use it; a root outside it is refused
        # (ValueError at the call, as Horovod's enqueue).
        outside = [x for x in range(n) if x not in members][0]
        expect_value_error(
            lambda: hvd.broadcast(torch.ones(2), outside, name=f"ps{tag}.badroot", process_set=ps),
            f"broadcast received invalid root rank {outside} for provided process set",
            "broadcast from a root outside the set",
        )
    if r not in even.ranks:
        expect_value_error(
            lambda: hvd.allreduce(torch.ones(2), name="notmember", process_set=even),
            f"Allreduce: Rank {r} is not a member of the provided process set.",
            "a non-member's allreduce in the set",
        )
    # The global set still works beside them.
    expect_equal(hvd.allreduce(torch.ones(2), op=hvd.Sum, name="global"), torch.full((2,), 4.0), "global after sets")
    # Dynamic sets need dynamic mode.
    try:
        hvd.add_process_set([0, 1])
        raise AssertionError("add_process_set without dynamic mode succeeded")
    except ValueError as e:
        assert "dynamic" in str(e), e
    hvd.shutdown()
    assert even.process_set_id is None, "shutdown must invalidate registered sets"

    hvd.init(process_sets="dynamic")
    pair = hvd.add_process_set([2, 3])
    assert pair.process_set_id is not None and pair.size() == 2
    try:
        hvd.add_process_set(hvd.ProcessSet([2, 3]))
        raise AssertionError("a duplicate process set was added")
    except ValueError as e:
        assert "duplicate" in str(e), e
    if r in (2, 3):
        got = hvd.allreduce(torch.full((3,), float(r)), op=hvd.Average, name="dyn", process_set=pair)
        expect_equal(got, torch.full((3,), 2.5), "dynamic set allreduce")
    assert hvd.remove_process_set(pair) is True
    assert pair.process_set_id is None
    assert hvd.remove_process_set(hvd.global_process_set) is False
    try:
        hvd.allreduce(torch.ones(1), name="removed", process_set=pair)
        raise AssertionError("a removed set was used")
    except ValueError as e:
        assert "not been registered" in str(e), e
    # Ranks that disagree on a set get an error naming both requests.
    try:
        hvd.add_process_set([0, 1] if r == 0 else [0, 2])
        raise AssertionError("mismatching process sets were added")
    except ValueError as e:
        assert "mismatching" in str(e), e
    hvd.shutdown()
    print("OK")


def elastic() -> None:
    """hvd.elastic on a real job (HOROVOD_ELASTIC=1): TorchState.sync gives
    every rank rank 0's model, optimizer, sampler and values, and an
    ObjectState rank 0's attributes; commit's host-update check agrees on
    every rank; run() re-forms the job (shutdown, init on the same daemon)
    after a HorovodInternalError, restoring the commit, and after a host
    update that only rank 0 was told of."""
    import hvdd.elastic

    hvd.init()
    r, n = hvd.rank(), hvd.size()
    model = _model(seed=r)  # different weights on every rank
    opt = torch.optim.SGD(model.parameters(), lr=0.1 * (r + 1), momentum=0.9)
    x, y = _batch(r, 0)
    torch.nn.functional.mse_loss(model(x), y).backward()
    opt.step()  # a rank's own momentum
    sampler = hvd.elastic.ElasticSampler(list(range(40)), seed=1)
    sampler.record_batch(0, 2 + r)
    state = hvd.elastic.TorchState(model, opt, sampler=sampler, epoch=10 + r, batch=20 + r)
    state.sync()
    gathered = hvd.allgather_object([model.state_dict(), opt.state_dict(), sampler.state_dict()])
    for other in gathered[1:]:
        for a, b in zip(gathered[0][0].values(), other[0].values()):
            expect_equal(b, a, "model after sync")
        for p in gathered[0][1]["state"]:
            expect_equal(
                other[1]["state"][p]["momentum_buffer"], gathered[0][1]["state"][p]["momentum_buffer"], "momentum"
            )
        assert other[1]["param_groups"][0]["lr"] == 0.1, other[1]["param_groups"]
        assert other[2] == {"epoch": 0, "processed_num": 2 * n}, other[2]
    assert (state.epoch, state.batch) == (10, 20), (state.epoch, state.batch)
    assert len(sampler) == (40 - 2 * n + n - 1) // n
    objs = hvd.elastic.ObjectState(name=f"rank{r}", values=[r] * 3)
    objs.sync()
    assert (objs.name, objs.values) == ("rank0", [0, 0, 0]), (objs.name, objs.values)
    state.commit()  # no host updates: no interrupt, on every rank

    resets = []
    state.register_reset_callbacks([lambda: resets.append((hvd.rank(), hvd.size()))])
    attempts = []

    @hvd.elastic.run
    def train(state):
        attempts.append(1)
        # Every rank runs every attempt: this collective would hang otherwise.
        hvd.allreduce(torch.ones(1), name=f"attempt{len(attempts)}")
        if len(attempts) == 1:
            state.batch = 99  # not committed: the restore undoes it
            raise hvd.HorovodInternalError("simulated loss of a rank")
        if len(attempts) == 2:
            assert state.batch == 20, state.batch
            if hvd.rank() == 0:
                hvdd.elastic.notification_manager.handle_hosts_updated(1, hvdd.elastic.HostUpdateResult.added)
            state.batch = 21
            state.commit()  # rank 0's notification interrupts every rank here
            raise AssertionError("commit did not raise HostsUpdatedInterrupt")
        return state.batch

    assert train(state) == 21
    assert len(attempts) == 3 and resets == [(r, n), (r, n)], (attempts, resets)
    assert hvd.is_initialized()
    hvd.shutdown()


def across_nodes() -> None:
    """Under `hvdd run -H a:2,b:2`: Horovod's rank layout across two nodes,
    then every collective and DistributedOptimizer through both daemons."""
    hvd.init()
    env = os.environ
    assert hvd.size() == int(env["HOROVOD_SIZE"]) == 4 and hvd.rank() == int(env["HOROVOD_RANK"])
    assert hvd.local_size() == int(env["HOROVOD_LOCAL_SIZE"]) == 2
    assert hvd.local_rank() == int(env["HOROVOD_LOCAL_RANK"]) == hvd.rank() % 2
    assert hvd.cross_size() == 2 and hvd.cross_rank() == hvd.rank() // 2 == int(env["HOROVOD_CROSS_RANK"])
    assert hvd.is_homogeneous() is True
    # Adasum across nodes: equal vectors come back unchanged (test_adasum_across_nodes checks the numbers).
    expect_equal(hvd.allreduce(torch.ones(4), op=hvd.Adasum, name="adasum.nodes"), torch.ones(4), "Adasum across nodes")
    allreduce_ops()
    other_ops()
    optimizer()


def timeline() -> None:
    """Runs under `hvdd run --timeline-filename`: the ops before
    start_timeline go to that file, the ones between start_timeline(argv[2])
    and stop_timeline to argv[2] (test_timeline.py reads both)."""
    hvd.init()
    n = hvd.size()
    hvd.allreduce(torch.ones(4), name="launch.grad")
    hvd.broadcast(torch.full((2,), float(hvd.rank())), root_rank=1, name="launch.bcast")
    hvd.start_timeline(sys.argv[2], mark_cycles=True)
    # Only rank 0's call acts, and it is no collective: the barrier keeps the
    # other ranks' next ops out of the launch file.
    hvd.barrier()
    got = hvd.allreduce(torch.ones(4), name="dyn.grad", op=hvd.Sum)
    expect_equal(got, torch.full((4,), float(n)), "allreduce under the timeline")
    got = hvd.allgather(torch.full((1,), float(hvd.rank())), name="dyn.gather")
    expect_equal(got, torch.arange(n, dtype=torch.float32), "allgather under the timeline")
    hvd.stop_timeline()
    hvd.stop_timeline()  # stopping a stopped timeline is no error
    hvd.barrier()  # as above, for rank 0's stop
    hvd.allreduce(torch.ones(1), name="after.stop")


SCENARIOS = {
    f.__name__: f
    for f in (
        basics,
        allreduce_ops,
        other_ops,
        errors,
        enqueue_errors,
        grads,
        sparse_optimizer,
        horovod_tests,
        victim,
        optimizer,
        sync_bn,
        process_sets,
        elastic,
        across_nodes,
        adasum,
        timeline,
    )
}

if __name__ == "__main__":
    SCENARIOS[sys.argv[1]]()
    sys.stdout.write("OK\n")
