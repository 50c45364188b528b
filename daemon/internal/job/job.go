package job

import (
	"fmt"
	"strings"
	"time"

	"github.com/hvdd/hvdd/backends"
	"github.com/hvdd/hvdd/cluster/clusterpb"
	"github.com/hvdd/hvdd/daemon/metrics"
	"github.com/hvdd/hvdd/daemon/p2p"
	"github.com/hvdd/hvdd/daemon/plan"
	"github.com/hvdd/hvdd/daemon/timeline"
	"github.com/hvdd/hvdd/ipc/ipcpb"
	"github.com/hvdd/hvdd/tensor"
)

// Op is one client request in flight.
type Op struct {
	Conn      Conn
	ID        uint32 // frame id: the handle the Done answers
	Type      tensor.OpType
	Name      string
	Group     uint64
	GroupSize int
	Req       plan.Request
	Reg       Mapping      // holds a reference while the op is in flight
	Buf       []byte       // the input (and in-place output) bytes
	Dev       DeviceTensor // a GPU tensor: holds its mapping while in flight
	// Send, Recv: the other rank (global; -1 any source) and the tag.
	Peer int
	Tag  int64
	// Send, Recv on one node: when it began waiting for its other side
	// (the loop's Now), for status and stall reports.
	Queued int64

	// Metrics: its collective's children in its job (nil when off), when
	// it arrived (the loop's monotonic clock), its size class.
	M     *metrics.Collective
	At    int64
	Class uint8
	// Since is when its batch was dispatched, on the op that carries its
	// tensor's latency sample (its first local rank's; MarkLatency), and
	// zero on the others: Count observes it.
	Since time.Time
}

// Release drops the op's hold on its buffer: its mapping's reference, or
// its device tensor's.
func (o *Op) Release() {
	if o.Dev != nil {
		o.Dev.Release()
		o.Dev = nil
		o.Buf = nil
	}
	if o.Reg != nil {
		o.Reg.Unref()
		o.Reg = nil
		o.Buf = nil
	}
}

// Finish answers the op and drops its buffer.
func (o *Op) Finish(d *ipcpb.Done) {
	if o.Dev != nil {
		d = o.Dev.Done(o, d)
	}
	// Counted before the answer goes out, so that a scrape by a client
	// that has its answer sees the op.
	o.Count(d.GetCode())
	o.Conn.Reply(o.ID, d)
	o.Release()
}

// Conn is a local rank's connection as a job, the coordination across nodes
// and the executor use it: the loop's client is the one implementation.
type Conn interface {
	// PID is the process's pid, Rank its global rank in its job.
	PID() int32
	Rank() int
	// Reply answers request id with d.
	Reply(id uint32, d *ipcpb.Done)
	// SendBatch answers several requests in one write.
	SendBatch(ids []uint32, ms []*ipcpb.ServerMessage) error
	// AllocOutput takes n bytes of the daemon's output region for an
	// answer: the bytes, and the buffer that names them to the client.
	AllocOutput(n int64) ([]byte, *ipcpb.Buffer, error)
	// OutputBytes returns the bytes of a buffer AllocOutput granted, and
	// ReleaseOutput gives it back when the daemon, not the client, read it.
	OutputBytes(b *ipcpb.Buffer) ([]byte, error)
	ReleaseOutput(b *ipcpb.Buffer) error
}

// Mapping is a shared-memory mapping an op holds a reference on.
type Mapping interface{ Unref() }

// DeviceTensor is an op's tensor in GPU memory, as the device path resolved
// it.
type DeviceTensor interface {
	// Bytes is the tensor's size.
	Bytes() int
	// GPU is the node's index of the GPU that holds it.
	GPU() int
	// Release drops the op's references on the tensor's mapping and event.
	Release()
	// Done is called as o is answered with d, and returns the answer to
	// send: a tensor staged through host memory is copied back first.
	Done(o *Op, d *ipcpb.Done) *ipcpb.Done
	// WhenOpen reports whether the tensor's memory is open in the daemon
	// (its IPC handles open off the loop goroutine): true, with the error
	// of a failed open; or false, and then it calls then, once, from
	// another goroutine, when the opens have ended.
	WhenOpen(then func(error)) (bool, error)
}

// OpKey finds a pending op: a global rank's tensor in a process set.
type OpKey struct {
	Rank int
	Set  int32
	Name string
}

