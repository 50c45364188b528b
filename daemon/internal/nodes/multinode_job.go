package nodes

import (
	"errors"
	"fmt"
	"slices"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/hvdd/hvdd/backends"
	"github.com/hvdd/hvdd/cluster"
	"github.com/hvdd/hvdd/cluster/clusterpb"
	"github.com/hvdd/hvdd/daemon/internal/job"
	"github.com/hvdd/hvdd/daemon/plan"
	"github.com/hvdd/hvdd/daemon/timeline"
	"github.com/hvdd/hvdd/ipc/ipcpb"
	"github.com/hvdd/hvdd/tensor"
)

// Negotiating a job across nodes (multiCoord, the job's coordination).
// During the job each follower (a node other than 0) forwards a tensor's
// requests (of all its local ranks, in one Ready message per loop pass) once
// every local rank has submitted it; joins go at once. The coordinator (node
// 0) feeds its own clients' requests and the forwarded ones to one plan table
// over all global ranks and, whenever its executor is idle, sends the next
// batch of responses to every node as a numbered Plan. Every node runs the
// plans in order: local reduction through shared memory, the backend on the
// fused buffer, write-back. A lost link, a lost client, a backend error or an
// Abort fails the job on every node.

// multiCoord is the coordination of a job across nodes, as coordinator
// (node 0) or follower.
type multiCoord struct {
	n     *multiNode
	hooks job.LoopHooksAcross
	j     *job.Job
	b     backends.Backend // the data engine, once connected
	table *plan.Table      // coordinator: the table over every global rank

	ids    []int                            // every node's --node-rank, by place in the job
	links  map[int]*cluster.Link            // by place: coordinator: every other node; else {0: coordinator}
	byes   map[int]bool                     // coordinator: nodes whose job ended normally
	count  map[setName]int                  // follower: local submissions per tensor
	joined map[int]bool                     // follower: local ranks joined (global ranks)
	setOut []*clusterpb.SetRequest          // follower: set requests to forward
	sets   []*clusterpb.SetChange           // coordinator: set rounds decided, for the next plan
	out    [][]*clusterpb.Request           // follower: groups of requests to forward
	outKey []setName                        // the tensor of each group (zero value: a join)
	sent   map[setName]*cacheEntry          // follower: what was forwarded before
	nslots int                              // follower: cache slots used
	plans  []*clusterpb.Plan                // follower: received, not yet run
	trace  nodeTrace                        // follower: phases recorded for the coordinator's timeline
	seq    uint64                           // plans sent (coordinator) or run (followers)
	caches map[int]map[int32][]plan.Request // coordinator: per node, cache slot -> requests
	// shutdown is an orderly shutdown (an Abort with CODE_SHUT_DOWN) that
	// waits for the plans received before it: they ran, or run, on the node
	// it came from, so they run here too.
	shutdown *clusterpb.Abort
	// expecting is what the links were last told (cluster.Link.Expect).
	expecting bool
	// tuning is the autotuner's settings for the coordinator's next plan.
	tuning *job.Settings
	// lost is the node (place in the job) whose loss fails the job, +1;
	// 0 when the failure has another cause (see abortLost).
	lost int
	// ncclID is the NCCL unique id of the job's communicator across nodes:
	// the coordinator draws it for its first plan with an NCCL response
	// (decideNCCL) and sends it in that plan; a follower takes it from
	// there. ncclFailed: the coordinator could not draw one (no response
	// of the job runs on NCCL across nodes then).
	ncclID     []byte
	ncclFailed bool
}

// A multiCoord has the part of a coordination across nodes too: the loop
// finds it by Job.SetCoord's probe.
var _ job.CoordinationAcross = (*multiCoord)(nil)

// cacheEntry is a tensor's requests as last forwarded, under a cache slot.
type cacheEntry struct {
	slot int32
	reqs []*clusterpb.Request
}

type setName struct {
	set  int32
	name string
}

func newMultiCoord(n *multiNode, j *job.Job) *multiCoord {
	return &multiCoord{n: n, hooks: n.hooks, j: j, trace: nodeTrace{epoch: time.Now()}, links: make(map[int]*cluster.Link), byes: make(map[int]bool),
		count: make(map[setName]int), sent: make(map[setName]*cacheEntry), caches: make(map[int]map[int32][]plan.Request)}
}

