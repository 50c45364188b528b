package tcp

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/hvdd/hvdd/backends"
	"github.com/hvdd/hvdd/reduce"
)

// Backend is the tcp engine's backends.Backend for one node rank, or for
// this rank within a group of ranks (Group). It also implements
// backends.StatsReporter and backends.Grouper.
type Backend struct {
	*engine
	// rank and size are this rank's place in the group and the group's
	// size; peers are the group's other ranks, by group rank (nil at
	// rank). For the Backend New returns they are the engine's.
	rank, size int
	peers      []*peer
	// sub marks a Backend that Group made; closed is set by its Close.
	sub    bool
	closed atomic.Bool
}

// engine is what every group of one rank shares: the connections to every
// peer, the failure, the counters.
type engine struct {
	cfg        Config
	rank, size int     // this rank in the whole engine
	peers      []*peer // by engine rank; nil at rank
	log        *slog.Logger
	addr       string // the advertised address
	// inlineMax is the largest message a small-message algorithm writes
	// before it reads: one that surely fits the socket send buffer, so the
	// write cannot block on the peer (see exchange).
	inlineMax int
	ropts     reduce.Options
	// verdictWait is how long a broken data connection waits for the
	// control connection to name the real culprit (see linkErr).
	verdictWait time.Duration
	bufs        sync.Pool // *[]byte scratch
	// tune is the per-collective settings in force (backends.Tunable):
	// Config's Streams, ChunkBytes and SmallBytes at first. Collectives
	// read it once each; SetTuning replaces it between collectives.
	tune atomic.Pointer[backends.Tuning]

	// mu guards the fields that follow.
	mu      sync.Mutex
	err     error // the first failure; later calls return it
	ln      net.Listener
	pending map[net.Conn]struct{} // connections in their handshake
	refusal error                 // the last refused handshake, for New's error
	groups  map[string]*Backend   // Group's views, by their engine ranks

	failed    chan struct{}  // closed when err is set
	byesSent  chan struct{}  // closed once fail has sent its byes
	byeHold   func(peer int) // tests: called before the bye to peer is sent
	noBeat    chan struct{}  // closed by tests to stop heartbeats
	closeOnce sync.Once
	wg        sync.WaitGroup // control readers, heartbeat, acceptor
}

var _ backends.Backend = (*Backend)(nil)
var _ backends.StatsReporter = (*Backend)(nil)
var _ backends.Grouper = (*Backend)(nil)
var _ backends.Tunable = (*Backend)(nil)

// peer is one remote rank's connections and counters.
type peer struct {
	rank int // in the engine

	// mu guards conns while New registers them and Close closes them; once
	// New has returned, ctrl and data are only read.
	mu     sync.Mutex
	ctrl   net.Conn
	data   []net.Conn // Config.Streams data connections
	closed bool

	ctrlMu sync.Mutex // serializes control frame writes

	sent, recv atomic.Int64

	// completed counts the collectives this rank finished together with
	// the peer (of the whole engine and of the groups holding both); an
	// orderly bye to the peer carries it, so that the peer may finish the
	// collective both were in. Counting per pair keeps the numbers equal
	// on both sides when groups run collectives that other ranks skip.
	completed atomic.Uint32
	// active is the number (completed+1) of the collective with the peer
	// in progress, 0 between them: the peer's orderly close fails only a
	// collective the peer never took part in (see readControl).
	active atomic.Int64
	// doneAt is how many collectives the peer had completed with this rank
	// when it closed its backend in an orderly way, or -1 while it has not.
	doneAt atomic.Int64
}

