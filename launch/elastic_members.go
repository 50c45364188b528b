package launch

import (
	"context"
	"fmt"
	"github.com/hvdd/hvdd/internal/elastickeys"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"
)

// The elastic driver decides the members of every epoch of the job after
// the first, as Horovod's driver does (its worker registry's barrier, then
// the blacklist, then the rendezvous's answer), and the daemons form each
// epoch only over the members it publishes (package nodes, driven.go; the
// daemons run --elastic-driver). The daemons report, at the job's
// rendezvous store, which workers (HVDD_WORKER: the rank's output tag)
// each node re-forms into a forming epoch; the driver waits until every
// node of the last epoch has reported and every rank the reports leave out
// has exited, so that its status has been judged (a failed rank's host is
// blacklisted and its other ranks stopped, rankExited), and then publishes
// the nodes that go on, each with its reported ranks, and the nodes that
// joined the running job and reported their ranks. It publishes nothing
// while fewer than --min-np ranks would be in it: the daemons' ranks wait
// in init() while the driver waits, up to --elastic-timeout, for hosts
// (checkMin). So no rank ever steps, or runs a reset callback, at a
// membership the driver did not decide, and a failure costs one reset.

// Keys of the job's rendezvous store (package nodes, driven.go, writes and
// reads the same).
var (
	reportKey  = elastickeys.Report
	joiningKey = elastickeys.Joining
	membersKey = elastickeys.Members
	formedKey  = elastickeys.Formed
	exitingKey = elastickeys.Exiting
)

// DefaultReportWait bounds the driver's wait for the daemons' reports of a
// forming epoch, from the first: a node still silent then (its host cut
// off, its daemon hung) is taken as failed, and a rank its daemon left
// out that still runs is stopped.
const DefaultReportWait = 10 * time.Second

// DefaultFormWait bounds the wait, from a decision's publication, for the
// daemons to form the epoch it decides: the decided nodes have all reported
// and their ranks wait in init(), so forming takes them a few network round
// trips; an epoch still not formed then (its coordinator hung, a decided
// node gone in a way no daemon or exit reports) ends the job with that
// error, where it would otherwise wait for the daemons without end.
const DefaultFormWait = 60 * time.Second

// DefaultExitWait bounds the wait, from the first report of a forming
// epoch, for the exit of a rank its daemon left out after a Goodbye that
// said its process exits (elastickeys.Exiting): such a rank is not stopped
// at the report wait, as one that still runs in the job would be, since a
// process may take seconds to end after its Goodbye on a loaded machine,
// and a rank stopped then exits with a signal, judged failed: the job that
// finished would end with an error. One still running after this wait is
// stopped (and judged by the status it then exits with).
const DefaultExitWait = 60 * time.Second

// membership is the driver's state in deciding epochs.
type membership struct {
	// epoch is the epoch being decided: the first after the last that
	// formed (1 at the start).
	epoch uint64
	// version counts the decisions published for it; last is the latest.
	version int
	last    string
	// members are the last decided epoch's ranks by node (the first
	// epoch's: the ranks the job started with); decided those of the
	// latest decision for epoch, and versions those of each decision for
	// it (by version), since the epoch may form with an earlier one than
	// the latest (a node ready to join came as it formed).
	members, decided map[int][]int
	versions         map[int]map[int][]int
	// since is when the first report for epoch came (zero: none yet);
	// wait fires DefaultReportWait later, and overdue says it has.
	since   time.Time
	wait    *time.Timer
	overdue bool
	// waitedFor are the ranks left out that said they exit whose exit the
	// driver has said it waits for (logged once).
	waitedFor map[int]bool
	// published is when the latest decision with members was published;
	// formWait fires DefaultFormWait later (see formOverdue).
	published time.Time
	formWait  *time.Timer
}

// startMembership records the job's first ranks as its first epoch's.
func (drv *driver) startMembership() {
	drv.ms = membership{epoch: 1, members: map[int][]int{}}
	for tag, r := range drv.ranks {
		drv.ms.members[r.node] = append(drv.ms.members[r.node], tag)
	}
}

// watchStore signals drv.storeC at every change of the job's rendezvous
// store, until ctx ends.
func (drv *driver) watchStore(ctx context.Context) {
	st := drv.j.rdv.srv.Store()
	ch := st.Changed()
	for {
		select {
		case <-ch:
		case <-ctx.Done():
			return
		}
		// Taken before the signal: a change after it closes this one.
		ch = st.Changed()
		select {
		case drv.storeC <- struct{}{}:
		default: // one pending signal covers every change before it
		}
	}
}

// reportWaitC fires when the wait for a forming epoch's reports is over
// (nil: none).
func (drv *driver) reportWaitC() <-chan time.Time {
	if drv.ms.wait == nil {
		return nil
	}
	return drv.ms.wait.C
}

