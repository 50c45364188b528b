"""The GPU path's steady state (issue 26, item 3): after a warm-up an op
costs nothing but the work. Out-of-place ops reduce in slots of a pool that
is exported once (hvdd._cuda.DeviceSession.slot, SlotAllocator), and the
daemon's device outputs, which come back in the buffers of its per
connection pool, stay mapped (DeviceSession.read_output).

The unit tests need no daemon; test_steady_state runs a job on fake GPUs
(the daemon's fake CUDA driver, tests/fake_cuda.py's memory) whose workers
are steady_workers.py's."""

from __future__ import annotations

import gc
import os
import random
import sys
import threading
from typing import Any, List, Optional, Tuple

import pytest
import torch

from hvdd import _cuda
from hvdd._proto import hvdd_pb2 as pb

from fake_cuda import SEGMENT, FakeDevice

HERE = os.path.dirname(os.path.abspath(__file__))
STEADY_WORKERS = os.path.join(HERE, "steady_workers.py")


# ------------------------------------------------------------ SlotAllocator


def test_slot_allocator_first_fit_aligned():
    a = _cuda.SlotAllocator(4096, align=256)
    assert a.alloc(1) == 0  # one alignment unit at least
    assert a.alloc(256) == 256
    assert a.alloc(257) == 512  # two units
    assert a.alloc(0) == 1024
    assert (a.busy, a.used) == (4, 1280)
    assert a.holes() == [(1280, 4096 - 1280)]
    a.free(256)
    assert a.holes() == [(256, 256), (1280, 2816)]
    assert a.alloc(300) == 1280  # first fit: the first hole is too small
    assert a.alloc(200) == 256  # which the next small one fits
    assert a.alloc(4096) is None
    with pytest.raises(ValueError):
        a.free(100)
    with pytest.raises(ValueError):
        _cuda.SlotAllocator(1000, align=256)


def test_slot_allocator_coalesces_in_every_order():
    for order in ([0, 1, 2], [2, 1, 0], [0, 2, 1], [1, 0, 2], [1, 2, 0], [2, 0, 1]):
        a = _cuda.SlotAllocator(3 * 256 + 512)
        offs = [a.alloc(256) for _ in range(3)]
        for i in order:
            a.free(offs[i])
        assert a.holes() == [(0, 3 * 256 + 512)], order
        assert (a.busy, a.used) == (0, 0)


