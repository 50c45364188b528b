package launch

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"syscall"
	"time"
)

// resetLimitMessage is Horovod's RESET_LIMIT_EXCEEDED_MESSAGE.
const resetLimitMessage = "Horovod was shutdown because number of resets during elastic job exceeded limit: %d"

// supervise is the elastic driver's loop: it waits for every rank to exit,
// while discovery reports the hosts every drv.every, and adds and removes
// ranks and hosts; see Run for the result.
func (drv *driver) supervise(ctx context.Context, sigs <-chan os.Signal) (int, error) {
	j := drv.j
	ctx, cancel := context.WithCancel(ctx)
	drv.ctx = ctx
	var wg sync.WaitGroup
	defer func() {
		cancel()
		close(drv.quit)
		wg.Wait()
	}()
	for _, d := range j.daemons {
		drv.watchDaemon(d)
	}
	wg.Go(func() { drv.runDiscovery(ctx) })
	if j.rdv != nil {
		wg.Go(func() { drv.watchStore(ctx) })
	}
	defer func() {
		if drv.ms.wait != nil {
			drv.ms.wait.Stop()
		}
	}()
	tick := time.NewTicker(drv.every)
	defer tick.Stop()
	ctxDone := ctx.Done()
	for j.running > 0 {
		select {
		case e := <-j.exits:
			drv.rankExited(e)
		case sig := <-sigs:
			drv.signal(sig)
		case <-ctxDone:
			ctxDone = nil
			if drv.state == jobRunning {
				drv.state, drv.code = jobCancelled, 128+int(syscall.SIGTERM)
				j.o.logf("%v; stopping %s", context.Cause(ctx), ranks(j.running))
				drv.stop(syscall.SIGTERM)
			}
		case <-drv.killC:
			drv.killC = nil
			j.killAfterGrace()
		case d := <-drv.daemonC:
			drv.daemonExited(d)
		case r := <-drv.readyC:
			drv.daemonReady(r)
		case r := <-drv.discC:
			drv.discovered(r)
		case <-tick.C:
			drv.stopLeavers()
			drv.killLingering()
			drv.reconcile()
		case <-drv.minWaitC():
			drv.minWait = nil
			drv.fail(drv.lastFail, errors.New(drv.slotsTimeout(j.cfg.MinNP)))
		case <-drv.storeC:
		case <-drv.reportWaitC():
			drv.ms.wait, drv.ms.overdue = nil, true
		case <-drv.formWaitC():
			drv.decide() // an epoch that formed in the meantime is done
			drv.formOverdue()
		}
		drv.decide()
	}
	drv.stopMinWait()
	j.closeStdins()
	j.drain()
	switch {
	case drv.state == jobCancelled:
		return drv.code, fmt.Errorf("job stopped: %w", context.Cause(ctx))
	case drv.state == jobRunning:
		return 0, nil
	}
	return drv.code, drv.err
}

// runDiscovery runs discovery every drv.every and reports each result,
// until ctx ends.
func (drv *driver) runDiscovery(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(drv.every):
		}
		hosts, err := drv.discover(ctx)
		select {
		case drv.discC <- discovery{hosts, err}:
		case <-ctx.Done():
			return
		}
	}
}

// watchDaemon reports d on drv.daemonC when it exits.
func (drv *driver) watchDaemon(d *daemonProc) {
	go func() {
		select {
		case <-d.done:
			select {
			case drv.daemonC <- d:
			case <-drv.quit:
			}
		case <-drv.quit:
		}
	}()
}

// stop sends sig to every rank and arms the kill grace, as supervise's stop.
func (drv *driver) stop(sig os.Signal) {
	drv.j.signalAll(sig)
	drv.killC = time.After(drv.j.cfg.KillGrace)
}

// fail stops the job: every rank gets SIGTERM, and Run returns code and
// err (err, when not nil, is also logged now).
func (drv *driver) fail(code int, err error) {
	if drv.state != jobRunning {
		return
	}
	drv.state, drv.code, drv.err = jobFailed, code, err
	if err != nil && drv.j.running > 0 {
		drv.j.o.logf("%v; stopping %s", err, ranks(drv.j.running))
	}
	drv.stop(syscall.SIGTERM)
}

// failRank stops the job after a rank's failure, logging msg as supervise
// does, and exits with the rank's code.
func (drv *driver) failRank(code int, msg string) {
	if drv.j.running > 0 {
		msg += fmt.Sprintf("; stopping the other %s", ranks(drv.j.running))
	}
	drv.j.o.logf("%s", msg)
	drv.fail(code, nil)
}

// signal forwards sig as supervise does.
func (drv *driver) signal(sig os.Signal) {
	first := drv.state == jobRunning
	if first {
		drv.state, drv.code = jobInterrupted, 128+signum(sig)
	}
	drv.j.forwardSignal(sig, first, drv.stop)
}

