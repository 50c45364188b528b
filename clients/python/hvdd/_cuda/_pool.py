"""The pools of out-of-place ops: exporter memory a session keeps per stream
(:meth:`hvdd._cuda.DeviceSession.slot`), exported once, cut into slots by
:class:`SlotAllocator`; a :class:`Slot` is lent to one op.

Framework-neutral: a pool is a tensor of the exporter's, which only the
exporter touches.
"""

from __future__ import annotations

import bisect
import weakref
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

__all__ = ["POOL_ALIGN", "SlotAllocator", "Slot"]

#: The alignment of a slot in a pool (cudaMalloc's is 256 bytes).
POOL_ALIGN = 256


def _aligned(n: int, align: int = POOL_ALIGN) -> int:
    return max(align, (n + align - 1) // align * align)


class SlotAllocator:
    """First-fit allocation of slots in [0, size): each slot's offset and
    length are multiples of align, and freeing one joins it with the free
    space around it. Not thread-safe (the session's pool lock guards it).

    The free space is a list of holes (offset, length), sorted by offset,
    none adjacent to another: first fit takes the front of the first hole
    that is large enough, so that slots freed and taken again in the same
    order (a training step's) land where they were."""

    def __init__(self, size: int, align: int = POOL_ALIGN) -> None:
        if size <= 0 or size % align:
            raise ValueError(f"a pool's size must be a positive multiple of {align}, not {size}")
        self.size = size
        self.align = align
        self._offs: List[int] = [0]  # the holes' offsets, sorted
        self._lens: List[int] = [size]  # and their lengths
        self._slots: Dict[int, int] = {}  # offset -> length of each slot taken
        #: The bytes in slots taken.
        self.used = 0

    @property
    def busy(self) -> int:
        """The number of slots taken."""
        return len(self._slots)

    def alloc(self, nbytes: int) -> Optional[int]:
        """The offset of a new slot of at least nbytes (one alignment unit
        at least), or None when no hole is large enough."""
        need = _aligned(nbytes, self.align)
        for i, n in enumerate(self._lens):
            if n >= need:
                off = self._offs[i]
                if n == need:
                    del self._offs[i], self._lens[i]
                else:
                    self._offs[i] = off + need
                    self._lens[i] = n - need
                self._slots[off] = need
                self.used += need
                return off
        return None

    def free(self, offset: int) -> None:
        """Gives back the slot at offset (ValueError for none taken there)."""
        n = self._slots.pop(offset, None)
        if n is None:
            raise ValueError(f"no slot at offset {offset}")
        self.used -= n
        i = bisect.bisect_left(self._offs, offset)
        joins_prev = i > 0 and self._offs[i - 1] + self._lens[i - 1] == offset
        joins_next = i < len(self._offs) and offset + n == self._offs[i]
        if joins_prev and joins_next:
            self._lens[i - 1] += n + self._lens[i]
            del self._offs[i], self._lens[i]
        elif joins_prev:
            self._lens[i - 1] += n
        elif joins_next:
            self._offs[i] = offset
            self._lens[i] += n
        else:
            self._offs.insert(i, offset)
            self._lens.insert(i, n)

    def holes(self) -> List[Tuple[int, int]]:
        """The free space as (offset, length) pairs, in order (tests)."""
        return list(zip(self._offs, self._lens))


@dataclass
class _Pool:
    """One pool: a uint8 tensor of exporter memory, exported once (the
    session's cache keeps its storage's export), and its slots; the views
    of its slots made so far (``Exporter.slot_view``) by (offset, dtype,
    shape), reused op after op: a training step's ops take the same slots
    for the same tensors (first fit), so a view is made once, not per op."""

    tensor: Any
    slots: SlotAllocator
    views: Dict[Tuple[int, Any, Any], Any] = field(default_factory=dict)

    #: The views kept, at most (beyond it they are made anew).
    MAX_VIEWS = 256

    def view(self, ex: Any, offset: int, like: Any) -> Any:
        """The view of the slot at offset for like (its dtype and shape)."""
        k = (offset, like.dtype, like.shape)
        v = self.views.get(k)
        if v is None:
            v = ex.slot_view(self.tensor, offset, like)
            if len(self.views) >= self.MAX_VIEWS:
                self.views.clear()
            self.views[k] = v
        return v


@dataclass
class _StreamPools:
    """The pools of one stream: the last is the one slots are taken from;
    the others (outgrown) are dropped once their last slot is freed."""

    stream: Any
    pools: List[_Pool] = field(default_factory=list)


# The slots lent to handles: weak reference to the handle -> (the session's
# queue of slots freed, the slot's entry in it). dict.pop is atomic: a slot
# goes back once, by Slot.free or by the handle's going (_gone, which may
# run in any thread, in a garbage collection: it only queues).
_lent: Dict[Any, Tuple[Any, Tuple[Any, Any, int]]] = {}


def _gone(r: Any) -> None:
    e = _lent.pop(r, None)
    if e is not None:
        e[0].put(e[1])


class Slot:
    """A slot of a session's pool lent to one op: ``view`` is the op's
    tensor in it (the input's dtype and shape) until :meth:`free`.

    A slot is freed exactly once: by :meth:`result` (the op succeeded), by
    :meth:`free`, or, when lent to a handle (:meth:`lend`), once the handle
    is gone (the op failed: its finish never runs). Freeing only queues the
    slot (it may run in a finalizer); the session takes it back at its next
    :meth:`DeviceSession.slot`. (``session`` is that
    :class:`hvdd._cuda.DeviceSession`, which imports this module.)"""

    __slots__ = ("view", "stream", "_session", "_sp", "_pool", "_offset", "_fin", "_freed")

    def __init__(self, session: Any, sp: _StreamPools, pool: _Pool, offset: int, view: Any) -> None:
        self.view = view
        self.stream = sp.stream
        self._session = session
        self._sp = sp
        self._pool = pool
        self._offset = offset
        self._fin: Optional[weakref.ref] = None
        self._freed = False

    def lend(self, owner: Any) -> None:
        """Frees the slot when owner (the op's handle) is gone, should the
        slot not have been freed before: a weak reference to owner whose
        callback gives the slot back (cheaper per op than a
        ``weakref.finalize``), kept in ``_lent`` until one of the two runs."""
        if not self._freed and self._fin is None:
            r = weakref.ref(owner, _gone)
            _lent[r] = (self._session._slots_freed, (self._sp, self._pool, self._offset))
            self._fin = r

    def free(self) -> None:
        """Gives the slot back (once; later calls do nothing)."""
        r = self._fin
        if r is not None:
            # the handle's going or this: whichever takes the entry first
            e = _lent.pop(r, None)
            if e is not None:
                e[0].put(e[1])
        elif not self._freed:
            self._freed = True
            self._session._slots_freed.put((self._sp, self._pool, self._offset))

    def result(self) -> Any:
        """The op's result: a new tensor of the framework's own with the
        slot's values (``Exporter.copy_out``); the slot is freed."""
        try:
            return self._session.exporter.copy_out(self.view, self.stream)
        finally:
            self.free()
