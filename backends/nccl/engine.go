package nccl

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/hvdd/hvdd/backends"
	"github.com/hvdd/hvdd/gpu"
	"github.com/hvdd/hvdd/tensor"
)

// InitTimeout bounds Join: NCCL's bootstrap waits for every rank, and a
// rank that never comes must not hold the caller forever.
const InitTimeout = 60 * time.Second

// WatchInterval is how often Wait looks at the communicators while the
// stream runs: NCCL reports a failed peer through ncclCommGetAsyncError, not
// through the stream, and a kernel that waits for a dead peer ends only
// once the communicator is aborted.
const WatchInterval = 20 * time.Millisecond

// DrainTimeout bounds the wait for a stream to drain after an abort, so
// that a stream stuck on work of another library does not hold Wait.
const DrainTimeout = 10 * time.Second

// ncclMinBF16 is the first NCCL version with bfloat16 and ncclAvg (2.10).
const ncclMinBF16 = 21000

// Engine is one rank of an NCCL communicator, a backends.DeviceEngine. It
// also implements backends.DeviceGrouper and backends.DevicePeer. Make it
// with NewLocal or Join; the zero value is not usable.
type Engine struct {
	lib     gpu.NCCL
	comm    gpu.Comm
	dev     gpu.Device
	idx     int // in cl.comms
	rank    int
	size    int
	version int // ncclGetVersion's, 0 if unknown
	cl      *clique
}

var (
	_ backends.DeviceEngine  = (*Engine)(nil)
	_ backends.DeviceGrouper = (*Engine)(nil)
	_ backends.DevicePeer    = (*Engine)(nil)
)

// clique is the communicators made together (one ncclCommInitAll, or the
// one rank of a Join): their engines fail together, since a group over
// them cannot go on once one is gone.
type clique struct {
	// mu guards the fields that follow. It is never held across a call
	// that can block (an enqueue, a group's end, a stream wait); it is held
	// across ncclCommGetAsyncError, which does not block, so that a
	// communicator is never freed under it.
	mu    sync.Mutex
	comms []gpu.Comm
	gone  []bool // comms[i] aborted or destroyed: never touched again
	// err is nil while the engines are usable, then why they are not
	// (wrapping backends.ErrAborted or backends.ErrClosed).
	err error
	// busy counts the calls in progress (enqueues, groups, Waits): Close
	// aborts rather than destroys while it is positive.
	busy int
	// groups counts the Groups open; a library failure inside one is
	// aborted at the outermost end (abortDue), after ncclGroupEnd, which
	// still touches the communicators.
	groups   int
	abortDue bool
}

// newClique returns the engines over comms (rank i at comms[i]).
func newClique(lib gpu.NCCL, comms []gpu.Comm) []*Engine {
	version, _ := lib.Version()
	cl := &clique{comms: comms, gone: make([]bool, len(comms))}
	es := make([]*Engine, len(comms))
	for i, c := range comms {
		es[i] = &Engine{lib: lib, comm: c, dev: c.Device(), idx: i, rank: c.Rank(), size: c.Size(), version: version, cl: cl}
	}
	return es
}

// NewLocal makes the node-local engines: one communicator over devs
// (ncclCommInitAll), rank i on devs[i], every rank in this process. The
// engines fail together; a goroutine that drives several of them issues
// their calls inside Group. Each must be closed.
func NewLocal(lib gpu.NCCL, devs []gpu.Device) ([]*Engine, error) {
	if lib == nil {
		return nil, errors.New("nccl: no NCCL library")
	}
	if len(devs) == 0 {
		return nil, errors.New("nccl: a communicator over no GPU")
	}
	comms, err := lib.CommInitAll(devs)
	if err != nil {
		return nil, fmt.Errorf("nccl: communicator over %d GPUs: %w", len(devs), err)
	}
	return newClique(lib, comms), nil
}

// NewUniqueID makes the bootstrap id of a communicator across nodes
// (ncclGetUniqueId, which starts NCCL's bootstrap root in this process):
// rank 0 makes it, and the control plane hands its bytes to every rank's
// Join.
func NewUniqueID(lib gpu.NCCL) ([]byte, error) {
	if lib == nil {
		return nil, errors.New("nccl: no NCCL library")
	}
	id, err := lib.GetUniqueID()
	if err != nil {
		return nil, fmt.Errorf("nccl: unique id: %w", err)
	}
	return id[:], nil
}

