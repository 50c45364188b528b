package loop

import (
	"errors"
	"fmt"
	"math"
	"math/bits"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/hvdd/hvdd/daemon/internal/exec/device"
	"github.com/hvdd/hvdd/daemon/internal/job"
	"github.com/hvdd/hvdd/ipc"
	"github.com/hvdd/hvdd/ipc/ipcpb"
	"github.com/hvdd/hvdd/shm"
	"github.com/hvdd/hvdd/tensor"
)

// grantedBase is the first region id the daemon uses for regions it grants; the
// ids below belong to the client.
const grantedBase = 0x80000000

// maxDims bounds a tensor's rank; more is refused as absurd.
const maxDims = 64

// client is one connection. The loop goroutine owns the read side, the region
// table and the job fields; the executor writes Done frames (ipc.Conn
// serialises writes) and allocates outputs, which have their own lock.
type client struct {
	l   *Loop
	ic  *ipc.Conn
	pid int32 // from SO_PEERCRED
	uid uint32

	// Owned by the loop goroutine.
	fd        int // the socket, registered with the loop's poller
	regions   map[uint32]*region
	hello     bool
	status    bool // a status connection (hvdd status): no Hello, no job
	bye       bool
	reset     bool // its Goodbye says it re-initialises at once (elastic)
	exiting   bool // its Goodbye says its process exits (no re-initialisation)
	dropped   bool
	lane      *lane // the job lane its hello went to (lanes.go)
	job       *job.Job
	localRank int
	rank      int
	helloMsg  *ipcpb.Hello
	groups    map[uint64][]*job.Op // partial groups by client group id
	chReg     *region              // the channel's mapping, while registered
	sockIn    uint64               // counted socket frames taken since the channel
	sockWant  uint64               // counted socket frames owed before the ring

	// txMu serialises what the daemon sends this client: the channel's
	// sending side and the socket writes it counts.
	txMu   sync.Mutex
	ch     *ipc.Channel // shared-memory frame rings; nil until registered
	outq   [][]byte     // frames waiting for room in the ring (see sendBatch)
	hasOut atomic.Bool  // outq is not empty: the loop must flush it

	out outputRegions
	gpu device.ConnGPU // its GPU mappings and device outputs
}

// region is a mapped client or daemon region with a reference count: the
// registration holds one, each op in flight holds one, and the mapping is
// closed when the count drops to zero.
type region struct {
	id   uint32
	m    *shm.Region
	refs atomic.Int32
	acct *atomic.Int64 // the Server's count of its kind of mapping (metrics.go)
}

func (r *region) ref() { r.refs.Add(1) }

// Unref drops a reference; the last closes the mapping (job.Mapping).
func (r *region) Unref() {
	if r.refs.Add(-1) == 0 {
		r.unaccount()
		r.m.Close()
	}
}

func newClient(l *Loop, uc *net.UnixConn) (*client, error) {
	ic, err := ipc.NewConn(uc)
	if err != nil {
		return nil, err
	}
	// A client that stops reading must not stall the daemon for long.
	ic.WriteTimeout = 5 * time.Second
	return &client{l: l, ic: ic, regions: make(map[uint32]*region), localRank: -1, rank: -1, gpu: device.ConnGPU{Log: l.cfg.Log}}, nil
}

// shmClose closes a received descriptor that will not be mapped.
func shmClose(fd int) { unix.Close(fd) }

// PID is the client's pid (SO_PEERCRED).
func (c *client) PID() int32 { return c.pid }

// Rank is the client's global rank in its job.
func (c *client) Rank() int { return c.rank }

// clientOf is the loop's client behind a connection of its jobs: every conn
// of a job the loop formed is one of its clients.
func clientOf(c job.Conn) *client {
	if c == nil {
		return nil
	}
	return c.(*client)
}

// String names the client for logs: its rank and pid once it joined a job.
func (c *client) String() string {
	if c.job != nil {
		return fmt.Sprintf("rank %d (pid %d)", c.rank, c.pid)
	}
	return fmt.Sprintf("client pid %d", c.pid)
}

