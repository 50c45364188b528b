package nodes

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/hvdd/hvdd/cluster"
	"github.com/hvdd/hvdd/cluster/clusterpb"
	"github.com/hvdd/hvdd/daemon/internal/job"
	"github.com/hvdd/hvdd/rendezvous"
)

// Choosing the coordinator of an elastic job's next epoch at the rendezvous,
// when the coordination can move (elastic_multinode.go). Every node that
// may coordinate keeps a control listener open from its start. Round r of
// epoch e has four keys:
//   - "elastic/e/r/claim", a counter every claimant adds 1 to: the one that
//     reads 1 won the claim;
//   - "elastic/e/r/addr", where the winner names itself ("NODE ADDR": its
//     --node-rank and control address) before it seals;
//   - "elastic/e/r/seal", a counter that decides the round once: the
//     winner adds 1 before it publishes, and a claimant that waited a peer
//     timeout for the publication adds 1 too. Whoever reads 1 decides: the
//     winner coordinates, or the waiter voids the round (the winner, slow
//     or dead, then reads 2 and takes part in the next round as the others);
//   - "elastic/e/r", where the winner publishes its "NODE ADDR", or the
//     waiter that voided the round "", as does a winner that left before
//     the epoch formed.
//
// A waiter that reads 2 or more from the seal waits no more: what it would
// wait for may only come from a node that is lost (a winner lost between
// its seal and its publication, or a waiter lost between its seal and its
// void). The store decides instead: the publication if there is one; else
// the winner's name, written before it sealed, which the waiter dials (a
// lost winner cannot be reached, a live one coordinates or refuses the
// dial as moved); else nothing: the winner never sealed, so a waiter did,
// and the round is void. A void round, or a winner that cannot be reached,
// sends the claimants to round r+1.
// Messages of an election.
type (
	msgElected struct {
		epoch uint64
		round int
		err   error
		won   bool
		// The winner, when another node won; link is nil when this node
		// could not reach it (dialErr) or it had left (void).
		lead    int
		link    *cluster.Link
		dialErr error
		void    bool
	}
	msgElectDeadline struct{ n *nextEpoch }
)

// maxRounds bounds the elections of one epoch: each round's winner left or
// could not be reached.
const maxRounds = 8

func electionKey(epoch uint64, round int) string {
	return "elastic/" + strconv.FormatUint(epoch, 10) + "/" + strconv.Itoa(round)
}

// elect claims the coordination of n's epoch at the rendezvous, on a
// goroutine of its own; msgElected brings the outcome.
func (c *multiNode) elect(n *nextEpoch) {
	if n.electing {
		return
	}
	if n.round >= maxRounds {
		c.nextGone(n, fmt.Sprintf("the elastic job cannot form epoch %d on node %d: %d coordinators in a row were lost before it formed", n.epoch, c.rank, n.round))
		return
	}
	n.electing = true
	epoch, round, who := n.epoch, n.round, "node "+strconv.Itoa(c.rank)
	announce := &clusterpb.Message{Msg: &clusterpb.Message_Join{Join: &clusterpb.Join{
		NodeRank: int32(c.rank), Epoch: epoch, Elastic: true, DataHost: c.host, Announce: true}}}
	c.log.Debug("elastic job: claiming the coordination of the next epoch", "epoch", epoch, "round", round)
	addr := c.ctrl.Addr() // open since the daemon started (migratable)
	go func() {
		res := msgElected{epoch: epoch, round: round}
		defer func() { c.p.Post(res) }()
		ctx, cancel := context.WithTimeout(c.life, c.cfg.StartTimeout)
		defer cancel()
		key := electionKey(epoch, round)
		v, err := c.store.Add(ctx, key+"/claim", 1)
		if err != nil {
			res.err = err
			return
		}
		if v == 1 {
			record := strconv.Itoa(c.rank) + " " + addr
			// Named before the seal: a waiter that finds the round sealed
			// without a publication dials this node (waitWinner).
			if res.err = c.publish(ctx, key+"/addr", record); res.err != nil {
				return
			}
			sealed, err := c.store.Add(ctx, key+"/seal", 1)
			switch {
			case err != nil:
				res.err = err
			case sealed != 1:
				res.void = true // a waiter gave up on this node's win
			default:
				res.err = c.publish(ctx, key, record)
				if res.err == nil {
					// Nodes that join the job later dial the coordinator here.
					res.err = c.publish(ctx, "coordinator", addr)
				}
				res.won = res.err == nil
			}
			return
		}
		kv, err := c.waitWinner(ctx, key)
		if err != nil || kv == nil {
			res.err, res.void = err, err == nil
			return
		}
		if _, err := fmt.Sscan(string(kv[key]), &res.lead, &addr); err != nil {
			res.void = true
			return
		}
		dctx, dcancel := context.WithTimeout(ctx, c.ccfg.PeerTimeout)
		defer dcancel()
		link, err := cluster.Dial(dctx, addr, c.ccfg, who)
		if err == nil && !c.joining.Add(link) {
			// The daemon closed meanwhile; closeAll closes what it holds.
			link.Close()
			err = errors.New("the daemon is shutting down")
		}
		if err == nil {
			if err = link.Send(announce); err != nil {
				c.joining.remove(link)
				link.Close()
			}
		}
		if err != nil {
			res.dialErr = err
			return
		}
		res.link = link
	}()
}

