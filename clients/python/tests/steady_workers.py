"""Worker scenarios of the GPU path's steady state without a GPU (``python
steady_workers.py NAME``), on tests/fake_cuda.py's fake device memory and a
daemon running the fake CUDA driver (``HVDD_GPU_DRIVER=fake``), as
gpu_workers.py's (whose helpers and staging counters these use).

After a warm-up, a training loop's ops cost nothing but the work: no
allocation of the pools, no export, no ReleaseDeviceMemory, no device
output mapped or unmapped per op, while every result stays right.
"""

from __future__ import annotations

import gc
import os
import sys
import time
import warnings
from typing import Any, Dict, List

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


# ------------------------------------------------------- per-op work, counted
#
# What the real exporter (hvdd/torch/_cuda_export.py) calls in libcuda for
# each exporter call the fake device gets (cudaMalloc'd memory comes from
# torch's caching allocator: no driver call in a steady state, so tensors
# made are not counted; a new pool is).
LIBCUDA = {
    "record_event": ("cuEventRecord",),
    "export": ("cuIpcGetMemHandle", "cuMemGetAddressRange"),
    "open_output": ("cuIpcOpenMemHandle",),
    "copy_output": ("cuMemcpyDtoDAsync", "cuStreamSynchronize"),
    "close_output": ("cuIpcCloseMemHandle",),
    "copy": ("cuMemcpyDtoDAsync",),
    "copy_out": ("cuMemcpyDtoDAsync",),
    "new_pool": ("cuMemAlloc",),
}


def _count_libcuda(dev) -> Dict[str, int]:
    """Wraps dev's exporter methods to count the libcuda calls they stand
    for (LIBCUDA); returns the counts, by call."""
    counts: Dict[str, int] = {}
    for meth, calls in LIBCUDA.items():
        f = getattr(dev, meth, None)
        if f is None:
            continue

        def wrapped(*a, _f=f, _calls=calls, **kw):
            for c in _calls:
                counts[c] = counts.get(c, 0) + 1
            return _f(*a, **kw)

        setattr(dev, meth, wrapped)
    return counts


def _hvdd_only(snap) -> Any:
    """A tracemalloc snapshot's allocations by hvdd's own code (its files
    only: not torch's, numpy's or the fake device's)."""
    import tracemalloc

    pkg = os.path.dirname(os.path.dirname(os.path.abspath(hvd.__file__)))  # hvd is .../hvdd/torch
    return snap.filter_traces([tracemalloc.Filter(True, pkg + os.sep + "*")])


