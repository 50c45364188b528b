package hvdd

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"unsafe"

	"github.com/hvdd/hvdd/ipc/ipcpb"
	"github.com/hvdd/hvdd/tensor"
)

// Float16 is an IEEE 754 half-precision number, stored as its bits.
type Float16 uint16

// BFloat16 is a bfloat16 number, stored as its bits.
type BFloat16 uint16

// Elem is the set of Go element types the collectives accept.
type Elem interface {
	uint8 | int8 | uint16 | int16 | int32 | int64 | Float16 | BFloat16 | float32 | float64 | bool
}

// DTypeOf returns the element type of T.
func DTypeOf[T Elem]() tensor.DType {
	var z T
	switch any(z).(type) {
	case uint8:
		return tensor.Uint8
	case int8:
		return tensor.Int8
	case uint16:
		return tensor.Uint16
	case int16:
		return tensor.Int16
	case int32:
		return tensor.Int32
	case int64:
		return tensor.Int64
	case Float16:
		return tensor.Float16
	case BFloat16:
		return tensor.BFloat16
	case float32:
		return tensor.Float32
	case float64:
		return tensor.Float64
	case bool:
		return tensor.Bool
	}
	panic("unreachable")
}

// Reduction ops, as in Horovod.
const (
	Average = tensor.Average
	Sum     = tensor.Sum
	Adasum  = tensor.Adasum
	Min     = tensor.Min
	Max     = tensor.Max
	Product = tensor.Product
)

// Option adjusts one collective call.
type Option func(*opts)

type opts struct {
	name      string
	op        tensor.ReduceOp
	prescale  float64
	postscale float64
	shape     []int64
	set       int32
	tag       int64 // send, recv: WithTag
}

// WithName names the tensor; ranks match tensors by name. Unnamed ops are
// named "<op>.noname.<n>" from this client's call order, as in Horovod.
func WithName(name string) Option { return func(o *opts) { o.name = name } }

// WithOp sets the reduction (default Average, as in Horovod).
func WithOp(op tensor.ReduceOp) Option { return func(o *opts) { o.op = op } }

// WithPrescale multiplies each rank's input by f before reducing.
func WithPrescale(f float64) Option { return func(o *opts) { o.prescale = f } }

// WithPostscale multiplies the reduced result by f.
func WithPostscale(f float64) Option { return func(o *opts) { o.postscale = f } }

// WithProcessSet runs the collective over the members of ps only (Horovod's
// process_set=); only they call it, and results count only them (an Average
// divides by ps's size). Broadcast roots stay global ranks.
func WithProcessSet(ps *ProcessSet) Option {
	return func(o *opts) {
		if ps != nil {
			o.set = ps.ID
		}
	}
}

// WithShape gives the tensor's shape; the slice holds its elements in row-major
// order. The default is one dimension, len(data). Allgather, alltoall and
// reducescatter work on the first dimension, so a matrix needs its shape.
func WithShape(dims ...int64) Option { return func(o *opts) { o.shape = dims } }

// Error is a failed collective, as the daemon reported it.
type Error struct {
	Code ipcpb.Code
	Msg  string
}

func (e *Error) Error() string { return e.Msg }

// Is makes errors.Is(err, ErrMismatch) and friends work on an *Error.
func (e *Error) Is(target error) bool {
	s, ok := target.(sentinel)
	return ok && ipcpb.Code(s) == e.Code
}

type sentinel ipcpb.Code

func (s sentinel) Error() string { return "hvdd: " + ipcpb.Code(s).String() }

// Error kinds, to test with errors.Is.
var (
	// ErrMismatch: ranks disagree about a tensor (shape, dtype, op, root...).
	ErrMismatch error = sentinel(ipcpb.Code_CODE_MISMATCH)
	// ErrAborted: the job failed because a rank or node was lost.
	ErrAborted error = sentinel(ipcpb.Code_CODE_ABORTED)
	// ErrShutDown: the daemon, this client or another rank shut down.
	ErrShutDown error = sentinel(ipcpb.Code_CODE_SHUT_DOWN)
	// ErrDuplicateName: a tensor of that name is already in flight here.
	ErrDuplicateName error = sentinel(ipcpb.Code_CODE_DUPLICATE_NAME)
	// ErrInvalidArgument: the request itself is wrong.
	ErrInvalidArgument error = sentinel(ipcpb.Code_CODE_INVALID_ARGUMENT)
	// ErrUnimplemented: Horovod has it, hvdd not yet.
	ErrUnimplemented error = sentinel(ipcpb.Code_CODE_UNIMPLEMENTED)
)