// waitWinner waits for the publication of round key's winner and returns
// it (under key; "" from a winner that withdrew or a waiter that voided the
// round), or nil, nil when this claimant voids the round. After a peer
// timeout without it, it seals the round: first to seal, it voids the
// round and publishes so; else it waits no more and returns what the
// store holds (see the top of this file): the publication, the winner's
// name, or nil, nil when the winner never sealed.
func (c *multiNode) waitWinner(ctx context.Context, key string) (map[string][]byte, error) {
	wctx, cancel := context.WithTimeout(ctx, c.ccfg.PeerTimeout)
	kv, err := c.store.Wait(wctx, key)
	cancel()
	if err == nil || ctx.Err() != nil {
		return kv, err
	}
	sealed, err := c.store.Add(ctx, key+"/seal", 1)
	if err != nil {
		return nil, err
	}
	if sealed == 1 {
		// The other waiters see the round void at once, not after their
		// own peer timeout.
		if err := c.store.Set(ctx, key, nil); err != nil {
			c.log.Warn("elastic job: cannot publish the void round at the rendezvous", "key", key, "err", err)
		}
		return nil, nil
	}
	for _, k := range []string{key, key + "/addr"} {
		v, err := c.store.Get(ctx, k)
		switch {
		case err == nil:
			return map[string][]byte{key: v}, nil
		case !errors.Is(err, rendezvous.ErrNotFound):
			return nil, err
		}
	}
	return nil, nil // a waiter sealed first, and the winner never sealed
}

// elected acts on the outcome of this node's claim.
func (c *multiNode) elected(m msgElected) {
	// The nodes that dialled in while the claim was in flight, now that its
	// outcome is known (or another claim is in flight again: held again).
	defer func() {
		held := c.held
		c.held = nil
		for _, nj := range held {
			c.epochDialIn(nj)
		}
	}()
	if m.link != nil {
		c.joining.remove(m.link) // the loop's now
	}
	n := c.next
	if n == nil || n.epoch != m.epoch || n.round != m.round || !n.electing {
		if m.link != nil {
			m.link.Close()
		}
		if m.won {
			// This node left before it could coordinate.
			c.void(&nextEpoch{epoch: m.epoch, won: m.round})
		}
		return
	}
	n.electing = false
	switch {
	case m.err != nil:
		c.nextGone(n, fmt.Sprintf("the elastic job cannot form epoch %d on node %d: its coordinator could not be chosen at the rendezvous %s: %v", n.epoch, c.rank, c.cfg.Rendezvous, m.err))
	case m.won:
		c.takeLead(n)
	case m.void || m.dialErr != nil:
		c.log.Warn("elastic job: the node chosen to coordinate the next epoch is gone; claiming again", "node", m.lead, "epoch", n.epoch, "round", n.round, "err", m.dialErr)
		n.round++
		c.elect(n)
	default:
		c.follow(n, m.lead, m.link)
	}
}

