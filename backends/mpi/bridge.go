//go:build mpi

package mpi

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Bridge carries byte streams between the processes of MPI_COMM_WORLD over
// MPI point-to-point messages, so that the daemons' control links travel on
// MPI when the data does (hvdd serve --backend mpi). The caller gets each
// stream as a net.Conn: it reads from one end of a Unix socketpair, into
// which the receiver writes what arrives, and its writes become MPI messages
// on a private communicator. A stream is ordered and reliable because MPI
// messages between two ranks on one communicator do not overtake each other.
//
// Tags encode a stream's id (the dialer's number for it), the direction
// (sent by the dialer or by the acceptor) and the kind (open, data, close).
// Writes to a stream's conn are sent at once, a blocking MPI_Send on the
// writer's thread (the conn's DirectWrite, which cluster.Link uses): a
// hand-off to a pump goroutine per message cost a fifth of a 4-byte
// allreduce's time. Each stream's pump only forwards bytes written to the
// descriptor itself (none, from cluster.Link) and sends the close once the
// caller has closed its end. One goroutine, locked to a thread, receives
// every message (probing, see receive). It needs MPI_THREAD_MULTIPLE.
//
// Limits: the receiver writes to a caller's end with blocking writes, so a
// caller that stops reading one stream, with its socket buffer full, stalls
// every stream; a large write waits in MPI_Send until the peer's receiver
// takes it. The daemon's loop always reads its links.
type Bridge struct {
	comm       comm
	rank, size int
	maxID      int
	secret     []byte

	mu      sync.Mutex
	next    int                 // the last id dialled
	streams map[[2]int]*bstream // by (dialer rank, id)
	accept  chan accepted       // streams other ranks opened
	recvErr error               // why the receiver stopped
	pumps   sync.WaitGroup      // pumpOut goroutines
	done    chan struct{}       // closed when the receiver returns
	closed  atomic.Bool         // Close was called: the receiver returns
	closing sync.Once

	// A send tells the receiver a reply may come (see pacer.sent): it sets
	// sent, and rings wake if the receiver is napping, in its idle wait
	// (nap). Both flags are swapped, not stored, so that either the sender
	// sees napping or the receiver sees sent.
	sent    atomic.Bool
	napping atomic.Bool
	wmu     sync.Mutex // guards wake against Close
	wake    int        // eventfd; -1 once closed
	// expecting counts the streams whose callers expect messages
	// (bridgeConn.Expect); the first one rings wake.
	expecting atomic.Int32
}

type accepted struct {
	conn net.Conn
	peer int
}

// bstream is one stream: local is our end of its socketpair.
type bstream struct {
	key    [2]int
	peer   int
	out    int // direction bit of what we send
	local  int
	mu     sync.Mutex
	halves int // ends closed: ours (EOF read) and theirs (close received)
}

// bridgeConn is the caller's end of a stream: reads come from the
// socketpair, writes go straight to MPI.
type bridgeConn struct {
	*net.UnixConn
	b *Bridge
	s *bstream
}

// DirectWrite sends p as one data message now, with MPI_Send on the calling
// thread (see cluster.DirectWriter).
func (c *bridgeConn) DirectWrite(p []byte) error {
	if c.b.closed.Load() {
		return errors.New("mpi bridge: closed")
	}
	if rc := c.b.comm.sendTag(p, c.s.peer, bridgeTag(c.s.key[1], c.s.out, kindData)); rc != 0 {
		return fmt.Errorf("mpi bridge: send to rank %d: %w", c.s.peer, newError(rc))
	}
	c.b.kick()
	return nil
}

// Expect says whether the stream's caller now awaits messages (see
// cluster.Expecter): while any stream does, the receiver's idle waits stay
// short (bridgeIdleWait); while none does, they grow to bridgeDeepWait. The
// caller alternates true and false, starting with true.
func (c *bridgeConn) Expect(on bool) {
	if !on {
		c.b.expecting.Add(-1)
		return
	}
	if c.b.expecting.Add(1) == 1 {
		c.b.kick()
	}
}

