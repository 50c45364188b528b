package nodes

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/hvdd/hvdd/cluster"
	"github.com/hvdd/hvdd/cluster/clusterpb"
	"github.com/hvdd/hvdd/daemon/internal/job"
	"github.com/hvdd/hvdd/ipc/ipcpb"
)

// Elastic jobs across nodes. When an epoch of an elastic job fails (a lost
// rank, a lost node), the job's control links do not close with it: they
// carry the formation of the next epoch. Each node re-forms its part from
// its own survivors (the loop's elastic re-forming) and then sends the coordinator a Join for
// the next epoch on its link, with its survivors' count, or with none when it
// has none left: it leaves the job. The coordinator waits for every node
// whose link is still up, lays the epoch out over the nodes that still have
// ranks, itself first and the others in their old order, and the epoch
// starts as any job does: a fresh generation, so the data engine (the tcp
// engine's rings) is connected anew among those nodes. A node whose link
// breaks while the epoch forms is left out. An epoch that is laid out but
// cannot form (its data engine does not connect, or a node of the layout is
// lost before it formed, e.g. hvdd run's driver stopped its daemon) fails as
// a running epoch does (multiCoord.abort keeps the links, beginNext): its
// ranks, still waiting in init(), are its survivors and wait on
// (the loop's reformUnformed), and the epoch after it forms from them,
// without the nodes that are gone, within the elastic timeout as any.
//
// The coordinator is node 0 at first. When another process serves the
// rendezvous (Config.ExternalRendezvous: hvdd run's elastic driver, hvdd
// rendezvous), the store outlives every node and the coordination can move:
// a node with survivors whose link to the coordinator is gone, and the
// coordinator itself once it knows it has survivors, claim the epoch at the
// rendezvous (an atomic counter: the first claim wins). The winner
// coordinates the epoch and publishes its control address; the others dial
// it and announce themselves; a coordinator left with no rank closes its
// links, so that its followers claim in its stead. A new coordinator expects
// the failed epoch's other nodes to announce themselves within the peer
// timeout, and forms the epoch without those that do not. Should a winner
// vanish before the epoch forms, its followers claim the next round.
// Without an external rendezvous, node 0 serves the store and coordinates
// every epoch: if it has no rank left, or its own survivors time out, the
// other nodes' survivors are told why and the job ends.

// nextEpoch is the next epoch of an elastic job while it forms across nodes.
type nextEpoch struct {
	epoch uint64
	// links are the control links that form the epoch, by the peer's
	// --node-rank: the coordinator's on a follower, the other nodes' on the
	// coordinator, where a nil link is a node expected to announce itself
	// after the coordination moved.
	links map[int]*cluster.Link
	// joins are the nodes' Joins for the epoch (coordinator).
	joins map[int]*clusterpb.Join
	// forming is this node's part of the epoch once it is complete
	// (followers, and a node whose election is under way), waiting for the
	// layout.
	forming *job.Job
	// lost says why the epoch cannot form on this follower (the coordinator
	// ended it, or its link is gone), for the survivors; "" while it can.
	lost string

	// prev are the failed epoch's nodes.
	prev []int
	// ready says that this node has survivors for the epoch (nextReady).
	ready bool
	// round is the election round this node takes part in, electing says
	// its claim is under way, and elected that it got its coordinator from
	// round's election (so that losing it starts the next round).
	round             int
	electing, elected bool
	// won is the round this node won and published, or -1.
	won int
	// deadline ends the wait of a new coordinator for the nodes it expects.
	deadline *time.Timer
	// members is hvdd run's elastic driver's latest decision for the epoch
	// (driven.go); nil until it has decided.
	members *members
}

// holds reports whether link forms the next epoch; n may be nil.
func (n *nextEpoch) holds(link *cluster.Link) bool {
	if n == nil || link == nil {
		return false
	}
	for _, l := range n.links {
		if l == link {
			return true
		}
	}
	return false
}

// Nodes returns the nodes of the next epoch other than the coordinator, in
// order.
func (n *nextEpoch) Nodes() []int { return slices.Sorted(maps.Keys(n.links)) }

// closeLinks stops watching and closes the epoch's links.
func (c *multiNode) closeLinks(n *nextEpoch) {
	for id, link := range n.links {
		if link != nil {
			c.closeLink(link)
		}
		delete(n.links, id)
	}
}

// migratable reports whether an elastic job's coordination can move to
// another node: the rendezvous outlives every node.
func (c *multiNode) migratable() bool {
	return c.cfg.Elastic && c.cfg.ExternalRendezvous && c.cfg.Control == nil
}

