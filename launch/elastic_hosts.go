package launch

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// How the elastic driver changes the job's hosts and ranks: reconcile
// compares what the hosts offer (discovery less the blacklist) with the
// ranks that run, and starts or stops ranks and daemons to match.

// reconcile brings the ranks in line with the available hosts: hosts back
// from their cooldown, hosts added, grown, shrunk or gone. Every call that
// changes the ranks is one reset of the job (Horovod counts a reset per
// host update, and per failure).
func (drv *driver) reconcile() {
	if drv.state != jobRunning || drv.finishing {
		return
	}
	j, cfg := drv.j, drv.j.cfg
	for _, h := range drv.hm.expire() {
		j.o.logf("host %s's blacklisting is over (its cooldown ended)", h)
	}
	drv.retireUndiscovered()
	avail := drv.hm.available()
	running := drv.perHost()
	target := assign(avail, running, cfg.MaxNP)

	var grow, shrink []string
	for _, h := range avail {
		if target[h.Name] > running[h.Name] {
			grow = append(grow, h.Name)
		}
	}
	keep := 0
	for _, h := range slices.Sorted(maps.Keys(running)) {
		if target[h] < running[h] {
			shrink = append(shrink, h)
		}
		keep += min(running[h], target[h])
	}
	if len(grow) == 0 && len(shrink) == 0 {
		drv.checkMin()
		return
	}
	if keep == 0 {
		// Horovod: new ranks get the job's state from running ones.
		drv.fail(drv.lastFail, errors.New("No hosts from previous set remaining, unable to broadcast state. (The hosts now are "+hostList(avail)+"; none of them runs a rank of the job.)"))
		return
	}
	if limit := cfg.ResetLimit; limit > 0 && drv.resets >= limit {
		drv.fail(drv.lastFail, fmt.Errorf(resetLimitMessage, limit))
		return
	}
	drv.resets++
	for _, h := range shrink {
		drv.shrink(h, running[h]-target[h], target[h] == 0)
	}
	for _, h := range grow {
		drv.grow(h, target[h]-running[h])
	}
	drv.checkMin()
}

// grow starts k more ranks on host: on its current node, or on a new node
// whose daemon is started first.
func (drv *driver) grow(host string, k int) {
	j := drv.j
	i, ok := drv.current[host]
	if !ok {
		drv.addHost(host, k)
		return
	}
	if n := &drv.nodes[i]; !n.ready {
		n.reserved += k
		j.o.logf("%s more for %s once its daemon is ready (reset %d)", ranks(k), host, drv.resets)
		return
	}
	j.o.logf("starting %s more on %s (reset %d)", ranks(k), host, drv.resets)
	drv.startRanksOn(i, k)
}

// addHost starts a daemon on host, a new node, to run k ranks once ready.
func (drv *driver) addHost(host string, k int) {
	j, cfg := drv.j, drv.j.cfg
	if drv.path == "" && j.isLocal(host) {
		path, _, err := lookCommand(cfg)
		if err != nil {
			cool := drv.hm.blacklistHost(host)
			j.o.logf("%v; blacklisting host %s, which is this machine, %s", err, host, cooldownPhrase(cool))
			return
		}
		drv.path = path
	}
	i := drv.addNode(host, k)
	drv.nodes[i].reserved = k
	j.o.logf("host %s joins the elastic job: starting its hvdd daemon (node %d) for %s (reset %d)", host, i, ranks(k), drv.resets)
	d, err := j.startDaemon(i)
	if err != nil {
		cool := drv.hm.blacklistHost(host)
		j.o.logf("%v; blacklisting host %s %s", err, host, cooldownPhrase(cool))
		drv.retire(i)
		return
	}
	j.daemons = append(j.daemons, d)
	drv.nodes[i].d = d
	drv.watchDaemon(d)
	n, deadline := j.nodes[i], time.Now().Add(cfg.StartTimeout)
	go func() {
		err := j.waitReady(drv.ctx, d, n, deadline)
		select {
		case drv.readyC <- readyEvent{i, err}:
		case <-drv.quit:
		}
	}()
}

