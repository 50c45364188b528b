package sched

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/hvdd/hvdd/daemon/internal/job"
	"github.com/hvdd/hvdd/daemon/plan"
	"github.com/hvdd/hvdd/tensor"
)

// TestAllreduceCalls checks the calls AllreduceCalls makes on a buffer
// against the naive expectation: one call on the whole when whole or under
// 8 MiB (one empty call for an empty buffer), else consecutive chunks of
// PipeChunk bytes, the last one short, covering the buffer once in order,
// each between its ready and its done.
func TestAllreduceCalls(t *testing.T) {
	tests := []struct {
		total int
		whole bool
	}{
		{0, false}, {0, true}, {4, false}, {8<<20 - 4, false}, {8 << 20, false}, {8 << 20, true},
		{12_000_000, false}, {12_000_000, true}, {33<<20 + 4, false}, {100_000_000, false},
	}
	for _, tc := range tests {
		t.Run(fmt.Sprintf("%d/whole=%v", tc.total, tc.whole), func(t *testing.T) {
			var want []call
			var events []string
			if tc.whole || tc.total < 8<<20 {
				want = []call{{op: "allreduce", n: tc.total}}
			} else {
				c := PipeChunk(tc.total)
				for lo := 0; lo < tc.total; lo += c {
					want = append(want, call{op: "allreduce", off: lo, n: min(c, tc.total-lo)})
				}
			}
			for k := range want {
				events = append(events, fmt.Sprint("ready ", k), fmt.Sprint("call ", k), fmt.Sprint("done ", k))
			}
			f := make([]byte, tc.total)
			b := &recorder{base: f}
			var got []string
			ready := func(k int) error { got = append(got, fmt.Sprint("ready ", k)); return nil }
			done := func(k int) { got = append(got, fmt.Sprint("call ", len(b.calls)-1), fmt.Sprint("done ", k)) }
			if err := AllreduceCalls(context.Background(), b, f, tensor.Uint8, tensor.Sum, tc.whole, ready, done); err != nil {
				t.Fatal(err)
			}
			if !slices.EqualFunc(b.calls, want, func(a, b call) bool { return a.String() == b.String() }) {
				t.Errorf("calls\n%v\nwant\n%v", b.calls, want)
			}
			if !slices.Equal(got, events) {
				t.Errorf("order %v, want %v", got, events)
			}
			if n := Chunks(tc.total, tc.whole); n != len(want) {
				t.Errorf("Chunks = %d, want %d", n, len(want))
			}
		})
	}
}

// TestAllreduceCallsStop checks that a failed call or ready ends the
// schedule with its error.
func TestAllreduceCallsStop(t *testing.T) {
	f := make([]byte, 40<<20)
	b := &recorder{base: f, fail: 2}
	if err := AllreduceCalls(context.Background(), b, f, tensor.Uint8, tensor.Sum, false, nil, nil); err == nil || len(b.calls) != 2 {
		t.Errorf("failed call: err %v after %d calls, want an error after 2", err, len(b.calls))
	}
	b = &recorder{base: f}
	stop := fmt.Errorf("stop")
	err := AllreduceCalls(context.Background(), b, f, tensor.Uint8, tensor.Sum, false, func(k int) error {
		if k == 3 {
			return stop
		}
		return nil
	}, nil)
	if err != stop || len(b.calls) != 3 {
		t.Errorf("failed ready: err %v after %d calls, want stop after 3", err, len(b.calls))
	}
}

