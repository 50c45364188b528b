package backends

import (
	"context"
	"errors"

	"github.com/hvdd/hvdd/gpu"
	"github.com/hvdd/hvdd/tensor"
)

// DeviceEngine moves data in device memory between ranks: one rank per GPU,
// within a node (one engine per local GPU) or across nodes (one per node).
// It is Backend's sibling for device buffers, with the same contract: its
// collective methods are called by one goroutine at a time, in the same
// order and with matching arguments on every rank; Abort and Close may be
// called concurrently with anything and make a blocked Wait return; buffers
// (device pointers) are owned by the caller.
//
// The collectives only enqueue work on the stream s, a stream of Device(),
// ordered after what the caller enqueued on s before; they neither wait for
// it nor for the peers. The caller keeps the buffers alive and unchanged
// until Wait on s returned. Counts are elements of dt; send and recv may be
// the same pointer (in place) except where a method says otherwise.
//
// Errors: a call with arguments the engine cannot run (a dtype or op the
// library lacks: errors.ErrUnsupported; a bad count or root) returns an
// error and enqueues nothing, and the engine stays usable. Any failure of
// the library, an asynchronous error seen by Wait, ctx's end in Wait, and
// Abort or Close from another goroutine, end the engine: it is aborted
// (its pending work ends without completing), and every later call returns
// an error wrapping ErrAborted or ErrClosed and the cause. Engines made
// together (the node-local ones) fail together.
type DeviceEngine interface {
	// Name is the engine's name ("nccl").
	Name() string
	// Rank is this engine's rank, Size the number of ranks.
	Rank() int
	Size() int
	// Device is the GPU the engine's rank runs on: streams and buffers
	// passed to it belong to this device.
	Device() gpu.Device

	// Allreduce reduces send element-wise across ranks into every rank's
	// recv (count elements each). op is Sum, Min, Max, Product, or Average
	// where the engine has it.
	Allreduce(s gpu.Stream, send, recv gpu.DevicePtr, count int, dt tensor.DType, op tensor.ReduceOp) error
	// Broadcast copies root's send into every rank's recv (count elements);
	// send is read on root only.
	Broadcast(s gpu.Stream, send, recv gpu.DevicePtr, count int, dt tensor.DType, root int) error
	// Allgather gathers every rank's send (count elements) into recv
	// (Size()*count elements), in rank order. recv must not overlap send
	// except at send's own block (recv + Rank()*count elements).
	Allgather(s gpu.Stream, send, recv gpu.DevicePtr, count int, dt tensor.DType) error
	// ReduceScatter reduces send (Size()*count elements, equal length on
	// every rank) element-wise across ranks and leaves block Rank() of the
	// result (count elements) in recv.
	ReduceScatter(s gpu.Stream, send, recv gpu.DevicePtr, count int, dt tensor.DType, op tensor.ReduceOp) error
	// Alltoallv sends send's block r (sendCounts[r] elements at the running
	// offset) to rank r and receives rank r's block for us into recv at the
	// running offset of recvCounts. recvCounts[r] on this rank equals
	// sendCounts[Rank()] on rank r; send and recv must not overlap.
	Alltoallv(s gpu.Stream, send gpu.DevicePtr, sendCounts []int, recv gpu.DevicePtr, recvCounts []int, dt tensor.DType) error

	// Wait returns once the work enqueued on s so far has run, watching the
	// engine for asynchronous errors (a lost peer, a failed link) while it
	// waits. On such an error, or when ctx ends, it aborts the engine, waits
	// a bounded time for s to drain, and returns an error wrapping the cause
	// (ctx.Err() on cancellation). It returns an error wrapping ErrAborted
	// or ErrClosed when the engine was ended, before or during the wait.
	Wait(ctx context.Context, s gpu.Stream) error

	// Err returns nil while the engine is usable, else why it is not: an
	// error wrapping ErrAborted or ErrClosed and the cause. It looks at the
	// library's asynchronous errors too (a lost peer, a failed link), and
	// ends the engines on one, so that a caller keeping engines between
	// collectives asks it before reusing them. It does not block; safe
	// concurrently with anything.
	Err() error

	// Abort ends the engine at once (and those made with it): pending work
	// on every stream ends without completing, blocked Waits return, later
	// calls fail with ErrAborted. It is the way out after a failure.
	Abort() error
	// Close releases the engine. An idle healthy engine is destroyed
	// cleanly; one with work in flight or a Wait in progress is aborted
	// (that Wait returns an error wrapping ErrClosed). Later calls fail with
	// ErrClosed; Close after Close or Abort returns nil.
	Close() error
}

// DeviceEngines makes one implementation's device engines (backends/nccl's
// Engines for NCCL): the daemon builds it and hands it to the executor,
// which holds its engines as DeviceEngine, so that another implementation
// needs no change there. Its methods may block (communicator set-up);
// safe for one goroutine at a time.
type DeviceEngines interface {
	// Name is the implementation's name ("nccl"), Version its library's
	// version (0 when unknown).
	Name() string
	Version() (int, error)
	// NewLocal makes the node-local engines over devs, rank i on devs[i],
	// every rank in this process: made together, they fail together, and
	// a goroutine driving several of them groups their calls
	// (DeviceGrouper). Each must be closed.
	NewLocal(devs []gpu.Device) ([]DeviceEngine, error)
	// NewUniqueID makes the bootstrap id of an engine across nodes, on the
	// rank that draws it; the control plane hands its bytes to every rank's
	// Join.
	NewUniqueID() ([]byte, error)
	// Join makes this node's rank of size of the engine across nodes whose
	// bootstrap id is id, on dev. Every rank calls it concurrently; it
	// returns once all have joined, or with an error when ctx ends.
	Join(ctx context.Context, dev gpu.Device, id []byte, rank, size int) (DeviceEngine, error)
}

// DeviceGrouper is implemented by engines whose calls can be issued as one
// (NCCL's ncclGroupStart/End): a goroutine driving several ranks of a node
// (one per GPU) must group their calls, or the first would wait for the
// others forever; an alltoall is a group of point-to-point calls.
type DeviceGrouper interface {
	// Group runs f, which makes calls on this engine and on the engines
	// made with it, and issues them together when f returns. Groups nest.
	// If f or the issue fails, Group aborts the engines and returns the
	// error.
	Group(f func() error) error
}

// DevicePeer is implemented by engines with point-to-point calls. Matching
// Send and Recv (same count and dtype) go inside one Group (on every rank
// involved), which issues them without deadlock whatever their order.
type DevicePeer interface {
	// Send sends count elements at buf to rank peer.
	Send(s gpu.Stream, buf gpu.DevicePtr, count int, dt tensor.DType, peer int) error
	// Recv receives count elements from rank peer into buf.
	Recv(s gpu.Stream, buf gpu.DevicePtr, count int, dt tensor.DType, peer int) error
}

// ErrAborted is wrapped by the errors of calls on an engine that was
// aborted, by Abort or after a failure (whose error is wrapped too).
var ErrAborted = errors.New("backends: engine aborted")