// coordOf returns the multi-node coordination of j.
func coordOf(j *job.Job) *multiCoord { return j.Coord.(*multiCoord) }

func (mc *multiCoord) coordinator() bool { return mc.n.leads() }

// Coordinates reports whether this node is the job's coordinator.
func (mc *multiCoord) Coordinates() bool { return mc.coordinator() }

// Retune takes the coordinator's autotuned settings (coordination): the
// fusion threshold now, the rest with the next plan.
func (mc *multiCoord) Retune(s job.Settings) {
	if mc.table != nil {
		mc.table.SetFusionThreshold(s.Fusion)
	}
	mc.tuning = &s
}

// applyTuning applies settings that a plan carries, before its responses:
// the loop's and the engine's. It reports false when the engine refused
// them, after failing the job.
func (mc *multiCoord) applyTuning(s job.Settings) bool {
	mc.hooks.Tuned(s)
	tb, ok := mc.b.(backends.Tunable)
	if !ok || s.Engine == (backends.Tuning{}) {
		return true
	}
	if err := tb.SetTuning(s.Engine); err != nil {
		mc.hooks.Abort(mc.j, ipcpb.Code_CODE_INTERNAL, fmt.Sprintf("node %d cannot apply the autotuned engine settings: %v (give every node the same --tcp-streams)", mc.n.rank, err), true)
		return false
	}
	return true
}

// Engine is the job's engine across nodes.
func (mc *multiCoord) Engine() backends.Backend { return mc.b }

// NCCLID is the job's NCCL unique id once a plan brought it
// (job.CoordinationAcross).
func (mc *multiCoord) NCCLID() []byte { return mc.ncclID }

// ncclReady reports whether a node's ranks' requests of one tensor can
// join one NCCL communicator across the nodes: the node can (capable: it
// runs with NCCL, configured for it), the tensor's process set spans every
// node of the job (spans), and every request is a non-empty tensor in GPU
// memory, one of them on the node's first GPU, where the communicator
// across nodes lives.
func ncclReady(capable, spans bool, reqs []*plan.Request) bool {
	if !capable || !spans || len(reqs) == 0 {
		return false
	}
	first := false
	for _, r := range reqs {
		if !r.Device || r.Shape.NumElements() == 0 {
			return false
		}
		first = first || r.GPU == 0
	}
	return first
}

// localNCCL is ncclReady for this node's ranks' requests of (set, name).
func (mc *multiCoord) localNCCL(set int32, name string) bool {
	j := mc.j
	if !mc.n.cfg.NCCLAcross {
		return false
	}
	var reqs []*plan.Request
	for lr := range j.Slots {
		if o, ok := j.Pending[job.OpKey{Rank: j.Members.Offset + lr, Set: set, Name: name}]; ok {
			reqs = append(reqs, &o.Req)
		}
	}
	return ncclReady(true, len(j.View(set).Nodes) == j.Members.Nodes(), reqs)
}

// decideNCCL completes the coordinator's decision for the responses of its
// next plan: the table decided from every request's word (plan.NCCLAcross),
// where this node's own requests said only whether it can at all; here a
// response of tensors this node's ranks cannot all join on NCCL runs on each
// node's own path instead. It draws the job's NCCL unique id for the first
// response that runs on NCCL, and returns it when this plan must carry it.
func (mc *multiCoord) decideNCCL(resps []plan.Response) []byte {
	var send []byte
	for i := range resps {
		r := &resps[i]
		if !r.NCCL {
			continue
		}
		for _, t := range r.Tensors {
			r.NCCL = r.NCCL && mc.localNCCL(r.ProcessSet, t.Name)
		}
		if r.NCCL && mc.ncclID == nil && !mc.ncclFailed {
			id, err := mc.n.cfg.NCCLUniqueID()
			if err != nil {
				mc.ncclFailed = true
				mc.n.log.Warn("NCCL across nodes: no unique id; the job's responses run on each node's own path", "job", mc.j.ID, "err", err)
			} else {
				mc.ncclID, send = id, id
			}
		}
		r.NCCL = r.NCCL && mc.ncclID != nil
	}
	return send
}