// kick tells the receiver that a message went out (see Bridge.sent).
func (b *Bridge) kick() {
	b.sent.Swap(true)
	if b.napping.Load() {
		b.ring()
	}
}

// ring wakes the receiver from its nap.
func (b *Bridge) ring() {
	var one [8]byte
	binary.NativeEndian.PutUint64(one[:], 1)
	b.wmu.Lock()
	defer b.wmu.Unlock()
	if b.wake >= 0 {
		unix.Write(b.wake, one[:])
	}
}

// Write sends p; see DirectWrite.
func (c *bridgeConn) Write(p []byte) (int, error) {
	if err := c.DirectWrite(p); err != nil {
		return 0, err
	}
	return len(p), nil
}

const (
	kindOpen  = 0
	kindData  = 1
	kindClose = 2

	bridgeChunk     = 64 << 10
	bridgeSecretLen = 32
	bridgeSockBuf   = 4 << 20
	// The receiver's pacing (see pacer): bridgeHot is how long it keeps
	// probing every bridgeMinWait after a message that follows another
	// within bridgeHot. Otherwise its waits double up to bridgeIdleWait
	// while some stream expects messages (Expect), up to bridgeDeepWait
	// while none does.
	bridgeHot      = 20 * time.Millisecond
	bridgeMinWait  = 20 * time.Microsecond
	bridgeIdleWait = 5 * time.Millisecond
	bridgeDeepWait = 50 * time.Millisecond
)

func bridgeTag(id, dir, kind int) int { return id<<3 | dir<<2 | kind }

// NewBridge starts the bridge. It is collective: every rank of
// MPI_COMM_WORLD calls it once, in the same order relative to New.
func NewBridge() (*Bridge, error) {
	proc.mu.Lock()
	defer proc.mu.Unlock()
	if err := initMPI(); err != nil {
		return nil, err
	}
	if proc.level != levelMultiple {
		return nil, fmt.Errorf("mpi: the control bridge needs MPI_THREAD_MULTIPLE; this MPI gives %v", proc.level)
	}
	wake, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		return nil, fmt.Errorf("mpi bridge: eventfd: %w", err)
	}
	b := &Bridge{streams: make(map[[2]int]*bstream), accept: make(chan accepted, 64), done: make(chan struct{}), wake: wake}
	var rc int
	if b.comm, b.rank, b.size, rc = cDupWorld(); rc != 0 {
		unix.Close(wake)
		return nil, fmt.Errorf("mpi: MPI_Comm_dup(MPI_COMM_WORLD): %w", newError(rc))
	}
	b.maxID = b.comm.tagUB() >> 3
	// The control links' handshake wants a shared secret; rank 0 makes one
	// and MPI hands it to the others (see Secret).
	b.secret = make([]byte, bridgeSecretLen)
	if b.rank == 0 {
		rand.Read(b.secret) // never fails (crypto/rand)
	}
	if rc := b.comm.bcast(unsafe.Pointer(&b.secret[0]), len(b.secret), 0, nil); rc != 0 {
		b.comm.free()
		unix.Close(wake)
		return nil, fmt.Errorf("mpi bridge: MPI_Bcast of the secret: %w", newError(rc))
	}
	go b.receive()
	return b, nil
}

// Secret is a random secret that every rank's bridge shares (rank 0 made it
// and broadcast it when the bridge started), for daemons under a mpirun that
// was given none: their control links travel inside the MPI job.
func (b *Bridge) Secret() []byte { return b.secret }

// Rank and Size are this process's place in MPI_COMM_WORLD.
func (b *Bridge) Rank() int { return b.rank }

// Size is the number of processes in MPI_COMM_WORLD.
func (b *Bridge) Size() int { return b.size }