// takeLead makes this node the coordinator of n's epoch, which it won.
func (c *multiNode) takeLead(n *nextEpoch) {
	old := c.lead
	c.lead, n.won = c.rank, n.round
	if old != c.rank {
		// The failed epoch's other nodes are expected to announce
		// themselves; those that do not in time are left out.
		for _, id := range n.prev {
			if _, ok := n.links[id]; !ok && id != old && id != c.rank {
				n.links[id] = nil
			}
		}
		n.deadline = time.AfterFunc(c.ccfg.PeerTimeout, func() { c.p.Post(msgElectDeadline{n}) })
		c.log.Warn("elastic job: this node coordinates the job from now on", "epoch", n.epoch, "was", old, "expects", n.Nodes())
	}
	if j := n.forming; j != nil {
		n.forming = nil
		c.waiting = j
	}
	c.maybeLayout()
}

// follow makes the node that won n's epoch, on link, this node's
// coordinator.
func (c *multiNode) follow(n *nextEpoch, lead int, link *cluster.Link) {
	if c.leads() {
		// This coordinator lost the claim to a node cut off from it: its
		// followers find their links closed and claim in turn, which leads
		// them to the winner.
		c.log.Warn("elastic job: another node took over the coordination", "node", lead, "epoch", n.epoch)
		c.closeLinks(n)
		c.moveJoiners(fmt.Sprintf("node %d lost the coordination of the elastic job to node %d", c.rank, lead))
		if j := c.waiting; j != nil && j.Epoch == n.epoch {
			c.waiting, n.forming = nil, j
		}
	}
	c.log.Debug("elastic job: following the node that won the claim", "node", lead, "epoch", n.epoch, "round", n.round)
	c.lead, n.elected = lead, true
	n.links[lead] = link
	if err := c.watch(nil, -1, lead, link); err != nil {
		c.coordLost(n, link, err)
		return
	}
	if n.forming != nil {
		c.sendJoin(n)
	}
}

// void withdraws this node's win of n's epoch, for a node leaving the job:
// the nodes waiting for the winner claim the next round.
func (c *multiNode) void(n *nextEpoch) {
	if n.won < 0 {
		return
	}
	key := electionKey(n.epoch, n.won)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), c.cfg.StartTimeout)
		defer cancel()
		if err := c.store.Set(ctx, key, nil); err != nil {
			c.log.Warn("elastic job: cannot withdraw this node from coordinating the next epoch", "key", key, "err", err)
		}
	}()
}

// electDeadline forms the epoch without the nodes that did not announce
// themselves to its new coordinator in time.
func (c *multiNode) electDeadline(n *nextEpoch) {
	if c.next != n || !c.leads() {
		return
	}
	for _, id := range n.Nodes() {
		if n.links[id] == nil {
			c.log.Warn("elastic job: a node did not reach the new coordinator in time; the next epoch forms without it", "node", id, "epoch", n.epoch, "waited", c.ccfg.PeerTimeout)
			delete(n.links, id)
		}
	}
	c.maybeLayout()
}

// reclaim makes node 0 coordinate again once the elastic job it left, whose
// coordination moved, is over: j is its next job.
func (c *multiNode) reclaim(j *job.Job) {
	c.lead = 0
	c.log.Warn("this node coordinates again: the elastic job whose coordination moved to another node is over")
	addr := c.ctrl.Addr()
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), c.cfg.StartTimeout)
		defer cancel()
		if err := c.publish(ctx, "coordinator", addr); err != nil {
			c.p.Post(msgLayout{j: j, err: err})
		}
	}()
	c.waiting = j
	c.maybeLayout()
}