// SetRequest takes a local rank's set request (coordination): the
// coordinator decides the rounds it completes at once (its table spans
// every rank) and sends the decisions in its next plan; a follower queues
// it until a plan brings its round's decision, and forwards it.
func (mc *multiCoord) SetRequest(r job.SetReq) {
	j := mc.j
	if mc.coordinator() {
		mc.decided(j.SettleLocal(r, mc.table))
		return
	}
	if r.Local {
		j.QueueLocalSet(r)
		mc.setOut = append(mc.setOut, &clusterpb.SetRequest{Rank: int32(r.Rank), Add: true, Ranks: ints32(r.Ranks), Local: true})
		return
	}
	if j.SetQueue == nil {
		j.SetQueue = make([][]job.SetReq, j.Members.Size)
	}
	j.SetQueue[r.Rank] = append(j.SetQueue[r.Rank], r)
	mc.setOut = append(mc.setOut, &clusterpb.SetRequest{Rank: int32(r.Rank), Add: r.Add, Ranks: ints32(r.Ranks), ProcessSet: r.Set})
}

// decided queues set decisions for the coordinator's next plan.
func (mc *multiCoord) decided(chs []job.SetChange) {
	for _, ch := range chs {
		mc.sets = append(mc.sets, &clusterpb.SetChange{Add: ch.Add, ProcessSet: ch.Set, Ranks: ints32(ch.Ranks), Error: ch.Err, Local: ch.Local})
	}
}

// applySets applies the set decisions of a plan on a follower, before its
// responses: each answers the request of every local rank at the front of
// its queue.
func (mc *multiCoord) applySets(chs []*clusterpb.SetChange) error {
	j := mc.j
	for _, pc := range chs {
		var local []job.SetReq
		for lr := range j.Slots {
			rank := j.Members.Offset + lr
			if pc.GetLocal() {
				// A round of the set's members: this node's members
				// made one local request each.
				ranks := ints(pc.GetRanks())
				if !slices.Contains(ranks, rank) {
					continue
				}
				r, ok := j.TakeLocalSet(ranks, rank)
				if !ok {
					return fmt.Errorf("the coordinator decided a local round of process set %v that rank %d has not reached", ranks, rank)
				}
				local = append(local, r)
				continue
			}
			if j.SetQueue == nil || len(j.SetQueue[rank]) == 0 {
				return fmt.Errorf("the coordinator decided a process set round that rank %d has not reached", rank)
			}
			local = append(local, j.SetQueue[rank][0])
			j.SetQueue[rank] = j.SetQueue[rank][1:]
		}
		ch := job.SetChange{Add: pc.GetAdd(), Set: pc.GetProcessSet(), Ranks: ints(pc.GetRanks()), Err: pc.GetError()}
		j.ApplySet(ch, local)
		if !ch.Add && ch.Err == "" {
			for sn := range mc.count {
				if sn.set == ch.Set {
					delete(mc.count, sn)
				}
			}
		}
	}
	return nil
}

// localNeed is the number of this node's ranks that must submit a tensor
// of set before it is forwarded: its local members that have not joined.
func (mc *multiCoord) localNeed(set int32) int {
	j := mc.j
	n := 0
	for lr := range j.Slots {
		rank := j.Members.Offset + lr
		if mc.joined[rank] {
			continue
		}
		if members, _ := j.SetRanks(set); set == 0 || slices.Contains(members, rank) {
			n++
		}
	}
	return n
}

// Stalls reports the tensors the coordinator waits on (job.Coordination).
func (mc *multiCoord) Stalls(now, olderThan int64) []plan.Stall {
	if mc.table == nil {
		return nil
	}
	return mc.table.Stalls(now, olderThan)
}

