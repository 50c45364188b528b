// Package ipc frames hvdd's client <-> daemon messages on a Unix stream socket
// and passes file descriptors beside them. PROTOCOL.md in this directory is the
// wire specification; ipcpb holds the generated protobuf messages.
//
// The package knows frames, messages and descriptors. It does not know what a
// region or a collective is: shm maps the descriptors, the daemon and the
// clients give the messages meaning.
package ipc

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/proto"

	"github.com/hvdd/hvdd/internal/rawsock"
	"github.com/hvdd/hvdd/ipc/ipcpb"
)

// Version is the protocol version this package speaks (Hello.version).
const Version = 1

// Frame layout constants; see PROTOCOL.md.
const (
	HeaderSize = 12
	MaxBody    = 4 << 20
	MaxFDs     = 16

	KindClient = 1 // body is an ipcpb.ClientMessage
	KindServer = 2 // body is an ipcpb.ServerMessage
	KindWake   = 3 // no body: a Channel's doorbell (see Channel)

	magic0, magic1 = 'H', 'V'
)

// ErrClosed is returned after Close or when the peer has closed the connection.
var ErrClosed = errors.New("ipc: connection closed")

// ProtocolError is a violation of the wire protocol by the peer: the connection
// cannot be trusted further and should be answered with a Fatal and closed.
type ProtocolError struct{ Msg string }

func (e *ProtocolError) Error() string { return "ipc: protocol error: " + e.Msg }

// IsProtocol reports whether err is (or wraps) a ProtocolError.
func IsProtocol(err error) bool {
	var pe *ProtocolError
	return errors.As(err, &pe)
}

func protoErrf(format string, args ...any) error {
	return &ProtocolError{Msg: fmt.Sprintf(format, args...)}
}

// Conn is one end of a framed connection. ReadFrame, PopFD and the Read*
// helpers must be called from one goroutine; the Write* methods may be called
// from any number of goroutines.
//
// A Conn owns its socket descriptor outright, outside Go's network poller:
// the poller would be woken (and would wake a runtime thread) by every frame
// and every drained write queue, which on a busy job costs more than the frame
// itself. Reads that must wait use poll(2) with an eventfd that cancellation
// rings; writes use MSG_DONTWAIT and poll for room.
type Conn struct {
	// pin is held around every system call on fd; Close closes the
	// descriptor once no call is using it.
	pin    rawsock.Pin
	fd     int
	intr   int // eventfd: a write interrupts a blocked read
	closed atomic.Bool

	// WriteTimeout bounds each write; a peer that stops reading for this long
	// is treated as gone. Zero means no bound.
	WriteTimeout time.Duration

	// Read side, owned by the reading goroutine.
	rbuf []byte
	r, w int // unread bytes are rbuf[r:w]
	oob  []byte
	fds  []int
	eof  bool

	// wmu guards the write side.
	wmu  sync.Mutex
	wbuf []byte
}

// NewConn takes over a connected Unix stream socket: its descriptor is
// duplicated out of Go's network poller and uc is closed.
func NewConn(uc *net.UnixConn) (*Conn, error) {
	fd, err := rawsock.Detach(uc)
	if err != nil {
		return nil, fmt.Errorf("ipc: %w", err)
	}
	c, err := NewConnFD(fd)
	if err != nil {
		unix.Close(fd)
		return nil, err
	}
	return c, nil
}

// NewConnFD wraps a connected Unix stream socket descriptor, which the Conn
// then owns.
func NewConnFD(fd int) (*Conn, error) {
	intr, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		return nil, fmt.Errorf("ipc: eventfd: %w", err)
	}
	return &Conn{
		fd:   fd,
		intr: intr,
		rbuf: make([]byte, 64<<10),
		oob:  make([]byte, unix.CmsgSpace(MaxFDs*4)),
	}, nil
}

// FD is the socket's descriptor, for an event loop to watch. It stays valid
// until Close.
func (c *Conn) FD() int { return c.fd }

// hold pins the descriptor for one system call; it fails once Close began.
func (c *Conn) hold() bool { return c.pin.Hold() }

func (c *Conn) unhold() { c.pin.Release() }

// Frame is one decoded frame. Body aliases the Conn's buffer and is valid until
// the next ReadFrame.
type Frame struct {
	Kind uint8
	ID   uint32
	Body []byte
}

