package nodes

import (
	"testing"

	"github.com/hvdd/hvdd/daemon/plan"
	"github.com/hvdd/hvdd/tensor"
)

// TestNCCLReady: a node's word, forwarded with its ranks' requests of one
// tensor, on whether they can join one NCCL communicator across nodes.
func TestNCCLReady(t *testing.T) {
	dev := func(gpu int, shape ...int64) *plan.Request {
		return &plan.Request{Device: true, GPU: gpu, Shape: tensor.Shape(shape)}
	}
	host := &plan.Request{Shape: tensor.Shape{4}}
	tests := []struct {
		name           string
		capable, spans bool
		reqs           []*plan.Request
		want           bool
	}{
		{"one rank on GPU 0", true, true, []*plan.Request{dev(0, 4)}, true},
		{"ranks on GPUs 0 and 1", true, true, []*plan.Request{dev(1, 4), dev(0, 4)}, true},
		{"a scalar", true, true, []*plan.Request{dev(0)}, true},
		{"none on GPU 0, where the communicator lives", true, true, []*plan.Request{dev(1, 4), dev(2, 4)}, false},
		{"a host tensor among them", true, true, []*plan.Request{dev(0, 4), host}, false},
		{"an empty tensor", true, true, []*plan.Request{dev(0, 4), dev(0, 0)}, false},
		{"a node without NCCL, or not configured for it", false, true, []*plan.Request{dev(0, 4)}, false},
		{"a set that leaves out a node", true, false, []*plan.Request{dev(0, 4)}, false},
		{"no requests", true, true, nil, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := ncclReady(tc.capable, tc.spans, tc.reqs); got != tc.want {
				t.Errorf("ncclReady = %v, want %v", got, tc.want)
			}
		})
	}
}