// Join makes this node's rank of the communicator across nodes whose
// bootstrap id is id (NewUniqueID's bytes, from the control plane): rank of
// size, on dev, joined with NCCL's own bootstrap (ncclCommInitRank). Every
// rank calls it concurrently; it returns once all have joined, or with an
// error when ctx ends or InitTimeout passes (the half-made communicator is
// then aborted).
func Join(ctx context.Context, lib gpu.NCCL, dev gpu.Device, id []byte, rank, size int) (*Engine, error) {
	if lib == nil {
		return nil, errors.New("nccl: no NCCL library")
	}
	if len(id) != gpu.UniqueIDSize {
		return nil, fmt.Errorf("nccl: a unique id of %d bytes, want %d", len(id), gpu.UniqueIDSize)
	}
	if size < 1 || rank < 0 || rank >= size {
		return nil, fmt.Errorf("nccl: rank %d of %d", rank, size)
	}
	var uid gpu.UniqueID
	copy(uid[:], id)
	ctx, cancel := context.WithTimeout(ctx, InitTimeout)
	defer cancel()
	c, err := lib.CommInitRank(ctx, dev, size, uid, rank)
	if err != nil {
		return nil, fmt.Errorf("nccl: rank %d joining a communicator of %d: %w", rank, size, err)
	}
	return newClique(lib, []gpu.Comm{c})[0], nil
}

// JoinWith is Join with the id carried by b, the host engine over the same
// nodes (whose connections the job's secret authenticated): b's rank 0
// makes the id and broadcasts it, and every rank joins as b.Rank() of
// b.Size(). Every rank of b calls it at the same point of its sequence of
// b's collectives. If rank 0 cannot make an id every rank fails alike.
func JoinWith(ctx context.Context, lib gpu.NCCL, dev gpu.Device, b backends.Backend) (*Engine, error) {
	// Byte 0 says whether rank 0 has an id.
	buf := make([]byte, 1+gpu.UniqueIDSize)
	var idErr error
	if b.Rank() == 0 {
		id, err := NewUniqueID(lib)
		if err == nil {
			buf[0] = 1
			copy(buf[1:], id)
		}
		idErr = err
	}
	if err := b.Broadcast(ctx, buf, 0); err != nil {
		return nil, fmt.Errorf("nccl: unique id through the %s engine: %w", b.Name(), err)
	}
	if buf[0] != 1 {
		if idErr != nil {
			return nil, idErr
		}
		return nil, errors.New("nccl: node rank 0 could not make a unique id")
	}
	return Join(ctx, lib, dev, buf[1:], b.Rank(), b.Size())
}

// Name returns "nccl".
func (e *Engine) Name() string { return "nccl" }

// Rank returns the engine's rank in its communicator.
func (e *Engine) Rank() int { return e.rank }

// Size returns the number of ranks of the communicator.
func (e *Engine) Size() int { return e.size }

// Device returns the GPU of the engine's rank.
func (e *Engine) Device() gpu.Device { return e.dev }

// errorf formats an error of the engine's, naming its rank.
func (e *Engine) errorf(format string, args ...any) error {
	return fmt.Errorf("nccl: rank %d of %d: %w", e.rank, e.size, fmt.Errorf(format, args...))
}

// enter starts a call: it fails with the reason once the engine has ended.
func (c *clique) enter() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		return c.err
	}
	c.busy++
	return nil
}

func (c *clique) leave() {
	c.mu.Lock()
	c.busy--
	c.mu.Unlock()
}

// end marks the clique ended with kind (backends.ErrAborted or ErrClosed)
// and cause, unless it ended already, and aborts every communicator not
// gone yet (outside mu: ncclCommAbort waits for the library's threads).
func (c *clique) end(kind, cause error) error {
	c.mu.Lock()
	if c.err == nil {
		c.err = kind
		if cause != nil {
			c.err = fmt.Errorf("%w: %w", kind, cause)
		}
	}
	c.abortDue = false
	var abort []gpu.Comm
	for i, g := range c.gone {
		if !g {
			c.gone[i] = true
			abort = append(abort, c.comms[i])
		}
	}
	c.mu.Unlock()
	var errs []error
	for _, cm := range abort {
		if err := cm.Abort(); err != nil {
			errs = append(errs, fmt.Errorf("ncclCommAbort of rank %d: %w", cm.Rank(), err))
		}
	}
	return errors.Join(errs...)
}

