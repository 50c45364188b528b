package loop

import (
	"os"
	"runtime"
	"time"

	"github.com/hvdd/hvdd/backends"
	"github.com/hvdd/hvdd/daemon/internal/job"
	"github.com/hvdd/hvdd/ipc/ipcpb"
)

// hvdd status (ipc StatusRequest). A connection that asks for the daemon's
// status instead of saying Hello joins no job; the loop answers each request
// with a snapshot of what it owns: its jobs (lanes.go), their ranks, the
// tensors they wait on (where this daemon negotiates them: the plan table of
// a job of one node, or of the coordinator across nodes, which also knows
// every other node's ranks from their Joins), the last errors, and the
// engine's byte counters per peer node (the command computes rates from two
// snapshots), and the node's GPUs as the Server's sampler last saw them
// (Server.GPUStatus). Root and the daemon's own uid see every job; other
// users see theirs, and how many others there are.

// maxErrors is how many recent errors the status keeps.
const maxErrors = 20

// defaultMaxPending is how many pending tensors a job's status lists when
// the request does not say.
const defaultMaxPending = 100

// noteError records an error for the status: a failed job, a refused
// process, a tensor that failed.
func (l *Loop) noteError(j *job.Job, msg string) {
	e := &ipcpb.StatusError{AtMs: time.Now().UnixMilli(), Error: msg}
	if j != nil {
		e.Job = j.ID
		e.JobName = j.Name
	}
	if len(l.errs) == maxErrors {
		copy(l.errs, l.errs[1:])
		l.errs = l.errs[:maxErrors-1]
	}
	l.errs = append(l.errs, e)
}

// statusRequest answers c's StatusRequest.
func (l *Loop) statusRequest(c *client, id uint32, req *ipcpb.StatusRequest) {
	c.status = true
	c.sendSocket(id, &ipcpb.ServerMessage{Msg: &ipcpb.ServerMessage_Status{Status: l.status(c.uid, int(req.GetMaxPending()))}}, -1)
}

// status is the daemon's status as uid may see it.
func (l *Loop) status(uid uint32, maxPending int) *ipcpb.Status {
	if maxPending <= 0 {
		maxPending = defaultMaxPending
	}
	host, _ := os.Hostname()
	all := uid == 0 || uid == l.cfg.UID
	st := &ipcpb.Status{
		Version: DaemonVersion, StartedMs: l.epoch.UnixMilli(), NowMs: time.Now().UnixMilli(),
		Slots: int32(l.cfg.Slots), NodeRank: int32(l.cfg.NodeRank), Nodes: int32(max(l.cfg.Nodes, 1)),
		Host: host, Pid: int32(os.Getpid()), Clients: int32(len(l.clients)),
		Goroutines: int32(runtime.NumGoroutine()), OpenFds: openFDs(),
	}
	for _, ln := range l.order {
		st.SlotsUsed += int32(ln.taken())
		if !all && ln.key.uid != uid {
			st.HiddenJobs++
			continue
		}
		st.Jobs = append(st.Jobs, l.jobStatus(ln, host, maxPending))
	}
	for _, e := range l.errs {
		if all || e.GetJob() == 0 || l.ownsJob(uid, e.GetJob()) {
			st.Errors = append(st.Errors, e)
		}
	}
	// The node's GPUs, as the Server's sampler last saw them: every user
	// may see them, as nvidia-smi shows them to everyone.
	if l.s != nil {
		l.s.GPUStatus(st)
	}
	return st
}

// ownsJob reports whether a current job of uid has this id.
func (l *Loop) ownsJob(uid uint32, id uint64) bool {
	for _, ln := range l.order {
		if ln.key.uid == uid && ln.job != nil && ln.job.ID == id {
			return true
		}
	}
	return false
}

