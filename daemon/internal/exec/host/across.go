package host

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/hvdd/hvdd/backends"
	"github.com/hvdd/hvdd/daemon/internal/exec/sched"
	"github.com/hvdd/hvdd/daemon/internal/job"
	"github.com/hvdd/hvdd/daemon/plan"
	"github.com/hvdd/hvdd/ipc/ipcpb"
	"github.com/hvdd/hvdd/reduce"
	"github.com/hvdd/hvdd/tensor"
)

// Hierarchical collectives for a job across nodes: the node's local ranks meet
// in shared memory, the backend moves one node's worth of bytes between nodes,
// and the result is written back locally. Global ranks are node-major, so a
// node's ranks are contiguous and node order is rank order.

// Fusion returns a scratch buffer of n bytes, reused across ops.
func (x *Path) Fusion(n int) []byte {
	if cap(x.fuse) < n {
		x.fuse = make([]byte, n)
	}
	return x.fuse[:n]
}

// executeMulti runs one response across nodes and answers the local ops. A
// backend failure fails the whole job and the ops with ABORTED, both
// through the loop.
func (x *Path) executeMulti(w job.Work) {
	r := &w.Resp
	ctx := context.Background()
	b, err := x.engines.For(&w)
	if err != nil {
		d := &ipcpb.Done{Code: ipcpb.Code_CODE_UNIMPLEMENTED, Error: err.Error()}
		job.FinishRows(w.Ops, d)
		x.P.Post(job.MsgExecErr{Job: w.Job, Err: err})
		return
	}
	var dones [][]*ipcpb.Done // per tensor, per row (nil = plain OK)
	// The phases nest in the response's top-level phase (execute), on the
	// node that writes the timeline: the local step through shared memory
	// (SHM_<OP>), the engine's transfer (crossNode), the write-back.
	x.ph = phases{w: w.Trace, r: r}
	switch r.Op {
	case tensor.Allreduce:
		err = x.allreduceMulti(ctx, b, w)
	case tensor.Broadcast:
		err = x.broadcastMulti(ctx, b, w)
	case tensor.Allgather:
		dones, err = x.allgatherMulti(ctx, b, w)
	case tensor.Alltoall:
		dones, err = x.alltoallMulti(ctx, b, w)
	case tensor.Reducescatter:
		dones, err = x.reducescatterMulti(ctx, b, w)
	case tensor.Barrier:
		x.ph.begin(crossNode(b, r))
		err = b.Barrier(ctx)
	case tensor.Join:
	default:
		err = fmt.Errorf("collective %v is not implemented across nodes", r.Op)
	}
	x.ph.endAll()
	if err != nil {
		msg := fmt.Sprintf("%v across nodes failed: %v", r.Op, err)
		lost := 0
		if n, ok := backends.LostRank(err); ok {
			msg = fmt.Sprintf("node %d%s was lost during %v: %v", n, w.Job.Members.RankRange(n), r.Op, err)
			lost = n + 1
		}
		// The loop answers the ops: it knows whether the job had already
		// failed, and the engine was closed for that.
		x.P.Post(job.MsgExecErr{Job: w.Job, Err: errors.New(msg), Ops: w.Ops, Closed: errors.Is(err, backends.ErrClosed), Lost: lost})
		return
	}
	for i, row := range w.Ops {
		for rank, o := range row {
			if o == nil {
				continue
			}
			d := &ipcpb.Done{}
			if dones != nil && dones[i][rank] != nil {
				d = dones[i][rank]
			}
			if r.Op == tensor.Join {
				d.LastJoinedRank = int32(r.LastJoinedRank)
			}
			o.Finish(d)
		}
	}
}

// localBufs returns the non-empty buffers of a row's ops (the local ranks
// that submitted the tensor).
func localBufs(row []*job.Op) [][]byte {
	var bufs [][]byte
	for _, o := range row {
		if o != nil && len(o.Buf) > 0 {
			bufs = append(bufs, o.Buf)
		}
	}
	return bufs
}