// failed ends the clique after err, a failure of the library: at once, or
// inside a Group at its outermost end (ncclGroupEnd still uses the
// communicators). Calls from now on fail.
func (c *clique) failed(err error) {
	c.mu.Lock()
	if c.groups > 0 {
		if c.err == nil {
			c.err = fmt.Errorf("%w: %w", backends.ErrAborted, err)
		}
		c.abortDue = true
		c.mu.Unlock()
		return
	}
	c.mu.Unlock()
	c.end(backends.ErrAborted, err)
}

// health returns why the clique ended, or the first asynchronous error of
// its communicators (then ending it), or nil.
func (c *clique) health() error {
	c.mu.Lock()
	if c.err != nil {
		err := c.err
		c.mu.Unlock()
		return err
	}
	var bad error
	for i, cm := range c.comms {
		if c.gone[i] {
			continue
		}
		if err := cm.AsyncError(); err != nil {
			bad = fmt.Errorf("communicator rank %d of %d failed: %w", cm.Rank(), cm.Size(), err)
			break
		}
	}
	c.mu.Unlock()
	if bad == nil {
		return nil
	}
	c.end(backends.ErrAborted, bad)
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// call runs one library call of e's: check, the call, and on its failure
// the end of the clique. check's error (bad arguments) leaves the engine
// usable.
func (e *Engine) call(what string, check func() error, f func() error) error {
	if err := e.cl.enter(); err != nil {
		return e.errorf("%s: %w", what, err)
	}
	defer e.cl.leave()
	if check != nil {
		if err := check(); err != nil {
			return e.errorf("%s: %w", what, err)
		}
	}
	if err := f(); err != nil {
		err = e.errorf("%s: %w", what, err)
		e.cl.failed(err)
		return err
	}
	return nil
}

// reduceArgs checks a reduction's count, dtype and op against NCCL's.
func (e *Engine) reduceArgs(count int, dt tensor.DType, op tensor.ReduceOp) error {
	if count < 0 {
		return fmt.Errorf("count %d", count)
	}
	switch dt {
	case tensor.Uint8, tensor.Int8, tensor.Int32, tensor.Int64, tensor.Float16, tensor.Float32, tensor.Float64:
	case tensor.BFloat16:
		if e.version < ncclMinBF16 {
			return fmt.Errorf("NCCL %d has no bfloat16 (2.10 has): %w", e.version, errors.ErrUnsupported)
		}
	default:
		return fmt.Errorf("NCCL reduces no %v: %w", dt, errors.ErrUnsupported)
	}
	switch op {
	case tensor.Sum, tensor.Min, tensor.Max, tensor.Product:
	case tensor.Average:
		if e.version < ncclMinBF16 {
			return fmt.Errorf("NCCL %d has no average (2.10 has): %w", e.version, errors.ErrUnsupported)
		}
	default:
		return fmt.Errorf("NCCL has no reduction %v: %w", op, errors.ErrUnsupported)
	}
	return nil
}

// moveArgs checks the count and dtype of a call that only moves data:
// NCCL moves any dtype, as bytes.
func moveArgs(count int, dt tensor.DType) error {
	if count < 0 {
		return fmt.Errorf("count %d", count)
	}
	if !dt.Valid() {
		return fmt.Errorf("dtype %v", dt)
	}
	return nil
}

// oneRankAverage is op as NCCL gets it: an average over one rank, which is
// the sum, goes as ncclSum. On one NVIDIA H200 (NCCL 2.28.3, driver 580)
// ncclAvg out of place at world size 1 left the last elements of an odd
// count (527,374 float32s: those from 527,360 on) unwritten, where ncclSum
// writes them all (scripts/gpu-check.sh, test:nccl-engine.test).
func (e *Engine) oneRankAverage(op tensor.ReduceOp) tensor.ReduceOp {
	if e.size == 1 && op == tensor.Average {
		return tensor.Sum
	}
	return op
}

// Allreduce enqueues ncclAllReduce.
func (e *Engine) Allreduce(s gpu.Stream, send, recv gpu.DevicePtr, count int, dt tensor.DType, op tensor.ReduceOp) error {
	return e.call("allreduce", func() error { return e.reduceArgs(count, dt, op) }, func() error {
		return e.comm.Allreduce(s, send, recv, count, dt, e.oneRankAverage(op))
	})
}

// Broadcast enqueues ncclBroadcast of count*dt.Size() bytes.
func (e *Engine) Broadcast(s gpu.Stream, send, recv gpu.DevicePtr, count int, dt tensor.DType, root int) error {
	return e.call("broadcast", func() error {
		if root < 0 || root >= e.size {
			return fmt.Errorf("root %d", root)
		}
		return moveArgs(count, dt)
	}, func() error {
		return e.comm.Broadcast(s, send, recv, count*dt.Size(), tensor.Uint8, root)
	})
}

// Allgather enqueues ncclAllGather of count*dt.Size() bytes per rank.
func (e *Engine) Allgather(s gpu.Stream, send, recv gpu.DevicePtr, count int, dt tensor.DType) error {
	return e.call("allgather", func() error { return moveArgs(count, dt) }, func() error {
		return e.comm.AllGather(s, send, recv, count*dt.Size(), tensor.Uint8)
	})
}

// ReduceScatter enqueues ncclReduceScatter.
func (e *Engine) ReduceScatter(s gpu.Stream, send, recv gpu.DevicePtr, count int, dt tensor.DType, op tensor.ReduceOp) error {
	return e.call("reducescatter", func() error { return e.reduceArgs(count, dt, op) }, func() error {
		return e.comm.ReduceScatter(s, send, recv, count, dt, e.oneRankAverage(op))
	})
}

// Send enqueues ncclSend of count*dt.Size() bytes; it belongs inside a
// Group with the peer's matching Recv.
func (e *Engine) Send(s gpu.Stream, buf gpu.DevicePtr, count int, dt tensor.DType, peer int) error {
	return e.call("send", func() error { return e.peerArgs(count, dt, peer) }, func() error {
		return e.comm.Send(s, buf, count*dt.Size(), tensor.Uint8, peer)
	})
}

// Recv enqueues ncclRecv of count*dt.Size() bytes; it belongs inside a
// Group with the peer's matching Send.
func (e *Engine) Recv(s gpu.Stream, buf gpu.DevicePtr, count int, dt tensor.DType, peer int) error {
	return e.call("recv", func() error { return e.peerArgs(count, dt, peer) }, func() error {
		return e.comm.Recv(s, buf, count*dt.Size(), tensor.Uint8, peer)
	})
}

func (e *Engine) peerArgs(count int, dt tensor.DType, peer int) error {
	if peer < 0 || peer >= e.size {
		return fmt.Errorf("peer %d", peer)
	}
	return moveArgs(count, dt)
}

// Alltoallv enqueues one group of ncclSend and ncclRecv: for every rank r
// (this one included) a send of sendCounts[r] elements and a receive of
// recvCounts[r], zero counts skipped (the peer skips the matching call,
// since its counts mirror ours).
func (e *Engine) Alltoallv(s gpu.Stream, send gpu.DevicePtr, sendCounts []int, recv gpu.DevicePtr, recvCounts []int, dt tensor.DType) error {
	if err := e.alltoallArgs(sendCounts, recvCounts, dt); err != nil {
		// Checked before the group, which would abort on it.
		if herr := e.cl.enter(); herr != nil {
			return e.errorf("alltoallv: %w", herr)
		}
		e.cl.leave()
		return e.errorf("alltoallv: %w", err)
	}
	es := dt.Size()
	return e.Group(func() error {
		sendOff, recvOff := 0, 0
		for r := range e.size {
			if n := sendCounts[r]; n > 0 {
				if err := e.Send(s, send.Add(sendOff*es), n, dt, r); err != nil {
					return err
				}
			}
			if n := recvCounts[r]; n > 0 {
				if err := e.Recv(s, recv.Add(recvOff*es), n, dt, r); err != nil {
					return err
				}
			}
			sendOff += sendCounts[r]
			recvOff += recvCounts[r]
		}
		return nil
	})
}

func (e *Engine) alltoallArgs(sendCounts, recvCounts []int, dt tensor.DType) error {
	if len(sendCounts) != e.size || len(recvCounts) != e.size {
		return fmt.Errorf("%d send and %d receive counts for %d ranks", len(sendCounts), len(recvCounts), e.size)
	}
	for r := range e.size {
		if sendCounts[r] < 0 || recvCounts[r] < 0 {
			return fmt.Errorf("negative count for rank %d", r)
		}
	}
	return moveArgs(0, dt)
}

// Group runs f between ncclGroupStart and ncclGroupEnd: the calls f makes,
// on e and on the engines made with e, are issued together at the end.
// NCCL's groups are per thread; the library binding keeps the goroutine on
// its thread until the end. If f or the group fails, Group aborts e's
// engines (at the outermost Group, after ncclGroupEnd) and returns the
// error; an error of f's that is not the library's aborts them too, since
// the calls it made would go without those it did not. f should call only
// engines made with e: an engine of another communicator that fails inside
// f is aborted before the group ends.
func (e *Engine) Group(f func() error) error {
	cl := e.cl
	if err := cl.enter(); err != nil {
		return e.errorf("group: %w", err)
	}
	defer cl.leave()
	cl.mu.Lock()
	cl.groups++
	cl.mu.Unlock()
	var errs []error
	if err := e.lib.GroupStart(); err != nil {
		errs = append(errs, err)
	} else {
		if err := f(); err != nil {
			errs = append(errs, err)
		}
		if err := e.lib.GroupEnd(); err != nil {
			errs = append(errs, err)
		}
	}
	cl.mu.Lock()
	cl.groups--
	outer, due := cl.groups == 0, cl.abortDue
	cl.mu.Unlock()
	if err := errors.Join(errs...); err != nil {
		err = e.errorf("group: %w", err)
		cl.failed(err)
		return err
	}
	if outer && due {
		cl.mu.Lock()
		why := cl.err
		cl.mu.Unlock()
		cl.end(backends.ErrAborted, nil)
		return e.errorf("group: %w", why)
	}
	return nil
}

// Wait synchronises s in slices of WatchInterval, looking at the
// communicators of e's clique after each (and after the last: NCCL may
// complete a collective whose peer failed without writing its result). An
// asynchronous error, the end of ctx, a failed stream or the engine's end
// by Abort or Close aborts the engines, drains s (up to DrainTimeout) and
// returns the error.
func (e *Engine) Wait(ctx context.Context, s gpu.Stream) error {
	cl := e.cl
	if err := cl.enter(); err != nil {
		return e.errorf("wait: %w", errors.Join(err, drain(s)))
	}
	defer cl.leave()
	for {
		wctx, cancel := context.WithTimeout(ctx, WatchInterval)
		serr := s.Synchronize(wctx)
		cancel()
		if err := cl.health(); err != nil {
			return e.errorf("wait: %w", errors.Join(err, drain(s)))
		}
		switch {
		case serr == nil:
			return nil
		case ctx.Err() != nil:
			cl.end(backends.ErrAborted, ctx.Err())
			return e.errorf("wait: %w", errors.Join(ctx.Err(), drain(s)))
		case !errors.Is(serr, context.DeadlineExceeded):
			// The stream failed: the device's context is broken.
			cl.end(backends.ErrAborted, serr)
			return e.errorf("wait: %w", serr)
		}
	}
}

// drain waits up to DrainTimeout for s, after an abort, so that the caller
// may reuse the buffers; it returns an error only if s did not drain.
func drain(s gpu.Stream) error {
	ctx, cancel := context.WithTimeout(context.Background(), DrainTimeout)
	defer cancel()
	if err := s.Synchronize(ctx); errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("the stream did not drain in %v after the abort", DrainTimeout)
	}
	return nil
}