// readable handles the frames a client has sent, without blocking: at most
// maxFramesPerWake of them, so one chatty client cannot starve the others. more
// reports that it stopped at the limit (frames may wait in user space, where
// epoll cannot see them). sock says the socket is readable; without it only
// the channel (and socket frames it says are owed) is read. A non-nil error
// means the connection must be dropped.
func (l *Loop) readable(c *client, sock bool) (more bool, err error) {
	for i := 0; i < maxFramesPerWake; i++ {
		if c.dropped {
			return false, nil
		}
		f, ok, err := c.nextFrame(sock)
		if err != nil {
			return false, err
		}
		if !ok {
			return false, nil
		}
		if f.Kind == ipc.KindWake {
			continue
		}
		id, m, err := ipc.DecodeClient(f)
		if err != nil {
			return false, err
		}
		if err := l.handle(c, id, m); err != nil {
			return false, err
		}
	}
	return true, nil
}

// nextFrame returns the client's next frame in the order it sent them: socket
// frames the channel says were sent before what its ring holds, then the ring,
// then (when sock says the socket is readable, or bytes wait in the buffer)
// the socket's own.
func (c *client) nextFrame(sock bool) (ipc.Frame, bool, error) {
	if c.ch != nil && c.sockIn >= c.sockWant {
		f, ok, err := c.ch.Next()
		if !ok && err == nil {
			// The ring is read up to the last snapshot: take a new one.
			want := c.ch.Snapshot()
			if want < c.sockWant {
				return ipc.Frame{}, false, &ipc.ProtocolError{Msg: fmt.Sprintf("channel: socket frame count went back from %d to %d", c.sockWant, want)}
			}
			c.sockWant = want
			if c.sockIn >= c.sockWant {
				f, ok, err = c.ch.Next()
			}
		}
		if ok || err != nil {
			return f, ok, err
		}
		if c.sockIn >= c.sockWant && !sock && !c.ic.Buffered() {
			return ipc.Frame{}, false, nil
		}
	}
	// The socket: frames the ring's counter says came first, or its own.
	f, ok, err := c.ic.TryReadFrame()
	if ok && f.Kind != ipc.KindWake && c.ch != nil {
		c.sockIn++
	}
	return f, ok, err
}

// maxFramesPerWake bounds the frames one client gets handled per poll.
const maxFramesPerWake = 64

