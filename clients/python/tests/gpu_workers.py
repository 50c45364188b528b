"""Worker scenarios of the GPU path without a GPU (``python gpu_workers.py
NAME``): tensors in the fake device memory of tests/fake_cuda.py, handed to a
daemon running the fake CUDA driver (``HVDD_GPU_DRIVER=fake``) as
DeviceBuffers. Each checks its results element by element against
references computed from every rank's inputs, and exits non-zero on the
first failure.

Staging is counted: ``hvdd.ops.submit_allreduce`` and ``submit_broadcast``
(the host-memory path) are wrapped, so a scenario can assert that its device
ops never went through host memory, or that its refused ones did.
"""

from __future__ import annotations

import gc
import os
import sys
import threading
import time
import warnings

import torch

import hvdd.torch as hvd
from hvdd import _cuda
from hvdd import basics as _basics
from hvdd import ops as _ops

from fake_cuda import FakeDevice
from workers import DTYPES, data, expect_equal, reference_reduce, tol_for

staged = {"n": 0}


def _count(f):
    def wrapped(*a, **kw):
        staged["n"] += 1
        return f(*a, **kw)

    return wrapped


_ops.submit_allreduce = _count(_ops.submit_allreduce)
_ops.submit_broadcast = _count(_ops.submit_broadcast)
_ops.submit_output = _count(_ops.submit_output)


def _device(uuid: str = "") -> tuple[FakeDevice, _cuda.DeviceSession]:
    """The fake GPU: the daemon's first (or uuid), installed."""
    c = _basics.client()
    uuids = sorted(c.gpu_uuids())
    if not uuid:
        assert uuids, "the daemon lists no GPUs: is it running with HVDD_GPU_DRIVER=fake?"
        # HVDD_FAKE_GPU_PER_RANK=1: rank r's tensors on the daemon's GPU r
        # (mod their number), so that the daemon reduces across GPUs.
        per_rank = os.environ.get("HVDD_FAKE_GPU_PER_RANK") == "1"
        uuid = uuids[_basics.rank() % len(uuids)] if per_rank else uuids[0]
    dev = FakeDevice(uuid)
    _cuda.install_exporter(dev)
    return dev, _cuda.session(c, dev)