// shrink stops k ranks of host (reserved ones first, then the newest), or,
// when gone is set, retires its node: its daemon is told that the host has
// been removed, and its ranks leave at their next reset (removeNode; they
// are stopped only if that fails).
func (drv *driver) shrink(host string, k int, gone bool) {
	j := drv.j
	i := drv.current[host]
	slots := drv.hm.slots(host)
	usable := drv.hm.usable(Host{host, slots})
	var why string
	switch {
	case slots == 0:
		why = "is no longer discovered"
	case j.cfg.MaxNP > 0 && usable > 0:
		why = fmt.Sprintf("gives its slots to older hosts (--max-np %d)", j.cfg.MaxNP)
	default:
		why = fmt.Sprintf("has %d usable slots now", usable)
	}
	if gone {
		live := drv.nodeRanks(i)
		if len(live) > 0 {
			err := drv.removeNode(i)
			if err == nil {
				j.o.logf("host %s %s: telling its daemon (node %d) that the host has been removed from the elastic job; its ranks (%s) leave the job at their next reset (reset %d)", host, why, i, tagList(live), drv.resets)
				return
			}
			j.o.logf("host %s %s: cannot tell its daemon (node %d) that the host has been removed: %v", host, why, i, err)
		}
		j.o.logf("host %s %s: stopping its ranks (%s) (reset %d)", host, why, tagList(live), drv.resets)
		drv.retire(i)
		return
	}
	n := &drv.nodes[i]
	r := min(n.reserved, k)
	n.reserved -= r
	k -= r
	live := drv.nodeRanks(i)
	stop := live[max(len(live)-k, 0):]
	j.o.logf("host %s %s: stopping %s (%s) (reset %d)", host, why, ranks(len(stop)), tagList(stop), drv.resets)
	for _, tag := range stop {
		drv.stopRank(tag)
	}
}

// removeNode takes node i, whose ranks run, out of the job the way
// Horovod removes a host: rather than stopping its ranks (which the others
// would see as lost, restoring their last commit), it tells the node's
// daemon through the job's rendezvous store (removedKey) that its host has
// been removed. The daemon notifies global rank 0, every rank resets at
// the same commit, and the daemon then refuses its own ranks'
// re-initialisation ("<host>[<local_rank>] has been removed from elastic
// job"), so they exit and the others re-form without them, losing nothing.
//
// From now on the node is retired: its ranks leave (their exits are
// expected, whatever their status) and no longer count as the job's, and
// its daemon is stopped once they have all exited. Ranks still running
// --elastic-timeout after the notice are stopped (stopLeavers).
func (drv *driver) removeNode(i int) error {
	j := drv.j
	if j.rdv == nil {
		return errors.New("the driver serves no rendezvous")
	}
	if err := j.rdv.srv.Store().Set(drv.ctx, removedKey(i), []byte(j.nodes[i].Host)); err != nil {
		return fmt.Errorf("set %s in the job's rendezvous: %w", removedKey(i), err)
	}
	drv.nodes[i].removedAt = time.Now()
	for _, tag := range drv.nodeRanks(i) {
		drv.ranks[tag].leaving = true
	}
	drv.retire(i) // stops none of them: they are leaving
	return nil
}

// stopLeavers stops the ranks of removed hosts still running
// --elastic-timeout after their daemon was told (removeNode): they did not
// take the removal in (their daemon may predate it, or they no longer
// commit).
func (drv *driver) stopLeavers() {
	if drv.state != jobRunning {
		return
	}
	j := drv.j
	for i := range drv.nodes {
		n := &drv.nodes[i]
		if n.removedAt.IsZero() || time.Since(n.removedAt) < drv.timeout {
			continue
		}
		var stop []int
		for tag, r := range drv.ranks {
			if r.node == i && r.leaving && !r.stopping && !j.exited[tag] {
				stop = append(stop, tag)
			}
		}
		if len(stop) == 0 {
			continue
		}
		j.o.logf("the ranks of host %s (%s) still run %v (--elastic-timeout) after its daemon (node %d) was told that the host has been removed from the elastic job; stopping them",
			j.nodes[i].Host, tagList(stop), drv.timeout, i)
		for _, tag := range stop {
			drv.stopRank(tag)
		}
	}
}

// retireUndiscovered retires the nodes whose host is no longer discovered
// and runs no rank (none to stop: no reset).
func (drv *driver) retireUndiscovered() {
	for host, i := range drv.current {
		if drv.hm.slots(host) == 0 && len(drv.nodeRanks(i)) == 0 && drv.nodes[i].reserved == 0 {
			drv.retire(i)
		}
	}
}

// startRanksOn starts k ranks on node i, whose daemon is ready. They join
// the running job: the daemon tells rank 0, and every rank takes them in
// at its next commit. Their rank variables are where Horovod's assignment
// puts them; HVDD_LOCAL_RANK is -1 (any), the daemon picks.
func (drv *driver) startRanksOn(i, k int) {
	j, cfg := drv.j, drv.j.cfg
	host := j.nodes[i].Host
	avail := drv.hm.available()
	running := drv.perHost()
	have := running[host]
	running[host] += k
	infos := slotInfos(avail, assign(avail, running, cfg.MaxNP))[host]
	var started []int
	var failed error
	for x := range k {
		s := slotInfo{rank: -1, size: -1, local: have + x, localSize: have + k, cross: -1, crossSize: -1}
		if have+x < len(infos) {
			s = infos[have+x]
		}
		tag := len(j.workers)
		if err := j.startRankAs(drv.path, i, tag, j.rankVars(i, s, "-1")); err != nil {
			failed = err
			break
		}
		drv.ranks = append(drv.ranks, driverRank{node: i})
		started = append(started, tag)
	}
	if len(started) > 0 {
		j.o.logf("started %s on %s: %s", ranks(len(started)), host, tagList(started))
	}
	if failed != nil {
		// A worker that cannot start is a failed one: its host is
		// blacklisted (the next look at the hosts makes up for it).
		cool, stopped := drv.blacklistFailedHost(i)
		j.o.logf("start a rank on %s: %v; check that the command exists and is executable there; %s", host, failed, blacklistedFailedPhrase(host, cool, stopped))
		if drv.hm.allBlacklisted() {
			drv.fail(drv.lastFail, errors.New(drv.allBlacklistedMessage()))
			return
		}
	}
	drv.checkMin()
}

