package loop

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/hvdd/hvdd/daemon/internal/job"
)

// What a service manager (systemd, through cmd/hvdd) needs from the daemon:
// what it is doing (Status, reported through Config.OnStatus as it
// changes), whether its event loop still turns (Probe: the watchdog's
// proof), and a stop that waits for the running job (Shutdown's drain).

// Status says what the daemon is doing. Its String is the line cmd/hvdd
// gives systemd (STATUS=, shown by systemctl status).
type Status struct {
	// Slots is Config.Slots: the local ranks of every job.
	Slots int
	// Draining is set once Shutdown was called: new jobs are refused, and
	// the daemon exits when Jobs is empty.
	Draining bool
	// Jobs are the jobs on this daemon (several at once: lanes.go), oldest
	// first. Empty when idle.
	Jobs []JobStatus
}

// JobStatus is one job in a Status.
type JobStatus struct {
	// ID numbers the daemon's jobs from 1; an elastic job keeps its id
	// across epochs.
	ID uint64
	// Name is the job's name (hvdd run --job, HVDD_JOB); "" if unnamed.
	Name string
	// State is where the job is in its life.
	State JobState
	// LocalRanks is how many of the job's ranks on this node are
	// connected: all Slots while it runs; for a re-forming elastic job,
	// how many survivors it waits for.
	LocalRanks int
	// Size is the number of ranks on all nodes and Nodes the number of
	// nodes, once the job has formed; zero before.
	Size, Nodes int
	// Epoch is an elastic job's epoch (0 for the first, and for other jobs).
	Epoch uint64
}

// JobState is where a job is in its life (JobStatus.State).
type JobState string

// The states of a job.
const (
	// JobForming: its local ranks are arriving (or, across nodes, the
	// other nodes' daemons are forming it).
	JobForming JobState = "forming"
	// JobRunning: it formed and runs collectives.
	JobRunning JobState = "running"
	// JobFailed: it failed, its ranks were told why, and the daemon waits
	// for their connections to close.
	JobFailed JobState = "failed"
	// JobReforming: an elastic job between epochs, waiting for its
	// surviving ranks to re-initialise.
	JobReforming JobState = "re-forming"
)

// String says what the daemon is doing in one line, e.g. "running job 3:
// 4 ranks on 2 nodes, 2 here (2 slots)" or "idle: no job (2 slots)".
func (s Status) String() string {
	var jobs []string
	for _, j := range s.Jobs {
		jobs = append(jobs, j.String())
	}
	slots := fmt.Sprintf(" (%d slots)", s.Slots)
	switch {
	case s.Draining && len(jobs) == 0:
		return "draining: no job left, stopping"
	case s.Draining:
		return "draining, new jobs refused: waiting for " + strings.Join(jobs, "; ") + " to end" + slots
	case len(jobs) == 0:
		return "idle: no job" + slots
	}
	return strings.Join(jobs, "; ") + slots
}

// String describes the job, e.g. "running job 3: 2 ranks" or, named,
// "running job 3 (train): 2 ranks".
func (j JobStatus) String() string {
	id := fmt.Sprint(j.ID)
	if j.Name != "" {
		id += " (" + j.Name + ")"
	}
	switch j.State {
	case JobForming:
		return fmt.Sprintf("forming job %s: %d local ranks connected", id, j.LocalRanks)
	case JobReforming:
		return fmt.Sprintf("re-forming elastic job %s (epoch %d): waiting for %d local ranks", id, j.Epoch, j.LocalRanks)
	case JobFailed:
		return fmt.Sprintf("failed job %s: waiting for %d local ranks to close", id, j.LocalRanks)
	}
	if j.Nodes > 1 {
		return fmt.Sprintf("running job %s: %d ranks on %d nodes, %d here", id, j.Size, j.Nodes, j.LocalRanks)
	}
	return fmt.Sprintf("running job %s: %d ranks", id, j.Size)
}

// Messages to the loop for a service manager.
type (
	msgProbe struct{ reply chan<- Status } // Probe: answer with the status
	MsgDrain struct{}                      // Shutdown: refuse new jobs, exit after the running one
)

// ErrLoopDone says that the loop has exited.
var ErrLoopDone = errors.New("the daemon's loop has exited")

// Probe asks the loop what it is doing (Server.Probe); errLoopDone once the
// loop has exited. Safe from any goroutine.
func (l *Loop) Probe(ctx context.Context) (Status, error) {
	reply := make(chan Status, 1)
	l.p.Post(msgProbe{reply})
	select {
	case st := <-reply:
		return st, nil
	case <-l.done:
		return Status{}, ErrLoopDone
	case <-ctx.Done():
		return Status{}, fmt.Errorf("daemon: the event loop did not answer: %w", context.Cause(ctx))
	}
}

