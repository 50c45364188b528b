package loop

import (
	"bytes"
	"fmt"
	"os"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/hvdd/hvdd/daemon/internal/job"
	"github.com/hvdd/hvdd/ipc/ipcpb"
)

// Elastic jobs (Hello.elastic, HOROVOD_ELASTIC=1). The daemon outlives the
// workers, so a lost rank need not end the job: its epoch fails as any job
// fails (every pending and later op answers the error naming the lost rank),
// the survivors re-initialise (Horovod's reset: shutdown() then init()), and
// the daemon forms the job's next epoch from them, with the same job id, the
// epoch number one higher and the survivors' ranks in their old order (rank 0
// stays on the oldest surviving rank, as Horovod keeps it on a worker with
// up-to-date state). The survivors of an epoch that failed (CODE_ABORTED: a
// lost rank, an engine error) are its ranks that closed with Goodbye; a lost
// rank closed without, and a rank whose process exits (Goodbye.exiting)
// is no survivor: while the job runs, its exit fails the epoch as a lost
// rank does, whether the process failed or not (hvdd run judges that). An epoch whose ranks all said Goodbye without such a
// failure (the job's end) ends as any job ends.
//
// The job grows the same way. A worker that says hello while the job runs or
// re-forms (a new worker of hvdd run's elastic driver) is a joiner: it waits
// in init(), and global rank 0 is told that hosts were updated (ipc
// HostsUpdated, sent with the replies to its collectives; from another node
// through node 0). Horovod's check_host_updates broadcasts rank 0's view at
// the next commit, so every rank raises HostsUpdatedInterrupt at the same
// step and resets; the reset's Goodbye says so (elastic_reset), which fails
// the epoch for all as a lost rank would (nobody has a collective pending),
// and the next epoch is formed from the survivors followed by the joiners.
//
// A survivor whose process has exited instead of re-initialising (checked
// every reformCheckEvery) is dropped, and the epoch forms from the others. If
// the survivors still have not all come back within Config.ElasticTimeout,
// those that did are told so and the job ends. Across nodes every node
// re-forms its own part this way and node 0 lays the epoch out
// (elastic_multinode.go); an epoch laid out that cannot form fails as one
// that ran, its ranks waiting in init() as the survivors (reformUnformed).

// reform is the next epoch of an elastic job whose epoch failed.
type reform struct {
	lane  *lane // the job's lane
	id    uint64
	epoch uint64
	// survivors are the pids of the epoch's local ranks, by new local rank:
	// the failed epoch's survivors, then the workers that joined (joiners).
	survivors []int32
	joiners   int
	failedAt  time.Time
	cause     string
	timer     *time.Timer // the elastic timeout
	check     *time.Timer // the next look for survivors that exited
	// dead says why the epoch cannot form (the other nodes gave it up); its
	// survivors are refused with it as they come back.
	dead string
	// removed is this node's host when hvdd run removed it: the epoch
	// forms without it, and its survivors are told so (dead is set too).
	removed string
	// again says that the epoch before could not form (reformUnformed):
	// the elastic timeout runs from the failure before it.
	again bool
}

// reformCheckEvery is how often a forming epoch looks for survivors whose
// process has exited.
const reformCheckEvery = 500 * time.Millisecond

// Messages of a re-formation: the survivors of r did not all come back in
// time; time to look for survivors that exited.
type (
	msgReformTimeout struct{ r *reform }
	msgReformCheck   struct{ r *reform }
)

