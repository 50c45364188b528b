package sched

import (
	"context"
	"fmt"
	"slices"

	"github.com/hvdd/hvdd/backends"
	"github.com/hvdd/hvdd/daemon/internal/job"
	"github.com/hvdd/hvdd/tensor"
)

// The one schedule of engine calls. Across nodes every node must make the
// same engine calls for a response, in the same order, whichever path its
// own tensors take: host memory (package host), or GPUs through host memory
// (package device, the hierarchical paths). The functions below are those
// calls, one function per collective, and both paths go through them: a
// path supplies only what it does around each call, in (the bytes this node
// contributes, made ready) and out (what to do with what came back). So a
// node of host tensors and a node of GPU tensors meet in the same calls by
// construction.

// Whole reports whether a fused allreduce across nodes goes to the engine
// as one call on the whole buffer, whatever its size: when it has one
// tensor, no prescale (Adasum aside), and every node of its set exactly one
// rank that contributes (a member that did not join). Then the host path
// hands the engine the lone local rank's buffer itself, with no copy in or
// out and so nothing to pipeline; otherwise the buffer goes in PipeChunk's
// chunks. Both paths, host and device, ask this one function, and it reads
// only what every node knows alike (the response and its set's layout over
// the nodes, never this node's buffers), so that every node makes the same
// number of calls with the same sizes: a node of one rank and a node of two
// must not split the same allreduce differently.
func Whole(w *job.Work) bool {
	r := &w.Resp
	if r.Op != tensor.Allreduce || r.ReduceOp == tensor.Adasum || len(r.Tensors) != 1 || r.Prescale != 1 {
		return false
	}
	mb := w.View.Rows
	if mb.Nodes() == 0 {
		return false
	}
	// Contributors per node: its members less those that joined.
	left := make([]int, mb.Nodes())
	for m := range left {
		lo, hi := mb.NodeRanks(m)
		left[m] = hi - lo
	}
	for _, g := range r.JoinedRanks {
		row, ok := setRow(w, g)
		if !ok {
			return false
		}
		if m := mb.NodeOf(row); m >= 0 {
			left[m]--
		}
	}
	for _, n := range left {
		if n != 1 {
			return false
		}
	}
	return true
}

// setRow is the row of global rank g in w's process set: g itself in the
// global set, else its place among the set's members.
func setRow(w *job.Work, g int) (int, bool) {
	set := w.Resp.ProcessSet
	if set == 0 {
		return g, true
	}
	if w.Job == nil {
		return 0, false
	}
	members, _ := w.Job.SetRanks(set)
	row := slices.Index(members, g)
	return row, row >= 0
}

// AllreduceCalls makes a fused allreduce's engine calls on f, this node's
// share (the local ranks' reduction, or the neutral element): one call on
// the whole of f when whole (Whole: the host path's lone local buffer,
// reduced in place) or when f is not worth pipelining (PipeChunk), else one
// call per chunk, in order. ready(k), when set, runs before chunk k's call (the
// pipelined host path waits there for the chunk's local reduction) and
// done(k) after it.
func AllreduceCalls(ctx context.Context, b backends.Backend, f []byte, dt tensor.DType, op tensor.ReduceOp, whole bool, ready func(k int) error, done func(k int)) error {
	chunk := PipeChunk(len(f))
	if whole || chunk >= len(f) {
		chunk = max(len(f), 1)
	}
	for k, lo := 0, 0; lo < len(f) || k == 0; k, lo = k+1, lo+chunk {
		if ready != nil {
			if err := ready(k); err != nil {
				return err
			}
		}
		if err := b.Allreduce(ctx, f[lo:min(lo+chunk, len(f))], dt, op); err != nil {
			return err
		}
		if done != nil {
			done(k)
		}
	}
	return nil
}

// Chunks is how many engine calls AllreduceCalls makes on total bytes
// (whole as given to it).
func Chunks(total int, whole bool) int {
	chunk := PipeChunk(total)
	if whole || chunk >= total {
		return 1
	}
	return (total + chunk - 1) / chunk
}

