package fake

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"sync"

	"github.com/hvdd/hvdd/gpu"
	"github.com/hvdd/hvdd/reduce"
	"github.com/hvdd/hvdd/tensor"
)

// NCCLVersion is the NCCL version the fake reports (2.21.5).
const NCCLVersion = 22105

const idMagic = "HVDDNCID"

// NCCL is the fake gpu.NCCL. The zero value is ready to use; its methods are
// safe for concurrent use.
type NCCL struct {
	// mu guards groups.
	mu     sync.Mutex
	groups map[int64]*group // by goroutine: NCCL's groups are per thread
}

var _ gpu.NCCL = (*NCCL)(nil)

// NewNCCL returns a fake NCCL.
func NewNCCL() *NCCL { loadEnv(); return &NCCL{} }

// Version returns NCCLVersion.
func (n *NCCL) Version() (int, error) {
	if err := check("ncclGetVersion"); err != nil {
		return 0, err
	}
	return NCCLVersion, nil
}

// GetUniqueID starts a hub in this process and returns its id.
func (n *NCCL) GetUniqueID() (gpu.UniqueID, error) {
	const call = "ncclGetUniqueId"
	var id gpu.UniqueID
	if err := check(call); err != nil {
		return id, err
	}
	var r [8]byte
	rand.Read(r[:])
	// A socket file, which ranks in other network namespaces (the
	// multi-node tests' hosts) reach too; the abstract namespace when the
	// temporary directory's path is too long for a socket address.
	base := fmt.Sprintf("hvdd-fake-nccl-%d-%s", os.Getpid(), hex.EncodeToString(r[:]))
	name := filepath.Join(os.TempDir(), base+".sock")
	if len(name) > 100 {
		name = "@" + base
	}
	ln, err := net.Listen("unix", name)
	if err != nil {
		return id, newErr(call, ncclSystemError, "listen on %s: %v", name, err)
	}
	h := &hub{ln: ln}
	go h.accept()
	copy(id[:8], idMagic)
	id[8] = byte(len(name))
	copy(id[9:], name)
	return id, nil
}

// The wire between ranks and the hub: frames of a 32-byte header (kind,
// coll, dtype, op: one byte each; a: int32; seq, count, plen: uint64; all
// little-endian) and plen payload bytes.
const (
	fHello  = iota + 1 // rank -> hub: a = rank, count = nranks
	fReady             // hub -> rank: everyone joined
	fColl              // rank -> hub: a collective's contribution (a = root)
	fResult            // hub -> rank: a collective's result for seq
	fP2P               // send: a = destination; delivered: a = source
	fAbort             // either way: the communicator is dead (payload: why)
	fBye               // rank -> hub: destroyed cleanly
)

// Collective kinds in frames.
const (
	cAllReduce = iota + 1
	cBroadcast
	cReduce
	cAllGather
	cReduceScatter
)

var collNames = map[uint8]string{cAllReduce: "ncclAllReduce", cBroadcast: "ncclBroadcast", cReduce: "ncclReduce", cAllGather: "ncclAllGather", cReduceScatter: "ncclReduceScatter"}

type frame struct {
	kind, coll, dtype, op uint8
	a                     int32
	seq, count            uint64
	payload               []byte
}

const frameHeader = 32

// maxPayload bounds a frame's payload (a corrupt header must not allocate
// without bound).
const maxPayload = 1 << 34

func writeFrame(w io.Writer, f *frame) error {
	var h [frameHeader]byte
	h[0], h[1], h[2], h[3] = f.kind, f.coll, f.dtype, f.op
	binary.LittleEndian.PutUint32(h[4:], uint32(f.a))
	binary.LittleEndian.PutUint64(h[8:], f.seq)
	binary.LittleEndian.PutUint64(h[16:], f.count)
	binary.LittleEndian.PutUint64(h[24:], uint64(len(f.payload)))
	if _, err := w.Write(h[:]); err != nil {
		return err
	}
	_, err := w.Write(f.payload)
	return err
}

func readFrame(r io.Reader) (*frame, error) {
	var h [frameHeader]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return nil, err
	}
	f := &frame{kind: h[0], coll: h[1], dtype: h[2], op: h[3], a: int32(binary.LittleEndian.Uint32(h[4:])),
		seq: binary.LittleEndian.Uint64(h[8:]), count: binary.LittleEndian.Uint64(h[16:])}
	n := binary.LittleEndian.Uint64(h[24:])
	if n > maxPayload {
		return nil, fmt.Errorf("frame payload of %d bytes", n)
	}
	if n > 0 {
		f.payload = make([]byte, n)
		if _, err := io.ReadFull(r, f.payload); err != nil {
			return nil, err
		}
	}
	return f, nil
}

