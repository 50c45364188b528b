package fake

import (
	"encoding/binary"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/hvdd/hvdd/gpu"
)

// The fake address space of the process: every allocation and every opened
// IPC mapping of every fake device gets a range of its own, handed out
// upwards from addrBase and never reused.
const (
	addrBase  = 0x7f0000000000
	addrAlign = 2 << 20
)

const (
	memMagic = "HVDDFAKE"
	evtMagic = "HVDDFEVT"
)

// alloc is one range of the fake address space: an allocation of this
// process (owned) or another process's allocation mapped here (opened).
type alloc struct {
	base gpu.DevicePtr
	size int
	mem  []byte // the mapping
	fd   int    // owned: the memfd (kept open for IPC); opened: -1
	id   uint64 // owned: the allocation id of the IPC handle
	ctx  *devCtx

	opened bool
	key    openKey // opened: which handle

	// Guarded by space.mu:
	opens int  // opened: OpenMemHandle calls not yet closed
	refs  int  // queued work that will touch the bytes
	dead  bool // freed or closed: unmapped when refs reaches 0
}

// openKey identifies another process's allocation.
type openKey struct {
	pid int
	id  uint64
}

// space is the process's fake address space. mu guards the fields that
// follow.
var space struct {
	mu     sync.Mutex
	next   uint64
	nextID uint64
	allocs []*alloc // live ranges by base (bases only grow: appends keep the order)
	opened map[openKey]*alloc
}

// reserve returns the base of a new range of n bytes. space.mu must be held.
func reserve(n int) gpu.DevicePtr {
	if space.next == 0 {
		space.next = addrBase
	}
	b := space.next
	space.next += (uint64(n)+addrAlign-1)/addrAlign*addrAlign + addrAlign
	return gpu.DevicePtr(b)
}

// insert adds a to the live ranges. space.mu must be held.
func insert(a *alloc) { space.allocs = append(space.allocs, a) }

// remove takes a out of the live ranges (so no new work can resolve it) and
// unmaps it unless queued work still holds it. space.mu must be held.
func remove(a *alloc) {
	i := sort.Search(len(space.allocs), func(i int) bool { return space.allocs[i].base >= a.base })
	if i < len(space.allocs) && space.allocs[i] == a {
		space.allocs = append(space.allocs[:i], space.allocs[i+1:]...)
	}
	forget(a)
	a.dead = true
	if a.refs == 0 {
		a.unmap()
	}
}

// forget takes an opened mapping out of the table OpenMemHandle reuses
// mappings from, unless a newer mapping of the handle replaced it there.
// space.mu must be held.
func forget(a *alloc) {
	if a.opened && space.opened[a.key] == a {
		delete(space.opened, a.key)
	}
}

func (a *alloc) unmap() {
	if a.mem != nil {
		unix.Munmap(a.mem)
		a.mem = nil
	}
	if a.fd >= 0 {
		unix.Close(a.fd)
		a.fd = -1
	}
}

// lookup returns the live range holding p. space.mu must be held.
func lookup(p gpu.DevicePtr) *alloc {
	i := sort.Search(len(space.allocs), func(i int) bool { return space.allocs[i].base > p })
	if i == 0 {
		return nil
	}
	a := space.allocs[i-1]
	if p >= a.base+gpu.DevicePtr(a.size) {
		return nil
	}
	return a
}

// span is n bytes of device memory held for queued work: bytes is valid
// until release.
type span struct {
	a     *alloc
	bytes []byte
}

// hold resolves [p, p+n) for work queued by call and keeps its allocation
// mapped until release. n == 0 resolves to an empty span without a lookup.
func hold(call string, p gpu.DevicePtr, n int) (span, error) {
	if n < 0 {
		return span{}, newErr(call, errInvalidValue, "negative size %d", n)
	}
	if n == 0 {
		return span{}, nil
	}
	space.mu.Lock()
	defer space.mu.Unlock()
	a := lookup(p)
	if a == nil {
		return span{}, newErr(call, errInvalidValue, "address %#x is in no allocation", uint64(p))
	}
	off := int(p - a.base)
	if n > a.size-off {
		return span{}, newErr(call, errInvalidValue, "[%#x, +%d) runs %d bytes past the end of the allocation at %#x (%d bytes)", uint64(p), n, n-(a.size-off), uint64(a.base), a.size)
	}
	a.refs++
	return span{a: a, bytes: a.mem[off : off+n : off+n]}, nil
}

func (s span) release() {
	if s.a == nil {
		return
	}
	space.mu.Lock()
	defer space.mu.Unlock()
	s.a.refs--
	if s.a.dead && s.a.refs == 0 {
		s.a.unmap()
	}
}