// New connects rank cfg.Rank to every other rank of the group and returns
// when all connections are authenticated, or ctx (or cfg.ConnectTimeout)
// ends, or a peer is refused. Every rank must call New with matching Size,
// Prefix, Secret, Streams, ChunkBytes, SmallBytes and Compression. With Size
// 1 it opens no socket.
func New(ctx context.Context, cfg Config) (*Backend, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	e := &engine{
		cfg:         cfg,
		rank:        cfg.Rank,
		size:        cfg.Size,
		log:         cfg.Logger.With("backend", "tcp", "rank", cfg.Rank),
		peers:       make([]*peer, cfg.Size),
		inlineMax:   4 << 10,
		ropts:       reduce.Options{Workers: 1},
		verdictWait: min(cfg.PeerTimeout/2, time.Second),
		pending:     make(map[net.Conn]struct{}),
		failed:      make(chan struct{}),
		byesSent:    make(chan struct{}),
		noBeat:      make(chan struct{}),
	}
	e.tune.Store(&backends.Tuning{Streams: cfg.Streams, ChunkBytes: cfg.ChunkBytes, SmallBytes: cfg.SmallBytes})
	b := &Backend{engine: e, rank: e.rank, size: e.size, peers: e.peers}
	if b.size == 1 {
		return b, nil
	}
	for r := range b.peers {
		if r != b.rank {
			b.peers[r] = &peer{rank: r, data: make([]net.Conn, cfg.Streams)}
			b.peers[r].doneAt.Store(-1)
		}
	}
	if err := b.connect(ctx); err != nil {
		b.Close()
		return nil, fmt.Errorf("tcp: rank %d of %d: %w", b.rank, b.size, err)
	}
	return b, nil
}

func (b *engine) key(rank int) string {
	return b.cfg.Prefix + "/tcp/addr/" + strconv.Itoa(rank)
}

// connect listens, publishes the address, dials the higher ranks and accepts
// the lower ones: Streams+1 connections per pair, each authenticated.
func (b *engine) connect(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, b.cfg.ConnectTimeout)
	defer cancel()

	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", b.cfg.ListenAddr)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	b.mu.Lock()
	b.ln = ln
	b.mu.Unlock()
	defer ln.Close() // no connection is expected after New
	b.addr = b.cfg.Advertise
	if b.addr == "" {
		b.addr = ln.Addr().String()
		if ip := ln.Addr().(*net.TCPAddr).IP; ip.IsUnspecified() {
			return fmt.Errorf("listening on %s (all interfaces) needs Advertise", b.addr)
		}
	}
	b.log.Debug("listening", "addr", ln.Addr(), "advertise", b.addr)

	// Heartbeats start before the group is complete, so that peers that
	// finished connecting do not time out a rank still dialing others.
	b.wg.Add(2)
	go b.heartbeat()
	accepted := make(chan struct{}, b.rank*(b.cfg.Streams+1))
	go b.accept(ln, accepted)

	if err := b.cfg.Store.Set(ctx, b.key(b.rank), []byte(b.addr)); err != nil {
		return fmt.Errorf("publish address: %w", err)
	}
	dialed := make(chan error, 1)
	go func() { dialed <- b.dialHigher(ctx) }()

	for need, dialing := b.rank*(b.cfg.Streams+1), true; need > 0 || dialing; {
		select {
		case <-accepted:
			need--
		case err := <-dialed:
			if err != nil {
				return err
			}
			dialing = false
		case <-b.failed:
			return b.failure()
		case <-ctx.Done():
			b.mu.Lock()
			why := b.refusal
			b.mu.Unlock()
			if why != nil {
				return fmt.Errorf("waiting for %d connections from lower ranks: %w (last refused: %v)", need, ctx.Err(), why)
			}
			return fmt.Errorf("waiting for %d connections from lower ranks: %w", need, ctx.Err())
		}
	}
	b.inlineMax = b.sendBufferFloor()
	b.log.Debug("connected", "peers", b.size-1, "streams", b.cfg.Streams, "compression", b.cfg.Compression)
	return b.failure()
}