// hub is the star at the centre of a fake communicator, in the process that
// made its UniqueID.
type hub struct {
	ln net.Listener

	// mu guards the fields that follow.
	mu     sync.Mutex
	nranks int
	conns  []*hubConn // by rank
	joined int
	colls  map[uint64][]*frame // seq -> contributions by rank
	gone   int                 // ranks that said bye or failed
	dead   bool
	lnShut bool
}

type hubConn struct {
	c   net.Conn
	wmu sync.Mutex // serialises writes
	bye bool       // guarded by hub.mu
}

func (hc *hubConn) send(f *frame) error {
	hc.wmu.Lock()
	defer hc.wmu.Unlock()
	return writeFrame(hc.c, f)
}

func (h *hub) accept() {
	for {
		c, err := h.ln.Accept()
		if err != nil {
			return
		}
		go h.serve(c)
	}
}

// serve reads one rank's connection: its hello, then its frames.
func (h *hub) serve(c net.Conn) {
	r := bufio.NewReader(c)
	f, err := readFrame(r)
	if err != nil || f.kind != fHello {
		c.Close()
		return
	}
	hc := &hubConn{c: c}
	rank, nranks := int(f.a), int(f.count)
	h.mu.Lock()
	if h.nranks == 0 && !h.dead {
		h.nranks = nranks
		h.conns = make([]*hubConn, nranks)
		h.colls = map[uint64][]*frame{}
	}
	if h.dead || nranks != h.nranks || rank < 0 || rank >= nranks || h.conns[rank] != nil {
		why := fmt.Sprintf("rank %d of %d refused: the communicator has %d ranks (or this rank joined already, or it failed)", rank, nranks, h.nranks)
		h.mu.Unlock()
		hc.send(&frame{kind: fAbort, payload: []byte(why)})
		c.Close()
		return
	}
	h.conns[rank] = hc
	h.joined++
	all := h.joined == h.nranks
	var conns []*hubConn
	if all {
		conns = append(conns, h.conns...)
		h.lnShut = true
	}
	h.mu.Unlock()
	if all {
		h.ln.Close()
		for _, x := range conns {
			x.send(&frame{kind: fReady})
		}
	}
	for {
		f, err := readFrame(r)
		if err != nil {
			h.mu.Lock()
			clean := hc.bye
			h.mu.Unlock()
			if clean {
				h.leave()
			} else {
				h.fail(fmt.Sprintf("connection of rank %d lost: %v", rank, err))
			}
			c.Close()
			return
		}
		switch f.kind {
		case fColl:
			h.coll(rank, f)
		case fP2P:
			h.mu.Lock()
			var to *hubConn
			if int(f.a) >= 0 && int(f.a) < h.nranks {
				to = h.conns[f.a]
			}
			h.mu.Unlock()
			if to == nil {
				h.fail(fmt.Sprintf("rank %d sent to peer %d, not in the communicator", rank, f.a))
				continue
			}
			f.a = int32(rank)
			to.send(f)
		case fAbort:
			h.fail(fmt.Sprintf("rank %d aborted the communicator", rank))
		case fBye:
			h.mu.Lock()
			hc.bye = true
			h.mu.Unlock()
		}
	}
}

// leave counts a rank gone after Destroy; the last one ends the hub.
func (h *hub) leave() {
	h.mu.Lock()
	h.gone++
	h.mu.Unlock()
}

// fail kills the communicator: every rank still connected gets an abort
// frame with why, and every connection is closed.
func (h *hub) fail(why string) {
	h.mu.Lock()
	if h.dead {
		h.mu.Unlock()
		return
	}
	h.dead = true
	conns := append([]*hubConn(nil), h.conns...)
	shut := !h.lnShut
	h.lnShut = true
	h.mu.Unlock()
	if shut {
		h.ln.Close()
	}
	for _, x := range conns {
		if x != nil {
			x.send(&frame{kind: fAbort, payload: []byte(why)})
			x.c.Close()
		}
	}
}