// Job is the set of local clients that negotiate together: what every job
// has, on one node or across several. How its tensors are negotiated is its
// coordination's business (Coordination), which keeps its own state.
type Job struct {
	ID      uint64
	UID     uint32       // its processes' uid
	Name    string       // its name (Hello.job_name; "" is a name too)
	M       *metrics.Job // its metrics; nil when off
	Slots   []Conn       // by local rank; nil while free
	Joined  int          // slots taken
	Open    int          // connections of the job still open
	Formed  bool
	Members Membership   // who the ranks are; set when the job forms
	Coord   Coordination // set once every local client is here (SetCoord)
	// Across is Coord's part across nodes, probed by SetCoord: nil for a
	// coordination without one (on one node).
	Across  CoordinationAcross
	Pending map[OpKey]*Op
	// P2P holds the sends and recvs waiting for their other side (made at
	// the first; nil before).
	P2P    *p2p.Table[*Op]
	Failed *ipcpb.Done // non-nil once the job failed: every op answers with it

	// An elastic job is re-formed from its survivors after a
	// lost rank: epoch numbers its memberships.
	Elastic   bool
	Epoch     uint64
	FailedAt  time.Time
	Survivors []Survivor // ranks that closed with Goodbye
	// LaidOut says that the job's layout across nodes is decided
	// (across nodes): from then on an elastic epoch that fails, formed or
	// not, is followed by the next.
	LaidOut bool

	Barriers map[int32][]int   // per process set, per global rank: barriers submitted so far
	SetQueue [][]SetReq        // per global rank: set requests waiting for the others (QueueSet)
	Sets     map[int32][]int   // registered process sets other than 0: members
	nextSet  int32             // the last process set id given out
	views    map[int32]setView // how sets lie over the nodes, as the executor asks
	// LocalSets: local set requests (SetReq.Local) waiting for the other
	// members, by the set's ranks, then by member index (QueueLocalSet).
	LocalSets map[string][][]SetReq
	// GlobalRows maps the executor's row index for the global set (the
	// global rank) to the local rank there, or -1 for another node's.
	GlobalRows []int

	Stats    jobStats  // what the job ran, logged when it ends
	FormedAt time.Time // when it formed
	// NodeRanks are the other nodes' ranks, on the coordinator of a job
	// across nodes (their Joins' pids), for hvdd status.
	NodeRanks []NodeRanks
}

// jobStats counts what a job ran, to show fusion at work: a training step
// whose gradients were fused runs as one batch of one response per dtype,
// however many tensors it had.
type jobStats struct {
	Batches   int64 // batches run (each: what was ready together)
	Responses int64 // fused responses run (each: one collective on one buffer)
	Tensors   int64 // tensors in them
	Bytes     int64 // their bytes
}

// SetCoord makes c the job's coordination, once every local client is here,
// and probes it, this once, for its part across nodes (Across).
func (j *Job) SetCoord(c Coordination) {
	j.Coord = c
	j.Across, _ = c.(CoordinationAcross)
}

// Engine is the job's cross-node data engine (CoordinationAcross.Engine):
// nil on one node, and until the job's engine across nodes is there.
func (j *Job) Engine() backends.Backend {
	if j.Across == nil {
		return nil
	}
	return j.Across.Engine()
}

// PIDs lists the pids of the job's local ranks, for logs.
func (j *Job) PIDs() string {
	var s []string
	for _, c := range j.Slots {
		if c != nil {
			s = append(s, fmt.Sprint(c.PID()))
		}
	}
	return strings.Join(s, " ")
}

// Membership is who a formed job's ranks are: every node's slot count and
// this node among them. Global ranks are node-major, so a node's ranks are
// contiguous and node order is rank order. The epoch numbers the
// memberships of one job: 0 when it forms, one more each time an elastic job
// re-forms from its survivors.
type Membership struct {
	Epoch  uint64
	slots  []int // slot count of every node
	Node   int   // this node
	Offset int   // global rank of this node's local rank 0
	Size   int   // global size
}

// NewMembership is the membership of nodes with these slot counts, seen from
// node.
func NewMembership(slots []int, node int) Membership {
	m := Membership{slots: slots, Node: node}
	for i, n := range slots {
		if i < node {
			m.Offset += n
		}
		m.Size += n
	}
	return m
}

// Nodes is the number of nodes.
func (m Membership) Nodes() int { return len(m.slots) }

// Local is the number of this node's ranks.
func (m Membership) Local() int { return m.slots[m.Node] }

// Homogeneous reports whether every node has as many ranks.
func (m Membership) Homogeneous() bool {
	for _, n := range m.slots {
		if n != m.slots[0] {
			return false
		}
	}
	return true
}

// Cross returns Horovod's cross_rank and cross_size of local rank lr: its
// place among the nodes that have a process with this local rank.
func (m Membership) Cross(lr int) (rank, size int) {
	for i, n := range m.slots {
		if n > lr {
			if i < m.Node {
				rank++
			}
			size++
		}
	}
	return rank, size
}

// NodeOf returns the node of a global rank, or -1.
func (m Membership) NodeOf(rank int) int {
	for n, s := range m.slots {
		if rank < s {
			return n
		}
		rank -= s
	}
	return -1
}

// NodeRanks returns the global ranks [lo, hi) of node n.
func (m Membership) NodeRanks(n int) (lo, hi int) {
	for i := 0; i < n; i++ {
		lo += m.slots[i]
	}
	return lo, lo + m.slots[n]
}

// RankRange names the global ranks of a node, " (ranks 2-3)"; "" for a node
// it does not know.
func (m Membership) RankRange(node int) string {
	if node < 0 || node >= len(m.slots) {
		return ""
	}
	lo, hi := m.NodeRanks(node)
	hi--
	if lo == hi {
		return fmt.Sprintf(" (rank %d)", lo)
	}
	return fmt.Sprintf(" (ranks %d-%d)", lo, hi)
}