// leads reports whether this node coordinates the job.
func (c *multiNode) leads() bool { return c.lead == c.rank }

// beginNext keeps the links of mc's failing elastic epoch for the next one.
func (c *multiNode) beginNext(mc *multiCoord) {
	n := &nextEpoch{epoch: mc.j.Epoch + 1, links: make(map[int]*cluster.Link), joins: make(map[int]*clusterpb.Join),
		prev: slices.Clone(mc.ids), won: -1}
	for at, link := range mc.links {
		if c.isWatched(link) {
			n.links[mc.ids[at]] = link
		}
	}
	if !c.leads() && n.links[c.lead] == nil && !c.migratable() {
		n.lost = fmt.Sprintf("the elastic job cannot form epoch %d on node %d: node %d (the coordinator) was lost", n.epoch, c.rank, c.lead)
	}
	c.next = n
	c.watchMembers(n)
	c.log.Debug("elastic job: the control links form the next epoch", "job", mc.j.ID, "epoch", n.epoch, "links", len(n.links))
}

func (c *multiNode) isWatched(link *cluster.Link) bool {
	for _, w := range c.watched {
		if w.link == link {
			return true
		}
	}
	return false
}

// NextReady is told, once this node's part of a failed epoch has ended, how
// many of its ranks will re-initialise into epoch (formation): none when
// every local rank is gone, or when the node's re-formation gave up (why).
// A follower with none leaves the job; so does a coordinator with none when
// the coordination can move, which otherwise ends the job.
func (c *multiNode) NextReady(epoch uint64, local int, why string) {
	n := c.next
	if n == nil || n.epoch != epoch {
		return
	}
	if local > 0 && n.lost == "" {
		n.ready = true
		if c.migratable() && (c.leads() || n.links[c.lead] == nil) {
			c.elect(n)
		}
		return
	}
	if c.leads() && !c.migratable() {
		if why == "" {
			why = "node 0 (the coordinator) has no surviving ranks, and without an external rendezvous (hvdd serve --rendezvous-external) every epoch of an elastic job across nodes is coordinated by node 0"
		}
		c.abortNext(fmt.Sprintf("the elastic job cannot form epoch %d: %s", epoch, why))
		return
	}
	c.next, c.running = nil, nil
	c.reportEpoch(epoch, nil)
	if n.deadline != nil {
		n.deadline.Stop()
	}
	// At a job's normal end every node's ranks exit: no news.
	logLeave := c.log.Warn
	if why == job.RanksExitedWhy {
		logLeave = c.log.Info
	}
	if c.leads() {
		// Its followers find the link closed and claim the epoch.
		logLeave("elastic job: no rank of this node goes on; it leaves the job, whose coordination moves to another node", "epoch", epoch, "why", why)
		c.lead = -1
		if c.waiting != nil && c.waiting.Epoch == epoch {
			c.waiting = nil
		}
		c.closeLinks(n)
		c.moveJoiners(fmt.Sprintf("node %d left the elastic job it coordinated", c.rank))
		c.void(n)
		return
	}
	if link := n.links[c.lead]; link != nil {
		logLeave("elastic job: no rank of this node goes on; it leaves the job", "epoch", epoch, "why", why)
		link.Send(&clusterpb.Message{Msg: &clusterpb.Message_Join{Join: &clusterpb.Join{
			NodeRank: int32(c.rank), Epoch: epoch, Elastic: true, DataHost: c.host}}})
		c.closeLink(link)
		return
	}
	if local > 0 {
		c.hooks.ReformFailed(epoch, n.lost)
	}
}

// completeEpoch is complete for the next epoch of an elastic job: the
// coordinator waits for the other nodes' Joins, a follower sends its own.
func (c *multiNode) completeEpoch(j *job.Job) {
	n := c.next
	if n == nil || n.epoch != j.Epoch {
		c.hooks.FormFailed(j, fmt.Sprintf("the elastic job cannot form epoch %d on node %d: its control links are gone", j.Epoch, c.rank))
		return
	}
	c.reportEpoch(j.Epoch, workersOf(j))
	if n.electing {
		n.forming = j // the election decides
		return
	}
	if c.leads() {
		c.waiting = j
		c.maybeLayout()
		return
	}
	if n.lost != "" {
		c.next = nil
		c.hooks.FormFailed(j, n.lost)
		return
	}
	n.forming = j
	c.sendJoin(n)
}