// dialHigher opens the connections to every higher rank.
func (b *engine) dialHigher(ctx context.Context) error {
	if b.rank == b.size-1 {
		return nil
	}
	keys := make([]string, 0, b.size-b.rank-1)
	for r := b.rank + 1; r < b.size; r++ {
		keys = append(keys, b.key(r))
	}
	addrs, err := b.cfg.Store.Wait(ctx, keys...)
	if err != nil {
		return fmt.Errorf("wait for peer addresses: %w", err)
	}
	d := net.Dialer{}
	if host, _, _ := net.SplitHostPort(b.cfg.ListenAddr); host != "" {
		// Leave through the interface we listen on, so that peers see
		// the address they expect on a multi-homed host.
		if ip := net.ParseIP(host); ip != nil && !ip.IsUnspecified() {
			d.LocalAddr = &net.TCPAddr{IP: ip}
		}
	}
	sh := b.shake()
	for r := b.rank + 1; r < b.size; r++ {
		addr := string(addrs[b.key(r)])
		for s := 0; s <= b.cfg.Streams; s++ {
			c, err := dialRetry(ctx, &d, addr)
			if err != nil {
				return fmt.Errorf("dial rank %d at %s: %w", r, addr, err)
			}
			if dl, ok := ctx.Deadline(); ok {
				c.SetDeadline(dl)
			}
			if err := sh.client(c, r, s); err != nil {
				c.Close()
				b.log.Error("handshake refused", "peer", r, "addr", addr, "err", err)
				return fmt.Errorf("handshake with rank %d at %s: %w", r, addr, err)
			}
			c.SetDeadline(time.Time{})
			b.register(r, s, c)
		}
	}
	return nil
}

// dialRetry dials addr until it answers or ctx ends; a peer may publish its
// address a moment before its accept queue is visible on every route.
func dialRetry(ctx context.Context, d *net.Dialer, addr string) (net.Conn, error) {
	for delay := time.Millisecond; ; delay = min(2*delay, 500*time.Millisecond) {
		c, err := d.DialContext(ctx, "tcp", addr)
		if err == nil || !errors.Is(err, syscall.ECONNREFUSED) {
			return c, err
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("%w (last: %v)", ctx.Err(), err)
		case <-time.After(delay):
		}
	}
}

// accept runs the server side of the handshake for every incoming
// connection until the listener closes. Refused connections are logged and
// dropped: a stray client must not stop a job from forming.
func (b *engine) accept(ln net.Listener, accepted chan<- struct{}) {
	defer b.wg.Done()
	sh := b.shake()
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		b.mu.Lock()
		if b.err != nil {
			b.mu.Unlock()
			c.Close()
			return
		}
		b.pending[c] = struct{}{}
		b.wg.Add(1)
		b.mu.Unlock()
		go func() {
			defer b.wg.Done()
			c.SetDeadline(time.Now().Add(min(b.cfg.ConnectTimeout, 10*time.Second)))
			from, stream, err := sh.server(c)
			b.mu.Lock()
			delete(b.pending, c)
			if err != nil {
				b.refusal = fmt.Errorf("connection from %s: %w", c.RemoteAddr(), err)
			}
			b.mu.Unlock()
			if err != nil {
				b.log.Warn("refused connection", "remote", c.RemoteAddr(), "err", err)
				c.Close()
				return
			}
			c.SetDeadline(time.Time{})
			if b.register(from, stream, c) {
				accepted <- struct{}{}
			}
		}()
	}
}

// register installs an authenticated connection; stream 0 is the control
// connection, whose reader starts here. It reports whether c was new.
func (b *engine) register(rank, stream int, c net.Conn) bool {
	if tc, ok := c.(*net.TCPConn); ok {
		tc.SetNoDelay(true)
		if n := b.cfg.SocketBuffer; n > 0 && stream > 0 {
			tc.SetReadBuffer(n)
			tc.SetWriteBuffer(n)
		}
	}
	p := b.peers[rank]
	p.mu.Lock()
	defer p.mu.Unlock()
	slot := &p.ctrl
	if stream > 0 {
		slot = &p.data[stream-1]
	}
	if p.closed || *slot != nil {
		if *slot != nil {
			b.log.Warn("duplicate connection", "peer", rank, "stream", stream)
		}
		c.Close()
		return false
	}
	*slot = c
	if stream == 0 {
		b.wg.Add(1)
		go b.readControl(p, c)
	}
	return true
}