// Err returns nil while e is usable, else why it is not (an error wrapping
// backends.ErrAborted or ErrClosed). It looks at the communicators'
// asynchronous errors too, and aborts the engines on one: a caller that
// keeps engines between jobs asks it before reusing them.
func (e *Engine) Err() error {
	if err := e.cl.health(); err != nil {
		return e.errorf("%w", err)
	}
	return nil
}

// Abort aborts e and the engines made with it (ncclCommAbort on each
// communicator not yet gone). It returns nil if they were ended already.
func (e *Engine) Abort() error {
	if err := e.cl.end(backends.ErrAborted, nil); err != nil {
		return e.errorf("abort: %w", err)
	}
	return nil
}

// Close destroys e's communicator (ncclCommDestroy) when e is idle and
// healthy; the engines made with e fail from then on with ErrClosed (each
// must still be closed). With a call or Wait in progress, or an
// asynchronous error pending, it aborts them all instead.
func (e *Engine) Close() error {
	cl := e.cl
	cl.mu.Lock()
	if cl.gone[e.idx] {
		cl.mu.Unlock()
		return nil
	}
	var cause error
	if cl.busy > 0 {
		cause = errors.New("closed with work in flight")
	} else if err := e.comm.AsyncError(); err != nil {
		cause = err
	}
	if cause != nil {
		cl.mu.Unlock()
		if err := cl.end(backends.ErrClosed, cause); err != nil {
			return e.errorf("close: %w", err)
		}
		return nil
	}
	cl.gone[e.idx] = true
	if cl.err == nil {
		cl.err = backends.ErrClosed
	}
	cl.mu.Unlock()
	if err := e.comm.Destroy(); err != nil {
		return e.errorf("close: %w", err)
	}
	return nil
}
