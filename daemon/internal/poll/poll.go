// Package poll is the daemon loop's epoll set and its mailbox: an eventfd
// through which other goroutines post messages to the loop.
package poll

import (
	"fmt"
	"sync"

	"golang.org/x/sys/unix"
)

// Poller is the loop's epoll set: every client socket plus an eventfd that
// other goroutines write to hand the loop a message (see Post).
type Poller struct {
	epfd   int
	Evfd   int // the mailbox's eventfd, readable when a message waits
	events []unix.EpollEvent

	// mu guards the fields that follow.
	mu     sync.Mutex
	inbox  []any
	closed bool // the descriptors are closed: post drops its message
}

// NewPoller makes the epoll set and its eventfd mailbox.
func NewPoller() (*Poller, error) {
	epfd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("daemon: epoll_create: %w", err)
	}
	evfd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		unix.Close(epfd)
		return nil, fmt.Errorf("daemon: eventfd: %w", err)
	}
	p := &Poller{epfd: epfd, Evfd: evfd, events: make([]unix.EpollEvent, 64)}
	if err := p.Add(evfd); err != nil {
		p.Close()
		return nil, err
	}
	return p, nil
}

// Add watches fd for input and hang-up.
func (p *Poller) Add(fd int) error {
	ev := unix.EpollEvent{Events: unix.EPOLLIN | unix.EPOLLRDHUP, Fd: int32(fd)}
	if err := unix.EpollCtl(p.epfd, unix.EPOLL_CTL_ADD, fd, &ev); err != nil {
		return fmt.Errorf("daemon: epoll add fd %d: %w", fd, err)
	}
	return nil
}

// Del stops watching fd.
func (p *Poller) Del(fd int) {
	unix.EpollCtl(p.epfd, unix.EPOLL_CTL_DEL, fd, nil)
}

// Wait returns the ready events; timeoutMs 0 polls, -1 blocks.
func (p *Poller) Wait(timeoutMs int) ([]unix.EpollEvent, error) {
	for {
		n, err := unix.EpollWait(p.epfd, p.events, timeoutMs)
		if err == unix.EINTR {
			if timeoutMs == 0 {
				return nil, nil
			}
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("daemon: epoll_wait: %w", err)
		}
		return p.events[:n], nil
	}
}

// Post queues m for the loop and wakes it. Safe from any goroutine, also
// after close (a scrape may ask a loop that is ending): the message is then
// dropped, and the eventfd's number, which may belong to another file by
// then, is left alone.
func (p *Poller) Post(m any) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return
	}
	p.inbox = append(p.inbox, m)
	var one = [8]byte{1}
	unix.Write(p.Evfd, one[:])
}

// Drain takes the queued messages and resets the eventfd.
func (p *Poller) Drain() []any {
	var buf [8]byte
	unix.Read(p.Evfd, buf[:])
	p.mu.Lock()
	m := p.inbox
	p.inbox = nil
	p.mu.Unlock()
	return m
}

// Close closes the descriptors; a later Post drops its message.
func (p *Poller) Close() {
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	unix.Close(p.Evfd)
	unix.Close(p.epfd)
}