// TestWhole checks the rule against its statement (one tensor, no
// prescale, exactly one member left on every node once the joined are
// taken off) and that every node of a layout reaches the same answer:
// uneven nodes (one rank here, two there) and joined ranks used to make a
// node of one contributing rank send the buffer whole while the others
// sent it in chunks.
func TestWhole(t *testing.T) {
	one := []plan.Tensor{{Name: "a", Shape: tensor.Shape{3_000_000}}}
	two := append(slices.Clone(one), plan.Tensor{Name: "b", Shape: tensor.Shape{4}})
	tests := []struct {
		name    string
		slots   []int
		tensors []plan.Tensor
		pre     float64
		adasum  bool
		joined  []int // global ranks
		want    bool
	}{
		{"one rank per node", []int{1, 1}, one, 1, false, nil, true},
		{"three nodes of one", []int{1, 1, 1}, one, 1, false, nil, true},
		{"two ranks per node", []int{2, 2}, one, 1, false, nil, false},
		{"uneven 1+2", []int{1, 2}, one, 1, false, nil, false},
		{"uneven 2+1", []int{2, 1}, one, 1, false, nil, false},
		{"two fused", []int{1, 1}, two, 1, false, nil, false},
		{"prescaled", []int{1, 1}, one, 0.5, false, nil, false},
		{"adasum", []int{1, 1}, one, 1, true, nil, false},
		{"one of one joined", []int{1, 1}, one, 1, false, []int{1}, false},
		{"one of two joined on each node", []int{2, 2}, one, 1, false, []int{0, 3}, true},
		{"one of two joined on one node", []int{2, 2}, one, 1, false, []int{1}, false},
		{"1+2, one joined on the second", []int{1, 2}, one, 1, false, []int{2}, true},
		{"3+1+2, joined to one each", []int{3, 1, 2}, one, 1, false, []int{0, 2, 5}, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := plan.Response{Op: tensor.Allreduce, ReduceOp: tensor.Sum, DType: tensor.Float32, Prescale: tc.pre, Postscale: 1, Tensors: tc.tensors, JoinedRanks: tc.joined}
			if tc.adasum {
				r.ReduceOp = tensor.Adasum
			}
			for node := range tc.slots {
				if got := Whole(workOn(tc.slots, node, r, tc.joined...)); got != tc.want {
					t.Errorf("node %d: Whole = %v, want %v", node, got, tc.want)
				}
			}
		})
	}
}

// TestWholeProcessSet checks that a process set's joined members (global
// ranks) count on the nodes of their rows.
func TestWholeProcessSet(t *testing.T) {
	// Set 3 is global ranks 1, 2 and 5 of a job of nodes {0,1}, {2,3},
	// {4,5}: one member on node 0, one on node 1, one on node 2.
	r := plan.Response{Op: tensor.Allreduce, ReduceOp: tensor.Sum, ProcessSet: 3, Prescale: 1, Postscale: 1, Tensors: []plan.Tensor{{Shape: tensor.Shape{8}}}}
	j := &job.Job{Sets: map[int32][]int{3: {1, 2, 5}}}
	w := workOn([]int{1, 1, 1}, 0, r)
	w.Job = j
	if !Whole(w) {
		t.Error("one member per node: not whole")
	}
	// Global rank 2 (row 1, node 1) joined: node 1 has none left.
	w.Resp.JoinedRanks = []int{2}
	if Whole(w) {
		t.Error("a node with no member left: whole")
	}
	// A joined rank that is no member of the set: not whole, on every node alike.
	w.Resp.JoinedRanks = []int{4}
	if Whole(w) {
		t.Error("an unknown joined rank: whole")
	}
}

// TestAllreduceSameOnEveryNode runs the fused allreduce's schedule on every
// node of many layouts, as the host path would (whole where Whole says),
// and checks that every node makes the same calls: a sum of 12 MB in
// chunks on one node and whole on another mixes the chunks.
func TestAllreduceSameOnEveryNode(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	for range 300 {
		slots := randSlots(rng)
		size := 0
		for _, n := range slots {
			size += n
		}
		var joined []int
		for g := range size {
			if rng.IntN(4) == 0 {
				joined = append(joined, g)
			}
		}
		n := []int{4, 1 << 20, 3_000_000, 9_000_001}[rng.IntN(4)]
		r := plan.Response{Op: tensor.Allreduce, ReduceOp: tensor.Sum, DType: tensor.Float32, Prescale: 1, Postscale: 1, Tensors: []plan.Tensor{{Shape: tensor.Shape{int64(n)}}}, JoinedRanks: joined}
		var first []call
		for node := range slots {
			w := workOn(slots, node, r, joined...)
			f := make([]byte, 4*n)
			b := &recorder{base: f}
			if err := AllreduceCalls(context.Background(), b, f, r.DType, tensor.Sum, Whole(w), nil, nil); err != nil {
				t.Fatal(err)
			}
			if node == 0 {
				first = b.calls
			} else if fmt.Sprint(b.calls) != fmt.Sprint(first) {
				t.Fatalf("slots %v joined %v: node %d calls %v, node 0 %v", slots, joined, node, b.calls, first)
			}
		}
	}
}