// makeRoom compacts or grows rbuf so that a read has space.
func (c *Conn) makeRoom() {
	if c.r > 0 && c.r == c.w {
		c.r, c.w = 0, 0
	}
	if c.w == len(c.rbuf) {
		if c.r > 0 {
			copy(c.rbuf, c.rbuf[c.r:c.w])
			c.w -= c.r
			c.r = 0
		} else {
			nb := make([]byte, 2*len(c.rbuf))
			copy(nb, c.rbuf[:c.w])
			c.rbuf = nb
		}
	}
}

// fill reads more bytes (and any descriptors riding on them) into rbuf,
// waiting until some arrive or ctx is done.
func (c *Conn) fill(ctx context.Context) error {
	for {
		got, err := c.fillNow()
		if err != nil || got {
			return err
		}
		if err := c.waitReadable(ctx); err != nil {
			return err
		}
	}
}

// waitReadable sleeps in poll(2) until the socket is readable (or hung up),
// ctx is done, or Close is called.
func (c *Conn) waitReadable(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if !c.hold() {
		return ErrClosed
	}
	defer c.unhold()
	if ctx.Done() != nil {
		stop := context.AfterFunc(ctx, c.interrupt)
		defer stop()
	}
	pfd := []unix.PollFd{{Fd: int32(c.fd), Events: unix.POLLIN}, {Fd: int32(c.intr), Events: unix.POLLIN}}
	for {
		_, err := unix.Poll(pfd, -1)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return fmt.Errorf("ipc: poll: %w", err)
		}
		break
	}
	if pfd[1].Revents != 0 {
		var b [8]byte
		unix.Read(c.intr, b[:])
		if err := ctx.Err(); err != nil {
			return err
		}
	}
	return nil
}

// interrupt wakes a read blocked in waitReadable.
func (c *Conn) interrupt() {
	if c.hold() {
		unix.Write(c.intr, []byte{1, 0, 0, 0, 0, 0, 0, 0})
		c.unhold()
	}
}

// received takes in what one recvmsg returned: n bytes (ignored when n <= 0,
// as on an error) and oobn bytes of ancillary data, whose descriptors are
// queued for PopFD.
func (c *Conn) received(n, oobn, flags int) error {
	if oobn > 0 {
		if err := c.takeFDs(c.oob[:oobn]); err != nil {
			return err
		}
	}
	if flags&unix.MSG_CTRUNC != 0 {
		return protoErrf("more than %d descriptors in one message", MaxFDs)
	}
	if n > 0 {
		c.w += n
	}
	return nil
}

func (c *Conn) takeFDs(oob []byte) error {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return protoErrf("bad control message: %v", err)
	}
	for _, m := range msgs {
		if m.Header.Level != unix.SOL_SOCKET || m.Header.Type != unix.SCM_RIGHTS {
			continue
		}
		fds, err := unix.ParseUnixRights(&m)
		if err != nil {
			return protoErrf("bad SCM_RIGHTS: %v", err)
		}
		c.fds = append(c.fds, fds...)
	}
	if len(c.fds) > MaxFDs {
		return protoErrf("%d descriptors received that no message claimed (at most %d)", len(c.fds), MaxFDs)
	}
	return nil
}

// fillNow reads whatever bytes are available without blocking. It reports
// whether it got any.
func (c *Conn) fillNow() (bool, error) {
	if c.eof {
		return false, ErrClosed
	}
	c.makeRoom()
	if !c.hold() {
		c.eof = true
		return false, ErrClosed
	}
	n, oobn, flags, _, rerr := unix.Recvmsg(c.fd, c.rbuf[c.w:], c.oob, unix.MSG_DONTWAIT|unix.MSG_CMSG_CLOEXEC)
	c.unhold()
	if rerr == unix.EAGAIN || rerr == unix.EINTR {
		return false, nil
	}
	if err := c.received(n, oobn, flags); err != nil {
		return false, err
	}
	if rerr != nil {
		if rerr == unix.ECONNRESET {
			c.eof = true
			return false, ErrClosed
		}
		return false, fmt.Errorf("ipc: read: %w", rerr)
	}
	if n <= 0 {
		c.eof = true
		return false, ErrClosed
	}
	return true, nil
}

// TryReadFrame returns the next frame if it is complete in the buffer or can be
// completed from bytes available now; ok is false when it would have to wait.
// Errors are those of ReadFrame. The frame's body is valid until the next read.
func (c *Conn) TryReadFrame() (f Frame, ok bool, err error) {
	for {
		f, ok, err = c.parse()
		if ok || err != nil {
			return f, ok, err
		}
		got, err := c.fillNow()
		if err != nil {
			if errors.Is(err, ErrClosed) && c.w > c.r {
				return Frame{}, false, protoErrf("connection closed inside a frame")
			}
			return Frame{}, false, err
		}
		if !got {
			return Frame{}, false, nil
		}
	}
}

