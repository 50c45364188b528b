package job

import (
	"fmt"
	"slices"

	"github.com/hvdd/hvdd/daemon/plan"
	"github.com/hvdd/hvdd/ipc/ipcpb"
)

// SetReq is one rank's AddProcessSet or RemoveProcessSet.
type SetReq struct {
	Conn  Conn   // the rank's connection; nil for another node's rank (coordinator)
	ID    uint32 // frame id: the handle the Done answers
	Rank  int    // global rank
	Add   bool
	Ranks []int // AddProcessSet: the members, as sent
	Set   int32 // RemoveProcessSet: the set
	// Local: an AddProcessSet from the set's members only (torch's
	// new_group(use_local_synchronization=True)): its round is the
	// members' k-th local request for these ranks (QueueLocalSet).
	Local bool
}

// String says what r asks, for errors and logs.
func (r SetReq) String() string {
	if r.Add {
		return fmt.Sprintf("add process set %v", r.Ranks)
	}
	return fmt.Sprintf("remove process set %d", r.Set)
}

// SetChange is the decision on one round of set requests: a set added or
// removed, or the error every request of the round answers with.
type SetChange struct {
	Add   bool
	Set   int32 // the id added or removed
	Ranks []int // add: the members, ascending (a local round's, failed or not)
	Err   string
	// Local: the round of local requests for Ranks (SetReq.Local), which
	// answers those of the members, not every rank's next request.
	Local bool
}

// LocalErr checks a local set request (SetReq.Local) of a job of size
// ranks where the rank lives, before it waits for the other members: its
// ranks must be a valid set that holds the requesting rank. It returns
// the error to answer it with at once, or "".
func (r SetReq) LocalErr(size int) string {
	if len(r.Ranks) == 0 {
		return "a process set needs at least one rank"
	}
	for i, k := range r.Ranks {
		if k < 0 || k >= size || i > 0 && k <= r.Ranks[i-1] {
			return fmt.Sprintf("process set %v: ranks must be distinct, sorted and in 0..%d", r.Ranks, size-1)
		}
	}
	if !slices.Contains(r.Ranks, r.Rank) {
		return fmt.Sprintf("rank %d asked to add process set %v with only its members (use_local_synchronization), but is not one of them", r.Rank, r.Ranks)
	}
	return ""
}

// localKey names the queue of local requests for ranks.
func localKey(ranks []int) string { return fmt.Sprint(ranks) }

// QueueLocalSet queues a member's local set request (checked: LocalErr)
// until every member of its set has made one.
func (j *Job) QueueLocalSet(r SetReq) {
	if j.LocalSets == nil {
		j.LocalSets = make(map[string][][]SetReq)
	}
	k := localKey(r.Ranks)
	q := j.LocalSets[k]
	if q == nil {
		q = make([][]SetReq, len(r.Ranks))
		j.LocalSets[k] = q
	}
	i := slices.Index(r.Ranks, r.Rank)
	q[i] = append(q[i], r)
}

// localRound takes the round of local requests for ranks that every
// member has reached (each one's first), or nil.
func (j *Job) localRound(ranks []int) []SetReq {
	k := localKey(ranks)
	q := j.LocalSets[k]
	for _, m := range q {
		if len(m) == 0 {
			return nil
		}
	}
	round := make([]SetReq, len(q))
	for i := range q {
		round[i] = q[i][0]
		q[i] = q[i][1:]
	}
	j.dropEmptyLocal(k)
	return round
}

// TakeLocalSet takes member rank's first local request for ranks, which a
// coordinator's decision (SetChange.Local) answers; false when it made
// none.
func (j *Job) TakeLocalSet(ranks []int, rank int) (SetReq, bool) {
	k := localKey(ranks)
	q := j.LocalSets[k]
	i := slices.Index(ranks, rank)
	if q == nil || i < 0 || len(q[i]) == 0 {
		return SetReq{}, false
	}
	r := q[i][0]
	q[i] = q[i][1:]
	j.dropEmptyLocal(k)
	return r, true
}

func (j *Job) dropEmptyLocal(k string) {
	for _, m := range j.LocalSets[k] {
		if len(m) > 0 {
			return
		}
	}
	delete(j.LocalSets, k)
}

// queueSet queues a rank's set request (by global rank, of size) and
// returns the rounds that every rank has now reached, in order.
func (j *Job) queueSet(r SetReq, size int) [][]SetReq {
	if j.SetQueue == nil {
		j.SetQueue = make([][]SetReq, size)
	}
	j.SetQueue[r.Rank] = append(j.SetQueue[r.Rank], r)
	var rounds [][]SetReq
	for {
		for _, q := range j.SetQueue {
			if len(q) == 0 {
				return rounds
			}
		}
		round := make([]SetReq, len(j.SetQueue))
		for i := range j.SetQueue {
			round[i] = j.SetQueue[i][0]
			j.SetQueue[i] = j.SetQueue[i][1:]
		}
		rounds = append(rounds, round)
	}
}