// sendBufferFloor returns a quarter of the smallest SO_SNDBUF of the data
// connections: Linux reports twice the requested size and charges skb
// overhead against it, so a write of that many bytes always fits.
func (b *engine) sendBufferFloor() int {
	floor := 1 << 30
	for _, p := range b.peers {
		if p == nil {
			continue
		}
		for _, c := range p.data {
			tc, ok := c.(*net.TCPConn)
			if !ok {
				return 4 << 10
			}
			rc, err := tc.SyscallConn()
			if err != nil {
				return 4 << 10
			}
			var v int
			var gerr error
			rc.Control(func(fd uintptr) {
				v, gerr = syscall.GetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_SNDBUF)
			})
			if gerr != nil {
				return 4 << 10
			}
			floor = min(floor, v/4)
		}
	}
	return max(floor, 1<<10)
}

// Name returns "tcp".
func (b *Backend) Name() string { return "tcp" }

// Compression returns Config.Compression: how the float32 data of Sum
// reductions travels.
func (b *Backend) Compression() backends.Compression { return b.cfg.Compression }

// Rank returns this node's rank.
func (b *Backend) Rank() int { return b.rank }

// Size returns the number of nodes.
func (b *Backend) Size() int { return b.size }

// Addr returns the address peers dial (empty for a group of one).
func (b *engine) Addr() string { return b.addr }

// Stats returns the payload bytes exchanged with each rank so far (control
// and handshake bytes are not counted).
func (b *engine) Stats() backends.Stats {
	s := backends.Stats{SentBytes: make([]int64, b.size), RecvBytes: make([]int64, b.size)}
	for r, p := range b.peers {
		if p != nil {
			s.SentBytes[r], s.RecvBytes[r] = p.sent.Load(), p.recv.Load()
		}
	}
	return s
}

// Close says goodbye to the peers (so they fail with a PeerError naming this
// rank at once) and closes every connection; blocked calls return
// backends.ErrClosed, in the groups too. On a Backend that Group made, Close
// only makes that Backend refuse later calls. Close is idempotent and always
// returns nil.
func (b *Backend) Close() error {
	if b.sub {
		b.closed.Store(true)
		return nil
	}
	b.engine.close()
	return nil
}

// CloseLost is Close after the loss of rank: the byes name that rank, so
// that a peer in a collective fails with a *PeerError naming it rather than
// this rank. Calls here return an error that is both backends.ErrClosed and
// a *PeerError naming rank. A rank out of range, or this rank, closes as
// Close does; on a Backend that Group made, CloseLost is Close.
func (b *Backend) CloseLost(rank int, err error) error {
	if b.sub || rank < 0 || rank >= b.size || rank == b.rank {
		return b.Close()
	}
	b.engine.closeWith(&backends.PeerError{Rank: rank, Err: fmt.Errorf("%w after the loss: %w", backends.ErrClosed, err)})
	return nil
}

func (b *engine) close() { b.closeWith(backends.ErrClosed) }

// closeWith fails the engine with err (unless it failed before) and closes
// it, once.
func (b *engine) closeWith(err error) {
	b.closeOnce.Do(func() {
		b.fail(err)
		// A failure recorded by another goroutine (a control reader's
		// missed heartbeat) may still be sending its byes: closing the
		// control connections under it would leave the peers an EOF that
		// blames this rank, not the one it lost.
		<-b.byesSent
		b.mu.Lock()
		if b.ln != nil {
			b.ln.Close()
		}
		for c := range b.pending {
			c.Close()
		}
		b.mu.Unlock()
		for _, p := range b.peers {
			if p != nil {
				p.closeAll()
			}
		}
		b.wg.Wait()
	})
}

