package sched

import (
	"context"
	"fmt"
	"math/rand/v2"

	"github.com/hvdd/hvdd/backends"
	"github.com/hvdd/hvdd/daemon/internal/job"
	"github.com/hvdd/hvdd/daemon/plan"
	"github.com/hvdd/hvdd/tensor"
)

// nodeOf is the naive node of rank among nodes of these slot counts: the
// first node whose ranks, counted from 0, reach past it.
func nodeOf(slots []int, rank int) int {
	for m, end := 0, 0; m < len(slots); m++ {
		end += slots[m]
		if rank < end {
			return m
		}
	}
	return -1
}

// workOn is node's work for response r of a set laid over nodes of these
// slot counts: every member of node has an op in every row except the
// joined rows.
func workOn(slots []int, node int, r plan.Response, joined ...int) *job.Work {
	mb := job.NewMembership(slots, node)
	w := &job.Work{Resp: r, Size: mb.Size, Engine: &recorder{size: len(slots), rank: node}}
	w.View.Rows = mb
	for m := range slots {
		w.View.Nodes = append(w.View.Nodes, m)
	}
	lo, hi := mb.NodeRanks(node)
	for range max(len(r.Tensors), 1) {
		row := make([]*job.Op, mb.Size)
		for rank := lo; rank < hi; rank++ {
			row[rank] = &job.Op{}
		}
		for _, j := range joined {
			row[j] = nil
		}
		w.Ops = append(w.Ops, row)
	}
	return w
}

// randSlots draws 1-4 nodes of 1-3 ranks.
func randSlots(rng *rand.Rand) []int {
	slots := make([]int, 1+rng.IntN(4))
	for m := range slots {
		slots[m] = 1 + rng.IntN(3)
	}
	return slots
}

// call is one engine call as the recorder saw it.
type call struct {
	op         string
	off, n     int // the buffer's offset in the buffer the caller passed and its length (Allreduce)
	in, out    int // lengths (Allgatherv, Alltoallv, ReduceScatter)
	counts     []int
	recvCounts []int
	root       int
}

func (c call) String() string {
	return fmt.Sprintf("%s off=%d n=%d in=%d out=%d counts=%v recv=%v root=%d", c.op, c.off, c.n, c.in, c.out, c.counts, c.recvCounts, c.root)
}

// recorder is a backends.Backend that does nothing but record its calls.
// base, when set, is the buffer Allreduce calls are cut from, for their
// offsets.
type recorder struct {
	size, rank int
	base       []byte
	calls      []call
	fail       int // fail the call of this number (1-based); 0: never
}

var _ backends.Backend = (*recorder)(nil)

func (b *recorder) record(c call) error {
	b.calls = append(b.calls, c)
	if len(b.calls) == b.fail {
		return fmt.Errorf("call %d failed", b.fail)
	}
	return nil
}

func (b *recorder) Name() string { return "rec" }
func (b *recorder) Rank() int    { return b.rank }
func (b *recorder) Size() int    { return b.size }
func (b *recorder) Allreduce(_ context.Context, buf []byte, _ tensor.DType, _ tensor.ReduceOp) error {
	off := 0
	if b.base != nil {
		off = cap(b.base) - cap(buf) // buf is base[off:...]
	}
	return b.record(call{op: "allreduce", off: off, n: len(buf)})
}
func (b *recorder) Allgatherv(_ context.Context, in, out []byte, counts []int) error {
	return b.record(call{op: "allgatherv", in: len(in), out: len(out), counts: counts})
}
func (b *recorder) Broadcast(_ context.Context, buf []byte, root int) error {
	return b.record(call{op: "broadcast", n: len(buf), root: root})
}
func (b *recorder) Alltoallv(_ context.Context, in []byte, sendCounts []int, out []byte, recvCounts []int) error {
	return b.record(call{op: "alltoallv", in: len(in), out: len(out), counts: sendCounts, recvCounts: recvCounts})
}
func (b *recorder) ReduceScatter(_ context.Context, in, out []byte, counts []int, _ tensor.DType, _ tensor.ReduceOp) error {
	return b.record(call{op: "reducescatter", in: len(in), out: len(out), counts: counts})
}
func (b *recorder) Barrier(context.Context) error { return b.record(call{op: "barrier"}) }
func (b *recorder) Close() error                  { return nil }