// decide settles one round of set requests (one per global rank, in rank
// order) against reg, the job's plan table, with Horovod's errors, and
// returns the change to apply.
func (j *Job) decide(round []SetReq, reg SetRegistry) SetChange {
	fail := func(format string, args ...any) SetChange { return SetChange{Err: fmt.Sprintf(format, args...)} }
	first := round[0]
	for _, r := range round[1:] {
		if r.Add != first.Add || !slices.Equal(r.Ranks, first.Ranks) || r.Set != first.Set {
			return fail("Different ranks tried to set up mismatching process sets: rank %d asked to %v, rank %d to %v",
				first.Rank, first, r.Rank, r)
		}
	}
	if !first.Add {
		if _, ok := j.Sets[first.Set]; !ok || first.Set == 0 {
			return fail("process set %d cannot be removed: it is not a registered set (the global set 0 never is)", first.Set)
		}
		if _, err := reg.RemoveProcessSet(first.Set); err != nil {
			return fail("%v", err)
		}
		return SetChange{Set: first.Set}
	}
	ranks := first.Ranks
	if len(ranks) == 0 {
		return fail("a process set needs at least one rank")
	}
	for i, r := range ranks {
		if r < 0 || r >= reg.Size() || i > 0 && r <= ranks[i-1] {
			return fail("process set %v: ranks must be distinct, sorted and in 0..%d", ranks, reg.Size()-1)
		}
	}
	for id, s := range j.Sets {
		if slices.Equal(s, ranks) {
			return fail("Attempted to add a duplicate process set: %v is already registered as process set %d", ranks, id)
		}
	}
	id := j.nextSet + 1
	if err := reg.AddProcessSet(id, ranks); err != nil {
		return fail("%v", err)
	}
	return SetChange{Add: true, Set: id, Ranks: slices.Clone(ranks)}
}

// ApplySet applies a decided change to the job and answers the local
// requests of its round (local: the requests of this node's ranks).
// Removing a set fails the collectives of the set that still wait here.
func (j *Job) ApplySet(ch SetChange, local []SetReq) {
	var d *ipcpb.Done
	switch {
	case ch.Err != "":
		d = &ipcpb.Done{Code: ipcpb.Code_CODE_INVALID_ARGUMENT, Error: ch.Err}
	case ch.Add:
		if j.Sets == nil {
			j.Sets = make(map[int32][]int)
		}
		j.Sets[ch.Set] = ch.Ranks
		j.nextSet = max(j.nextSet, ch.Set)
		d = &ipcpb.Done{ProcessSetId: ch.Set}
	default:
		delete(j.Sets, ch.Set)
		delete(j.views, ch.Set)
		aborted := &ipcpb.Done{Code: ipcpb.Code_CODE_ABORTED, Error: fmt.Sprintf("process set %d was removed while this collective waited in it", ch.Set)}
		for k, o := range j.Pending {
			if k.Set == ch.Set {
				delete(j.Pending, k)
				o.Finish(aborted)
			}
		}
		d = &ipcpb.Done{}
	}
	for _, r := range local {
		if r.Conn != nil {
			r.Conn.Reply(r.ID, d)
		}
	}
}

// SettleLocal decides and applies every round that r completes, where the
// job's table is reg (one node, or the coordinator), and returns the
// changes.
func (j *Job) SettleLocal(r SetReq, reg SetRegistry) []SetChange {
	if r.Local {
		j.QueueLocalSet(r)
		round := j.localRound(r.Ranks)
		if round == nil {
			return nil
		}
		ch := j.decide(round, reg)
		ch.Local, ch.Ranks = true, slices.Clone(r.Ranks)
		j.ApplySet(ch, round)
		return []SetChange{ch}
	}
	var out []SetChange
	for _, round := range j.queueSet(r, reg.Size()) {
		ch := j.decide(round, reg)
		j.ApplySet(ch, round)
		out = append(out, ch)
	}
	return out
}

// RowRanks returns, for each row of a response in set (the index the
// executor treats as the rank), the global rank whose op goes there, or -1
// for a rank on another node; and root as a row index. The global set's rows
// are the global ranks. Another set's rows are its members in set order,
// the order the plan indexes shapes and splits by, so the executor works as
// on a job of the set's size: the Average divisor, allgather order, alltoall
// splits, reducescatter blocks. (A member on another node has no pending op
// here, so its row stays empty.)
func (j *Job) RowRanks(set int32, root int) ([]int, int) {
	if set == 0 {
		return j.GlobalRows, root
	}
	members, _ := j.SetRanks(set)
	return members, slices.Index(members, root)
}

// SetRanks returns the global ranks, ascending, of process set set (not
// 0): a registered set's, or a pair set's (plan.PairSet: the two ranks of a
// transfer across nodes), or false for neither.
func (j *Job) SetRanks(set int32) ([]int, bool) {
	if rs, ok := j.Sets[set]; ok {
		return rs, true
	}
	return plan.PairRanks(set, j.Members.Size)
}

// setView is how the rows of a process set lie over the job's nodes, for
// the executor across nodes: its members are node-major like the global
// ranks, so each node holds a contiguous run of the set's rows.
type setView struct {
	// Rows is the set seen as a job of its own: the slot count of every
	// node that holds a member (in node order), this node's place among
	// them (-1: it holds none) and the set row of its first member.
	Rows Membership
	// Nodes are those nodes' places in the job (the engine's ranks).
	Nodes []int
}

// View returns the set's setView; the global set's is the job's own.
func (j *Job) View(set int32) setView {
	if v, ok := j.views[set]; ok {
		return v
	}
	v := setView{Rows: Membership{Node: -1}}
	if set == 0 {
		v.Rows = j.Members
		for n := range j.Members.Nodes() {
			v.Nodes = append(v.Nodes, n)
		}
	} else {
		members, _ := j.SetRanks(set)
		for row, rank := range members {
			n := j.Members.NodeOf(rank)
			if len(v.Nodes) == 0 || v.Nodes[len(v.Nodes)-1] != n {
				v.Nodes = append(v.Nodes, n)
				v.Rows.slots = append(v.Rows.slots, 0)
				if n == j.Members.Node {
					v.Rows.Node, v.Rows.Offset = len(v.Nodes)-1, row
				}
			}
			v.Rows.slots[len(v.Rows.slots)-1]++
			v.Rows.Size++
		}
	}
	if j.views == nil {
		j.views = make(map[int32]setView)
	}
	j.views[set] = v
	return v
}
