// Package shm creates, checks and maps shared-memory regions: memfd files that a
// client and the daemon both map, so tensor bytes never cross the socket.
//
// A Region is one mapping. Regions made with Create are sealed against shrinking
// (F_SEAL_SHRINK), so the peer that receives the fd cannot be made to fault by a
// later ftruncate; Open refuses an fd without that seal. An Arena hands out
// aligned byte ranges of a region. The package knows nothing of the protocol that
// names regions, nor of tensors.
package shm

import (
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// MaxRegion is the largest region Open accepts (1 TiB); larger claims are refused
// as absurd rather than attempted.
const MaxRegion = 1 << 40

// ErrNotSealed is returned by Open for a descriptor that may still shrink.
var ErrNotSealed = errors.New("shm: region fd lacks F_SEAL_SHRINK")

// Region is a shared mapping of a memfd. The zero value is not usable; get one
// from Create or Open. Close unmaps it and closes the descriptor.
type Region struct {
	fd   int
	data []byte
}

// Create makes a new memfd of size bytes, seals it against shrinking and maps it
// read-write. The name shows in /proc/<pid>/fd for debugging only.
func Create(name string, size int64) (*Region, error) {
	if size <= 0 || size > MaxRegion {
		return nil, fmt.Errorf("shm: create %q: size %d out of range (1..%d)", name, size, int64(MaxRegion))
	}
	fd, err := unix.MemfdCreate(name, unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return nil, fmt.Errorf("shm: memfd_create %q: %w", name, err)
	}
	if err := unix.Ftruncate(fd, size); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("shm: ftruncate %q to %d: %w", name, size, err)
	}
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, unix.F_SEAL_SHRINK|unix.F_SEAL_SEAL); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("shm: seal %q: %w", name, err)
	}
	r, err := mapFD(fd, size)
	if err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("shm: create %q: %w", name, err)
	}
	return r, nil
}

// Open checks and maps an fd received from a peer, taking ownership of it (it is
// closed on error). The fd must be a regular file of at least size bytes sealed
// with F_SEAL_SHRINK; anything else (a socket, a pipe, a short or unsealed file)
// is refused with an error saying why.
func Open(fd int, size int64) (*Region, error) {
	r, err := open(fd, size)
	if err != nil {
		unix.Close(fd)
		return nil, err
	}
	return r, nil
}

func open(fd int, size int64) (*Region, error) {
	if size <= 0 || size > MaxRegion {
		return nil, fmt.Errorf("shm: region size %d out of range (1..%d)", size, int64(MaxRegion))
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, fmt.Errorf("shm: fstat fd %d: %w", fd, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return nil, fmt.Errorf("shm: fd %d is not a memfd (file mode %#o)", fd, st.Mode&unix.S_IFMT)
	}
	if st.Size < size {
		return nil, fmt.Errorf("shm: fd %d holds %d bytes, fewer than the %d claimed", fd, st.Size, size)
	}
	seals, err := unix.FcntlInt(uintptr(fd), unix.F_GET_SEALS, 0)
	if err != nil {
		return nil, fmt.Errorf("shm: fd %d: %w (%v)", fd, ErrNotSealed, err)
	}
	if seals&unix.F_SEAL_SHRINK == 0 {
		return nil, fmt.Errorf("shm: fd %d: %w", fd, ErrNotSealed)
	}
	unix.CloseOnExec(fd)
	return mapFD(fd, size)
}

func mapFD(fd int, size int64) (*Region, error) {
	data, err := unix.Mmap(fd, 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("mmap %d bytes: %w", size, err)
	}
	return &Region{fd: fd, data: data}, nil
}

// Bytes returns the whole mapping. It stays valid until Close.
func (r *Region) Bytes() []byte { return r.data }

// Size is the mapped length in bytes.
func (r *Region) Size() int64 { return int64(len(r.data)) }

// FD is the region's descriptor, for passing to a peer with SCM_RIGHTS. It stays
// owned by the Region.
func (r *Region) FD() int { return r.fd }

// Slice returns the bytes [off, off+n) after checking that they lie inside the
// region; overflowing or out-of-range requests get an error naming the bounds.
func (r *Region) Slice(off, n uint64) ([]byte, error) {
	size := uint64(len(r.data))
	if off > size || n > size-off {
		return nil, fmt.Errorf("shm: range [%d, %d+%d) outside region of %d bytes", off, off, n, size)
	}
	return r.data[off : off+n : off+n], nil
}

// Close unmaps the region and closes its descriptor. Slices obtained from it
// must no longer be used.
func (r *Region) Close() error {
	var errs []error
	if r.data != nil {
		errs = append(errs, unix.Munmap(r.data))
		r.data = nil
	}
	if r.fd >= 0 {
		errs = append(errs, unix.Close(r.fd))
		r.fd = -1
	}
	return errors.Join(errs...)
}

// PageSize returns the system page size in bytes.
func PageSize() int { return os.Getpagesize() }

// RoundToPages returns n rounded up to a whole number of pages: the size of
// the smallest region that holds n bytes. n must not be negative.
func RoundToPages(n int64) int64 {
	page := int64(PageSize())
	return (n + page - 1) / page * page
}