// handle acts on one client message.
func (l *Loop) handle(c *client, id uint32, m *ipcpb.ClientMessage) error {
	if c.bye {
		return &ipc.ProtocolError{Msg: "message after Goodbye"}
	}
	switch m := m.Msg.(type) {
	case *ipcpb.ClientMessage_Hello:
		if c.hello {
			return &ipc.ProtocolError{Msg: "second Hello on one connection"}
		}
		if c.status {
			return &ipc.ProtocolError{Msg: "Hello on a status connection"}
		}
		if v := m.Hello.GetVersion(); v != ipc.Version {
			return &ipc.ProtocolError{Msg: fmt.Sprintf("client speaks protocol version %d, this daemon speaks %d: upgrade the client or the daemon", v, ipc.Version)}
		}
		c.hello = true
		l.hello(c, m.Hello)
	case *ipcpb.ClientMessage_RegisterRegion:
		return c.register(m.RegisterRegion)
	case *ipcpb.ClientMessage_UnregisterRegion:
		r, ok := c.regions[m.UnregisterRegion.GetRegion()]
		if !ok {
			return &ipc.ProtocolError{Msg: fmt.Sprintf("unregister of unknown region %d", m.UnregisterRegion.GetRegion())}
		}
		delete(c.regions, r.id)
		r.Unref()
	case *ipcpb.ClientMessage_Enqueue:
		if !c.hello {
			return &ipc.ProtocolError{Msg: "Enqueue before Hello"}
		}
		o, err := c.Resolve(id, m.Enqueue)
		if err == nil && o.Dev != nil {
			// A device tensor's IPC handles open off the loop: the op
			// joins the negotiation once they are (msgOpened).
			e := m.Enqueue
			now, oerr := o.Dev.WhenOpen(func(err error) { l.p.Post(msgOpened{c: c, o: o, e: e, err: err}) })
			if !now {
				return nil
			}
			if err = oerr; err != nil {
				o.Release()
			}
		}
		if err != nil {
			l.refuseOp(c, id, m.Enqueue, err)
			return nil
		}
		l.enqueue(o)
	case *ipcpb.ClientMessage_AddProcessSet:
		if !c.hello {
			return &ipc.ProtocolError{Msg: "AddProcessSet before Hello"}
		}
		ranks := make([]int, len(m.AddProcessSet.GetRanks()))
		for i, r := range m.AddProcessSet.GetRanks() {
			ranks[i] = int(r)
		}
		l.processSetReq(job.SetReq{Conn: c, ID: id, Add: true, Ranks: ranks, Local: m.AddProcessSet.GetLocal()})
	case *ipcpb.ClientMessage_RemoveProcessSet:
		if !c.hello {
			return &ipc.ProtocolError{Msg: "RemoveProcessSet before Hello"}
		}
		l.processSetReq(job.SetReq{Conn: c, ID: id, Set: m.RemoveProcessSet.GetProcessSet()})
	case *ipcpb.ClientMessage_Status:
		if c.hello {
			return &ipc.ProtocolError{Msg: "StatusRequest on a job's connection: ask on a connection of its own"}
		}
		l.statusRequest(c, id, m.Status)
	case *ipcpb.ClientMessage_Timeline:
		if !c.hello {
			return &ipc.ProtocolError{Msg: "Timeline before Hello"}
		}
		l.timelineRequest(c, id, m.Timeline)
	case *ipcpb.ClientMessage_Release:
		if h := m.Release.GetDeviceOutput(); len(h) > 0 {
			if err := c.gpu.ReleaseOutput(h); err != nil {
				return &ipc.ProtocolError{Msg: err.Error()}
			}
			break
		}
		if err := c.out.Release(m.Release.GetBuffer()); err != nil {
			return &ipc.ProtocolError{Msg: err.Error()}
		}
	case *ipcpb.ClientMessage_RegisterChannel:
		if err := c.registerChannel(m.RegisterChannel); err != nil {
			return err
		}
		l.chans = append(l.chans, c)
		l.cfg.Log.Debug("shared-memory channel registered", "pid", c.pid, "local_rank", c.localRank)
	case *ipcpb.ClientMessage_ReleaseDeviceMemory:
		c.gpu.ReleaseMemory(m.ReleaseDeviceMemory)
	case *ipcpb.ClientMessage_Goodbye:
		c.bye, c.reset, c.exiting = true, m.Goodbye.GetElasticReset(), m.Goodbye.GetExiting()
	default:
		return &ipc.ProtocolError{Msg: fmt.Sprintf("unknown client message %T", m)}
	}
	return nil
}

// fatalError ends a connection with a Fatal of the given code.
type fatalError struct {
	code ipcpb.Code
	msg  string
}

// Error is the message the client is told.
func (e *fatalError) Error() string { return e.msg }

// checkPeer reads the peer's credentials and decides whether it may connect.
func (c *client) checkPeer() error {
	cred, err := c.ic.PeerCred()
	if err != nil {
		return err
	}
	c.pid, c.uid = cred.Pid, cred.Uid
	c.gpu.Log = c.l.cfg.Log.With("pid", c.pid)
	if !c.l.allowed(cred.Uid, cred.Gid) && !c.l.allowedGroups(c.ic.FD()) {
		return &fatalError{ipcpb.Code_CODE_PERMISSION_DENIED,
			fmt.Sprintf("uid %d gid %d may not use this daemon (it runs as uid %d; add the group with --allow-gid)", cred.Uid, cred.Gid, c.l.cfg.UID)}
	}
	return nil
}