// BroadcastCalls makes a broadcast's engine calls: one per tensor, from the
// root's node. in(i) gives tensor i's buffer on this node (holding the
// root's data on the root's node), out(i, buf) takes it once the call
// filled it.
func BroadcastCalls(ctx context.Context, b backends.Backend, w *job.Work, in func(i int) ([]byte, error), out func(i int, buf []byte) error) error {
	rootNode := w.View.Rows.NodeOf(w.Resp.Root)
	for i := range w.Resp.Tensors {
		buf, err := in(i)
		if err != nil {
			return err
		}
		if err := b.Broadcast(ctx, buf, rootNode); err != nil {
			return err
		}
		if err := out(i, buf); err != nil {
			return err
		}
	}
	return nil
}

// AllgatherCalls makes an allgather's engine calls: one Allgatherv per
// tensor, each node contributing its ranks' pieces in rank order.
// in(i, into) fills into, this node's bytes of tensor i (sized by the
// plan), and out(i, all) takes every node's, the tensor's output. all is
// the host path's fusion buffer: it serves again once out returned.
func AllgatherCalls(ctx context.Context, b backends.Backend, w *job.Work, fusion func(n int) []byte, in func(i int, into []byte) error, out func(i int, all []byte) error) error {
	r, mb := &w.Resp, w.View.Rows
	for i := range r.Tensors {
		counts, total := AllgatherCounts(mb, &r.Tensors[i], r.DType)
		into := make([]byte, counts[mb.Node])
		if err := in(i, into); err != nil {
			return err
		}
		all := fusion(total)
		if err := b.Allgatherv(ctx, into, all, counts); err != nil {
			return err
		}
		if err := out(i, all); err != nil {
			return err
		}
	}
	return nil
}

// AlltoallCalls makes an alltoall's engine calls: one Alltoallv per tensor
// in A2APlan's layout. in(i, a, into) fills into with what this node sends
// (its ranks' pieces in a.Sends' order), and out(i, a, got) takes what it
// received (got is the fusion buffer, as in AllgatherCalls).
func AlltoallCalls(ctx context.Context, b backends.Backend, w *job.Work, fusion func(n int) []byte, in func(i int, a *A2APlan, into []byte) error, out func(i int, a *A2APlan, got []byte) error) error {
	for i := range w.Resp.Tensors {
		a := NewA2APlan(w, i)
		sent := 0
		for _, c := range a.SendCounts {
			sent += c
		}
		into := make([]byte, sent)
		if err := in(i, a, into); err != nil {
			return err
		}
		got := fusion(a.Total)
		if err := b.Alltoallv(ctx, into, a.SendCounts, got, a.RecvCounts); err != nil {
			return err
		}
		if err := out(i, a, got); err != nil {
			return err
		}
	}
	return nil
}

// ReducescatterCalls makes a reducescatter's engine calls: one
// ReduceScatter per tensor of the node's reduction of the whole tensor into
// this node's block (its ranks' rows, in rank order). full(i) gives the
// node's reduction of tensor i (prescaled), out(i, block, at) takes the
// block, where local rank r's rows begin at at[r] and number rows(r).
func ReducescatterCalls(ctx context.Context, b backends.Backend, w *job.Work, full func(i int) ([]byte, error), out func(i int, block []byte, at []int) error) error {
	r, mb := &w.Resp, w.View.Rows
	op, _, _ := Scales(r, w.Size)
	for i := range r.Tensors {
		t := &r.Tensors[i]
		rowBytes := int(t.Shape.RowElements()) * r.DType.Size()
		bytes := func(rank int) int {
			_, k := ScatterBlock(t, w.Size, rank)
			return int(k) * rowBytes
		}
		f, err := full(i)
		if err != nil {
			return err
		}
		counts := NodeCounts(mb, bytes)
		if len(f) != sumInts(counts) {
			return fmt.Errorf("reducescatter: the node's reduction has %d bytes, the plan's blocks %d", len(f), sumInts(counts))
		}
		block := make([]byte, counts[mb.Node])
		if err := b.ReduceScatter(ctx, f, block, counts, r.DType, op); err != nil {
			return err
		}
		at := make([]int, mb.Local())
		off := 0
		for lr := range at {
			at[lr] = off
			off += bytes(mb.Offset + lr)
		}
		if err := out(i, block, at); err != nil {
			return err
		}
	}
	return nil
}

func sumInts(v []int) int {
	n := 0
	for _, x := range v {
		n += x
	}
	return n
}
