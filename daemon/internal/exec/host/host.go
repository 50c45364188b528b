package host

import (
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"sync"

	"github.com/hvdd/hvdd/daemon/internal/exec/sched"
	"github.com/hvdd/hvdd/daemon/internal/job"
	"github.com/hvdd/hvdd/daemon/internal/poll"
	"github.com/hvdd/hvdd/daemon/plan"
	"github.com/hvdd/hvdd/daemon/timeline"
	"github.com/hvdd/hvdd/ipc/ipcpb"
	"github.com/hvdd/hvdd/reduce"
	"github.com/hvdd/hvdd/tensor"
)

// Path runs responses on host memory: in the clients' shared memory on
// one node, through the job's engine across nodes (across.go).
type Path struct {
	log   *slog.Logger
	P     *poll.Poller
	ropts reduce.Options
	fuse  []byte // fusion buffer of cross-node ops, reused
	adaIn []byte // a node's block of a cross-node Adasum, reused

	// The timeline row of the tensor being run and how many phases to end
	// there (endTrace); no writer when off. The loop runs small batches
	// itself only while the executor goroutine is idle, so one of them at a
	// time uses these.
	traceW    job.EventSink
	traceRow  string
	traceEnds int
	// ph: the phases of the response running across nodes.
	ph phases
	// engines gives a response across nodes its engine (shared with the
	// device path).
	engines *sched.Engines
}

// New returns the host path; it posts a failed collective across
// nodes (job.MsgExecErr) to the loop through p, reduces with workers
// goroutines and takes the engine of a response across nodes from
// engines.
func New(log *slog.Logger, p *poll.Poller, workers int, engines *sched.Engines) *Path {
	return &Path{log: log, P: p, ropts: reduce.Options{Workers: workers}, engines: engines}
}

// Execute runs w on host memory (GPU tensors staged there already).
func (x *Path) Execute(w job.Work) {
	if w.Engine != nil {
		if w.Trace != nil {
			// The response's top-level phase (tracer.responded) ends
			// once every rank has its answer.
			defer job.TraceAll(w.Trace, &w.Resp, timeline.End, "")
		}
		x.executeMulti(w)
		return
	}
	r := &w.Resp
	if r.Op == tensor.Allreduce {
		if w.Trace != nil {
			job.TraceAll(w.Trace, r, timeline.Begin, Activity(r))
		}
		err := x.allreduceFused(r, w.Ops, w.Size)
		if w.Trace != nil {
			// The activity and the response's top-level phase
			// (tracer.responded) end before the ranks hear, so that a
			// rank's next request of a name opens its negotiation after.
			job.TraceAll(w.Trace, r, timeline.End, "")
			job.TraceAll(w.Trace, r, timeline.End, "")
		}
		if err != nil {
			x.log.Error("allreduce failed", "tensors", len(r.Tensors), "err", err)
			d := &ipcpb.Done{Code: ipcpb.Code_CODE_INTERNAL, Error: fmt.Sprintf("allreduce of %d tensors: %v", len(r.Tensors), err)}
			job.FinishRows(w.Ops, d)
			return
		}
		x.FinishBatched(w.Ops)
		return
	}
	for i, t := range r.Tensors {
		ops := w.Ops[i]
		if w.Trace != nil {
			x.traceW, x.traceRow, x.traceEnds = w.Trace, job.Row(r.ProcessSet, t.Name), 1
			if r.Op != tensor.Barrier && r.Op != tensor.Join {
				w.Trace.Event(x.traceRow, timeline.Begin, Activity(r))
				x.traceEnds = 2
			}
		}
		var err error
		switch r.Op {
		case tensor.Broadcast:
			err = x.broadcast(r, ops)
		case tensor.Allgather:
			err = x.allgather(r, &t, ops)
		case tensor.Alltoall:
			err = x.alltoall(r, &t, ops)
		case tensor.Reducescatter:
			err = x.reducescatter(r, &t, ops, w.Size)
		case tensor.Barrier:
			err = x.finishAll(ops, nil)
		case tensor.Join:
			err = x.finishAll(ops, &ipcpb.Done{LastJoinedRank: int32(r.LastJoinedRank)})
		default:
			err = fmt.Errorf("collective %v is not implemented", r.Op)
		}
		x.endTrace() // if the handler failed before answering
		if err != nil {
			x.log.Error("collective failed", "tensor", t.Name, "op", r.Op, "err", err)
			d := &ipcpb.Done{Code: ipcpb.Code_CODE_INTERNAL, Error: fmt.Sprintf("tensor %q: %v", t.Name, err)}
			// Handlers return an error only before answering any op.
			for _, o := range ops {
				if o != nil {
					o.Finish(d)
				}
			}
		}
	}
}

