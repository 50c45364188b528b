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
	"math"
	"strings"

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

// LostCloser is implemented by engines that can close saying why: a rank
// of theirs was lost. The other ranks' calls in progress then fail with a
// *PeerError naming that rank, not this one: a node that closes its engine
// because another node was lost must not be taken for the lost one by a
// peer still waiting for its bytes.
type LostCloser interface {
	// CloseLost is Close after the loss of rank (err says what was seen).
	CloseLost(rank int, err error) error
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

// Compression is how an engine sends the float32 data of its reductions
// between nodes: as it is, or rounded to 16 bits on the wire while every
// sum is still accumulated in float32 (hvdd serve --wire-compression). It
// changes results, within ErrorBound, so it is a fixed setting every rank
// must share (engines check it when they connect), not part of Tuning: an
// autotuner that scores speed alone would always pick 16 bits on a slow
// link, which is an accuracy decision for the user to make, as Horovod
// leaves hvd.Compression to the user. The zero value is CompressNone.
type Compression uint8

const (
	// CompressNone sends every byte as it is.
	CompressNone Compression = iota
	// CompressFP16 sends float32 Sum data as IEEE 754 binary16 (float16):
	// 11 significant bits, finite range ±65504.
	CompressFP16
	// CompressBF16 sends float32 Sum data as bfloat16: 8 significant bits,
	// float32's range.
	CompressBF16
)

// ParseCompression parses a Compression as hvdd serve's flag spells it:
// none (or empty), fp16 or bf16, in any case.
func ParseCompression(s string) (Compression, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "", "none":
		return CompressNone, nil
	case "fp16":
		return CompressFP16, nil
	case "bf16":
		return CompressBF16, nil
	}
	return 0, fmt.Errorf("unknown wire compression %q (want none, fp16 or bf16)", s)
}

// String returns the name ParseCompression takes.
func (c Compression) String() string {
	switch c {
	case CompressNone:
		return "none"
	case CompressFP16:
		return "fp16"
	case CompressBF16:
		return "bf16"
	}
	return fmt.Sprintf("Compression(%d)", uint8(c))
}

// Valid reports whether c is one of the constants.
func (c Compression) Valid() bool { return c <= CompressBF16 }

// Format returns the 16-bit type the data travels as (tensor.Float16 or
// tensor.BFloat16), or tensor.Invalid for CompressNone.
func (c Compression) Format() tensor.DType {
	switch c {
	case CompressFP16:
		return tensor.Float16
	case CompressBF16:
		return tensor.BFloat16
	}
	return tensor.Invalid
}

// ErrorBound returns the most by which one element of a compressed float32
// Sum (Allreduce or ReduceScatter) over n ranks may differ from the exact
// sum S = Σ x_i of its inputs, given sumAbs = Σ |x_i|; 0 for CompressNone
// (whose float32 rounding is the engine's usual one).
//
// The bound counts the roundings on any input's path to the result. Let u
// be the unit roundoff of the 16-bit format (2^-11 for float16, 2^-8 for
// bfloat16), u32 = 2^-24 that of float32, and η half the format's smallest
// subnormal (2^-25, 2^-134). A rounding R to 16 bits gives
// R(x) = x(1+δ) + e with |δ| <= u, |e| <= η (e only below the normal range),
// a float32 addition fl(a+b) = (a+b)(1+ε) with |ε| <= u32 (additions that
// underflow are exact). In a ring of n ranks, the input that starts a
// block is rounded when it is sent and each partial sum once more at every
// later step (n-1 roundings in all), each step adds in float32 (n-1
// additions), and the block's final value is rounded once before the
// allgather: at most n roundings R and n-1 additions on any input's path.
// Recursive doubling (small buffers) rounds both operands of each of its
// ⌈log2 n⌉ rounds, an extra rank's data once before them, and the result
// once: at most ⌈log2 n⌉+1 <= n roundings and ⌈log2 n⌉ <= n-1 additions
// per input, and at most 2n-1 roundings in the whole tree. Expanding the
// products as usual,
//
//	|F - S| <= γ·Σ|x_i| + (2n-1)(1+γ)·η,   γ = (1+u)^n (1+u32)^(n-1) - 1,
//
// about n·u·Σ|x_i|: for n = 2 and 8, 9.8e-4 and 3.9e-3 of Σ|x_i| with
// float16, 7.8e-3 and 3.2e-2 with bfloat16. Data the engine sends
// uncompressed because it would overflow the format (see the engine) has
// fewer roundings, so the bound holds for it too. It assumes no float32
// overflow: inputs whose sums are near ±3.4e38 may give ±Inf, as they may
// without compression; NaNs and infinities in the inputs propagate as in
// float32.
func (c Compression) ErrorBound(n int, sumAbs float64) float64 {
	var u, eta float64
	switch c {
	case CompressFP16:
		u, eta = 0x1p-11, 0x1p-25
	case CompressBF16:
		u, eta = 0x1p-8, 0x1p-134
	default:
		return 0
	}
	g := math.Pow(1+u, float64(n))*math.Pow(1+0x1p-24, float64(n-1)) - 1
	return g*sumAbs + float64(2*n-1)*(1+g)*eta
}
