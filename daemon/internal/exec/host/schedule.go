package host

import (
	"context"
	"fmt"

	"github.com/hvdd/hvdd/backends"
	"github.com/hvdd/hvdd/daemon/internal/job"
	"github.com/hvdd/hvdd/tensor"
)

// The one schedule of engine calls. Across nodes every node must make the
// same engine calls for a response, in the same order, whichever path its
// own tensors take: host memory (this package), or GPUs through host memory
// (package device, the hierarchical paths). The functions below are those
// calls, one function per collective, and both paths go through them: a
// path supplies only what it does around each call, in (the bytes this node
// contributes, made ready) and out (what to do with what came back). So a
// node of host tensors and a node of GPU tensors meet in the same calls by
// construction.

// AllreduceCalls makes a fused allreduce's engine calls on f, this node's
// share (the local ranks' reduction, or the neutral element): one call on
// the whole of f when whole (the host path's lone local buffer, reduced in
// place) or when f is not worth pipelining (PipeChunk), else one call per
// chunk, in order. ready(k), when set, runs before chunk k's call (the
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

// Chunks is how many engine calls AllreduceCalls makes on total bytes.
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
