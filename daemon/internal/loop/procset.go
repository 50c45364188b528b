package loop

import (
	"github.com/hvdd/hvdd/daemon/internal/job"
	"github.com/hvdd/hvdd/ipc/ipcpb"
)

// Process sets (Horovod's ProcessSet). Registering and removing sets are
// collectives over the whole job: every rank's k-th AddProcessSet or
// RemoveProcessSet belongs to round k, and the round is decided once every
// rank has reached it. Where the job's plan table lives (the only node of a
// one-node job, the coordinator of a multi-node one) the rounds are
// decided: the requests are compared, the set is registered in the table
// under the next id (or removed from it) and the change is applied to the
// job. Across nodes the followers forward their ranks' requests to the
// coordinator in their Ready messages (multinode_job.go); the coordinator
// decides and sends each decision in its next Plan, ahead of that plan's
// responses, and every node applies the decisions in plan order, so every
// node has the same sets under the same ids before a response of a set
// runs, and a removed set's responses never run after its removal.
//
// A local AddProcessSet (torch's new_group(use_local_synchronization=True))
// is sent by the set's members only: its round is the members' k-th local
// request for those ranks, decided where the table lives as the others are,
// apart from the job's rounds, and applied on every node.

// processSetReq takes a local rank's set request to the job's coordination.
func (l *Loop) processSetReq(r job.SetReq) {
	c := clientOf(r.Conn)
	j := c.job
	switch {
	case j == nil || !j.Formed:
		c.Reply(r.ID, &ipcpb.Done{Code: ipcpb.Code_CODE_INVALID_ARGUMENT, Error: "process set request before the job was formed: wait for init() to return"})
		return
	case j.Failed != nil:
		c.Reply(r.ID, j.Failed)
		return
	}
	r.Rank = c.rank
	if r.Local {
		if msg := r.LocalErr(j.Members.Size); msg != "" {
			c.Reply(r.ID, &ipcpb.Done{Code: ipcpb.Code_CODE_INVALID_ARGUMENT, Error: msg})
			return
		}
	}
	j.Coord.SetRequest(r)
}
