package loop

import (
	"fmt"

	"github.com/hvdd/hvdd/daemon/internal/job"
	"github.com/hvdd/hvdd/daemon/plan"
	"github.com/hvdd/hvdd/ipc/ipcpb"
)

// The loop's two seams. A daemon forms jobs through a formation: alone
// (oneNode, below) or with the daemons of other nodes (multiNode,
// multinode.go). A formed job negotiates its tensors through a coordination:
// over a plan.Table on one node (localCoord, below), or across nodes as
// coordinator or follower (multiCoord, multinode_job.go). The loop calls
// both from its goroutine only, and they reach the loop only through its
// hooks (job.LoopHooks; across nodes job.LoopHooksAcross). Whatever differs
// between one node and several lives behind these two interfaces and their
// parts across nodes (job.FormationAcross, job.CoordinationAcross), which
// the one-node ones lack: the loop probes for them once (New,
// Job.SetCoord), and a nil part is its only multi-node branch.

// The loop's hooks are those of a formation across nodes too, which
// nodes.New probes for.
var _ job.LoopHooksAcross = (*Loop)(nil)

// oneNode forms every job on this node alone: it has no part across nodes
// (job.FormationAcross), no control links, no elastic re-forming with other
// nodes.
type oneNode struct {
	hooks           job.LoopHooks
	fusionThreshold int64
}

// Complete implements job.Formation.
func (f *oneNode) Complete(j *job.Job) {
	t, err := plan.New(plan.Config{Size: len(j.Slots), FusionThreshold: f.fusionThreshold})
	if err != nil {
		f.hooks.FormFailed(j, fmt.Sprintf("cannot start the job: %v", err))
		return
	}
	j.SetCoord(&localCoord{j: j, t: t, hooks: f.hooks})
	f.hooks.Start(j, job.NewMembership([]int{len(j.Slots)}, 0))
}

// Ended implements job.Formation.
func (f *oneNode) Ended(*job.Job) {}

// Close implements job.Formation.
func (f *oneNode) Close() {}

// localCoord negotiates a job of one node over a plan table. It has no part
// across nodes (job.CoordinationAcross): no links, no engine, no timeline
// of another node's.
type localCoord struct {
	j     *job.Job
	t     *plan.Table
	hooks job.LoopHooks
}

// Submit implements job.Coordination.
func (c *localCoord) Submit(o *job.Op) *ipcpb.Done {
	return job.TableSubmit(c.t, c.j, o, c.hooks.Now())
}

// Next implements job.Coordination.
func (c *localCoord) Next() []plan.Response { return c.t.Ready() }

// Stalls implements job.Coordination.
func (c *localCoord) Stalls(now, olderThan int64) []plan.Stall { return c.t.Stalls(now, olderThan) }

// SetRequest implements job.Coordination.
func (c *localCoord) SetRequest(r job.SetReq) { c.j.SettleLocal(r, c.t) }

// Coordinates implements job.Coordination.
func (c *localCoord) Coordinates() bool { return true }

// Retune implements job.Coordination.
func (c *localCoord) Retune(s job.Settings) {
	// The threshold is never negative here (tuner.settings).
	c.t.SetFusionThreshold(s.Fusion)
}