// release drops the connection's hold on its regions and descriptors. Called
// once, by the loop, after the socket is closed.
func (c *client) releaseConn() {
	c.ic.CloseFDs()
	for _, r := range c.regions {
		r.Unref()
	}
	c.regions = nil
	c.gpu.Close()
	if c.chReg != nil {
		c.txMu.Lock()
		c.ch = nil
		c.txMu.Unlock()
		c.chReg.Unref()
		c.chReg = nil
	}
}

func (c *client) register(m *ipcpb.RegisterRegion) error {
	fd, err := c.ic.PopFD()
	if err != nil {
		return err
	}
	id := m.GetRegion()
	if id >= grantedBase {
		shmClose(fd)
		return &ipc.ProtocolError{Msg: fmt.Sprintf("region id %#x is in the daemon's range (client ids are below %#x)", id, grantedBase)}
	}
	if _, dup := c.regions[id]; dup {
		shmClose(fd)
		return &ipc.ProtocolError{Msg: fmt.Sprintf("region %d registered twice", id)}
	}
	if m.GetSize() > shm.MaxRegion {
		shmClose(fd)
		return &ipc.ProtocolError{Msg: fmt.Sprintf("region %d claims an absurd size of %d bytes", id, m.GetSize())}
	}
	if len(c.regions) >= 4096 {
		shmClose(fd)
		return &ipc.ProtocolError{Msg: "more than 4096 regions registered"}
	}
	sm, err := shm.Open(fd, int64(m.GetSize()))
	if err != nil {
		return &ipc.ProtocolError{Msg: fmt.Sprintf("region %d: %v", id, err)}
	}
	r := &region{id: id, m: sm}
	r.refs.Store(1)
	r.account(&c.l.mapped.client)
	c.regions[id] = r
	return nil
}

// registerChannel maps the client's channel region; from now on its frames
// may come through the rings and its Done frames go out through them.
func (c *client) registerChannel(m *ipcpb.RegisterChannel) error {
	fd, err := c.ic.PopFD()
	if err != nil {
		return err
	}
	if c.chReg != nil {
		shmClose(fd)
		return &ipc.ProtocolError{Msg: "second RegisterChannel on one connection"}
	}
	if m.GetSize() > 64<<20 {
		shmClose(fd)
		return &ipc.ProtocolError{Msg: fmt.Sprintf("channel region of %d bytes is absurd", m.GetSize())}
	}
	sm, err := shm.Open(fd, int64(m.GetSize()))
	if err != nil {
		return &ipc.ProtocolError{Msg: fmt.Sprintf("channel region: %v", err)}
	}
	ch, err := ipc.NewChannel(sm.Bytes(), ipc.DaemonSide)
	if err != nil {
		sm.Close()
		return &ipc.ProtocolError{Msg: err.Error()}
	}
	r := &region{id: ^uint32(0), m: sm}
	r.refs.Store(1)
	r.account(&c.l.mapped.channel)
	c.chReg = r
	c.txMu.Lock()
	c.ch = ch
	c.txMu.Unlock()
	return nil
}