// coll records rank's contribution to collective f.seq and, once every rank
// has contributed, computes the results and sends them.
func (h *hub) coll(rank int, f *frame) {
	h.mu.Lock()
	parts := h.colls[f.seq]
	if parts == nil {
		parts = make([]*frame, h.nranks)
		h.colls[f.seq] = parts
	}
	parts[rank] = f
	for _, p := range parts {
		if p == nil {
			h.mu.Unlock()
			return
		}
	}
	delete(h.colls, f.seq)
	conns := append([]*hubConn(nil), h.conns...)
	h.mu.Unlock()

	results, err := compute(parts)
	if err != nil {
		h.fail(err.Error())
		return
	}
	for r, x := range conns {
		x.send(&frame{kind: fResult, seq: f.seq, payload: results[r]})
	}
}

// compute returns each rank's result of one collective.
func compute(parts []*frame) ([][]byte, error) {
	n := len(parts)
	p0 := parts[0]
	name := collNames[p0.coll]
	for r, p := range parts {
		if p.coll != p0.coll || p.dtype != p0.dtype || p.op != p0.op || p.a != p0.a || p.count != p0.count {
			return nil, fmt.Errorf("collective %d: rank %d called %s(count %d, %v, %v, root %d), rank 0 %s(count %d, %v, %v, root %d)",
				p0.seq, r, collNames[p.coll], p.count, tensor.DType(p.dtype), tensor.ReduceOp(p.op), p.a,
				name, p0.count, tensor.DType(p0.dtype), tensor.ReduceOp(p0.op), p0.a)
		}
	}
	dt, op, root := tensor.DType(p0.dtype), tensor.ReduceOp(p0.op), int(p0.a)
	out := make([][]byte, n)
	reduceAll := func() ([]byte, error) {
		srcs := make([][]byte, n)
		for r, p := range parts {
			srcs[r] = p.payload
		}
		res := make([]byte, len(srcs[0]))
		post := 1.0
		if op == tensor.Average {
			op, post = tensor.Sum, 1/float64(n)
		}
		if err := reduce.Reduce([][]byte{res}, srcs, dt, op, 1, post, nil); err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		return res, nil
	}
	switch p0.coll {
	case cAllReduce:
		res, err := reduceAll()
		if err != nil {
			return nil, err
		}
		for r := range out {
			out[r] = res
		}
	case cReduce:
		res, err := reduceAll()
		if err != nil {
			return nil, err
		}
		out[root] = res
	case cBroadcast:
		for r := range out {
			out[r] = parts[root].payload
		}
	case cAllGather:
		var all []byte
		for _, p := range parts {
			all = append(all, p.payload...)
		}
		for r := range out {
			out[r] = all
		}
	case cReduceScatter:
		res, err := reduceAll()
		if err != nil {
			return nil, err
		}
		k := len(res) / n
		for r := range out {
			out[r] = res[r*k : (r+1)*k]
		}
	default:
		return nil, fmt.Errorf("unknown collective %d", p0.coll)
	}
	return out, nil
}

// parseID returns the hub's socket address of id.
func parseID(id gpu.UniqueID) (string, error) {
	if string(id[:8]) != idMagic || int(id[8]) == 0 || 9+int(id[8]) > len(id) {
		return "", errors.New("not a fake NCCL unique id")
	}
	return string(id[9 : 9+int(id[8])]), nil
}

// comm is one rank of a fake communicator.
type comm struct {
	n          *NCCL
	dev        *device
	rank, size int
	conn       net.Conn
	wmu        sync.Mutex    // serialises writes
	failed     chan struct{} // closed when the communicator broke or was aborted
	readerDone chan struct{}

	// mu guards the fields that follow.
	mu       sync.Mutex
	seq      uint64 // collectives issued
	waiting  map[uint64]chan []byte
	inbox    map[int][][]byte
	arrived  chan struct{} // closed (and replaced) when inbox grows
	asyncErr *gpu.Error
	closed   bool // Abort or Destroy called
}

var _ gpu.Comm = (*comm)(nil)

