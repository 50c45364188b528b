package job

import (
	"github.com/hvdd/hvdd/backends"
	"github.com/hvdd/hvdd/daemon/plan"
	"github.com/hvdd/hvdd/ipc/ipcpb"
)

// Work is one plan response with the ops it completes: ops[i][rank] is rank's
// op for resp.Tensors[i], nil for a rank that has joined.
type Work struct {
	Resp   plan.Response
	Job    *Job
	Engine backends.Backend // the job's cross-node engine; nil on one node (or for a set on one node)
	View   setView          // across nodes: how the response's set lies over the nodes
	Trace  EventSink        // where the work's phases go (the timeline, or a follower's record of them); nil when off
	Size   int
	Ops    [][]*Op
	// NCCLID is the job's NCCL unique id for the communicator across
	// nodes (CoordinationAcross.NCCLID), for a response the plan runs on
	// NCCL across nodes (Resp.NCCL).
	NCCLID []byte
}

// FinishRows answers every op of every row with d.
func FinishRows(rows [][]*Op, d *ipcpb.Done) {
	for _, row := range rows {
		for _, o := range row {
			if o != nil {
				o.Finish(d)
			}
		}
	}
}

// DeviceBatch reports whether any op of the batch is a GPU tensor: such
// batches never run inline in the loop.
func DeviceBatch(batch []Work) bool {
	for i := range batch {
		if DeviceWork(&batch[i]) {
			return true
		}
	}
	return false
}

// DeviceWork reports whether any op of w is a GPU tensor.
func DeviceWork(w *Work) bool {
	for _, row := range w.Ops {
		for _, o := range row {
			if o != nil && o.Dev != nil {
				return true
			}
		}
	}
	return false
}

// InlineBytes is the most payload the loop executes itself instead of handing
// the batch to the executor goroutine.
const InlineBytes = 256 << 10

// InlineMultiBytes is the same across nodes, where the loop then also waits
// for the network (see exec.LoopRunnable).
const InlineMultiBytes = 64 << 10

// MsgExecIdle is the executor's message to the loop that it finished its
// batch.
type MsgExecIdle struct{}

// MsgExecErr is the executor's message to the loop that a collective across
// nodes failed: the job fails.
type MsgExecErr struct {
	Job *Job
	Err error
	// Ops are the failed collective's local ops, for the loop to
	// answer (nil when the executor answered them): with the job's
	// failure when the job failed before (the engine was closed for it,
	// here or on another node), else with Err.
	Ops [][]*Op
	// Closed: the engine failed because this node closed it
	// (backends.ErrClosed).
	Closed bool
	// Lost is the node (its place in the job) whose loss the engine
	// reported (backends.PeerError), +1; 0 when it named none.
	Lost int
}