// Resolve checks an Enqueue against the protocol and the client's regions and
// turns it into an op holding a reference on its region.
func (c *client) Resolve(id uint32, e *ipcpb.Enqueue) (*job.Op, error) {
	t := tensor.OpType(e.GetOp())
	if !t.Valid() {
		return nil, fmt.Errorf("unknown collective %d", e.GetOp())
	}
	o := &job.Op{Conn: c, ID: id, Type: t, Name: e.GetName(), Group: e.GetGroup(), GroupSize: int(e.GetGroupSize())}
	o.Req.Op = t
	o.Req.Name = e.GetName()
	o.Req.ProcessSet = e.GetProcessSet()
	if o.Req.ProcessSet < 0 {
		// Negative ids are the daemon's own (plan.PairSet).
		return nil, fmt.Errorf("%v %q: process set %d does not exist: use an id that AddProcessSet returned", t, o.Name, o.Req.ProcessSet)
	}
	if t == tensor.Barrier || t == tensor.Join {
		return o, nil
	}
	if o.Name == "" {
		return nil, fmt.Errorf("%v without a name", t)
	}
	dt := tensor.DType(e.GetDtype())
	if !dt.Valid() {
		return nil, fmt.Errorf("tensor %q: unsupported dtype %d", o.Name, e.GetDtype())
	}
	if len(e.GetShape()) > maxDims {
		return nil, fmt.Errorf("tensor %q: %d dimensions (at most %d)", o.Name, len(e.GetShape()), maxDims)
	}
	// numel * size must not overflow and must equal the buffer length.
	n := uint64(dt.Size())
	for _, d := range e.GetShape() {
		if d < 0 {
			return nil, fmt.Errorf("tensor %q: negative dimension in shape %v", o.Name, e.GetShape())
		}
		hi, lo := bits.Mul64(n, uint64(d))
		if hi != 0 || lo > shm.MaxRegion {
			return nil, fmt.Errorf("tensor %q: shape %v is absurdly large", o.Name, e.GetShape())
		}
		n = lo
	}
	b := e.GetBuffer()
	if db := e.GetDeviceBuffer(); db != nil {
		if b != nil {
			return nil, fmt.Errorf("tensor %q: both a host buffer and a device buffer", o.Name)
		}
		dv, err := c.l.cfg.GPUs.Resolve(&c.gpu, o.Name, db, n)
		if err != nil {
			return nil, err
		}
		o.Dev = dv
		o.Req.Device, o.Req.GPU = true, dv.GPU()
	} else if b.GetLength() != n {
		return nil, fmt.Errorf("tensor %q: buffer of %d bytes for shape %v of %v (%d bytes)", o.Name, b.GetLength(), e.GetShape(), dt, n)
	}
	if n > 0 && o.Dev == nil {
		r, ok := c.regions[b.GetRegion()]
		if !ok {
			return nil, fmt.Errorf("tensor %q: buffer in unknown region %d", o.Name, b.GetRegion())
		}
		buf, err := r.m.Slice(b.GetOffset(), b.GetLength())
		if err != nil {
			return nil, fmt.Errorf("tensor %q: %v", o.Name, err)
		}
		r.ref()
		o.Reg, o.Buf = r, buf
	}
	pre, post := e.GetPrescale(), e.GetPostscale()
	if pre == 0 {
		pre = 1
	}
	if post == 0 {
		post = 1
	}
	if math.IsNaN(pre) || math.IsInf(pre, 0) || math.IsNaN(post) || math.IsInf(post, 0) {
		o.Release()
		return nil, fmt.Errorf("tensor %q: scale factors must be finite (prescale %v, postscale %v)", o.Name, pre, post)
	}
	o.Req.DType = dt
	o.Req.Shape = tensor.Shape(e.GetShape())
	o.Req.ReduceOp = tensor.ReduceOp(e.GetReduceOp())
	o.Req.Prescale, o.Req.Postscale = pre, post
	o.Req.Root = int(e.GetRootRank())
	o.Req.Splits = e.GetSplits()
	o.Peer, o.Tag = int(e.GetPeerRank()), e.GetTag()
	if !o.Req.ReduceOp.Valid() {
		o.Release()
		return nil, fmt.Errorf("tensor %q: unknown reduce op %d", o.Name, e.GetReduceOp())
	}
	return o, nil
}

// Reply sends a Done for frame id. Write errors mean the client is gone; its
// reader notices that on its own.
func (c *client) Reply(id uint32, d *ipcpb.Done) {
	c.SendBatch([]uint32{id}, []*ipcpb.ServerMessage{{Msg: &ipcpb.ServerMessage_Done{Done: d}}})
}