// reformAfter begins the next epoch of an elastic job whose failed epoch has
// ended, when it has survivors: an epoch that formed, or one that failed as
// it formed across nodes (reformUnformed).
func (l *Loop) reformAfter(j *job.Job) {
	if !j.Elastic || j.Failed.GetCode() != ipcpb.Code_CODE_ABORTED || !j.Formed && len(j.Survivors) == 0 || l.quit {
		return
	}
	if len(j.Survivors) == 0 {
		why := ""
		if job.IsRankExited(j.Failed.GetError()) {
			why = job.RanksExitedWhy
		}
		l.nextReady(j.Epoch+1, 0, why)
		return
	}
	ln := l.laneOf(j)
	sort.Slice(j.Survivors, func(a, b int) bool { return j.Survivors[a].Rank < j.Survivors[b].Rank })
	r := &reform{lane: ln, id: j.ID, epoch: j.Epoch + 1, failedAt: j.FailedAt, cause: j.Failed.GetError()}
	for _, s := range j.Survivors {
		r.survivors = append(r.survivors, s.Pid)
	}
	// Workers waiting to join come after the survivors (Horovod's "older
	// workers first": rank 0 stays on a survivor, whose state is current).
	for _, c := range ln.joiners {
		r.survivors = append(r.survivors, c.pid)
	}
	r.joiners = len(ln.joiners)
	wait := l.cfg.ElasticTimeout
	if old := ln.reform; old != nil && old.id == j.ID && old.epoch == j.Epoch {
		// The epoch that re-formed could not form (reformUnformed): the
		// wait for one that does goes on, so that epochs that keep failing
		// to form end within the elastic timeout.
		old.stop()
		r.failedAt, r.again = old.failedAt, true
		wait -= time.Since(old.failedAt)
	}
	r.timer = time.AfterFunc(wait, func() { l.p.Post(msgReformTimeout{r}) })
	r.check = time.AfterFunc(reformCheckEvery, func() { l.p.Post(msgReformCheck{r}) })
	ln.reform = r
	// Warn, not Info: a membership change is what the daemon a job starts
	// for itself (hvdd run, --log-level warning) must still show.
	if host := l.removedHost(); host != "" {
		// Horovod's removed workers fail their re-initialisation.
		r.removed = host
		r.dead = fmt.Sprintf("%s has been removed from elastic job", host)
		l.cfg.Log.Warn("elastic job: this host was removed; its ranks leave the job at its next epoch", "job", j.ID, "epoch", r.epoch,
			"pids", pidList(r.survivors))
		l.nextReady(r.epoch, 0, r.dead)
		return
	}
	what := "elastic job lost ranks; its next epoch waits for the survivors"
	if isHostsUpdated(r.cause) {
		what = "elastic job resets after a host update; its next epoch waits for its ranks"
	}
	l.cfg.Log.Warn(what, "job", j.ID, "epoch", r.epoch,
		"survivors", len(r.survivors)-r.joiners, "joining", r.joiners, "pids", pidList(r.survivors), "cause", r.cause)
	l.nextReady(r.epoch, len(r.survivors), "")
}

// nextReady tells the formation across nodes, if the daemon has one, how
// many local ranks will re-initialise into epoch (FormationAcross.NextReady).
func (l *Loop) nextReady(epoch uint64, local int, why string) {
	if l.across != nil {
		l.across.NextReady(epoch, local, why)
	}
}

// removedHost is this node's host once hvdd run's elastic driver removed it
// from the elastic job (FormationAcross.Removed), else "".
func (l *Loop) removedHost() string {
	if l.across == nil {
		return ""
	}
	return l.across.Removed()
}

// reformUnformed fails an epoch of an elastic job that was laid out across
// nodes but could not form (its data engine did not connect, a node of the
// layout was lost) as any failed epoch, with its ranks, still waiting in
// init(), as the survivors: they need not come back, they wait on for the
// next epoch, which the formation began without the nodes that are gone
// (multiCoord.abort, elastic_multinode.go).
func (l *Loop) reformUnformed(j *job.Job, msg string) {
	l.cfg.Log.Warn("elastic job: its epoch could not form across the nodes; the next one forms from the same ranks", "job", j.ID, "epoch", j.Epoch, "err", msg)
	l.fail(j, ipcpb.Code_CODE_ABORTED, msg)
	ln := l.laneOf(j)
	for lr, s := range j.Slots {
		c := clientOf(s)
		if c == nil || c.dropped {
			continue
		}
		j.Survivors = append(j.Survivors, job.Survivor{Rank: lr, Pid: c.pid})
		j.Slots[lr], c.job = nil, nil
		j.Joined--
		j.Open--
		ln.waiting = append(ln.waiting, c) // they say hello again (jobEnded)
	}
	if j.Open == 0 {
		l.jobEnded(j)
	}
}

// joinLater is reformRank's local rank for a worker that joins a later
// epoch than the one forming.
const joinLater = -2

// addJoiner queues c, a worker that joins the elastic job j while it runs
// or re-forms: it waits in init() for the job's next epoch, and global rank
// 0 is told that hosts were updated, so that every rank resets at its next
// commit (Horovod's HostsUpdatedInterrupt).
func (l *Loop) addJoiner(c *client, j *job.Job) {
	ln := l.laneOf(j)
	if !slices.Contains(ln.joiners, c) {
		ln.joiners = append(ln.joiners, c)
	}
	l.cfg.Log.Warn("a worker waits to join the elastic job at its next epoch", "job", j.ID, "pid", c.pid, "waiting", len(ln.joiners))
	l.laneHostsUpdated(ln, job.HostsAdded)
}