func (x *Path) allreduceMulti(ctx context.Context, b backends.Backend, w job.Work) error {
	r := &w.Resp
	if r.ReduceOp == tensor.Adasum {
		return x.adasumMulti(ctx, b, w)
	}
	op, pre, post := sched.Scales(r, w.Size)
	es := r.DType.Size()
	whole := sched.Whole(&w)
	if whole {
		if bufs := localBufs(w.Ops[0]); len(bufs) == 1 {
			// One local rank holds the only buffer: the engine works on the
			// client's shared memory directly, with no copy in or out.
			x.ph.begin(crossNode(b, r))
			if err := sched.AllreduceCalls(ctx, b, bufs[0], r.DType, op, true, nil, nil); err != nil {
				return err
			}
			x.ph.End()
			if post != 1 {
				return reduce.Scale(bufs[0], r.DType, post)
			}
			return nil
		}
	}
	total := 0
	for _, t := range r.Tensors {
		total += int(t.Shape.NumElements()) * es
	}
	// Reduce the local ranks' buffers into the fusion buffer, tensor after
	// tensor; a node whose ranks all joined contributes the neutral element.
	f := x.Fusion(total)
	if sched.Chunks(total, whole) > 1 {
		return x.allreducePipelined(ctx, b, w, f, sched.PipeChunk(total), op, pre, post)
	}
	x.ph.begin(Activity(r))
	off := 0
	for i, t := range r.Tensors {
		n := int(t.Shape.NumElements()) * es
		seg := f[off : off+n]
		if bufs := localBufs(w.Ops[i]); len(bufs) > 0 {
			if err := reduce.Reduce([][]byte{seg}, bufs, r.DType, op, pre, 1, &x.ropts); err != nil {
				return err
			}
		} else if err := reduce.Fill(seg, r.DType, op); err != nil {
			return err
		}
		off += n
	}
	x.ph.End()
	x.ph.begin(crossNode(b, r))
	if err := sched.AllreduceCalls(ctx, b, f, r.DType, op, whole, nil, nil); err != nil {
		return err
	}
	x.ph.End()
	// Write back, applying the postscale in the same pass: Horovod's copy
	// out of the fusion buffer.
	x.ph.begin("MEMCPY_OUT_FUSION_BUFFER")
	off = 0
	for i, t := range r.Tensors {
		n := int(t.Shape.NumElements()) * es
		if bufs := localBufs(w.Ops[i]); len(bufs) > 0 {
			if err := reduce.Reduce(bufs, [][]byte{f[off : off+n]}, r.DType, op, 1, post, &x.ropts); err != nil {
				return err
			}
		}
		off += n
	}
	return nil
}

// allreducePipelined is allreduceMulti's fused path in chunks of chunk bytes
// of the fusion buffer f (sched.PipeChunk, which says why): the local
// ranks' buffers are reduced into f and the result written back to them
// chunk by chunk, around the engine's calls (pipeline).
func (x *Path) allreducePipelined(ctx context.Context, b backends.Backend, w job.Work, f []byte, chunk int, op tensor.ReduceOp, pre, post float64) error {
	r := &w.Resp
	fz := newFused(&w, f)
	reduceChunk := func(lo, hi int) error {
		return fz.each(lo, hi, func(seg []byte, bufs [][]byte) error {
			if len(bufs) == 0 {
				return reduce.Fill(seg, r.DType, op)
			}
			return reduce.Reduce([][]byte{seg}, bufs, r.DType, op, pre, 1, &x.ropts)
		})
	}
	writeChunk := func(lo, hi int) error {
		return fz.each(lo, hi, func(seg []byte, bufs [][]byte) error {
			if len(bufs) == 0 {
				return nil
			}
			return reduce.Reduce(bufs, [][]byte{seg}, r.DType, op, 1, post, &x.ropts)
		})
	}
	return x.pipeline(ctx, b, r, f, chunk, op, reduceChunk, writeChunk)
}

// fused is a response's tensors laid out one after the other in the fusion
// buffer f: tensor i is f[offs[i]:offs[i+1]].
type fused struct {
	w    *job.Work
	f    []byte
	offs []int
}

func newFused(w *job.Work, f []byte) *fused {
	r := &w.Resp
	es := r.DType.Size()
	offs := make([]int, len(r.Tensors)+1)
	for i, t := range r.Tensors {
		offs[i+1] = offs[i] + int(t.Shape.NumElements())*es
	}
	return &fused{w: w, f: f, offs: offs}
}

// each calls fn for every piece of a tensor within f[lo:hi]: the piece's
// range in f, and the tensor's local buffers cut to the same range.
func (fz *fused) each(lo, hi int, fn func(seg []byte, bufs [][]byte) error) error {
	for i := range fz.w.Resp.Tensors {
		a, z := max(lo, fz.offs[i]), min(hi, fz.offs[i+1])
		if a >= z {
			continue
		}
		var cut [][]byte
		for _, buf := range localBufs(fz.w.Ops[i]) {
			cut = append(cut, buf[a-fz.offs[i]:z-fz.offs[i]])
		}
		if err := fn(fz.f[a:z], cut); err != nil {
			return err
		}
	}
	return nil
}