// SendBatch sends messages that carry no descriptor: through the channel when
// there is one and it has room (ringing the doorbell if the client sleeps),
// else on the socket in one write.
//
// The daemon never waits for a client that does not read: when the ring is
// full the frames wait in memory (at most one Done per op in flight) and the
// loop moves them into the ring as the client makes room (flushOut). A
// socket write could block the loop, whose client might itself be waiting for
// room in its own ring: each would wait for the other.
func (c *client) SendBatch(ids []uint32, ms []*ipcpb.ServerMessage) error {
	c.txMu.Lock()
	defer c.txMu.Unlock()
	if c.ch != nil {
		published := false
		for i, m := range ms {
			b, err := c.ch.Encode(ipc.KindServer, ids[i], m)
			if err != nil {
				return err
			}
			if len(b) > c.ch.MaxFrame() {
				// Too large for the ring at all: the socket (counted).
				if err := c.ic.WriteRaw(b, -1); err != nil {
					return err
				}
				c.ch.SocketSent(1)
				continue
			}
			if len(c.outq) == 0 {
				ok, err := c.ch.SendFrame(b)
				if err != nil {
					return err
				}
				if ok {
					published = true
					continue
				}
			}
			c.outq = append(c.outq, slices.Clone(b))
			c.hasOut.Store(true)
		}
		if published && c.ch.PeerAsleep() {
			c.ic.TryWriteWake()
		}
		return nil
	}
	err := c.ic.WriteServerBatch(ids, ms)
	if err == nil && c.ch != nil {
		c.ch.SocketSent(len(ms))
	}
	return err
}

// flushOut moves frames that waited for room into the channel's ring, as far
// as they fit, ringing the doorbell if the client sleeps. The loop calls it
// for clients whose hasOut is set.
func (c *client) flushOut() error {
	c.txMu.Lock()
	defer c.txMu.Unlock()
	if c.ch == nil {
		c.outq = nil
		c.hasOut.Store(false)
		return nil
	}
	n := 0
	for _, b := range c.outq {
		ok, err := c.ch.SendFrame(b)
		if err != nil {
			return err
		}
		if !ok {
			break
		}
		n++
	}
	if n > 0 {
		c.outq = slices.Delete(c.outq, 0, n)
		if c.ch.PeerAsleep() {
			c.ic.TryWriteWake()
		}
	}
	c.hasOut.Store(len(c.outq) > 0)
	return nil
}

// sendSocket sends a message on the socket (with fd, if >= 0), counted for
// the channel so that the client takes it before later ring frames.
func (c *client) sendSocket(id uint32, m *ipcpb.ServerMessage, fd int) error {
	c.txMu.Lock()
	defer c.txMu.Unlock()
	err := c.ic.WriteServer(id, m, fd)
	if err == nil && c.ch != nil {
		c.ch.SocketSent(1)
	}
	return err
}

// outputRegions are the daemon-owned regions granted to one client for results.
type outputRegions struct {
	// mu guards the fields that follow.
	mu      sync.Mutex
	regions []*outRegion
	nextID  uint32
	closed  bool
}

type outRegion struct {
	id    uint32
	m     *shm.Region
	arena *shm.Arena
	acct  *atomic.Int64 // the Server's count of output mappings (metrics.go)
}

// OutputBytes returns the bytes of a granted output buffer.
func (c *client) OutputBytes(b *ipcpb.Buffer) ([]byte, error) {
	if b.GetLength() == 0 {
		return nil, nil
	}
	o := &c.out
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, r := range o.regions {
		if r.id == b.GetRegion() {
			return r.m.Slice(b.GetOffset(), b.GetLength())
		}
	}
	return nil, fmt.Errorf("output in unknown region %#x", b.GetRegion())
}

// ReleaseOutput gives back an output buffer the daemon read itself.
func (c *client) ReleaseOutput(b *ipcpb.Buffer) error { return c.out.Release(b) }