// control acts on a message from another node of the running job.
func (mc *multiCoord) control(node int, m *clusterpb.Message) {
	j := mc.j
	if !mc.hooks.Current(j) {
		return
	}
	switch msg := m.Msg.(type) {
	case *clusterpb.Message_Ready:
		if !mc.coordinator() || j.Failed != nil || mc.table == nil {
			return
		}
		if err := mc.ready(node, msg.Ready); err != nil {
			mc.hooks.Abort(j, ipcpb.Code_CODE_INVALID_ARGUMENT, err.Error(), true)
			return
		}
	case *clusterpb.Message_Plan:
		if !mc.coordinator() {
			if c := msg.Plan.GetTimeline(); c != nil {
				mc.trace.clock(c)
			}
			mc.plans = append(mc.plans, msg.Plan)
		}
	case *clusterpb.Message_TimelineEvents:
		if mc.coordinator() {
			mc.hooks.TraceRemote(node, msg.TimelineEvents)
		}
	case *clusterpb.Message_Abort:
		if code, m := ipcpb.Code(msg.Abort.GetCode()), msg.Abort.GetMsg(); (code == ipcpb.Code_CODE_SHUT_DOWN || job.IsRankExited(m) || job.IsHostsUpdated(m)) && (mc.hooks.Executing() || len(mc.plans) > 0) {
			// A rank shut down, exited or reset for a host update after
			// its last collective (Horovod's ranks all reset after the
			// same commit's broadcast); plans sent before that still run
			// here (see next), so their ranks get those results.
			mc.n.log.Debug("shutdown waits for the plans before it", "job", j.ID, "from", node, "plans", len(mc.plans), "running", mc.hooks.Executing())
			mc.shutdown = msg.Abort
			return
		}
		// Node 0 relays a node's abort to the others.
		if a := msg.Abort; a.LostNode != nil && ipcpb.Code(a.GetCode()) == ipcpb.Code_CODE_ABORTED {
			mc.abortLost(int(a.GetLostNode()), a.GetMsg(), mc.coordinator())
			return
		}
		mc.hooks.Abort(j, ipcpb.Code(msg.Abort.GetCode()), msg.Abort.GetMsg(), mc.coordinator())
	case *clusterpb.Message_Bye:
		mc.byes[node] = true
	case *clusterpb.Message_HostsUpdated:
		if mc.coordinator() {
			mc.hooks.HostsUpdated(msg.HostsUpdated.GetResult())
		}
	}
}

// HostsUpdated forwards a host-update notification to the coordinator
// (coordination).
func (mc *multiCoord) HostsUpdated(u *ipcpb.HostsUpdated) {
	if link := mc.links[0]; link != nil && !mc.coordinator() {
		link.Send(&clusterpb.Message{Msg: &clusterpb.Message_HostsUpdated{HostsUpdated: &clusterpb.HostsUpdated{Timestamp: u.GetTimestamp(), Result: u.GetResult()}}})
	}
}

// ready submits what a node forwarded (node 0): new request groups, which
// also fill the node's cache slots, and the cached groups its bit vector names.
func (mc *multiCoord) ready(node int, rd *clusterpb.Ready) error {
	cache := mc.caches[node]
	if cache == nil {
		cache = make(map[int32][]plan.Request)
		mc.caches[node] = cache
	}
	var all []plan.Request
	reqs, starts, slots := rd.GetRequests(), rd.GetGroupStart(), rd.GetSlot()
	if len(starts) != len(slots) {
		return fmt.Errorf("node %d sent a malformed Ready (%d groups, %d slots)", node, len(starts), len(slots))
	}
	for g := range starts {
		lo, hi := int(starts[g]), len(reqs)
		if g+1 < len(starts) {
			hi = int(starts[g+1])
		}
		if lo < 0 || lo > hi || hi > len(reqs) {
			return fmt.Errorf("node %d sent a malformed Ready (group %d spans [%d, %d) of %d)", node, g, lo, hi, len(reqs))
		}
		group := make([]plan.Request, 0, hi-lo)
		for _, pr := range reqs[lo:hi] {
			group = append(group, requestFromPB(pr))
		}
		if slots[g] >= 0 {
			cache[slots[g]] = group
		}
		all = append(all, group...)
	}
	for i, b := range rd.GetCached() {
		for bit := 0; bit < 8; bit++ {
			if b&(1<<bit) == 0 {
				continue
			}
			group, ok := cache[int32(i*8+bit)]
			if !ok {
				return fmt.Errorf("node %d named cache slot %d, which it never filled", node, i*8+bit)
			}
			all = append(all, group...)
		}
	}
	for _, r := range all {
		if err := mc.table.Submit(r, mc.hooks.Now()); err != nil {
			return fmt.Errorf("rank %d's request for %q was refused: %v", r.Rank, r.Name, err)
		}
		mc.hooks.TraceSubmitted(&r)
	}
	// (The job may not have started here yet: the node's ranks were
	// welcomed first.)
	for _, sr := range rd.GetSetRequests() {
		rank := int(sr.GetRank())
		if rank < 0 || rank >= mc.table.Size() {
			return fmt.Errorf("node %d sent a process set request for rank %d of %d", node, rank, mc.table.Size())
		}
		r := job.SetReq{Rank: rank, Add: sr.GetAdd(), Ranks: ints(sr.GetRanks()), Set: sr.GetProcessSet(), Local: sr.GetLocal()}
		if r.Local {
			if msg := r.LocalErr(mc.table.Size()); msg != "" || !r.Add {
				return fmt.Errorf("node %d sent a local process set request the node should have refused: %s", node, msg)
			}
		}
		mc.decided(mc.j.SettleLocal(r, mc.table))
	}
	return nil
}

