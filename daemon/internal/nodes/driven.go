package nodes

import (
	"context"
	"fmt"
	"github.com/hvdd/hvdd/internal/elastickeys"
	"slices"
	"strconv"
	"strings"

	"github.com/hvdd/hvdd/daemon/internal/job"
	"github.com/hvdd/hvdd/ipc/ipcpb"
)

// Epochs whose membership hvdd run's elastic driver decides
// (Config.ElasticDriver). Horovod's driver, not its workers, decides who is
// in the job after a failure: the failed worker's host is blacklisted with
// all its slots, discovery is read again, --min-np is waited for, and only
// then does the rendezvous answer the survivors' init(). The daemons see a
// lost rank tens of milliseconds before the driver sees its exit status, so
// left to themselves they would form an epoch Horovod never produces (the
// failed host's other rank still in it, a size below --min-np). So, driven,
// they keep their speed for everything but the decision:
//
//   - every node reports each forming epoch's workers at the rendezvous, as
//     soon as its own part is complete ("elastic/E/node/K": the workers'
//     HVDD_WORKER names, space-separated; empty when none of its ranks goes
//     on), and a node that joins the running job reports its workers once
//     ("elastic/joining/K");
//   - every node marks each of its ranks that leaves the running job with a
//     Goodbye saying its process exits ("elastic/exiting/WORKER"): the
//     driver waits for that rank's exit status, where it stops a rank left
//     out that still runs after its report wait;
//   - the driver, once it has every node's report and the exit status of
//     every rank the reports leave out, applies Horovod's rules and
//     publishes the epoch's members ("elastic/E/members/V", V = 1, 2, ...:
//     the latest holds), "K:RANKS" for each node in order, or "end WHY"
//     when the job cannot go on (a rank finished it);
//   - the coordinator lays the epoch out only over the published nodes, each
//     with the published number of ranks: a node left out hears why, and
//     its ranks, which the driver stops, leave;
//   - the coordinator marks an epoch formed ("elastic/E/formed"), which
//     closes the driver's decision for it.
//
// An epoch therefore never runs, not even for a step, at a membership the
// driver did not decide, and one failure costs the survivors one reset.

// members is the driver's decision for a forming epoch.
type members struct {
	version int
	nodes   []int       // in order
	slots   map[int]int // ranks by node
	end     string      // the driver ended the job: why
}

// msgMembers brings a decision of the driver to the loop.
type msgMembers struct {
	epoch uint64
	m     *members
	err   error
}

var (
	reportKey  = elastickeys.Report
	joiningKey = elastickeys.Joining
	membersKey = elastickeys.Members
	formedKey  = elastickeys.Formed
)

// parseMembers parses a decision ("K:RANKS ..." or "end WHY").
func parseMembers(version int, v []byte) (*members, error) {
	s := string(v)
	if why, ok := strings.CutPrefix(s, "end "); ok {
		return &members{version: version, end: why}, nil
	}
	m := &members{version: version, slots: map[int]int{}}
	for _, f := range strings.Fields(s) {
		k, n, ok := strings.Cut(f, ":")
		node, err1 := strconv.Atoi(k)
		ranks, err2 := strconv.Atoi(n)
		if !ok || err1 != nil || err2 != nil || node < 0 || ranks < 1 {
			return nil, fmt.Errorf("the elastic driver's members %q: want NODE:RANKS entries", s)
		}
		if _, dup := m.slots[node]; dup {
			return nil, fmt.Errorf("the elastic driver's members %q name node %d twice", s, node)
		}
		m.nodes = append(m.nodes, node)
		m.slots[node] = ranks
	}
	if len(m.nodes) == 0 {
		return nil, fmt.Errorf("the elastic driver's members %q name no node", s)
	}
	return m, nil
}

// driven reports whether the elastic driver decides each epoch's members.
func (c *multiNode) driven() bool { return c.cfg.ElasticDriver && c.migratable() }

// workersOf names j's ranks for the driver: their HVDD_WORKER, or "pid:N"
// for a client that gave none.
func workersOf(j *job.Job) []string {
	ws := make([]string, 0, len(j.Slots))
	for _, s := range j.Slots {
		if s == nil {
			continue
		}
		w := ""
		if named, ok := s.(interface{ Worker() string }); ok {
			w = named.Worker()
		}
		if w == "" {
			w = "pid:" + strconv.Itoa(int(s.PID()))
		}
		ws = append(ws, w)
	}
	return ws
}

// tell sets key at the rendezvous for the driver, in the order of the calls
// (a node's later report replaces its earlier one), off the loop.
func (c *multiNode) tell(key string, value []byte) {
	c.reportMu.Lock()
	defer c.reportMu.Unlock()
	if c.reports == nil {
		c.reports = make(chan func(), 64)
		go func() {
			for {
				select {
				case f := <-c.reports:
					f()
				case <-c.life.Done():
					return
				}
			}
		}()
	}
	set := func() {
		ctx, cancel := context.WithTimeout(c.life, c.cfg.StartTimeout)
		defer cancel()
		if err := c.store.Set(ctx, key, value); err != nil && c.life.Err() == nil {
			c.log.Warn("elastic job: cannot report to hvdd run's elastic driver at the rendezvous", "key", key, "err", err)
		}
	}
	select {
	case c.reports <- set:
	default:
		go set() // a store too slow for 64 reports: order matters less than not blocking the loop
	}
}