// rankExited handles the exit of rank e.rank.
func (drv *driver) rankExited(e exitEvent) {
	j, cfg := drv.j, drv.j.cfg
	j.running--
	j.exited[e.rank] = true
	r := &drv.ranks[e.rank]
	c, how := describeExit(e.state)
	if drv.state != jobRunning {
		return
	}
	if n := &drv.nodes[r.node]; !n.dead && !n.retired && daemonGone(n.d) {
		// It went with its daemon, whose exit is not handled yet.
		drv.daemonExited(n.d)
		r.stopping = true
		if drv.state != jobRunning {
			return
		}
	}
	msg := j.describeRank(e.rank, how)
	switch {
	case r.leaving:
		// Its host was removed (removeNode): whatever its status, it left
		// as told; no failure, no blacklisting, no reset of its own.
		host := j.nodes[r.node].Host
		if r.stopping {
			j.o.logf("%s; it was stopped, its host %s having been removed from the elastic job; the job goes on with %s", msg, host, ranks(drv.live()))
		} else {
			j.o.logf("%s; it left the elastic job, its host %s having been removed; the job goes on with %s", msg, host, ranks(drv.live()))
		}
		drv.retireDaemons()
		drv.checkMin()
		return
	case r.stopping:
		j.o.logf("%s; the elastic job goes on with %s", msg, ranks(j.running))
		drv.retireDaemons()
		drv.checkMin()
		return
	case c == 0:
		// Horovod: a worker that succeeds ends the job; the others finish.
		drv.finishing = true
		drv.stopMinWait()
		return
	case drv.finishing:
		// Its failure may be seen after the others finished even when it
		// came first (the others went on without it): the job's status is
		// theirs.
		j.o.logf("%s; a rank has finished the job with status 0, which is the job's", msg)
		return
	}
	// A rank failed (a non-zero status, a signal): as Horovod's driver
	// does, its host is blacklisted, for the cooldown of
	// --blacklist-cooldown-range or for good, and the host's other ranks
	// are stopped; the job goes on on the other hosts.
	drv.lastFail = c
	host := j.nodes[r.node].Host
	cool, stopped := drv.blacklistFailedHost(r.node)
	live := drv.live()
	switch limit := cfg.ResetLimit; {
	case drv.hm.allBlacklisted():
		j.o.logf("%s", msg)
		drv.fail(c, errors.New(drv.allBlacklistedMessage()))
		return
	case live == 0:
		drv.failRank(c, msg+"; no rank is left to carry the job's state on")
		return
	case !drv.prevGoesOn():
		// Horovod: new ranks get the job's state from running ones.
		drv.failRank(c, msg+"; No hosts from previous set remaining, unable to broadcast state. (Only ranks that joined since the last epoch run.)")
		return
	case limit > 0 && drv.resets >= limit:
		drv.failRank(c, msg+"; "+fmt.Sprintf(resetLimitMessage, limit))
		return
	}
	drv.resets++
	j.o.logf("%s; the elastic job goes on with %s (--min-np %d; reset %d)", msg, ranks(live), cfg.MinNP, drv.resets)
	j.o.logf("%s", blacklistedFailedPhrase(host, cool, stopped))
	drv.reconcile()
}

// blacklistFailedHost blacklists the host of node i, one of whose ranks
// failed (Horovod blacklists the host of a failed worker, not its slot),
// and retires the node: its other ranks are stopped and its daemon once
// they have exited. It returns the host's cooldown (zero: for good) and
// the ranks it stopped.
func (drv *driver) blacklistFailedHost(i int) (time.Duration, []int) {
	cool := drv.hm.blacklistHost(drv.j.nodes[i].Host)
	stopped := drv.nodeRanks(i)
	drv.retire(i)
	return cool, stopped
}

// blacklistedFailedPhrase says that host was blacklisted for a failed rank
// and which of its ranks were stopped.
func blacklistedFailedPhrase(host string, cool time.Duration, stopped []int) string {
	msg := fmt.Sprintf("blacklisting host %s %s, as Horovod blacklists the host of a failed worker", host, cooldownPhrase(cool))
	if len(stopped) > 0 {
		msg += fmt.Sprintf("; stopping its other ranks (%s)", tagList(stopped))
	}
	return msg
}

// cooldownPhrase says how long a host or slot is blacklisted for, given
// the cooldown that blacklisting it returned (zero: for good).
func cooldownPhrase(cool time.Duration) string {
	if cool > 0 {
		return fmt.Sprintf("for %v (--blacklist-cooldown-range)", cool.Round(time.Millisecond))
	}
	return "for good (no --blacklist-cooldown-range)"
}

// daemonGone reports whether d has exited.
func daemonGone(d *daemonProc) bool {
	if d == nil {
		return false
	}
	select {
	case <-d.done:
		return true
	default:
		return false
	}
}

// nodeOfDaemon returns the node whose daemon d is.
func (drv *driver) nodeOfDaemon(d *daemonProc) int {
	for i, n := range drv.nodes {
		if n.d == d {
			return i
		}
	}
	return -1
}