def ipc_collectives() -> None:
    """allreduce (every dtype and op, pre/postscale), in place and out of
    place, sync and async; grouped allreduce; broadcast from each root; all
    through CUDA IPC (nothing staged), each storage exported once."""
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    dev, s = _device()
    with warnings.catch_warnings():
        warnings.simplefilter("error", _cuda.HvddStagingWarning)
        for dt in DTYPES:
            for op in (hvd.Sum, hvd.Average, hvd.Min, hvd.Max, hvd.Product):
                if dt is torch.bool and op == hvd.Average:
                    continue
                ins = [data(k, dt, seed=op) for k in range(n)]
                want = reference_reduce(ins, op, n)
                what = f"ipc allreduce {dt} op={op}"
                x = dev.tensor(ins[r])
                got = hvd.allreduce(x, op=op, name=f"ar.{dt}.{op}")
                assert dev.claims(got), what + ": the result is not device memory"
                expect_equal(got, want, what, tol_for(dt))
                expect_equal(x, ins[r], what + " (input untouched)")
                y = dev.tensor(ins[r])
                assert hvd.allreduce_(y, op=op) is y
                expect_equal(y, want, what + " in place", tol_for(dt))
                z = dev.tensor(ins[r])
                h1 = hvd.allreduce_async(z, op=op, name=f"a1.{dt}.{op}")
                h2 = hvd.allreduce_async_(z, op=op, name=f"a2.{dt}.{op}")
                expect_equal(hvd.synchronize(h1), want, what + " async", tol_for(dt))
                hvd.synchronize(h2)
                expect_equal(z, want, what + " async_", tol_for(dt))
        for dt in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
            ins = [data(k, dt, seed=11) for k in range(n)]
            for op, pre, post in ((hvd.Sum, 0.5, 3.0), (hvd.Average, 2.0, 1.0), (hvd.Average, 1.0, 0.25)):
                x = dev.tensor(ins[r])
                hvd.allreduce_(x, op=op, prescale_factor=pre, postscale_factor=post)
                want = reference_reduce(ins, op, n, pre, post)
                expect_equal(x, want, f"ipc allreduce {dt} op={op} pre={pre} post={post}", tol_for(dt) or 0)
        # grouped, in place and not, tensors of several dtypes and sizes
        shapes = [(5,), (3, 4), (1000,), (2, 2, 2)]
        ins = [[data(k, torch.float32, sh, seed=i) for i, sh in enumerate(shapes)] for k in range(n)]
        xs = [dev.tensor(t) for t in ins[r]]
        outs = hvd.grouped_allreduce(xs, op=hvd.Sum, name="grouped")
        for i in range(len(shapes)):
            want = reference_reduce([ins[k][i] for k in range(n)], hvd.Sum, n)
            expect_equal(outs[i], want, f"grouped[{i}]", 1e-5)
            expect_equal(xs[i], ins[r][i], f"grouped[{i}] input untouched")
        hvd.grouped_allreduce_(xs, op=hvd.Average)
        for i in range(len(shapes)):
            want = reference_reduce([ins[k][i] for k in range(n)], hvd.Average, n)
            expect_equal(xs[i], want, f"grouped_[{i}]", 1e-5)
        # broadcast from every root, in place and not
        for root in range(n):
            for dt in DTYPES:
                ins = [data(k, dt, seed=20 + root) for k in range(n)]
                x = dev.tensor(ins[r])
                got = hvd.broadcast(x, root, name=f"bc.{root}.{dt}")
                expect_equal(got, ins[root], f"broadcast root={root} {dt}")
                expect_equal(x, ins[r], f"broadcast root={root} {dt} input untouched")
                hvd.broadcast_(x, root)
                expect_equal(x, ins[root], f"broadcast_ root={root} {dt}")
        # A storage is exported once: ops on the same memory again export nothing.
        x = dev.tensor(torch.arange(64, dtype=torch.float32) + r)
        hvd.allreduce_(x, op=hvd.Sum, name="cache.1")
        before = s.exports
        for i in range(5):
            hvd.allreduce_(x, op=hvd.Sum, name=f"cache.{i + 2}")
        assert s.exports == before, f"re-exported: {before} -> {s.exports}"
        want = sum(torch.arange(64, dtype=torch.float32) + k for k in range(n)) * n**5
        expect_equal(x, want, "six allreduces in place")
        # Daemon-allocated outputs (allgather, alltoall, reducescatter) come
        # back as the daemon's device memory, copied into new device tensors.
        for dt in (torch.float32, torch.bfloat16, torch.int64, torch.uint8):
            ins = [data(k, dt, (k + 1, 3), seed=30) for k in range(n)]
            got = hvd.allgather(dev.tensor(ins[r]), name=f"ag.{dt}")
            assert dev.claims(got), "allgather: the result is not device memory"
            expect_equal(got, torch.cat(ins), f"allgather {dt}")
        ins = [data(k, torch.float32, (2 * n, 2), seed=40) for k in range(n)]
        got = hvd.alltoall(dev.tensor(ins[r]), name="a2a")
        expect_equal(got, torch.cat([ins[k][2 * r : 2 * r + 2] for k in range(n)]), "alltoall")
        splits = torch.tensor([k + 1 for k in range(n)], dtype=torch.int32)
        ins = [data(k, torch.float32, (n * (n + 1) // 2, 3), seed=41) for k in range(n)]
        got, rs = hvd.alltoall(dev.tensor(ins[r]), splits=splits, name="a2a.splits")
        starts = [sum(range(1, j + 1)) for j in range(n)]
        want = torch.cat([ins[k][starts[r] : starts[r] + r + 1] for k in range(n)])
        expect_equal(got, want, "alltoall with splits")
        assert rs.tolist() == [r + 1] * n, rs
        ins = [data(k, torch.float32, (2 * n + 1, 3), seed=42) for k in range(n)]
        got = hvd.reducescatter(dev.tensor(ins[r]), op=hvd.Sum, name="rs")
        total = reference_reduce(ins, hvd.Sum, n)
        lo = sum(3 if k == 0 else 2 for k in range(r))  # the first d0 % n ranks get one row more
        expect_equal(got, total[lo : lo + (3 if r == 0 else 2)], "reducescatter", 1e-5)
        assert dev.outputs_read == 7, f"{dev.outputs_read} device outputs read"
    assert staged["n"] == 0, f"{staged['n']} device ops were staged through host memory"
    print(f"exports {s.exports} released {len(s.released)}")
    hvd.shutdown()


def ipc_release() -> None:
    """A freed storage's allocation is released to the daemon
    (ReleaseDeviceMemory), the job goes on, and memory exported again after
    the release works."""
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    dev, s = _device()
    x = dev.tensor(torch.arange(8, dtype=torch.float64) * (r + 1), new_segment=True)
    seg = dev.segments[-1]
    hvd.allreduce_(x, op=hvd.Sum, name="rel.1")
    expect_equal(x, torch.arange(8, dtype=torch.float64) * sum(range(1, n + 1)), "before release")
    del x
    gc.collect()
    y = dev.tensor(torch.ones(4) * r, new_segment=True)
    hvd.allreduce_(y, op=hvd.Sum, name="rel.2")
    s.flush()  # what the releaser thread (torch >= 2) or the export's sweep started is done
    assert s.released == [seg.handle], s.released
    expect_equal(y, torch.ones(4) * sum(range(n)), "after release")
    # The released allocation again, through a new storage in it.
    z = torch.from_numpy(seg.bytes[:32].view("float64")).view(4)
    z.copy_(torch.full((4,), float(r)))
    hvd.allreduce_(z, op=hvd.Max, name="rel.3")
    expect_equal(z, torch.full((4,), float(n - 1), dtype=torch.float64), "the released allocation again")
    assert staged["n"] == 0
    hvd.shutdown()


def ipc_event_wait() -> None:
    """The daemon waits for the event recorded before the Enqueue: the
    tensor's data is written after the op is submitted (a producer stream
    still running), and the event completes only then, from another thread.
    A daemon that read without waiting would reduce zeros."""
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    dev, s = _device()
    dev.hold_events = True
    x = dev.empty((256,), torch.float32)
    x.zero_()
    h = hvd.allreduce_async_(x, op=hvd.Sum, name="held")
    vals = torch.arange(256, dtype=torch.float32) + 1000 * r

    def producer() -> None:
        time.sleep(0.2)  # the producer's "kernel" still runs
        x.copy_(vals)
        dev.complete()

    t = threading.Thread(target=producer)
    t.start()
    hvd.synchronize(h)
    t.join()
    want = sum(torch.arange(256, dtype=torch.float32) + 1000 * k for k in range(n))
    expect_equal(x, want, "reduced after the event completed")
    assert staged["n"] == 0
    hvd.shutdown()


def staging_fallbacks() -> None:
    """Device tensors the daemon cannot take are staged through host memory,
    with results as right as through IPC and one warning per reason:
    HVDD_FAKE_REASON picks it (cpu-only: the daemon has no GPUs; other-gpu;
    allocator; export)."""
    reason = os.environ["HVDD_FAKE_REASON"]
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    _cuda.reset_warnings()
    dev, s = _device("GPU-not-served" if reason in ("cpu-only", "other-gpu") else "")
    if reason == "allocator":
        dev.problem_text = _cuda.allocator_problem("native", {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"})
    if reason == "export":
        dev.refuse = "a tensor received from another process cannot be shared"
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        for i in range(3):
            ins = [data(k, torch.float32, seed=i) for k in range(n)]
            x = dev.tensor(ins[r])
            hvd.allreduce_(x, op=hvd.Sum, name=f"st.{i}")
            expect_equal(x, reference_reduce(ins, hvd.Sum, n), f"staged allreduce {i}", 1e-5)
            got = hvd.broadcast(x, 0, name=f"stb.{i}")
            expect_equal(got, reference_reduce(ins, hvd.Sum, n), f"staged broadcast {i}", 1e-5)
    msgs = [str(x.message) for x in w if issubclass(x.category, _cuda.HvddStagingWarning)]
    assert len(msgs) == 1, msgs
    print("WARNING:", msgs[0])
    assert staged["n"] == 6, staged
    assert s.exports == 0
    hvd.shutdown()


def mixed() -> None:
    """Device and host tensors in one job: a tensor device memory on some
    ranks and host memory on others (the same name), a group of both, and
    device and host ops in flight together."""
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    dev, s = _device()
    with warnings.catch_warnings():
        warnings.simplefilter("error", _cuda.HvddStagingWarning)
        for dt in (torch.float32, torch.int64, torch.bfloat16):
            ins = [data(k, dt, (4, 5), seed=50) for k in range(n)]
            x = dev.tensor(ins[r]) if r % 2 == 0 else ins[r].clone()
            hvd.allreduce_(x, op=hvd.Sum, name=f"where.{dt}")
            expect_equal(x, reference_reduce(ins, hvd.Sum, n), f"device on even ranks, host on odd {dt}", tol_for(dt))
        a = [data(k, torch.float32, (6,), seed=51) for k in range(n)]
        b = [data(k, torch.float32, (7,), seed=52) for k in range(n)]
        outs = hvd.grouped_allreduce([dev.tensor(a[r]), b[r].clone()], op=hvd.Sum, name="group.mixed")
        expect_equal(outs[0], reference_reduce(a, hvd.Sum, n), "group: device member", 1e-5)
        expect_equal(outs[1], reference_reduce(b, hvd.Sum, n), "group: host member", 1e-5)
        hs = []
        ins = [[data(k, torch.float32, (3,), seed=60 + i) for k in range(n)] for i in range(8)]
        xs = [dev.tensor(ins[i][r]) if i % 2 else ins[i][r].clone() for i in range(8)]
        for i, x in enumerate(xs):
            hs.append(hvd.allreduce_async_(x, op=hvd.Sum, name=f"inflight.{i}"))
        for h in hs:
            hvd.synchronize(h)
        for i, x in enumerate(xs):
            expect_equal(x, reference_reduce(ins[i], hvd.Sum, n), f"in flight together {i}", 1e-5)
    assert s.exports > 0
    hvd.shutdown()


def pg_collectives() -> None:
    """torch.distributed on backend hvdd with tensors in device memory: the
    collectives that DDP and FSDP2 run (all_reduce with every reduction the
    daemon has, in place; reduce; broadcast from each root;
    all_gather_into_tensor; reduce_scatter_tensor), on a group of every rank
    and on a subgroup, go through CUDA IPC, nothing staged through host
    memory, with the results of references computed here from every rank's
    inputs. Then the reductions the daemon lacks (bitwise), which go through
    host memory, still right."""
    import torch.distributed as dist

    import hvdd.torch.distributed  # noqa: F401 (registers the backend)

    R = dist.ReduceOp
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    dev, _ = _device()
    dist.init_process_group("hvdd", init_method=f"file://{os.getcwd()}/pg-store", rank=r, world_size=n)
    sub = dist.new_group([0, 1])
    ops = {R.SUM: hvd.Sum, R.AVG: hvd.Average, R.MIN: hvd.Min, R.MAX: hvd.Max, R.PRODUCT: hvd.Product}
    with warnings.catch_warnings():
        warnings.simplefilter("error", _cuda.HvddStagingWarning)
        for group, ranks in ((None, list(range(n))), (sub, [0, 1])):
            if r not in ranks:
                continue
            m, me = len(ranks), ranks.index(r)
            for dt in (torch.float32, torch.bfloat16, torch.int32, torch.int64):
                for rop, hop in ops.items():
                    if rop == R.AVG and not dt.is_floating_point:
                        continue
                    ins = [data(k, dt, seed=int(hop)) for k in ranks]
                    what = f"all_reduce {dt} {rop} ranks {ranks}"
                    x = dev.tensor(ins[me])
                    dist.all_reduce(x, op=rop, group=group)
                    expect_equal(x, reference_reduce(ins, hop, m), what, tol_for(dt))
                    y = dev.tensor(ins[me])
                    dist.all_reduce(y, op=rop, group=group, async_op=True).wait()
                    expect_equal(y, reference_reduce(ins, hop, m), what + " async", tol_for(dt))
            ins = [data(k, torch.float32, seed=7) for k in ranks]
            x = dev.tensor(ins[me])
            dist.all_reduce(x, op=dist._make_nccl_premul_sum(0.5), group=group)
            expect_equal(x, reference_reduce(ins, hvd.Sum, m, 0.5), f"all_reduce PREMUL_SUM(0.5) ranks {ranks}", 1e-5)
            for root in ranks:
                x = dev.tensor(ins[me])
                dist.reduce(x, dst=root, group=group)
                want = reference_reduce(ins, hvd.Sum, m) if r == root else ins[me]
                expect_equal(x, want, f"reduce to {root} ranks {ranks}", 1e-5)
                x = dev.tensor(ins[me])
                dist.broadcast(x, src=root, group=group)
                expect_equal(x, ins[ranks.index(root)], f"broadcast from {root} ranks {ranks}")
            for dt in (torch.float32, torch.bfloat16, torch.uint8):
                ins = [data(k, dt, (2, 3), seed=30) for k in ranks]
                out = dev.empty((2 * m, 3), dt)
                dist.all_gather_into_tensor(out, dev.tensor(ins[me]), group=group)
                expect_equal(out, torch.cat(ins), f"all_gather_into_tensor {dt} ranks {ranks}")
            for rop, hop, pre in ((R.SUM, hvd.Sum, 1.0), (R.AVG, hvd.Average, 1.0)):
                ins = [data(k, torch.float32, (m * 4,), seed=40) for k in ranks]
                out = dev.empty((4,), torch.float32)
                dist.reduce_scatter_tensor(out, dev.tensor(ins[me]), op=rop, group=group)
                want = reference_reduce(ins, hop, m, pre)[me * 4 : me * 4 + 4]
                expect_equal(out, want, f"reduce_scatter_tensor {rop} ranks {ranks}", 1e-5)
        device_ops = staged["n"]
        assert device_ops == 0, f"{device_ops} device collectives were staged through host memory"
        # Bitwise reductions the daemon lacks: through host memory, right.
        ins = [data(k, torch.int32, seed=50) for k in range(n)]
        x = dev.tensor(ins[r])
        dist.all_reduce(x, op=R.BOR)
        want = ins[0].clone()
        for t in ins[1:]:
            want |= t
        expect_equal(x, want, "all_reduce BOR")
    dist.destroy_process_group()
    hvd.shutdown()


SCENARIOS = {
    f.__name__: f for f in (ipc_collectives, ipc_release, ipc_event_wait, staging_fallbacks, mixed, pg_collectives)
}

if __name__ == "__main__":
    SCENARIOS[sys.argv[1]]()
    sys.stdout.write("OK\n")
