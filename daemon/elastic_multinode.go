package daemon

import (
	"fmt"
	"maps"
	"slices"

	"github.com/hvdd/hvdd/cluster"
	"github.com/hvdd/hvdd/cluster/clusterpb"
	"github.com/hvdd/hvdd/ipc/ipcpb"
)

// Elastic jobs across nodes. When an epoch of an elastic job fails (a lost
// rank, a lost node), the job's control links do not close with it: they
// carry the formation of the next epoch. Each node re-forms its part from
// its own survivors (elastic.go) and then sends node 0 a Join for the next
// epoch on its link, with its survivors' count, or with none when it has
// none left: it leaves the job. Node 0 (the coordinator) waits for every node
// whose link is still up, lays the epoch out over the nodes that still have
// ranks, in their old order, and the epoch starts as any job does: a fresh
// generation, so the data engine (the tcp engine's rings) is connected anew
// among those nodes. A node whose link breaks while the epoch forms is left
// out. Node 0 coordinates every epoch, so it must keep a rank: if it has none
// left, or its own survivors time out, the other nodes' survivors are told
// why and the job ends.

// nextEpoch is the next epoch of an elastic job while it forms across nodes.
type nextEpoch struct {
	epoch uint64
	// links are the control links that outlived the failed epoch, by the
	// peer's --node-rank: node 0's on a follower, the other nodes' on node 0.
	links map[int]*cluster.Link
	// joins are the nodes' Joins for the epoch (node 0).
	joins map[int]*clusterpb.Join
	// forming is this node's part of the epoch once it sent its Join
	// (followers), waiting for the layout.
	forming *job
	// lost says why the epoch cannot form on this follower (node 0 ended it,
	// or its link is gone), for the survivors; "" while it can.
	lost string
}

// holds reports whether link forms the next epoch; n may be nil.
func (n *nextEpoch) holds(link *cluster.Link) bool {
	if n == nil {
		return false
	}
	for _, l := range n.links {
		if l == link {
			return true
		}
	}
	return false
}

// nodes returns the nodes of the next epoch other than node 0, in order.
func (n *nextEpoch) nodes() []int { return slices.Sorted(maps.Keys(n.links)) }

// beginNext keeps the links of mc's failing elastic epoch for the next one.
func (c *multiNode) beginNext(mc *multiCoord) {
	n := &nextEpoch{epoch: mc.j.members.epoch + 1, links: make(map[int]*cluster.Link), joins: make(map[int]*clusterpb.Join)}
	for at, link := range mc.links {
		if c.isWatched(link) {
			n.links[mc.ids[at]] = link
		}
	}
	if c.rank != 0 && n.links[0] == nil {
		n.lost = fmt.Sprintf("the elastic job cannot form epoch %d on node %d: node 0 (the coordinator) was lost", n.epoch, c.rank)
	}
	c.next = n
	c.log.Debug("elastic job: the control links form the next epoch", "job", mc.j.id, "epoch", n.epoch, "links", len(n.links))
}

func (c *multiNode) isWatched(link *cluster.Link) bool {
	for _, w := range c.watched {
		if w.link == link {
			return true
		}
	}
	return false
}

// nextReady is told, once this node's part of a failed epoch has ended, how
// many of its ranks will re-initialise into epoch (formation): none when
// every local rank is gone, or when the node's re-formation gave up (why).
// A follower with none leaves the job; node 0 with none ends it.
func (c *multiNode) nextReady(epoch uint64, local int, why string) {
	n := c.next
	if n == nil || n.epoch != epoch || local > 0 && n.lost == "" {
		return
	}
	if c.rank == 0 {
		if why == "" {
			why = "node 0 (the coordinator) has no surviving ranks, and every epoch of an elastic job across nodes is coordinated by node 0"
		}
		c.abortNext(fmt.Sprintf("the elastic job cannot form epoch %d: %s", epoch, why))
		return
	}
	c.next = nil
	if link := n.links[0]; link != nil {
		c.log.Warn("elastic job: no rank of this node goes on; it leaves the job", "epoch", epoch, "why", why)
		link.Send(&clusterpb.Message{Msg: &clusterpb.Message_Join{Join: &clusterpb.Join{
			NodeRank: int32(c.rank), Epoch: epoch, Elastic: true, DataHost: c.host}}})
		c.closeLink(link)
		return
	}
	if local > 0 {
		c.hooks.reformFailed(epoch, n.lost)
	}
}

