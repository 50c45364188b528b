"""Shared-memory regions (memfd) and the client's staging arena.

A :class:`Region` is a memfd mapped into this process. Client regions are
created with ``MFD_ALLOW_SEALING`` and sealed with ``F_SEAL_SHRINK`` (the daemon
refuses unsealed ones) and are sparse: pages cost nothing until touched.
:class:`Arena` hands out aligned byte ranges of one region; :class:`Staging`
is the client's staging memory, regions with an arena each, and grows by a
region when none has room. Neither is thread-safe: the client serialises
calls under its lock. This module knows regions, not the protocol: Staging
has its caller register each new region with the daemon.
"""

from __future__ import annotations

import bisect
import fcntl
import logging
import mmap
import os
from typing import Callable

import numpy as np

__all__ = ["Region", "Arena", "Staging", "ALIGN"]

log = logging.getLogger(__name__)

#: Alignment of staging allocations: a cache line, enough for every dtype.
ALIGN = 64


class Region:
    """A mapped memfd. ``array`` is a writable uint8 numpy view of all of it."""

    __slots__ = ("id", "size", "fd", "mm", "array")

    def __init__(self, region_id: int, size: int, fd: int, mm: mmap.mmap) -> None:
        self.id = region_id
        self.size = size
        self.fd = fd
        self.mm = mm
        self.array = np.frombuffer(mm, dtype=np.uint8)

    @classmethod
    def create(cls, region_id: int, size: int, name: str = "hvdd-client") -> "Region":
        """Creates a sealed, sparse memfd of ``size`` bytes and maps it."""
        fd = os.memfd_create(name, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            os.ftruncate(fd, size)
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_SEAL)
            mm = mmap.mmap(fd, size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)
        except BaseException:
            os.close(fd)
            raise
        return cls(region_id, size, fd, mm)

    @classmethod
    def open(cls, region_id: int, size: int, fd: int) -> "Region":
        """Maps a region the daemon granted (it takes ownership of ``fd``)."""
        try:
            st = os.fstat(fd)
            if st.st_size < size:
                raise OSError(f"granted region {region_id:#x} is {st.st_size} bytes, announced {size}")
            mm = mmap.mmap(fd, size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)
        except BaseException:
            os.close(fd)
            raise
        return cls(region_id, size, fd, mm)

    def close_fd(self) -> None:
        """Closes the descriptor; the mapping stays valid."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def close(self) -> None:
        """Closes the descriptor and drops this object's reference to the
        mapping. Numpy views handed out keep the mapping alive until they die."""
        self.close_fd()
        self.array = None  # type: ignore[assignment]
        # mmap.close() would fail while views exist; let GC unmap it.
        self.mm = None  # type: ignore[assignment]


class Arena:
    """First-fit allocator over ``size`` bytes with coalescing frees.

    Free blocks are kept as two parallel sorted lists (starts, lengths), which
    stay short in practice (collectives free roughly in allocation order).
    """

    __slots__ = ("size", "_starts", "_lens", "_used")

    def __init__(self, size: int) -> None:
        self.size = size
        self._starts: list[int] = [0]
        self._lens: list[int] = [size]
        self._used: dict[int, int] = {}

    def alloc(self, n: int) -> int:
        """Returns the offset of ``n`` free bytes, or -1 when none fit."""
        n = (n + (ALIGN - 1)) & ~(ALIGN - 1) if n > 0 else ALIGN
        lens = self._lens
        for i in range(len(lens)):
            ln = lens[i]
            if ln >= n:
                off = self._starts[i]
                if ln == n:
                    del self._starts[i]
                    del lens[i]
                else:
                    self._starts[i] = off + n
                    lens[i] = ln - n
                self._used[off] = n
                return off
        return -1

    def free(self, off: int) -> None:
        """Returns the allocation at ``off`` to the arena."""
        n = self._used.pop(off)
        starts, lens = self._starts, self._lens
        i = bisect.bisect_left(starts, off)
        # Merge with the following block.
        if i < len(starts) and off + n == starts[i]:
            n += lens[i]
            del starts[i]
            del lens[i]
        # Merge with the preceding block.
        if i > 0 and starts[i - 1] + lens[i - 1] == off:
            lens[i - 1] += n
        else:
            starts.insert(i, off)
            lens.insert(i, n)

    @property
    def in_use(self) -> int:
        """Bytes currently allocated (rounded to the alignment)."""
        return sum(self._used.values())


class Staging:
    """The client's staging memory: sealed regions it creates and registers
    with the daemon, each carved by an :class:`Arena`, in ``regions`` as
    (region, arena) pairs. The first region is ``size`` bytes (see
    :meth:`add`); an allocation that fits in none (:meth:`grow`) adds a region
    of ``size`` bytes, or of the allocation's rounded up to pages when larger.
    Region ids count from 0 (the client's range).

    The client allocates with a first-fit scan of ``regions`` in its own
    ``stage`` (one call fewer on the per-op path), then :meth:`grow`.

    ``register(region)`` sends the region's descriptor to the daemon; it runs
    before the region is used, and a failure closes the region and raises.
    """

    __slots__ = ("size", "regions", "_register", "_next_id")

    def __init__(self, size: int, register: Callable[[Region], None]) -> None:
        self.size = size
        self.regions: list[tuple[Region, Arena]] = []
        self._register = register
        self._next_id = 0

    def add(self, size: int) -> tuple[Region, Arena]:
        """Creates and registers a region of ``size`` bytes."""
        r = Region.create(self._next_id, size, f"hvdd-client-{os.getpid()}")
        self._next_id += 1
        try:
            self._register(r)
        except BaseException:
            r.close()
            raise
        r.close_fd()  # the daemon holds its own reference; the mapping stays
        ra = (r, Arena(size))
        self.regions.append(ra)
        return ra

    def grow(self, nbytes: int) -> tuple[Region, int]:
        """Reserves ``nbytes`` in a new region, for an allocation that fits in
        none of the others; returns (region, offset)."""
        page = 4096
        size = max(self.size, (nbytes + page - 1) // page * page)
        log.info("hvdd: staging arena full, registering another region of %d bytes", size)
        region, arena = self.add(size)
        return region, arena.alloc(nbytes)

    def free(self, region: Region, offset: int) -> None:
        """Returns an allocation; one in a region not (or no longer) here is
        ignored."""
        for r, arena in self.regions:
            if r is region:
                arena.free(offset)
                return

    def close(self) -> None:
        """Closes every region (views handed out keep their mappings)."""
        for r, _ in self.regions:
            r.close()
        self.regions.clear()