// Handle is an asynchronous collective in flight.
type Handle struct {
	c    *Client
	name string
	done chan struct{}
	res  *ipcpb.Done
	err  error
	// parts, for a grouped op, are the member handles; done is unused.
	parts []*Handle
	// after runs once, in Wait, on success: copies results back.
	after func(*ipcpb.Done) error
	// cleanup runs once, in Wait, always: frees staging memory.
	cleanup func()
	waited  bool
}

func (h *Handle) complete(d *ipcpb.Done, err error) {
	if err == nil && d.GetCode() != ipcpb.Code_CODE_OK {
		err = &Error{Code: d.GetCode(), Msg: d.GetError()}
	}
	h.res, h.err = d, err
	close(h.done)
}

func (h *Handle) isDone() bool {
	if h.parts != nil {
		for _, p := range h.parts {
			if !p.isDone() {
				return false
			}
		}
		return true
	}
	select {
	case <-h.done:
		return true
	default:
		return false
	}
}

// Poll reports whether the operation has finished (successfully or not),
// taking in whatever the daemon has answered meanwhile. It never blocks.
func (h *Handle) Poll() bool {
	if h.isDone() {
		return true
	}
	h.c.progress()
	return h.isDone()
}

// Wait blocks until the operation finishes or ctx is done. After a successful
// Wait, in-place results are in the caller's slice. Waiting again returns the
// same error. Abandoning a wait with ctx does not cancel the collective.
func (h *Handle) Wait(ctx context.Context) error {
	if h.parts != nil {
		if !h.waited {
			for _, p := range h.parts {
				if err := p.Wait(ctx); err != nil && h.err == nil {
					if ctx.Err() != nil {
						return err
					}
					h.err = err
				}
			}
			h.waited = true
		}
		return h.err
	}
	if err := h.c.waitFor(ctx, h); err != nil {
		return fmt.Errorf("hvdd: waiting for %q: %w", h.name, err)
	}
	if !h.waited {
		h.waited = true
		if h.err == nil && h.after != nil {
			h.err = h.after(h.res)
		}
		if h.cleanup != nil {
			h.cleanup()
		}
	}
	return h.err
}

// bytesOf views a typed slice as bytes.
func bytesOf[T Elem](s []T) []byte {
	if len(s) == 0 {
		return nil
	}
	var z T
	return unsafe.Slice((*byte)(unsafe.Pointer(&s[0])), len(s)*int(unsafe.Sizeof(z)))
}

// Alloc returns a slice of n elements in shared memory. Collectives on it (or
// on a sub-slice) reach the daemon without a copy. Give it back with Free.
func Alloc[T Elem](c *Client, n int) ([]T, error) {
	if n == 0 {
		return []T{}, nil
	}
	var z T
	b, _, _, err := c.alloc(int64(n) * int64(unsafe.Sizeof(z)))
	if err != nil {
		return nil, err
	}
	return unsafe.Slice((*T)(unsafe.Pointer(&b[0])), n), nil
}

// Free returns a slice from Alloc to the arena.
func Free[T Elem](c *Client, s []T) error {
	if len(s) == 0 {
		return nil
	}
	r, off, ok := c.locate(bytesOf(s))
	if !ok {
		return errors.New("hvdd: Free of a slice that Alloc did not return")
	}
	return r.arena.Free(off)
}