// serviceStatus is what the daemon is doing now.
func (l *Loop) serviceStatus() Status {
	return Status{Slots: l.cfg.Slots, Draining: l.draining, Jobs: l.serviceJobs()}
}

// serviceJobs describes every lane's job.
func (l *Loop) serviceJobs() []JobStatus {
	var js []JobStatus
	for _, ln := range l.order {
		if j, ok := laneJobStatus(ln); ok {
			js = append(js, j)
		}
	}
	return js
}

// laneJobStatus describes ln's job, if it has one.
func laneJobStatus(ln *lane) (JobStatus, bool) {
	j := ln.job
	name := ln.key.name
	switch {
	case j == nil && ln.reform != nil:
		return JobStatus{ID: ln.reform.id, Name: name, State: JobReforming, Epoch: ln.reform.epoch, LocalRanks: len(ln.reform.survivors)}, true
	case j == nil:
		return JobStatus{}, false
	case j.Failed != nil:
		return JobStatus{ID: j.ID, Name: name, State: JobFailed, LocalRanks: j.Open, Epoch: j.Epoch}, true
	case !j.Formed:
		return JobStatus{ID: j.ID, Name: name, State: JobForming, LocalRanks: j.Joined, Epoch: j.Epoch}, true
	}
	return JobStatus{ID: j.ID, Name: name, State: JobRunning, LocalRanks: j.Open, Size: j.Members.Size, Nodes: j.Members.Nodes(), Epoch: j.Epoch}, true
}

// afterPass runs at the end of each pass of the loop that did something:
// it reports a changed status to Config.OnStatus, and ends a drain that has
// no job left to wait for. Comparing the job's summary costs a few loads,
// so the busy path pays nothing more.
func (l *Loop) afterPass() {
	if l.cfg.OnStatus != nil {
		js := l.serviceJobs()
		if !l.reported || !slices.Equal(js, l.lastJobs) || l.draining != l.lastDraining {
			l.reported, l.lastJobs, l.lastDraining = true, js, l.draining
			l.cfg.OnStatus(Status{Slots: l.cfg.Slots, Draining: l.draining, Jobs: js})
		}
	}
	if l.draining && !l.drained && len(l.order) == 0 {
		l.drained = true
		l.cfg.Log.Info("drained: no job left; exiting")
		// Close posts to this loop: not from the loop's own goroutine.
		go l.s.Close()
	}
}

// drain starts Shutdown's drain: hellos waiting for the next job and
// workers waiting to join an elastic job's next epoch are refused now; the
// running job runs on (afterPass ends the drain when it has ended).
func (l *Loop) drain() {
	if l.draining {
		return
	}
	l.draining = true
	for _, j := range l.serviceJobs() {
		l.cfg.Log.Warn("draining: the running job runs on; new jobs are refused; the daemon exits when it ends",
			"job", j.ID, "name", j.Name, "state", j.State, "local_ranks", j.LocalRanks)
	}
	for _, ln := range slices.Clone(l.order) {
		for _, c := range slices.Clone(ln.waiting) {
			if l.drainRefuses(c) {
				l.refuse(c, l.drainNote())
			}
		}
		for _, c := range slices.Clone(ln.joiners) {
			l.refuse(c, l.drainNote())
		}
	}
}

// drainRefuses reports whether a draining daemon refuses c's hello: it
// takes the rest of a job that was forming when the drain began, and the
// ranks of an elastic job that re-initialise into its next epoch, and
// nothing that would start a job.
func (l *Loop) drainRefuses(c *client) bool {
	if !l.draining {
		return false
	}
	ln := l.lanes[laneKey{uid: c.uid, name: c.helloMsg.GetJob()}]
	if ln == nil {
		return true // a new job
	}
	j := ln.job
	switch {
	case j == nil:
		return ln.reform == nil
	case !j.Formed && j.Failed == nil:
		return false
	}
	member := j.Elastic && slices.ContainsFunc(j.Slots, func(x job.Conn) bool { return x != nil && x.PID() == c.pid })
	return !member
}

// drainNote is what a client refused by a draining daemon is told.
func (l *Loop) drainNote() string {
	what := "its running jobs"
	if js := l.serviceJobs(); len(js) == 1 {
		what = fmt.Sprintf("job %d", js[0].ID)
	}
	return fmt.Sprintf("this hvdd daemon is stopping (draining: it exits once %s has ended) and takes no new job; start the job again once the daemon has restarted", what)
}

// refuseDraining refuses a hello that a draining daemon does not take
// (drainRefuses), and reports whether it did.
func (l *Loop) refuseDraining(c *client) bool {
	if !l.drainRefuses(c) {
		return false
	}
	l.refuse(c, l.drainNote())
	return true
}
