package cluster

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/proto"

	"github.com/hvdd/hvdd/cluster/clusterpb"
	"github.com/hvdd/hvdd/internal/rawsock"
)

// Link is one authenticated control connection. Send may be called from any
// goroutine. A link is read either with Recv, from one goroutine at a time,
// or by an event loop that watches FD and calls TryRecv and Silent.
//
// After the handshake a Link owns its socket descriptor outright, outside
// Go's network poller: the daemon's loop watches it in its own epoll set, and
// the poller would otherwise wake a runtime thread for every message as
// well, which on two busy vCPUs costs more than the message. Waits use
// poll(2) with an eventfd that Close rings.
type Link struct {
	cfg  Config
	peer string

	// pin is held around every system call on fd; Close closes the
	// descriptor once no call is using it.
	pin  rawsock.Pin
	fd   int
	intr int // eventfd, rung once by Close: wakes blocked waits for good

	// wmu guards writes.
	wmu  sync.Mutex
	wbuf []byte
	// direct, if set, sends a whole frame instead of the socket (see
	// DirectWriter).
	direct func([]byte) error
	// expect, if set, tells the connection whether the link awaits
	// messages (see Expecter); expecting is what it was told last. Close
	// clears expect: the connection is told nothing more.
	emu       sync.Mutex
	expect    func(bool)
	expecting bool

	// Read side, one reader at a time: bytes received and not yet decoded
	// are pb[pr:]; heard is when a byte last arrived.
	pb    []byte
	pr    int
	heard time.Time

	// Round-trip time, from heartbeat echoes (see clusterpb.Heartbeat):
	// born is the zero of this end's clock; rtt the last round trip
	// measured (ns, 0 until one is). hbMu guards the last heartbeat the
	// peer sent (its clock value, and when it arrived), which this end's
	// next heartbeat echoes.
	born     time.Time
	rtt      atomic.Int64
	hbMu     sync.Mutex
	peerSent int64
	peerAt   time.Time

	stop chan struct{}
	once sync.Once
}

// DirectWriter is a connection whose writes travel some other way than its
// descriptor: the MPI bridge (backends/mpi) sends each as an MPI message on
// the writer's thread, saving a hand-off to a pump per control message. A
// Link over one sends each frame with DirectWrite and only reads the
// descriptor; the handshake's writes must have gone the same way (Write).
type DirectWriter interface {
	DirectWrite(b []byte) error
}

// Expecter is a connection that wants to know when its reader awaits
// messages: the MPI bridge, which has to poll for them, polls often then and
// rarely otherwise. Expect(true) and Expect(false) alternate.
type Expecter interface {
	Expect(on bool)
}

// tryReadChunk is the least room a read offers the kernel.
const tryReadChunk = 64 << 10

// newLink takes over an authenticated connection: its descriptor is
// duplicated out of Go's network poller and c is closed.
func newLink(c net.Conn, cfg Config, peer string) (*Link, error) {
	if tc, ok := c.(*net.TCPConn); ok {
		tc.SetNoDelay(true)
	}
	sc, ok := c.(interface {
		syscall.Conn
		Close() error
	})
	if !ok {
		return nil, fmt.Errorf("cluster: link to %s has no descriptor", peer)
	}
	intr, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		return nil, fmt.Errorf("cluster: link to %s: eventfd: %w", peer, err)
	}
	fd, err := rawsock.Detach(sc)
	if err != nil {
		unix.Close(intr)
		return nil, fmt.Errorf("cluster: link to %s: %w", peer, err)
	}
	now := time.Now()
	l := &Link{cfg: cfg, peer: peer, fd: fd, intr: intr, stop: make(chan struct{}), heard: now, born: now}
	if dw, ok := c.(DirectWriter); ok {
		l.direct = dw.DirectWrite
	}
	if e, ok := c.(Expecter); ok {
		l.expect = e.Expect
	}
	go l.heartbeat()
	return l, nil
}

// Peer is the remote address.
func (l *Link) Peer() string { return l.peer }

