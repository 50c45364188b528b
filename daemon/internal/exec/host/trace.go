package host

import (
	"strings"

	"github.com/hvdd/hvdd/backends"
	"github.com/hvdd/hvdd/daemon/internal/job"
	"github.com/hvdd/hvdd/daemon/plan"
	"github.com/hvdd/hvdd/daemon/timeline"
)

// Activity is the executor's phase name for r on one node, and for the
// local step (reduction or copy through shared memory) of r across nodes.
func Activity(r *plan.Response) string {
	return "SHM_" + r.Op.String()
}

// crossNode is the phase name of r's cross-node transfer on engine b:
// Horovod's <ENGINE>_<OP> by the engine's name (MPI_ALLREDUCE, or
// TCP_ALLREDUCE for hvdd's ring over TCP), or CROSS_NODE_<OP> for an
// engine without a name.
func crossNode(b backends.Backend, r *plan.Response) string {
	engine := strings.ToUpper(b.Name())
	if engine == "" {
		engine = "CROSS_NODE"
	}
	return engine + "_" + r.Op.String()
}

// phases writes the nested phases of a response's execution across nodes
// on the rows of its tensors (all of them, or one: at), keeping count of
// those open so that a failure ends them all (endAll). With no writer it
// does nothing.
type phases struct {
	w    job.EventSink
	r    *plan.Response
	one  bool // only the row of r.Tensors[i]
	i    int
	open int
}

func (p *phases) event(ph timeline.Phase, name string) {
	if p.one {
		p.w.Event(job.Row(p.r.ProcessSet, p.r.Tensors[p.i].Name), ph, name)
		return
	}
	job.TraceAll(p.w, p.r, ph, name)
}

// at makes the next phases those of tensor i's row alone (collectives run
// tensor by tensor), ending the phases open on the row before.
func (p *phases) at(i int) {
	p.endAll()
	p.one, p.i = true, i
}

func (p *phases) begin(name string) {
	if p.w == nil {
		return
	}
	p.event(timeline.Begin, name)
	p.open++
}

// End ends the innermost open phase.
func (p *phases) End() {
	if p.w == nil || p.open == 0 {
		return
	}
	p.event(timeline.End, "")
	p.open--
}

func (p *phases) endAll() {
	for p.open > 0 {
		p.End()
	}
}
