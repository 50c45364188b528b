package job

import (
	"fmt"

	"github.com/hvdd/hvdd/daemon/plan"
	"github.com/hvdd/hvdd/daemon/timeline"
	"github.com/hvdd/hvdd/tensor"
)

// The timeline's names that the loop and both executor paths share: a
// tensor's row and the top-level phase of a response on it. The phases
// nested under it (SHM_<OP>, the engine's, the device path's) are named by
// the executor that runs them.

// Row names a tensor's timeline row: its name, and its process set's id
// when not the global set.
func Row(set int32, name string) string {
	if set == 0 {
		return name
	}
	return fmt.Sprintf("%s (process set %d)", name, set)
}

// TopName is the name of r's top-level phase: its collective, as Horovod
// names the row's phase after negotiation.
func TopName(r *plan.Response) string {
	if r.Op == tensor.Allreduce && r.ReduceOp == tensor.Adasum {
		return "ADASUM"
	}
	return r.Op.String()
}

// TraceAll writes ph (named name, for Begin) to w on every tensor row of r.
func TraceAll(w EventSink, r *plan.Response, ph timeline.Phase, name string) {
	for _, tn := range r.Tensors {
		w.Event(Row(r.ProcessSet, tn.Name), ph, name)
	}
}