// daemonExited handles the exit of a node's daemon, node 0's as any other:
// it blacklists its host (Horovod blacklists the host of a failed worker)
// and stops the host's ranks. The other daemons move the job's
// coordination off a node 0 that is lost.
func (drv *driver) daemonExited(d *daemonProc) {
	j, cfg := drv.j, drv.j.cfg
	i := drv.nodeOfDaemon(d)
	if i < 0 || drv.nodes[i].dead {
		return
	}
	n := &drv.nodes[i]
	n.dead = true
	if n.stopped || n.retired {
		return // stopped by the driver, or its host had left the job
	}
	if !n.ready {
		// A daemon that never was ready (a host being added): the wait
		// for it sees the exit too, and daemonReady blacklists the host,
		// once, saying that it exited before it was ready.
		return
	}
	_, how := describeExit(d.cmd.ProcessState)
	j.o.logf("%s %s while the job was running; its last output:\n%s", d.describe(), how, d.tail.lines(10))
	if drv.state != jobRunning {
		return
	}
	host := j.nodes[i].Host
	if limit := cfg.ResetLimit; limit > 0 && drv.resets >= limit {
		drv.fail(drv.lastFail, fmt.Errorf(resetLimitMessage, limit))
		return
	}
	drv.resets++
	cool := drv.hm.blacklistHost(host)
	live := drv.nodeRanks(i)
	drv.retire(i)
	what := ""
	if len(live) > 0 {
		what = fmt.Sprintf(" and stopping the ranks on it (%s), which lost their daemon", tagList(live))
	}
	j.o.logf("blacklisting host %s %s%s (reset %d)", host, cooldownPhrase(cool), what, drv.resets)
	if drv.hm.allBlacklisted() {
		drv.fail(drv.lastFail, errors.New(drv.allBlacklistedMessage()))
		return
	}
	drv.reconcile()
}

// allBlacklistedMessage says that every host is blacklisted (Horovod:
// "blacklisted slots count == N -> stop running").
func (drv *driver) allBlacklistedMessage() string {
	return fmt.Sprintf("Horovod detected that one or more processes exited with non-zero status: every host of the elastic job is blacklisted (%s), so it stops; see the ranks' output above for why they failed", hostList(drv.hm.discovered))
}

// daemonReady handles the end of the wait for a new node's daemon: its
// reserved ranks start, or its host is blacklisted.
func (drv *driver) daemonReady(r readyEvent) {
	j := drv.j
	n := &drv.nodes[r.node]
	host := j.nodes[r.node].Host
	if r.err != nil {
		if drv.state != jobRunning || n.retired {
			return
		}
		cool := drv.hm.blacklistHost(host)
		j.o.logf("%v; blacklisting host %s %s", r.err, host, cooldownPhrase(cool))
		drv.retire(r.node)
		if drv.hm.allBlacklisted() {
			drv.fail(drv.lastFail, errors.New(drv.allBlacklistedMessage()))
			return
		}
		drv.reconcile()
		return
	}
	n.ready = true
	k := n.reserved
	n.reserved = 0
	if drv.state != jobRunning || n.retired || drv.finishing || k == 0 {
		drv.retireDaemons()
		return
	}
	drv.startRanksOn(r.node, k)
}

// discovered takes in a run of the discovery.
func (drv *driver) discovered(r discovery) {
	j := drv.j
	if drv.state != jobRunning || drv.finishing {
		return
	}
	if r.err != nil {
		switch {
		case drv.discFailing.IsZero():
			drv.discFailing = time.Now()
			j.o.logf("%v; retrying every %v for up to %v (--elastic-timeout); the hosts found before stay", r.err, drv.every, drv.timeout)
		case time.Since(drv.discFailing) > drv.timeout:
			drv.fail(drv.lastFail, fmt.Errorf("host discovery has failed for longer than --elastic-timeout (%v): %w", drv.timeout, r.err))
		}
		return
	}
	if !drv.discFailing.IsZero() {
		drv.discFailing = time.Time{}
		j.o.logf("the host discovery script works again")
	}
	drv.hm.setDiscovered(r.hosts)
	drv.reconcile()
}

// killLingering SIGKILLs the ranks asked to stop more than the kill grace
// ago (remote ones: their wrapper's grace too).
func (drv *driver) killLingering() {
	j := drv.j
	for tag := range drv.ranks {
		r := &drv.ranks[tag]
		if !r.stopping || r.killed || j.exited[tag] {
			continue
		}
		grace := j.cfg.KillGrace
		if _, remote := j.hosts[tag]; remote {
			grace += time.Duration(max(j.grace, 1)) * time.Second
		}
		if time.Since(r.stopAt) > grace {
			r.killed = true
			j.o.logf("rank %d still running %v after being asked to stop; sending SIGKILL", tag, grace)
			j.signalRanks(tag, tag+1, syscall.SIGKILL)
		}
	}
}
