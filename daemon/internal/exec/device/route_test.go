package device

import (
	"testing"

	"github.com/hvdd/hvdd/daemon/plan"
	"github.com/hvdd/hvdd/tensor"
)

// TestDecide checks the route of responses on topologies, with the label
// each logs (tests across the repository look for these names) and its
// timeline phase.
func TestDecide(t *testing.T) {
	f32, i16 := tensor.Float32, tensor.Int16
	oneGPU1 := topology{native: true, gpus: 1, noJoined: true, oneRankPerGPU: true} // one rank on one GPU
	shared := topology{native: true, gpus: 1, noJoined: true}                       // ranks sharing one GPU
	twoGPUs := topology{native: true, gpus: 2, nccl: true, noJoined: true}          // ranks on two GPUs, some sharing
	perGPU := topology{native: true, gpus: 2, nccl: true, noJoined: true, oneRankPerGPU: true}
	noNCCL := topology{native: true, gpus: 2, noJoined: true, oneRankPerGPU: true} // two GPUs, no NCCL
	across1 := topology{native: true, gpus: 1, crossNodes: true}                   // across nodes, one GPU here
	across2 := topology{native: true, gpus: 2, nccl: true, crossNodes: true}       // across nodes, two GPUs here
	across2NoNCCL := topology{native: true, gpus: 2, crossNodes: true}
	joined := topology{native: true, gpus: 1}      // a rank of the set joined
	notNative := topology{gpus: 0, noJoined: true} // host-only, empty tensors, mixed ops
	resp := func(op tensor.OpType, edit ...func(*plan.Response)) *plan.Response {
		r := &plan.Response{Op: op, ReduceOp: tensor.Sum, DType: f32, Prescale: 1, Postscale: 1}
		for _, e := range edit {
			e(r)
		}
		return r
	}
	pre := func(r *plan.Response) { r.Prescale = 2 }
	adasum := func(r *plan.Response) { r.ReduceOp = tensor.Adasum }
	int16s := func(r *plan.Response) { r.DType = i16 }
	ncclPlan := func(r *plan.Response) { r.NCCL = true }
	joinedRank := func(r *plan.Response) { r.JoinedRanks = []int{3} }

	tests := []struct {
		name  string
		r     *plan.Response
		t     topology
		want  route
		label string
	}{
		// Allreduce.
		{"allreduce one GPU", resp(tensor.Allreduce), shared, route{oneGPU, tensor.Allreduce}, "device allreduce"},
		{"allreduce one rank one GPU", resp(tensor.Allreduce), oneGPU1, route{oneGPU, tensor.Allreduce}, "device allreduce"},
		{"allreduce a rank per GPU", resp(tensor.Allreduce), perGPU, route{inPlace, tensor.Allreduce}, "device allreduce in place over GPUs"},
		{"allreduce a rank per GPU prescaled", resp(tensor.Allreduce, pre), perGPU, route{overGPUs, tensor.Allreduce}, "device allreduce"},
		{"allreduce ranks sharing two GPUs", resp(tensor.Allreduce), twoGPUs, route{overGPUs, tensor.Allreduce}, "device allreduce"},
		{"allreduce two GPUs without NCCL", resp(tensor.Allreduce), noNCCL, route{staged, tensor.Allreduce}, "staged allreduce"},
		{"allreduce int16 on two GPUs", resp(tensor.Allreduce, int16s), perGPU, route{staged, tensor.Allreduce}, "staged allreduce"},
		{"allreduce int16 on one GPU", resp(tensor.Allreduce, int16s), shared, route{oneGPU, tensor.Allreduce}, "device allreduce"},
		{"adasum", resp(tensor.Allreduce, adasum), shared, route{staged, tensor.Allreduce}, "staged allreduce"},
		{"allreduce across nodes", resp(tensor.Allreduce), across1, route{hierarchical, tensor.Allreduce}, "hierarchical allreduce"},
		{"allreduce across nodes, two GPUs", resp(tensor.Allreduce), across2, route{hierarchical, tensor.Allreduce}, "hierarchical allreduce"},
		{"allreduce across nodes, two GPUs, no NCCL", resp(tensor.Allreduce), across2NoNCCL, route{staged, tensor.Allreduce}, "staged allreduce"},
		{"allreduce with a joined rank", resp(tensor.Allreduce, joinedRank), joined, route{oneGPU, tensor.Allreduce}, "device allreduce"},
		{"allreduce not native", resp(tensor.Allreduce), notNative, route{staged, tensor.Allreduce}, "staged allreduce"},
		{"allreduce on NCCL across nodes", resp(tensor.Allreduce, ncclPlan), across2, route{ncclAcross, tensor.Allreduce}, "nccl allreduce"},
		{"the plan's NCCL on a node that cannot", resp(tensor.Allreduce, ncclPlan), notNative, route{ncclAcross, tensor.Allreduce}, "nccl allreduce"},
		// Broadcast.
		{"broadcast one GPU", resp(tensor.Broadcast), shared, route{oneGPU, tensor.Broadcast}, "device broadcast"},
		{"broadcast two GPUs", resp(tensor.Broadcast), twoGPUs, route{overGPUs, tensor.Broadcast}, "device broadcast"},
		{"broadcast two GPUs without NCCL", resp(tensor.Broadcast), noNCCL, route{staged, tensor.Broadcast}, "staged broadcast"},
		{"broadcast across nodes without NCCL", resp(tensor.Broadcast), across2NoNCCL, route{hierarchical, tensor.Broadcast}, "hierarchical broadcast"},
		{"broadcast on NCCL across nodes", resp(tensor.Broadcast, ncclPlan), across1, route{ncclAcross, tensor.Broadcast}, "nccl broadcast"},
		{"broadcast not native", resp(tensor.Broadcast), notNative, route{staged, tensor.Broadcast}, "staged broadcast"},
	}
	// Allgather, alltoall, reducescatter.
	for _, op := range []tensor.OpType{tensor.Allgather, tensor.Alltoall, tensor.Reducescatter} {
		name := map[tensor.OpType]string{tensor.Allgather: "allgather", tensor.Alltoall: "alltoall", tensor.Reducescatter: "reducescatter"}[op]
		rs := op == tensor.Reducescatter
		pick := func(ifRS, other route) route {
			if rs {
				return ifRS
			}
			return other
		}
		label := func(ifRS, other string) string {
			if rs {
				return ifRS
			}
			return other
		}
		tests = append(tests, []struct {
			name  string
			r     *plan.Response
			t     topology
			want  route
			label string
		}{
			{name + " one GPU", resp(op), shared, route{oneGPU, op}, "device " + name},
			{name + " one GPU, a rank without its op", resp(op), joined, route{staged, op}, "staged " + name},
			{name + " two GPUs", resp(op), twoGPUs, route{overGPUs, op}, "device " + name + " over GPUs"},
			{name + " two GPUs without NCCL", resp(op), noNCCL, route{staged, op}, "staged " + name},
			{name + " int16 on two GPUs", resp(op, int16s), twoGPUs, pick(route{staged, op}, route{overGPUs, op}), label("staged "+name, "device "+name+" over GPUs")},
			{name + " int16 on one GPU", resp(op, int16s), shared, route{oneGPU, op}, "device " + name},
			{name + " across nodes", resp(op), across1, route{hierarchical, op}, "hierarchical " + name},
			{name + " across nodes, two GPUs", resp(op), across2, route{hierarchical, op}, "hierarchical " + name},
			{name + " across nodes, two GPUs, no NCCL", resp(op), across2NoNCCL, pick(route{staged, op}, route{hierarchical, op}), label("staged "+name, "hierarchical "+name)},
			{name + " int16 across nodes, two GPUs", resp(op, int16s), across2, pick(route{staged, op}, route{hierarchical, op}), label("staged "+name, "hierarchical "+name)},
			{name + " int16 across nodes, one GPU", resp(op, int16s), across1, route{hierarchical, op}, "hierarchical " + name},
			{name + " across nodes with a joined rank", resp(op, joinedRank), across1, route{staged, op}, "staged " + name},
			{name + " on NCCL across nodes", resp(op, ncclPlan), across2, route{ncclAcross, op}, "nccl " + name},
			{name + " not native", resp(op), notNative, route{staged, op}, "staged " + name},
		}...)
	}
	// What has no native route.
	tests = append(tests, []struct {
		name  string
		r     *plan.Response
		t     topology
		want  route
		label string
	}{
		{"barrier", resp(tensor.Barrier), shared, route{staged, tensor.Barrier}, "staged barrier"},
		{"join", resp(tensor.Join), shared, route{staged, tensor.Join}, "staged join"},
	}...)
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := decide(tc.r, tc.t)
			if got != tc.want {
				t.Errorf("decide = %+v, want %+v", got, tc.want)
			}
			if l := got.label(); l != tc.label {
				t.Errorf("label %q, want %q", l, tc.label)
			}
			wantPhase := "GPU_SHM_" + tc.r.Op.String()
			if tc.want.way == staged {
				wantPhase = ""
			}
			if p := got.phase(); p != wantPhase {
				t.Errorf("phase %q, want %q", p, wantPhase)
			}
		})
	}
}
