package device

import (
	"testing"

	"github.com/hvdd/hvdd/daemon/internal/job"
	"github.com/hvdd/hvdd/tensor"
)

// TestOrderedOK: only one GPU's allreduce and broadcast (kernels and
// copies on the daemon's stream, nothing a remote failure could stall)
// complete ordered on the GPU, and only with the mode on and every client
// waiting on the event.
func TestOrderedOK(t *testing.T) {
	ops := []tensor.OpType{tensor.Allreduce, tensor.Broadcast, tensor.Allgather, tensor.Alltoall, tensor.Reducescatter}
	ways := []way{staged, oneGPU, inPlace, overGPUs, hierarchical, ncclAcross}
	for _, on := range []bool{false, true} {
		for _, waits := range []bool{false, true} {
			for _, w := range ways {
				for _, op := range ops {
					want := on && waits && w == oneGPU && (op == tensor.Allreduce || op == tensor.Broadcast)
					if got := orderedOK(on, route{w, op}, waits); got != want {
						t.Errorf("orderedOK(on %t, %s, clients wait %t) = %t, want %t", on, route{w, op}.label(), waits, got, want)
					}
				}
			}
		}
	}
}

// TestClientsWait: every local op must say its client waits; rows of other
// nodes' ranks (nil) do not count, and a response of no local op is not
// ordered.
func TestClientsWait(t *testing.T) {
	waits := &job.Op{Dev: &devOp{waits: true}}
	not := &job.Op{Dev: &devOp{}}
	host := &job.Op{}
	for _, tc := range []struct {
		name string
		ops  [][]*job.Op
		want bool
	}{
		{"all wait", [][]*job.Op{{waits, waits}, {waits, waits}}, true},
		{"other nodes' rows nil", [][]*job.Op{{nil, waits}, {nil, waits}}, true},
		{"one does not", [][]*job.Op{{waits, waits}, {waits, not}}, false},
		{"a host tensor", [][]*job.Op{{waits, host}}, false},
		{"no local op", [][]*job.Op{{nil, nil}}, false},
		{"none", nil, false},
	} {
		if got := clientsWait(&job.Work{Ops: tc.ops}); got != tc.want {
			t.Errorf("%s: clientsWait = %t, want %t", tc.name, got, tc.want)
		}
	}
}