// Buffered reports whether unread bytes are waiting in the Conn's buffer.
func (c *Conn) Buffered() bool { return c.w > c.r }

// parse decodes a frame from the buffer if a whole one is there.
func (c *Conn) parse() (Frame, bool, error) {
	if c.w-c.r < HeaderSize {
		return Frame{}, false, nil
	}
	f, n, err := parseHeader(c.rbuf[c.r : c.r+HeaderSize])
	if err != nil {
		return Frame{}, false, err
	}
	total := HeaderSize + int(n)
	if c.w-c.r < total {
		return Frame{}, false, nil
	}
	f.Body = c.rbuf[c.r+HeaderSize : c.r+total]
	c.r += total
	return f, true, nil
}

// parseHeader checks a frame header and returns the frame's kind and id and
// its body length.
func parseHeader(h []byte) (Frame, uint32, error) {
	if h[0] != magic0 || h[1] != magic1 {
		return Frame{}, 0, protoErrf("bad magic %#02x%02x (want \"HV\"): not an hvdd client, or a desynchronised stream", h[0], h[1])
	}
	f := Frame{Kind: h[2], ID: binary.LittleEndian.Uint32(h[4:8])}
	if f.Kind != KindClient && f.Kind != KindServer && f.Kind != KindWake {
		return Frame{}, 0, protoErrf("unknown frame kind %d", f.Kind)
	}
	if h[3] != 0 {
		return Frame{}, 0, protoErrf("reserved flags %#x set", h[3])
	}
	n := binary.LittleEndian.Uint32(h[8:12])
	if n > MaxBody {
		return Frame{}, 0, protoErrf("frame body of %d bytes exceeds the %d-byte limit", n, MaxBody)
	}
	if f.Kind == KindWake && n != 0 {
		return Frame{}, 0, protoErrf("wake frame with a %d-byte body", n)
	}
	return f, n, nil
}

// parseFrame checks a whole frame held in b (header and body, nothing more).
func parseFrame(b []byte) (Frame, error) {
	f, n, err := parseHeader(b[:HeaderSize])
	if err != nil {
		return Frame{}, err
	}
	if int(n) != len(b)-HeaderSize {
		return Frame{}, protoErrf("frame body of %d bytes in %d", n, len(b)-HeaderSize)
	}
	f.Body = b[HeaderSize:]
	return f, nil
}

// WriteWake sends a Channel's doorbell: a Wake frame, which the receiver takes
// as a reason to look at the ring and otherwise ignores.
func (c *Conn) WriteWake() error { return c.WriteRaw(wakeFrame[:], -1) }

// wakeFrame is the encoded Wake frame: a header with no body.
var wakeFrame = [HeaderSize]byte{magic0, magic1, KindWake}

// TryWriteWake sends a Wake frame if it can do so at once: not when another
// write holds the socket or its buffer is full, for then the peer has bytes
// to read and will look at the ring anyway. It never blocks.
func (c *Conn) TryWriteWake() {
	if !c.wmu.TryLock() {
		return
	}
	defer c.wmu.Unlock()
	if !c.hold() {
		return
	}
	defer c.unhold()
	unix.SendmsgN(c.fd, wakeFrame[:], nil, nil, unix.MSG_DONTWAIT|unix.MSG_NOSIGNAL)
}

// ReadFrame returns the next frame, blocking until it has arrived or ctx is
// done (then ctx's error). A malformed header or an oversized body is a
// *ProtocolError; a closed connection is ErrClosed.
func (c *Conn) ReadFrame(ctx context.Context) (Frame, error) {
	for {
		f, ok, err := c.parse()
		if err != nil {
			return Frame{}, err
		}
		if ok {
			return f, nil
		}
		if err := c.fill(ctx); err != nil {
			if errors.Is(err, ErrClosed) && c.w > c.r {
				return Frame{}, protoErrf("connection closed inside a frame")
			}
			return Frame{}, err
		}
	}
}

// PopFD takes the oldest received descriptor, which the caller then owns.
func (c *Conn) PopFD() (int, error) {
	if len(c.fds) == 0 {
		return -1, protoErrf("message needs a file descriptor but none was sent with it")
	}
	fd := c.fds[0]
	c.fds = c.fds[1:]
	return fd, nil
}