// submit sends one Enqueue and returns its handle. data is staged into shared
// memory unless it already lives there; in-place results are copied back by
// Wait when copyBack is set.
func (c *Client) submit(e *ipcpb.Enqueue, data []byte, copyBack bool) (*Handle, error) {
	h := &Handle{c: c, done: make(chan struct{})}
	if e.Name == "" && e.Op != ipcpb.OpType_OP_BARRIER && e.Op != ipcpb.OpType_OP_JOIN {
		kind := tensor.OpType(e.Op).String()
		c.mu.Lock()
		n := c.autoName[kind]
		c.autoName[kind] = n + 1
		c.mu.Unlock()
		e.Name = fmt.Sprintf("%s.noname.%d", tensor.OpType(e.Op).Lower(), n)
	}
	h.name = e.Name
	if len(data) > 0 {
		r, off, ok := c.locate(data)
		if !ok {
			stage, sr, soff, err := c.alloc(int64(len(data)))
			if err != nil {
				return nil, err
			}
			copy(stage, data)
			r, off = sr, soff
			h.cleanup = func() { sr.arena.Free(soff) }
			if copyBack {
				h.after = func(*ipcpb.Done) error { copy(data, stage); return nil }
			}
		}
		e.Buffer = &ipcpb.Buffer{Region: r.id, Offset: uint64(off), Length: uint64(len(data))}
	}
	c.mu.Lock()
	if c.failed != nil {
		err := c.failed
		c.mu.Unlock()
		if h.cleanup != nil {
			h.cleanup()
		}
		return nil, err
	}
	if e.Name != "" && c.names[e.Name] {
		c.mu.Unlock()
		if h.cleanup != nil {
			h.cleanup()
		}
		return nil, &Error{Code: ipcpb.Code_CODE_DUPLICATE_NAME, Msg: fmt.Sprintf(
			"Requested to %s a tensor with the same name as another tensor that is currently being processed (%q). If you want to request another tensor, use a different tensor name.",
			tensor.OpType(e.Op).Lower(), e.Name)}
	}
	c.nextID++
	id := c.nextID
	c.pending[id] = h
	if e.Name != "" {
		c.names[e.Name] = true
	}
	c.mu.Unlock()
	if err := c.send(id, &ipcpb.ClientMessage{Msg: &ipcpb.ClientMessage_Enqueue{Enqueue: e}}, -1); err != nil {
		c.mu.Lock()
		delete(c.pending, id)
		delete(c.names, e.Name)
		c.mu.Unlock()
		if h.cleanup != nil {
			h.cleanup()
		}
		return nil, fmt.Errorf("hvdd: enqueue %q: %w", e.Name, err)
	}
	return h, nil
}

func apply(os []Option) opts {
	o := opts{op: tensor.Average, prescale: 1, postscale: 1}
	for _, f := range os {
		f(&o)
	}
	return o
}

func enqueue[T Elem](op tensor.OpType, data []T, o *opts) *ipcpb.Enqueue {
	shape := o.shape
	if shape == nil {
		shape = []int64{int64(len(data))}
	}
	return &ipcpb.Enqueue{
		Name: o.name, Op: ipcpb.OpType(op), Dtype: ipcpb.DType(DTypeOf[T]()), Shape: shape,
		ReduceOp: ipcpb.ReduceOp(o.op), Prescale: o.prescale, Postscale: o.postscale,
		ProcessSet: o.set,
	}
}

// AllreduceAsync starts an in-place allreduce of data (Horovod's
// allreduce_async_): after Wait, data holds op over every rank's data.
func AllreduceAsync[T Elem](c *Client, data []T, options ...Option) (*Handle, error) {
	o := apply(options)
	return c.submit(enqueue(tensor.Allreduce, data, &o), bytesOf(data), true)
}

// Allreduce reduces data across ranks in place (default op Average).
func Allreduce[T Elem](ctx context.Context, c *Client, data []T, options ...Option) error {
	h, err := AllreduceAsync(c, data, options...)
	if err != nil {
		return err
	}
	return h.Wait(ctx)
}

// GroupedAllreduceAsync starts the allreduce of several tensors negotiated as
// one unit: none runs until every one is ready on every rank. Names, if given
// with WithName, get a ".<i>" suffix per member. The handle's Wait covers all.
func GroupedAllreduceAsync[T Elem](c *Client, data [][]T, options ...Option) (*Handle, error) {
	o := apply(options)
	group := c.groupSeq.Add(1)
	hs := make([]*Handle, 0, len(data))
	for i, d := range data {
		oi := o
		oi.shape = nil
		if o.name != "" {
			oi.name = fmt.Sprintf("%s.%d", o.name, i)
		}
		e := enqueue(tensor.Allreduce, d, &oi)
		e.Group, e.GroupSize = group, uint32(len(data))
		h, err := c.submit(e, bytesOf(d), true)
		if err != nil {
			// Members already sent stay in flight; the daemon fails them when
			// the job ends. Report the first error.
			return nil, err
		}
		hs = append(hs, h)
	}
	return joinHandles(c, hs), nil
}

// GroupedAllreduce is the blocking GroupedAllreduceAsync.
func GroupedAllreduce[T Elem](ctx context.Context, c *Client, data [][]T, options ...Option) error {
	h, err := GroupedAllreduceAsync(c, data, options...)
	if err != nil {
		return err
	}
	return h.Wait(ctx)
}

// joinHandles makes one handle that finishes when all of hs have.
func joinHandles(c *Client, hs []*Handle) *Handle {
	return &Handle{c: c, name: "group", parts: hs}
}