// HostsUpdated tells global rank 0 of the running elastic job that its
// hosts changed (loopHooks: the multi-node formation's, whose daemon runs
// one job at a time).
func (l *Loop) HostsUpdated(result int32) {
	if ln := l.soleLane(); ln != nil {
		l.laneHostsUpdated(ln, result)
	}
}

// laneHostsUpdated tells global rank 0 of ln's elastic job, if it runs,
// that its hosts changed (result): here, or through the coordinator when
// rank 0 is on another node.
func (l *Loop) laneHostsUpdated(ln *lane, result int32) {
	j := ln.job
	if j == nil || !j.Elastic || !j.Formed || j.Failed != nil {
		return
	}
	u := &ipcpb.HostsUpdated{Timestamp: time.Now().UnixMilli(), Result: result}
	if j.Members.Offset == 0 && len(j.Slots) > 0 && j.Slots[0] != nil {
		j.Slots[0].SendBatch([]uint32{0}, []*ipcpb.ServerMessage{{Msg: &ipcpb.ServerMessage_HostsUpdated{HostsUpdated: u}}})
		return
	}
	if j.Across != nil {
		j.Across.HostsUpdated(u)
	}
}

// hostsUpdatedCause ends the message of an epoch that ends because its ranks
// reset after a host update (job.HostsUpdatedCause).
const hostsUpdatedCause = job.HostsUpdatedCause

// isHostsUpdated reports whether msg ends an epoch for a host update.
func isHostsUpdated(msg string) bool { return job.IsHostsUpdated(msg) }

// seatJoiners, once ln's job has ended, seats the waiting workers in the
// epoch that re-forms it, or refuses them when the job is over.
func (l *Loop) seatJoiners(ln *lane) {
	r := ln.reform
	js := ln.joiners
	ln.joiners = nil
	for _, c := range js {
		switch {
		case r != nil && r.dead == "" && slices.Contains(r.survivors, c.pid):
			l.hello(c, c.helloMsg)
		case r != nil || ln.job != nil:
			ln.joiners = append(ln.joiners, c) // a later epoch
		default:
			l.refuse(c, "the elastic job this worker was to join has ended (no rank of it re-initialised)")
		}
	}
}

// ReformFailed gives up the forming epoch (loopHooks): the other nodes
// cannot form it. The survivors that joined get msg, and so do those still
// to come back.
func (l *Loop) ReformFailed(epoch uint64, msg string) {
	ln := l.soleLane()
	if ln == nil {
		return
	}
	if j := ln.job; j != nil && j.Elastic && j.Epoch == epoch && !j.Formed && j.Failed == nil {
		l.FormFailed(j, msg)
	}
	if r := ln.reform; r != nil && r.epoch == epoch {
		r.dead = msg
	}
}

// reformRank is the local rank a hello takes in the forming epoch: its
// place among the survivors, or a reason to refuse it.
func (l *Loop) reformRank(ln *lane, c *client, h *ipcpb.Hello) (lr int, refusal string) {
	r := ln.reform
	lr = slices.Index(r.survivors, c.pid)
	if r.dead != "" {
		if lr < 0 {
			return int(h.GetLocalRank()), "" // not a survivor: a job of its own
		}
		r.survivors = slices.Delete(r.survivors, lr, lr+1)
		if len(r.survivors) == 0 {
			r.stop()
			ln.reform = nil
		}
		if r.removed != "" {
			return -1, fmt.Sprintf("%s[%d] has been removed from elastic job", r.removed, h.GetLocalRank())
		}
		return -1, r.dead
	}
	if lr < 0 && h.GetElastic() {
		// A worker that joins the job: in the epoch after this one.
		if j := ln.job; j != nil && j.ID == r.id {
			l.addJoiner(c, j)
		} else if !slices.Contains(ln.joiners, c) {
			ln.joiners = append(ln.joiners, c)
		}
		return joinLater, ""
	}
	if lr < 0 || !h.GetElastic() {
		return -1, fmt.Sprintf("this daemon is re-forming elastic job %d (epoch %d) from its surviving ranks (pids %s); new workers cannot join it yet",
			r.id, r.epoch, pidList(r.survivors))
	}
	return lr, ""
}

