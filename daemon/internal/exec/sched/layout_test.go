package sched

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/hvdd/hvdd/daemon/internal/job"
	"github.com/hvdd/hvdd/daemon/plan"
	"github.com/hvdd/hvdd/tensor"
)

// TestPipeChunk checks PipeChunk against the rule written out the slow way:
// under 8 MiB whole; else the smallest multiple of 256 bytes that is at
// least 4 MiB and at least an eighth of the total, so that there are at
// most 8 chunks and none is small.
func TestPipeChunk(t *testing.T) {
	naive := func(total int) int {
		if total < 8<<20 {
			return total
		}
		c := max(4<<20, (total+7)/8)
		for c%256 != 0 {
			c++
		}
		return c
	}
	totals := []int{0, 1, 4, 255, 4 << 20, 8<<20 - 1, 8 << 20, 8<<20 + 1, 12_000_000, 32 << 20, 32<<20 + 4, 33<<20 + 7, 100_000_003, 1 << 30}
	rng := rand.New(rand.NewPCG(1, 2))
	for range 200 {
		totals = append(totals, rng.IntN(200<<20))
	}
	for _, total := range totals {
		got := PipeChunk(total)
		if want := naive(total); got != want {
			t.Errorf("PipeChunk(%d) = %d, want %d", total, got, want)
		}
		if total >= 8<<20 {
			if n := (total + got - 1) / got; n < 2 || n > 8 {
				t.Errorf("PipeChunk(%d) = %d: %d chunks", total, got, n)
			}
		}
	}
}

// TestScatterBlock checks ScatterBlock against rows dealt one by one: each
// row, in order, to the lowest rank still short of its share, where the
// first d0%size ranks' share is one more.
func TestScatterBlock(t *testing.T) {
	for d0 := range int64(23) {
		for size := 1; size <= 7; size++ {
			t.Run(fmt.Sprintf("d0=%d/size=%d", d0, size), func(t *testing.T) {
				share := make([]int64, size)
				for r := range share {
					share[r] = d0 / int64(size)
					if int64(r) < d0%int64(size) {
						share[r]++
					}
				}
				start := make([]int64, size)
				rows := make([]int64, size)
				r := 0
				for row := range d0 {
					for rows[r] == share[r] {
						r++
						start[r] = row
					}
					rows[r]++
				}
				for r++; r < size; r++ {
					start[r] = d0
				}
				tn := &plan.Tensor{Shape: tensor.Shape{d0, 3}}
				for r := range size {
					s, n := ScatterBlock(tn, size, r)
					if s != start[r] || n != rows[r] {
						t.Errorf("rank %d: block [%d +%d), want [%d +%d)", r, s, n, start[r], rows[r])
					}
				}
			})
		}
	}
	if s, n := ScatterBlock(&plan.Tensor{}, 3, 1); s != 0 || n != 0 {
		t.Errorf("scalar: block [%d +%d), want empty", s, n)
	}
}

// TestAllgatherCounts checks the per-node counts against the ranks' bytes
// added up node by node the naive way (nodeOf), over many layouts.
func TestAllgatherCounts(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for k := range 300 {
		slots := randSlots(rng)
		size := 0
		for _, n := range slots {
			size += n
		}
		row := 1 + rng.IntN(4)
		tn := &plan.Tensor{Shape: tensor.Shape{0, int64(row)}, RankShapes: make([]tensor.Shape, size)}
		var rows int64
		for r := range size {
			if rng.IntN(5) > 0 {
				tn.RankShapes[r] = tensor.Shape{int64(rng.IntN(6)), int64(row)}
				rows += tn.RankShapes[r][0]
			}
		}
		dt := []tensor.DType{tensor.Float32, tensor.Float16, tensor.Float64, tensor.Uint8}[k%4]
		want := make([]int, len(slots))
		wantTotal := 0
		for r, s := range tn.RankShapes {
			if len(s) > 0 {
				b := int(s[0]) * row * dt.Size()
				want[nodeOf(slots, r)] += b
				wantTotal += b
			}
		}
		for node := range slots {
			counts, total := AllgatherCounts(job.NewMembership(slots, node), tn, dt)
			if !slices.Equal(counts, want) || total != wantTotal {
				t.Fatalf("slots %v node %d: counts %v total %d, want %v %d", slots, node, counts, total, want, wantTotal)
			}
		}
		if got := AllgatherShape(tn); !slices.Equal(got, tensor.Shape{rows, int64(row)}) {
			t.Fatalf("AllgatherShape = %v, want [%d %d]", got, rows, row)
		}
	}
}

// TestScales checks Average's divisor folded into the postscale.
func TestScales(t *testing.T) {
	tests := []struct {
		op        tensor.ReduceOp
		pre, post float64
		size      int
		wantOp    tensor.ReduceOp
		wantPost  float64
	}{
		{tensor.Sum, 1, 1, 4, tensor.Sum, 1},
		{tensor.Sum, 0.5, 3, 4, tensor.Sum, 3},
		{tensor.Average, 1, 1, 4, tensor.Sum, 0.25},
		{tensor.Average, 2, 0.5, 5, tensor.Sum, 0.1},
		{tensor.Max, 1, 1, 3, tensor.Max, 1},
	}
	for _, tc := range tests {
		r := &plan.Response{ReduceOp: tc.op, Prescale: tc.pre, Postscale: tc.post}
		op, pre, post := Scales(r, tc.size)
		if op != tc.wantOp || pre != tc.pre || post != tc.wantPost {
			t.Errorf("Scales(%v pre %v post %v, %d) = %v %v %v, want %v %v %v", tc.op, tc.pre, tc.post, tc.size, op, pre, post, tc.wantOp, tc.pre, tc.wantPost)
		}
	}
}

