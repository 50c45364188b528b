"""Worker scenarios of the real GPU path (``python cuda_workers.py NAME``):
torch CUDA tensors on cuda:0 (every local rank on the one GPU, as
scripts/gpu-check.sh runs them), handed to a daemon that serves the GPU
through CUDA IPC. Results are checked element by element against references
computed from every rank's inputs; staging through host memory is counted
(``hvdd.ops.submit_allreduce`` and ``submit_broadcast`` wrapped) so that
the IPC scenarios can assert it never happened.
"""

from __future__ import annotations

import os
import sys
import warnings

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import hvdd.torch as hvd  # noqa: E402
from hvdd import _cuda  # noqa: E402
from hvdd import basics as _basics  # noqa: E402
from hvdd import ops as _ops  # noqa: E402
from workers import _batch, _model, data, expect_equal, reference_reduce, tol_for  # noqa: E402

staged = {"n": 0}


def _count(f):
    def wrapped(*a, **kw):
        staged["n"] += 1
        return f(*a, **kw)

    return wrapped


_ops.submit_allreduce = _count(_ops.submit_allreduce)
_ops.submit_broadcast = _count(_ops.submit_broadcast)
_ops.submit_output = _count(_ops.submit_output)

DEV = torch.device("cuda", int(os.environ.get("HVDD_TEST_CUDA_DEVICE", "0")))
FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
DTYPES = FLOATS + (torch.int32, torch.int64, torch.uint8)


def _init() -> tuple[int, int]:
    hvd.init()
    torch.cuda.set_device(DEV)
    uuid = _cuda.format_uuid(torch.cuda.get_device_properties(DEV).uuid)
    served = sorted(_basics.client().gpu_uuids())
    print(f"rank {hvd.rank()}: {DEV} {uuid}; the daemon serves {served}")
    return hvd.rank(), hvd.size()


def _check_served() -> None:
    uuid = _cuda.format_uuid(torch.cuda.get_device_properties(DEV).uuid)
    served = _basics.client().gpu_uuids()
    assert uuid in served, f"the daemon does not serve {uuid} (it serves {sorted(served)}): see `hvdd gpus`"


def _cpu(t: torch.Tensor) -> torch.Tensor:
    return t.detach().cpu()


def collectives() -> None:
    """The checks of :func:`collectives_body` in a job of their own."""
    r, n = _init()
    collectives_body(r, n)
    hvd.shutdown()


def collectives_body(r: int, n: int) -> None:
    """allreduce (Sum, Average; pre/postscale; fp16, bf16, fp32, fp64, ints)
    in place and not, grouped allreduce, broadcast from every root,
    allgather, alltoall and reducescatter (device outputs), a large
    tensor, and a tensor written by a kernel still queued on the stream: all
    through CUDA IPC, nothing staged, each storage exported once."""
    _check_served()
    staged["n"] = 0
    with warnings.catch_warnings():
        warnings.simplefilter("error", _cuda.HvddStagingWarning)
        for dt in DTYPES:
            for op in (hvd.Sum, hvd.Average):
                ins = [data(k, dt, seed=op) for k in range(n)]
                want = reference_reduce(ins, op, n)
                what = f"cuda allreduce {dt} op={op}"
                x = ins[r].to(DEV)
                got = hvd.allreduce(x, op=op, name=f"ar.{dt}.{op}")
                assert got.is_cuda, what
                expect_equal(_cpu(got), want, what, tol_for(dt))
                expect_equal(_cpu(x), ins[r], what + " (input untouched)")
                assert hvd.allreduce_(x, op=op) is x
                expect_equal(_cpu(x), want, what + " in place", tol_for(dt))
                if dt in FLOATS:
                    for pre, post in ((0.5, 3.0), (2.0, 0.25)):
                        y = ins[r].to(DEV)
                        hvd.allreduce_(y, op=op, prescale_factor=pre, postscale_factor=post)
                        want2 = reference_reduce(ins, op, n, pre, post)
                        expect_equal(_cpu(y), want2, what + f" pre={pre} post={post}", tol_for(dt))
        shapes = [(5,), (3, 4), (1000,), (2, 2, 2)]
        ins = [[data(k, torch.float32, sh, seed=i) for i, sh in enumerate(shapes)] for k in range(n)]
        xs = [t.to(DEV) for t in ins[r]]
        outs = hvd.grouped_allreduce(xs, op=hvd.Sum, name="grouped")
        for i in range(len(shapes)):
            want = reference_reduce([ins[k][i] for k in range(n)], hvd.Sum, n)
            expect_equal(_cpu(outs[i]), want, f"grouped[{i}]", 1e-5)
        hvd.grouped_allreduce_(xs, op=hvd.Average)
        for i in range(len(shapes)):
            want = reference_reduce([ins[k][i] for k in range(n)], hvd.Average, n)
            expect_equal(_cpu(xs[i]), want, f"grouped_[{i}]", 1e-5)
        for root in range(n):
            for dt in (torch.float32, torch.bfloat16, torch.int64, torch.uint8):
                ins = [data(k, dt, seed=20 + root) for k in range(n)]
                x = ins[r].to(DEV)
                expect_equal(_cpu(hvd.broadcast(x, root, name=f"bc.{root}.{dt}")), ins[root], f"broadcast {root}")
                hvd.broadcast_(x, root)
                expect_equal(_cpu(x), ins[root], f"broadcast_ {root} {dt}")
        # Daemon-allocated outputs, read from the daemon's device memory.
        for dt in (torch.float32, torch.float16, torch.int64):
            ins = [data(k, dt, (k + 1, 3), seed=30) for k in range(n)]
            got = hvd.allgather(ins[r].to(DEV), name=f"ag.{dt}")
            assert got.is_cuda
            expect_equal(_cpu(got), torch.cat(ins), f"allgather {dt}")
        ins = [data(k, torch.float32, (2 * n, 2), seed=40) for k in range(n)]
        got = hvd.alltoall(ins[r].to(DEV), name="a2a")
        expect_equal(_cpu(got), torch.cat([ins[k][2 * r : 2 * r + 2] for k in range(n)]), "alltoall")
        ins = [data(k, torch.float32, (2 * n + 1, 3), seed=42) for k in range(n)]
        got = hvd.reducescatter(ins[r].to(DEV), op=hvd.Sum, name="rs")
        lo = sum(3 if k == 0 else 2 for k in range(r))
        want = reference_reduce(ins, hvd.Sum, n)[lo : lo + (3 if r == 0 else 2)]
        expect_equal(_cpu(got), want, "reducescatter", 1e-5)
        # 64 MiB, and data a queued kernel writes: the IPC event orders the
        # daemon after it with no synchronisation here.
        big = torch.full((16 << 20,), float(r + 1), device=DEV)
        big.mul_(3.0)
        hvd.allreduce_(big, op=hvd.Sum, name="big")
        want = 3.0 * sum(range(1, n + 1))
        assert bool((big == want).all()), f"big: {big[:4]} want {want}"
        s = _cuda.session(_basics.client(), _cuda.exporter_for(big))
        before = s.exports
        for i in range(5):
            big.fill_(1.0)
            hvd.allreduce_(big, op=hvd.Sum, name=f"again.{i}")
            assert bool((big == float(n)).all()), f"again {i}: {big[:4]}"
        assert s.exports == before, f"re-exported: {before} -> {s.exports}"
    assert staged["n"] == 0, f"{staged['n']} ops were staged through host memory"
    print(f"rank {r}: collectives OK through CUDA IPC (exports {s.exports}, released {len(s.released)})")