// sendJoin sends this node's Join for the forming epoch to the coordinator
// (follower).
func (c *multiNode) sendJoin(n *nextEpoch) {
	link := n.links[c.lead]
	if link == nil {
		return // an election finds the coordinator
	}
	if err := link.Send(c.joinOf(n.forming)); err != nil {
		c.coordLost(n, link, err)
	}
}

// epochMessage handles a message on a link that is not the running epoch's
// business: the formation of an elastic job's next epoch, and what arrives
// on links kept between epochs. It reports false for a message of the
// running epoch.
func (c *multiNode) epochMessage(w *watchedLink, m *clusterpb.Message) bool {
	n := c.next
	switch msg := m.Msg.(type) {
	case *clusterpb.Message_Join:
		c.epochJoin(w, msg.Join)
		return true
	case *clusterpb.Message_Layout:
		if c.leads() || n == nil || n.forming == nil || n.links[c.lead] != w.link {
			c.log.Warn("ignoring a layout that no epoch waits for", "node", w.id)
			return true
		}
		c.next = nil
		c.layout(msgLayout{j: n.forming, link: w.link, layout: msg.Layout})
		return true
	}
	if a := m.GetAbort(); a != nil && n != nil && a.GetEpoch() == n.epoch && !c.leads() && n.links[c.lead] == w.link {
		if a.GetMoved() && c.migratable() {
			// The node chosen to coordinate left before we reached it.
			c.coordLost(n, w.link, errors.New(a.GetMsg()))
			return true
		}
		// The coordinator gave the next epoch up (the failed one may still
		// be ending here).
		c.nextGone(n, a.GetMsg())
		return true
	}
	// What comes on the failed epoch's links once it ended is stale.
	return w.mc == nil || !c.hooks.Current(w.mc.j)
}

// nextGone records on a follower why the next epoch cannot form, and tells
// its survivors if they are back.
func (c *multiNode) nextGone(n *nextEpoch, why string) {
	if link := n.links[c.lead]; link != nil {
		c.closeLink(link)
	}
	delete(n.links, c.lead)
	n.lost, c.running = why, nil
	if n.forming != nil {
		c.next = nil
		c.hooks.ReformFailed(n.epoch, why)
	}
}

// epochJoin takes a node's Join for the next epoch (coordinator).
func (c *multiNode) epochJoin(w *watchedLink, jn *clusterpb.Join) {
	n := c.next
	if !c.leads() || n == nil || n.links[w.id] != w.link || jn.GetEpoch() != n.epoch || int(jn.GetNodeRank()) != w.id {
		want := "none"
		if n != nil {
			want = fmt.Sprint(n.epoch)
		}
		msg := fmt.Sprintf("node %d joined epoch %d of an elastic job on a link that forms %s", jn.GetNodeRank(), jn.GetEpoch(), want)
		c.log.Warn("refusing node", "node", w.id, "reason", msg)
		w.link.Send(abortMsg(ipcpb.Code_CODE_ABORTED, msg, 0))
		c.closeLink(w.link)
		if w.mc != nil {
			w.mc.linkLost(w.node, fmt.Errorf("%s", msg))
		}
		return
	}
	c.takeEpochJoin(n, w.id, w.link, jn)
	c.maybeLayout()
}

// takeEpochJoin records node id's Join for the forming epoch n, which came
// on link (coordinator).
func (c *multiNode) takeEpochJoin(n *nextEpoch, id int, link *cluster.Link, jn *clusterpb.Join) {
	switch {
	case jn.GetAnnounce():
		// Its Join follows.
	case jn.GetSlots() == 0:
		c.log.Warn("elastic job: a node has no surviving ranks; the next epoch forms without it", "node", id, "epoch", n.epoch)
		delete(n.links, id)
		c.closeLink(link)
	default:
		n.joins[id] = jn
	}
}