// failure returns the error the backend failed with, or nil.
func (b *engine) failure() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.err
}

// fail records err as the backend's failure unless one is recorded already,
// tells every peer (a bye naming the reason), and closes the data
// connections so that blocked transfers return. It returns the recorded
// failure.
func (b *engine) fail(err error) error {
	b.mu.Lock()
	if b.err != nil {
		err = b.err
		b.mu.Unlock()
		return err
	}
	b.err = err
	close(b.failed)
	b.mu.Unlock()
	switch {
	case errors.Is(err, backends.ErrClosed):
	case errors.Is(err, errPeerClosed):
		b.log.Debug("peer closed its backend", "err", err)
	default:
		b.log.Warn("backend failed", "err", err)
	}
	// Every peer at once: one whose link is cut must not hold up the
	// others' byes by its write deadline.
	var sent sync.WaitGroup
	for _, p := range b.peers {
		if p != nil {
			bye := b.byeFor(err, p).marshal()
			sent.Go(func() {
				if b.byeHold != nil {
					b.byeHold(p.rank)
				}
				p.sendCtrl(bye, 500*time.Millisecond)
			})
		}
	}
	sent.Wait()
	close(b.byesSent)
	for _, p := range b.peers {
		if p != nil {
			p.closeData()
		}
	}
	return err
}

// linkErr handles a failed transfer with rank. The data connection alone
// cannot tell who failed: when a rank dies its neighbours stop too, and the
// socket that breaks first may be a survivor's. The control connections can:
// a dead rank's breaks at once, and a survivor's bye names the rank it lost.
// So linkErr gives them verdictWait to decide before blaming rank itself.
func (b *engine) linkErr(rank int, err error) error {
	if e := b.failure(); e != nil {
		return e
	}
	t := time.NewTimer(b.verdictWait)
	defer t.Stop()
	select {
	case <-b.failed:
	case <-t.C:
	}
	return b.fail(&backends.PeerError{Rank: rank, Err: err})
}

func (p *peer) sendCtrl(f []byte, timeout time.Duration) error {
	p.mu.Lock()
	c := p.ctrl
	p.mu.Unlock()
	if c == nil {
		return net.ErrClosed
	}
	p.ctrlMu.Lock()
	defer p.ctrlMu.Unlock()
	c.SetWriteDeadline(time.Now().Add(timeout))
	_, err := c.Write(f)
	return err
}

func (p *peer) closeData() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	for _, c := range p.data {
		if c != nil {
			c.Close()
		}
	}
}

func (p *peer) closeAll() {
	p.closeData()
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ctrl != nil {
		p.ctrl.Close()
	}
}

// kill closes every connection without a bye, as a crashed process would
// (tests only).
func (b *engine) kill() {
	b.mu.Lock()
	if b.err == nil {
		b.err = errors.New("killed")
		close(b.failed)
		close(b.byesSent) // none: a crash sends none
	}
	b.mu.Unlock()
	for _, p := range b.peers {
		if p != nil {
			p.closeAll()
		}
	}
}

// do runs one collective of the group: it refuses calls on a failed or
// closed backend, makes ctx cancellation abort the transfers, and turns any
// error into the engine's (first) failure. A collective that stops half way
// leaves the byte streams out of step, so every failure, cancellation
// included, is final, for the whole engine.
func (b *Backend) do(ctx context.Context, name string, f func() error) error {
	if err := b.failure(); err != nil {
		return fmt.Errorf("tcp: %s: %w", name, err)
	}
	if b.closed.Load() {
		return fmt.Errorf("tcp: %s: %w", name, backends.ErrClosed)
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("tcp: %s: %w", name, err)
	}
	if b.size == 1 {
		return f()
	}
	// A peer that closed after finishing k collectives with us takes part
	// in none after the k-th. active is published before doneAt is read,
	// and readControl stores doneAt before it reads active: one of the two
	// sees the other (both are sequentially consistent atomics).
	for _, p := range b.peers {
		if p != nil {
			p.active.Store(int64(p.completed.Load()) + 1)
		}
	}
	defer func() {
		for _, p := range b.peers {
			if p != nil {
				p.active.Store(0)
			}
		}
	}()
	for _, p := range b.peers {
		if p != nil {
			if at := p.doneAt.Load(); at >= 0 && p.active.Load() > at {
				return fmt.Errorf("tcp: %s: %w", name, b.fail(&backends.PeerError{Rank: p.rank, Err: errPeerClosed}))
			}
		}
	}
	stop := context.AfterFunc(ctx, func() {
		b.fail(fmt.Errorf("%s aborted: %w", name, ctx.Err()))
	})
	err := f()
	stop()
	if err != nil {
		return fmt.Errorf("tcp: %s: %w", name, b.fail(err))
	}
	for _, p := range b.peers {
		if p != nil {
			p.completed.Add(1)
		}
	}
	return nil
}