// newMemfd creates a memfd of n bytes named name and maps it.
func newMemfd(name string, n int) (fd int, mem []byte, err error) {
	fd, err = unix.MemfdCreate(name, unix.MFD_CLOEXEC)
	if err != nil {
		return -1, nil, fmt.Errorf("memfd_create: %w", err)
	}
	if err := unix.Ftruncate(fd, int64(n)); err != nil {
		unix.Close(fd)
		return -1, nil, fmt.Errorf("ftruncate memfd to %d bytes: %w", n, err)
	}
	mem, err = unix.Mmap(fd, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		unix.Close(fd)
		return -1, nil, fmt.Errorf("mmap memfd of %d bytes: %w", n, err)
	}
	return fd, mem, nil
}

// openPeerFd opens fd of process pid through /proc and returns it with the
// memfd's name (from its /proc link, "/memfd:NAME (deleted)") and size.
func openPeerFd(pid, fd int) (f int, name string, size int64, err error) {
	path := fmt.Sprintf("/proc/%d/fd/%d", pid, fd)
	link, err := os.Readlink(path)
	if err != nil {
		return -1, "", 0, fmt.Errorf("read link %s: %w", path, err)
	}
	name, ok := strings.CutPrefix(link, "/memfd:")
	if !ok {
		return -1, "", 0, fmt.Errorf("%s is %q, not a memfd", path, link)
	}
	name = strings.TrimSuffix(name, " (deleted)")
	f, err = unix.Open(path, unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, "", 0, fmt.Errorf("open %s: %w", path, err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(f, &st); err != nil {
		unix.Close(f)
		return -1, "", 0, fmt.Errorf("stat %s: %w", path, err)
	}
	return f, name, st.Size, nil
}

// memHandle builds a's IPC handle.
func memHandle(a *alloc) gpu.IpcMemHandle {
	var h gpu.IpcMemHandle
	copy(h[0:8], memMagic)
	binary.LittleEndian.PutUint32(h[8:], uint32(os.Getpid()))
	binary.LittleEndian.PutUint32(h[12:], uint32(int32(a.fd)))
	binary.LittleEndian.PutUint64(h[16:], uint64(a.size))
	binary.LittleEndian.PutUint64(h[24:], a.id)
	return h
}

// parsedMem is a decoded memory handle.
type parsedMem struct {
	pid, fd int
	size    uint64
	id      uint64
}

func parseMemHandle(h gpu.IpcMemHandle) (parsedMem, error) {
	if string(h[0:8]) != memMagic {
		return parsedMem{}, fmt.Errorf("not a fake memory handle (magic %q)", h[0:8])
	}
	for _, b := range h[32:] {
		if b != 0 {
			return parsedMem{}, fmt.Errorf("memory handle has non-zero bytes past offset 32")
		}
	}
	return parsedMem{
		pid:  int(binary.LittleEndian.Uint32(h[8:])),
		fd:   int(int32(binary.LittleEndian.Uint32(h[12:]))),
		size: binary.LittleEndian.Uint64(h[16:]),
		id:   binary.LittleEndian.Uint64(h[24:]),
	}, nil
}

// checkMemName checks a memfd's name against the handle when the name has
// the fake's own form "hvdd-fake-mem-<pid>-<id>".
func checkMemName(name string, p parsedMem) error {
	rest, ok := strings.CutPrefix(name, "hvdd-fake-mem-")
	if !ok {
		return nil
	}
	pid, id, ok := strings.Cut(rest, "-")
	if !ok {
		return nil
	}
	if pid != strconv.Itoa(p.pid) || id != strconv.FormatUint(p.id, 10) {
		return fmt.Errorf("fd %d of pid %d is allocation %s-%s now, not %d-%d (freed, its fd reused)", p.fd, p.pid, pid, id, p.pid, p.id)
	}
	return nil
}

// futex operations on the low 32-bit half of a uint64 in shared memory
// (not FUTEX_PRIVATE: waiters and wakers may be in other processes).

func futexWait(addr *uint64, val uint32, ns int64) {
	ts := unix.NsecToTimespec(ns)
	unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(addr)), uintptr(futexWaitOp), uintptr(val), uintptr(unsafe.Pointer(&ts)), 0, 0)
}

func futexWake(addr *uint64) {
	unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(addr)), uintptr(futexWakeOp), uintptr(1<<31-1), 0, 0, 0)
}

func closeFd(fd int) { unix.Close(fd) }

func mmapShared(fd, n int) ([]byte, error) {
	mem, err := unix.Mmap(fd, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("mmap %d bytes: %w", n, err)
	}
	return mem, nil
}

func unmapBytes(mem []byte) { unix.Munmap(mem) }

const (
	futexWaitOp = 0 // FUTEX_WAIT
	futexWakeOp = 1 // FUTEX_WAKE
)