// ReadClient reads and decodes a ClientMessage frame (the daemon's side).
func (c *Conn) ReadClient(ctx context.Context) (uint32, *ipcpb.ClientMessage, error) {
	f, err := c.ReadFrame(ctx)
	if err != nil {
		return 0, nil, err
	}
	return DecodeClient(f)
}

// DecodeClient decodes a frame that should hold a ClientMessage.
func DecodeClient(f Frame) (uint32, *ipcpb.ClientMessage, error) {
	if f.Kind != KindClient {
		return 0, nil, protoErrf("frame kind %d where a client message (kind %d) was expected", f.Kind, KindClient)
	}
	m := new(ipcpb.ClientMessage)
	if err := proto.Unmarshal(f.Body, m); err != nil {
		return 0, nil, protoErrf("undecodable client message: %v", err)
	}
	if m.Msg == nil {
		return 0, nil, protoErrf("client message with no known content (unknown message type?)")
	}
	return f.ID, m, nil
}

// ReadServer reads and decodes a ServerMessage frame (the client's side).
func (c *Conn) ReadServer(ctx context.Context) (uint32, *ipcpb.ServerMessage, error) {
	f, err := c.ReadFrame(ctx)
	if err != nil {
		return 0, nil, err
	}
	return DecodeServer(f)
}

// DecodeServer decodes a frame that should hold a ServerMessage.
func DecodeServer(f Frame) (uint32, *ipcpb.ServerMessage, error) {
	if f.Kind != KindServer {
		return 0, nil, protoErrf("frame kind %d where a server message (kind %d) was expected", f.Kind, KindServer)
	}
	m := new(ipcpb.ServerMessage)
	if err := proto.Unmarshal(f.Body, m); err != nil {
		return 0, nil, protoErrf("undecodable server message: %v", err)
	}
	if m.Msg == nil {
		return 0, nil, protoErrf("server message with no known content")
	}
	return f.ID, m, nil
}

// appendFrame appends m as one frame of the given kind and id to b.
func appendFrame(b []byte, kind uint8, id uint32, m proto.Message) ([]byte, error) {
	start := len(b)
	b = append(b, magic0, magic1, kind, 0, 0, 0, 0, 0, 0, 0, 0, 0)
	b, err := proto.MarshalOptions{}.MarshalAppend(b, m)
	if err != nil {
		return b[:start], fmt.Errorf("ipc: encode: %w", err)
	}
	n := len(b) - start - HeaderSize
	if n > MaxBody {
		return b[:start], fmt.Errorf("ipc: message of %d bytes exceeds the %d-byte limit", n, MaxBody)
	}
	binary.LittleEndian.PutUint32(b[start+4:start+8], id)
	binary.LittleEndian.PutUint32(b[start+8:start+12], uint32(n))
	return b, nil
}

// WriteMessage encodes m into one frame of the given kind and sends it, with fd
// (if >= 0) as SCM_RIGHTS in the same sendmsg.
func (c *Conn) WriteMessage(kind uint8, id uint32, m proto.Message, fd int) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	b, err := appendFrame(c.wbuf[:0], kind, id, m)
	c.wbuf = b
	if err != nil {
		return err
	}
	return c.writeLocked(b, fd)
}

// WriteServerBatch sends several ServerMessages in one write: frame i gets
// ids[i]. It saves a system call (and a wake-up of the peer) per message when
// many answers are due at once.
func (c *Conn) WriteServerBatch(ids []uint32, ms []*ipcpb.ServerMessage) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	b := c.wbuf[:0]
	for i, m := range ms {
		var err error
		if b, err = appendFrame(b, KindServer, ids[i], m); err != nil {
			c.wbuf = b
			return err
		}
	}
	c.wbuf = b
	return c.writeLocked(b, -1)
}

// WriteRaw sends bytes as they are (tests use it to send malformed frames).
func (c *Conn) WriteRaw(b []byte, fd int) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	return c.writeLocked(b, fd)
}

