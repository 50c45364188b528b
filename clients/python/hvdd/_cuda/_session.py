"""The GPU path of one connection, for one exporter (:class:`DeviceSession`):
per tensor, CUDA IPC or staging; the exports and the handles the daemon has
mapped; the daemon's device outputs mapped here; the pools of out-of-place
ops.

Caching. A storage is exported once: its export is kept under the storage's
address and size while the storage lives (a weakref finalizer on the
storage, and a liveness check at every lookup, retire it). The daemon maps
an allocation once per connection and keeps the mapping under the handle's
bytes; when the last exported storage of an allocation is freed, the
session sends ``ReleaseDeviceMemory`` for its handle with the next request,
so the daemon closes its mapping (the next export of that allocation opens
it again).

Device outputs. The daemon lends its results (allgather, alltoall,
reducescatter) in buffers of a pool it keeps per connection, so the same
handles come back op after op. The session keeps each one it has mapped
open under the handle's bytes (an LRU of :attr:`DeviceSession.output_cache`,
and none idle for over :attr:`DeviceSession.output_idle` reads), so that a
steady state opens and closes nothing; each read still copies and waits
before the Release, after which the daemon may reuse the buffer.

Out-of-place ops. An op whose result is a new tensor (allreduce,
broadcast) reduces a copy of its input in a slot of a pool of exporter
memory the session keeps per stream (:meth:`DeviceSession.slot`): the pool
is exported once, so a steady state exports nothing where a new tensor per
op would export (and, once freed, release) its memory every op. The result
is copied out of the slot into a new tensor of the framework's own (never
exported) when the op completes, and the slot is reused.

Framework-neutral: the exporter does everything that touches a tensor.
"""

from __future__ import annotations

import collections
import logging
import queue
import threading
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Set, Tuple

from .._wire import encode_device_buffer
from ._exporter import Export, Exporter, ExportUnavailable
from ._pool import Slot, SlotAllocator, _aligned, _Pool, _StreamPools
from ._staging import _warn_once

__all__ = ["DeviceSession", "session"]

log = logging.getLogger("hvdd._cuda")


@dataclass
class _Mapping:
    """A device output's allocation mapped here (``Exporter.open_output``)."""

    mapping: Any
    size: int
    last: int = 0  # the read count at its last use
    pins: int = 0  # reads copying from it now
    stale: bool = False  # dropped from the cache: closed at its last unpin


# ---------------------------------------------------------------- sessions


@dataclass
class _Entry:
    export: Export
    key: Tuple[int, int]
    #: the storage's GPU
    uuid: str
    # a finalizer retires it when its storage is freed (no liveness checks)
    watched: bool = False
    # the last DeviceBuffer made of it: (offset, length, event handle, bytes)
    last: Optional[Tuple[int, int, bytes, bytes]] = None