// Dial opens a stream to rank peer, which gets it from Accept.
func (b *Bridge) Dial(ctx context.Context, peer int) (net.Conn, error) {
	if peer < 0 || peer >= b.size || peer == b.rank {
		return nil, fmt.Errorf("mpi bridge: no rank %d to dial (size %d, we are %d)", peer, b.size, b.rank)
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	b.mu.Lock()
	if b.recvErr != nil {
		err := b.recvErr
		b.mu.Unlock()
		return nil, err
	}
	id := 0
	for tries := 0; tries < b.maxID; tries++ {
		b.next = b.next%b.maxID + 1
		if _, busy := b.streams[[2]int{b.rank, b.next}]; !busy {
			id = b.next
			break
		}
	}
	b.mu.Unlock()
	if id == 0 {
		return nil, errors.New("mpi bridge: every stream id is in use")
	}
	s, conn, err := b.newStream([2]int{b.rank, id}, peer, 0)
	if err != nil {
		return nil, err
	}
	if rc := b.comm.sendTag([]byte{1}, peer, bridgeTag(id, 0, kindOpen)); rc != 0 {
		conn.Close()
		return nil, fmt.Errorf("mpi bridge: open stream to rank %d: %w", peer, newError(rc))
	}
	b.startPump(s)
	return conn, nil
}

// Accept returns the next stream another rank opened, and that rank.
func (b *Bridge) Accept() (net.Conn, int, error) {
	select {
	case a := <-b.accept:
		return a.conn, a.peer, nil
	case <-b.done:
		b.mu.Lock()
		defer b.mu.Unlock()
		return nil, -1, b.recvErr
	}
}

// newStream makes the socketpair of a stream and registers it.
func (b *Bridge) newStream(key [2]int, peer, out int) (*bstream, net.Conn, error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("mpi bridge: socketpair: %w", err)
	}
	// Room for what the receiver hands the caller (best effort, up to
	// net.core.wmem_max): a receiver that blocks on a full end receives
	// nothing else until the caller reads, and a peer's MPI_Send of a large
	// message waits for it.
	unix.SetsockoptInt(fds[0], unix.SOL_SOCKET, unix.SO_SNDBUF, bridgeSockBuf)
	f := os.NewFile(uintptr(fds[1]), "mpi-bridge")
	conn, err := net.FileConn(f)
	f.Close()
	if err != nil {
		unix.Close(fds[0])
		return nil, nil, fmt.Errorf("mpi bridge: %w", err)
	}
	s := &bstream{key: key, peer: peer, out: out, local: fds[0]}
	b.mu.Lock()
	b.streams[key] = s
	b.mu.Unlock()
	return s, &bridgeConn{UnixConn: conn.(*net.UnixConn), b: b, s: s}, nil
}

func (b *Bridge) startPump(s *bstream) {
	b.pumps.Add(1)
	go func() {
		defer b.pumps.Done()
		b.pumpOut(s)
	}()
}

// pumpOut sends what the caller writes to its end's descriptor as data
// messages (writes through the conn go out directly instead), and a close
// message at EOF, once every copy of that descriptor is closed.
func (b *Bridge) pumpOut(s *bstream) {
	buf := make([]byte, bridgeChunk)
	id := s.key[1]
	for {
		n, err := unix.Read(s.local, buf)
		if err == unix.EINTR {
			continue
		}
		if n <= 0 {
			break
		}
		if rc := b.comm.sendTag(buf[:n], s.peer, bridgeTag(id, s.out, kindData)); rc != 0 {
			break
		}
	}
	b.comm.sendTag(nil, s.peer, bridgeTag(id, s.out, kindClose))
	b.halfClosed(s)
}

// halfClosed records that one direction of s ended; the second frees it.
func (b *Bridge) halfClosed(s *bstream) {
	s.mu.Lock()
	s.halves++
	last := s.halves == 2
	s.mu.Unlock()
	if !last {
		return
	}
	b.mu.Lock()
	if b.streams[s.key] == s {
		delete(b.streams, s.key)
	}
	b.mu.Unlock()
	unix.Close(s.local)
}