// pipeline makes the engine's calls on f chunk by chunk (AllreduceCalls)
// while one goroutine runs reduceChunk ahead of them and another runs
// writeChunk behind. The phases it writes on the timeline: the local
// reduction until the first chunk is ready, the engine's transfer until the
// last chunk is through, then the rest of the write-back. It returns only
// once both goroutines have finished with the clients' buffers, also when
// the engine fails.
func (x *Path) pipeline(ctx context.Context, b backends.Backend, r *plan.Response, f []byte, chunk int, op tensor.ReduceOp, reduceChunk, writeChunk func(lo, hi int) error) error {
	total := len(f)
	n := sched.Chunks(total, false)
	bounds := func(k int) (int, int) { return k * chunk, min((k+1)*chunk, total) }
	// The reducer runs at most two chunks ahead of the one in the engine
	// (one waiting in the channel, one being reduced); the writer follows
	// the engine.
	stop := make(chan struct{})
	reduced := make(chan error, 1)
	written := make(chan int, n)
	var wg sync.WaitGroup
	var werr error
	wg.Add(2)
	go func() {
		defer wg.Done()
		defer close(reduced)
		for k := 0; k < n; k++ {
			select {
			case <-stop:
				return
			default:
			}
			lo, hi := bounds(k)
			err := reduceChunk(lo, hi)
			select {
			case reduced <- err:
			case <-stop:
				return
			}
			if err != nil {
				return
			}
		}
	}()
	go func() {
		defer wg.Done()
		for k := range written {
			if werr == nil {
				lo, hi := bounds(k)
				werr = writeChunk(lo, hi)
			}
		}
	}()
	x.ph.begin(Activity(r))
	ready := func(k int) error {
		rerr, ok := <-reduced
		if !ok {
			return errors.New("local reduction ended early")
		}
		if rerr != nil {
			return rerr
		}
		if k == 0 {
			x.ph.End()
			x.ph.begin(crossNode(b, r))
		}
		return nil
	}
	err := sched.AllreduceCalls(ctx, b, f, r.DType, op, false, ready, func(k int) { written <- k })
	if err == nil {
		x.ph.End()
		x.ph.begin("MEMCPY_OUT_FUSION_BUFFER")
	}
	close(stop)
	close(written)
	wg.Wait()
	if err != nil {
		return err
	}
	return werr
}

// adasumMulti reduces a fused Adasum response across nodes with the numbers
// of the one-node tree over the global ranks (reduce/adasum.go): each node
// computes the subtrees that lie inside its ranks (reduce.AdasumSpans: one
// per node when the nodes have equal power-of-two sizes), one allgather
// gives every node every node's subtree values, and each node finishes the
// upper levels itself, the same way on every node. Tensors stay separate,
// as on one node (dot products per tensor), and share the one exchange.
//
// Node m sends, for tensor after tensor, its spans' values, then one byte
// per (tensor, span): 1 when the value exists, 0 when every rank of the span
// joined (a zero vector, which Adasum skips rather than adds, so it cannot
// travel as zeros). The flags are padded to 8 bytes, so that every node's
// block, and so every value, keeps the element alignment of the fusion
// buffer.
func (x *Path) adasumMulti(ctx context.Context, b backends.Backend, w job.Work) error {
	r := &w.Resp
	mb := w.View.Rows
	nn := len(r.Tensors)
	sizes := make([]int, nn) // bytes of tensor i
	row := 0                 // bytes of every tensor once
	for i, t := range r.Tensors {
		sizes[i] = int(t.Shape.NumElements()) * r.DType.Size()
		row += sizes[i]
	}
	spans := make([][]reduce.AdasumSpan, mb.Nodes())
	counts := make([]int, mb.Nodes())
	for m := range spans {
		spans[m] = reduce.AdasumSpans(mb.NodeRanks(m))
		counts[m] = len(spans[m])*row + (len(spans[m])*nn+7)&^7
	}
	// Our block: the values of our spans, then their flags.
	mine := spans[mb.Node]
	in := x.adasumIn(counts[mb.Node])
	flags := in[len(mine)*row:]
	clear(flags)
	x.ph.begin(Activity(r))
	off := 0
	for i := range r.Tensors {
		for k, s := range mine {
			bufs := make([][]byte, s.Len)
			for j, o := range w.Ops[i][s.Start : s.Start+s.Len] {
				if o != nil {
					bufs[j] = o.Buf
				}
			}
			v, err := reduce.AdasumPartial(bufs, r.DType, r.Prescale, &x.ropts)
			if err != nil {
				return fmt.Errorf("tensor %q: %w", r.Tensors[i].Name, err)
			}
			if v != nil {
				copy(in[off:off+sizes[i]], v)
				flags[i*len(mine)+k] = 1
			}
			off += sizes[i]
		}
	}
	total := 0
	for _, c := range counts {
		total += c
	}
	out := x.Fusion(total)
	x.ph.End()
	x.ph.begin(crossNode(b, r))
	if err := b.Allgatherv(ctx, in, out, counts); err != nil {
		return err
	}
	x.ph.End()
	// The upper levels of the tree, and the write-back.
	x.ph.begin(Activity(r))
	// Every node's values of tensor i, in rank order, and the root.
	var all []reduce.AdasumSpan
	for _, ss := range spans {
		all = append(all, ss...)
	}
	vals := make([][]byte, len(all))
	tensorOff := 0
	for i, t := range r.Tensors {
		base, v := 0, 0
		for m, ss := range spans {
			fl := out[base+len(ss)*row:]
			for k := range ss {
				vals[v] = nil
				if fl[i*len(ss)+k] == 1 {
					at := base + tensorOff*len(ss) + k*sizes[i]
					vals[v] = out[at : at+sizes[i]]
				}
				v++
			}
			base += counts[m]
		}
		root, err := reduce.AdasumFinish(all, vals, r.DType, r.Postscale, &x.ropts)
		if err != nil {
			return fmt.Errorf("tensor %q: %w", t.Name, err)
		}
		if dsts := localBufs(w.Ops[i]); len(dsts) > 0 && root != nil {
			parallelCopy(dsts, root)
		}
		tensorOff += sizes[i]
	}
	return nil
}