// linkLost handles a broken control link.
func (mc *multiCoord) linkLost(node int, err error) {
	j := mc.j
	if !mc.hooks.Current(j) || j.Failed != nil || mc.byes[node] {
		return
	}
	mc.abortLost(node, fmt.Sprintf("%s%s was lost: %v", mc.name(node), j.Members.RankRange(node), err), true)
}

// abortLost fails the job for the loss of node (its place in the job): the
// Abort the other nodes get names it, and every node closes its data engine
// naming it, so that a node still in a collective blames the lost node
// rather than a neighbour that closed its engine first.
func (mc *multiCoord) abortLost(node int, msg string, notify bool) {
	mc.Lost(node)
	mc.hooks.Abort(mc.j, ipcpb.Code_CODE_ABORTED, msg, notify)
}

// Lost records node (its place in the job) as the one whose loss fails the
// job, for the Abort that follows (coordination; abortLost).
func (mc *multiCoord) Lost(node int) {
	if mc.j.Failed == nil && mc.lost == 0 && node >= 0 && node < len(mc.ids) {
		mc.lost = node + 1
	}
}

// name names the node at a place in the job by its --node-rank.
func (mc *multiCoord) name(node int) string {
	id := node
	if node < len(mc.ids) {
		id = mc.ids[node]
	}
	if id == 0 {
		return "node 0 (the coordinator)"
	}
	return fmt.Sprintf("node %d", id)
}

// Submit takes a local request (coordination): the coordinator submits it
// to its table; a follower forwards it once every local rank has.
func (mc *multiCoord) Submit(o *job.Op) *ipcpb.Done {
	j := mc.j
	if mc.coordinator() {
		// This node's own word on NCCL across nodes: whether it can at
		// all; decideNCCL looks at its ranks together.
		o.Req.NCCL = mc.n.cfg.NCCLAcross && o.Req.Device
		return job.TableSubmit(mc.table, j, o, mc.hooks.Now())
	}
	k := job.OpKey{Rank: o.Req.Rank, Set: o.Req.ProcessSet, Name: o.Req.Name}
	if _, dup := j.Pending[k]; dup {
		return &ipcpb.Done{Code: ipcpb.Code_CODE_DUPLICATE_NAME, Error: fmt.Sprintf(
			"Requested to %s a tensor with the same name as another tensor that is currently being processed (%q). If you want to request another tensor, use a different tensor name.",
			o.Type.Lower(), o.Name)}
	}
	if set := o.Req.ProcessSet; set != 0 && o.Type != tensor.Join {
		// The coordinator's table would refuse it; say so here, as on
		// one node.
		members, ok := j.SetRanks(set)
		var err error
		switch {
		case !ok:
			err = plan.UnknownSetError(o.Type, set)
		case !slices.Contains(members, o.Req.Rank):
			err = plan.NotMemberError(o.Type, o.Req.Rank, set)
		}
		if err != nil {
			return &ipcpb.Done{Code: ipcpb.Code_CODE_INVALID_ARGUMENT, Error: err.Error()}
		}
	}
	j.Pending[k] = o
	mn := mc
	if o.Type == tensor.Join {
		if mn.joined == nil {
			mn.joined = make(map[int]bool)
		}
		mn.joined[o.Req.Rank] = true
		mn.out = append(mn.out, []*clusterpb.Request{requestToPB(&o.Req)})
		mn.outKey = append(mn.outKey, setName{})
		// Tensors the remaining local ranks have all submitted are ready now.
		for sn, n := range mn.count {
			if n >= mc.localNeed(sn.set) {
				mc.forward(sn)
			}
		}
		return nil
	}
	sn := setName{o.Req.ProcessSet, o.Req.Name}
	mn.count[sn]++
	if mn.count[sn] >= mc.localNeed(sn.set) {
		mc.forward(sn)
	}
	return nil
}

