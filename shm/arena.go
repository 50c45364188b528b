package shm

import (
	"fmt"
	"sort"
	"sync"
)

// Align is the alignment of every Arena allocation: a cache line, and enough for
// any vector load the reduction kernels use.
const Align = 64

// Arena hands out aligned ranges of a fixed-size space (a Region's bytes) with a
// first-fit free list that merges neighbours on Free. It stores offsets only and
// is safe for concurrent use.
type Arena struct {
	size int64

	// mu guards the fields that follow.
	mu   sync.Mutex
	free []span // sorted by off, non-adjacent
	used map[int64]int64
}

type span struct{ off, n int64 }

// NewArena manages size bytes starting at offset 0.
func NewArena(size int64) *Arena {
	return &Arena{size: size, free: []span{{0, size}}, used: make(map[int64]int64)}
}

// Alloc reserves n bytes (rounded up to Align) and returns their offset, or
// ok=false when no free range is large enough.
func (a *Arena) Alloc(n int64) (off int64, ok bool) {
	if n <= 0 {
		n = 1
	}
	n = (n + Align - 1) &^ (Align - 1)
	a.mu.Lock()
	defer a.mu.Unlock()
	for i, s := range a.free {
		if s.n < n {
			continue
		}
		off = s.off
		if s.n == n {
			a.free = append(a.free[:i], a.free[i+1:]...)
		} else {
			a.free[i] = span{s.off + n, s.n - n}
		}
		a.used[off] = n
		return off, true
	}
	return 0, false
}

// Free returns the range that Alloc gave at off. Freeing an offset that is not
// allocated is an error (and changes nothing).
func (a *Arena) Free(off int64) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	n, ok := a.used[off]
	if !ok {
		return fmt.Errorf("shm: free of offset %d, which is not allocated", off)
	}
	delete(a.used, off)
	i := sort.Search(len(a.free), func(i int) bool { return a.free[i].off > off })
	a.free = append(a.free, span{})
	copy(a.free[i+1:], a.free[i:])
	a.free[i] = span{off, n}
	// Merge with the right neighbour, then the left.
	if i+1 < len(a.free) && a.free[i].off+a.free[i].n == a.free[i+1].off {
		a.free[i].n += a.free[i+1].n
		a.free = append(a.free[:i+1], a.free[i+2:]...)
	}
	if i > 0 && a.free[i-1].off+a.free[i-1].n == a.free[i].off {
		a.free[i-1].n += a.free[i].n
		a.free = append(a.free[:i], a.free[i+1:]...)
	}
	return nil
}

// InUse is the number of bytes allocated now.
func (a *Arena) InUse() int64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	var n int64
	for _, v := range a.used {
		n += v
	}
	return n
}

// Size is the managed size.
func (a *Arena) Size() int64 { return a.size }
