package ipc

import (
	"encoding/binary"
	"fmt"
	"sync/atomic"
	"time"
	"unsafe"

	"google.golang.org/protobuf/proto"
)

// A Channel is a pair of single-producer single-consumer byte rings in a
// shared-memory region that a client registers beside its socket
// (RegisterChannel). Frames travel through it exactly as they would on the
// socket (same header, same protobuf bodies), but without a system call: the
// receiver polls the ring while it spins and only sleeps in the kernel, on the
// socket, after telling the sender so through a flag in the region. A sender
// that finds the flag set rings the doorbell: a 12-byte Wake frame on the
// socket. Descriptors still travel on the socket.
//
// Layout (little-endian, every counter a free-running uint64 byte count):
//
//	0    client->daemon head    written by the client
//	8    client->daemon sockets written by the client: frames it sent on the socket
//	64   client->daemon tail    written by the daemon
//	128  daemon->client head    written by the daemon
//	136  daemon->client sockets written by the daemon
//	192  daemon->client tail    written by the client
//	256  daemon asleep          uint32, written by the daemon
//	320  client asleep          uint32, written by the client
//	4096 client->daemon ring, then the daemon->client ring, Size bytes each
//
// Order: a sender that writes a frame to the socket bumps its socket counter
// after the write; a receiver that sees a ring frame first reads its socket
// until it has taken as many (counted) socket frames as the counter read after
// the ring's head. So a descriptor (GrantRegion, RegisterRegion) always
// arrives before a ring frame that refers to it.
//
// Neither side trusts the other's counters: a head or tail that moves
// backwards or past the ring, or a frame that does not fit, is a protocol
// error. Frames are copied out of the ring before they are decoded, so a peer
// scribbling on the ring cannot change a frame under the decoder.
type Channel struct {
	mem  []byte
	size uint64 // bytes per ring, a power of two

	tx ring // the direction this side writes
	rx ring // the direction this side reads

	myAsleep, peerAsleep *atomic.Uint32
	mySock, peerSock     *atomic.Uint64

	txHead uint64 // private copies: never read back from shared memory
	rxTail uint64
	limit  uint64 // rx head as of the last Snapshot
	sent   uint64 // counted socket frames sent
	rbuf   []byte
	wbuf   []byte
}

type ring struct {
	head, tail *atomic.Uint64
	data       []byte
}

// Channel geometry.
const (
	ChannelHeader   = 4096
	DefaultRingSize = 128 << 10
	minRingSize     = 4096
	maxRingSize     = 16 << 20
)

// Side says which end of a Channel a process is.
type Side int

// The two ends.
const (
	ClientSide Side = iota
	DaemonSide
)

// ChannelBytes is the region size of a Channel with rings of ringSize bytes.
func ChannelBytes(ringSize int) int { return ChannelHeader + 2*ringSize }

// NewChannel lays a Channel over mem, a shared mapping of ChannelBytes(n)
// bytes for a power-of-two n. A fresh (zeroed) region is an empty channel.
func NewChannel(mem []byte, side Side) (*Channel, error) {
	n := (len(mem) - ChannelHeader) / 2
	if len(mem) < ChannelHeader || n < minRingSize || n > maxRingSize || n&(n-1) != 0 || ChannelBytes(n) != len(mem) {
		return nil, fmt.Errorf("ipc: a channel region must be %d bytes plus two power-of-two rings of %d..%d bytes, not %d bytes",
			ChannelHeader, minRingSize, maxRingSize, len(mem))
	}
	if uintptr(unsafe.Pointer(&mem[0]))%64 != 0 {
		return nil, fmt.Errorf("ipc: channel region is not aligned")
	}
	u64 := func(off int) *atomic.Uint64 { return (*atomic.Uint64)(unsafe.Pointer(&mem[off])) }
	u32 := func(off int) *atomic.Uint32 { return (*atomic.Uint32)(unsafe.Pointer(&mem[off])) }
	c2d := ring{head: u64(0), tail: u64(64), data: mem[ChannelHeader : ChannelHeader+n]}
	d2c := ring{head: u64(128), tail: u64(192), data: mem[ChannelHeader+n : ChannelHeader+2*n]}
	ch := &Channel{mem: mem, size: uint64(n)}
	if side == ClientSide {
		ch.tx, ch.rx = c2d, d2c
		ch.mySock, ch.peerSock = u64(8), u64(136)
		ch.myAsleep, ch.peerAsleep = u32(320), u32(256)
	} else {
		ch.tx, ch.rx = d2c, c2d
		ch.mySock, ch.peerSock = u64(136), u64(8)
		ch.myAsleep, ch.peerAsleep = u32(256), u32(320)
	}
	// A channel joined after use (the daemon maps it once the client has
	// registered it) starts from the counters as they are.
	ch.txHead = ch.tx.head.Load()
	ch.rxTail = ch.rx.tail.Load()
	ch.limit = ch.rxTail
	ch.sent = ch.mySock.Load()
	return ch, nil
}

// MaxFrame is the largest frame the channel carries; larger ones go on the
// socket.
func (ch *Channel) MaxFrame() int { return int(ch.size / 2) }

// Encode encodes m as one frame in the channel's scratch buffer, valid until
// the next Encode.
func (ch *Channel) Encode(kind uint8, id uint32, m proto.Message) ([]byte, error) {
	b, err := appendFrame(ch.wbuf[:0], kind, id, m)
	ch.wbuf = b
	return b, err
}

// Room reports whether a frame of n bytes fits in the ring now.
func (ch *Channel) Room(n int) bool {
	used := ch.txHead - ch.tx.tail.Load()
	return used <= ch.size && ch.size-used >= uint64(n)
}