def optimizer() -> None:
    """The checks of :func:`optimizer_body` in a job of their own."""
    r, n = _init()
    optimizer_body(r, n)
    hvd.shutdown()


def optimizer_body(r: int, n: int) -> None:
    """DistributedOptimizer on a small model on the GPU: after a few steps the
    parameters equal those of one process training on every rank's
    batches."""
    _check_served()
    steps = 5

    def reference() -> list[torch.Tensor]:
        m = _model(1).to(DEV)
        opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
        for s in range(steps):
            opt.zero_grad()
            for k in range(n):
                x, y = _batch(k, s)
                (torch.nn.functional.mse_loss(m(x.to(DEV)), y.to(DEV)) / n).backward()
            opt.step()
        return [_cpu(p) for p in m.parameters()]

    with warnings.catch_warnings():
        warnings.simplefilter("error", _cuda.HvddStagingWarning)
        for compression, tol in ((hvd.Compression.none, 1e-5), (hvd.Compression.fp16, 1e-2)):
            m = _model(1 + r).to(DEV)
            opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
            opt = hvd.DistributedOptimizer(opt, named_parameters=m.named_parameters(), compression=compression)
            hvd.broadcast_parameters(m.state_dict(), root_rank=0)
            hvd.broadcast_optimizer_state(opt, root_rank=0)
            for s in range(steps):
                opt.zero_grad()
                x, y = _batch(r, s)
                torch.nn.functional.mse_loss(m(x.to(DEV)), y.to(DEV)).backward()
                opt.step()
            for got, w in zip(m.parameters(), reference()):
                expect_equal(_cpu(got), w, f"DistributedOptimizer {compression.__name__}", tol)
    print(f"rank {r}: DistributedOptimizer OK ({staged['n']} ops staged)")


def expandable() -> None:
    """Under PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True the tensors are
    staged through host memory, right, with one warning that says why."""
    assert "expandable_segments:True" in os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")
    r, n = _init()
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        for i in range(3):
            ins = [data(k, torch.float32, seed=i) for k in range(n)]
            x = ins[r].to(DEV)
            hvd.allreduce_(x, op=hvd.Sum, name=f"ex.{i}")
            expect_equal(_cpu(x), reference_reduce(ins, hvd.Sum, n), f"staged {i}", 1e-5)
    msgs = [str(x.message) for x in w if issubclass(x.category, _cuda.HvddStagingWarning)]
    assert len(msgs) == 1 and "expandable_segments" in msgs[0], msgs
    assert staged["n"] == 3, staged
    print("WARNING:", msgs[0])
    hvd.shutdown()


SCENARIOS = {f.__name__: f for f in (collectives, optimizer, expandable)}

if __name__ == "__main__":
    SCENARIOS[sys.argv[1]]()
    sys.stdout.write("OK\n")