// forward queues every local rank's request for a locally ready tensor.
func (mc *multiCoord) forward(sn setName) {
	j := mc.j
	delete(mc.count, sn)
	var group []*clusterpb.Request
	nccl := mc.localNCCL(sn.set, sn.name)
	for lr := range j.Slots {
		if o, ok := j.Pending[job.OpKey{Rank: j.Members.Offset + lr, Set: sn.set, Name: sn.name}]; ok {
			o.Req.NCCL = nccl
			group = append(group, requestToPB(&o.Req))
		}
	}
	mc.out = append(mc.out, group)
	mc.outKey = append(mc.outKey, sn)
}

// Flush sends what became locally ready during this loop pass, in one
// message. A tensor forwarded before with the same requests travels as one
// bit of the cache vector; others travel whole and (re)fill a cache slot.
func (mc *multiCoord) Flush() {
	j := mc.j
	if len(mc.out) == 0 && len(mc.setOut) == 0 || j.Failed != nil {
		return
	}
	mn := mc
	rd := &clusterpb.Ready{SetRequests: mc.setOut}
	mc.setOut = nil
	for i, group := range mn.out {
		sn := mn.outKey[i]
		if sn == (setName{}) || sn.set < 0 {
			// A join, or a transfer across nodes (a pair set's broadcast,
			// its name used once): never cached.
			rd.GroupStart = append(rd.GroupStart, int32(len(rd.Requests)))
			rd.Slot = append(rd.Slot, -1)
			rd.Requests = append(rd.Requests, group...)
			continue
		}
		e := mn.sent[sn]
		if e != nil && sameRequests(e.reqs, group) {
			for int(e.slot/8) >= len(rd.Cached) {
				rd.Cached = append(rd.Cached, 0)
			}
			rd.Cached[e.slot/8] |= 1 << (e.slot % 8)
			continue
		}
		if e == nil {
			e = &cacheEntry{slot: int32(mn.nslots)}
			mn.nslots++
			mn.sent[sn] = e
		}
		e.reqs = group
		rd.GroupStart = append(rd.GroupStart, int32(len(rd.Requests)))
		rd.Slot = append(rd.Slot, e.slot)
		rd.Requests = append(rd.Requests, group...)
	}
	mn.out, mn.outKey = nil, nil
	if link := mn.links[0]; link != nil {
		if err := link.Send(&clusterpb.Message{Msg: &clusterpb.Message_Ready{Ready: rd}}); err != nil {
			mc.abortLost(0, fmt.Sprintf("node 0 (the coordinator) was lost: %v", err), false)
		}
	}
}

// Expect tells the job's control links whether this node awaits messages
// on them: while a local request is pending it does. Links over MPI
// (--control mpi) then probe for messages often, and rarely otherwise.
func (mc *multiCoord) Expect(on bool) {
	if on == mc.expecting {
		return
	}
	mc.expecting = on
	for _, link := range mc.links {
		if link != nil {
			link.Expect(on)
		}
	}
}