// receive (one goroutine, its own thread) takes every message and hands it
// to its stream. It probes rather than blocking in MPI_Recv, which MPI
// libraries implement by spinning a core, and sleeps between probes as its
// pacer says: bridgeMinWait while messages flow, then longer and longer, up
// to bridgeIdleWait while the daemon expects messages and bridgeDeepWait
// while it does not, so that an idle daemon costs nothing measurable.
func (b *Bridge) receive() {
	runtime.LockOSThread()
	defer close(b.done)
	buf := make([]byte, bridgeChunk)
	pace := pacer{window: bridgeHot}
	for !b.closed.Load() {
		ok, src, tag, n, rc := b.comm.probeAny()
		if rc == 0 && !ok {
			ok, src, tag, n, rc = b.nap(&pace)
		}
		if rc == 0 && ok {
			if n > len(buf) {
				// A direct write is one message of any size.
				buf = make([]byte, n)
			}
			rc = b.comm.recvFrom(buf[:n], src, tag)
		}
		if rc != 0 {
			b.stop(fmt.Errorf("mpi bridge: receive: %w", newError(rc)))
			return
		}
		if !ok {
			continue
		}
		pace.message(time.Now())
		id, dir, kind := tag>>3, tag>>2&1, tag&3
		key := [2]int{src, id} // sent by the dialer: src dialled it
		if dir == 1 {
			key = [2]int{b.rank, id} // sent by the acceptor: we dialled it
		}
		switch kind {
		case kindOpen:
			s, conn, err := b.newStream(key, src, 1)
			if err != nil {
				continue // the dialer sees its stream never answer
			}
			b.startPump(s)
			b.accept <- accepted{conn, src}
		case kindData:
			b.mu.Lock()
			s := b.streams[key]
			b.mu.Unlock()
			if s != nil {
				writeAll(s.local, buf[:n])
			}
		case kindClose:
			b.mu.Lock()
			s := b.streams[key]
			b.mu.Unlock()
			if s != nil {
				unix.Shutdown(s.local, unix.SHUT_WR)
				b.halfClosed(s)
			}
		}
	}
	b.stop(errors.New("mpi bridge: closed"))
}

// nap waits after an empty probe, as the pacer says. While the receiver is
// hot it sleeps minWait here, in nanosleep(2) itself (time.Sleep rounds
// waits under a millisecond up to one). Otherwise it leaves the wait to C,
// which probes too and returns what it found; a send (kick) or Close rings
// the eventfd to end that wait early.
func (b *Bridge) nap(pace *pacer) (ok bool, src, tag, n, rc int) {
	if pace.hot(time.Now()) {
		ts := unix.NsecToTimespec(int64(bridgeMinWait))
		unix.Nanosleep(&ts, nil)
		return false, 0, 0, 0, 0
	}
	// Raise napping before taking sent: a send after this rings wake.
	b.napping.Swap(true)
	if b.sent.Swap(false) {
		pace.sent()
	}
	maxWait := bridgeDeepWait
	if b.expecting.Load() > 0 {
		maxWait = bridgeIdleWait
	}
	ok, src, tag, n, rc = b.comm.idleProbe(b.wake, &pace.wait, bridgeMinWait, maxWait)
	b.napping.Store(false)
	return ok, src, tag, n, rc
}

func writeAll(fd int, p []byte) {
	for len(p) > 0 {
		n, err := unix.Write(fd, p)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return // the caller closed its end: drop the bytes
		}
		p = p[n:]
	}
}

func (b *Bridge) stop(err error) {
	b.mu.Lock()
	if b.recvErr == nil {
		b.recvErr = err
	}
	b.mu.Unlock()
}

// Close stops the bridge: its streams end (their callers read EOF), and the
// communicator is freed. Every rank should close its bridge before
// Finalize.
func (b *Bridge) Close() error {
	b.closing.Do(func() {
		b.closed.Store(true)
		b.ring()
		<-b.done
		b.mu.Lock()
		for _, s := range b.streams {
			unix.Shutdown(s.local, unix.SHUT_RDWR)
		}
		b.mu.Unlock()
		b.pumps.Wait()
		b.mu.Lock()
		for k, s := range b.streams {
			unix.Close(s.local) // half open: the peer never closed its side
			delete(b.streams, k)
		}
		b.mu.Unlock()
		b.comm.free()
		b.wmu.Lock()
		unix.Close(b.wake)
		b.wake = -1
		b.wmu.Unlock()
	})
	return nil
}
