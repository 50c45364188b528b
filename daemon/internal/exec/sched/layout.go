package sched

import (
	"github.com/hvdd/hvdd/daemon/internal/job"
	"github.com/hvdd/hvdd/daemon/plan"
	"github.com/hvdd/hvdd/tensor"
)

// The layouts of a response's bytes across nodes. Global ranks (and a
// process set's rows) are node-major, so a node's ranks are one contiguous
// run [lo, hi) (job.Membership.NodeRanks) and node order is rank order.

// Pipelining a large fused allreduce across nodes: the fusion buffer goes
// through the engine in chunks, and while the engine moves chunk k, the host
// path reduces the local ranks' chunk k+1 into the fusion buffer and writes
// chunk k-1's result back to them. Unpipelined, the link idles while the
// node reduces the whole batch before the first byte leaves and while it
// writes the whole result back after the last one arrives (for 40 MB, 10-20
// ms each way on the 2 cores of docs/BENCHMARKS.md's headline, where the link
// needed 150-320 ms). Chunks are at least pipeMinChunk and at most
// total/pipeChunks rounded up, so a batch makes at most pipeChunks engine
// calls; buffers under 2*pipeMinChunk go whole.
const (
	pipeMinChunk = 4 << 20
	pipeChunks   = 8
)

// PipeChunk returns the chunk size for a fused allreduce of total bytes:
// total itself when it is not worth pipelining. Chunks are a multiple of
// 256 bytes, so of every element size, and start cache-line aligned
// relative to the fusion buffer.
func PipeChunk(total int) int {
	if total < 2*pipeMinChunk {
		return total
	}
	c := max(pipeMinChunk, (total+pipeChunks-1)/pipeChunks)
	return (c + 255) &^ 255
}

// FusedOffsets returns where each tensor of r lies in the concatenation of
// them all (a fusion buffer): tensor i at [offs[i], offs[i+1]) bytes.
func FusedOffsets(r *plan.Response) []int {
	offs := make([]int, len(r.Tensors)+1)
	for i, t := range r.Tensors {
		offs[i+1] = offs[i] + int(t.Shape.NumElements())*r.DType.Size()
	}
	return offs
}

// Scales turns Average into Sum with the divisor folded into the postscale,
// as Horovod does (so integer averages truncate): the op to run, the
// prescale and the postscale, for a set of size ranks.
func Scales(r *plan.Response, size int) (op tensor.ReduceOp, pre, post float64) {
	op, post = r.ReduceOp, r.Postscale
	if op == tensor.Average {
		op = tensor.Sum
		post /= float64(size)
	}
	return op, r.Prescale, post
}

// ScatterBlock is rank's block of a reducescatter of t over size ranks: its
// first row and its number of rows. With d0 rows, every rank gets d0/size
// rows and the first d0%size ranks one more, as in Horovod; the blocks
// follow each other in rank order, so rank r starts after r full blocks
// and the min(r, d0%size) extra rows of the ranks before it.
func ScatterBlock(t *plan.Tensor, size, rank int) (start, rows int64) {
	var d0 int64
	if len(t.Shape) > 0 {
		d0 = t.Shape[0]
	}
	n, r := int64(size), int64(rank)
	rows = d0 / n
	start = r*rows + min(r, d0%n)
	if r < d0%n {
		rows++
	}
	return start, rows
}

// AllgatherShape is the output shape of allgather tensor t: the ranks' first
// dimensions added up.
func AllgatherShape(t *plan.Tensor) tensor.Shape {
	var rows int64
	for _, s := range t.RankShapes {
		if len(s) > 0 {
			rows += s[0]
		}
	}
	return append(tensor.Shape{rows}, t.Shape[1:]...)
}

// AllgatherRankBytes is what rank contributes to an allgather of t.
func AllgatherRankBytes(t *plan.Tensor, dt tensor.DType, rank int) int {
	if rank >= len(t.RankShapes) || len(t.RankShapes[rank]) == 0 {
		return 0
	}
	return int(t.RankShapes[rank][0]*t.Shape.RowElements()) * dt.Size()
}

// AllgatherCounts is what each node of mb contributes to an allgather of t
// (bytes), and the total.
func AllgatherCounts(mb job.Membership, t *plan.Tensor, dt tensor.DType) (counts []int, total int) {
	counts = NodeCounts(mb, func(rank int) int { return AllgatherRankBytes(t, dt, rank) })
	for _, c := range counts {
		total += c
	}
	return counts, total
}

// NodeCounts adds up bytes(rank) over each node's ranks of mb.
func NodeCounts(mb job.Membership, bytes func(rank int) int) []int {
	counts := make([]int, mb.Nodes())
	for m := range counts {
		lo, hi := mb.NodeRanks(m)
		for rank := lo; rank < hi; rank++ {
			counts[m] += bytes(rank)
		}
	}
	return counts
}

