package plan

import (
	"slices"
	"strings"
	"testing"

	"github.com/hvdd/hvdd/tensor"
)

// TestChecksPerOp runs each collective's checks one by one, and pairs of
// them to pin their order: three ranks (or size) submit request "x", edited
// per rank, and the one response must fail on attr with Horovod's text (or
// succeed when attr is empty).
func TestChecksPerOp(t *testing.T) {
	// base returns the agreeing request of op for rank.
	base := func(op tensor.OpType, rank int) Request {
		r := ar(rank, "x", 6, 2)
		r.Op = op
		return r
	}
	tests := []struct {
		name   string
		op     tensor.OpType
		edit   func(rank int, r *Request)
		join   []int // ranks that join instead of submitting
		size   int   // ranks in the job; 0 means 3
		attr   string
		ranks  []int
		prefix string
	}{
		// Common checks, before the per-op ones.
		{
			name: "barrier ignores dtype",
			op:   tensor.Barrier,
			edit: func(rank int, r *Request) {
				if rank == 1 {
					r.DType = tensor.Int64
				}
			},
		},
		{
			name: "op before dtype",
			op:   tensor.Allreduce,
			edit: func(rank int, r *Request) {
				if rank == 1 {
					r.Op, r.DType = tensor.Broadcast, tensor.Int32
				}
			},
			attr:   "op",
			ranks:  []int{1},
			prefix: "Mismatched operations: One rank did an ALLREDUCE, but another rank did an BROADCAST.",
		},
		{
			name: "dtype before group",
			op:   tensor.Allgather,
			edit: func(rank int, r *Request) {
				if rank == 2 {
					r.DType, r.Group, r.GroupSize = tensor.Int32, "g", 1
				}
			},
			attr:   "dtype",
			ranks:  []int{2},
			prefix: "Mismatched data types: One rank had type float32, but another rank had type int32.",
		},
		{
			name: "group before the op's checks",
			op:   tensor.Broadcast,
			edit: func(rank int, r *Request) {
				if rank == 0 {
					r.Group, r.GroupSize, r.Root = "g", 1, 1
				}
			},
			attr:   "group",
			ranks:  []int{1, 2},
			prefix: `Mismatched groups: One rank placed the tensor in group "g" of 1, but another rank placed it in group none.`,
		},

		// Allreduce.
		{
			name: "allreduce joined ranks are fine",
			op:   tensor.Allreduce,
			join: []int{2},
		},
		{
			name: "allreduce reduce op before shape",
			op:   tensor.Allreduce,
			edit: func(rank int, r *Request) {
				if rank == 1 {
					r.ReduceOp, r.Shape = tensor.Min, tensor.Shape{7}
				}
			},
			attr:   "reduce_op",
			ranks:  []int{1},
			prefix: "Mismatched reduction operation: One rank sent reduction op 1, but another rank sent reduction op 3.",
		},
		{
			name: "allreduce adasum on four ranks",
			op:   tensor.Allreduce,
			size: 4,
			edit: func(rank int, r *Request) { r.ReduceOp = tensor.Adasum },
		},
		{
			name: "allreduce adasum with a joined rank and scales",
			op:   tensor.Allreduce,
			size: 4,
			join: []int{3},
			edit: func(rank int, r *Request) {
				r.ReduceOp, r.DType, r.Prescale, r.Postscale = tensor.Adasum, tensor.Float16, 0.5, 2
			},
		},
		{
			name: "allreduce adasum float64 on two ranks",
			op:   tensor.Allreduce,
			size: 2,
			edit: func(rank int, r *Request) { r.ReduceOp, r.DType = tensor.Adasum, tensor.Float64 },
		},
		{
			name: "allreduce reduce op before adasum",
			op:   tensor.Allreduce,
			edit: func(rank int, r *Request) {
				if rank == 0 {
					r.ReduceOp = tensor.Adasum
				}
			},
			attr:   "reduce_op",
			ranks:  []int{1, 2},
			prefix: "Mismatched reduction operation: One rank sent reduction op 2, but another rank sent reduction op 1.",
		},
		{
			name: "allreduce adasum ranks before dtype and shape",
			op:   tensor.Allreduce,
			edit: func(rank int, r *Request) {
				r.ReduceOp, r.DType = tensor.Adasum, tensor.Int32
				if rank == 1 {
					r.Shape = tensor.Shape{7}
				}
			},
			attr:   "reduce_op",
			ranks:  []int{0, 1, 2},
			prefix: "Running Adasum with non-power-of-two ranks is not supported yet.",
		},
		{
			name: "allreduce adasum dtype before shape",
			op:   tensor.Allreduce,
			size: 4,
			edit: func(rank int, r *Request) {
				r.ReduceOp, r.DType = tensor.Adasum, tensor.BFloat16
				if rank == 1 {
					r.Shape = tensor.Shape{7}
				}
			},
			attr:   "dtype",
			ranks:  []int{0, 1, 2, 3},
			prefix: "Unsupported data type: Adasum reduces float16, float32 and float64 tensors only.",
		},
		{
			name: "allreduce adasum shape",
			op:   tensor.Allreduce,
			size: 4,
			edit: func(rank int, r *Request) {
				r.ReduceOp = tensor.Adasum
				if rank == 3 {
					r.Shape = tensor.Shape{7}
				}
			},
			attr:   "shape",
			ranks:  []int{3},
			prefix: "Mismatched ALLREDUCE tensor shapes: One rank sent a tensor of shape [6, 2], but another rank sent a tensor of shape [7].",
		},
		{
			name: "allreduce shape before scale",
			op:   tensor.Allreduce,
			edit: func(rank int, r *Request) {
				if rank == 2 {
					r.Shape, r.Prescale = tensor.Shape{6, 3}, 2
				}
			},
			attr:   "shape",
			ranks:  []int{2},
			prefix: "Mismatched ALLREDUCE tensor shapes: One rank sent a tensor of shape [6, 2], but another rank sent a tensor of shape [6, 3].",
		},

		// Reducescatter.
		{
			name:   "reducescatter joined ranks",
			op:     tensor.Reducescatter,
			join:   []int{1},
			attr:   "join",
			ranks:  []int{1},
			prefix: "Reducescatter is not supported with Join at this time.",
		},
		{
			name: "reducescatter reduce op",
			op:   tensor.Reducescatter,
			edit: func(rank int, r *Request) {
				if rank == 0 {
					r.ReduceOp = tensor.Average
				}
			},
			attr:   "reduce_op",
			ranks:  []int{1, 2},
			prefix: "Mismatched reduction operation: One rank sent reduction op 0, but another rank sent reduction op 1.",
		},
		{
			name: "reducescatter average or sum only, before shape",
			op:   tensor.Reducescatter,
			edit: func(rank int, r *Request) {
				r.ReduceOp = tensor.Product
				if rank == 1 {
					r.Shape = tensor.Shape{7}
				}
			},
			attr:   "reduce_op",
			ranks:  []int{0, 1, 2},
			prefix: "Reducescatter currently only supports AVERAGE and SUM.",
		},
		{
			name: "reducescatter shape before scale",
			op:   tensor.Reducescatter,
			edit: func(rank int, r *Request) {
				if rank == 1 {
					r.Shape, r.Postscale = tensor.Shape{3}, 2
				}
			},
			attr:   "shape",
			ranks:  []int{1},
			prefix: "Mismatched REDUCESCATTER tensor shapes: One rank sent a tensor of shape [6, 2], but another rank sent a tensor of shape [3].",
		},
		{
			name: "reducescatter scalar before scale",
			op:   tensor.Reducescatter,
			edit: func(rank int, r *Request) {
				r.Shape = nil
				if rank == 1 {
					r.Postscale = 2
				}
			},
			attr:   "shape",
			ranks:  []int{0},
			prefix: "Process-set rank zero tried to REDUCESCATTER a rank-zero tensor.",
		},
		{
			name: "reducescatter scale",
			op:   tensor.Reducescatter,
			edit: func(rank int, r *Request) {
				if rank == 2 {
					r.Prescale = 0.5
				}
			},
			attr:   "scale",
			ranks:  []int{2},
			prefix: "Mismatched prescale and/or postscale factors: One rank sent factors (1, 1), but another rank sent factors (0.5, 1).",
		},

		// Allgather and alltoall.
		{
			name:   "allgather joined ranks before scalar",
			op:     tensor.Allgather,
			edit:   func(rank int, r *Request) { r.Shape = nil },
			join:   []int{2},
			attr:   "join",
			ranks:  []int{2},
			prefix: "Allgather is not supported with Join at this time. Specify sparse_to_dense=True if using DistributedOptimizer",
		},
		{
			name: "allgather scalar on the lowest rank only",
			op:   tensor.Allgather,
			edit: func(rank int, r *Request) {
				if rank == 0 {
					r.Shape = nil
				}
			},
			attr:   "shape",
			ranks:  []int{0},
			prefix: "Process-set rank zero tried to ALLGATHER a rank-zero tensor.",
		},
		{
			name: "allgather scalar elsewhere is a dimension mismatch",
			op:   tensor.Allgather,
			edit: func(rank int, r *Request) {
				if rank == 1 {
					r.Shape = nil
				}
			},
			attr:   "shape",
			ranks:  []int{1},
			prefix: "Mismatched ALLGATHER tensor shapes: One rank sent a tensor of rank 2, but another rank sent a tensor of rank 0.",
		},
		{
			name: "allgather first dimension may differ",
			op:   tensor.Allgather,
			edit: func(rank int, r *Request) { r.Shape = tensor.Shape{int64(rank + 1), 2} },
		},
		{
			name: "alltoall joined ranks",
			op:   tensor.Alltoall,
			join: []int{0},
			attr: "join",
			// The joined rank is the lowest: rank 1's request is the first.
			ranks:  []int{0},
			prefix: "Alltoall is not supported with Join at this time.",
		},
		{
			name: "alltoall shape before splits",
			op:   tensor.Alltoall,
			edit: func(rank int, r *Request) {
				if rank == 1 {
					r.Shape = tensor.Shape{4, 3}
				}
			},
			attr:   "shape",
			ranks:  []int{1},
			prefix: "Mismatched ALLTOALL tensor shapes: One rank sent a tensor with dimension 1 equal to 2, but another rank sent a tensor with dimension 1 equal to 3.",
		},
		{
			name: "alltoall splits",
			op:   tensor.Alltoall,
			edit: func(rank int, r *Request) {
				if rank == 2 {
					r.Splits = []int32{1, 1}
				}
			},
			attr:   "splits",
			ranks:  []int{2},
			prefix: "Number of entries in splits does not equal number of workers.",
		},

		// Broadcast.
		{
			name: "broadcast shape before joined ranks",
			op:   tensor.Broadcast,
			edit: func(rank int, r *Request) {
				if rank == 1 {
					r.Shape = tensor.Shape{2, 6}
				}
			},
			join:   []int{2},
			attr:   "shape",
			ranks:  []int{1},
			prefix: "Mismatched BROADCAST tensor shapes: One rank sent a tensor of shape [6, 2], but another rank sent a tensor of shape [2, 6].",
		},
		{
			name: "broadcast joined ranks before root",
			op:   tensor.Broadcast,
			edit: func(rank int, r *Request) {
				if rank == 1 {
					r.Root = 1
				}
			},
			join:   []int{2},
			attr:   "join",
			ranks:  []int{2},
			prefix: "Broadcast is not supported with Join at this time.",
		},
		{
			name: "broadcast root agreement before membership",
			op:   tensor.Broadcast,
			edit: func(rank int, r *Request) {
				r.Root = 3
				if rank == 2 {
					r.Root = 1
				}
			},
			attr:   "root",
			ranks:  []int{2},
			prefix: "Mismatched BROADCAST root ranks: One rank specified root rank 3, but another rank specified root rank 1.",
		},
		{
			name:   "broadcast root outside the set",
			op:     tensor.Broadcast,
			edit:   func(rank int, r *Request) { r.Root = -1 },
			attr:   "root",
			ranks:  []int{0, 1, 2},
			prefix: "broadcast received invalid root rank -1 for provided process set",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			size := tt.size
			if size == 0 {
				size = 3
			}
			tbl := mustNew(t, Config{Size: size, FusionThreshold: 1 << 20})
			for rank := range size {
				if slices.Contains(tt.join, rank) {
					if err := tbl.Submit(Request{Rank: rank, Op: tensor.Join}, 0); err != nil {
						t.Fatal(err)
					}
					continue
				}
				r := base(tt.op, rank)
				if tt.edit != nil {
					tt.edit(rank, &r)
				}
				if err := tbl.Submit(r, 0); err != nil {
					t.Fatal(err)
				}
			}
			var rs []Response
			for _, r := range tbl.Ready() {
				if r.Op != tensor.Join {
					rs = append(rs, r)
				}
			}
			if len(rs) != 1 {
				t.Fatalf("Ready = %v, want one response for x", rs)
			}
			e := rs[0].Err
			if tt.attr == "" {
				if e != nil {
					t.Fatalf("Err = %v, want none", e)
				}
				return
			}
			if e == nil {
				t.Fatalf("no error, want attr %q", tt.attr)
			}
			if e.Attr != tt.attr || e.Tensor != "x" || !slices.Equal(e.Ranks, tt.ranks) {
				t.Fatalf("Err = attr %q tensor %q ranks %v (%s), want %q %q %v", e.Attr, e.Tensor, e.Ranks, e.Msg, tt.attr, "x", tt.ranks)
			}
			if !strings.HasPrefix(e.Msg, tt.prefix+` (tensor "x": `) {
				t.Fatalf("Msg = %q, want prefix %q", e.Msg, tt.prefix)
			}
		})
	}
}