// SendFrame publishes an encoded frame on the ring. It reports false,
// sending nothing, when the frame is larger than MaxFrame or the ring lacks
// room; the caller then waits for room, keeps the frame, or uses the socket.
// The caller serialises Encode, SendFrame and SocketSent.
func (ch *Channel) SendFrame(b []byte) (bool, error) {
	if len(b) > ch.MaxFrame() {
		return false, nil
	}
	tail := ch.tx.tail.Load()
	used := ch.txHead - tail
	if tail > ch.txHead || used > ch.size {
		return false, protoErrf("channel: the peer moved the ring's tail to %d, outside [%d, %d]", tail, ch.txHead-ch.size, ch.txHead)
	}
	if ch.size-used < uint64(len(b)) {
		return false, nil
	}
	at := ch.txHead & (ch.size - 1)
	n := copy(ch.tx.data[at:], b)
	copy(ch.tx.data, b[n:])
	ch.txHead += uint64(len(b))
	// An exchange, not a store: see SetAsleep.
	ch.tx.head.Swap(ch.txHead)
	return true, nil
}

// Empty reports whether the peer has taken everything this side sent.
func (ch *Channel) Empty() bool { return ch.tx.tail.Load() == ch.txHead }

// SocketSent records that n counted frames went on the socket. Call it after
// the write has returned.
func (ch *Channel) SocketSent(n int) {
	ch.sent += uint64(n)
	ch.mySock.Store(ch.sent)
}

// PeerAsleep reports whether the peer has said it sleeps on the socket: after
// publishing, the sender must then ring the doorbell (a Wake frame).
func (ch *Channel) PeerAsleep() bool { return ch.peerAsleep.Load() != 0 }

// SetAsleep tells the peer whether this side sleeps on the socket. After
// setting it, check Pending once more before sleeping: a frame published
// before the peer saw the flag rang no doorbell.
//
// The handshake is a store then a load on each side (the receiver's flag,
// then the ring's head; the sender's head, then the flag), and it holds
// only if neither load can pass the store before it. The flag and the head
// are therefore written with an atomic exchange, a full barrier, rather
// than a store: under the race detector Go's atomic stores are release
// stores, which a later load of another location may pass when the
// location is shared with another process (golang/go#58020). The receiver
// then slept with a frame in its ring and no doorbell coming: an
// intermittent hang of the race-enabled multi-node tests, caught by the
// counters of both sides. Without the race detector a store is already an
// exchange on amd64, so this costs nothing there.
func (ch *Channel) SetAsleep(v bool) {
	var x uint32
	if v {
		x = 1
	}
	ch.myAsleep.Swap(x)
}

// Pending reports whether unread frames wait in the ring.
func (ch *Channel) Pending() bool { return ch.rx.head.Load() != ch.rxTail }

// Snapshot fixes how far the next Next calls may read (the ring's head now)
// and returns the peer's count of socket frames as read after it: the
// receiver takes that many counted socket frames before reading the ring.
func (ch *Channel) Snapshot() (sockets uint64) {
	ch.limit = ch.rx.head.Load()
	return ch.peerSock.Load()
}

// Next returns the next frame up to the last Snapshot; ok is false when there
// is none. The body is a private copy, valid until the next call.
func (ch *Channel) Next() (f Frame, ok bool, err error) {
	avail := ch.limit - ch.rxTail
	if ch.limit < ch.rxTail || avail > ch.size {
		return Frame{}, false, protoErrf("channel: the peer moved the ring's head to %d, outside [%d, %d]", ch.limit, ch.rxTail, ch.rxTail+ch.size)
	}
	if avail == 0 {
		return Frame{}, false, nil
	}
	if avail < HeaderSize {
		return Frame{}, false, protoErrf("channel: %d bytes published, less than a frame header", avail)
	}
	var h [HeaderSize]byte
	ch.read(h[:], ch.rxTail)
	if _, _, err := parseHeader(h[:]); err != nil {
		return Frame{}, false, err
	}
	n := uint64(binary.LittleEndian.Uint32(h[8:12]))
	if HeaderSize+n > avail {
		return Frame{}, false, protoErrf("channel: frame of %d body bytes runs past the %d bytes published", n, avail-HeaderSize)
	}
	if cap(ch.rbuf) < HeaderSize+int(n) {
		ch.rbuf = make([]byte, HeaderSize+int(n))
	}
	b := ch.rbuf[:HeaderSize+int(n)]
	copy(b, h[:])
	ch.read(b[HeaderSize:], ch.rxTail+HeaderSize)
	ch.rxTail += HeaderSize + n
	ch.rx.tail.Store(ch.rxTail)
	f, err = parseFrame(b)
	if err != nil {
		return Frame{}, false, err
	}
	return f, true, nil
}

// read copies len(dst) bytes from the rx ring at position pos.
func (ch *Channel) read(dst []byte, pos uint64) {
	at := pos & (ch.size - 1)
	n := copy(dst, ch.rx.data[at:])
	copy(dst[n:], ch.rx.data)
}

// AdaptSpin returns the next spin window of a spin-then-sleep wait after it
// slept for slept: an answer that came a little after the window widens it (to
// twice the gap, averaged with the current window, at most ten times base), so
// that a peer whose messages come every 50-100 µs (a Python training loop)
// stops costing a wake-up each; a long sleep (an idle job) restores base. The
// daemon's loop and the clients adapt their windows this way.
func AdaptSpin(cur, base, slept time.Duration) time.Duration {
	if hi := 10 * base; slept < hi {
		return max(base, min(hi, (cur+2*slept)/2))
	}
	return base
}