// reportEpoch reports this node's workers for the forming epoch (none:
// it leaves the job).
func (c *multiNode) reportEpoch(epoch uint64, workers []string) {
	if !c.driven() {
		return
	}
	c.tell(reportKey(epoch, c.rank), []byte(strings.Join(workers, " ")))
}

// RankExiting tells the driver that worker's process exits (Goodbye.exiting):
// it waits for the exit status of a rank that said so, where it stops one
// its daemon left out that still runs after the report wait. Under load a
// process can take seconds to end after its Goodbye (the interpreter's
// teardown), and one stopped then would be judged failed: its host
// blacklisted, a job that finished ended with an error.
func (c *multiNode) RankExiting(worker string) {
	if c.driven() && worker != "" {
		c.tell(elastickeys.Exiting(worker), nil)
	}
}

// reportJoining reports the workers of this node, which joins the running
// elastic job.
func (c *multiNode) reportJoining(j *job.Job) {
	if c.driven() && j.Elastic && !c.leads() {
		c.tell(joiningKey(c.rank), []byte(strings.Join(workersOf(j), " ")))
	}
}

// reportFormed marks epoch formed, on the coordinator, with the version of
// the decision it formed with.
func (c *multiNode) reportFormed(j *job.Job) {
	if c.driven() && j.Elastic && j.Epoch > 0 && c.leads() {
		c.tell(formedKey(j.Epoch), []byte(strconv.Itoa(c.formedWith)))
	}
}

// watchMembers follows the driver's decisions for n's epoch until the next
// epoch begins, the job ends or the daemon closes (stopMembers).
func (c *multiNode) watchMembers(n *nextEpoch) {
	c.stopMembers()
	if !c.driven() {
		return
	}
	ctx, cancel := context.WithCancel(c.life)
	c.membersStop = cancel
	store, epoch := c.store, n.epoch
	go func() {
		for v := 1; ; v++ {
			kv, err := store.Wait(ctx, membersKey(epoch, v))
			if ctx.Err() != nil {
				return
			}
			var m *members
			if err == nil {
				m, err = parseMembers(v, kv[membersKey(epoch, v)])
			}
			c.p.Post(msgMembers{epoch: epoch, m: m, err: err})
			if err != nil {
				return
			}
		}
	}()
}

// stopMembers ends the watch of watchMembers.
func (c *multiNode) stopMembers() {
	if c.membersStop != nil {
		c.membersStop()
		c.membersStop = nil
	}
}

// membersDecided takes a decision of the driver for the forming epoch.
func (c *multiNode) membersDecided(msg msgMembers) {
	n := c.next
	if n == nil || n.epoch != msg.epoch {
		return
	}
	switch {
	case msg.err != nil:
		why := fmt.Sprintf("the elastic job cannot form epoch %d on node %d: hvdd run's elastic driver's decision could not be read at the rendezvous %s: %v", n.epoch, c.rank, c.cfg.Rendezvous, msg.err)
		c.endDriven(n, why)
	case msg.m.end != "":
		c.endDriven(n, fmt.Sprintf("the elastic job cannot form epoch %d: hvdd run's elastic driver ended it: %s", n.epoch, msg.m.end))
	case n.members == nil || msg.m.version > n.members.version:
		n.members = msg.m
		c.log.Info("elastic job: hvdd run's elastic driver decided the next epoch's members", "epoch", n.epoch, "version", msg.m.version, "nodes", msg.m.nodes)
		c.maybeLayout()
	}
}

// endDriven gives the forming epoch n up on this node with why.
func (c *multiNode) endDriven(n *nextEpoch, why string) {
	c.stopMembers()
	if c.leads() {
		c.abortNext(why)
		return
	}
	c.nextGone(n, why)
}

// drivenNodes checks the nodes of forming epoch n against the driver's
// decision, for the coordinator's layout of its part j: ok once every
// decided node is there with the decided ranks. It then returns the
// decided nodes among the failed epoch's (in their order) and among those
// that joined the running job (c.joins); the failed epoch's others are
// told that the driver left them out, and dropped.
func (c *multiNode) drivenNodes(j *job.Job, n *nextEpoch) (prev, joined []int, ok bool) {
	m := n.members
	if m == nil || m.slots[c.rank] != len(j.Slots) {
		return nil, nil, false // the driver has not decided, or this node's part does not match yet
	}
	for _, id := range m.nodes {
		if id == c.rank {
			continue
		}
		var slots int32
		if jn := n.joins[id]; jn != nil && n.links[id] != nil {
			slots = jn.GetSlots()
		} else if nj, in := c.joins[id]; in && nj.join.GetElastic() {
			slots = nj.join.GetSlots()
		}
		if int(slots) != m.slots[id] {
			return nil, nil, false
		}
	}
	for _, id := range n.Nodes() {
		if _, in := m.slots[id]; in {
			prev = append(prev, id)
			continue
		}
		why := fmt.Sprintf("hvdd run's elastic driver left node %d out of epoch %d of the elastic job (its host was blacklisted or removed, or its ranks are gone)", id, n.epoch)
		c.log.Warn("elastic job: the next epoch forms without a node", "node", id, "epoch", n.epoch, "why", why)
		if link := n.links[id]; link != nil {
			link.Send(abortMsg(ipcpb.Code_CODE_ABORTED, why, n.epoch))
			c.closeLink(link)
		}
		delete(n.links, id)
		delete(n.joins, id)
	}
	for _, id := range c.elasticJoins() {
		if _, in := m.slots[id]; in && !slices.Contains(prev, id) {
			joined = append(joined, id)
		}
	}
	return prev, joined, true
}