// A2APlan is how one alltoall tensor's pieces travel across nodes in one
// Alltoallv: each node sends node m, for each rank d of m in rank order,
// the pieces of its own ranks s for d, in rank order (Sends); so what node
// k receives from node m is, for each of k's ranks d, the pieces of m's
// ranks for d. Rank d's output is every rank's piece for d in rank order,
// which it gathers as one run per node (Segments): node m's block of what
// was received holds, for d, m's ranks' pieces for d contiguously.
type A2APlan struct {
	mb         job.Membership
	sp         [][]int32 // splits: sp[s][d] rows from s to d
	RowBytes   int       // bytes of one row of the tensor
	myLo, myHi int       // this node's ranks
	SendCounts []int     // bytes to each node
	RecvCounts []int     // bytes from each node
	BlockStart []int     // where node m's bytes begin in what was received
	Total      int       // bytes received
}

// NewA2APlan plans the alltoall of w's tensor i across nodes. A rank of
// this node without an op (w.Ops[i][s] nil) sends nothing.
func NewA2APlan(w *job.Work, i int) *A2APlan {
	t := &w.Resp.Tensors[i]
	mb := w.View.Rows
	a := &A2APlan{mb: mb, sp: t.Splits, RowBytes: int(t.Shape.RowElements()) * w.Resp.DType.Size()}
	a.myLo, a.myHi = mb.NodeRanks(mb.Node)
	nn := mb.Nodes()
	a.SendCounts, a.RecvCounts, a.BlockStart = make([]int, nn), make([]int, nn), make([]int, nn)
	for m := range nn {
		lo, hi := mb.NodeRanks(m)
		for d := lo; d < hi; d++ {
			for s := a.myLo; s < a.myHi; s++ {
				if w.Ops[i][s] != nil {
					a.SendCounts[m] += a.Piece(s, d)
				}
			}
		}
		for d := a.myLo; d < a.myHi; d++ {
			for s := lo; s < hi; s++ {
				a.RecvCounts[m] += a.Piece(s, d)
			}
		}
		if m > 0 {
			a.BlockStart[m] = a.BlockStart[m-1] + a.RecvCounts[m-1]
		}
		a.Total += a.RecvCounts[m]
	}
	return a
}

// Piece is the bytes rank s sends rank d.
func (a *A2APlan) Piece(s, d int) int { return int(a.sp[s][d]) * a.RowBytes }

// Start is where the bytes rank s sends rank d begin in s's input: after
// its pieces for the ranks before d.
func (a *A2APlan) Start(s, d int) int {
	o := 0
	for k := range d {
		o += a.Piece(s, k)
	}
	return o
}

// Sends calls f for the pieces this node sends, in the order they travel.
func (a *A2APlan) Sends(f func(s, d int)) {
	for m := range a.mb.Nodes() {
		lo, hi := a.mb.NodeRanks(m)
		for d := lo; d < hi; d++ {
			for s := a.myLo; s < a.myHi; s++ {
				f(s, d)
			}
		}
	}
}

// Rows is how many rows rank d receives.
func (a *A2APlan) Rows(d int) int {
	n := 0
	for s := range a.sp {
		n += int(a.sp[s][d])
	}
	return n
}

// Received is how many rows rank d receives from each rank.
func (a *A2APlan) Received(d int) []int32 {
	out := make([]int32, len(a.sp))
	for s := range a.sp {
		out[s] = a.sp[s][d]
	}
	return out
}

// Shape is rank d's output shape for an input of shape in.
func (a *A2APlan) Shape(d int, in tensor.Shape) tensor.Shape {
	return append(tensor.Shape{int64(a.Rows(d))}, in[1:]...)
}

// Segments lists where local rank d's output lies in what the Alltoallv
// received: one run per node (its ranks' pieces for d, in rank order), as
// {offset, length}. In node m's block the pieces for this node's ranks
// before d come first.
func (a *A2APlan) Segments(d int) [][2]int {
	segs := make([][2]int, 0, a.mb.Nodes())
	for m := range a.mb.Nodes() {
		lo, hi := a.mb.NodeRanks(m)
		off := a.BlockStart[m]
		for dd := a.myLo; dd < d; dd++ {
			for s := lo; s < hi; s++ {
				off += a.Piece(s, dd)
			}
		}
		n := 0
		for s := lo; s < hi; s++ {
			n += a.Piece(s, d)
		}
		segs = append(segs, [2]int{off, n})
	}
	return segs
}

// Fill writes local rank d's output (Rows(d) rows) into dst from got, what
// the Alltoallv received.
func (a *A2APlan) Fill(d int, dst, got []byte) {
	at := 0
	for _, sg := range a.Segments(d) {
		at += copy(dst[at:], got[sg[0]:sg[0]+sg[1]])
	}
}