// FD returns the link's socket descriptor, for an event loop's epoll set. It
// stays the link's: the loop must stop watching it before Close.
func (l *Link) FD() int { return l.fd }

// hold pins the descriptor for one system call; it fails once Close began.
func (l *Link) hold() bool { return l.pin.Hold() }

func (l *Link) unhold() { l.pin.Release() }

var (
	errLinkClosed = errors.New("link closed")
	errTimeout    = errors.New("timed out")
)

// wait sleeps in poll(2) until the socket has one of events, Close is
// called, or deadline passes.
func (l *Link) wait(events int16, deadline time.Time) error {
	if !l.hold() {
		return errLinkClosed
	}
	defer l.unhold()
	pfd := []unix.PollFd{{Fd: int32(l.fd), Events: events}, {Fd: int32(l.intr), Events: unix.POLLIN}}
	for {
		left := time.Until(deadline)
		if left <= 0 {
			return errTimeout
		}
		// Round up, so that a wait never spins on a timeout of 0.
		n, err := unix.Poll(pfd, int((left+time.Millisecond-1)/time.Millisecond))
		switch {
		case err == unix.EINTR || err == nil && n == 0:
			continue
		case err != nil:
			return fmt.Errorf("poll: %w", err)
		case pfd[1].Revents != 0:
			return errLinkClosed
		}
		return nil
	}
}

func (l *Link) heartbeat() {
	t := time.NewTicker(l.cfg.Heartbeat)
	defer t.Stop()
	for {
		select {
		case <-l.stop:
			return
		case <-t.C:
			if l.Send(&clusterpb.Message{Msg: &clusterpb.Message_Heartbeat{Heartbeat: l.nextHeartbeat(time.Now())}}) != nil {
				return
			}
		}
	}
}

// nextHeartbeat is the heartbeat to send at now: this end's clock, and the
// echo of the last heartbeat the peer sent with how long it was held.
func (l *Link) nextHeartbeat(now time.Time) *clusterpb.Heartbeat {
	hb := &clusterpb.Heartbeat{Sent: int64(now.Sub(l.born)) + 1}
	l.hbMu.Lock()
	if l.peerSent != 0 {
		hb.Echo, hb.Held = l.peerSent, int64(now.Sub(l.peerAt))
	}
	l.hbMu.Unlock()
	return hb
}

// heartbeatIn takes a heartbeat that arrived at at: it keeps the peer's
// clock for the next echo, and an echo of ours gives the round-trip time.
// A heartbeat without fields (an older daemon) changes nothing.
func (l *Link) heartbeatIn(hb *clusterpb.Heartbeat, at time.Time) {
	if s := hb.GetSent(); s != 0 {
		l.hbMu.Lock()
		l.peerSent, l.peerAt = s, at
		l.hbMu.Unlock()
	}
	if e := hb.GetEcho(); e != 0 {
		if rtt := int64(at.Sub(l.born)) + 1 - e - hb.GetHeld(); rtt > 0 {
			l.rtt.Store(rtt)
		}
	}
}

// RTT returns the link's last round-trip time measured by heartbeats (the
// peer's echo of one of ours, less the time the peer held it): the network
// both ways plus the time each side took to read. It is 0 until one has
// been measured, and stays 0 with a peer that does not echo (an older
// daemon). It is updated as heartbeats are read (Recv, TryRecv), once per
// heartbeat period. Safe from any goroutine.
func (l *Link) RTT() time.Duration { return time.Duration(l.rtt.Load()) }

// Expect says whether the link's reader now awaits messages from the peer,
// for a connection that wants to know (Expecter); for others it does
// nothing. Close ends the expecting.
func (l *Link) Expect(on bool) {
	l.emu.Lock()
	defer l.emu.Unlock()
	if l.expect != nil && l.expecting != on {
		l.expecting = on
		l.expect(on)
	}
}

