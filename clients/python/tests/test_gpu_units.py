"""Unit tests of the client's GPU path that need no daemon and no GPU: the
DeviceBuffer encoding, UUIDs, allocator detection, torch's handle forms, the
session's caching and releases (against a stand-in client), and
hvdd.tensorflow's choice of path by device string."""

from __future__ import annotations

import gc
import random
import warnings

import pytest
import torch

from hvdd import _cuda
from hvdd._proto import hvdd_pb2 as pb
from hvdd._wire import encode_device_buffer, encode_enqueue

from fake_cuda import FakeDevice, mem_handle


def test_encode_device_buffer_matches_protobuf():
    rnd = random.Random(3)
    for _ in range(500):
        kw = dict(
            device_uuid=rnd.choice(["", "GPU-fake-0", "GPU-" + "ab" * 40]),
            mem_handle=rnd.choice([b"", bytes(range(64)), b"\x00" * 64]),
            alloc_size=rnd.choice([0, 1, 2 << 20, 1 << 40]),
            offset=rnd.choice([0, 256, 1 << 33]),
            length=rnd.choice([0, 4, 1 << 30]),
            event_handle=rnd.choice([b"", bytes(range(1, 65))]),
            client_waits=rnd.choice([False, True]),
        )
        want = pb.DeviceBuffer(**kw)
        got = encode_device_buffer(**kw)
        assert got == want.SerializeToString(), kw
        if not got:
            continue  # an empty DeviceBuffer is never sent
        # ... and inside an Enqueue, after every other field.
        body = encode_enqueue(1, "n", 9, [3, 4], 0, 0, 0, 1, 0.5, 2.0, 0, None, 7, 2, 3, got)
        m = pb.ClientMessage()
        e = m.enqueue
        e.name, e.op, e.dtype, e.reduce_op, e.prescale, e.postscale = "n", 1, 9, 1, 0.5, 2.0
        e.shape.extend([3, 4])
        e.group, e.group_size, e.process_set = 7, 2, 3
        e.device_buffer.CopyFrom(want)
        assert body == m.SerializeToString(), kw


@pytest.mark.parametrize(
    "uuid,want",
    [
        (bytes(range(16)), "GPU-00010203-0405-0607-0809-0a0b0c0d0e0f"),
        ("58b1dd8d-7a3b-4c1b-8e6d-0123456789ab", "GPU-58b1dd8d-7a3b-4c1b-8e6d-0123456789ab"),
        ("GPU-58b1dd8d-7a3b-4c1b-8e6d-0123456789ab", "GPU-58b1dd8d-7a3b-4c1b-8e6d-0123456789ab"),
        ("MIG-1234", "MIG-1234"),
    ],
)
def test_format_uuid(uuid, want):
    assert _cuda.format_uuid(uuid) == want

    class CUuuid:  # torch's _CUuuid: bytes as a list of ints
        bytes = list(range(16))

    assert _cuda.format_uuid(CUuuid()) == "GPU-00010203-0405-0607-0809-0a0b0c0d0e0f"