@dataclass
class DeviceSession:
    """The GPU path of one connection to the daemon, for one exporter: it
    decides, per tensor, between CUDA IPC and staging, and keeps the exports
    and the handles the daemon has mapped, the daemon's device outputs
    mapped here, and the pools of out-of-place ops.

    ``exports`` counts the allocations exported (a cache miss each);
    ``released`` lists the handles sent in ReleaseDeviceMemory, in order;
    ``output_opens`` and ``output_closes`` count the device outputs' mappings
    opened and closed; ``pools_made`` counts the pools allocated;
    ``ordered`` the ops the daemon completed ordered on the GPU
    (:meth:`wait_done`)."""

    client: Any
    exporter: Exporter
    exports: int = 0
    ordered: int = 0
    released: List[bytes] = field(default_factory=list)
    output_opens: int = 0
    output_closes: int = 0
    pools_made: int = 0
    #: The device outputs kept mapped, at most (least recently used first
    #: out), and the reads after which one unused is closed (the daemon
    #: frees the buffers its pool holds beyond its bound: their handles
    #: never come back).
    output_cache: int = 64
    output_idle: int = 1024
    #: A stream's first pool's size, and the largest a pool grows to (a
    #: tensor that fits in none takes a copy of its own, exported per op).
    pool_min: int = 1 << 20
    pool_max: int = 256 << 20
    #: The streams whose pools are kept while idle, at most (the least
    #: recently used idle ones go beyond it).
    pool_streams: int = 8
    _cache: Dict[Tuple[int, int], _Entry] = field(default_factory=dict)
    # handle bytes -> live cached storages in that allocation
    _refs: Dict[bytes, int] = field(default_factory=dict)
    # Freed storages, queued by their finalizers (SimpleQueue.put is safe
    # there: a finalizer may run inside a send, holding the client's write
    # lock) for the releaser thread, or for flush().
    _freed: "queue.SimpleQueue[Optional[Tuple[Tuple[int, int], _Entry]]]" = field(default_factory=queue.SimpleQueue)
    _releaser: Optional[threading.Thread] = None
    # held while retiring, so that flush() returns after a retirement the
    # releaser thread has begun
    _flush_lock: threading.Lock = field(default_factory=threading.Lock)
    # handle bytes -> the allocation size sent with it (the daemon refuses
    # a handle again with another size)
    _sizes: Dict[bytes, int] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _ops: int = 0
    # Some export has no finalizer (torch < 2): flush() then checks every
    # cached export's liveness.
    _unwatched: bool = False
    # handle bytes -> the device output mapped, least recently used first
    _outputs: "collections.OrderedDict[bytes, _Mapping]" = field(default_factory=collections.OrderedDict)
    _out_lock: threading.Lock = field(default_factory=threading.Lock)
    _reads: int = 0
    # stream -> its pools; slots freed, queued until the next slot()
    _pools: "collections.OrderedDict[Any, _StreamPools]" = field(default_factory=collections.OrderedDict)
    _pool_lock: threading.Lock = field(default_factory=threading.Lock)
    _slots_freed: "queue.SimpleQueue[Tuple[_StreamPools, _Pool, int]]" = field(default_factory=queue.SimpleQueue)
    _pool_off: bool = False
    # the GPUs found usable (usable() checks nothing more for them)
    _usable: Set[str] = field(default_factory=set)

    def usable(self, tensor: Any) -> bool:
        """Whether tensor can go through CUDA IPC as far as the daemon's GPUs
        and this process's allocator go (it warns once when not). A GPU
        found usable is kept so: the next op on it asks nothing more."""
        uuid = self.exporter.device_uuid(tensor)
        if uuid in self._usable:
            return True
        uuids = self.client.gpu_uuids()
        if not uuids:
            _warn_once(
                "no-gpus",
                f"hvdd: {self.exporter.name} tensors are staged through host memory: the daemon runs CPU-only "
                "(it found no GPU, or no CUDA driver: see `hvdd gpus` and its log); run the daemon on a node "
                "with the GPUs for zero-copy GPU collectives",
            )
            return False
        if uuid not in uuids:
            _warn_once(
                "gpu-not-served:" + uuid,
                f"hvdd: {self.exporter.name} tensors on {uuid} are staged through host memory: the daemon does not "
                f"serve that GPU (it serves {', '.join(sorted(uuids))}); check CUDA_VISIBLE_DEVICES of the daemon",
            )
            return False
        p = self.exporter.problem()
        if p is not None:
            _warn_once("allocator", f"hvdd: {self.exporter.name} tensors are staged through host memory: {p}")
            return False
        self._usable.add(uuid)
        return True

    def buffer(self, tensor: Any) -> Optional[bytes]:
        """The encoded DeviceBuffer for a contiguous tensor the exporter
        claims (the event recorded), or None to stage it (warned once). Op
        after op on one tensor, the bytes are the last op's (an entry keeps
        them): the event handle is the stream's, the same each time."""
        ex = self.exporter
        key = ex.storage_key(tensor)
        self._ops += 1
        if (self._ops & 255) == 0:
            self.flush(wait=False)
        e = self._cache.get(key)
        # Checked even where a finalizer watches the storage: a storage freed
        # and another made at its address before the releaser thread ran
        # must not reuse the old export (the block may be another one).
        if e is not None and e.export.alive is not None and not e.export.alive():
            self._retire(key, e)
            e = None
        if e is None:
            # A miss: first retire what was freed (where no finalizer says so,
            # the liveness checks find it), so that a freed allocation is
            # released before new memory goes out.
            self.flush(wait=False)
            try:
                exp = ex.export(tensor)
            except ExportUnavailable as err:
                _warn_once("export", f"hvdd: {ex.name} tensors are staged through host memory: {err}")
                return None
            self.exports += 1
            sent = self._sizes.get(exp.mem_handle)
            if sent is not None and sent != exp.alloc_size:
                # An allocation whose size the exporter could only bound
                # (no driver call): keep the size the daemon has.
                exp.alloc_size = sent
            e = _Entry(exp, key, ex.device_uuid(tensor))
            with self._lock:
                self._cache[key] = e
                self._refs[exp.mem_handle] = self._refs.get(exp.mem_handle, 0) + 1
                self._sizes[exp.mem_handle] = exp.alloc_size
            e.watched = ex.on_free(tensor, lambda k=key, e=e: self._freed.put((k, e)))
            if not e.watched:
                self._unwatched = True
            elif self._releaser is None:
                self._releaser = threading.Thread(target=self._release_loop, name="hvdd-gpu-release", daemon=True)
                self._releaser.start()
        exp = e.export
        offset = exp.storage_offset + ex.element_offset(tensor)
        length = ex.nbytes(tensor)
        if offset + length > exp.alloc_size:
            _warn_once(
                "bounds",
                f"hvdd: {ex.name} tensors are staged through host memory: a tensor at offset {offset} + {length} "
                f"bytes lies outside the allocation size {exp.alloc_size} known for its IPC handle",
            )
            return None
        ev = ex.record_event(tensor)
        last = e.last
        if last is not None and last[0] == offset and last[1] == length and last[2] == ev:
            return last[3]
        b = encode_device_buffer(e.uuid, exp.mem_handle, exp.alloc_size, offset, length, ev, ex.can_wait)
        e.last = (offset, length, ev, b)
        return b

    def _retire(self, key: Tuple[int, int], entry: Optional[_Entry] = None) -> Optional[bytes]:
        """Drops a storage's export (the cache's entry for key, if it is
        still entry), and releases its allocation's handle when it was the
        last one (returned)."""
        with self._lock:
            e = self._cache.get(key)
            if e is None or (entry is not None and e is not entry):
                return None
            del self._cache[key]
            h = e.export.mem_handle
            n = self._refs.get(h, 0) - 1
            if n > 0:
                self._refs[h] = n
                return None
            self._refs.pop(h, None)
            self._sizes.pop(h, None)
        self.released.append(h)
        self.client.release_device_memory([h])
        return h

    def _release_loop(self) -> None:
        """The releaser thread: retires storages as their finalizers queue
        them, so that the daemon closes a freed allocation's mapping at once
        (CUDA leaves freeing memory another process has mapped undefined,
        and torch's caching allocator may free a segment once its storages
        are gone)."""
        while True:
            item = self._freed.get()
            if item is None:
                return
            if isinstance(item, threading.Event):
                item.set()  # flush(wait=True)'s marker: everything before it is done
                continue
            with self._flush_lock:
                self._retire(*item)

    def flush(self, wait: bool = True) -> None:
        """Retires the exports of freed storages (finalizers queued them, or
        their liveness check fails) and releases the allocations no live
        export uses. With wait, also what the releaser thread has taken
        and not yet finished."""
        r = self._releaser
        if wait and r is not None and r.is_alive():
            done = threading.Event()
            self._freed.put(done)  # type: ignore[arg-type]
            done.wait(10)  # bounded: a closed session's thread has ended
        with self._flush_lock:
            while True:
                try:
                    item = self._freed.get_nowait()
                except queue.Empty:
                    break
                if isinstance(item, threading.Event):
                    item.set()
                elif item is not None:
                    self._retire(*item)
                else:
                    self._freed.put(None)  # close()'s: leave it for the thread
                    break
            if not self._unwatched:
                return
            for k, e in list(self._cache.items()):
                if e.export.alive is not None and not e.export.alive():
                    self._retire(k, e)

    # ----------------------------------------------------- device outputs

    def wait_done(self, h: Any, tensor: Any) -> None:
        """After handle h's Done: where the daemon completed the op ordered on
        the GPU (Done.device_event), the current stream of tensor's device
        waits on its event, so that the result is there for what that stream
        runs next (reading it on the host included: that synchronises the
        stream); else nothing (the daemon waited for the GPU)."""
        d = h.done
        if d is not None and d.device_event:
            self.ordered += 1
            self.exporter.wait_event(d.device_event, tensor)

    def read_output(self, out: Any, mem_handle: bytes, alloc_size: int, offset: int, length: int) -> None:
        """Copies length bytes at offset of the daemon's device output of
        handle mem_handle (of alloc_size bytes) into the contiguous tensor
        out, and waits for the copy. The allocation stays mapped under the
        handle's bytes for the next output the daemon lends in it."""
        ex = self.exporter
        close: List[Any] = []
        try:
            with self._out_lock:
                self._reads += 1
                e = self._outputs.get(mem_handle)
                if e is not None and e.size != alloc_size:  # not the allocation mapped before
                    self._drop_output(mem_handle, e, close)
                    e = None
                if e is None:
                    try:
                        m = ex.open_output(out, mem_handle, alloc_size)
                    except NotImplementedError:
                        m = None
                    if m is not None:
                        self.output_opens += 1
                        e = self._outputs[mem_handle] = _Mapping(m, alloc_size)
                else:
                    self._outputs.move_to_end(mem_handle)
                if e is not None:
                    e.pins += 1
                    e.last = self._reads
                self._evict_outputs(close)
        finally:
            self._close_outputs(close)
        if e is None:  # an exporter that maps nothing for longer than a read
            ex.read_output(out, mem_handle, alloc_size, offset, length)
            return
        try:
            ex.copy_output(out, e.mapping, offset, length)
        finally:
            with self._out_lock:
                e.pins -= 1
                if e.stale and e.pins == 0:
                    close.append(e.mapping)
            self._close_outputs(close)

    def _drop_output(self, h: bytes, e: _Mapping, close: List[Any]) -> None:
        """Takes e out of the cache: closed now, or at its last unpin."""
        del self._outputs[h]
        if e.pins:
            e.stale = True
        else:
            close.append(e.mapping)

    def _evict_outputs(self, close: List[Any]) -> None:
        """Drops the least recently used mappings beyond output_cache, and
        those idle for over output_idle reads (_out_lock held)."""
        while self._outputs:
            h, e = next(iter(self._outputs.items()))
            if len(self._outputs) <= self.output_cache and self._reads - e.last <= self.output_idle:
                return
            if e.pins:
                return  # in use now: dropped by a later read
            self._drop_output(h, e, close)

    def _close_outputs(self, close: List[Any]) -> None:
        while close:
            m = close.pop()
            self.output_closes += 1
            try:
                self.exporter.close_output(m)
            except Exception:  # noqa: BLE001 - a closing process may have lost its context
                log.debug("hvdd: closing a device output's mapping failed", exc_info=True)

    def outputs_mapped(self) -> int:
        """The device outputs' allocations mapped now."""
        return len(self._outputs)

    # --------------------------------------------------- out-of-place pool

    def slot(self, tensor: Any) -> Optional[Slot]:
        """A slot for an out-of-place op on tensor (contiguous, device memory
        the session takes): the input's dtype and shape in a pool of the
        current stream, its memory exported once. None where no pool serves
        (the exporter keeps none, the tensor is larger than pool_max, the
        pool is full at pool_max, or memory for a pool ran out): the op then
        copies into a tensor of its own."""
        if self._pool_off:
            return None
        ex = self.exporter
        key = ex.pool_key(tensor)
        if key is None:
            return None
        nbytes = ex.nbytes(tensor)
        if _aligned(nbytes) > self.pool_max:
            return None
        with self._pool_lock:
            self._take_back_slots()
            sp = self._pools.get(key)
            if sp is None:
                sp = self._pools[key] = _StreamPools(key)
                self._forget_streams()
            else:
                self._pools.move_to_end(key)
            pool = sp.pools[-1] if sp.pools else None
            off = pool.slots.alloc(nbytes) if pool is not None else None
            if off is None:
                pool = self._grow(sp, tensor, nbytes)
                if pool is None:
                    return None
                off = pool.slots.alloc(nbytes)
                assert off is not None
            view = pool.view(ex, off, tensor)
        return Slot(self, sp, pool, off, view)

    def _grow(self, sp: _StreamPools, like: Any, nbytes: int) -> Optional[_Pool]:
        """A new pool for sp, twice the last one's size (at least pool_min,
        and large enough for nbytes), which slots are taken from from now
        on; the older ones go once their slots are free (_pool_lock held)."""
        last = sp.pools[-1].slots.size if sp.pools else 0
        if last >= self.pool_max:
            return None
        size = max(self.pool_min, 2 * last)
        while size < nbytes:
            size *= 2
        size = _aligned(min(size, self.pool_max))
        try:
            t = self.exporter.new_pool(like, size)
        except Exception as e:  # noqa: BLE001 - out of memory, or no pools: a copy of its own
            log.debug("hvdd: no pool of %d bytes for out-of-place ops (%s)", size, e)
            return None
        self.pools_made += 1
        pool = _Pool(t, SlotAllocator(size))
        sp.pools = [p for p in sp.pools if p.slots.busy] + [pool]
        return pool

    def _forget_streams(self) -> None:
        """Drops the pools of the least recently used streams beyond
        pool_streams whose slots are all free (_pool_lock held): a job that
        makes streams as it goes must not keep a pool for each."""
        over = len(self._pools) - self.pool_streams
        for k in list(self._pools)[:-1]:  # not the stream just added
            if over <= 0:
                return
            sp = self._pools[k]
            if not any(p.slots.busy for p in sp.pools):
                sp.pools = []
                del self._pools[k]
                over -= 1

    def _take_back_slots(self) -> None:
        """Frees the slots queued by Slot.free, and drops outgrown pools
        whose last slot that was (_pool_lock held)."""
        while True:
            try:
                sp, pool, off = self._slots_freed.get_nowait()
            except queue.Empty:
                return
            pool.slots.free(off)
            if pool.slots.busy == 0 and sp.pools and pool is not sp.pools[-1]:
                sp.pools = [p for p in sp.pools if p is not pool]

    def pool_refused(self) -> None:
        """The pools' memory cannot go through CUDA IPC (its export failed):
        out-of-place ops copy into tensors of their own from now on."""
        with self._pool_lock:
            self._pool_off = True
            self._drop_pools()

    def _drop_pools(self) -> None:
        """Drops every pool (_pool_lock held): a slot lent still holds its
        pool's memory until it is freed."""
        self._take_back_slots()
        for sp in self._pools.values():
            sp.pools = []
        self._pools.clear()

    def pool_stats(self) -> Dict[Any, List[Tuple[int, int, int]]]:
        """stream -> (size, slots taken, bytes in them) of each of its pools,
        once the slots freed are taken back (tests)."""
        with self._pool_lock:
            self._take_back_slots()
            return {k: [(p.slots.size, p.slots.busy, p.slots.used) for p in sp.pools] for k, sp in self._pools.items()}

    def unmap_outputs(self) -> None:
        """Closes the device outputs mapped here. The client calls it before
        it says Goodbye: the daemon frees its output buffers when the
        connection closes, and CUDA leaves freeing memory another process
        still maps undefined."""
        close: List[Any] = []
        with self._out_lock:
            for h, e in list(self._outputs.items()):
                self._drop_output(h, e, close)
        self._close_outputs(close)

    def close(self) -> None:
        """Ends the releaser thread (the connection is closing: the daemon
        closes every mapping of a connection it loses), closes the device
        outputs still mapped here and drops the pools."""
        if self._releaser is not None:
            self._freed.put(None)
        self.unmap_outputs()
        with self._pool_lock:
            self._drop_pools()


def session(client: Any, ex: Exporter) -> DeviceSession:
    """The client's session for ex (one per connection and exporter)."""
    sessions = client.device_sessions
    s = sessions.get(id(ex))
    if s is None or s.exporter is not ex:
        s = sessions[id(ex)] = DeviceSession(client, ex)
    return s