// BroadcastAsync starts an in-place broadcast of root's data to every rank.
func BroadcastAsync[T Elem](c *Client, data []T, root int, options ...Option) (*Handle, error) {
	o := apply(options)
	e := enqueue(tensor.Broadcast, data, &o)
	e.RootRank = int32(root)
	return c.submit(e, bytesOf(data), true)
}

// Broadcast overwrites data on every rank with root's (root is a global rank).
func Broadcast[T Elem](ctx context.Context, c *Client, data []T, root int, options ...Option) error {
	h, err := BroadcastAsync(c, data, root, options...)
	if err != nil {
		return err
	}
	return h.Wait(ctx)
}

// Future is an asynchronous collective whose result is a new slice.
type Future[T Elem] struct {
	*Handle
	out    []T
	shape  []int64
	splits []int32
}

// Wait blocks until the result is ready and returns it.
func (f *Future[T]) Wait(ctx context.Context) ([]T, error) {
	if err := f.Handle.Wait(ctx); err != nil {
		return nil, err
	}
	return f.out, nil
}

// Shape is the result's shape, valid after Wait.
func (f *Future[T]) Shape() []int64 { return f.shape }

// ReceivedSplits is, for alltoall, the rows received from each rank.
func (f *Future[T]) ReceivedSplits() []int32 { return f.splits }

func newFuture[T Elem](c *Client, h *Handle) *Future[T] {
	f := &Future[T]{Handle: h}
	prev := h.after
	h.after = func(d *ipcpb.Done) error {
		if prev != nil {
			if err := prev(d); err != nil {
				return err
			}
		}
		b, err := c.output(d.GetOutput())
		if err != nil {
			return err
		}
		var z T
		f.out = make([]T, len(b)/int(unsafe.Sizeof(z)))
		copy(bytesOf(f.out), b)
		c.release(d.GetOutput())
		f.shape, f.splits = d.GetOutputShape(), d.GetReceivedSplits()
		return nil
	}
	return f
}

// AllgatherAsync starts an allgather: the result concatenates every rank's
// data along the first dimension, in rank order (first dimensions may differ).
func AllgatherAsync[T Elem](c *Client, data []T, options ...Option) (*Future[T], error) {
	o := apply(options)
	h, err := c.submit(enqueue(tensor.Allgather, data, &o), bytesOf(data), false)
	if err != nil {
		return nil, err
	}
	return newFuture[T](c, h), nil
}

// Allgather concatenates every rank's data along the first dimension.
func Allgather[T Elem](ctx context.Context, c *Client, data []T, options ...Option) ([]T, error) {
	f, err := AllgatherAsync(c, data, options...)
	if err != nil {
		return nil, err
	}
	return f.Wait(ctx)
}

// AlltoallAsync starts an alltoall: splits[r] rows of data (along the first
// dimension, in order) go to rank r; nil splits means equal parts. The result
// holds the rows received from every rank, in rank order; ReceivedSplits says
// how many came from each.
func AlltoallAsync[T Elem](c *Client, data []T, splits []int32, options ...Option) (*Future[T], error) {
	o := apply(options)
	e := enqueue(tensor.Alltoall, data, &o)
	e.Splits = splits
	h, err := c.submit(e, bytesOf(data), false)
	if err != nil {
		return nil, err
	}
	return newFuture[T](c, h), nil
}

// Alltoall scatters rows of data to every rank and gathers what they send.
func Alltoall[T Elem](ctx context.Context, c *Client, data []T, splits []int32, options ...Option) ([]T, []int32, error) {
	f, err := AlltoallAsync(c, data, splits, options...)
	if err != nil {
		return nil, nil, err
	}
	out, err := f.Wait(ctx)
	return out, f.ReceivedSplits(), err
}

// ReducescatterAsync starts a reducescatter: data is reduced across ranks
// (Average or Sum) and rank r receives its block of rows; the first d0 % size
// ranks get one row more.
func ReducescatterAsync[T Elem](c *Client, data []T, options ...Option) (*Future[T], error) {
	o := apply(options)
	h, err := c.submit(enqueue(tensor.Reducescatter, data, &o), bytesOf(data), false)
	if err != nil {
		return nil, err
	}
	return newFuture[T](c, h), nil
}

// Reducescatter reduces data across ranks and returns this rank's block.
func Reducescatter[T Elem](ctx context.Context, c *Client, data []T, options ...Option) ([]T, error) {
	f, err := ReducescatterAsync(c, data, options...)
	if err != nil {
		return nil, err
	}
	return f.Wait(ctx)
}

