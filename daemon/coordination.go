package daemon

import (
	"fmt"

	"github.com/hvdd/hvdd/backends"
	"github.com/hvdd/hvdd/daemon/internal/job"
	"github.com/hvdd/hvdd/daemon/plan"
	"github.com/hvdd/hvdd/ipc/ipcpb"
)

// The loop's two seams. A daemon forms jobs through a formation: alone
// (oneNode, below) or with the daemons of other nodes (multiNode,
// multinode.go). A formed job negotiates its tensors through a coordination:
// over a plan.Table on one node (localCoord, below), or across nodes as
// coordinator or follower (multiCoord, multinode_job.go). The loop calls
// both from its goroutine only, and they reach the loop only through
// loopHooks. Whatever differs between one node and several lives behind
// these two interfaces; the loop itself has no multi-node branch.

// oneNode forms every job on this node alone.
type oneNode struct {
	hooks           job.LoopHooks
	fusionThreshold int64
}

func (f *oneNode) Complete(j *job.Job) {
	t, err := plan.New(plan.Config{Size: len(j.Slots), FusionThreshold: f.fusionThreshold})
	if err != nil {
		f.hooks.FormFailed(j, fmt.Sprintf("cannot start the job: %v", err))
		return
	}
	c := &localCoord{j: j, t: t, hooks: f.hooks}
	j.Coord = c
	f.hooks.Start(j, job.NewMembership([]int{len(j.Slots)}, 0), c)
}

func (f *oneNode) Ended(*job.Job) {}

func (f *oneNode) Message(any) bool { return false }

func (f *oneNode) Readable(int) bool { return false }

func (f *oneNode) Close() {}

func (f *oneNode) NextReady(uint64, int, string) {}

func (f *oneNode) Links([]*job.Job) map[int]*job.LinkStats { return nil }

func (f *oneNode) Removed() string { return "" }

// localCoord negotiates a job of one node over a plan table.
type localCoord struct {
	j     *job.Job
	t     *plan.Table
	hooks job.LoopHooks
}

func (c *localCoord) Submit(o *job.Op) *ipcpb.Done {
	return job.TableSubmit(c.t, c.j, o, c.hooks.Now())
}

func (c *localCoord) Next() []plan.Response { return c.t.Ready() }

func (c *localCoord) Stalls(now, olderThan int64) []plan.Stall { return c.t.Stalls(now, olderThan) }

func (c *localCoord) SetRequest(r job.SetReq) { c.j.SettleLocal(r, c.t) }

func (c *localCoord) Abort(ipcpb.Code, string, bool) {}

func (c *localCoord) Flush() {}

func (c *localCoord) Expect(bool) {}

func (c *localCoord) End() {}

func (c *localCoord) HostsUpdated(*ipcpb.HostsUpdated) {}

func (c *localCoord) Engine() backends.Backend { return nil }

func (c *localCoord) TraceSink() job.EventSink { return nil }

func (c *localCoord) TraceSent() {}

func (c *localCoord) Coordinates() bool { return true }

func (c *localCoord) Retune(s job.Settings) {
	// The threshold is never negative here (tuner.settings).
	c.t.SetFusionThreshold(s.Fusion)
}