// epochDialIn takes a node that dialled in to join the forming epoch after
// an election (coordinator): its first message, an announcement or a Join.
func (c *multiNode) epochDialIn(nj nodeJoin) {
	n, id := c.next, int(nj.join.GetNodeRank())
	refuseAs := func(moved bool, msg string) {
		c.log.Warn("refusing node", "node", id, "reason", msg)
		a := abortMsg(ipcpb.Code_CODE_ABORTED, msg, nj.join.GetEpoch())
		a.GetAbort().Moved = moved
		nj.link.Send(a)
		nj.link.Close()
	}
	refuse := func(msg string) { refuseAs(false, msg) }
	switch {
	case c.lead < 0:
		// This node left the job after it won the claim: the nodes that
		// found it there claim the next round.
		refuseAs(true, fmt.Sprintf("node %d left the elastic job, whose epoch %d node %d joined: another node coordinates it", c.rank, nj.join.GetEpoch(), id))
		return
	case n == nil || n.epoch != nj.join.GetEpoch():
		refuse(fmt.Sprintf("node %d joined epoch %d of the elastic job, which node %d does not form (it formed without node %d, or the job is over)", id, nj.join.GetEpoch(), c.rank, id))
		return
	case !c.leads() && n.electing:
		c.held = append(c.held, nj) // see multiNode.held
		return
	case !c.leads():
		// It found this node's name for a round this node did not win in
		// the end (waitWinner) or no longer coordinates: as moved, so that
		// it claims the next round, which leads it to the coordinator.
		refuseAs(true, fmt.Sprintf("node %d joined epoch %d of the elastic job at node %d, which does not coordinate it", id, n.epoch, c.rank))
		return
	case !slices.Contains(n.prev, id) || id == c.rank:
		refuse(fmt.Sprintf("node %d was not in epoch %d of the elastic job, so it cannot form the next one", id, n.epoch-1))
		return
	}
	if old := n.links[id]; old != nil {
		c.closeLink(old)
		delete(n.joins, id)
	}
	n.links[id] = nj.link
	c.takeEpochJoin(n, id, nj.link, nj.join)
	if n.links[id] == nil {
		c.maybeLayout()
		return
	}
	// Watching reads what followed the first message.
	if err := c.watch(nil, -1, id, nj.link); err != nil {
		c.log.Warn("elastic job: a node that joined the next epoch is not watched", "node", id, "err", err)
		delete(n.links, id)
		delete(n.joins, id)
		nj.link.Close()
	}
	c.maybeLayout()
}

// nextLost drops a node whose link broke from the forming epoch.
func (c *multiNode) nextLost(w *watchedLink, err error) {
	n := c.next
	if n == nil || n.links[w.id] != w.link {
		return
	}
	if !c.leads() {
		c.coordLost(n, w.link, err)
		return
	}
	w.link.Close()
	c.log.Warn("elastic job: a node was lost; the next epoch forms without it", "node", w.id, "epoch", n.epoch, "err", err)
	delete(n.links, w.id)
	delete(n.joins, w.id)
	c.maybeLayout()
}

// coordLost handles the loss of the coordinator's link while the next epoch
// forms (follower): the coordination moves, or the epoch is lost.
func (c *multiNode) coordLost(n *nextEpoch, link *cluster.Link, err error) {
	if !c.migratable() {
		c.nextGone(n, fmt.Sprintf("the elastic job cannot form epoch %d on node %d: node %d (the coordinator) was lost: %v", n.epoch, c.rank, c.lead, err))
		return
	}
	c.log.Warn("elastic job: the coordinator of the next epoch was lost; another node takes over", "coordinator", c.lead, "epoch", n.epoch, "err", err)
	c.closeLink(link)
	delete(n.links, c.lead)
	if n.elected {
		n.round++
		n.elected = false
	}
	if n.ready {
		c.elect(n)
	}
}

// abortNext ends the forming epoch on every node (coordinator).
func (c *multiNode) abortNext(msg string) {
	n := c.next
	c.next, c.running = nil, nil
	if n.deadline != nil {
		n.deadline.Stop()
	}
	c.log.Error("elastic job ends", "epoch", n.epoch, "err", msg)
	a := abortMsg(ipcpb.Code_CODE_ABORTED, msg, n.epoch)
	for _, link := range n.links {
		if link != nil {
			link.Send(a)
		}
	}
	c.closeLinks(n)
	if j := c.waiting; j != nil && j.Epoch == n.epoch {
		c.waiting = nil
	}
	c.hooks.ReformFailed(n.epoch, msg) // fails our forming part, if any
}

// moveJoiners sends the nodes waiting to join the running elastic job at
// this node, which no longer coordinates it (why), to the coordinator
// registered at the rendezvous: a refusal marked moved makes them dial it
// anew (joinCoordinator).
func (c *multiNode) moveJoiners(why string) {
	for _, id := range c.elasticJoins() {
		nj := c.joins[id]
		delete(c.joins, id)
		c.log.Warn("a node waiting to join the elastic job goes to its new coordinator", "node", id, "why", why)
		a := abortMsg(ipcpb.Code_CODE_ABORTED, why+"; dial the coordinator registered at the rendezvous", 0)
		a.GetAbort().Moved = true
		nj.link.Send(a)
		c.closeLink(nj.link)
	}
}