// Send writes one message. A peer that takes none of it for PeerTimeout is
// reported lost.
func (l *Link) Send(m *clusterpb.Message) error {
	l.wmu.Lock()
	defer l.wmu.Unlock()
	b := append(l.wbuf[:0], 0, 0, 0, 0)
	b, err := proto.MarshalOptions{}.MarshalAppend(b, m)
	if err != nil {
		return fmt.Errorf("cluster: encode: %w", err)
	}
	if len(b)-4 > MaxMessage {
		return fmt.Errorf("cluster: message of %d bytes exceeds %d", len(b)-4, MaxMessage)
	}
	binary.BigEndian.PutUint32(b, uint32(len(b)-4))
	l.wbuf = b
	if l.direct != nil {
		if !l.hold() {
			return fmt.Errorf("cluster: send to %s: %w", l.peer, errLinkClosed)
		}
		defer l.unhold()
		if err := l.direct(b); err != nil {
			return fmt.Errorf("cluster: send to %s: %w", l.peer, err)
		}
		return nil
	}
	deadline := time.Now().Add(l.cfg.PeerTimeout)
	for len(b) > 0 {
		if !l.hold() {
			return fmt.Errorf("cluster: send to %s: %w", l.peer, errLinkClosed)
		}
		n, err := unix.SendmsgN(l.fd, b, nil, nil, unix.MSG_DONTWAIT|unix.MSG_NOSIGNAL)
		l.unhold()
		switch {
		case err == unix.EAGAIN:
			if err := l.wait(unix.POLLOUT, deadline); err != nil {
				if errors.Is(err, errTimeout) {
					return fmt.Errorf("cluster: send to %s: it took nothing for %v: node or link lost", l.peer, l.cfg.PeerTimeout)
				}
				return fmt.Errorf("cluster: send to %s: %w", l.peer, err)
			}
		case err == unix.EINTR:
		case err != nil:
			return fmt.Errorf("cluster: send to %s: %w", l.peer, err)
		default:
			b = b[n:]
			deadline = time.Now().Add(l.cfg.PeerTimeout)
		}
	}
	return nil
}

// Recv returns the next message other than a heartbeat, waiting for it. It
// fails when the peer closes the link, breaks the framing, or stays silent
// (no heartbeat either) for PeerTimeout, and when Close is called.
func (l *Link) Recv() (*clusterpb.Message, error) {
	for {
		m, err := l.TryRecv()
		if m != nil || err != nil {
			return m, err
		}
		if err := l.wait(unix.POLLIN, l.heard.Add(l.cfg.PeerTimeout)); err != nil {
			if errors.Is(err, errTimeout) {
				return nil, l.Silent(time.Now())
			}
			return nil, fmt.Errorf("cluster: receive from %s: %w", l.peer, err)
		}
	}
}

// TryRecv returns the next complete message other than a heartbeat, reading
// only what the socket already holds: it never blocks, and it returns nil,
// nil when no whole message has arrived yet. An event loop calls it until
// then each time FD is readable. It fails like Recv, except for silence,
// which Silent reports.
func (l *Link) TryRecv() (*clusterpb.Message, error) {
	for {
		m, need, err := l.buffered()
		if m != nil || err != nil {
			return m, err
		}
		l.room(need)
		n, err := l.readAvailable()
		if err != nil || n == 0 {
			return nil, err
		}
	}
}

// Buffered reports whether a whole frame waits in the link's buffer (or a
// header TryRecv will refuse): TryRecv then answers without reading the
// socket. An event loop that stops calling TryRecv when nothing is buffered
// saves the read that would find the socket empty; bytes still in the
// socket make a level-triggered epoll report it again.
func (l *Link) Buffered() bool {
	avail := l.pb[l.pr:]
	if len(avail) < 4 {
		return false
	}
	n := binary.BigEndian.Uint32(avail)
	return n > MaxMessage || len(avail) >= 4+int(n)
}