// nextEpoch moves the decision on to the next epoch: the one decided has
// formed with the decision of version formedWith (0: unknown, the latest),
// or failed as it formed.
func (drv *driver) nextEpoch(formedWith int) {
	ms := &drv.ms
	ms.members = ms.decided
	if m, ok := ms.versions[formedWith]; ok {
		ms.members = m
	}
	ms.epoch++
	ms.version, ms.last, ms.decided, ms.versions = 0, "", nil, nil
	ms.since, ms.overdue, ms.waitedFor = time.Time{}, false, nil
	if ms.wait != nil {
		ms.wait.Stop()
		ms.wait = nil
	}
	if ms.formWait != nil {
		ms.formWait.Stop()
		ms.formWait = nil
	}
}

// formWaitC fires when the latest decision has waited its bound to form
// (nil: none).
func (drv *driver) formWaitC() <-chan time.Time {
	if drv.ms.formWait == nil {
		return nil
	}
	return drv.ms.formWait.C
}

// formOverdue ends the job when the epoch the driver decided has not
// formed within the form wait of the decision (decide, called first, has
// moved on from an epoch that formed).
func (drv *driver) formOverdue() {
	ms := &drv.ms
	ms.formWait = nil
	if ms.decided == nil || drv.state != jobRunning {
		return
	}
	drv.fail(drv.lastFail, fmt.Errorf("the elastic job's epoch %d, decided %v ago (%s), has not formed: its daemons did not lay it out (a coordinator that hangs, or a decided host lost without a report; see the daemons' logs)",
		ms.epoch, time.Since(ms.published).Round(time.Millisecond), ms.last))
}

// get reads key from the job's store: nil, false when it is not there.
func (drv *driver) get(key string) ([]byte, bool) {
	v, err := drv.j.rdv.srv.Store().Get(drv.ctx, key)
	return v, err == nil
}

// workers reads the workers a node reported under key: their tags, -1 for
// a worker the driver did not start.
func (drv *driver) workers(key string) ([]int, bool) {
	v, ok := drv.get(key)
	if !ok {
		return nil, false
	}
	var tags []int
	for _, f := range strings.Fields(string(v)) {
		t, err := strconv.Atoi(f)
		if err != nil || t < 0 || t >= len(drv.ranks) {
			t = -1
		}
		tags = append(tags, t)
	}
	return tags, true
}

// goesOn reports whether rank tag runs and is not being stopped or leaving.
func (drv *driver) goesOn(tag int) bool {
	if tag < 0 || drv.j.exited[tag] {
		return false
	}
	r := drv.ranks[tag]
	return !r.stopping && !r.leaving
}

// decide publishes the members of the forming epoch once the daemons'
// reports and the ranks' exits allow (see above). supervise calls it after
// every event.
func (drv *driver) decide() {
	if drv.state != jobRunning || drv.j.rdv == nil || drv.ctx.Err() != nil {
		return
	}
	j, ms := drv.j, &drv.ms
	for ms.version > 0 {
		// An epoch that formed, or whose successor forms, is decided.
		v, formed := drv.get(formedKey(ms.epoch))
		if !formed && !drv.anyReport(ms.epoch+1) {
			break
		}
		with, _ := strconv.Atoi(string(v))
		drv.nextEpoch(with)
	}
	reports := map[int][]int{}
	for i := range drv.nodes {
		if tags, ok := drv.workers(reportKey(ms.epoch, i)); ok {
			reports[i] = tags
		}
	}
	if len(reports) == 0 {
		return // no epoch forms
	}
	if ms.since.IsZero() {
		ms.since = time.Now()
		ms.wait = time.NewTimer(drv.reportWait)
	}
	if drv.finishing {
		// Horovod: a worker that succeeded ends the job.
		drv.publish("end a rank finished the job with status 0, which ends an elastic job as in Horovod", nil)
		return
	}

	// Settled: every node of the last epoch reported, every rank the
	// reports leave out has exited (its status judged), and every rank
	// reported goes on.
	var silent, leftOut, gone []int
	for _, i := range slices.Sorted(maps.Keys(ms.members)) {
		if n := drv.nodes[i]; n.retired || n.dead {
			continue
		}
		rep, ok := reports[i]
		if !ok {
			silent = append(silent, i)
			continue
		}
		for _, t := range ms.members[i] {
			if !slices.Contains(rep, t) && !j.exited[t] {
				leftOut = append(leftOut, t)
			}
		}
	}
	for i, rep := range reports {
		if n := drv.nodes[i]; n.retired || n.dead {
			continue
		}
		for _, t := range rep {
			if !drv.goesOn(t) {
				gone = append(gone, t)
			}
		}
	}
	if len(silent)+len(leftOut)+len(gone) > 0 {
		if ms.overdue {
			drv.overdue(silent, leftOut)
		}
		return
	}

	// The members: the last epoch's nodes that go on, with the ranks they
	// reported, then the nodes that joined, with theirs.
	var parts []string
	decided, total := map[int][]int{}, 0
	for i := range drv.nodes {
		n := drv.nodes[i]
		if n.retired || n.dead {
			continue
		}
		tags := reports[i]
		if _, member := ms.members[i]; !member {
			var ok bool
			if tags, ok = drv.workers(joiningKey(i)); !ok || !n.ready || slices.ContainsFunc(tags, func(t int) bool { return !drv.goesOn(t) }) {
				continue // it joins a later epoch
			}
		}
		if len(tags) == 0 {
			continue
		}
		parts = append(parts, fmt.Sprintf("%d:%d", i, len(tags)))
		decided[i], total = tags, total+len(tags)
	}
	if total < j.cfg.MinNP || len(parts) == 0 {
		return // checkMin waits for hosts, up to --elastic-timeout
	}
	if !slices.ContainsFunc(slices.Collect(maps.Keys(decided)), func(i int) bool { return len(ms.members[i]) > 0 }) {
		// Horovod: new ranks get the job's state from running ones.
		drv.fail(drv.lastFail, fmt.Errorf("No hosts from previous set remaining, unable to broadcast state. (Epoch %d would hold only ranks that joined since the last epoch: %s.)", ms.epoch, strings.Join(parts, " ")))
		return
	}
	drv.publish(strings.Join(parts, " "), decided)
}

