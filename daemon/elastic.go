package daemon

import (
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

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
// rank closed without. An epoch whose ranks all said Goodbye without such a
// failure (the job's end, or every rank resetting at once after a host
// update) ends as any job ends, and the next job forms from the hellos that
// come, as any job forms. Hellos of processes
// that are not survivors are refused while the next epoch forms. If the
// survivors have not all come back within Config.ElasticTimeout, those that
// did are told so and the job ends. One node only, so far.

// reform is the next epoch of an elastic job whose epoch failed.
type reform struct {
	id        uint64
	epoch     uint64
	survivors []int32 // pids, by new local rank
	failedAt  time.Time
	cause     string
	timer     *time.Timer
}

// msgReformTimeout: the survivors of r did not all come back in time.
type msgReformTimeout struct{ r *reform }

// survivor is a rank of a failed elastic epoch that went on to re-initialise.
type survivor struct {
	rank int
	pid  int32
}

// noteSurvivor records c, closing its connection with Goodbye, as a
// survivor should its elastic epoch fail.
func (j *job) noteSurvivor(c *client) {
	j.survivors = append(j.survivors, survivor{rank: c.rank, pid: c.pid})
}

// reformAfter begins the next epoch of an elastic job whose failed epoch has
// ended, when it has survivors.
func (l *loop) reformAfter(j *job) {
	if !j.elastic || j.failed.GetCode() != ipcpb.Code_CODE_ABORTED || !j.formed || len(j.survivors) == 0 || l.quit {
		return
	}
	sort.Slice(j.survivors, func(a, b int) bool { return j.survivors[a].rank < j.survivors[b].rank })
	r := &reform{id: j.id, epoch: j.members.epoch + 1, failedAt: j.failedAt, cause: j.failed.GetError()}
	for _, s := range j.survivors {
		r.survivors = append(r.survivors, s.pid)
	}
	r.timer = time.AfterFunc(l.cfg.ElasticTimeout, func() { l.p.post(msgReformTimeout{r}) })
	l.reform = r
	// Warn, not Info: a membership change is what the daemon a job starts
	// for itself (hvdd run, --log-level warning) must still show.
	l.s.log.Warn("elastic job lost ranks; its next epoch waits for the survivors", "job", j.id, "epoch", r.epoch,
		"survivors", len(r.survivors), "pids", pidList(r.survivors), "cause", r.cause)
}

// reformSlot places a hello during a re-formation: the new job (epoch) it
// joins and its local rank there, or a reason to refuse it.
func (l *loop) reformSlot(c *client, h *ipcpb.Hello) (lr int, refusal string) {
	r := l.reform
	lr = slices.Index(r.survivors, c.pid)
	if lr < 0 || !h.GetElastic() {
		return -1, fmt.Sprintf("this daemon is re-forming elastic job %d (epoch %d) from its surviving ranks (pids %s); new workers cannot join it yet",
			r.id, r.epoch, pidList(r.survivors))
	}
	if l.job == nil {
		l.job = &job{id: r.id, elastic: true, epoch: r.epoch, slots: make([]*client, len(r.survivors)), pending: make(map[opKey]*op)}
	}
	return lr, ""
}

// reformed ends a re-formation when the epoch has formed.
func (l *loop) reformed(j *job) {
	r := l.reform
	if r == nil || r.id != j.id || r.epoch != j.epoch {
		return
	}
	r.timer.Stop()
	l.reform = nil
	l.s.log.Warn("elastic job re-formed", "job", j.id, "epoch", r.epoch, "size", j.members.size,
		"pids", j.pids(), "after", time.Since(r.failedAt).Round(time.Millisecond), "cause", r.cause)
}

// reformTimeout gives up a re-formation whose survivors did not all return.
func (l *loop) reformTimeout(r *reform) {
	if l.reform != r {
		return
	}
	l.reform = nil
	msg := fmt.Sprintf("Timed out waiting for the %d surviving ranks of elastic job %d to re-initialise into epoch %d (waited %v, --elastic-timeout): pids %s",
		len(r.survivors), r.id, r.epoch, l.cfg.ElasticTimeout, pidList(r.survivors))
	if j := l.job; j != nil && j.id == r.id && !j.formed {
		l.formFailed(j, msg)
		return
	}
	l.s.log.Warn(msg)
}

func pidList(pids []int32) string {
	s := make([]string, len(pids))
	for i, p := range pids {
		s[i] = fmt.Sprint(p)
	}
	return strings.Join(s, " ")
}