// jobStatus is the status of ln's job (or of its next epoch while that
// forms).
func (l *Loop) jobStatus(ln *lane, host string, maxPending int) *ipcpb.JobStatus {
	js := &ipcpb.JobStatus{Name: ln.key.name, Uid: ln.key.uid, LocalSize: int32(ln.size)}
	j := ln.job
	if j == nil {
		if r := ln.reform; r != nil {
			js.Id, js.Epoch, js.State, js.Elastic = r.id, r.epoch, "re-forming", true
			js.Error = r.cause
			for lr, pid := range r.survivors {
				js.Ranks = append(js.Ranks, &ipcpb.RankStatus{Rank: -1, LocalRank: int32(lr), Pid: pid, Host: host, Node: int32(l.cfg.NodeRank)})
			}
		} else {
			js.State = "waiting"
		}
		return js
	}
	js.Id, js.Epoch, js.Elastic = j.ID, j.Epoch, j.Elastic
	js.Batches, js.Responses, js.Tensors, js.Bytes = j.Stats.Batches, j.Stats.Responses, j.Stats.Tensors, j.Stats.Bytes
	switch {
	case j.Failed != nil:
		js.State, js.Error = "failed", j.Failed.GetError()
	case !j.Formed:
		js.State = "forming"
	default:
		js.State = "running"
		js.FormedMs = j.FormedAt.UnixMilli()
		js.Size = int32(j.Members.Size)
	}
	inFlight := map[int]int32{}
	for k := range j.Pending {
		inFlight[k.Rank]++
	}
	for lr, s := range j.Slots {
		c := clientOf(s)
		if c == nil {
			continue
		}
		rs := &ipcpb.RankStatus{Rank: int32(c.rank), LocalRank: int32(lr), Pid: c.pid, Uid: c.uid, UidKnown: true,
			Host: host, Node: int32(j.Members.Node), InFlight: inFlight[c.rank]}
		if !j.Formed {
			rs.Rank = -1
		}
		js.Ranks = append(js.Ranks, rs)
	}
	if j.Formed {
		for _, nr := range j.NodeRanks {
			lo, _ := j.Members.NodeRanks(nr.Node)
			for lr, pid := range nr.PIDs {
				js.Ranks = append(js.Ranks, &ipcpb.RankStatus{Rank: int32(lo + lr), LocalRank: int32(lr), Pid: pid, Host: nr.Host, Node: int32(nr.Node)})
			}
		}
	}
	if j.Coord != nil && j.Formed && j.Failed == nil {
		now := l.Now()
		pend := append(j.Coord.Stalls(now, -1), l.p2pStalls(j, now, -1)...)
		js.PendingTotal = int32(len(pend))
		for i, p := range pend {
			if i == maxPending {
				break
			}
			pt := &ipcpb.PendingTensor{Name: p.Name, ProcessSet: p.ProcessSet, WaitingMs: now - p.FirstSubmit}
			for _, r := range p.Submitted {
				pt.Submitted = append(pt.Submitted, int32(r))
			}
			for _, r := range p.Missing {
				pt.Missing = append(pt.Missing, int32(r))
			}
			js.Pending = append(js.Pending, pt)
		}
		if b := j.Engine(); b != nil {
			js.Engine = b.Name()
			if sr, ok := b.(backends.StatsReporter); ok {
				s := sr.Stats()
				for peer := range s.SentBytes {
					if peer == j.Members.Node {
						continue
					}
					js.Links = append(js.Links, &ipcpb.LinkStatus{PeerNode: int32(peer), SentBytes: s.SentBytes[peer], RecvBytes: s.RecvBytes[peer]})
				}
			}
		}
	}
	return js
}

// openFDs counts the daemon's open file descriptors (Linux's /proc/self/fd,
// less the one reading it); 0 where that cannot be read.
func openFDs() int32 {
	d, err := os.Open("/proc/self/fd")
	if err != nil {
		return 0
	}
	defer d.Close()
	names, err := d.Readdirnames(-1)
	if err != nil {
		return 0
	}
	return int32(len(names) - 1)
}
