package loop

import (
	"fmt"
	"slices"
	"strings"

	"github.com/hvdd/hvdd/daemon/internal/job"
	"github.com/hvdd/hvdd/daemon/metrics"
)

// Several jobs at once. A daemon runs as many jobs as its --slots hold:
// each job lives in a lane, found by the uid of its processes and the name
// they give in Hello (hvdd run --job, HVDD_JOB, the launcher's job id; an
// empty name is a name too). A lane holds what the loop keeps for one job
// across its life: the job forming or running, the hellos that wait for it
// to end, and for an elastic job the workers waiting to join its next epoch
// and the re-formation between epochs (elastic.go). Each job has its own
// ranks, negotiation (its coordination and plan table), process sets,
// fusion, stall checks and failure; they share the loop, which dispatches
// their ready work in turn (dispatch starts each pass with the lane after
// the one that last handed the executor a batch), and the executor.
//
// A process of another uid cannot join a job: a hello whose name a lane of
// another uid holds is refused. Its regions are its own, so no job sees
// another's tensors. A job takes its local size (Hello.local_size, else
// --slots) out of the daemon's slots while it forms and runs, and gives
// them back when it ends. A daemon of a multi-node job (--nodes > 1,
// --elastic, or --backend mpi) runs one job at a time: its formation and
// control links belong to one job.

// laneKey identifies a lane: the uid of its processes and its job's name.
type laneKey struct {
	uid  uint32
	name string
}

// lane is one job's place in the daemon (see above).
type lane struct {
	key laneKey
	// job is the job forming or running; nil between the epochs of an
	// elastic job, or after the job ended while hellos wait.
	job *job.Job
	// size is the number of local ranks the lane's job takes.
	size int
	// waiting are hellos that wait for the lane's job to end (its ranks on
	// their way out), then form the next.
	waiting []*client
	// joiners are elastic workers waiting to join the job's next epoch.
	joiners []*client
	// reform is the next epoch of an elastic job, while it forms.
	reform *reform
	// m is the job's metrics (metrics.go); nil when off.
	m *metrics.Job
	// tune is the autotuner of the running job, on the node that decides
	// its plans (autotune.go); nil otherwise.
	tune *tuner
}

// laneOf is the lane of j (a job the loop made, running or ended).
func (l *Loop) laneOf(j *job.Job) *lane { return l.lanes[laneKey{uid: j.UID, name: j.Name}] }

// name is how logs and errors name the lane's job.
func (ln *lane) name() string {
	if ln.key.name == "" {
		return fmt.Sprintf("(unnamed, uid %d)", ln.key.uid)
	}
	return fmt.Sprintf("%q (uid %d)", ln.key.name, ln.key.uid)
}

// idle reports whether the lane holds nothing: no job, nobody waiting.
func (ln *lane) idle() bool {
	return ln.job == nil && ln.reform == nil && len(ln.waiting) == 0 && len(ln.joiners) == 0
}

// taken is the number of local ranks the lane holds: its job's, or its
// next epoch's while that forms.
func (ln *lane) taken() int {
	switch {
	case ln.job != nil:
		return len(ln.job.Slots)
	case ln.reform != nil:
		return len(ln.reform.survivors)
	}
	return 0
}

// laneFor returns the lane a hello h from c belongs to, making it if there
// is room; otherwise it returns why c is refused.
func (l *Loop) laneFor(c *client, h HelloView) (*lane, string) {
	key := laneKey{uid: c.uid, name: h.GetJob()}
	if ln := l.lanes[key]; ln != nil {
		return ln, ""
	}
	if key.name != "" {
		for _, ln := range l.order {
			if ln.key.name == key.name {
				return nil, fmt.Sprintf("job %q belongs to uid %d; a process of uid %d cannot join it (give your job another name: hvdd run --job NAME, or HVDD_JOB)",
					key.name, ln.key.uid, key.uid)
			}
		}
	}
	size := int(h.GetLocalSize())
	multi := l.cfg.MultiNode
	if size == 0 || multi {
		// A multi-node daemon's jobs have --slots ranks here (an elastic
		// job's epochs as many as come back): what the other nodes were
		// told.
		size = l.cfg.Slots
	}
	switch {
	case size < 0:
		return nil, fmt.Sprintf("local size %d is not a number of processes", size)
	case multi && len(l.order) > 0:
		return nil, fmt.Sprintf("this daemon of a multi-node job runs one job at a time and runs job %s (pids %s); wait for it to end, or start another daemon with a different --socket",
			l.order[0].name(), l.order[0].PIDs())
	}
	used := 0
	for _, ln := range l.order {
		used += ln.taken()
	}
	if used+size > l.cfg.Slots {
		if len(l.order) == 0 || size > l.cfg.Slots {
			return nil, fmt.Sprintf("a job of %d local processes does not fit this daemon's --slots %d; raise --slots, or run fewer processes per node", size, l.cfg.Slots)
		}
		return nil, fmt.Sprintf("this daemon has --slots %d and its jobs hold %d (%s); a job of %d more must wait for one to end, or run on a daemon with more slots",
			l.cfg.Slots, used, l.jobList(), size)
	}
	ln := &lane{key: key, size: size}
	ln.m = l.cfg.Metrics.Job(key.name)
	l.lanes[key] = ln
	l.order = append(l.order, ln)
	return ln, ""
}

// HelloView is what laneFor reads of a Hello.
type HelloView interface {
	GetJob() string
	GetLocalSize() int32
}

// PIDs lists the pids of the lane's ranks.
func (ln *lane) PIDs() string {
	if ln.job != nil {
		return ln.job.PIDs()
	}
	if ln.reform != nil {
		return pidList(ln.reform.survivors)
	}
	return ""
}

// jobList names the daemon's jobs with their ranks, for refusals.
func (l *Loop) jobList() string {
	var s []string
	for _, ln := range l.order {
		if n := ln.taken(); n > 0 {
			s = append(s, fmt.Sprintf("job %s: %d", ln.name(), n))
		}
	}
	return strings.Join(s, ", ")
}

// dropLane forgets ln once it holds nothing.
func (l *Loop) dropLane(ln *lane) {
	if !ln.idle() || l.lanes[ln.key] != ln {
		return
	}
	delete(l.lanes, ln.key)
	ln.m.Release()
	i := slices.Index(l.order, ln)
	l.order = slices.Delete(l.order, i, i+1)
	if l.rr > i {
		l.rr--
	}
}

// jobs returns the jobs of every lane, forming or running, in lane order.
func (l *Loop) jobs() []*job.Job {
	var js []*job.Job
	for _, ln := range l.order {
		if ln.job != nil {
			js = append(js, ln.job)
		}
	}
	return js
}

// soleLane is the lane of a daemon that runs one job at a time (a
// multi-node daemon), or nil: what the multi-node formation's hooks act on.
func (l *Loop) soleLane() *lane {
	if len(l.order) == 0 {
		return nil
	}
	return l.order[0]
}