// CommInitRank joins the communicator of id.
func (n *NCCL) CommInitRank(ctx context.Context, dev gpu.Device, nranks int, id gpu.UniqueID, rank int) (gpu.Comm, error) {
	const call = "ncclCommInitRank"
	if err := check(call); err != nil {
		return nil, err
	}
	d, ok := dev.(*device)
	if !ok || d == nil {
		return nil, newErr(call, ncclInvalidArgument, "device %T is not a fake device", dev)
	}
	if d.closed.Load() {
		return nil, newErr(call, ncclInvalidArgument, "device %d is closed", d.ctx.index)
	}
	if nranks < 1 || rank < 0 || rank >= nranks {
		return nil, newErr(call, ncclInvalidArgument, "rank %d of %d", rank, nranks)
	}
	name, err := parseID(id)
	if err != nil {
		return nil, newErr(call, ncclInvalidArgument, "%v", err)
	}
	var dialer net.Dialer
	conn, err := dialer.DialContext(ctx, "unix", name)
	if err != nil {
		return nil, newErr(call, ncclSystemError, "rank %d of %d: connect to the bootstrap root %s: %v", rank, nranks, name, err)
	}
	// ctx bounds the join: its end closes the connection, which aborts the
	// half-made communicator at the hub.
	joined := make(chan struct{})
	stop := context.AfterFunc(ctx, func() {
		select {
		case <-joined:
		default:
			conn.Close()
		}
	})
	defer stop()
	r := bufio.NewReader(conn)
	err = writeFrame(conn, &frame{kind: fHello, a: int32(rank), count: uint64(nranks)})
	var f *frame
	if err == nil {
		f, err = readFrame(r)
	}
	if err == nil && f.kind != fReady {
		err = fmt.Errorf("%s", f.payload)
	}
	close(joined)
	if err != nil {
		conn.Close()
		if ctx.Err() != nil {
			return nil, fmt.Errorf("%s: rank %d of %d: %w", call, rank, nranks, ctx.Err())
		}
		return nil, newErr(call, ncclRemoteError, "rank %d of %d: %v", rank, nranks, err)
	}
	c := &comm{n: n, dev: d, rank: rank, size: nranks, conn: conn, failed: make(chan struct{}), readerDone: make(chan struct{}),
		waiting: map[uint64]chan []byte{}, inbox: map[int][][]byte{}, arrived: make(chan struct{})}
	go c.read(r)
	return c, nil
}