// adasumIn returns a scratch buffer of n bytes for adasumMulti's own block,
// reused across ops (the fusion buffer receives every node's blocks).
func (x *Path) adasumIn(n int) []byte {
	if cap(x.adaIn) < n {
		x.adaIn = make([]byte, n)
	}
	return x.adaIn[:n]
}

func (x *Path) broadcastMulti(ctx context.Context, b backends.Backend, w job.Work) error {
	r := &w.Resp
	var src []byte
	in := func(i int) ([]byte, error) {
		row := w.Ops[i]
		// The root's own buffer travels as is; elsewhere one local buffer
		// receives and the others copy from it.
		src = nil
		if row[r.Root] != nil {
			src = row[r.Root].Buf
		} else {
			for _, o := range row {
				if o != nil {
					src = o.Buf
					break
				}
			}
		}
		if src == nil {
			src = x.Fusion(int(r.Tensors[i].Shape.NumElements()) * r.DType.Size())
		}
		x.ph.at(i)
		x.ph.begin(crossNode(b, r))
		return src, nil
	}
	out := func(i int, src []byte) error {
		x.ph.End()
		x.ph.begin(Activity(r))
		var dsts [][]byte
		for _, o := range w.Ops[i] {
			if o != nil && len(o.Buf) > 0 && &o.Buf[0] != &src[0] {
				dsts = append(dsts, o.Buf)
			}
		}
		if len(src) > 0 {
			parallelCopy(dsts, src)
		}
		return nil
	}
	return sched.BroadcastCalls(ctx, b, &w, in, out)
}

func (x *Path) allgatherMulti(ctx context.Context, b backends.Backend, w job.Work) ([][]*ipcpb.Done, error) {
	r := &w.Resp
	mb := w.View.Rows
	dones := make([][]*ipcpb.Done, len(r.Tensors))
	in := func(i int, into []byte) error {
		off := 0
		for _, o := range w.Ops[i][mb.Offset : mb.Offset+mb.Local()] {
			if o != nil {
				if off+len(o.Buf) > len(into) {
					return fmt.Errorf("allgather: the node's pieces exceed the %d bytes the plan gives it", len(into))
				}
				off += copy(into[off:], o.Buf)
			}
		}
		x.ph.at(i)
		x.ph.begin(crossNode(b, r))
		return nil
	}
	out := func(i int, all []byte) error {
		x.ph.End()
		x.ph.begin(Activity(r))
		t := &r.Tensors[i]
		dones[i] = x.results(w.Ops[i], func(_ int, dst []byte) { copy(dst, all) }, func(int) int { return len(all) }, sched.AllgatherShape(t), nil)
		return nil
	}
	if err := sched.AllgatherCalls(ctx, b, &w, x.Fusion, in, out); err != nil {
		return nil, err
	}
	return dones, nil
}