// TestCollectiveCallsAgree runs the broadcast's, allgather's, alltoall's
// and reducescatter's schedules on every node of many layouts and checks
// the calls against what the engine needs of them: one call per tensor in
// tensor order, the same counts and root on every node, this node's bytes
// in its own slot of the counts, each node's sends matched by the
// receiver's expected bytes.
func TestCollectiveCallsAgree(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 10))
	ctx := context.Background()
	fusion := func(n int) []byte { return make([]byte, n) }
	for range 200 {
		slots := randSlots(rng)
		size := 0
		for _, n := range slots {
			size += n
		}
		nt := 1 + rng.IntN(3)
		var ts []plan.Tensor
		for i := range nt {
			tn := plan.Tensor{Name: fmt.Sprint("t", i), Shape: tensor.Shape{int64(rng.IntN(9)), 2}, RankShapes: make([]tensor.Shape, size), Splits: make([][]int32, size)}
			for s := range size {
				tn.RankShapes[s] = tensor.Shape{int64(rng.IntN(4)), 2}
				tn.Splits[s] = make([]int32, size)
				for d := range size {
					tn.Splits[s][d] = int32(rng.IntN(3))
				}
			}
			ts = append(ts, tn)
		}
		root := rng.IntN(size)
		type perNode struct{ bc, ag, a2a, rs []call }
		nodes := make([]perNode, len(slots))
		for node := range slots {
			mk := func(op tensor.OpType) (*job.Work, *recorder) {
				w := workOn(slots, node, plan.Response{Op: op, ReduceOp: tensor.Sum, DType: tensor.Float32, Prescale: 1, Postscale: 1, Root: root, Tensors: ts})
				return w, w.Engine.(*recorder)
			}
			w, b := mk(tensor.Broadcast)
			var order []int
			if err := BroadcastCalls(ctx, b, w, func(i int) ([]byte, error) {
				order = append(order, i)
				return make([]byte, int(ts[i].Shape.NumElements())*4), nil
			}, func(int, []byte) error { return nil }); err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(order, []int{0, 1, 2}[:nt]) {
				t.Fatalf("broadcast in order %v", order)
			}
			nodes[node].bc = b.calls
			w, b = mk(tensor.Allgather)
			if err := AllgatherCalls(ctx, b, w, fusion, func(int, []byte) error { return nil }, func(int, []byte) error { return nil }); err != nil {
				t.Fatal(err)
			}
			nodes[node].ag = b.calls
			w, b = mk(tensor.Alltoall)
			if err := AlltoallCalls(ctx, b, w, fusion, func(int, *A2APlan, []byte) error { return nil }, func(int, *A2APlan, []byte) error { return nil }); err != nil {
				t.Fatal(err)
			}
			nodes[node].a2a = b.calls
			w, b = mk(tensor.Reducescatter)
			if err := ReducescatterCalls(ctx, b, w, func(i int) ([]byte, error) {
				return make([]byte, int(ts[i].Shape.NumElements())*4), nil
			}, func(int, []byte, []int) error { return nil }); err != nil {
				t.Fatal(err)
			}
			nodes[node].rs = b.calls
		}
		for node, p := range nodes {
			if len(p.bc) != nt || len(p.ag) != nt || len(p.a2a) != nt || len(p.rs) != nt {
				t.Fatalf("node %d: %d %d %d %d calls for %d tensors", node, len(p.bc), len(p.ag), len(p.a2a), len(p.rs), nt)
			}
			for i := range nt {
				if c := p.bc[i]; c.root != nodeOf(slots, root) || c.n != int(ts[i].Shape.NumElements())*4 {
					t.Fatalf("node %d broadcast %d: %v, want root node %d", node, i, c, nodeOf(slots, root))
				}
				// Allgather: every node's rows, the counts alike everywhere.
				want := make([]int, len(slots))
				for s, sh := range ts[i].RankShapes {
					want[nodeOf(slots, s)] += int(sh[0]) * 2 * 4
				}
				if c := p.ag[i]; !slices.Equal(c.counts, want) || c.in != want[node] || c.out != sumInts(want) {
					t.Fatalf("slots %v node %d allgather %d: %v, want counts %v", slots, node, i, c, want)
				}
				// Reducescatter: the whole tensor in, each node's ranks' blocks.
				want = make([]int, len(slots))
				for rank := range size {
					_, rows := ScatterBlock(&ts[i], size, rank)
					want[nodeOf(slots, rank)] += int(rows) * 2 * 4
				}
				if c := p.rs[i]; !slices.Equal(c.counts, want) || c.out != want[node] || c.in != sumInts(want) {
					t.Fatalf("slots %v node %d reducescatter %d: %v, want counts %v", slots, node, i, c, want)
				}
				// Alltoall: what node sends m is what m expects from it.
				for m, q := range nodes {
					if p.a2a[i].counts[m] != q.a2a[i].recvCounts[node] {
						t.Fatalf("slots %v tensor %d: node %d sends node %d %d bytes, which expects %d", slots, i, node, m, p.a2a[i].counts[m], q.a2a[i].recvCounts[node])
					}
				}
				if c := p.a2a[i]; c.in != sumInts(c.counts) || c.out != sumInts(c.recvCounts) {
					t.Fatalf("node %d alltoall %d: %v", node, i, c)
				}
			}
		}
	}
}