// anyReport reports whether a node reported for epoch.
func (drv *driver) anyReport(epoch uint64) bool {
	for i := range drv.nodes {
		if _, ok := drv.get(reportKey(epoch, i)); ok {
			return true
		}
	}
	return false
}

// publish sets the forming epoch's members to value, unless they are
// already.
func (drv *driver) publish(value string, decided map[int][]int) {
	ms, j := &drv.ms, drv.j
	if value == ms.last {
		return
	}
	if err := j.rdv.srv.Store().Set(drv.ctx, membersKey(ms.epoch, ms.version+1), []byte(value)); err != nil {
		drv.fail(drv.lastFail, fmt.Errorf("publish the elastic job's members for epoch %d at its rendezvous: %w", ms.epoch, err))
		return
	}
	ms.version++
	ms.last, ms.decided = value, decided
	if decided == nil {
		return
	}
	if ms.versions == nil {
		ms.versions = map[int]map[int][]int{}
	}
	ms.versions[ms.version] = decided
	ms.published = time.Now()
	if ms.formWait != nil {
		ms.formWait.Stop()
	}
	ms.formWait = time.NewTimer(drv.formWait)
	var hosts []string
	size := 0
	for _, i := range slices.Sorted(maps.Keys(decided)) {
		hosts = append(hosts, fmt.Sprintf("%s (%d)", j.nodes[i].Host, len(decided[i])))
		size += len(decided[i])
	}
	j.o.logf("the elastic job's epoch %d forms with %s: %s", ms.epoch, ranks(size), strings.Join(hosts, ", "))
}

// leftOutRuns acts on rank t, which its daemon left out of the forming
// epoch but still runs after the report wait: one that said its process
// exits is waited for up to drv.exitWait (its exit status is judged), any
// other is stopped.
func (drv *driver) leftOutRuns(t int) {
	j, ms := drv.j, &drv.ms
	if _, exiting := drv.get(exitingKey(strconv.Itoa(t))); !exiting {
		j.o.logf("rank %d left its daemon's part of the elastic job's epoch %d but still runs %v later; stopping it", t, ms.epoch, drv.reportWait)
		drv.stopRank(t)
		return
	}
	waited := time.Since(ms.since)
	switch {
	case waited >= drv.exitWait:
		j.o.logf("rank %d said its process exits but still runs %v after the elastic job's epoch %d began to form; stopping it", t, waited.Round(time.Millisecond), ms.epoch)
		drv.stopRank(t)
	case !ms.waitedFor[t]:
		if ms.waitedFor == nil {
			ms.waitedFor = map[int]bool{}
		}
		ms.waitedFor[t] = true
		j.o.logf("rank %d left the elastic job's epoch %d saying its process exits, but still runs %v later; waiting up to %v for its exit status", t, ms.epoch, waited.Round(time.Millisecond), drv.exitWait)
	}
}

// overdue acts on a forming epoch whose reports did not all come within
// the report wait: the silent nodes' hosts are blacklisted as failed (their
// daemons cannot reach the rendezvous, or hang), and ranks their daemons
// left out that still run are stopped.
func (drv *driver) overdue(silent, leftOut []int) {
	j := drv.j
	for _, i := range silent {
		if n := drv.nodes[i]; n.retired || n.dead {
			continue
		}
		host := j.nodes[i].Host
		cool, stopped := drv.blacklistFailedHost(i)
		j.o.logf("host %s's daemon (node %d) did not report its ranks for the elastic job's epoch %d within %v of the first report; taking it as failed: %s",
			host, i, drv.ms.epoch, drv.reportWait, blacklistedFailedPhrase(host, cool, stopped))
	}
	for _, t := range leftOut {
		if drv.goesOn(t) {
			drv.leftOutRuns(t)
		}
	}
	if drv.hm.allBlacklisted() {
		drv.fail(drv.lastFail, fmt.Errorf("%s", drv.allBlacklistedMessage()))
	}
}

// prevGoesOn reports whether a rank of the last epoch (or of the latest
// decision) goes on: one that holds the job's state.
func (drv *driver) prevGoesOn() bool {
	for _, m := range []map[int][]int{drv.ms.members, drv.ms.decided} {
		for _, tags := range m {
			if slices.ContainsFunc(tags, drv.goesOn) {
				return true
			}
		}
	}
	return false
}