// completeEpoch is complete for the next epoch of an elastic job: node 0
// waits for the other nodes' Joins, a follower sends its own.
func (c *multiNode) completeEpoch(j *job) {
	n := c.next
	if n == nil || n.epoch != j.epoch {
		c.hooks.formFailed(j, fmt.Sprintf("the elastic job cannot form epoch %d on node %d: its control links are gone", j.epoch, c.rank))
		return
	}
	if c.rank == 0 {
		c.waiting = j
		c.maybeLayout()
		return
	}
	if n.lost != "" {
		c.next = nil
		c.hooks.formFailed(j, n.lost)
		return
	}
	if err := n.links[0].Send(c.joinOf(j)); err != nil {
		c.next = nil
		c.closeLink(n.links[0])
		c.hooks.formFailed(j, fmt.Sprintf("the elastic job cannot form epoch %d on node %d: node 0 (the coordinator) was lost: %v", j.epoch, c.rank, err))
		return
	}
	n.forming = j
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
		if c.rank == 0 || n == nil || n.forming == nil || n.links[0] != w.link {
			c.log.Warn("ignoring a layout that no epoch waits for", "node", w.id)
			return true
		}
		c.next = nil
		c.layout(msgLayout{j: n.forming, link: w.link, layout: msg.Layout})
		return true
	}
	if a := m.GetAbort(); a != nil && n != nil && a.GetEpoch() == n.epoch && c.rank != 0 && n.links[0] == w.link {
		// Node 0 gave the next epoch up (the failed one may still be
		// ending here).
		c.nextGone(n, a.GetMsg())
		return true
	}
	// What comes on the failed epoch's links once it ended is stale.
	return w.mc == nil || !c.hooks.current(w.mc.j)
}

// nextGone records on a follower why the next epoch cannot form, and tells
// its survivors if they are back.
func (c *multiNode) nextGone(n *nextEpoch, why string) {
	if link := n.links[0]; link != nil {
		n.links[0] = nil
		c.closeLink(link)
	}
	n.lost = why
	if n.forming != nil {
		c.next = nil
		c.hooks.reformFailed(n.epoch, why)
	}
}

// epochJoin takes a node's Join for the next epoch (node 0).
func (c *multiNode) epochJoin(w *watchedLink, jn *clusterpb.Join) {
	n := c.next
	if c.rank != 0 || n == nil || n.links[w.id] != w.link || jn.GetEpoch() != n.epoch || int(jn.GetNodeRank()) != w.id {
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
	if jn.GetSlots() == 0 {
		c.log.Warn("elastic job: a node has no surviving ranks; the next epoch forms without it", "node", w.id, "epoch", n.epoch)
		delete(n.links, w.id)
		c.closeLink(w.link)
	} else {
		n.joins[w.id] = jn
	}
	c.maybeLayout()
}

// nextLost drops a node whose link broke from the forming epoch.
func (c *multiNode) nextLost(w *watchedLink, err error) {
	n := c.next
	if n == nil || n.links[w.id] != w.link {
		return
	}
	if c.rank != 0 {
		c.nextGone(n, fmt.Sprintf("the elastic job cannot form epoch %d on node %d: node 0 (the coordinator) was lost: %v", n.epoch, c.rank, err))
		return
	}
	w.link.Close()
	c.log.Warn("elastic job: a node was lost; the next epoch forms without it", "node", w.id, "epoch", n.epoch, "err", err)
	delete(n.links, w.id)
	delete(n.joins, w.id)
	c.maybeLayout()
}

// abortNext ends the forming epoch on every node (node 0).
func (c *multiNode) abortNext(msg string) {
	n := c.next
	c.next = nil
	c.log.Error("elastic job ends", "epoch", n.epoch, "err", msg)
	a := abortMsg(ipcpb.Code_CODE_ABORTED, msg, n.epoch)
	for _, link := range n.links {
		link.Send(a)
		c.closeLink(link)
	}
	if j := c.waiting; j != nil && j.epoch == n.epoch {
		c.waiting = nil
	}
	c.hooks.reformFailed(n.epoch, msg) // fails our forming part, if any
}