// Settings are what tuning changes: the values in force.
type Settings struct {
	Fusion int64         // fusion threshold, bytes; 0 disables fusion
	Cycle  time.Duration // least time between dispatched plans
	Spin   time.Duration // the loop's spin window; 0 never spins
	Engine backends.Tuning
	Final  bool // tuning has ended: the best configuration
}

// PB is s as the control plane carries it in a plan.
func (s Settings) PB() *clusterpb.Tuning {
	spin := s.Spin.Microseconds()
	if s.Spin <= 0 {
		spin = -1
	}
	return &clusterpb.Tuning{
		FusionThreshold: s.Fusion, CycleTimeUs: s.Cycle.Microseconds(), SpinUs: spin,
		Streams: int32(s.Engine.Streams), ChunkBytes: int32(s.Engine.ChunkBytes), SmallBytes: int32(s.Engine.SmallBytes),
		Final: s.Final,
	}
}

// SettingsFromPB is the inverse of Settings.PB.
func SettingsFromPB(t *clusterpb.Tuning) Settings {
	s := Settings{
		Fusion: t.GetFusionThreshold(), Cycle: time.Duration(t.GetCycleTimeUs()) * time.Microsecond,
		Spin:   time.Duration(t.GetSpinUs()) * time.Microsecond,
		Engine: backends.Tuning{Streams: int(t.GetStreams()), ChunkBytes: int(t.GetChunkBytes()), SmallBytes: int(t.GetSmallBytes())},
		Final:  t.GetFinal(),
	}
	if s.Spin < 0 {
		s.Spin = 0
	}
	return s
}

// Attrs are s as log attributes.
func (s Settings) Attrs() []any {
	a := []any{"fusion_threshold", s.Fusion, "cycle_time", s.Cycle, "spin", s.Spin}
	if s.Engine != (backends.Tuning{}) {
		a = append(a, "streams", s.Engine.Streams, "chunk_bytes", s.Engine.ChunkBytes, "small_bytes", s.Engine.SmallBytes)
	}
	return a
}

// Survivor is a rank of a failed elastic epoch that went on to re-initialise.
type Survivor struct {
	Rank int
	Pid  int32
}

// NoteSurvivor records c, closing its connection with Goodbye, as a
// survivor should its elastic epoch fail.
func (j *Job) NoteSurvivor(c Conn) {
	j.Survivors = append(j.Survivors, Survivor{Rank: c.Rank(), Pid: c.PID()})
}

// Horovod's HostUpdateResult: removed, added (mixed is both).
const (
	HostsRemoved = 1
	HostsAdded   = 2
)

// Count counts o as answered with code, and observes its tensor's latency
// if o carries it; before the answer goes out, so that a client holding it
// scrapes the op, and before release, which drops its buffer.
func (o *Op) Count(code ipcpb.Code) {
	if o.M != nil {
		n := len(o.Buf)
		if o.Dev != nil {
			n = o.Dev.Bytes() // a GPU tensor
		}
		o.M.Done(code, n)
		if !o.Since.IsZero() {
			o.M.Latency(int(o.Class)).Observe(time.Since(o.Since).Seconds())
			o.Since = time.Time{}
		}
	}
}

// NodeRanks is what the coordinator knows of another node's ranks: the
// node's host and the pids of its local ranks, from its Join.
type NodeRanks struct {
	Node int    // the node's place in the job (its index in the membership)
	Host string // the address it advertised
	PIDs []int32
}

// EventSink takes phase events of tensor rows: the timeline's Writer on the
// node that writes it, a follower's nodeTrace on the others.
type EventSink interface {
	Event(tensor string, ph timeline.Phase, name string)
}

// RankExitedCause ends the message of an epoch that ends because a rank's
// process exited while the elastic job ran (Goodbye.exiting): whether it
// failed or finished, the others go on without it.
const RankExitedCause = "left the elastic job: its process exited while the job ran (Goodbye at exit); the other ranks reset and go on without it"

// IsRankExited reports whether msg ends an epoch for a rank that exited,
// here or relayed from another node. Every rank of a job that ends
// normally exits so: with nothing in flight, that is no failure to log.
func IsRankExited(msg string) bool { return strings.HasSuffix(msg, RankExitedCause) }

// HostsUpdatedCause ends the message of an epoch that ends because its
// ranks reset after a host update (HostsUpdatedInterrupt): no rank was
// lost.
const HostsUpdatedCause = "the job's hosts were updated (hvd.elastic reset)"

// IsHostsUpdated reports whether msg ends an epoch for a host update, here
// or relayed from another node.
func IsHostsUpdated(msg string) bool { return strings.HasSuffix(msg, HostsUpdatedCause) }

// RanksExitedWhy is why a node with no survivors leaves an epoch that
// failed only because ranks exited: at a job's normal end, every node.
const RanksExitedWhy = "its ranks exited"
