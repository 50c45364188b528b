// Package backends defines the interface of hvdd's cross-node engines: the
// collectives over node ranks (one rank per daemon) on byte buffers. The daemon
// calls a Backend with the fused buffers of its node; it does not know which
// engine runs underneath (tcp, mpi, later nccl).
//
// A Backend carries no negotiation: every rank calls the same methods with
// matching arguments in the same order, as the daemon's plan guarantees.
// Implementations live in sub-packages; backends/backendtest is the
// conformance suite every implementation runs.
package backends

import (
	"context"
	"errors"
	"fmt"

	"github.com/hvdd/hvdd/tensor"
)

// Backend moves bytes between node ranks. Its collective methods must be
// called by one goroutine at a time, in the same order on every rank; Close may
// be called concurrently and makes blocked calls return. Buffers are owned by
// the caller and are not retained after a call returns.
//
// Every call honours ctx: on cancellation or deadline it returns an error
// wrapping ctx.Err(). A lost peer (closed connection, failed heartbeat,
// process exit) makes the call return a *PeerError naming that rank, promptly
// rather than at a deadline; after such an error the Backend is unusable and
// every later call fails the same way.
type Backend interface {
	// Name is the engine's name ("tcp", "mpi").
	Name() string
	// Rank is this node's rank, Size the number of nodes.
	Rank() int
	Size() int

	// Allreduce reduces buf element-wise across ranks, in place: afterwards
	// every rank's buf holds op over all ranks' buf. op is Sum, Min, Max or
	// Product (the caller turns Average into Sum and applies scale factors).
	// len(buf) must be a multiple of dt.Size() and equal on every rank.
	Allreduce(ctx context.Context, buf []byte, dt tensor.DType, op tensor.ReduceOp) error

	// Allgatherv gathers every rank's in into out, in rank order: rank r
	// contributes counts[r] bytes, len(in) == counts[Rank()], and
	// len(out) == sum(counts). counts is identical on every rank.
	Allgatherv(ctx context.Context, in, out []byte, counts []int) error

	// Broadcast copies root's buf into every other rank's buf (equal lengths).
	Broadcast(ctx context.Context, buf []byte, root int) error

	// Alltoallv sends in[sendOff[r] : sendOff[r]+sendCounts[r]] to rank r and
	// receives rank r's piece for us into out[recvOff[r] : +recvCounts[r]],
	// where the offsets are the running sums of the counts. recvCounts[r] on
	// this rank equals sendCounts[Rank()] on rank r.
	Alltoallv(ctx context.Context, in []byte, sendCounts []int, out []byte, recvCounts []int) error

	// ReduceScatter reduces in (len == sum(counts), equal on every rank)
	// element-wise across ranks and leaves block r (counts[r] bytes, at the
	// running offset) of the result in rank r's out (len == counts[Rank()]).
	// Counts are multiples of dt.Size().
	ReduceScatter(ctx context.Context, in, out []byte, counts []int, dt tensor.DType, op tensor.ReduceOp) error

	// Barrier returns when every rank has called it.
	Barrier(ctx context.Context) error

	// Close releases connections. Blocked calls return errors.
	Close() error
}

// Stats are per-peer byte counters, for engines that can report them.
type Stats struct {
	// SentBytes[r] and RecvBytes[r] count payload bytes exchanged with rank r
	// since the backend was created.
	SentBytes, RecvBytes []int64
}

// StatsReporter is implemented by backends that count bytes per peer link.
type StatsReporter interface {
	Stats() Stats
}

// PeerError reports that a peer rank was lost (its connection closed or timed
// out) during or before a collective.
type PeerError struct {
	Rank int   // the lost node rank
	Err  error // what was observed
}

func (e *PeerError) Error() string { return fmt.Sprintf("node rank %d lost: %v", e.Rank, e.Err) }

func (e *PeerError) Unwrap() error { return e.Err }

// LostRank returns the rank named by a *PeerError in err's chain.
func LostRank(err error) (int, bool) {
	var pe *PeerError
	if errors.As(err, &pe) {
		return pe.Rank, true
	}
	return -1, false
}

// ErrClosed is returned by calls on a closed Backend.
var ErrClosed = errors.New("backends: closed")

// LoopRunnable is implemented by engines whose collectives on small buffers
// wait for their peers in the kernel (poll, blocking reads) instead of
// parking the goroutine in Go's network poller. A goroutine locked to its OS
// thread, such as the daemon's event loop, may then run them itself: parked
// in the poller it would be woken only by the runtime's 10 ms sysmon poll.
// LoopRunnable returns the largest buffer (bytes) for which that holds.
type LoopRunnable interface {
	LoopRunnable() int
}

// Grouper is implemented by engines that can run collectives over a subset
// of their ranks (a process set whose members live on some nodes only).
//
// Group returns a Backend over ranks (ascending ranks of this Backend,
// including Rank()): its Rank is this rank's index in ranks, its Size
// len(ranks), and its collectives involve those ranks only; the others
// neither call them nor wait for them. Every rank in ranks must call Group
// with the same ranks at the same point of the sequence of collectives that
// it shares with the other members (the daemon asks for a group on its first
// use, from the goroutine that runs collectives); ranks outside call
// nothing. Groups share the parent's connections and its failure: a lost
// peer fails the parent and every group, and a *PeerError names the peer by
// its rank in the parent. Closing the parent closes its groups; a group's
// Close does nothing more than make the group unusable. Group may return
// the same Backend for the same ranks again.
type Grouper interface {
	Group(ranks []int) (Backend, error)
}

// Tuning is an engine's per-collective settings, which an autotuner may
// change between collectives. Zero fields mean "unchanged" to SetTuning.
type Tuning struct {
	// Streams is how many of the engine's data connections per peer a large
	// collective is dealt over.
	Streams int
	// ChunkBytes is the pipeline segment of the large-message algorithms.
	ChunkBytes int
	// SmallBytes is the largest buffer the latency-oriented algorithms take;
	// larger ones take the pipelined rings. Negative: always the rings.
	SmallBytes int
}

// Tunable is implemented by engines whose Tuning can change while they run.
// Every rank must apply the same Tuning at the same point of its sequence of
// collectives (the daemon applies a plan's tuning before the plan's
// collectives, and every node runs the plans in the same order), and never
// while a collective runs. Group views share their parent's Tuning.
type Tunable interface {
	// Tuning returns the settings in force.
	Tuning() Tuning
	// MaxStreams is the most Streams SetTuning accepts: the data
	// connections opened per peer.
	MaxStreams() int
	// SetTuning changes the settings given (non-zero fields), or returns an
	// error naming the bad one and changes nothing.
	SetTuning(t Tuning) error
}
