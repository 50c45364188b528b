package daemon

import (
	"fmt"
	"sync"

	"github.com/hvdd/hvdd/daemon/plan"
	"github.com/hvdd/hvdd/ipc/ipcpb"
	"github.com/hvdd/hvdd/reduce"
	"github.com/hvdd/hvdd/tensor"
)

// work is one plan response with the ops it completes: ops[i][rank] is rank's
// op for resp.Tensors[i], nil for a rank that has joined.
type work struct {
	resp plan.Response
	j    *job
	size int
	ops  [][]*op
}

// executor runs batches of work in order on its own goroutine, so the loop
// keeps negotiating while data moves.
type executor struct {
	s       *Server
	p       *poller
	ropts   reduce.Options
	fuse    []byte // fusion buffer of cross-node ops, reused
	work    chan []work
	stopped chan struct{}
}

func newExecutor(s *Server, p *poller) *executor {
	return &executor{
		s:       s,
		p:       p,
		ropts:   reduce.Options{Workers: s.cfg.Workers},
		work:    make(chan []work, 1),
		stopped: make(chan struct{}),
	}
}

func (x *executor) run() {
	defer close(x.stopped)
	for batch := range x.work {
		for _, w := range batch {
			x.execute(w)
		}
		x.p.post(msgExecIdle{})
	}
}

func (x *executor) execute(w work) {
	if w.j != nil && w.j.backend != nil {
		x.executeMulti(w)
		return
	}
	r := &w.resp
	for i, t := range r.Tensors {
		ops := w.ops[i]
		var err error
		switch r.Op {
		case tensor.Allreduce:
			err = x.allreduce(r, ops, w.size)
		case tensor.Broadcast:
			err = x.broadcast(r, ops)
		case tensor.Allgather:
			err = x.allgather(r, &t, ops)
		case tensor.Alltoall:
			err = x.alltoall(r, &t, ops)
		case tensor.Reducescatter:
			err = x.reducescatter(r, &t, ops, w.size)
		case tensor.Barrier:
			err = x.finishAll(ops, nil)
		case tensor.Join:
			err = x.finishAll(ops, &ipcpb.Done{LastJoinedRank: int32(r.LastJoinedRank)})
		default:
			err = fmt.Errorf("collective %v is not implemented", r.Op)
		}
		if err != nil {
			x.s.log.Error("collective failed", "tensor", t.Name, "op", r.Op, "err", err)
			d := &ipcpb.Done{Code: ipcpb.Code_CODE_INTERNAL, Error: fmt.Sprintf("tensor %q: %v", t.Name, err)}
			// Handlers return an error only before answering any op.
			for _, o := range ops {
				if o != nil {
					o.finish(d)
				}
			}
		}
	}
}

// finishAll answers every op with d (OK when nil).
func (x *executor) finishAll(ops []*op, d *ipcpb.Done) error {
	if d == nil {
		d = &ipcpb.Done{}
	}
	for _, o := range ops {
		if o != nil {
			o.finish(d)
		}
	}
	return nil
}

// scales turns Average into Sum with the divisor folded into the postscale, as
// Horovod does (so integer averages truncate).
func scales(r *plan.Response, size int) (tensor.ReduceOp, float64, float64) {
	op, post := r.ReduceOp, r.Postscale
	if op == tensor.Average {
		op = tensor.Sum
		post /= float64(size)
	}
	return op, r.Prescale, post
}

// allreduce reduces every rank's buffer and writes the result into each of
// them in one pass. Joined ranks have no buffer and so contribute nothing (the
// neutral element); the Average divisor still counts them, as in Horovod.
func (x *executor) allreduce(r *plan.Response, ops []*op, size int) error {
	bufs := make([][]byte, 0, len(ops))
	for _, o := range ops {
		if o != nil && len(o.buf) > 0 {
			bufs = append(bufs, o.buf)
		}
	}
	if len(bufs) > 0 {
		rop, pre, post := scales(r, size)
		if err := reduce.Reduce(bufs, bufs, r.DType, rop, pre, post, &x.ropts); err != nil {
			return err
		}
	}
	return x.finishAll(ops, nil)
}

// broadcast copies the root's buffer into every other rank's.
func (x *executor) broadcast(r *plan.Response, ops []*op) error {
	if r.Root < 0 || r.Root >= len(ops) || ops[r.Root] == nil {
		return fmt.Errorf("broadcast root %d has no buffer", r.Root)
	}
	src := ops[r.Root].buf
	var dsts [][]byte
	for i, o := range ops {
		if o != nil && i != r.Root {
			dsts = append(dsts, o.buf)
		}
	}
	parallelCopy(dsts, src)
	return x.finishAll(ops, nil)
}

// allgather concatenates every rank's rows, in rank order, into an output of
// each rank's own.
func (x *executor) allgather(r *plan.Response, t *plan.Tensor, ops []*op) error {
	rowBytes := t.Shape.RowElements() * int64(r.DType.Size())
	var total int64
	for _, s := range t.RankShapes {
		if len(s) > 0 {
			total += s[0]
		}
	}
	shape := append(tensor.Shape{total}, t.Shape[1:]...)
	srcs := make([][]byte, len(ops))
	for i, o := range ops {
		if o != nil {
			srcs[i] = o.buf
		}
	}
	return x.each(ops, func(o *op) (*ipcpb.Done, error) {
		out, ref, err := o.c.allocOutput(total * rowBytes)
		if err != nil {
			return nil, err
		}
		off := 0
		for _, s := range srcs {
			off += copy(out[off:], s)
		}
		return &ipcpb.Done{Output: ref, OutputShape: shape}, nil
	})
}

