package plan

import (
	"fmt"
	"slices"
	"testing"

	"github.com/hvdd/hvdd/tensor"
)

// TestNCCLAcross: the coordinator's one decision per response between one
// NCCL communicator across the nodes and each node's own path.
func TestNCCLAcross(t *testing.T) {
	tests := []struct {
		name  string
		r     Response
		every bool
		want  bool
	}{
		{"allreduce sum", Response{Op: tensor.Allreduce, ReduceOp: tensor.Sum, DType: tensor.Float32}, true, true},
		{"allreduce average", Response{Op: tensor.Allreduce, ReduceOp: tensor.Average, DType: tensor.Float16}, true, true},
		{"a node cannot", Response{Op: tensor.Allreduce, ReduceOp: tensor.Sum, DType: tensor.Float32}, false, false},
		{"allreduce min", Response{Op: tensor.Allreduce, ReduceOp: tensor.Min, DType: tensor.Float32}, true, false},
		{"adasum", Response{Op: tensor.Allreduce, ReduceOp: tensor.Adasum, DType: tensor.Float32}, true, false},
		{"int16, which NCCL lacks", Response{Op: tensor.Allreduce, ReduceOp: tensor.Sum, DType: tensor.Int16}, true, false},
		{"bool", Response{Op: tensor.Allreduce, ReduceOp: tensor.Sum, DType: tensor.Bool}, true, false},
		{"a joined rank", Response{Op: tensor.Allreduce, ReduceOp: tensor.Sum, DType: tensor.Float32, JoinedRanks: []int{3}}, true, false},
		{"an error", Response{Op: tensor.Allreduce, ReduceOp: tensor.Sum, DType: tensor.Float32, Err: &Error{Msg: "mismatch"}}, true, false},
		{"reducescatter sum", Response{Op: tensor.Reducescatter, ReduceOp: tensor.Sum, DType: tensor.Int32}, true, true},
		{"reducescatter max", Response{Op: tensor.Reducescatter, ReduceOp: tensor.Max, DType: tensor.Int32}, true, false},
		{"broadcast of int16", Response{Op: tensor.Broadcast, DType: tensor.Int16}, true, true},
		{"allgather", Response{Op: tensor.Allgather, DType: tensor.Uint8}, true, true},
		{"alltoall", Response{Op: tensor.Alltoall, DType: tensor.Float64}, true, true},
		{"barrier", Response{Op: tensor.Barrier}, true, false},
		{"join", Response{Op: tensor.Join}, true, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := NCCLAcross(&tc.r, tc.every); got != tc.want {
				t.Errorf("NCCLAcross(%s, every %v) = %v, want %v", tc.name, tc.every, got, tc.want)
			}
		})
	}
}

// TestTableDecidesNCCL: a response runs on NCCL across nodes only when every
// rank's request says its node can; fusion keeps NCCL responses apart from
// the others.
func TestTableDecidesNCCL(t *testing.T) {
	tbl := mustNew(t, Config{Size: 2, FusionThreshold: 1 << 20})
	// n1 and n2: both ranks' nodes can; h1: rank 1's cannot.
	for _, n := range []string{"n1", "h1", "n2"} {
		for rank := range 2 {
			r := ar(rank, n, 100)
			r.Device = true
			r.NCCL = n[0] == 'n' || rank == 0
			if err := tbl.Submit(r, 0); err != nil {
				t.Fatal(err)
			}
		}
	}
	var got []string
	for _, r := range tbl.Ready() {
		var names []string
		for _, tn := range r.Tensors {
			names = append(names, tn.Name)
		}
		got = append(got, fmt.Sprintf("%v%v", r.NCCL, names))
	}
	if want := []string{"true[n1 n2]", "false[h1]"}; !slices.Equal(got, want) && !slices.Equal(got, []string{"false[h1]", "true[n1 n2]"}) {
		t.Fatalf("responses %v, want %v (in either order)", got, want)
	}
}