// buffered decodes the next whole frame in pb[pr:], skipping heartbeats.
// With none there it returns how many bytes the frame in progress needs in
// all (header and body).
func (l *Link) buffered() (*clusterpb.Message, int, error) {
	for {
		avail := l.pb[l.pr:]
		if len(avail) < 4 {
			return nil, 4, nil
		}
		n := binary.BigEndian.Uint32(avail)
		if n > MaxMessage {
			return nil, 0, fmt.Errorf("cluster: %s sent a %d-byte message (limit %d)", l.peer, n, MaxMessage)
		}
		if len(avail) < 4+int(n) {
			return nil, 4 + int(n), nil
		}
		m, err := l.decode(avail[4 : 4+n])
		l.pr += 4 + int(n)
		if l.pr == len(l.pb) {
			l.pb, l.pr = l.pb[:0], 0
		}
		if m != nil || err != nil {
			return m, 0, err
		}
	}
}

// decode parses one message body; a heartbeat decodes to nil.
func (l *Link) decode(b []byte) (*clusterpb.Message, error) {
	m := new(clusterpb.Message)
	if err := proto.Unmarshal(b, m); err != nil || m.Msg == nil {
		return nil, fmt.Errorf("cluster: undecodable message from %s: %v", l.peer, err)
	}
	if hb, ok := m.Msg.(*clusterpb.Message_Heartbeat); ok {
		// It arrived with the read that brought it: l.heard.
		l.heartbeatIn(hb.Heartbeat, l.heard)
		return nil, nil
	}
	return m, nil
}

// room makes pb able to hold the frame in progress (need bytes from pr) with
// space left to read into: it moves the unread bytes to the front, or grows
// pb to at least tryReadChunk.
func (l *Link) room(need int) {
	if l.pr+need <= cap(l.pb) {
		// The frame is incomplete, so pb is not full either.
		return
	}
	unread := l.pb[l.pr:]
	if size := max(need, tryReadChunk); size > cap(l.pb) {
		nb := make([]byte, len(unread), size)
		copy(nb, unread)
		l.pb, l.pr = nb, 0
		return
	}
	n := copy(l.pb, unread)
	l.pb, l.pr = l.pb[:n], 0
}

// readAvailable appends what the socket holds to pb without blocking; it
// returns 0 when nothing is there.
func (l *Link) readAvailable() (int, error) {
	for {
		if !l.hold() {
			return 0, fmt.Errorf("cluster: receive from %s: %w", l.peer, errLinkClosed)
		}
		n, err := unix.Read(l.fd, l.pb[len(l.pb):cap(l.pb)])
		l.unhold()
		switch {
		case err == unix.EINTR:
			continue
		case err == unix.EAGAIN:
			return 0, nil
		case err == unix.ECONNRESET || err == nil && n == 0:
			return 0, fmt.Errorf("cluster: %s closed the connection", l.peer)
		case err != nil:
			return 0, fmt.Errorf("cluster: receive from %s: %w", l.peer, err)
		}
		l.pb = l.pb[:len(l.pb)+n]
		l.heard = time.Now()
		return n, nil
	}
}

// Silent reports an error naming the peer once nothing, not even a
// heartbeat, has arrived for PeerTimeout. An event loop reading with TryRecv
// calls it periodically, after draining the socket.
func (l *Link) Silent(now time.Time) error {
	if now.Sub(l.heard) < l.cfg.PeerTimeout {
		return nil
	}
	return fmt.Errorf("cluster: %s silent for %v (no heartbeat): node or link lost", l.peer, l.cfg.PeerTimeout)
}

// Close closes the link; a blocked Recv or Send returns an error.
func (l *Link) Close() error {
	var err error
	l.once.Do(func() {
		l.Expect(false)
		l.emu.Lock()
		l.expect = nil
		l.emu.Unlock()
		close(l.stop)
		// Wake a wait in poll for good, then close once no call is using
		// the descriptor.
		unix.Write(l.intr, []byte{1, 0, 0, 0, 0, 0, 0, 0})
		l.pin.Close(func() {
			err = unix.Close(l.fd)
			unix.Close(l.intr)
			l.fd, l.intr = -1, -1
		})
	})
	return err
}