// stopRank asks rank tag to stop: SIGTERM, or its agent's stdin closed.
func (drv *driver) stopRank(tag int) {
	r := &drv.ranks[tag]
	if r.stopping || drv.j.exited[tag] {
		return
	}
	r.stopping, r.stopAt = true, time.Now()
	drv.j.signalRanks(tag, tag+1, syscall.SIGTERM)
}

// retire takes node i out of the job: it gets no more ranks, its ranks are
// stopped (but those leaving: they exit on their own), and its daemon is
// stopped once they have exited (node 0's too: the other daemons move the
// job's coordination).
func (drv *driver) retire(i int) {
	n := &drv.nodes[i]
	n.retired, n.reserved = true, 0
	host := drv.j.nodes[i].Host
	if c, ok := drv.current[host]; ok && c == i {
		delete(drv.current, host)
	}
	for _, tag := range drv.nodeRanks(i) {
		drv.stopRank(tag)
	}
	drv.retireDaemons()
}

// retireDaemons stops the daemons of retired nodes whose ranks have all
// exited.
func (drv *driver) retireDaemons() {
	grace := drv.j.cfg.KillGrace
	for i := range drv.nodes {
		n := &drv.nodes[i]
		if !n.retired || n.stopped || n.dead || n.d == nil || drv.nodeAlive(i) {
			continue
		}
		n.stopped = true
		go n.d.stop(grace)
	}
}

// nodeRanks returns the tags of node i's ranks that run and are neither
// stopping nor leaving.
func (drv *driver) nodeRanks(i int) []int {
	var tags []int
	for tag, r := range drv.ranks {
		if r.node == i && !r.stopping && !r.leaving && !drv.j.exited[tag] {
			tags = append(tags, tag)
		}
	}
	return tags
}

// nodeAlive reports whether a rank of node i has not exited yet.
func (drv *driver) nodeAlive(i int) bool {
	for tag, r := range drv.ranks {
		if r.node == i && !drv.j.exited[tag] {
			return true
		}
	}
	return false
}

// perHost counts, per host, the ranks on its current node that go on:
// running and not stopping, and those reserved for its daemon.
func (drv *driver) perHost() map[string]int {
	running := map[string]int{}
	for host, i := range drv.current {
		if n := len(drv.nodeRanks(i)) + drv.nodes[i].reserved; n > 0 {
			running[host] = n
		}
	}
	return running
}

// live counts the ranks that go on, and those about to start.
func (drv *driver) live() int {
	n := 0
	for _, k := range drv.perHost() {
		n += k
	}
	return n
}

// checkMin starts the wait of --elastic-timeout when fewer than --min-np
// ranks go on (Horovod's wait_for_available_slots), ends it when enough
// do, and fails the job when no rank is left or none can be added.
func (drv *driver) checkMin() {
	if drv.state != jobRunning || drv.finishing {
		return
	}
	j, min := drv.j, drv.j.cfg.MinNP
	live := drv.live()
	switch {
	case live >= min:
		if drv.minWait != nil {
			drv.stopMinWait()
			j.o.logf("the elastic job has %s again (--min-np %d)", ranks(live), min)
		}
	case drv.minWait != nil:
	case live == 0:
		drv.fail(drv.lastFail, errors.New("no rank of the elastic job is left to carry its state on"))
	default:
		// As Horovod's driver: wait for hosts even when none can come
		// (fixed hosts, blacklisted for good); no epoch forms meanwhile.
		drv.minWait = time.NewTimer(drv.timeout)
		j.o.logf("%s left, fewer than --min-np %d: waiting up to %v (--elastic-timeout) for slots; no epoch forms meanwhile", ranks(live), min, drv.timeout)
	}
}

// stopMinWait ends the wait for --min-np ranks.
func (drv *driver) stopMinWait() {
	if drv.minWait != nil {
		drv.minWait.Stop()
		drv.minWait = nil
	}
}

// minWaitC fires when the wait for --min-np ranks times out (nil: no
// wait).
func (drv *driver) minWaitC() <-chan time.Time {
	if drv.minWait == nil {
		return nil
	}
	return drv.minWait.C
}

// tagList names ranks by their output tags: "[3] [4]".
func tagList(tags []int) string {
	s := make([]string, len(tags))
	for i, t := range tags {
		s[i] = "[" + strconv.Itoa(t) + "]"
	}
	return strings.Join(s, " ")
}