// CommInitAll makes a communicator over devs in this process.
func (n *NCCL) CommInitAll(devs []gpu.Device) ([]gpu.Comm, error) {
	const call = "ncclCommInitAll"
	if err := check(call); err != nil {
		return nil, err
	}
	if len(devs) == 0 {
		return nil, newErr(call, ncclInvalidArgument, "no devices")
	}
	id, err := n.GetUniqueID()
	if err != nil {
		return nil, err
	}
	comms := make([]gpu.Comm, len(devs))
	errs := make([]error, len(devs))
	var wg sync.WaitGroup
	for i, d := range devs {
		wg.Go(func() {
			comms[i], errs[i] = n.CommInitRank(context.Background(), d, len(devs), id, i)
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		for _, c := range comms {
			if c != nil {
				c.Abort()
			}
		}
		return nil, fmt.Errorf("%s: %w", call, err)
	}
	return comms, nil
}

// read receives the hub's frames until the connection ends.
func (c *comm) read(r *bufio.Reader) {
	defer close(c.readerDone)
	for {
		f, err := readFrame(r)
		if err != nil {
			c.fail(ncclRemoteError, fmt.Sprintf("rank %d: connection to the communicator's root lost: %v", c.rank, err))
			return
		}
		switch f.kind {
		case fResult:
			c.mu.Lock()
			ch := c.waiting[f.seq]
			delete(c.waiting, f.seq)
			c.mu.Unlock()
			if ch != nil {
				ch <- f.payload
			}
		case fP2P:
			c.mu.Lock()
			c.inbox[int(f.a)] = append(c.inbox[int(f.a)], f.payload)
			close(c.arrived)
			c.arrived = make(chan struct{})
			c.mu.Unlock()
		case fAbort:
			c.fail(ncclRemoteError, fmt.Sprintf("rank %d: %s", c.rank, f.payload))
		}
	}
}

// fail breaks the communicator: AsyncError reports code and why (unless it
// was aborted or destroyed here), and blocked work ends.
func (c *comm) fail(code int, why string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.asyncErr == nil && !c.closed {
		c.asyncErr = newErr("ncclCommGetAsyncError", code, "%s", why)
	}
	select {
	case <-c.failed:
	default:
		close(c.failed)
	}
}

func (c *comm) Rank() int          { return c.rank }
func (c *comm) Size() int          { return c.size }
func (c *comm) Device() gpu.Device { return c.dev }

func (c *comm) AsyncError() error {
	if err := check("ncclCommGetAsyncError"); err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.asyncErr == nil {
		return nil
	}
	return c.asyncErr
}

func (c *comm) Abort() error {
	return c.end("ncclCommAbort", fAbort, true, "aborted")
}

func (c *comm) Destroy() error {
	return c.end("ncclCommDestroy", fBye, false, "destroyed")
}

// end closes the communicator once (Abort and Destroy): it tells the hub
// with a frame of kind, closes the connection and waits for the reader.
// failFirst marks the communicator failed before the frame goes (Abort:
// blocked calls end at once) rather than after (Destroy).
func (c *comm) end(call string, kind uint8, failFirst bool, why string) error {
	c.mu.Lock()
	was := c.closed
	c.closed = true
	c.mu.Unlock()
	if was {
		return newErr(call, ncclInvalidUsage, "communicator already aborted or destroyed")
	}
	if failFirst {
		c.fail(ncclRemoteError, why)
	}
	c.wmu.Lock()
	writeFrame(c.conn, &frame{kind: kind})
	c.wmu.Unlock()
	c.conn.Close()
	if !failFirst {
		c.fail(ncclRemoteError, why)
	}
	<-c.readerDone
	return check(call)
}

// write sends f to the hub. On an error the connection is broken: write
// waits for the reader to see why (an abort from the hub comes first) so
// that AsyncError names the cause, not the broken pipe.
func (c *comm) write(f *frame) error {
	c.wmu.Lock()
	err := writeFrame(c.conn, f)
	c.wmu.Unlock()
	if err != nil {
		c.conn.Close()
		<-c.readerDone
	}
	return err
}

// ncclDType checks that NCCL has dt.
func ncclDType(call string, dt tensor.DType) error {
	switch dt {
	case tensor.Uint8, tensor.Int8, tensor.Int32, tensor.Int64, tensor.Float16, tensor.BFloat16, tensor.Float32, tensor.Float64:
		return nil
	}
	return newErr(call, ncclInvalidArgument, "NCCL has no dtype %v", dt)
}

func ncclOp(call string, op tensor.ReduceOp) error {
	switch op {
	case tensor.Sum, tensor.Min, tensor.Max, tensor.Product, tensor.Average:
		return nil
	}
	return newErr(call, ncclInvalidArgument, "NCCL has no reduction %v", op)
}

// start checks a call on c and returns its stream.
func (c *comm) start(call string, s gpu.Stream, count int, dt tensor.DType) (*stream, error) {
	if err := check(call); err != nil {
		return nil, err
	}
	c.mu.Lock()
	closed := c.closed
	c.mu.Unlock()
	if closed {
		return nil, newErr(call, ncclInvalidUsage, "communicator aborted or destroyed")
	}
	if err := c.dev.ctx.err(call); err != nil {
		return nil, newErr(call, ncclUnhandledCudaError, "%v", err)
	}
	if count < 0 {
		return nil, newErr(call, ncclInvalidArgument, "count %d", count)
	}
	if err := ncclDType(call, dt); err != nil {
		return nil, err
	}
	fs, err := asStream(call, c.dev.ctx, s)
	if err != nil {
		return nil, newErr(call, ncclInvalidArgument, "%v", err)
	}
	return fs, nil
}

// holdAll resolves the spans of a call (a zero size skips one).
func holdAll(call string, ptrs []gpu.DevicePtr, sizes []int) ([]span, error) {
	var spans []span
	for i, p := range ptrs {
		if sizes[i] == 0 {
			spans = append(spans, span{})
			continue
		}
		sp, err := hold(call, p, sizes[i])
		if err != nil {
			for _, x := range spans {
				x.release()
			}
			return nil, newErr(call, ncclInvalidArgument, "%s", err.(*gpu.Error).Desc)
		}
		spans = append(spans, sp)
	}
	return spans, nil
}

// collective queues one collective: its contribution is send's bytes (nil
// for none), and its result lands in recv (when the hub sends one).
func (c *comm) collective(call string, s gpu.Stream, kind uint8, send, recv gpu.DevicePtr, sendBytes, recvBytes, count int, dt tensor.DType, op tensor.ReduceOp, root int) error {
	fs, err := c.start(call, s, count, dt)
	if err != nil {
		return err
	}
	spans, err := holdAll(call, []gpu.DevicePtr{send, recv}, []int{sendBytes, recvBytes})
	if err != nil {
		return err
	}
	c.mu.Lock()
	c.seq++
	seq := c.seq
	c.mu.Unlock()
	run := func(quit <-chan struct{}) error {
		ch := make(chan []byte, 1)
		c.mu.Lock()
		c.waiting[seq] = ch
		c.mu.Unlock()
		f := &frame{kind: fColl, coll: kind, dtype: uint8(dt), op: uint8(op), a: int32(root), seq: seq, count: uint64(count)}
		if sendBytes > 0 {
			f.payload = append([]byte(nil), spans[0].bytes...)
		}
		if err := c.write(f); err != nil {
			c.fail(ncclSystemError, fmt.Sprintf("rank %d: %s: %v", c.rank, call, err))
			return nil
		}
		select {
		case res := <-ch:
			if recvBytes > 0 {
				if len(res) != recvBytes {
					c.fail(ncclInternalError, fmt.Sprintf("rank %d: %s: %d result bytes for a %d-byte buffer", c.rank, call, len(res), recvBytes))
					return nil
				}
				copy(spans[1].bytes, res)
			}
		case <-c.failed:
		case <-quit:
		}
		return nil
	}
	done := func() {
		for _, sp := range spans {
			sp.release()
		}
	}
	return c.n.issue(fs, work{call: call, run: run, done: done}, false)
}

func (c *comm) Allreduce(s gpu.Stream, send, recv gpu.DevicePtr, count int, dt tensor.DType, op tensor.ReduceOp) error {
	const call = "ncclAllReduce"
	if err := ncclOp(call, op); err != nil {
		return err
	}
	b := count * dt.Size()
	return c.collective(call, s, cAllReduce, send, recv, b, b, count, dt, op, 0)
}

func (c *comm) Broadcast(s gpu.Stream, send, recv gpu.DevicePtr, count int, dt tensor.DType, root int) error {
	const call = "ncclBroadcast"
	if root < 0 || root >= c.size {
		return newErr(call, ncclInvalidArgument, "root %d of %d", root, c.size)
	}
	b := count * dt.Size()
	sb := 0
	if c.rank == root {
		sb = b
	}
	return c.collective(call, s, cBroadcast, send, recv, sb, b, count, dt, tensor.Sum, root)
}

func (c *comm) Reduce(s gpu.Stream, send, recv gpu.DevicePtr, count int, dt tensor.DType, op tensor.ReduceOp, root int) error {
	const call = "ncclReduce"
	if err := ncclOp(call, op); err != nil {
		return err
	}
	if root < 0 || root >= c.size {
		return newErr(call, ncclInvalidArgument, "root %d of %d", root, c.size)
	}
	b := count * dt.Size()
	rb := 0
	if c.rank == root {
		rb = b
	}
	return c.collective(call, s, cReduce, send, recv, b, rb, count, dt, op, root)
}

func (c *comm) AllGather(s gpu.Stream, send, recv gpu.DevicePtr, sendCount int, dt tensor.DType) error {
	const call = "ncclAllGather"
	b := sendCount * dt.Size()
	return c.collective(call, s, cAllGather, send, recv, b, b*c.size, sendCount, dt, tensor.Sum, 0)
}

func (c *comm) ReduceScatter(s gpu.Stream, send, recv gpu.DevicePtr, recvCount int, dt tensor.DType, op tensor.ReduceOp) error {
	const call = "ncclReduceScatter"
	if err := ncclOp(call, op); err != nil {
		return err
	}
	b := recvCount * dt.Size()
	return c.collective(call, s, cReduceScatter, send, recv, b*c.size, b, recvCount, dt, op, 0)
}

func (c *comm) Send(s gpu.Stream, buf gpu.DevicePtr, count int, dt tensor.DType, peer int) error {
	const call = "ncclSend"
	fs, err := c.start(call, s, count, dt)
	if err != nil {
		return err
	}
	if peer < 0 || peer >= c.size {
		return newErr(call, ncclInvalidArgument, "peer %d of %d", peer, c.size)
	}
	spans, err := holdAll(call, []gpu.DevicePtr{buf}, []int{count * dt.Size()})
	if err != nil {
		return err
	}
	run := func(<-chan struct{}) error {
		f := &frame{kind: fP2P, a: int32(peer), dtype: uint8(dt), count: uint64(count), payload: append([]byte{}, spans[0].bytes...)}
		if err := c.write(f); err != nil {
			c.fail(ncclSystemError, fmt.Sprintf("rank %d: %s to %d: %v", c.rank, call, peer, err))
		}
		return nil
	}
	return c.n.issue(fs, work{call: call, run: run, done: spans[0].release}, true)
}

func (c *comm) Recv(s gpu.Stream, buf gpu.DevicePtr, count int, dt tensor.DType, peer int) error {
	const call = "ncclRecv"
	fs, err := c.start(call, s, count, dt)
	if err != nil {
		return err
	}
	if peer < 0 || peer >= c.size {
		return newErr(call, ncclInvalidArgument, "peer %d of %d", peer, c.size)
	}
	n := count * dt.Size()
	spans, err := holdAll(call, []gpu.DevicePtr{buf}, []int{n})
	if err != nil {
		return err
	}
	run := func(quit <-chan struct{}) error {
		for {
			c.mu.Lock()
			if q := c.inbox[peer]; len(q) > 0 {
				b := q[0]
				c.inbox[peer] = q[1:]
				c.mu.Unlock()
				if len(b) != n {
					c.fail(ncclInvalidUsage, fmt.Sprintf("rank %d: %s from %d: %d bytes sent, %d expected", c.rank, call, peer, len(b), n))
					return nil
				}
				copy(spans[0].bytes, b)
				return nil
			}
			ch := c.arrived
			c.mu.Unlock()
			select {
			case <-ch:
			case <-c.failed:
				return nil
			case <-quit:
				return nil
			}
		}
	}
	return c.n.issue(fs, work{call: call, run: run, done: spans[0].release}, false)
}

// group is the calls one goroutine issued between GroupStart and GroupEnd.
type group struct {
	depth int
	items []groupItem
}

type groupItem struct {
	s    *stream
	w    work
	send bool
}

// goid returns the calling goroutine's id (NCCL's groups are per thread; the
// fake's are per goroutine).
func goid() int64 {
	var buf [64]byte
	b := buf[:runtime.Stack(buf[:], false)]
	// "goroutine 123 [running]:..."
	b = b[len("goroutine "):]
	i := 0
	for i < len(b) && b[i] >= '0' && b[i] <= '9' {
		i++
	}
	id, _ := strconv.ParseInt(string(b[:i]), 10, 64)
	return id
}

// issue queues w on s, or keeps it for GroupEnd inside a group.
func (n *NCCL) issue(s *stream, w work, send bool) error {
	id := goid()
	n.mu.Lock()
	if g := n.groups[id]; g != nil {
		g.items = append(g.items, groupItem{s, w, send})
		n.mu.Unlock()
		return nil
	}
	n.mu.Unlock()
	return s.enqueue(w)
}

// GroupStart opens (or nests) the calling goroutine's group.
func (n *NCCL) GroupStart() error {
	if err := check("ncclGroupStart"); err != nil {
		return err
	}
	id := goid()
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.groups == nil {
		n.groups = map[int64]*group{}
	}
	g := n.groups[id]
	if g == nil {
		g = &group{}
		n.groups[id] = g
	}
	g.depth++
	return nil
}

// GroupEnd issues the group's calls: per stream, in the order of the
// streams' first use, its sends first and then the rest in call order.
func (n *NCCL) GroupEnd() error {
	const call = "ncclGroupEnd"
	id := goid()
	n.mu.Lock()
	g := n.groups[id]
	if g == nil {
		n.mu.Unlock()
		return newErr(call, ncclInvalidUsage, "ncclGroupEnd without ncclGroupStart")
	}
	g.depth--
	if g.depth > 0 {
		n.mu.Unlock()
		return check(call)
	}
	delete(n.groups, id)
	n.mu.Unlock()
	if err := check(call); err != nil {
		for _, it := range g.items {
			it.w.done()
		}
		return err
	}
	var order []*stream
	per := map[*stream][]groupItem{}
	for _, it := range g.items {
		if per[it.s] == nil {
			order = append(order, it.s)
		}
		per[it.s] = append(per[it.s], it)
	}
	var errs []error
	for _, s := range order {
		for _, sends := range []bool{true, false} {
			for _, it := range per[s] {
				if it.send == sends {
					if err := s.enqueue(it.w); err != nil {
						errs = append(errs, err)
					}
				}
			}
		}
	}
	return errors.Join(errs...)
}
