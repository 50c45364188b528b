package job

import (
	"errors"
	"time"

	"github.com/hvdd/hvdd/backends"
	"github.com/hvdd/hvdd/cluster/clusterpb"
	"github.com/hvdd/hvdd/daemon/plan"
	"github.com/hvdd/hvdd/ipc/ipcpb"
)

// Formation is how the daemon forms a job once its local clients are there.
// A formation across nodes is a FormationAcross too; the loop probes it
// once, when it is made.
type Formation interface {
	// Complete is called when every local client of j has said hello. The
	// formation sets j's coordination (Job.SetCoord) and ends in
	// LoopHooks.Start, or in FormFailed.
	Complete(j *Job)
	// Ended is called when the last client of j has left.
	Ended(j *Job)
	// Close releases what the formation holds when the daemon stops.
	Close()
}

// FormationAcross is what a formation has only across nodes: its control
// links, which post to the loop and which the loop polls, the elastic
// re-forming it takes part in with the other nodes, and the links'
// figures. A formation without it (on one node) has none of these.
type FormationAcross interface {
	// Message handles a message the formation posted to the loop; it
	// reports false for one that is not its own.
	Message(m any) bool
	// Readable handles a readable descriptor of the formation's own (a
	// control link); it reports false for one that is not its own.
	Readable(fd int) bool
	// NextReady is told, when the failed epoch of an elastic job has ended
	// here, how many local ranks will re-initialise into epoch, the next
	// one (the loop's elastic re-forming): none when every local rank is
	// gone or the re-formation gave up (why says why).
	NextReady(epoch uint64, local int, why string)
	// Removed returns the name of this node's host once hvdd run's elastic
	// driver removed it from the elastic job, else "".
	Removed() string
	// RankExiting is told that a local rank of the running elastic job,
	// the worker named worker (its HVDD_WORKER), left it with a Goodbye that
	// says its process exits (Goodbye.exiting).
	RankExiting(worker string)
	// Links reports this node's links to the other nodes, by their
	// --node-rank, for the metrics: what every job's engine (jobs, the
	// running ones; the ended ones' counts are kept) exchanged with each,
	// and the control links' round-trip times.
	Links(jobs []*Job) map[int]*LinkStats
}

// LinkStats is this node's link to another node: the engines' bytes (every
// job's since the daemon started) and the control link's round-trip time.
type LinkStats struct {
	Sent, Recv int64
	Bytes      bool // the engine counts bytes (backends.StatsReporter)
	RTT        time.Duration
}

// Coordination negotiates the tensors of one job: it takes its local ranks'
// requests and decides which responses run, in which order, on every node.
// A coordination across nodes is a CoordinationAcross too; the one of a job
// on one node need not be.
type Coordination interface {
	// Submit takes a local rank's request. It adds an accepted op to the
	// job's pending ops; a non-nil Done refuses it, and the loop answers the
	// op with it.
	Submit(o *Op) *ipcpb.Done
	// Next returns the next responses to run, called while the executor is
	// idle and until it returns nil: the responses in the job's pending ops
	// that every node runs in the same order.
	Next() []plan.Response
	// Stalls reports the tensors waiting longer than olderThan ms for some
	// ranks, where this node negotiates them (plan.Table.Stalls).
	Stalls(now, olderThan int64) []plan.Stall
	// SetRequest takes a local rank's AddProcessSet or RemoveProcessSet
	// (Job.QueueSet): the coordination decides its round once every rank has
	// reached it, or passes it to the node that decides, and answers it.
	SetRequest(r SetReq)
	// Coordinates reports whether this node decides the job's plans (and
	// so runs its autotuner).
	Coordinates() bool
	// Retune applies the autotuner's settings on the deciding node: the
	// fusion threshold to its table at once; across nodes every setting
	// travels in the next plan, and each node applies it
	// (LoopHooksAcross.Tuned, the engine's) before that plan's responses.
	Retune(s Settings)
}