// Next returns the next plan to run (coordination), called while the
// executor is idle: on the coordinator the next batch of ready responses,
// which it sends to every node first; on a follower the next plan received,
// in order. A shutdown that came after plans takes effect once they have
// run.
func (mc *multiCoord) Next() []plan.Response {
	j := mc.j
	if mc.coordinator() {
		if mc.shutdown != nil {
			mc.shutdownAfterPlans()
			return nil
		}
		resps := mc.table.Ready()
		if len(resps) == 0 && len(mc.sets) == 0 {
			return nil
		}
		mc.seq++
		pm := &clusterpb.Plan{Seq: mc.seq, Sets: mc.sets, NcclId: mc.decideNCCL(resps)}
		mc.sets = nil
		if gen, now, ok := mc.hooks.TraceClock(); ok {
			pm.Timeline = &clusterpb.TimelineClock{Gen: gen, NowUs: now}
		}
		var tuned *job.Settings
		if mc.tuning != nil {
			tuned, mc.tuning = mc.tuning, nil
			pm.Tuning = tuned.PB()
		}
		if resps == nil {
			resps = []plan.Response{} // set decisions only: nothing to run
		}
		for i := range resps {
			pm.Responses = append(pm.Responses, responseToPB(&resps[i]))
		}
		msg := &clusterpb.Message{Msg: &clusterpb.Message_Plan{Plan: pm}}
		for r, link := range mc.links {
			if err := link.Send(msg); err != nil {
				mc.abortLost(r, fmt.Sprintf("%s%s was lost: %v", mc.name(r), j.Members.RankRange(r), err), true)
				return nil
			}
		}
		if tuned != nil && !mc.applyTuning(*tuned) {
			return nil
		}
		return resps
	}
	// Several plans may have arrived in one read: the loop asks for them
	// all while the executor stays idle, since one that runs in the loop
	// leaves nothing that would bring the loop back here for the next, and
	// the ranks waiting for it send nothing more.
	if len(mc.plans) == 0 {
		mc.shutdownAfterPlans()
		return nil
	}
	pm := mc.plans[0]
	mc.plans = mc.plans[1:]
	mc.TraceSent()
	mc.trace.active = pm.GetTimeline() != nil && mc.trace.known
	mc.seq++
	if pm.GetSeq() != mc.seq {
		mc.hooks.Abort(j, ipcpb.Code_CODE_INTERNAL, fmt.Sprintf("plan %d arrived where %d was due", pm.GetSeq(), mc.seq), true)
		return nil
	}
	if err := mc.applySets(pm.GetSets()); err != nil {
		mc.hooks.Abort(j, ipcpb.Code_CODE_INTERNAL, fmt.Sprintf("plan %d: %v", pm.GetSeq(), err), true)
		return nil
	}
	if t := pm.GetTuning(); t != nil {
		s := job.SettingsFromPB(t)
		if s.Final {
			mc.n.log.Info("autotune: the coordinator's best settings applied", s.Attrs()...)
		}
		if !mc.applyTuning(s) {
			return nil
		}
	}
	if id := pm.GetNcclId(); id != nil {
		mc.ncclID = id
	}
	resps := make([]plan.Response, 0, len(pm.GetResponses()))
	for _, pr := range pm.GetResponses() {
		resps = append(resps, responseFromPB(pr))
	}
	for _, r := range resps {
		if r.Op == tensor.Join {
			clear(mc.joined)
		}
	}
	return resps
}

// TraceSink is the follower's record of a traced plan's phases
// (coordination).
func (mc *multiCoord) TraceSink() job.EventSink {
	if mc.trace.active {
		return &mc.trace
	}
	return nil
}

// TraceSent sends the phases recorded for the coordinator's timeline
// (coordination); a lost link drops them (the job fails anyway).
func (mc *multiCoord) TraceSent() {
	t := &mc.trace
	if len(t.events) == 0 {
		return
	}
	if link := mc.links[0]; link != nil && !mc.coordinator() {
		link.Send(&clusterpb.Message{Msg: &clusterpb.Message_TimelineEvents{TimelineEvents: &clusterpb.TimelineEvents{Gen: t.gen, Events: t.events}}})
	}
	t.events = nil
}