def counted() -> None:
    """The per-op Python work of the device path (issue 33 item 5, GPU-PATH
    D10), on the fake GPU: for each kind of op, after HVDD_COUNT_WARM (50)
    ops, HVDD_COUNT_OPS (300) ops and then twice as many, counting the
    libcuda calls they stand for (LIBCUDA), the Python calls (functions and
    builtins, sys.setprofile) of the submit (the ``*_async`` call), and
    with tracemalloc the bytes hvdd's code keeps live and each op's peak.
    Per op, the counts must not grow with the number of ops (flat), and
    hvdd keeps nothing per op. Prints one ``counts`` line per kind."""
    import json
    import tracemalloc

    hvd.init()
    r, n = hvd.rank(), hvd.size()
    dev, s = _device()
    libcuda = _count_libcuda(dev)
    ops = int(os.environ.get("HVDD_COUNT_OPS", "300"))
    warm = int(os.environ.get("HVDD_COUNT_WARM", "50"))
    f32 = torch.float32
    a = dev.tensor(_values(r, 0, (1024,), f32))  # 4 KiB, GPU-PATH's small op
    x = dev.tensor(_values(r, 0, (1024,), f32))
    ag = dev.tensor(_values(r, 0, (r + 1, 256), f32))
    bc = dev.tensor(_values(r, 0, (1024,), f32))
    kinds = {
        "allreduce_ (in place)": lambda: hvd.allreduce_async_(a, op=hvd.Sum, name="count.ar_"),
        "allreduce (out of place, a slot)": lambda: hvd.allreduce_async(x, op=hvd.Sum, name="count.ar"),
        "allgather (a device output)": lambda: hvd.allgather_async(ag, name="count.ag"),
        "broadcast (out of place, a slot)": lambda: hvd.broadcast_async(bc, 0, name="count.bc"),
    }
    calls = [0]

    def prof(frame, event, arg):
        if event == "call" or event == "c_call":
            calls[0] += 1

    def run(submit, k: int) -> Dict[str, float]:
        """k ops: libcuda calls, submit's Python calls, the median peak."""
        lib0 = sum(libcuda.values())
        calls[0] = 0
        peaks = []
        for _ in range(k):
            base = tracemalloc.get_traced_memory()[0]
            tracemalloc.reset_peak()
            sys.setprofile(prof)
            h = submit()
            sys.setprofile(None)
            hvd.synchronize(h)
            peaks.append(tracemalloc.get_traced_memory()[1] - base)
        peaks.sort()
        return {
            "libcuda": (sum(libcuda.values()) - lib0) / k,
            "python": calls[0] / k,
            "peak": float(peaks[len(peaks) // 2]),
        }

    failures: List[str] = []
    with warnings.catch_warnings():
        warnings.simplefilter("error", _cuda.HvddStagingWarning)
        for kind, submit in kinds.items():
            for _ in range(warm):
                hvd.synchronize(submit())
            before = dict(libcuda)
            tracemalloc.start()
            one = run(submit, ops)
            s.flush()
            gc.collect()  # what is kept, not garbage that a collection would free
            snap1 = _hvdd_only(tracemalloc.take_snapshot())
            two = run(submit, 2 * ops)
            s.flush()
            gc.collect()
            snap2 = _hvdd_only(tracemalloc.take_snapshot())
            tracemalloc.stop()
            live1 = sum(st.size for st in snap1.statistics("filename"))
            live2 = sum(st.size for st in snap2.statistics("filename"))
            blocks = sum(st.count for st in snap2.statistics("filename")) - sum(
                st.count for st in snap1.statistics("filename")
            )
            if os.environ.get("HVDD_COUNT_DEBUG"):
                seen: List[str] = []

                def trace(frame, event, arg):
                    if event == "call":
                        seen.append(f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_code.co_name}")
                    elif event == "c_call":
                        seen.append(f"  c {getattr(arg, '__qualname__', arg)}")

                sys.setprofile(trace)
                h = submit()
                sys.setprofile(None)
                hvd.synchronize(h)
                print(f"rank {r}: {kind}: one submit's calls: {seen}", flush=True)
                for st in snap2.compare_to(snap1, "lineno")[:5]:
                    print(f"rank {r}: {kind}: {st}", flush=True)
            per_op = {c: (libcuda.get(c, 0) - before.get(c, 0)) / (3 * ops) for c in libcuda}
            per_op = {c: v for c, v in per_op.items() if v}
            fig = {
                "kind": kind,
                "libcuda per op": one["libcuda"],
                "libcuda by call": per_op,
                "python calls per submit": round(two["python"], 1),
                "peak bytes per op": two["peak"],
                f"hvdd blocks (bytes) kept over {2 * ops} more ops": f"{blocks} ({live2 - live1})",
            }
            print(f"rank {r}: counts {json.dumps(fig)}", flush=True)
            if one["libcuda"] != two["libcuda"]:
                failures.append(
                    f"{kind}: libcuda calls per op {one['libcuda']} over {ops}, {two['libcuda']} over {2 * ops}"
                )
            if two["python"] > one["python"] * 1.05 + 2:
                failures.append(
                    f"{kind}: Python calls per submit {one['python']} over {ops}, {two['python']} over {2 * ops}"
                )
            # An object kept per op is a block per op; CPython's free lists
            # keep a bounded few (tens) live where they were allocated.
            if blocks >= 2 * ops // 4:
                failures.append(
                    f"{kind}: hvdd kept {blocks} blocks ({live2 - live1} bytes) more over {2 * ops} more ops"
                )
    assert not failures, f"rank {r}: per-op work grows with the ops: " + "; ".join(failures)
    assert staged["n"] == 0, f"{staged['n']} device ops were staged through host memory"
    hvd.shutdown()


def _host_syncs() -> float:
    """The daemon's hvdd_gpu_host_syncs_total (HVDD_TEST_METRICS: its
    /metrics URL)."""
    import re
    import urllib.request

    body = urllib.request.urlopen(os.environ["HVDD_TEST_METRICS"], timeout=10).read().decode()
    m = re.search(r"^hvdd_gpu_host_syncs_total (\S+)$", body, re.M)
    assert m, "the daemon has no hvdd_gpu_host_syncs_total"
    return float(m.group(1))


def completion() -> None:
    """Issue 33 item 4: HVDD_TEST_OPS (200) iterations, after 20 of warm-up,
    of allreduce_ in place, allreduce out of place (through the pool's
    slot) and broadcast_ in place, each result checked at once, on a daemon
    whose fake GPU runs its work late (HVDD_FAKE_GPU_DELAY): a result read
    before the daemon's work ran is stale. With HVDD_TEST_ORDERED=1 (the
    daemon run with --gpu-completion stream) every op must have come back
    ordered on the GPU (its Done named the daemon's event, which this
    rank's "stream" waited on) and the daemon's host must not have waited
    for the GPU once over the measured ops (hvdd_gpu_host_syncs_total
    flat); else no op comes back so and the host waits once per response at
    least."""
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    dev, s = _device()
    ordered = os.environ.get("HVDD_TEST_ORDERED") == "1"
    ops = int(os.environ.get("HVDD_TEST_OPS", "200"))
    warm = 20
    f32 = torch.float32
    a = dev.empty((1000,), f32)
    x = dev.empty((300,), f32)
    bc = dev.empty((77,), torch.int32)
    syncs0 = ordered0 = waits0 = 0.0
    for i in range(warm + ops):
        if i == warm:
            hvd.barrier()  # every rank's warm-up done before the count starts
            syncs0, ordered0, waits0 = _host_syncs(), s.ordered, dev.event_waits
        a.copy_(_values(r, i, (1000,), f32))
        assert hvd.allreduce_(a, op=hvd.Sum, name="completion.ar_") is a
        expect_equal(a, _sum(i, (1000,), f32, n), f"op {i}: allreduce_")
        x.copy_(_values(r, i, (300,), f32))
        got = hvd.allreduce(x, op=hvd.Sum, name="completion.ar")
        expect_equal(got, _sum(i, (300,), f32, n), f"op {i}: allreduce")
        bc.copy_(_values(r, i, (77,), torch.int32))
        assert hvd.broadcast_(bc, root_rank=1, name="completion.bc") is bc
        expect_equal(bc, _values(1, i, (77,), torch.int32), f"op {i}: broadcast_")
    hvd.barrier()  # every rank's ops answered (the daemon's count settled)
    syncs = _host_syncs() - syncs0
    got_ordered, waits = s.ordered - ordered0, dev.event_waits - waits0
    print(f"rank {r}: {3 * ops} ops: ordered {got_ordered}, event waits {waits}, daemon host syncs {syncs:.0f}")
    if ordered:
        assert got_ordered == 3 * ops and waits == 3 * ops, (got_ordered, waits)
        assert syncs == 0, f"the daemon waited for the GPU {syncs:.0f} times over {3 * ops} ops completed on the GPU"
    else:
        assert got_ordered == 0 and waits == 0, (got_ordered, waits)
        assert syncs >= 3 * ops, f"host-synchronised completion: {syncs:.0f} host syncs over {3 * ops} ops"
    hvd.shutdown()


SCENARIOS = {f.__name__: f for f in (steady, burst, counted, completion)}

if __name__ == "__main__":
    SCENARIOS[sys.argv[1]]()
    sys.stdout.write("OK\n")