def test_slot_allocator_random_against_a_model():
    """Random allocations and frees: slots never overlap, stay in bounds and
    aligned, the free space is exactly what no slot covers, and a pool whose
    every slot is freed is one hole again."""
    rnd = random.Random(7)
    size, align = 1 << 16, 256
    a = _cuda.SlotAllocator(size, align)
    live: dict = {}
    for step in range(5000):
        if live and (rnd.random() < 0.45 or len(live) > 40):
            off = rnd.choice(list(live))
            a.free(off)
            del live[off]
        else:
            n = rnd.choice([1, 4, 255, 256, 1000, 4096, 9000])
            off = a.alloc(n)
            need = max(align, -(-n // align) * align)
            if off is None:
                # first fit fails only when no hole is large enough
                assert all(ln < need for _, ln in a.holes()), step
                continue
            assert off % align == 0 and off + need <= size
            for o, ln in live.items():
                assert off + need <= o or o + ln <= off, (step, off, o)
            live[off] = need
        cover = sorted(list(live.items()) + a.holes())
        pos = 0
        for o, ln in cover:
            assert o == pos, (step, cover)
            pos += ln
        assert pos == size
        holes = a.holes()
        assert all(o1 + l1 < o2 for (o1, l1), (o2, _) in zip(holes, holes[1:])), holes  # none adjacent
        assert a.used == sum(live.values()) and a.busy == len(live)
    for off in list(live):
        a.free(off)
    assert a.holes() == [(0, size)]


# --------------------------------------------------------- the session's pool


class StubClient:
    """Stands in for hvdd._client.Client: the daemon's GPUs and the releases."""

    def __init__(self, uuids):
        self.uuids = frozenset(uuids)
        self.releases = []
        self.device_sessions = {}

    def gpu_uuids(self):
        return self.uuids

    def release_device_memory(self, handles):
        self.releases.append(list(handles))


class Owner:
    """Stands in for a Handle, to which a slot is lent."""


def _session(uuid: str = "GPU-fake-pool") -> Tuple[FakeDevice, _cuda.DeviceSession, StubClient]:
    dev = FakeDevice(uuid)
    c = StubClient([uuid])
    return dev, _cuda.session(c, dev), c


def test_pool_slots_are_views_exported_once():
    dev, s, c = _session()
    dts = (torch.float32, torch.bfloat16, torch.bool, torch.int64)
    xs = [dev.tensor((torch.arange(10) % 3).to(dt).view(2, 5)) for dt in dts]
    slots = [s.slot(x) for x in xs]
    assert s.pools_made == 1 and len(dev.segments) == 2  # the inputs', the pool's
    pool_seg = dev.segments[1]
    handles = set()
    for x, sl in zip(xs, slots):
        assert sl is not None and sl.stream == 0
        assert sl.view.dtype == x.dtype and sl.view.shape == x.shape and sl.view.is_contiguous()
        assert (sl.view.data_ptr() - pool_seg.base) % _cuda.POOL_ALIGN == 0
        sl.view.copy_(x)
        d = pb.DeviceBuffer.FromString(s.buffer(sl.view))
        handles.add(d.mem_handle)
        assert d.offset == sl.view.data_ptr() - pool_seg.base
        assert d.length == x.numel() * x.element_size()
        raw = x.view(torch.int16) if x.dtype is torch.bfloat16 else x
        assert bytes(pool_seg.bytes[d.offset : d.offset + d.length]) == raw.numpy().tobytes()
        r = sl.result()
        assert torch.equal(r, x) and r.dtype == x.dtype and dev.claims(r)
        assert r.data_ptr() != sl.view.data_ptr()
    assert handles == {pool_seg.handle}
    assert s.exports == 1  # the pool, once
    # Freed slots are taken back; the next ops reuse them: nothing new.
    for _ in range(50):
        sl = s.slot(xs[0])
        sl.view.copy_(xs[0])
        s.buffer(sl.view)
        sl.result()
    assert (s.exports, s.pools_made) == (1, 1)
    assert s.pool_stats() == {0: [(SEGMENT, 0, 0)]}
    assert c.releases == []


def test_pool_grows_and_drops_the_outgrown_once_free():
    dev, s, c = _session()
    s.pool_min = 4096
    x = dev.tensor(torch.zeros(256))  # 1 KiB
    held = [s.slot(x) for _ in range(4)]  # fills the 4 KiB pool
    first = dev.segments[-1]
    assert s.pools_made == 1
    for h in held:
        s.buffer(h.view)
    more = s.slot(x)  # the next grows: a pool twice the size
    assert s.pools_made == 2 and more.view.data_ptr() >= dev.segments[-1].base
    s.buffer(more.view)
    assert s.pool_stats() == {0: [(4096, 4, 4096), (8192, 1, 1024)]}
    for h in held[:3]:
        h.free()
    assert s.pool_stats() == {0: [(4096, 1, 1024), (8192, 1, 1024)]}
    held[3].free()
    held[3].free()  # once only
    assert s.pool_stats() == {0: [(8192, 1, 1024)]}  # the outgrown pool is gone
    del held, h
    gc.collect()
    s.flush()
    assert c.releases == [[first.handle]]  # and its memory released to the daemon
    # A tensor larger than the pool: a pool that fits it.
    big = dev.tensor(torch.zeros(5000))
    sl = s.slot(big)
    assert s.pool_stats()[0][-1][0] == 32768
    sl.free()
    more.free()
    assert s.pool_stats() == {0: [(32768, 0, 0)]}


def test_pool_bounds_and_streams():
    dev, s, _ = _session()
    s.pool_min, s.pool_max = 4096, 8192
    x = dev.tensor(torch.zeros(1024))  # 4 KiB
    assert s.slot(dev.tensor(torch.zeros(2049))) is None  # over pool_max: a copy of its own
    a, b, b2 = s.slot(x), s.slot(x), s.slot(x)  # the 4 KiB pool's, the 8 KiB one's two
    assert None not in (a, b, b2) and s.pools_made == 2
    assert s.slot(x) is None  # full at pool_max
    # Another stream has pools of its own.
    dev.stream = "side"
    c = s.slot(x)
    assert c is not None and c.stream == "side" and s.pools_made == 3
    assert sorted(s.pool_stats(), key=str) == [0, "side"]
    dev.stream = 0
    b.free()
    assert s.slot(x) is not None
    # Beyond pool_streams, the least recently used streams whose slots are
    # all free lose their pools.
    s.pool_streams = 2
    c.free()
    dev.stream = "third"
    s.slot(x).free()
    assert sorted(s.pool_stats(), key=str) == [0, "third"]


def test_slot_lent_to_a_handle_is_freed_when_it_goes():
    dev, s, _ = _session()
    x = dev.tensor(torch.ones(8))
    h = Owner()
    sl = s.slot(x)
    sl.lend(h)
    assert s.pool_stats()[0][0][1] == 1
    del h  # the op failed: its finish never ran
    gc.collect()
    assert s.pool_stats()[0][0][1] == 0
    sl.free()  # and once only
    h2 = Owner()
    sl = s.slot(x)
    sl.lend(h2)
    sl.result()
    del h2
    gc.collect()
    assert s.pool_stats()[0][0][1:] == (0, 0)


def test_pool_refused_falls_back():
    dev, s, _ = _session()
    x = dev.tensor(torch.ones(8))
    sl = s.slot(x)
    s.pool_refused()
    sl.free()
    assert s.slot(x) is None and s.pool_stats() == {}


def test_no_pool_without_the_exporter_s_stream():
    dev, s, _ = _session()
    dev.pool_key = lambda t: None  # type: ignore[method-assign]
    assert s.slot(dev.tensor(torch.ones(8))) is None and s.pools_made == 0


def test_slots_from_many_threads():
    dev, s, _ = _session()
    s.pool_min = 1 << 14
    xs = [dev.tensor(torch.arange(64, dtype=torch.float32) + i) for i in range(8)]
    errors: List[BaseException] = []

    def work(i: int) -> None:
        try:
            for _ in range(200):
                sl = s.slot(xs[i])
                sl.view.copy_(xs[i])
                assert torch.equal(sl.result(), xs[i])
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    ts = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errors, errors
    assert all(busy == 0 for pools in s.pool_stats().values() for _, busy, _ in pools)


# ------------------------------------------------------- device outputs' maps


class OutputExporter(_cuda.Exporter):
    """Maps "device outputs" that are bytes objects under their handles."""

    name = "outputs"

    def __init__(self) -> None:
        self.memory: dict = {}
        self.opened: List[bytes] = []
        self.closed: List[bytes] = []
        self.gate: Optional[threading.Event] = None

    def open_output(self, out: Any, mem_handle: bytes, alloc_size: int) -> Any:
        assert len(self.memory[mem_handle]) == alloc_size
        self.opened.append(mem_handle)
        return [mem_handle, True]

    def copy_output(self, out: Any, mapping: Any, offset: int, length: int) -> None:
        assert mapping[1], "copied from a closed mapping"
        if self.gate is not None:
            self.gate.wait(10)
        out[:length] = torch.frombuffer(bytearray(self.memory[mapping[0]][offset : offset + length]), dtype=torch.uint8)

    def close_output(self, mapping: Any) -> None:
        assert mapping[1], "closed twice"
        mapping[1] = False
        self.closed.append(mapping[0])


def _outputs(n: int, size: int = 64) -> Tuple[OutputExporter, _cuda.DeviceSession, List[bytes]]:
    ex = OutputExporter()
    hs = []
    for i in range(n):
        h = bytes([i % 256, i // 256]) + bytes(62)
        ex.memory[h] = bytes((i + j) % 256 for j in range(size))
        hs.append(h)
    return ex, _cuda.DeviceSession(StubClient([]), ex), hs


def test_outputs_stay_mapped():
    ex, s, hs = _outputs(3)
    out = torch.zeros(16, dtype=torch.uint8)
    for i in range(300):
        h = hs[i % 3]
        s.read_output(out, h, 64, 8, 16)
        assert bytes(out.numpy()) == ex.memory[h][8:24]
    assert ex.opened == hs and ex.closed == []
    assert (s.output_opens, s.output_closes, s.outputs_mapped()) == (3, 0, 3)
    s.close()
    assert sorted(ex.closed) == sorted(hs) and s.output_closes == 3 and s.outputs_mapped() == 0


def test_outputs_lru_bound_and_idle():
    ex, s, hs = _outputs(10)
    s.output_cache = 4
    out = torch.zeros(4, dtype=torch.uint8)
    for h in hs:
        s.read_output(out, h, 64, 0, 4)
    assert ex.closed == hs[:6] and s.outputs_mapped() == 4
    s.read_output(out, hs[6], 64, 0, 4)  # recently used: moves to the back
    s.read_output(out, hs[0], 64, 0, 4)  # opened again, the oldest (hs[7]) out
    assert ex.closed[-1] == hs[7] and s.output_opens == 11
    # One not used for over output_idle reads is closed, although the
    # cache has room.
    s.output_idle = 5
    for _ in range(6):
        s.read_output(out, hs[0], 64, 0, 4)
    assert s.outputs_mapped() == 1 and s.output_closes == s.output_opens - 1
    # Another size under the same handle: not the allocation mapped before.
    ex.memory[hs[0]] = bytes(128)
    s.read_output(out, hs[0], 128, 0, 4)
    assert ex.closed[-1] == hs[0] and s.output_opens == 12 and bytes(out.numpy()) == bytes(4)


def test_outputs_not_closed_while_copied():
    """A mapping evicted (or the session closed) while another thread copies
    from it is closed once that copy is done."""
    ex, s, hs = _outputs(2)
    s.output_cache = 1
    out1 = torch.zeros(4, dtype=torch.uint8)
    ex.gate = threading.Event()
    t = threading.Thread(target=s.read_output, args=(out1, hs[0], 64, 0, 4))
    t.start()
    while s.output_opens == 0:
        pass
    g, ex.gate = ex.gate, None
    out2 = torch.zeros(4, dtype=torch.uint8)
    s.read_output(out2, hs[1], 64, 0, 4)  # hs[0] is in use: not closed yet
    assert ex.closed == []
    g.set()
    t.join()
    s.read_output(out2, hs[1], 64, 0, 4)
    assert ex.closed == [hs[0]] and bytes(out1.numpy()) == ex.memory[hs[0]][:4]
    s.close()
    assert ex.closed == hs and s.output_closes == 2


def test_exporter_read_output_maps_once_per_read():
    """Exporter.read_output (no session): open, copy, close each time."""
    ex, _, hs = _outputs(1)
    out = torch.zeros(4, dtype=torch.uint8)
    ex.read_output(out, hs[0], 64, 4, 4)
    assert ex.opened == ex.closed == hs and bytes(out.numpy()) == ex.memory[hs[0]][4:8]


# ----------------------------------------------------------------- the job


@pytest.fixture
def fake_gpus(monkeypatch):
    """The daemons the test starts run the fake CUDA driver."""
    monkeypatch.setenv("HVDD_GPU_DRIVER", "fake")


def test_steady_state(job, fake_gpus):
    """1,000 ops of each kind (after 20 of warm-up) on 2 ranks: no pool
    made, no export, no release, no device output opened or closed per op,
    results right."""
    res = job.run("steady", np=2, timeout=300, cmd=[sys.executable, STEADY_WORKERS, "steady"])
    for o in res.outputs:
        assert o.rstrip().endswith("OK"), o
        print(o.strip().splitlines()[-2])


def test_outputs_beyond_the_daemon_s_pool(job, fake_gpus):
    """12 device outputs in flight at once, more than the daemon's pool
    keeps: the buffers it frees never come back, their mappings here go
    (LRU, idle), results stay right."""
    res = job.run("burst", np=2, timeout=300, cmd=[sys.executable, STEADY_WORKERS, "burst"])
    for o in res.outputs:
        assert o.rstrip().endswith("OK"), o
        print(o.strip().splitlines()[-2])


def test_per_op_work_is_flat(job, fake_gpus):
    """Issue 33 item 5: per steady-state device op (allreduce_ in place,
    allreduce and broadcast out of place, allgather), the libcuda calls it
    stands for, the Python calls of its submit and hvdd's allocations kept
    (tracemalloc) do not grow with the number of ops. The figures
    (docs/BENCHMARKS.md) are the ``counts`` lines printed."""
    res = job.run("counted", np=2, timeout=300, cmd=[sys.executable, STEADY_WORKERS, "counted"])
    for o in res.outputs:
        assert o.rstrip().endswith("OK"), o
        for line in o.splitlines():
            if line.startswith("rank "):
                print(line.strip())


def _free_port() -> int:
    import socket

    with socket.socket() as so:
        so.bind(("127.0.0.1", 0))
        return so.getsockname()[1]


@pytest.mark.parametrize("mode", ["stream", "host"])
def test_completion_ordered_on_the_gpu(job, fake_gpus, monkeypatch, mode):
    """Issue 33 item 4: with --gpu-completion stream the daemon answers one
    GPU's allreduce_, allreduce and broadcast_ once their work is enqueued,
    with its completion event, and the rank orders its reads after it: every
    result right although the fake GPU runs the daemon's work up to 2 ms
    late, and no host wait for the GPU in the daemon over 600 ops
    (hvdd_gpu_host_syncs_total flat). With host (the default) the same ops
    come back host-synchronised, one host wait per response at least."""
    monkeypatch.setenv("HVDD_FAKE_GPU_DELAY", "2ms")
    port = _free_port()
    res = job.run(
        "completion",
        np=2,
        timeout=300,
        cmd=[sys.executable, STEADY_WORKERS, "completion"],
        daemon_args=["--gpu-completion", mode, "--metrics-addr", f"127.0.0.1:{port}"],
        env={
            "HVDD_TEST_METRICS": f"http://127.0.0.1:{port}/metrics",
            "HVDD_TEST_ORDERED": "1" if mode == "stream" else "0",
        },
    )
    for o in res.outputs:
        assert o.rstrip().endswith("OK"), o
        print(o.strip().splitlines()[-2])
