package daemon

import (
	"fmt"
	"slices"

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

// psReq is one rank's AddProcessSet or RemoveProcessSet.
type psReq struct {
	c     conn   // the rank's connection; nil for another node's rank (coordinator)
	id    uint32 // frame id: the handle the Done answers
	rank  int    // global rank
	add   bool
	ranks []int // AddProcessSet: the members, as sent
	set   int32 // RemoveProcessSet: the set
}

func (r psReq) String() string {
	if r.add {
		return fmt.Sprintf("add process set %v", r.ranks)
	}
	return fmt.Sprintf("remove process set %d", r.set)
}

// setChange is the decision on one round of set requests: a set added or
// removed, or the error every request of the round answers with.
type setChange struct {
	add   bool
	set   int32 // the id added or removed
	ranks []int // add: the members, ascending
	err   string
}

// processSetReq takes a local rank's set request to the job's coordination.
func (l *loop) processSetReq(r psReq) {
	c := clientOf(r.c)
	j := c.job
	switch {
	case j == nil || !j.formed:
		c.reply(r.id, &ipcpb.Done{Code: ipcpb.Code_CODE_INVALID_ARGUMENT, Error: "process set request before the job was formed: wait for init() to return"})
		return
	case j.failed != nil:
		c.reply(r.id, j.failed)
		return
	}
	r.rank = c.rank
	j.coord.setRequest(r)
}

// queueSet queues a rank's set request (by global rank, of size) and
// returns the rounds that every rank has now reached, in order.
func (j *job) queueSet(r psReq, size int) [][]psReq {
	if j.psq == nil {
		j.psq = make([][]psReq, size)
	}
	j.psq[r.rank] = append(j.psq[r.rank], r)
	var rounds [][]psReq
	for {
		for _, q := range j.psq {
			if len(q) == 0 {
				return rounds
			}
		}
		round := make([]psReq, len(j.psq))
		for i := range j.psq {
			round[i] = j.psq[i][0]
			j.psq[i] = j.psq[i][1:]
		}
		rounds = append(rounds, round)
	}
}

// decide settles one round of set requests (one per global rank, in rank
// order) against reg, the job's plan table, with Horovod's errors, and
// returns the change to apply.
func (j *job) decide(round []psReq, reg setRegistry) setChange {
	fail := func(format string, args ...any) setChange { return setChange{err: fmt.Sprintf(format, args...)} }
	first := round[0]
	for _, r := range round[1:] {
		if r.add != first.add || !slices.Equal(r.ranks, first.ranks) || r.set != first.set {
			return fail("Different ranks tried to set up mismatching process sets: rank %d asked to %v, rank %d to %v",
				first.rank, first, r.rank, r)
		}
	}
	if !first.add {
		if _, ok := j.sets[first.set]; !ok || first.set == 0 {
			return fail("process set %d cannot be removed: it is not a registered set (the global set 0 never is)", first.set)
		}
		if _, err := reg.RemoveProcessSet(first.set); err != nil {
			return fail("%v", err)
		}
		return setChange{set: first.set}
	}
	ranks := first.ranks
	if len(ranks) == 0 {
		return fail("a process set needs at least one rank")
	}
	for i, r := range ranks {
		if r < 0 || r >= reg.Size() || i > 0 && r <= ranks[i-1] {
			return fail("process set %v: ranks must be distinct, sorted and in 0..%d", ranks, reg.Size()-1)
		}
	}
	for id, s := range j.sets {
		if slices.Equal(s, ranks) {
			return fail("Attempted to add a duplicate process set: %v is already registered as process set %d", ranks, id)
		}
	}
	id := j.nextSet + 1
	if err := reg.AddProcessSet(id, ranks); err != nil {
		return fail("%v", err)
	}
	return setChange{add: true, set: id, ranks: slices.Clone(ranks)}
}

// applySet applies a decided change to the job and answers the local
// requests of its round (local: the requests of this node's ranks).
// Removing a set fails the collectives of the set that still wait here.
func (j *job) applySet(ch setChange, local []psReq) {
	var d *ipcpb.Done
	switch {
	case ch.err != "":
		d = &ipcpb.Done{Code: ipcpb.Code_CODE_INVALID_ARGUMENT, Error: ch.err}
	case ch.add:
		if j.sets == nil {
			j.sets = make(map[int32][]int)
		}
		j.sets[ch.set] = ch.ranks
		j.nextSet = max(j.nextSet, ch.set)
		d = &ipcpb.Done{ProcessSetId: ch.set}
	default:
		delete(j.sets, ch.set)
		delete(j.views, ch.set)
		aborted := &ipcpb.Done{Code: ipcpb.Code_CODE_ABORTED, Error: fmt.Sprintf("process set %d was removed while this collective waited in it", ch.set)}
		for k, o := range j.pending {
			if k.set == ch.set {
				delete(j.pending, k)
				o.finish(aborted)
			}
		}
		d = &ipcpb.Done{}
	}
	for _, r := range local {
		if r.c != nil {
			r.c.reply(r.id, d)
		}
	}
}

// settleLocal decides and applies every round that r completes, where the
// job's table is reg (one node, or the coordinator), and returns the
// changes.
func (j *job) settleLocal(r psReq, reg setRegistry) []setChange {
	var out []setChange
	for _, round := range j.queueSet(r, reg.Size()) {
		ch := j.decide(round, reg)
		j.applySet(ch, round)
		out = append(out, ch)
	}
	return out
}

// rowRanks returns, for each row of a response in set (the index the
// executor treats as the rank), the global rank whose op goes there, or -1
// for a rank on another node; and root as a row index. The global set's rows
// are the global ranks. Another set's rows are its members in set order,
// the order the plan indexes shapes and splits by, so the executor works as
// on a job of the set's size: the Average divisor, allgather order, alltoall
// splits, reducescatter blocks. (A member on another node has no pending op
// here, so its row stays empty.)
func (j *job) rowRanks(set int32, root int) ([]int, int) {
	if set == 0 {
		return j.globalRows, root
	}
	members := j.sets[set]
	return members, slices.Index(members, root)
}

// setView is how the rows of a process set lie over the job's nodes, for
// the executor across nodes: its members are node-major like the global
// ranks, so each node holds a contiguous run of the set's rows.
type setView struct {
	// rows is the set seen as a job of its own: the slot count of every
	// node that holds a member (in node order), this node's place among
	// them (-1: it holds none) and the set row of its first member.
	rows membership
	// nodes are those nodes' places in the job (the engine's ranks).
	nodes []int
}

// view returns the set's setView; the global set's is the job's own.
func (j *job) view(set int32) setView {
	if v, ok := j.views[set]; ok {
		return v
	}
	v := setView{rows: membership{node: -1}}
	if set == 0 {
		v.rows = j.members
		for n := range j.members.nodes() {
			v.nodes = append(v.nodes, n)
		}
	} else {
		for row, rank := range j.sets[set] {
			n := j.members.nodeOf(rank)
			if len(v.nodes) == 0 || v.nodes[len(v.nodes)-1] != n {
				v.nodes = append(v.nodes, n)
				v.rows.slots = append(v.rows.slots, 0)
				if n == j.members.node {
					v.rows.node, v.rows.offset = len(v.nodes)-1, row
				}
			}
			v.rows.slots[len(v.rows.slots)-1]++
			v.rows.size++
		}
	}
	if j.views == nil {
		j.views = make(map[int32]setView)
	}
	j.views[set] = v
	return v
}