// Barrier blocks until every rank (of the process set given with
// WithProcessSet, else of the job) has called it.
func (c *Client) Barrier(ctx context.Context, options ...Option) error {
	o := apply(options)
	h, err := c.submit(&ipcpb.Enqueue{Op: ipcpb.OpType_OP_BARRIER, ProcessSet: o.set}, nil, false)
	if err != nil {
		return err
	}
	return h.Wait(ctx)
}

// Join tells the job this rank has run out of data. Until every rank has
// joined, this rank takes part in the others' allreduces with zeros. It returns
// the last rank to join, the same on every rank.
func (c *Client) Join(ctx context.Context) (int, error) {
	h, err := c.submit(&ipcpb.Enqueue{Op: ipcpb.OpType_OP_JOIN}, nil, false)
	if err != nil {
		return -1, err
	}
	if err := h.Wait(ctx); err != nil {
		return -1, err
	}
	return int(h.res.GetLastJoinedRank()), nil
}

// ProcessSet is a registered subset of the job's global ranks that
// collectives can run over (Horovod's process sets), on one node or
// across nodes.
type ProcessSet struct {
	// ID is the daemon's id for the set; 0 is the whole job.
	ID int32
	// Ranks are the members' global ranks, sorted.
	Ranks []int
}

// Rank is this client's index in the set, or -1 when it is not a member.
func (ps *ProcessSet) Rank(c *Client) int { return slices.Index(ps.Ranks, c.Rank()) }

// AddProcessSet registers the set of the given global ranks. It is a
// collective over every rank of the job: all must call it with the same
// ranks, in the same order of calls; ranks that disagree, a duplicate of a
// registered set, or ranks out of range get an error.
func (c *Client) AddProcessSet(ctx context.Context, ranks []int) (*ProcessSet, error) {
	rs := slices.Sorted(slices.Values(ranks))
	m := &ipcpb.AddProcessSet{}
	for _, r := range rs {
		m.Ranks = append(m.Ranks, int32(r))
	}
	d, err := c.call(ctx, &ipcpb.ClientMessage{Msg: &ipcpb.ClientMessage_AddProcessSet{AddProcessSet: m}})
	if err != nil {
		return nil, err
	}
	return &ProcessSet{ID: d.GetProcessSetId(), Ranks: rs}, nil
}

// RemoveProcessSet drops a registered set, collectively like AddProcessSet.
func (c *Client) RemoveProcessSet(ctx context.Context, ps *ProcessSet) error {
	_, err := c.call(ctx, &ipcpb.ClientMessage{Msg: &ipcpb.ClientMessage_RemoveProcessSet{
		RemoveProcessSet: &ipcpb.RemoveProcessSet{ProcessSet: ps.ID}}})
	return err
}

// StartTimeline starts Horovod's timeline in the file at path (made
// absolute here), which the daemon writes; with markCycles it marks every
// cycle of the daemon's loop (CYCLE_START). As in Horovod, only global rank
// 0's call acts; a started timeline switches to the new file.
func (c *Client) StartTimeline(ctx context.Context, path string, markCycles bool) error {
	abs, err := filepath.Abs(path)
	if err != nil {
		return fmt.Errorf("hvdd: timeline file %q: %w", path, err)
	}
	_, err = c.call(ctx, &ipcpb.ClientMessage{Msg: &ipcpb.ClientMessage_Timeline{
		Timeline: &ipcpb.Timeline{FilePath: abs, MarkCycles: markCycles}}})
	return err
}

// StopTimeline stops the timeline and returns once its file is complete.
// Stopping a stopped timeline is no error.
func (c *Client) StopTimeline(ctx context.Context) error {
	_, err := c.call(ctx, &ipcpb.ClientMessage{Msg: &ipcpb.ClientMessage_Timeline{Timeline: &ipcpb.Timeline{}}})
	return err
}

// call sends a request the daemon answers with one Done and waits for it.
func (c *Client) call(ctx context.Context, m *ipcpb.ClientMessage) (*ipcpb.Done, error) {
	h := &Handle{c: c, done: make(chan struct{})}
	c.mu.Lock()
	if c.failed != nil {
		err := c.failed
		c.mu.Unlock()
		return nil, err
	}
	c.nextID++
	id := c.nextID
	c.pending[id] = h
	c.mu.Unlock()
	if err := c.send(id, m, -1); err != nil {
		c.mu.Lock()
		delete(c.pending, id)
		c.mu.Unlock()
		return nil, fmt.Errorf("hvdd: %w", err)
	}
	if err := h.Wait(ctx); err != nil {
		return nil, err
	}
	return h.res, nil
}