// reformed ends a re-formation when the epoch has formed.
func (l *Loop) reformed(j *job.Job) {
	ln := l.laneOf(j)
	r := ln.reform
	if r == nil || r.id != j.ID || r.epoch != j.Epoch {
		return
	}
	r.stop()
	ln.reform = nil
	l.cfg.Log.Warn("elastic job re-formed", "job", j.ID, "epoch", r.epoch, "size", j.Members.Size,
		"pids", j.PIDs(), "after", time.Since(r.failedAt).Round(time.Millisecond), "cause", r.cause)
	if len(ln.joiners) > 0 {
		// Workers came while it formed: the next epoch takes them.
		l.laneHostsUpdated(ln, job.HostsAdded)
	}
}

// reformTimeout gives up a re-formation whose survivors did not all return.
func (l *Loop) reformTimeout(r *reform) {
	ln := r.lane
	if ln.reform != r {
		return
	}
	r.stop()
	ln.reform = nil
	if r.dead != "" {
		l.endLane(ln)
		return
	}
	msg := fmt.Sprintf("Timed out waiting for the %d surviving ranks of elastic job %d to re-initialise into epoch %d (waited %v, --elastic-timeout): pids %s",
		len(r.survivors), r.id, r.epoch, l.cfg.ElasticTimeout, pidList(r.survivors))
	if r.again {
		msg += fmt.Sprintf("; epoch %d could not form across the nodes: %s", r.epoch-1, r.cause)
	}
	if j := ln.job; j != nil && j.ID == r.id && !j.Formed {
		l.FormFailed(j, msg)
	} else {
		l.cfg.Log.Warn(msg)
	}
	l.nextReady(r.epoch, 0, msg)
	l.seatJoiners(ln)
	l.endLane(ln)
}

// stop stops r's timers.
func (r *reform) stop() {
	r.timer.Stop()
	r.check.Stop()
}

// reformCheck drops the survivors of r whose process has exited without
// coming back, and forms the epoch from the others when they are all there.
func (l *Loop) reformCheck(r *reform) {
	ln := r.lane
	if ln.reform != r {
		return
	}
	j := ln.job
	if j != nil && (j.ID != r.id || j.Formed) {
		j = nil
	}
	var alive, gone []int32
	for _, pid := range r.survivors {
		if j != nil && slices.ContainsFunc(j.Slots, func(c job.Conn) bool { return c != nil && c.PID() == pid }) || processAlive(pid) {
			alive = append(alive, pid)
		} else {
			gone = append(gone, pid)
		}
	}
	if len(gone) == 0 {
		r.check = time.AfterFunc(reformCheckEvery, func() { l.p.Post(msgReformCheck{r}) })
		return
	}
	l.cfg.Log.Warn("survivors of the elastic job exited instead of re-initialising; its next epoch forms without them",
		"job", r.id, "epoch", r.epoch, "gone", pidList(gone), "survivors", len(alive))
	r.survivors = alive
	if len(alive) == 0 {
		r.stop()
		ln.reform = nil
		l.nextReady(r.epoch, 0, "its surviving ranks exited instead of re-initialising")
		l.seatJoiners(ln)
		l.endLane(ln)
		return
	}
	r.check = time.AfterFunc(reformCheckEvery, func() { l.p.Post(msgReformCheck{r}) })
	if j == nil {
		return
	}
	// The joined survivors move up to their places among the others.
	slots := make([]job.Conn, len(alive))
	for _, s := range j.Slots {
		if c := clientOf(s); c != nil {
			lr := slices.Index(alive, c.pid)
			slots[lr], c.localRank, c.rank = c, lr, lr
		}
	}
	j.Slots = slots
	if j.Joined == len(slots) {
		l.nodes.Complete(j)
	}
}

// processAlive reports whether a process exists and has not exited (a
// zombie, exited but not yet reaped, counts as exited).
func processAlive(pid int32) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// pid (comm) state ...: comm may hold spaces and parentheses.
	i := bytes.LastIndexByte(b, ')')
	return i >= 0 && i+2 < len(b) && b[i+2] != 'Z' && b[i+2] != 'X'
}

func pidList(pids []int32) string {
	s := make([]string, len(pids))
	for i, p := range pids {
		s[i] = fmt.Sprint(p)
	}
	return strings.Join(s, " ")
}
