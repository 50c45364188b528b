package shm

import (
	"testing"

	"golang.org/x/sys/unix"
)

func TestCreateOpen(t *testing.T) {
	r, err := Create("t", 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	r.Bytes()[100] = 42
	fd, err := unix.Dup(r.FD())
	if err != nil {
		t.Fatal(err)
	}
	o, err := Open(fd, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	defer o.Close()
	if o.Bytes()[100] != 42 {
		t.Fatal("second mapping does not share the bytes")
	}
	if err := unix.Ftruncate(r.FD(), 4096); err == nil {
		t.Fatal("a sealed region could be shrunk")
	}
	if _, err := Create("t", 0); err == nil {
		t.Fatal("zero-size region created")
	}
}

func TestOpenRefuses(t *testing.T) {
	unsealed, _ := unix.MemfdCreate("u", unix.MFD_ALLOW_SEALING)
	unix.Ftruncate(unsealed, 4096)
	var p [2]int
	unix.Pipe(p[:])
	defer unix.Close(p[1])
	small, _ := unix.MemfdCreate("s", unix.MFD_ALLOW_SEALING)
	unix.Ftruncate(small, 4096)
	unix.FcntlInt(uintptr(small), unix.F_ADD_SEALS, unix.F_SEAL_SHRINK)
	tests := []struct {
		name string
		fd   int
		size int64
	}{
		{"unsealed", unsealed, 4096},
		{"pipe", p[0], 4096},
		{"too small", small, 8192},
		{"bad fd", 987654, 4096},
		{"absurd", -1, MaxRegion + 1},
	}
	for _, tc := range tests {
		if _, err := Open(tc.fd, tc.size); err == nil {
			t.Errorf("%s: Open succeeded", tc.name)
		}
	}
}

// FuzzSlice checks the bounds check against the obvious definition.
func FuzzSlice(f *testing.F) {
	r, err := Create("f", 8192)
	if err != nil {
		f.Fatal(err)
	}
	defer r.Close()
	f.Add(uint64(0), uint64(8192))
	f.Add(uint64(8192), uint64(0))
	f.Add(uint64(1<<64-1), uint64(2))
	f.Fuzz(func(t *testing.T, off, n uint64) {
		b, err := r.Slice(off, n)
		inside := off <= 8192 && n <= 8192 && off+n <= 8192
		if inside != (err == nil) {
			t.Fatalf("Slice(%d, %d): err %v, inside %v", off, n, err, inside)
		}
		if err == nil && (uint64(len(b)) != n || uint64(cap(b)) != n) {
			t.Fatalf("Slice(%d, %d) has len %d cap %d", off, n, len(b), cap(b))
		}
	})
}

func TestArena(t *testing.T) {
	a := NewArena(1024)
	var offs []int64
	for i := 0; i < 16; i++ {
		off, ok := a.Alloc(64)
		if !ok {
			t.Fatalf("alloc %d failed", i)
		}
		offs = append(offs, off)
	}
	if _, ok := a.Alloc(1); ok {
		t.Fatal("alloc beyond the arena succeeded")
	}
	for i := 0; i < 16; i += 2 {
		a.Free(offs[i])
	}
	if _, ok := a.Alloc(128); ok {
		t.Fatal("fragmented arena gave a contiguous 128 bytes")
	}
	for i := 1; i < 16; i += 2 {
		a.Free(offs[i])
	}
	if off, ok := a.Alloc(1024); !ok || off != 0 {
		t.Fatalf("after freeing all, alloc(1024) = %d %v", off, ok)
	}
	if err := a.Free(5); err == nil {
		t.Fatal("free of an unallocated offset succeeded")
	}
	if a.InUse() != 1024 {
		t.Fatalf("InUse %d", a.InUse())
	}
}

func TestRoundToPages(t *testing.T) {
	page := int64(PageSize())
	if page <= 0 || page&(page-1) != 0 {
		t.Fatalf("PageSize() = %d, want a power of two", page)
	}
	tests := []struct{ n, want int64 }{
		{0, 0},
		{1, page},
		{page - 1, page},
		{page, page},
		{page + 1, 2 * page},
		{10*page + 3, 11 * page},
	}
	for _, tt := range tests {
		if got := RoundToPages(tt.n); got != tt.want {
			t.Errorf("RoundToPages(%d) = %d, want %d", tt.n, got, tt.want)
		}
	}
}