func (c *Conn) writeLocked(b []byte, fd int) error {
	if !c.hold() {
		return ErrClosed
	}
	defer c.unhold()
	var deadline time.Time
	if c.WriteTimeout > 0 {
		deadline = time.Now().Add(c.WriteTimeout)
	}
	var oob []byte
	if fd >= 0 {
		oob = unix.UnixRights(fd)
	}
	for len(b) > 0 {
		// A stream socket may take part of a sendmsg; the descriptor goes
		// with the first byte, the rest follows as plain data.
		n, err := unix.SendmsgN(c.fd, b, oob, nil, unix.MSG_DONTWAIT|unix.MSG_NOSIGNAL)
		if n > 0 {
			b, oob = b[n:], nil
		}
		switch {
		case err == nil || err == unix.EINTR:
		case err == unix.EAGAIN:
			if err := c.waitWritable(deadline); err != nil {
				return err
			}
		case err == unix.EPIPE || err == unix.ECONNRESET || err == unix.ENOTCONN:
			return ErrClosed
		default:
			return fmt.Errorf("ipc: write: %w", err)
		}
	}
	return nil
}

// waitWritable sleeps until the socket has room, until deadline (zero: no
// bound). The caller holds the descriptor.
func (c *Conn) waitWritable(deadline time.Time) error {
	pfd := []unix.PollFd{{Fd: int32(c.fd), Events: unix.POLLOUT}}
	for {
		ms := -1
		if !deadline.IsZero() {
			left := time.Until(deadline)
			if left <= 0 {
				return fmt.Errorf("ipc: write: peer stopped reading for %v: %w", c.WriteTimeout, ErrClosed)
			}
			ms = int((left + time.Millisecond - 1) / time.Millisecond)
		}
		n, err := unix.Poll(pfd, ms)
		if err == unix.EINTR || n == 0 {
			continue
		}
		if err != nil {
			return fmt.Errorf("ipc: poll: %w", err)
		}
		return nil // writable, or hung up: the next sendmsg says which
	}
}

// WriteServer sends a ServerMessage (the daemon's side).
func (c *Conn) WriteServer(id uint32, m *ipcpb.ServerMessage, fd int) error {
	return c.WriteMessage(KindServer, id, m, fd)
}

// WriteClient sends a ClientMessage (the client's side).
func (c *Conn) WriteClient(id uint32, m *ipcpb.ClientMessage, fd int) error {
	return c.WriteMessage(KindClient, id, m, fd)
}

// PeerCred returns the credentials of the process at the other end, as the
// kernel recorded them at connect time.
func (c *Conn) PeerCred() (*unix.Ucred, error) {
	if !c.hold() {
		return nil, ErrClosed
	}
	defer c.unhold()
	cred, err := unix.GetsockoptUcred(c.fd, unix.SOL_SOCKET, unix.SO_PEERCRED)
	if err != nil {
		return nil, fmt.Errorf("ipc: SO_PEERCRED: %w", err)
	}
	return cred, nil
}

// PeerClosed waits up to d for the peer to close or shut down its end, and
// reports whether it has, without reading anything.
func (c *Conn) PeerClosed(d time.Duration) bool {
	if !c.hold() {
		return true
	}
	defer c.unhold()
	pfd := []unix.PollFd{{Fd: int32(c.fd), Events: unix.POLLRDHUP}}
	n, err := unix.Poll(pfd, int(d/time.Millisecond))
	return err == nil && n > 0 && pfd[0].Revents&(unix.POLLRDHUP|unix.POLLHUP|unix.POLLERR|unix.POLLNVAL) != 0
}

// CloseWrite shuts down the sending side: the peer reads the end of the
// stream after what was sent.
func (c *Conn) CloseWrite() error {
	if !c.hold() {
		return ErrClosed
	}
	defer c.unhold()
	return unix.Shutdown(c.fd, unix.SHUT_WR)
}

// Close closes the connection. A read or write blocked in another goroutine
// returns ErrClosed; the reading goroutine then calls CloseFDs.
func (c *Conn) Close() error {
	if c.closed.Swap(true) {
		return nil
	}
	// Wake whoever sleeps on the socket, then close it once they are out.
	if c.hold() {
		unix.Shutdown(c.fd, unix.SHUT_RDWR)
		unix.Write(c.intr, []byte{1, 0, 0, 0, 0, 0, 0, 0})
		c.unhold()
	}
	var err error
	c.pin.Close(func() {
		err = unix.Close(c.fd)
		unix.Close(c.intr)
		c.fd, c.intr = -1, -1
	})
	return err
}

// CloseFDs closes received descriptors that no message claimed. Call it only
// from the reading goroutine (or after it has stopped).
func (c *Conn) CloseFDs() {
	for _, fd := range c.fds {
		unix.Close(fd)
	}
	c.fds = nil
}
