package loop

import (
	"fmt"
	"path/filepath"

	"github.com/hvdd/hvdd/cluster/clusterpb"
	"github.com/hvdd/hvdd/daemon/internal/job"
	"github.com/hvdd/hvdd/daemon/plan"
	"github.com/hvdd/hvdd/daemon/timeline"
	"github.com/hvdd/hvdd/ipc/ipcpb"
	"github.com/hvdd/hvdd/tensor"
)

// Horovod's timeline, as the loop and the executor feed it.
//
// A tensor's row shows, as Horovod's does:
//
//	NEGOTIATE_<OP>   from the first rank's request to the plan's response,
//	  <rank> ticks   one per rank as its request arrives
//	<OP>             from the response to the last rank's answer,
//	  <ACTIVITY>     the execution: SHM_<OP> on one node (hvdd's reduction
//	                 or copy between the ranks' shared-memory buffers);
//	                 across nodes, node 0's phases (phases): SHM_<OP>, the
//	                 engine's <ENGINE>_<OP>, MEMCPY_OUT_FUSION_BUFFER
//
// Across nodes node 0 writes the file, and the other nodes' ranks tick as
// their forwarded requests reach its table; each other node's phases (its
// <OP> with its SHM_, engine and write-back phases) come in TimelineEvents
// and go on that node's track of the row (nodeTrace, traceRemote).
//
// The loop owns the negotiation state (which rows are negotiating); the
// executor only writes the phases of work it runs, through the Writer it was
// handed with the work, so the loop may stop or switch the timeline while a
// batch runs. With no timeline the hooks cost a nil check.

// tracer is the loop's running timeline. The daemon writes one at a time,
// for the job that asked for it.
type tracer struct {
	job         *job.Job // the job it records
	gen         uint32   // counts the timelines this loop started
	w           *timeline.Writer
	markCycles  bool
	negotiating map[job.OpKey]struct{} // rows in NEGOTIATE_*; rank -1 in the key
}

// negotiationName is Horovod's NEGOTIATE_<request type>.
func negotiationName(r *plan.Request) string {
	if r.Op == tensor.Allreduce && r.ReduceOp == tensor.Adasum {
		return "NEGOTIATE_ADASUM"
	}
	return "NEGOTIATE_" + r.Op.String()
}

// submitted records a rank's accepted request, a local one or (on node 0)
// one another node forwarded: the row's negotiation starts with the first
// rank, and every global rank ticks.
func (t *tracer) submitted(r *plan.Request) {
	k := job.OpKey{Rank: -1, Set: r.ProcessSet, Name: r.Name}
	name := job.Row(k.Set, k.Name)
	if _, ok := t.negotiating[k]; !ok {
		t.negotiating[k] = struct{}{}
		t.w.Event(name, timeline.Begin, negotiationName(r))
	}
	t.w.RankReady(name, r.Rank)
}

// tracerOf returns the running timeline if it records j, else nil.
func (l *Loop) tracerOf(j *job.Job) *tracer {
	if l.tl != nil && l.tl.job == j {
		return l.tl
	}
	return nil
}

// traceSink is where j's coordination records the phases of the responses
// it last returned for another node's timeline (CoordinationAcross.TraceSink),
// or nil.
func (l *Loop) traceSink(j *job.Job) job.EventSink {
	if j.Across == nil {
		return nil
	}
	return j.Across.TraceSink()
}

// TraceSubmitted records on the timeline, if one runs, a request another
// node forwarded to the coordinator (loopHooks).
func (l *Loop) TraceSubmitted(r *plan.Request) {
	if l.tl != nil {
		l.tl.submitted(r)
	}
}

// responded ends the negotiation of r's tensors and, for a response that
// runs, starts their top-level phase.
func (t *tracer) responded(r *plan.Response) {
	top := job.TopName(r)
	for _, tn := range r.Tensors {
		k := job.OpKey{Rank: -1, Set: r.ProcessSet, Name: tn.Name}
		name := job.Row(k.Set, k.Name)
		if _, ok := t.negotiating[k]; ok {
			delete(t.negotiating, k)
			t.w.Event(name, timeline.End, "")
		}
		if r.Err == nil {
			t.w.Event(name, timeline.Begin, top)
		}
	}
}