// Group returns the Backend of the group of ranks (backends.Grouper):
// ranks of b, ascending, b's own among them. It costs no communication: the
// group uses the engine's connections to its members, in the order of the
// collectives that the members share, so its members need not call Group
// at the same moment; the same ranks give the same Backend.
func (b *Backend) Group(ranks []int) (backends.Backend, error) {
	me := -1
	for i, r := range ranks {
		if r < 0 || r >= b.size || i > 0 && r <= ranks[i-1] {
			return nil, fmt.Errorf("tcp: group %v: ranks must be ascending and in [0, %d)", ranks, b.size)
		}
		if r == b.rank {
			me = i
		}
	}
	if me < 0 {
		return nil, fmt.Errorf("tcp: group %v does not hold this rank (%d)", ranks, b.rank)
	}
	peers := make([]*peer, len(ranks))
	for i, r := range ranks {
		peers[i] = b.peers[r]
	}
	key := make([]byte, 0, 4*len(ranks))
	for _, p := range peers {
		if p == nil {
			key = strconv.AppendInt(key, int64(b.engine.rank), 10)
		} else {
			key = strconv.AppendInt(key, int64(p.rank), 10)
		}
		key = append(key, ',')
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if g := b.groups[string(key)]; g != nil && !g.closed.Load() {
		return g, nil
	}
	if b.groups == nil {
		b.groups = make(map[string]*Backend)
	}
	g := &Backend{engine: b.engine, rank: me, size: len(ranks), peers: peers, sub: true}
	b.groups[string(key)] = g
	return g, nil
}

// send writes buf to rank's data connection on stream s.
func (b *Backend) send(p *peer, s int, buf []byte) error {
	if len(buf) == 0 {
		return nil
	}
	if _, err := p.data[s].Write(buf); err != nil {
		return b.linkErr(p.rank, fmt.Errorf("send to rank %d: %w", p.rank, err))
	}
	p.sent.Add(int64(len(buf)))
	return nil
}

// tuning is the settings in force for the collective about to run.
func (e *engine) tuning() *backends.Tuning { return e.tune.Load() }

// Tuning returns the per-collective settings in force (backends.Tunable).
func (b *Backend) Tuning() backends.Tuning { return *b.tuning() }

// MaxStreams is Config.Streams: the data connections opened per peer, the
// most streams a collective can be dealt over.
func (b *Backend) MaxStreams() int { return b.cfg.Streams }

// SetTuning changes the settings of the collectives that follow; zero
// fields keep theirs (backends.Tunable). Every rank must make the same
// change between the same two collectives: the handshake that checked
// Config's values does not see it. A group view shares its parent's
// settings.
func (b *Backend) SetTuning(t backends.Tuning) error {
	next := *b.tuning()
	switch {
	case t.Streams < 0 || t.Streams > b.cfg.Streams:
		return fmt.Errorf("tcp: %d streams is outside [1, %d] (the connections opened per peer)", t.Streams, b.cfg.Streams)
	case t.ChunkBytes != 0 && t.ChunkBytes < 64:
		return fmt.Errorf("tcp: chunk of %d bytes is below 64", t.ChunkBytes)
	}
	if t.Streams != 0 {
		next.Streams = t.Streams
	}
	if t.ChunkBytes != 0 {
		next.ChunkBytes = t.ChunkBytes
	}
	if t.SmallBytes != 0 {
		next.SmallBytes = t.SmallBytes
	}
	b.tune.Store(&next)
	return nil
}

// LoopRunnable reports that collectives on up to Config.SmallBytes wait in
// the kernel (see recvPoll), never in Go's network poller.
func (b *Backend) LoopRunnable() int { return b.tuning().SmallBytes }

// recv fills buf from rank's data connection on stream s.
func (b *Backend) recv(p *peer, s int, buf []byte) error {
	if len(buf) == 0 {
		return nil
	}
	if len(buf) <= b.tuning().SmallBytes {
		if err := b.recvPoll(p.data[s], buf); err != nil {
			return b.linkErr(p.rank, fmt.Errorf("receive from rank %d: %w", p.rank, err))
		}
		p.recv.Add(int64(len(buf)))
		return nil
	}
	if _, err := io.ReadFull(p.data[s], buf); err != nil {
		return b.linkErr(p.rank, fmt.Errorf("receive from rank %d: %w", p.rank, err))
	}
	p.recv.Add(int64(len(buf)))
	return nil
}

// recvPoll fills a small buf from c, waiting for data in poll(2), so that the
// calling thread sleeps in the kernel and is woken by it directly, instead of
// the goroutine parking in Go's network poller. Between waits of at most
// 10 ms it checks whether the backend has failed (a peer lost, Close).
func (b *engine) recvPoll(c net.Conn, buf []byte) error {
	sc, ok := c.(syscall.Conn)
	if !ok {
		_, err := io.ReadFull(c, buf)
		return err
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return err
	}
	got := 0
	var rerr error
	err = rc.Read(func(fd uintptr) bool {
		pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		for got < len(buf) {
			n, err := unix.Read(int(fd), buf[got:])
			switch {
			case n > 0:
				got += n
			case err == unix.EAGAIN:
				if ferr := b.failure(); ferr != nil {
					rerr = ferr
					return true
				}
				unix.Poll(pfd, 10)
			case err == unix.EINTR:
			case err != nil:
				rerr = err
				return true
			default:
				rerr = io.ErrUnexpectedEOF
				return true
			}
		}
		return true
	})
	if err != nil {
		return err
	}
	return rerr
}

// exchange sends out to and receives in from rank p (possibly different
// lengths) on stream s. When out fits the socket send buffer it is written
// before the read, from the calling goroutine: the write cannot block, since
// the buffer has room, and the exchange costs no goroutine wake-up. Larger
// messages are written from a second goroutine while this one reads, so two
// ranks exchanging with each other cannot both block in write.
func (b *Backend) exchange(to *peer, out []byte, from *peer, in []byte, s int) error {
	if len(out) <= b.inlineMax {
		if err := b.send(to, s, out); err != nil {
			return err
		}
		return b.recv(from, s, in)
	}
	errc := make(chan error, 1)
	go func() { errc <- b.send(to, s, out) }()
	rerr := b.recv(from, s, in)
	if serr := <-errc; rerr == nil {
		return serr
	}
	return rerr
}

// getBuf returns a scratch buffer of n bytes; putBuf gives it back. New
// buffers get room for a compressed message's header beyond n, so that the
// scratch of a segment (or of a small buffer) and the one of its
// compressed message (wireCap, compress.go) reuse each other's.
func (b *engine) getBuf(n int) *[]byte {
	p, _ := b.bufs.Get().(*[]byte)
	if p == nil || cap(*p) < n {
		s := make([]byte, n, n+wireHeader)
		return &s
	}
	*p = (*p)[:n]
	return p
}

func (b *engine) putBuf(p *[]byte) { b.bufs.Put(p) }