// endTrace ends the timeline phases of the tensor being run (its activity
// and its top-level phase), just before its ranks are answered: a rank's next
// request of the same name then opens a new negotiation after them.
func (x *Path) endTrace() {
	if x.traceW == nil {
		return
	}
	for range x.traceEnds {
		x.traceW.Event(x.traceRow, timeline.End, "")
	}
	x.traceW = nil
}

// FinishBatched answers every op OK, one write per client.
func (x *Path) FinishBatched(ops [][]*job.Op) {
	type batch struct {
		ids []uint32
		ms  []*ipcpb.ServerMessage
		ops []*job.Op
	}
	by := make(map[job.Conn]*batch)
	var order []job.Conn
	ok := &ipcpb.ServerMessage{Msg: &ipcpb.ServerMessage_Done{Done: &ipcpb.Done{}}}
	for _, row := range ops {
		for _, o := range row {
			if o == nil {
				continue
			}
			if o.Dev != nil {
				// A staged GPU tensor copies its result back first.
				o.Finish(&ipcpb.Done{})
				continue
			}
			b := by[o.Conn]
			if b == nil {
				b = &batch{}
				by[o.Conn] = b
				order = append(order, o.Conn)
			}
			b.ids = append(b.ids, o.ID)
			b.ms = append(b.ms, ok)
			b.ops = append(b.ops, o)
		}
	}
	for _, c := range order {
		b := by[c]
		for _, o := range b.ops {
			o.Count(ipcpb.Code_CODE_OK) // before the answer: Op.Count
		}
		c.SendBatch(b.ids, b.ms)
		for _, o := range b.ops {
			o.Release()
		}
	}
}

// finishAll answers every op with d (OK when nil).
func (x *Path) finishAll(ops []*job.Op, d *ipcpb.Done) error {
	if d == nil {
		d = &ipcpb.Done{}
	}
	x.endTrace()
	for _, o := range ops {
		if o != nil {
			o.Finish(d)
		}
	}
	return nil
}