// shutdownAfterPlans applies a deferred shutdown once no plan waits or runs.
func (mc *multiCoord) shutdownAfterPlans() {
	a := mc.shutdown
	if a == nil || mc.hooks.Executing() || len(mc.plans) > 0 || mc.j.Failed != nil {
		return
	}
	mc.shutdown = nil
	mc.hooks.Abort(mc.j, ipcpb.Code(a.GetCode()), a.GetMsg(), mc.coordinator())
}

// Abort tells the other nodes why the job fails (notify), while the links
// are open, and closes the data engine (coordination).
func (mc *multiCoord) Abort(code ipcpb.Code, msg string, notify bool) {
	if mc.j.Elastic && mc.j.LaidOut && code == ipcpb.Code_CODE_ABORTED {
		// The links outlive the epoch, formed or only laid out (its engine
		// did not connect, a node was lost): they form the next one.
		mc.n.beginNext(mc)
	}
	if notify {
		a := abortMsg(code, msg, mc.j.Epoch)
		if mc.lost > 0 {
			a.GetAbort().LostNode = proto.Int32(int32(mc.lost - 1))
		}
		for _, link := range mc.links {
			link.Send(a)
		}
	}
	if mc.b == nil {
		return
	}
	if lc, ok := mc.b.(backends.LostCloser); ok && mc.lost > 0 {
		lc.CloseLost(mc.lost-1, errors.New(msg))
		return
	}
	mc.b.Close()
}

// End says goodbye on the links of a job that ended normally, closes them
// and the engine (coordination).
func (mc *multiCoord) End() {
	j := mc.j
	mc.TraceSent() // ahead of the Bye on the coordinator's link
	bye := &clusterpb.Message{Msg: &clusterpb.Message_Bye{Bye: &clusterpb.Bye{}}}
	for _, link := range mc.links {
		if mc.n.next.holds(link) {
			continue // it forms the next epoch
		}
		// A job that had not formed here did not end normally (the daemon
		// shut down as it formed): to the other nodes, this one is lost.
		if j.Formed && (j.Failed == nil || j.Failed.GetCode() == ipcpb.Code_CODE_SHUT_DOWN) {
			link.Send(bye)
		}
		mc.n.closeLink(link)
	}
	if mc.b != nil {
		if sr, ok := mc.b.(backends.StatsReporter); ok {
			st := sr.Stats()
			mc.n.endedLinkBytes(mc.ids, st)
			mc.n.log.Info("cross-node bytes of the job", "job", j.ID, "node", j.Members.Node, "sent", st.SentBytes, "received", st.RecvBytes)
		}
		mc.b.Close()
	}
}

// sameRequests compares two groups of requests field by field.
func sameRequests(a, b []*clusterpb.Request) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if !proto.Equal(a[i], b[i]) {
			return false
		}
	}
	return true
}

// nodeTrace records, on a node that does not write the timeline, the
// phases it runs for plans the coordinator marked as traced, converted to
// the coordinator's timeline clock, until they are sent (multiCoord.traceSent).
//
// The clock: each traced plan carries the coordinator's timeline time at
// sending; the difference to this node's clock on arrival is the clocks'
// offset plus the plan's one-way latency, so the least difference seen is
// the best estimate (it places this node's phases early by at most that
// plan's latency).
type nodeTrace struct {
	epoch  time.Time // this node's clock: µs since epoch
	gen    uint32    // the coordinator's timeline the offset belongs to
	offset int64     // local minus coordinator µs; valid when known
	known  bool
	active bool // the plan being run is traced
	events []*clusterpb.TimelineEvent
}

// clock takes a traced plan's clock on its arrival.
func (t *nodeTrace) clock(c *clusterpb.TimelineClock) {
	d := time.Since(t.epoch).Microseconds() - c.GetNowUs()
	if !t.known || c.GetGen() != t.gen || d < t.offset {
		t.gen, t.offset, t.known = c.GetGen(), d, true
	}
}

// Event records a phase event now, on the coordinator's clock (eventSink).
func (t *nodeTrace) Event(tensor string, ph timeline.Phase, name string) {
	t.events = append(t.events, &clusterpb.TimelineEvent{
		Row: tensor, Ph: uint32(ph), Name: name, TsUs: time.Since(t.epoch).Microseconds() - t.offset,
	})
}