// results allocates each local op's result of size(rank) bytes in its
// client's output region, fills it with fill and returns the Done of each,
// with shape and what extra adds.
func (x *Path) results(row []*job.Op, fill func(rank int, dst []byte), size func(rank int) int, shape tensor.Shape, extra func(rank int, d *ipcpb.Done)) []*ipcpb.Done {
	dones := make([]*ipcpb.Done, len(row))
	for rank, o := range row {
		if o == nil {
			continue
		}
		buf, ref, err := o.Conn.AllocOutput(int64(size(rank)))
		if err != nil {
			dones[rank] = &ipcpb.Done{Code: ipcpb.Code_CODE_INTERNAL, Error: fmt.Sprintf("tensor %q: %v", o.Name, err)}
			continue
		}
		fill(rank, buf)
		d := &ipcpb.Done{Output: ref, OutputShape: shape}
		if extra != nil {
			extra(rank, d)
		}
		dones[rank] = d
	}
	return dones
}

func (x *Path) alltoallMulti(ctx context.Context, b backends.Backend, w job.Work) ([][]*ipcpb.Done, error) {
	r := &w.Resp
	dones := make([][]*ipcpb.Done, len(r.Tensors))
	in := func(i int, a *sched.A2APlan, into []byte) error {
		off := 0
		a.Sends(func(s, d int) {
			if o := w.Ops[i][s]; o != nil {
				off += copy(into[off:], o.Buf[a.Start(s, d):a.Start(s, d)+a.Piece(s, d)])
			}
		})
		x.ph.at(i)
		x.ph.begin(crossNode(b, r))
		return nil
	}
	out := func(i int, a *sched.A2APlan, got []byte) error {
		x.ph.End()
		x.ph.begin(Activity(r))
		row, shape := w.Ops[i], r.Tensors[i].Shape
		dones[i] = make([]*ipcpb.Done, len(row))
		for d, o := range row {
			if o == nil {
				continue
			}
			ds := x.results(row[d:d+1], func(_ int, dst []byte) { a.Fill(d, dst, got) }, func(int) int { return a.Rows(d) * a.RowBytes },
				a.Shape(d, shape), func(_ int, dn *ipcpb.Done) { dn.ReceivedSplits = a.Received(d) })
			dones[i][d] = ds[0]
		}
		return nil
	}
	if err := sched.AlltoallCalls(ctx, b, &w, x.Fusion, in, out); err != nil {
		return nil, err
	}
	return dones, nil
}

func (x *Path) reducescatterMulti(ctx context.Context, b backends.Backend, w job.Work) ([][]*ipcpb.Done, error) {
	r := &w.Resp
	mb := w.View.Rows
	op, pre, post := sched.Scales(r, w.Size)
	dones := make([][]*ipcpb.Done, len(r.Tensors))
	full := func(i int) ([]byte, error) {
		t := &r.Tensors[i]
		var d0 int
		if len(t.Shape) > 0 {
			d0 = int(t.Shape[0])
		}
		f := x.Fusion(d0 * int(t.Shape.RowElements()) * r.DType.Size())
		x.ph.at(i)
		x.ph.begin(Activity(r))
		if bufs := localBufs(w.Ops[i]); len(bufs) > 0 {
			if err := reduce.Reduce([][]byte{f}, bufs, r.DType, op, pre, 1, &x.ropts); err != nil {
				return nil, err
			}
		} else if err := reduce.Fill(f, r.DType, op); err != nil {
			return nil, err
		}
		x.ph.End()
		x.ph.begin(crossNode(b, r))
		return f, nil
	}
	out := func(i int, block []byte, at []int) error {
		x.ph.End()
		x.ph.begin(Activity(r))
		t := &r.Tensors[i]
		rowBytes := int(t.Shape.RowElements()) * r.DType.Size()
		rows := func(rank int) int {
			_, k := sched.ScatterBlock(t, w.Size, rank)
			return int(k)
		}
		var ferr error
		dones[i] = x.results(w.Ops[i], func(rank int, dst []byte) {
			if len(dst) > 0 {
				from := at[rank-mb.Offset]
				if err := reduce.Reduce([][]byte{dst}, [][]byte{block[from : from+len(dst)]}, r.DType, op, 1, post, &x.ropts); err != nil {
					ferr = err
				}
			}
		}, func(rank int) int { return rows(rank) * rowBytes }, nil, func(rank int, d *ipcpb.Done) {
			d.OutputShape = append(tensor.Shape{int64(rows(rank))}, t.Shape[1:]...)
		})
		return ferr
	}
	if err := sched.ReducescatterCalls(ctx, b, &w, full, out); err != nil {
		return nil, err
	}
	return dones, nil
}
