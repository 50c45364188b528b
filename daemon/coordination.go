package daemon

import (
	"errors"
	"fmt"

	"github.com/hvdd/hvdd/backends"
	"github.com/hvdd/hvdd/cluster/clusterpb"
	"github.com/hvdd/hvdd/daemon/plan"
	"github.com/hvdd/hvdd/ipc/ipcpb"
)

// The loop's two seams. A daemon forms jobs through a formation: alone
// (oneNode, below) or with the daemons of other nodes (multiNode,
// multinode.go). A formed job negotiates its tensors through a coordination:
// over a plan.Table on one node (localCoord, below), or across nodes as
// coordinator or follower (multiCoord, multinode_job.go). The loop calls
// both from its goroutine only, and they reach the loop only through
// loopHooks. Whatever differs between one node and several lives behind
// these two interfaces; the loop itself has no multi-node branch.

// formation is how the daemon forms a job once its local clients are there.
type formation interface {
	// complete is called when every local client of j has said hello. The
	// formation ends in loopHooks.start, or in formFailed.
	complete(j *job)
	// ended is called when the last client of j has left.
	ended(j *job)
	// message handles a message the formation posted to the loop; it
	// reports false for one that is not its own.
	message(m any) bool
	// readable handles a readable descriptor of the formation's own (a
	// control link); it reports false for one that is not its own.
	readable(fd int) bool
	// nextReady is told, when the failed epoch of an elastic job has ended
	// here, how many local ranks will re-initialise into epoch, the next one
	// (elastic.go): none when every local rank is gone or the re-formation
	// gave up (why says why).
	nextReady(epoch uint64, local int, why string)
	// removed returns the name of this node's host once hvdd run's elastic
	// driver removed it from the elastic job, else "".
	removed() string
	// close releases what the formation holds when the daemon stops.
	Close()
}

// coordination negotiates the tensors of one job: it takes its local ranks'
// requests and decides which responses run, in which order, on every node.
type coordination interface {
	// submit takes a local rank's request. It adds an accepted op to the
	// job's pending ops; a non-nil Done refuses it, and the loop answers the
	// op with it.
	submit(o *op) *ipcpb.Done
	// flush sends what this pass of the loop made ready (to the other
	// nodes); the loop calls it before dispatching.
	flush()
	// next returns the next responses to run, called while the executor is
	// idle and until it returns nil: the responses in the job's pending ops
	// that every node runs in the same order.
	next() []plan.Response
	// expect says whether local requests are pending, after each pass.
	expect(pending bool)
	// engine is the job's cross-node data engine; nil on one node.
	engine() backends.Backend
	// stalls reports the tensors waiting longer than olderThan ms for some
	// ranks, where this node negotiates them (plan.Table.Stalls).
	stalls(now, olderThan int64) []plan.Stall
	// setRequest takes a local rank's AddProcessSet or RemoveProcessSet
	// (procset.go): the coordination decides its round once every rank has
	// reached it, or passes it to the node that decides, and answers it.
	setRequest(r psReq)
	// abort is called as the job fails with code and msg, before its pending
	// ops are answered. With notify it tells the other nodes; it closes the
	// engine, so that a blocked collective returns.
	abort(code ipcpb.Code, msg string, notify bool)
	// end releases the job's links and engine once its last client left.
	end()
	// hostsUpdated passes a host-update notification on to global rank 0's
	// node (elastic.go); only a node without rank 0 is asked to.
	hostsUpdated(u *ipcpb.HostsUpdated)
	// traceSink is where the phases of the responses next() last returned
	// go, on a node that records them for another's timeline; nil if none.
	traceSink() eventSink
	// traceSent hands the phases recorded so far to the node that writes
	// the timeline; called while the executor is idle.
	traceSent()
	// coordinates reports whether this node decides the job's plans (and
	// so runs its autotuner).
	coordinates() bool
	// retune applies the autotuner's settings on the deciding node: the
	// fusion threshold to its table at once; across nodes every setting
	// travels in the next plan, and each node applies it (loopHooks.tuned,
	// the engine's) before that plan's responses.
	retune(s settings)
}

// setRegistry registers and removes process sets; *plan.Table is one.
type setRegistry interface {
	Size() int // the number of global ranks
	AddProcessSet(id int32, ranks []int) error
	RemoveProcessSet(id int32) ([]plan.Aborted, error)
}