// TestFusedOffsets checks the fusion buffer's layout: the tensors one after
// the other.
func TestFusedOffsets(t *testing.T) {
	r := &plan.Response{DType: tensor.Float16, Tensors: []plan.Tensor{{Shape: tensor.Shape{3}}, {Shape: tensor.Shape{}}, {Shape: tensor.Shape{2, 0}}, {Shape: tensor.Shape{2, 5}}}}
	if got, want := FusedOffsets(r), []int{0, 6, 8, 8, 28}; !slices.Equal(got, want) {
		t.Errorf("FusedOffsets = %v, want %v", got, want)
	}
}

// TestA2APlan runs an alltoall across nodes on A2APlan's layout, every
// node's plan for its own part, and checks each rank's output against the
// alltoall computed the obvious way: rank d's output is every rank s's
// rows [sum(splits[s][:d]), +splits[s][d]) in source-rank order. The
// exchange is simulated as Alltoallv defines it: node k receives from node
// m what m's send buffer holds at its running offset for k. Over many
// layouts of nodes, ranks and splits (zeros among them).
func TestA2APlan(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	for k := range 500 {
		slots := randSlots(rng)
		size := 0
		for _, n := range slots {
			size += n
		}
		row := 1 + rng.IntN(3)
		dt := []tensor.DType{tensor.Uint8, tensor.Float32, tensor.Float64}[k%3]
		rowBytes := row * dt.Size()
		splits := make([][]int32, size)
		inputs := make([][]byte, size)
		for s := range size {
			splits[s] = make([]int32, size)
			n := 0
			for d := range size {
				if rng.IntN(4) > 0 {
					splits[s][d] = int32(rng.IntN(4))
				}
				n += int(splits[s][d])
			}
			inputs[s] = make([]byte, n*rowBytes)
			for i := range inputs[s] {
				inputs[s][i] = byte(s*37 + i*11 + k)
			}
		}
		// The naive outputs.
		want := make([][]byte, size)
		for d := range size {
			for s := range size {
				start := 0
				for dd := range d {
					start += int(splits[s][dd]) * rowBytes
				}
				want[d] = append(want[d], inputs[s][start:start+int(splits[s][d])*rowBytes]...)
			}
		}
		r := plan.Response{Op: tensor.Alltoall, DType: dt, Tensors: []plan.Tensor{{Shape: tensor.Shape{0, int64(row)}, Splits: splits}}}
		plans := make([]*A2APlan, len(slots))
		sent := make([][]byte, len(slots))
		for node := range slots {
			a := NewA2APlan(workOn(slots, node, r), 0)
			plans[node] = a
			a.Sends(func(s, d int) {
				sent[node] = append(sent[node], inputs[s][a.Start(s, d):a.Start(s, d)+a.Piece(s, d)]...)
			})
			if n := sumInts(a.SendCounts); n != len(sent[node]) {
				t.Fatalf("slots %v node %d: SendCounts %v add up to %d, the pieces sent to %d", slots, node, a.SendCounts, n, len(sent[node]))
			}
		}
		for node, a := range plans {
			// What node receives: from each node m, m's block for it.
			var got []byte
			for m, am := range plans {
				if a.RecvCounts[m] != am.SendCounts[node] {
					t.Fatalf("slots %v: node %d expects %d bytes from node %d, which sends it %d", slots, node, a.RecvCounts[m], m, am.SendCounts[node])
				}
				if a.BlockStart[m] != len(got) {
					t.Fatalf("slots %v node %d: BlockStart[%d] = %d, want %d", slots, node, m, a.BlockStart[m], len(got))
				}
				off := sumInts(am.SendCounts[:node])
				got = append(got, sent[m][off:off+am.SendCounts[node]]...)
			}
			if a.Total != len(got) {
				t.Fatalf("slots %v node %d: Total %d, received %d", slots, node, a.Total, len(got))
			}
			lo, hi := job.NewMembership(slots, node).NodeRanks(node)
			for d := lo; d < hi; d++ {
				if a.Rows(d)*a.RowBytes != len(want[d]) {
					t.Fatalf("slots %v rank %d: Rows %d, want %d bytes", slots, d, a.Rows(d), len(want[d]))
				}
				out := make([]byte, a.Rows(d)*a.RowBytes)
				a.Fill(d, out, got)
				if !slices.Equal(out, want[d]) {
					t.Fatalf("slots %v splits %v rank %d: output %v, want %v", slots, splits, d, out, want[d])
				}
				wantRecv := make([]int32, size)
				for s := range size {
					wantRecv[s] = splits[s][d]
				}
				if !slices.Equal(a.Received(d), wantRecv) {
					t.Fatalf("rank %d: Received %v, want %v", d, a.Received(d), wantRecv)
				}
				if sh := a.Shape(d, tensor.Shape{9, int64(row)}); !slices.Equal(sh, tensor.Shape{int64(a.Rows(d)), int64(row)}) {
					t.Fatalf("rank %d: Shape %v", d, sh)
				}
			}
		}
	}
}
