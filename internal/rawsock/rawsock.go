// Package rawsock holds socket descriptors outside Go's network poller.
// ipc.Conn (client <-> daemon) and cluster.Link (daemon <-> daemon) own
// theirs this way, so that the daemon's loop can watch them in its own epoll
// set and the poller does not wake a runtime thread for every message.
package rawsock

import (
	"fmt"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

// Detach duplicates the descriptor of c out of Go's network poller
// (close-on-exec, non-blocking) and closes c. The caller owns the result.
func Detach(c interface {
	syscall.Conn
	Close() error
}) (int, error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return -1, err
	}
	fd := -1
	var derr error
	if err := rc.Control(func(f uintptr) { fd, derr = unix.FcntlInt(f, unix.F_DUPFD_CLOEXEC, 0) }); err != nil {
		return -1, err
	}
	if derr != nil {
		return -1, fmt.Errorf("duplicate socket: %w", derr)
	}
	if err := unix.SetNonblock(fd, true); err != nil {
		unix.Close(fd)
		return -1, err
	}
	c.Close()
	return fd, nil
}

// Pin guards a descriptor that one goroutine may close while others make
// system calls on it: each call runs between Hold and Release, and Close
// waits for them to finish, so that a descriptor number is never used after
// the kernel may have given it to another file.
type Pin struct {
	mu     sync.RWMutex
	closed bool
}

// Hold pins the descriptor for one system call; it reports false once
// Close has begun, and then the descriptor must not be used.
func (p *Pin) Hold() bool {
	p.mu.RLock()
	if p.closed {
		p.mu.RUnlock()
		return false
	}
	return true
}

// Release ends a Hold that succeeded.
func (p *Pin) Release() { p.mu.RUnlock() }

// Close waits for every Hold to be released, then runs closeFD (once: later
// calls do nothing); Holds fail from then on.
func (p *Pin) Close(closeFD func()) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.closed {
		p.closed = true
		closeFD()
	}
}