// loopHooks is what a formation or a coordination may ask of the loop.
type loopHooks interface {
	// now is the plan's logical clock (ms).
	now() int64
	// executing reports whether the executor is running a batch.
	executing() bool
	// current reports whether j is the daemon's job still.
	current(j *job) bool
	// start begins a formed job: it welcomes the local clients.
	start(j *job, m membership, c coordination)
	// abort fails j with a cause (see coordination.abort for notify).
	abort(j *job, code ipcpb.Code, msg string, notify bool)
	// formFailed ends a job that could not form: its clients get msg.
	formFailed(j *job, msg string)
	// reformFailed gives up the forming epoch of an elastic job: the
	// survivors get msg.
	reformFailed(epoch uint64, msg string)
	// hostsUpdated tells global rank 0 of the running elastic job, if one
	// runs, that its hosts changed: result is Horovod's HostUpdateResult
	// (hostsAdded: workers wait to join it, from this node or another, or
	// a node joins; hostsRemoved: a node's host is removed).
	hostsUpdated(result int32)
	// traceSubmitted records a request another node forwarded on the
	// timeline, if one runs (node 0 writes it).
	traceSubmitted(r *plan.Request)
	// traceClock is the timeline's generation and clock (µs) if this node
	// writes one (the coordinator's plans carry it).
	traceClock() (gen uint32, now int64, ok bool)
	// traceRemote writes another node's phases into the timeline, if the
	// one they were recorded for still runs.
	traceRemote(node int, m *clusterpb.TimelineEvents)
	// tuned applies the loop's part of the autotuner's settings (cycle
	// time, spin window), as a plan of the coordinator's brought them.
	tuned(s settings)
}

// oneNode forms every job on this node alone.
type oneNode struct {
	hooks           loopHooks
	fusionThreshold int64
}

func (f *oneNode) complete(j *job) {
	t, err := plan.New(plan.Config{Size: len(j.slots), FusionThreshold: f.fusionThreshold})
	if err != nil {
		f.hooks.formFailed(j, fmt.Sprintf("cannot start the job: %v", err))
		return
	}
	c := &localCoord{j: j, t: t, hooks: f.hooks}
	j.coord = c
	f.hooks.start(j, newMembership([]int{len(j.slots)}, 0), c)
}

func (f *oneNode) ended(*job) {}

func (f *oneNode) message(any) bool { return false }

func (f *oneNode) readable(int) bool { return false }

func (f *oneNode) Close() {}

func (f *oneNode) nextReady(uint64, int, string) {}

func (f *oneNode) removed() string { return "" }

// localCoord negotiates a job of one node over a plan table.
type localCoord struct {
	j     *job
	t     *plan.Table
	hooks loopHooks
}

func (c *localCoord) submit(o *op) *ipcpb.Done { return tableSubmit(c.t, c.j, o, c.hooks.now()) }

func (c *localCoord) next() []plan.Response { return c.t.Ready() }

func (c *localCoord) stalls(now, olderThan int64) []plan.Stall { return c.t.Stalls(now, olderThan) }

func (c *localCoord) setRequest(r psReq) { c.j.settleLocal(r, c.t) }

func (c *localCoord) abort(ipcpb.Code, string, bool) {}

func (c *localCoord) flush() {}

func (c *localCoord) expect(bool) {}

func (c *localCoord) end() {}

func (c *localCoord) hostsUpdated(*ipcpb.HostsUpdated) {}

func (c *localCoord) engine() backends.Backend { return nil }

func (c *localCoord) traceSink() eventSink { return nil }

func (c *localCoord) traceSent() {}

func (c *localCoord) coordinates() bool { return true }

func (c *localCoord) retune(s settings) {
	// The threshold is never negative here (tuner.settings).
	c.t.SetFusionThreshold(s.fusion)
}

// tableSubmit submits o to t and adds it to j's pending ops, or returns the
// Done that refuses it.
func tableSubmit(t *plan.Table, j *job, o *op, now int64) *ipcpb.Done {
	if err := t.Submit(o.req, now); err != nil {
		code := ipcpb.Code_CODE_INVALID_ARGUMENT
		if errors.Is(err, plan.ErrDuplicateName) {
			code = ipcpb.Code_CODE_DUPLICATE_NAME
		}
		return &ipcpb.Done{Code: code, Error: err.Error()}
	}
	j.pending[opKey{o.req.Rank, o.req.ProcessSet, o.req.Name}] = o
	return nil
}
