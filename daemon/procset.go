package daemon

import (
	"fmt"
	"slices"

	"github.com/hvdd/hvdd/ipc/ipcpb"
)

// psReq is one rank's AddProcessSet or RemoveProcessSet. Registering and
// removing sets are collectives over the whole job: the daemon pairs each
// rank's k-th request with every other rank's k-th and acts once all agree.
type psReq struct {
	c     *client
	id    uint32 // frame id: the handle the Done answers
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

// processSetReq queues a rank's set request and settles every round that all
// ranks have reached.
func (l *loop) processSetReq(r psReq) {
	c := r.c
	j := c.job
	switch {
	case j == nil || !j.formed:
		c.reply(r.id, &ipcpb.Done{Code: ipcpb.Code_CODE_INVALID_ARGUMENT, Error: "process set request before the job was formed: wait for init() to return"})
		return
	case j.failed != nil:
		c.reply(r.id, j.failed)
		return
	case j.coord.processSets() == nil:
		c.reply(r.id, &ipcpb.Done{Code: ipcpb.Code_CODE_UNIMPLEMENTED, Error: "process sets across several nodes are not supported yet; on one node they are"})
		return
	}
	if j.psq == nil {
		j.psq = make([][]psReq, len(j.slots))
	}
	j.psq[c.localRank] = append(j.psq[c.localRank], r)
	for {
		for _, q := range j.psq {
			if len(q) == 0 {
				return
			}
		}
		round := make([]psReq, len(j.psq))
		for i := range j.psq {
			round[i] = j.psq[i][0]
			j.psq[i] = j.psq[i][1:]
		}
		l.settleSets(j, round)
	}
}

// settleSets acts on one round of set requests, one per rank.
func (l *loop) settleSets(j *job, round []psReq) {
	fail := func(msg string) {
		for _, r := range round {
			r.c.reply(r.id, &ipcpb.Done{Code: ipcpb.Code_CODE_INVALID_ARGUMENT, Error: msg})
		}
	}
	first := round[0]
	for _, r := range round[1:] {
		if r.add != first.add || !slices.Equal(r.ranks, first.ranks) || r.set != first.set {
			fail(fmt.Sprintf("Different ranks tried to set up mismatching process sets: rank %d asked to %v, rank %d to %v",
				first.c.rank, first, r.c.rank, r))
			return
		}
	}
	if !first.add {
		if _, ok := j.sets[first.set]; !ok || first.set == 0 {
			fail(fmt.Sprintf("process set %d cannot be removed: it is not a registered set (the global set 0 never is)", first.set))
			return
		}
		aborted, err := j.coord.processSets().RemoveProcessSet(first.set)
		if err != nil {
			fail(err.Error())
			return
		}
		delete(j.sets, first.set)
		d := &ipcpb.Done{Code: ipcpb.Code_CODE_ABORTED, Error: fmt.Sprintf("process set %d was removed while this collective waited in it", first.set)}
		for _, a := range aborted {
			for _, rank := range a.Ranks {
				k := opKey{rank, a.ProcessSet, a.Name}
				if o := j.pending[k]; o != nil {
					delete(j.pending, k)
					o.finish(d)
				}
			}
		}
		for _, r := range round {
			r.c.reply(r.id, &ipcpb.Done{})
		}
		return
	}
	ranks := first.ranks
	if len(ranks) == 0 {
		fail("a process set needs at least one rank")
		return
	}
	for i, r := range ranks {
		if r < 0 || r >= j.members.size || i > 0 && r <= ranks[i-1] {
			fail(fmt.Sprintf("process set %v: ranks must be distinct, sorted and in 0..%d", ranks, j.members.size-1))
			return
		}
	}
	for id, s := range j.sets {
		if slices.Equal(s, ranks) {
			fail(fmt.Sprintf("Attempted to add a duplicate process set: %v is already registered as process set %d", ranks, id))
			return
		}
	}
	j.nextSet++
	id := j.nextSet
	if err := j.coord.processSets().AddProcessSet(id, ranks); err != nil {
		fail(err.Error())
		return
	}
	if j.sets == nil {
		j.sets = make(map[int32][]int)
	}
	j.sets[id] = ranks
	for _, r := range round {
		r.c.reply(r.id, &ipcpb.Done{ProcessSetId: id})
	}
}

// rowRanks returns, for each row of a response in set (the index the
// executor treats as the rank), the global rank whose op goes there, or -1
// for a rank on another node; and root as a row index. The global set's rows
// are the global ranks. Another set's rows are its members in set order (one
// node only), the order the plan indexes shapes and splits by, so the
// executor works as on a job of the set's size: the Average divisor,
// allgather order, alltoall splits, reducescatter blocks.
func (j *job) rowRanks(set int32, root int) ([]int, int) {
	if set == 0 {
		return j.globalRows, root
	}
	members := j.sets[set]
	return members, slices.Index(members, root)
}