// timelineRequest starts, switches or stops the timeline for c's Timeline
// request id. Only global rank 0's request acts.
func (l *Loop) timelineRequest(c *client, id uint32, m *ipcpb.Timeline) {
	if c.job == nil || !c.job.Formed || c.rank != 0 {
		c.Reply(id, &ipcpb.Done{})
		return
	}
	path := m.GetFilePath()
	if path == "" {
		l.stopTimeline(c.job, func(err error) {
			d := &ipcpb.Done{}
			if err != nil {
				d = &ipcpb.Done{Code: ipcpb.Code_CODE_INTERNAL, Error: err.Error()}
			}
			c.Reply(id, d)
		})
		return
	}
	if !filepath.IsAbs(path) {
		c.Reply(id, &ipcpb.Done{Code: ipcpb.Code_CODE_INVALID_ARGUMENT, Error: fmt.Sprintf("timeline file %q is not an absolute path", path)})
		return
	}
	if err := l.startTimeline(c.job, path, m.GetMarkCycles()); err != nil {
		c.Reply(id, &ipcpb.Done{Code: ipcpb.Code_CODE_INVALID_ARGUMENT, Error: err.Error()})
		return
	}
	c.Reply(id, &ipcpb.Done{})
}

// startTimeline starts j's timeline in the file at path, an absolute path,
// stopping j's in another file; the same file again only updates
// markCycles. Another job's running timeline is an error: the daemon writes
// one at a time.
func (l *Loop) startTimeline(j *job.Job, path string, markCycles bool) error {
	if !filepath.IsAbs(path) {
		return fmt.Errorf("timeline file %q is not an absolute path", path)
	}
	if l.tl != nil && l.tl.job != j {
		return fmt.Errorf("this daemon writes one timeline at a time, and job %s's runs (%s); stop it first, or run the job on its own daemon",
			l.laneOf(l.tl.job).name(), l.tl.w.Path())
	}
	if l.tl != nil && l.tl.w.Path() == path {
		l.tl.markCycles = markCycles
		return nil
	}
	l.stopTimeline(j, nil)
	// Creating the file is the one disk access of the loop's own: once per
	// start.
	w, err := timeline.Create(path, timeline.Options{})
	if err != nil {
		l.cfg.Log.Error("cannot write the timeline", "err", err)
		return err
	}
	l.cfg.Log.Info("timeline started", "file", path, "mark_cycles", markCycles)
	l.tlGen++
	l.tl = &tracer{job: j, gen: l.tlGen, w: w, markCycles: markCycles, negotiating: make(map[job.OpKey]struct{})}
	return nil
}

// helloTimeline starts the timeline global rank 0 asked for in its Hello
// (HOROVOD_TIMELINE), as j forms on the node that holds rank 0.
func (l *Loop) helloTimeline(j *job.Job) {
	if j.Members.Offset != 0 || len(j.Slots) == 0 || j.Slots[0] == nil {
		return
	}
	tl := clientOf(j.Slots[0]).helloMsg.GetTimeline()
	if tl.GetFilePath() == "" {
		return
	}
	if err := l.startTimeline(j, tl.GetFilePath(), tl.GetMarkCycles()); err != nil {
		l.cfg.Log.Error("HOROVOD_TIMELINE: no timeline is written", "err", err)
	}
}

// stopTimeline stops the running timeline, if any and if it records j (any
// job's when j is nil); done (if not nil) is called, on another goroutine,
// once its file is complete.
func (l *Loop) stopTimeline(j *job.Job, done func(error)) {
	t := l.tl
	if t == nil || j != nil && t.job != j {
		if done != nil {
			done(nil)
		}
		return
	}
	l.tl = nil
	log := l.cfg.Log
	l.tlClosing.Add(1)
	t.w.CloseAsync(func(err error) {
		defer l.tlClosing.Done()
		if n := t.w.Dropped(); n > 0 {
			log.Warn("timeline dropped events: its writer could not keep up", "file", t.w.Path(), "dropped", n)
		}
		if err != nil {
			log.Error("timeline failed", "err", err)
		} else {
			log.Info("timeline written", "file", t.w.Path())
		}
		if done != nil {
			done(err)
		}
	})
}

// TraceClock reports the running timeline's generation and clock
// (loopHooks).
func (l *Loop) TraceClock() (uint32, int64, bool) {
	if l.tl == nil {
		return 0, 0, false
	}
	return l.tl.gen, l.tl.w.Now(), true
}

// TraceRemote writes the phases node ran for the timeline of generation
// m.Gen, on the node's track of each row (loopHooks). Events of an earlier
// timeline are dropped.
func (l *Loop) TraceRemote(node int, m *clusterpb.TimelineEvents) {
	if l.tl == nil || m.GetGen() != l.tl.gen {
		return
	}
	for _, e := range m.GetEvents() {
		ph := timeline.Phase(e.GetPh())
		if ph != timeline.Begin && ph != timeline.End {
			continue
		}
		l.tl.w.EventAt(e.GetRow(), ph, e.GetName(), e.GetTsUs(), node)
	}
}