// alltoall sends rank s's rows [sum(splits[s][:d]), +splits[s][d]) to rank d;
// each rank receives the pieces in source-rank order.
func (x *executor) alltoall(r *plan.Response, t *plan.Tensor, ops []*op) error {
	rowBytes := t.Shape.RowElements() * int64(r.DType.Size())
	n := len(ops)
	// starts[s][d] is the row where rank s's piece for rank d begins.
	starts := make([][]int64, n)
	for s := 0; s < n; s++ {
		starts[s] = make([]int64, n+1)
		for d := 0; d < n; d++ {
			starts[s][d+1] = starts[s][d] + int64(t.Splits[s][d])
		}
	}
	return x.eachRank(ops, func(d int, o *op) (*ipcpb.Done, error) {
		var rows int64
		recv := make([]int32, n)
		for s := 0; s < n; s++ {
			rows += int64(t.Splits[s][d])
			recv[s] = t.Splits[s][d]
		}
		out, ref, err := o.c.allocOutput(rows * rowBytes)
		if err != nil {
			return nil, err
		}
		off := 0
		for s := 0; s < n; s++ {
			if ops[s] == nil {
				return nil, fmt.Errorf("rank %d has no input (joined?)", s)
			}
			src := ops[s].buf
			off += copy(out[off:], src[starts[s][d]*rowBytes:starts[s][d+1]*rowBytes])
		}
		shape := append(tensor.Shape{rows}, t.Shape[1:]...)
		return &ipcpb.Done{Output: ref, OutputShape: shape, ReceivedSplits: recv}, nil
	})
}

// reducescatter reduces the ranks' buffers and hands rank r its block of rows:
// the first d0%n ranks get one row more than the others, as in Horovod.
func (x *executor) reducescatter(r *plan.Response, t *plan.Tensor, ops []*op, size int) error {
	var d0 int64
	if len(t.Shape) > 0 {
		d0 = t.Shape[0]
	}
	rowBytes := t.Shape.RowElements() * int64(r.DType.Size())
	n := int64(len(ops))
	rop, pre, post := scales(r, size)
	return x.eachRank(ops, func(rank int, o *op) (*ipcpb.Done, error) {
		rr := int64(rank)
		rows := d0 / n
		start := rr*rows + min(rr, d0%n)
		if rr < d0%n {
			rows++
		}
		out, ref, err := o.c.allocOutput(rows * rowBytes)
		if err != nil {
			return nil, err
		}
		if rows > 0 {
			srcs := make([][]byte, 0, len(ops))
			for s, so := range ops {
				if so == nil {
					return nil, fmt.Errorf("rank %d has no input (joined?)", s)
				}
				srcs = append(srcs, so.buf[start*rowBytes:(start+rows)*rowBytes])
			}
			if err := reduce.Reduce([][]byte{out}, srcs, r.DType, rop, pre, post, &x.ropts); err != nil {
				return nil, err
			}
		}
		shape := append(tensor.Shape{rows}, t.Shape[1:]...)
		return &ipcpb.Done{Output: ref, OutputShape: shape}, nil
	})
}

// each runs f for every rank's op (in parallel when there are several) and
// answers each op with f's Done, or with an error.
func (x *executor) each(ops []*op, f func(o *op) (*ipcpb.Done, error)) error {
	return x.eachRank(ops, func(_ int, o *op) (*ipcpb.Done, error) { return f(o) })
}

func (x *executor) eachRank(ops []*op, f func(rank int, o *op) (*ipcpb.Done, error)) error {
	var wg sync.WaitGroup
	dones := make([]*ipcpb.Done, len(ops))
	for i, o := range ops {
		if o == nil {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			d, err := f(i, o)
			if err != nil {
				d = &ipcpb.Done{Code: ipcpb.Code_CODE_INTERNAL, Error: fmt.Sprintf("tensor %q: %v", o.name, err)}
			}
			dones[i] = d
		}()
	}
	// Every rank's input may be read while building any rank's output, so
	// no rank hears "done" (and reuses its input) before all are built.
	wg.Wait()
	for i, o := range ops {
		if o != nil {
			o.finish(dones[i])
		}
	}
	return nil
}

// parallelCopy copies src into every dst, splitting large copies across
// goroutines.
func parallelCopy(dsts [][]byte, src []byte) {
	const chunk = 4 << 20
	if len(src) < 2*chunk || len(dsts) == 0 {
		for _, d := range dsts {
			copy(d, src)
		}
		return
	}
	var wg sync.WaitGroup
	for _, d := range dsts {
		for off := 0; off < len(src); off += chunk {
			end := min(off+chunk, len(src))
			wg.Add(1)
			go func() {
				defer wg.Done()
				copy(d[off:end], src[off:end])
			}()
		}
	}
	wg.Wait()
}
