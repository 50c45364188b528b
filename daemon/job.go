package daemon

import (
	"fmt"
	"strings"
	"time"

	"github.com/hvdd/hvdd/daemon/metrics"
	"github.com/hvdd/hvdd/daemon/plan"
	"github.com/hvdd/hvdd/ipc/ipcpb"
	"github.com/hvdd/hvdd/tensor"
)

// op is one client request in flight.
type op struct {
	c         conn
	id        uint32 // frame id: the handle the Done answers
	typ       tensor.OpType
	name      string
	group     uint64
	groupSize int
	req       plan.Request
	reg       mapping      // holds a reference while the op is in flight
	buf       []byte       // the input (and in-place output) bytes
	dev       deviceTensor // a GPU tensor (gpu.go): holds its mapping while in flight

	// Metrics (metrics.go): its collective's children in its job (nil
	// when off), when it arrived (monoNow), its size class.
	m     *metrics.Collective
	at    int64
	class uint8
}

func (o *op) release() {
	if o.dev != nil {
		o.dev.release()
		o.dev = nil
		o.buf = nil
	}
	if o.reg != nil {
		o.reg.unref()
		o.reg = nil
		o.buf = nil
	}
}

// finish answers the op and drops its buffer.
func (o *op) finish(d *ipcpb.Done) {
	if o.dev != nil {
		d = o.dev.done(o, d)
	}
	o.c.reply(o.id, d)
	o.count(d.GetCode()) // metrics.go
	o.release()
}

// conn is a local rank's connection as a job, the coordination across nodes
// and the executor use it: the loop's client is the one implementation.
type conn interface {
	// PID is the process's pid, Rank its global rank in its job.
	PID() int32
	Rank() int
	// reply answers request id with d.
	reply(id uint32, d *ipcpb.Done)
	// sendBatch answers several requests in one write.
	sendBatch(ids []uint32, ms []*ipcpb.ServerMessage) error
	// allocOutput takes n bytes of the daemon's output region for an
	// answer: the bytes, and the buffer that names them to the client.
	allocOutput(n int64) ([]byte, *ipcpb.Buffer, error)
}

// mapping is a shared-memory mapping an op holds a reference on.
type mapping interface{ unref() }

// deviceTensor is an op's tensor in GPU memory, as the device path resolved
// it (gpu.go: devOp).
type deviceTensor interface {
	// bytes is the tensor's size.
	bytes() int
	// release drops the op's references on the tensor's mapping and event.
	release()
	// done is called as o is answered with d, and returns the answer to
	// send: a tensor staged through host memory is copied back first.
	done(o *op, d *ipcpb.Done) *ipcpb.Done
}

// opKey finds a pending op: a global rank's tensor in a process set.
type opKey struct {
	rank int
	set  int32
	name string
}

// job is the set of local clients that negotiate together: what every job
// has, on one node or across several. How its tensors are negotiated is its
// coordination's business (coordination.go), which keeps its own state.
type job struct {
	id      uint64
	uid     uint32       // its processes' uid
	name    string       // its name (Hello.job_name; "" is a name too)
	m       *metrics.Job // its metrics; nil when off
	slots   []conn       // by local rank; nil while free
	joined  int          // slots taken
	open    int          // connections of the job still open
	formed  bool
	members membership   // who the ranks are; set when the job forms
	coord   coordination // set once every local client is here
	pending map[opKey]*op
	failed  *ipcpb.Done // non-nil once the job failed: every op answers with it

	// An elastic job (elastic.go) is re-formed from its survivors after a
	// lost rank: epoch numbers its memberships.
	elastic   bool
	epoch     uint64
	failedAt  time.Time
	survivors []survivor // ranks that closed with Goodbye
	// laidOut says that the job's layout across nodes is decided
	// (multinode.go): from then on an elastic epoch that fails, formed or
	// not, is followed by the next (elastic_multinode.go).
	laidOut bool

	barriers map[int32][]int   // per process set, per global rank: barriers submitted so far
	psq      [][]psReq         // per global rank: set requests waiting for the others (procset.go)
	sets     map[int32][]int   // registered process sets other than 0: members
	nextSet  int32             // the last process set id given out
	views    map[int32]setView // how sets lie over the nodes, as the executor asks
	// globalRows maps the executor's row index for the global set (the
	// global rank) to the local rank there, or -1 for another node's.
	globalRows []int

	stats    jobStats  // what the job ran, logged when it ends
	formedAt time.Time // when it formed
	// nodeRanks are the other nodes' ranks, on the coordinator of a job
	// across nodes (their Joins' pids), for hvdd status.
	nodeRanks []nodeRanks
}

// jobStats counts what a job ran, to show fusion at work: a training step
// whose gradients were fused runs as one batch of one response per dtype,
// however many tensors it had.
type jobStats struct {
	batches   int64 // batches run (each: what was ready together)
	responses int64 // fused responses run (each: one collective on one buffer)
	tensors   int64 // tensors in them
	bytes     int64 // their bytes
}

func (j *job) pids() string {
	var s []string
	for _, c := range j.slots {
		if c != nil {
			s = append(s, fmt.Sprint(c.PID()))
		}
	}
	return strings.Join(s, " ")
}

// membership is who a formed job's ranks are: every node's slot count and
// this node among them. Global ranks are node-major, so a node's ranks are
// contiguous and node order is rank order. The epoch numbers the
// memberships of one job: 0 when it forms, one more each time an elastic job
// re-forms from its survivors (elastic.go).
type membership struct {
	epoch  uint64
	slots  []int // slot count of every node
	node   int   // this node
	offset int   // global rank of this node's local rank 0
	size   int   // global size
}

// newMembership is the membership of nodes with these slot counts, seen from
// node.
func newMembership(slots []int, node int) membership {
	m := membership{slots: slots, node: node}
	for i, n := range slots {
		if i < node {
			m.offset += n
		}
		m.size += n
	}
	return m
}

// nodes is the number of nodes.
func (m membership) nodes() int { return len(m.slots) }

// local is the number of this node's ranks.
func (m membership) local() int { return m.slots[m.node] }

// homogeneous reports whether every node has as many ranks.
func (m membership) homogeneous() bool {
	for _, n := range m.slots {
		if n != m.slots[0] {
			return false
		}
	}
	return true
}

// cross returns Horovod's cross_rank and cross_size of local rank lr: its
// place among the nodes that have a process with this local rank.
func (m membership) cross(lr int) (rank, size int) {
	for i, n := range m.slots {
		if n > lr {
			if i < m.node {
				rank++
			}
			size++
		}
	}
	return rank, size
}

// nodeOf returns the node of a global rank, or -1.
func (m membership) nodeOf(rank int) int {
	for n, s := range m.slots {
		if rank < s {
			return n
		}
		rank -= s
	}
	return -1
}

// nodeRanks returns the global ranks [lo, hi) of node n.
func (m membership) nodeRanks(n int) (lo, hi int) {
	for i := 0; i < n; i++ {
		lo += m.slots[i]
	}
	return lo, lo + m.slots[n]
}

// rankRange names the global ranks of a node, " (ranks 2-3)"; "" for a node
// it does not know.
func (m membership) rankRange(node int) string {
	if node < 0 || node >= len(m.slots) {
		return ""
	}
	lo, hi := m.nodeRanks(node)
	hi--
	if lo == hi {
		return fmt.Sprintf(" (rank %d)", lo)
	}
	return fmt.Sprintf(" (ranks %d-%d)", lo, hi)
}