// CoordinationAcross is what a coordination has only across nodes: the
// links to the other nodes (what to send them, when, and their end), the
// data engine between the nodes, and the timeline's phases recorded here
// for another node's file. Job.SetCoord probes a job's coordination for it
// once, as the job forms; a job whose coordination is none (on one node)
// has a nil Job.Across, and the loop then does nothing of these.
type CoordinationAcross interface {
	// Flush sends what this pass of the loop made ready to the other
	// nodes; the loop calls it before dispatching.
	Flush()
	// Expect says whether local requests are pending, after each pass.
	Expect(pending bool)
	// Engine is the job's cross-node data engine; nil while the job forms,
	// and when it has none.
	Engine() backends.Backend
	// NCCLID is the job's NCCL unique id for the communicator across
	// nodes, once a plan brought it; nil until then.
	NCCLID() []byte
	// Abort is called as the job fails with code and msg, before its pending
	// ops are answered. With notify it tells the other nodes; it closes the
	// engine, so that a blocked collective returns.
	Abort(code ipcpb.Code, msg string, notify bool)
	// Lost is told, before the Abort that follows, that the job fails for
	// the loss of node (its place in the job), which the engine reported:
	// the Abort then names it to the other nodes, and every node closes its
	// engine naming it (backends.LostCloser), as for a lost control link.
	// It does nothing once the job failed, or for a node outside the job.
	Lost(node int)
	// End releases the job's links and engine once its last client left.
	End()
	// HostsUpdated passes a host-update notification on to global rank 0's
	// node; only a node without rank 0 is asked to.
	HostsUpdated(u *ipcpb.HostsUpdated)
	// TraceSink is where the phases of the responses Next last returned
	// go, on a node that records them for another's timeline; nil if none.
	TraceSink() EventSink
	// TraceSent hands the phases recorded so far to the node that writes
	// the timeline; called while the executor is idle.
	TraceSent()
}

// SetRegistry registers and removes process sets; *plan.Table is one.
type SetRegistry interface {
	Size() int // the number of global ranks
	AddProcessSet(id int32, ranks []int) error
	RemoveProcessSet(id int32) ([]plan.Aborted, error)
}

// LoopHooks is what a formation or a coordination may ask of the loop.
// The loop's hooks are LoopHooksAcross too, which a formation across nodes
// probes for once, when it is made.
type LoopHooks interface {
	// Now is the plan's logical clock (ms).
	Now() int64
	// Executing reports whether the executor is running a batch.
	Executing() bool
	// Current reports whether j is the daemon's job still.
	Current(j *Job) bool
	// Start begins a formed job, whose coordination the formation set
	// (Job.SetCoord): it welcomes the local clients.
	Start(j *Job, m Membership)
	// Abort fails j with a cause (see CoordinationAcross.Abort for notify).
	Abort(j *Job, code ipcpb.Code, msg string, notify bool)
	// FormFailed ends a job that could not form: its clients get msg.
	FormFailed(j *Job, msg string)
}

// LoopHooksAcross is what only a formation or coordination across nodes
// asks of the loop besides LoopHooks: to give up an elastic epoch the
// other nodes cannot form, to pass on another node's host update, to
// write another node's requests and phases into the timeline, and to apply
// the settings a plan of the coordinator's brought.
type LoopHooksAcross interface {
	LoopHooks
	// ReformFailed gives up the forming epoch of an elastic job: the
	// survivors get msg.
	ReformFailed(epoch uint64, msg string)
	// HostsUpdated tells global rank 0 of the running elastic job, if one
	// runs, that its hosts changed: result is Horovod's HostUpdateResult
	// (hostsAdded: workers wait to join it, from this node or another, or
	// a node joins; hostsRemoved: a node's host is removed).
	HostsUpdated(result int32)
	// TraceSubmitted records a request another node forwarded on the
	// timeline, if one runs (node 0 writes it).
	TraceSubmitted(r *plan.Request)
	// TraceClock is the timeline's generation and clock (µs) if this node
	// writes one (the coordinator's plans carry it).
	TraceClock() (gen uint32, now int64, ok bool)
	// TraceRemote writes another node's phases into the timeline, if the
	// one they were recorded for still runs.
	TraceRemote(node int, m *clusterpb.TimelineEvents)
	// Tuned applies the loop's part of the autotuner's settings (cycle
	// time, spin window), as a plan of the coordinator's brought them.
	Tuned(s Settings)
}

// TableSubmit submits o to t and adds it to j's pending ops, or returns the
// Done that refuses it.
func TableSubmit(t *plan.Table, j *Job, o *Op, now int64) *ipcpb.Done {
	if err := t.Submit(o.Req, now); err != nil {
		code := ipcpb.Code_CODE_INVALID_ARGUMENT
		if errors.Is(err, plan.ErrDuplicateName) {
			code = ipcpb.Code_CODE_DUPLICATE_NAME
		}
		return &ipcpb.Done{Code: code, Error: err.Error()}
	}
	j.Pending[OpKey{o.Req.Rank, o.Req.ProcessSet, o.Req.Name}] = o
	return nil
}