@pytest.mark.parametrize(
    "backend,env,bad",
    [
        ("native", {}, None),
        ("cudaMallocAsync", {}, "cudaMallocAsync"),
        ("native", {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}, "expandable_segments"),
        ("native", {"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:64, expandable_segments:true"}, "expandable"),
        ("native", {"PYTORCH_ALLOC_CONF": "expandable_segments:True"}, "PYTORCH_ALLOC_CONF"),
        ("native", {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:False"}, None),
    ],
)
def test_allocator_problem(backend, env, bad):
    p = _cuda.allocator_problem(backend, env)
    if bad is None:
        assert p is None
    else:
        assert p is not None and bad in p


def test_parse_torch_handle():
    raw = bytes(range(64))
    assert _cuda.parse_torch_handle(raw) == raw  # torch before versioned handles
    for version in (2, 3):
        assert _cuda.parse_torch_handle(bytes([version]) + b"c" + raw) == raw
    with pytest.raises(_cuda.ExportUnavailable, match="expandable segment"):
        _cuda.parse_torch_handle(b"\x02e" + bytes(100))
    with pytest.raises(_cuda.ExportUnavailable):
        _cuda.parse_torch_handle(b"\x02x" + bytes(10))


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


def _decode(b: bytes) -> pb.DeviceBuffer:
    return pb.DeviceBuffer.FromString(b)


def test_session_caches_exports_and_releases_freed_allocations():
    dev = FakeDevice("GPU-fake-test")
    c = StubClient(["GPU-fake-test"])
    s = _cuda.session(c, dev)
    assert _cuda.session(c, dev) is s
    a = dev.tensor(torch.arange(10, dtype=torch.float32), new_segment=True)
    b = dev.tensor(torch.arange(6, dtype=torch.int64))  # the same segment, further in
    seg = dev.segments[-1]
    da = _decode(s.buffer(a))
    db = _decode(s.buffer(b))
    assert (da.device_uuid, da.mem_handle, da.alloc_size) == ("GPU-fake-test", seg.handle, seg.size)
    assert db.mem_handle == seg.handle
    assert (da.offset, da.length) == (a.data_ptr() - seg.base, 40)
    assert (db.offset, db.length) == (b.data_ptr() - seg.base, 48)
    assert db.offset >= da.offset + da.length
    assert da.event_handle == db.event_handle and len(da.event_handle) == 64
    assert s.exports == 2
    # A second op on the same memory exports nothing; the event is re-recorded.
    r = dev.recorded()
    s.buffer(a)
    s.buffer(b)
    assert s.exports == 2 and dev.recorded() == r + 2
    # A view at an offset in the storage: the same export, the view's offset.
    v = a[4:]
    dv = _decode(s.buffer(v))
    assert s.exports == 2 and dv.offset == da.offset + 16 and dv.length == 24
    # Freeing one storage of the allocation releases nothing; the last does.
    del a, v
    gc.collect()
    s.buffer(b)
    assert c.releases == []
    del b
    gc.collect()
    s.flush()
    assert c.releases == [[seg.handle]] and s.released == [seg.handle]
    # New memory in a new allocation: exported anew.
    d = dev.tensor(torch.ones(3), new_segment=True)
    assert _decode(s.buffer(d)).mem_handle == dev.segments[-1].handle != seg.handle
    assert s.exports == 3


def test_session_refuses_with_one_warning_each():
    _cuda.reset_warnings()
    dev = FakeDevice("GPU-elsewhere")
    t = dev.tensor(torch.ones(4))
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        assert not _cuda.session(StubClient([]), dev).usable(t)
        assert not _cuda.session(StubClient([]), dev).usable(t)
        assert not _cuda.session(StubClient(["GPU-other"]), dev).usable(t)
        assert not _cuda.session(StubClient(["GPU-other"]), dev).usable(t)
        ok = StubClient(["GPU-elsewhere"])
        dev.problem_text = "expandable_segments:True is set; unset it"
        assert not _cuda.session(ok, dev).usable(t)
        assert not _cuda.session(ok, dev).usable(t)
        dev.problem_text = None
        dev.refuse = "a tensor received from another process"
        s = _cuda.session(ok, dev)
        assert s.usable(t)
        assert s.buffer(t) is None and s.buffer(t) is None and s.exports == 0
    msgs = [str(x.message) for x in w if issubclass(x.category, _cuda.HvddStagingWarning)]
    assert len(msgs) == 4, msgs
    assert "CPU-only" in msgs[0]
    assert "does not serve that GPU" in msgs[1] and "GPU-other" in msgs[1]
    assert "expandable_segments" in msgs[2]
    assert "received from another process" in msgs[3]
    _cuda.reset_warnings()


def test_fake_handles_layout():
    h = mem_handle(0x01020304, 7, 1 << 20, 9)
    assert len(h) == 64 and h[:8] == b"HVDDFAKE"
    assert h[8:12] == bytes([4, 3, 2, 1]) and h[12:16] == (7).to_bytes(4, "little")
    assert h[16:24] == (1 << 20).to_bytes(8, "little") and h[24:32] == (9).to_bytes(8, "little")
    assert h[32:] == bytes(32)


def test_exporter_for_cpu_tensor_is_none():
    assert _cuda.exporter_for(torch.ones(2)) is None
    dev = FakeDevice("GPU-x")
    _cuda.install_exporter(dev)
    try:
        t = dev.tensor(torch.ones(2))
        assert _cuda.exporter_for(t) is dev
        assert _cuda.exporter_for(torch.ones(2)) is None
    finally:
        _cuda.remove_exporter(dev)


@pytest.mark.parametrize(
    "device,want",
    [
        ("/job:localhost/replica:0/task:0/device:GPU:0", "GPU:0"),
        ("/job:worker/replica:0/task:1/device:GPU:3", "GPU:3"),
        ("/device:GPU:1", "GPU:1"),
        ("GPU:0", "GPU:0"),
        ("/gpu:2", "GPU:2"),
        ("/job:localhost/replica:0/task:0/device:CPU:0", None),
        ("/cpu:0", None),
        ("CPU:0", None),
        ("", None),
        ("/job:localhost/replica:0/task:0/device:TPU:0", None),
    ],
)
def test_tensorflow_staged_device(device, want):
    assert _cuda.staged_device(device) == want


def test_tensorflow_gpu_tensor_warns_once():
    """hvdd.tensorflow's check on a tensor's device: a GPU-placed tensor warns
    once, naming why; CPU tensors and unplaced graph tensors say nothing."""
    pytest.importorskip("tensorflow")
    from hvdd.tensorflow import mpi_ops

    class Placed:
        def __init__(self, device):
            self.device = device

    _cuda.reset_warnings()
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        mpi_ops._note_device(Placed("/job:localhost/replica:0/task:0/device:CPU:0"))
        mpi_ops._note_device(Placed(""))
        assert not w
        for _ in range(3):
            mpi_ops._note_device(Placed("/job:localhost/replica:0/task:0/device:GPU:0"))
    msgs = [str(x.message) for x in w if issubclass(x.category, _cuda.HvddStagingWarning)]
    assert len(msgs) == 1 and "GPU:0" in msgs[0] and "no CUDA IPC" in msgs[0], msgs
    _cuda.reset_warnings()


def test_driver_maps_and_counts():
    """_Driver's IPC calls (libcuda's functions stood in for): an open, a
    copy and its stream's synchronize, a close, each counted; copy_from_ipc
    is the three in one."""
    calls = []

    def open_(pp, h, flags):
        calls.append(("open", bytes(h.reserved)[:4], flags))
        pp._obj.value = 0x10000
        return 0

    def copy(dst, src, n, stream):
        calls.append(("copy", dst.value, src.value, n, stream.value))
        return 0

    def sync(stream):
        calls.append(("sync", stream.value))
        return 0

    def close(p):
        calls.append(("close", p.value))
        return 0

    d = _cuda._Driver.__new__(_cuda._Driver)
    d.lib, d.opens, d.closes = object(), 0, 0
    d._fns = {"cuIpcOpenMemHandle_v2": open_, "cuMemcpyDtoDAsync_v2": copy, "cuStreamSynchronize": sync}
    d._fns["cuIpcCloseMemHandle"] = close
    p = d.open_ipc(b"HVDD" + bytes(60))
    assert p == 0x10000 and (d.opens, d.closes) == (1, 0)
    d.copy_sync(0x2000, p + 64, 128, 7)
    d.close_ipc(p)
    assert (d.opens, d.closes) == (1, 1)
    assert calls == [
        ("open", b"HVDD", 1),
        ("copy", 0x2000, 0x10040, 128, 7),
        ("sync", 7),
        ("close", 0x10000),
    ]
    calls.clear()
    d.copy_from_ipc(b"HVDD" + bytes(60), 16, 0x3000, 8, 9)
    assert [c[0] for c in calls] == ["open", "copy", "sync", "close"] and (d.opens, d.closes) == (2, 2)
    # A failed copy still closes what it opened.
    d._fns["cuMemcpyDtoDAsync_v2"] = lambda *a: 700
    with pytest.raises(RuntimeError, match="cuMemcpyDtoDAsync failed: CUDA error 700"):
        d.copy_from_ipc(b"HVDD" + bytes(60), 0, 0x3000, 8, 9)
    assert (d.opens, d.closes) == (3, 3)


def test_torch_exporter_records_per_stream_without_a_stream_object_per_op(monkeypatch):
    """TorchCudaExporter (hvdd/torch/_cuda_export.py) per op, without a GPU
    (torch's CUDA calls stood in for): the stream found by its raw handle,
    its torch.cuda.Stream made once, one interprocess event per stream made
    once and re-recorded on it; where no event can be made, the stream is
    synchronised each op instead."""
    from hvdd.torch import _cuda_export

    made, records, syncs = [], [], []

    class Stream:
        def __init__(self, raw):
            self.raw = raw
            made.append(raw)

        def synchronize(self):
            syncs.append(self.raw)

    class Event:
        refuse = False

        def __init__(self, interprocess=False):
            assert interprocess
            if Event.refuse:
                raise RuntimeError("no interprocess events here")

        def record(self, stream):
            records.append(stream.raw)

        def ipc_handle(self):
            return b"E" * 64

    class T:  # a CUDA tensor's device
        def __init__(self, dev):
            self.dev = dev

        def get_device(self):
            return self.dev

    current = {0: 0x70, 1: 0x71}
    monkeypatch.setattr(_cuda_export, "_raw_stream", lambda i: current[i])
    monkeypatch.setattr(torch.cuda, "current_stream", lambda i=None: Stream(current[i]))
    monkeypatch.setattr(torch.cuda, "Event", Event)
    ex = _cuda_export.TorchCudaExporter()
    for _ in range(5):
        assert ex.record_event(T(0)) == b"E" * 64
        assert ex.record_event(T(1)) == b"E" * 64
    assert made == [0x70, 0x71] and records == [0x70, 0x71] * 5
    assert ex.pool_key(T(0)) is ex.pool_key(T(0)) and made == [0x70, 0x71]
    current[0] = 0x80  # another stream made current on device 0
    Event.refuse = True
    assert ex.record_event(T(0)) == b"" and ex.record_event(T(0)) == b""
    assert made == [0x70, 0x71, 0x80] and syncs == [0x80, 0x80] and records == [0x70, 0x71] * 5