// alloc reserves n bytes in one of c's output regions, granting a new region to
// the client first when none has room.
func (c *client) AllocOutput(n int64) ([]byte, *ipcpb.Buffer, error) {
	if n == 0 {
		return nil, &ipcpb.Buffer{}, nil
	}
	o := &c.out
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.closed {
		return nil, nil, errors.New("client gone")
	}
	for _, r := range o.regions {
		if off, ok := r.arena.Alloc(n); ok {
			return r.m.Bytes()[off : off+n : off+n], &ipcpb.Buffer{Region: r.id, Offset: uint64(off), Length: uint64(n)}, nil
		}
	}
	size := max(c.l.cfg.OutputRegion, shm.RoundToPages(n))
	m, err := shm.Create(fmt.Sprintf("hvdd-out-%d", c.pid), size)
	if err != nil {
		return nil, nil, fmt.Errorf("output region: %w", err)
	}
	r := &outRegion{id: grantedBase + o.nextID, m: m, arena: shm.NewArena(size), acct: &c.l.mapped.output}
	o.nextID++
	if err := c.sendSocket(0, &ipcpb.ServerMessage{Msg: &ipcpb.ServerMessage_GrantRegion{
		GrantRegion: &ipcpb.GrantRegion{Region: r.id, Size: uint64(size)}}}, m.FD()); err != nil {
		m.Close()
		return nil, nil, fmt.Errorf("grant output region: %w", err)
	}
	o.regions = append(o.regions, r)
	r.acct.Add(size)
	off, _ := r.arena.Alloc(n)
	return m.Bytes()[off : off+n : off+n], &ipcpb.Buffer{Region: r.id, Offset: uint64(off), Length: uint64(n)}, nil
}

// Release gives back the part of an output region that b names.
func (o *outputRegions) Release(b *ipcpb.Buffer) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, r := range o.regions {
		if r.id == b.GetRegion() {
			if err := r.arena.Free(int64(b.GetOffset())); err != nil {
				return fmt.Errorf("release in region %#x: %v", r.id, err)
			}
			return nil
		}
	}
	return fmt.Errorf("release of a buffer in unknown region %#x", b.GetRegion())
}

// Close unmaps the output regions as the connection closes.
func (o *outputRegions) Close() {
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, r := range o.regions {
		r.acct.Add(-r.m.Size())
		r.m.Close()
	}
	o.regions = nil
	o.closed = true
}

// fatal tells a client why its connection is about to be closed.
func (c *client) fatal(code ipcpb.Code, msg string) {
	c.sendSocket(0, &ipcpb.ServerMessage{Msg: &ipcpb.ServerMessage_Fatal{Fatal: &ipcpb.Fatal{Code: code, Error: msg}}}, -1)
}

// allowedGroups reports whether the peer on socket fd has one of
// Config.AllowGIDs among its supplementary groups.
func (l *Loop) allowedGroups(fd int) bool {
	if len(l.cfg.AllowGIDs) == 0 {
		return false
	}
	gids, err := peerGroups(fd)
	if err != nil {
		l.cfg.Log.Warn("cannot read a client's supplementary groups; only its primary group counts", "err", err)
		return false
	}
	for _, g := range gids {
		if slices.Contains(l.cfg.AllowGIDs, g) {
			return true
		}
	}
	return false
}

// allowed reports whether a peer with these credentials may connect.
func (l *Loop) allowed(uid, gid uint32) bool {
	if uid == l.cfg.UID || uid == 0 {
		return true
	}
	for _, g := range l.cfg.AllowGIDs {
		if g == gid {
			return true
		}
	}
	return false
}

// Accept takes a connection the Server's accept goroutine got: it checks
// the peer, then, if admit lets it in (the Server is not closing), hands it
// to the loop. Safe from any goroutine.
func (l *Loop) Accept(uc *net.UnixConn, admit func() bool) {
	c, err := newClient(l, uc)
	if err != nil {
		l.cfg.Log.Warn("refusing connection", "err", err)
		uc.Close()
		return
	}
	if err := c.checkPeer(); err != nil {
		l.cfg.Log.Warn("refusing connection", "pid", c.pid, "uid", c.uid, "err", err)
		var fe *fatalError
		if errors.As(err, &fe) {
			c.fatal(fe.code, fe.msg)
		}
		c.ic.Close()
		return
	}
	if !admit() {
		uc.Close()
		return
	}
	l.p.Post(msgConn{c})
}

// Worker is the launcher's name for the client's process (Hello.worker,
// HVDD_WORKER); "" when it gave none.
func (c *client) Worker() string { return c.helloMsg.GetWorker() }