// allreduceFused reduces every tensor of a fused response: for each, every
// rank's buffer is read and the result written into all of them in one pass.
// Joined ranks have no buffer and so contribute nothing (the neutral element);
// the Average divisor still counts them, as in Horovod.
//
// The work is split by bytes across the whole response rather than tensor by
// tensor, so that many mid-sized tensors keep every worker as busy as one
// large fused buffer would. Split points are multiples of 4 KiB of the
// concatenation; every tensor starts at a multiple of the element size there,
// so every piece is whole elements.
func (x *Path) allreduceFused(r *plan.Response, ops [][]*job.Op, size int) error {
	if r.ReduceOp == tensor.Adasum {
		return x.adasum(r, ops)
	}
	type seg struct {
		bufs  [][]byte
		start int // offset in the concatenation
	}
	var segs []seg
	total := 0
	for _, row := range ops {
		bufs := localBufs(row)
		if len(bufs) == 0 {
			continue
		}
		segs = append(segs, seg{bufs, total})
		total += len(bufs[0])
	}
	rop, pre, post := sched.Scales(r, size)
	workers := x.ropts.Workers
	if workers <= 0 {
		workers = runtime.GOMAXPROCS(0)
	}
	if total < 1<<20 || workers == 1 || len(segs) == 1 {
		for _, sg := range segs {
			if err := reduce.Reduce(sg.bufs, sg.bufs, r.DType, rop, pre, post, &x.ropts); err != nil {
				return err
			}
		}
		return nil
	}
	per := (total/workers + 4095) &^ 4095
	one := reduce.Options{Workers: 1}
	errs := make([]error, workers)
	var wg sync.WaitGroup
	for wk := 0; wk < workers; wk++ {
		lo, hi := wk*per, min((wk+1)*per, total)
		if lo >= hi {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			sub := make([][]byte, 0, 8)
			for _, sg := range segs {
				n := len(sg.bufs[0])
				a, b := max(lo, sg.start), min(hi, sg.start+n)
				if a >= b {
					continue
				}
				sub = sub[:0]
				for _, buf := range sg.bufs {
					sub = append(sub, buf[a-sg.start:b-sg.start])
				}
				if err := reduce.Reduce(sub, sub, r.DType, rop, pre, post, &one); err != nil {
					errs[wk] = err
					return
				}
			}
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// adasum reduces every tensor of a fused Adasum response on its own, as
// Horovod does (dot products per tensor, not over the fused buffer): the
// ranks' buffers, in set order, meet in reduce.Adasum, which leaves the
// result in all of them. A joined rank has no buffer and counts as a zero
// vector. A large tensor is spread over the workers inside reduce.Adasum.
func (x *Path) adasum(r *plan.Response, ops [][]*job.Op) error {
	for i, row := range ops {
		bufs := make([][]byte, len(row))
		for k, o := range row {
			if o != nil {
				bufs[k] = o.Buf
			}
		}
		if err := reduce.Adasum(bufs, r.DType, r.Prescale, r.Postscale, &x.ropts); err != nil {
			return fmt.Errorf("tensor %q: %w", r.Tensors[i].Name, err)
		}
	}
	return nil
}

// broadcast copies the root's buffer into every other rank's.
func (x *Path) broadcast(r *plan.Response, ops []*job.Op) error {
	if r.Root < 0 || r.Root >= len(ops) || ops[r.Root] == nil {
		return fmt.Errorf("broadcast root %d has no buffer", r.Root)
	}
	src := ops[r.Root].Buf
	var dsts [][]byte
	for i, o := range ops {
		if o != nil && i != r.Root {
			dsts = append(dsts, o.Buf)
		}
	}
	parallelCopy(dsts, src)
	return x.finishAll(ops, nil)
}

// allgather concatenates every rank's rows, in rank order, into an output of
// each rank's own.
func (x *Path) allgather(r *plan.Response, t *plan.Tensor, ops []*job.Op) error {
	rowBytes := t.Shape.RowElements() * int64(r.DType.Size())
	shape := sched.AllgatherShape(t)
	total := shape[0]
	srcs := make([][]byte, len(ops))
	for i, o := range ops {
		if o != nil {
			srcs[i] = o.Buf
		}
	}
	return x.each(ops, func(o *job.Op) (*ipcpb.Done, error) {
		out, ref, err := o.Conn.AllocOutput(total * rowBytes)
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
func (x *Path) alltoall(r *plan.Response, t *plan.Tensor, ops []*job.Op) error {
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
	return x.eachRank(ops, func(d int, o *job.Op) (*ipcpb.Done, error) {
		var rows int64
		recv := make([]int32, n)
		for s := 0; s < n; s++ {
			rows += int64(t.Splits[s][d])
			recv[s] = t.Splits[s][d]
		}
		out, ref, err := o.Conn.AllocOutput(rows * rowBytes)
		if err != nil {
			return nil, err
		}
		off := 0
		for s := 0; s < n; s++ {
			if ops[s] == nil {
				return nil, fmt.Errorf("rank %d has no input (joined?)", s)
			}
			src := ops[s].Buf
			off += copy(out[off:], src[starts[s][d]*rowBytes:starts[s][d+1]*rowBytes])
		}
		shape := append(tensor.Shape{rows}, t.Shape[1:]...)
		return &ipcpb.Done{Output: ref, OutputShape: shape, ReceivedSplits: recv}, nil
	})
}

// reducescatter reduces the ranks' buffers and hands rank r its block of
// rows (sched.ScatterBlock).
func (x *Path) reducescatter(r *plan.Response, t *plan.Tensor, ops []*job.Op, size int) error {
	rowBytes := t.Shape.RowElements() * int64(r.DType.Size())
	rop, pre, post := sched.Scales(r, size)
	return x.eachRank(ops, func(rank int, o *job.Op) (*ipcpb.Done, error) {
		start, rows := sched.ScatterBlock(t, len(ops), rank)
		out, ref, err := o.Conn.AllocOutput(rows * rowBytes)
		if err != nil {
			return nil, err
		}
		if rows > 0 {
			srcs := make([][]byte, 0, len(ops))
			for s, so := range ops {
				if so == nil {
					return nil, fmt.Errorf("rank %d has no input (joined?)", s)
				}
				srcs = append(srcs, so.Buf[start*rowBytes:(start+rows)*rowBytes])
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
func (x *Path) each(ops []*job.Op, f func(o *job.Op) (*ipcpb.Done, error)) error {
	return x.eachRank(ops, func(_ int, o *job.Op) (*ipcpb.Done, error) { return f(o) })
}

func (x *Path) eachRank(ops []*job.Op, f func(rank int, o *job.Op) (*ipcpb.Done, error)) error {
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
				d = &ipcpb.Done{Code: ipcpb.Code_CODE_INTERNAL, Error: fmt.Sprintf("tensor %q: %v", o.Name, err)}
			}
			dones[i] = d
		}()
	}
	// Every rank's input may be read while building any rank's output, so
	// no rank hears "done" (and reuses its input) before all are built.
	wg.Wait()
	x.endTrace()
	for i, o := range ops {
		if o != nil {
			o.Finish(dones[i])
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
