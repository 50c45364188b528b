//go:build mpi

package mpi

import (
	"context"
	"fmt"
	"math"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/hvdd/hvdd/backends"
	"github.com/hvdd/hvdd/tensor"
)

var _ backends.Backend = (*Backend)(nil)

// Available reports whether the engine was compiled in (the mpi build tag).
func Available() bool { return true }

// maxCount is the largest count one MPI call is given (MPI counts are C
// ints). Tests lower it to exercise the splitting and fallback paths.
var maxCount = math.MaxInt32

// wantLevel is the thread level New asks MPI for. Tests lower it to
// exercise the serialised paths.
var wantLevel = levelMultiple

// proc is the process-wide MPI state.
var proc struct {
	mu      sync.Mutex // held by New and Finalize
	started bool       // MPI is initialised (by us or before us)
	ours    bool       // we called MPI_Init_thread, so Finalize calls MPI_Finalize
	level   threadLevel
	work    chan func() // run on MPI's main thread (ours only)
}

// finalized is set by Finalize; later calls fail with ErrFinalized.
var finalized atomic.Bool

// leaked keeps the pins of requests abandoned after an error: MPI may still
// touch their buffers, so they must never be unpinned or freed.
var leaked struct {
	sync.Mutex
	pins []*runtime.Pinner
}

// initMPI initialises MPI once per process on a goroutine locked to its OS
// thread, which stays MPI's main thread (for FUNNELED calls and
// MPI_Finalize). proc.mu is held.
func initMPI() error {
	if finalized.Load() {
		return ErrFinalized
	}
	if proc.started {
		return nil
	}
	type result struct {
		level      threadLevel
		ours, main bool
		rc         int
	}
	res := make(chan result, 1)
	work := make(chan func())
	go func() {
		runtime.LockOSThread() // never unlocked: this thread is MPI's main thread
		l, o, m, rc := cInit(wantLevel)
		res <- result{l, o, m, rc}
		if rc != 0 || !o {
			return
		}
		for f := range work {
			f()
		}
	}()
	r := <-res
	if r.rc != 0 {
		return fmt.Errorf("mpi: MPI_Init_thread: %w", newError(r.rc))
	}
	if !r.ours && r.level < levelSerialized {
		return fmt.Errorf("mpi: MPI was initialised elsewhere in this process at %v; the mpi backend then needs MPI_THREAD_SERIALIZED or better", r.level)
	}
	proc.started, proc.ours, proc.level = true, r.ours, r.level
	if r.ours {
		proc.work = work
	}
	return nil
}

// Finalize finalises MPI if New initialised it (MPI_Finalize, on MPI's main
// thread); call it once at process end, after closing every Backend. Later
// calls to New fail with ErrFinalized. Finalize is collective in effect:
// every rank should call it.
func Finalize() error {
	proc.mu.Lock()
	defer proc.mu.Unlock()
	if !proc.started || finalized.Load() {
		finalized.Store(true)
		return nil
	}
	finalized.Store(true)
	if !proc.ours {
		return nil
	}
	var rc int
	done := make(chan struct{})
	proc.work <- func() { rc = cFinalize(); close(done) }
	<-done
	close(proc.work)
	if rc != 0 {
		return fmt.Errorf("mpi: MPI_Finalize: %w", newError(rc))
	}
	return nil
}

// LibraryVersion returns the first line of MPI_Get_library_version (for
// example "Open MPI v4.1.4, ..."), or "" before New or after Finalize.
func LibraryVersion() string {
	proc.mu.Lock()
	defer proc.mu.Unlock()
	if !proc.started || finalized.Load() {
		return ""
	}
	var v string
	execAt(proc.level, proc.work, func() { v = libraryVersion() })
	return v
}

// Error is an error code returned by an MPI call, with MPI's text for it.
type Error struct {
	Code  int    // the code the call returned
	Class int    // MPI_Error_class(Code); -1 if unknown
	Msg   string // MPI_Error_string(Code)
}

func (e *Error) Error() string {
	if e.Msg == "" {
		return fmt.Sprintf("MPI error %d (class %d)", e.Code, e.Class)
	}
	return e.Msg
}

// newError looks the code's text up; the caller holds the right to call MPI.
func newError(code int) *Error {
	msg, cls := errorString(code)
	return &Error{Code: code, Class: cls, Msg: msg}
}

// Backend is one rank of an MPI communicator duplicated from
// MPI_COMM_WORLD. It implements backends.Backend; see the package
// documentation for what cancellation and Close can and cannot do.
type Backend struct {
	comm       comm
	rank, size int
	level      threadLevel
	work       chan func()

	// ranks are a group's members as ranks of the Backend that made it
	// (Group); nil for a Backend from New.
	ranks []int

	mu     sync.Mutex
	busy   bool                // a collective is running
	closed bool                // Close was called
	freed  bool                // the communicator is freed
	err    error               // the failure every later call returns
	groups map[string]*Backend // the groups made by Group, closed with b
}

var _ backends.Grouper = (*Backend)(nil)

// groupTag is the tag of MPI_Comm_create_group: members create their
// groups one at a time, in the order of the collectives they share, so one
// tag serves them all.
const groupTag = 0x4856

// Group returns the Backend of a group of b's ranks (backends.Grouper):
// a communicator made by MPI_Comm_create_group, which every member calls
// and no other rank does, at the same point of the collectives the members
// share. Group needs MPI_THREAD_MULTIPLE: the call blocks until every
// member has made it, and below that level it would hold the process's MPI
// lock (or main thread) meanwhile, which the MPI control links need. The
// same ranks give the same Backend; closing b closes its groups.
func (b *Backend) Group(ranks []int) (backends.Backend, error) {
	me := -1
	for i, r := range ranks {
		if r < 0 || r >= b.size || i > 0 && r <= ranks[i-1] {
			return nil, fmt.Errorf("mpi: group %v: ranks must be ascending and in [0, %d)", ranks, b.size)
		}
		if r == b.rank {
			me = i
		}
	}
	if me < 0 {
		return nil, fmt.Errorf("mpi: group %v does not hold this rank (%d)", ranks, b.rank)
	}
	key := fmt.Sprint(ranks)
	b.mu.Lock()
	g := b.groups[key]
	b.mu.Unlock()
	if g != nil {
		return g, nil
	}
	if b.level != levelMultiple {
		return nil, fmt.Errorf("mpi: a group of ranks %v needs MPI_THREAD_MULTIPLE; this MPI provides %v", ranks, b.level)
	}
	if err := b.begin(context.Background(), "Group"); err != nil {
		return nil, err
	}
	var c comm
	var rank int
	rc := 0
	b.exec(func() { c, rank, rc = b.comm.group(ints32(ranks), groupTag) })
	if err := b.end(b.mpiErr("MPI_Comm_create_group", rc)); err != nil {
		return nil, err
	}
	g = &Backend{comm: c, rank: rank, size: len(ranks), level: b.level, work: b.work, ranks: slices.Clone(ranks)}
	if b.ranks != nil {
		for i, r := range g.ranks {
			g.ranks[i] = b.ranks[r]
		}
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		g.closed = true
		g.freeLocked()
		return nil, fmt.Errorf("mpi: Group: %w", backends.ErrClosed)
	}
	if b.groups == nil {
		b.groups = make(map[string]*Backend)
	}
	b.groups[key] = g
	return g, nil
}

func ints32(v []int) []int32 {
	out := make([]int32, len(v))
	for i, x := range v {
		out[i] = int32(x)
	}
	return out
}

// New initialises MPI if needed and returns a backend on a private
// duplicate of MPI_COMM_WORLD. MPI_Comm_dup is collective: every rank must
// call New the same number of times in the same order, from one goroutine
// at a time.
func New(cfg Config) (*Backend, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	proc.mu.Lock()
	defer proc.mu.Unlock()
	if err := initMPI(); err != nil {
		return nil, err
	}
	b := &Backend{level: proc.level, work: proc.work}
	var err error
	b.exec(func() {
		var rc int
		if b.comm, b.rank, b.size, rc = cDupWorld(); rc != 0 {
			err = fmt.Errorf("mpi: MPI_Comm_dup(MPI_COMM_WORLD): %w", newError(rc))
		}
	})
	if err != nil {
		return nil, err
	}
	return b, nil
}

// Name returns "mpi".
func (b *Backend) Name() string { return "mpi" }

// Rank is this process's rank in the communicator.
func (b *Backend) Rank() int { return b.rank }

// Size is the number of ranks.
func (b *Backend) Size() int { return b.size }

// ThreadLevel names the thread level MPI provides ("MPI_THREAD_MULTIPLE"),
// which decides between blocking calls and polled nonblocking ones.
func (b *Backend) ThreadLevel() string { return b.level.String() }

// callMu serialises MPI calls at MPI_THREAD_SERIALIZED.
var callMu sync.Mutex

// execAt runs f where MPI allows a call at level: on the calling thread at
// MPI_THREAD_MULTIPLE; on the calling thread under the process-wide callMu
// at MPI_THREAD_SERIALIZED; on MPI's main thread, one call at a time, at
// FUNNELED or SINGLE.
func execAt(level threadLevel, work chan func(), f func()) {
	switch level {
	case levelMultiple:
		f()
	case levelSerialized:
		callMu.Lock()
		defer callMu.Unlock()
		f()
	default:
		done := make(chan struct{})
		work <- func() { defer close(done); f() }
		<-done
	}
}

func (b *Backend) exec(f func()) { execAt(b.level, b.work, f) }

// begin admits a collective: it fails on a closed or failed backend, and
// fails the backend if ctx is already done (the peers would otherwise wait
// in a collective this rank never enters).
func (b *Backend) begin(ctx context.Context, what string) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	switch {
	case b.closed:
		return fmt.Errorf("mpi: %s: %w", what, backends.ErrClosed)
	case b.err != nil:
		return b.err
	case finalized.Load():
		return fmt.Errorf("mpi: %s: %w", what, ErrFinalized)
	}
	if err := ctx.Err(); err != nil {
		b.err = fmt.Errorf("mpi: %s not started (the backend is now out of step with its peers): %w", what, err)
		return b.err
	}
	b.busy = true
	return nil
}

// end finishes a collective begun by begin: an error fails the backend, and
// a Close that came in meanwhile frees the communicator now.
func (b *Backend) end(err error) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.busy = false
	if err != nil && b.err == nil {
		b.err = err
	}
	if b.closed {
		b.freeLocked()
	}
	return err
}

// Close frees the communicator. It does not interrupt a collective blocked
// in MPI (nothing can); the communicator is then freed when that call
// returns. Later calls return an error wrapping backends.ErrClosed. Close
// after Finalize does nothing.
func (b *Backend) Close() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return nil
	}
	b.closed = true
	for _, g := range b.groups {
		g.Close()
	}
	if b.busy {
		return nil
	}
	return b.freeLocked()
}

func (b *Backend) freeLocked() error {
	if b.freed {
		return nil
	}
	b.freed = true
	proc.mu.Lock()
	defer proc.mu.Unlock()
	if finalized.Load() {
		return nil
	}
	var err error
	b.exec(func() {
		if rc := b.comm.free(); rc != 0 {
			err = fmt.Errorf("mpi: MPI_Comm_free: %w", newError(rc))
		}
	})
	return err
}

// mpiErr turns a return code into an error: a *backends.PeerError when
// the library names a failed rank (ULFM), else the wrapped *Error. Called
// where MPI may be called.
func (b *Backend) mpiErr(call string, rc int) error {
	if rc == 0 {
		return nil
	}
	err := fmt.Errorf("mpi: %s: %w", call, newError(rc))
	if r := b.comm.failedRank(rc); r >= 0 {
		if b.ranks != nil {
			r = b.ranks[r] // a group's rank, named in the world's
		}
		return &backends.PeerError{Rank: r, Err: err}
	}
	return err
}

// run makes one MPI operation. At MPI_THREAD_MULTIPLE that is the blocking
// call, start(nil), on this goroutine's thread. Below it, start(req) begins
// the nonblocking call and run polls it, holding the MPI lock only for each
// single call; keep lists the Go memory MPI uses until then, pinned
// meanwhile.
func (b *Backend) run(call string, start func(req *request) int, keep ...unsafe.Pointer) error {
	if b.level == levelMultiple {
		return b.mpiErr(call, start(nil))
	}
	return b.runAll(call, 1, func(reqs []request) int { return start(&reqs[0]) }, keep...)
}

// runAll starts n nonblocking operations (start fills reqs and stops at the
// first error) and waits for all of them: MPI_Waitall at
// MPI_THREAD_MULTIPLE, else MPI_Testall polled under the lock.
func (b *Backend) runAll(call string, n int, start func(reqs []request) int, keep ...unsafe.Pointer) error {
	pin := new(runtime.Pinner)
	for _, p := range keep {
		if p != nil {
			pin.Pin(p)
		}
	}
	reqs := make([]request, n)
	for i := range reqs {
		reqs[i] = nullRequest()
	}
	var err error
	b.exec(func() {
		if rc := start(reqs); rc != 0 {
			err = b.mpiErr(call, rc)
		}
	})
	if err == nil {
		if b.level == levelMultiple {
			err = b.mpiErr(call, waitAll(reqs))
		} else {
			for i := 0; ; i++ {
				var done bool
				b.exec(func() {
					var rc int
					if done, rc = testAll(reqs); rc != 0 {
						err = b.mpiErr(call, rc)
					}
				})
				if done || err != nil {
					break
				}
				backoff(i)
			}
		}
	}
	if err != nil {
		// Requests may still be in flight: their memory stays pinned.
		leaked.Lock()
		leaked.pins = append(leaked.pins, pin)
		leaked.Unlock()
		return err
	}
	pin.Unpin()
	return nil
}

// backoff paces the polling of a request: yield at first, then sleep a few
// microseconds more each time, up to 50 µs.
func backoff(i int) {
	if i < 64 {
		runtime.Gosched()
		return
	}
	time.Sleep(time.Duration(min(i-63, 50)) * time.Microsecond)
}

// ptr is the address of b's first byte, nil for an empty slice.
func ptr(b []byte) unsafe.Pointer {
	if len(b) == 0 {
		return nil
	}
	return unsafe.Pointer(&b[0])
}

func ctxErr(ctx context.Context, what string) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("mpi: %s stopped between MPI calls (the backend is now out of step with its peers): %w", what, err)
	}
	return nil
}

func checkReduce(what string, dt tensor.DType, op tensor.ReduceOp) error {
	if !dt.Valid() {
		return fmt.Errorf("mpi: %s: invalid dtype %v", what, dt)
	}
	switch op {
	case tensor.Sum, tensor.Min, tensor.Max, tensor.Product:
		return nil
	}
	return fmt.Errorf("mpi: %s: unsupported reduce op %v (want Sum, Min, Max or Product)", what, op)
}

// checkCounts validates per-rank byte counts and returns their sum.
func (b *Backend) checkCounts(what, name string, counts []int, unit int) (int, error) {
	if len(counts) != b.size {
		return 0, fmt.Errorf("mpi: %s: %d %s for %d ranks", what, len(counts), name, b.size)
	}
	total := 0
	for r, c := range counts {
		if c < 0 || c%unit != 0 {
			return 0, fmt.Errorf("mpi: %s: %s[%d] = %d is not a non-negative multiple of %d", what, name, r, c, unit)
		}
		total += c
	}
	return total, nil
}

// offsets returns the running sums of counts.
func offsets(counts []int) []int {
	off := make([]int, len(counts))
	for i := 1; i < len(counts); i++ {
		off[i] = off[i-1] + counts[i-1]
	}
	return off
}

func int32s(v []int, div int) []int32 {
	out := make([]int32, len(v))
	for i, x := range v {
		out[i] = int32(x / div)
	}
	return out
}

// Allreduce reduces buf in place across ranks (MPI_Allreduce with
// MPI_IN_PLACE), in pieces of at most maxCount elements.
func (b *Backend) Allreduce(ctx context.Context, buf []byte, dt tensor.DType, op tensor.ReduceOp) (err error) {
	const what = "Allreduce"
	if err := b.begin(ctx, what); err != nil {
		return err
	}
	defer func() { err = b.end(err) }()
	if err := checkReduce(what, dt, op); err != nil {
		return err
	}
	sz := dt.Size()
	if len(buf)%sz != 0 {
		return fmt.Errorf("mpi: %s: %d bytes is not a whole number of %v elements", what, len(buf), dt)
	}
	n := len(buf) / sz
	for off := 0; off < n; off += maxCount {
		if err := ctxErr(ctx, what); err != nil {
			return err
		}
		c, p := min(n-off, maxCount), unsafe.Pointer(&buf[off*sz])
		if err := b.run("MPI_Allreduce", func(req *request) int {
			return b.comm.allreduce(p, c, int(dt), int(op), req)
		}, p); err != nil {
			return err
		}
	}
	return nil
}

// Allgatherv gathers every rank's in into out (MPI_Allgatherv on
// MPI_BYTE). When the total exceeds maxCount bytes (MPI's displacements are
// ints) it falls back to one chunked broadcast per rank.
func (b *Backend) Allgatherv(ctx context.Context, in, out []byte, counts []int) (err error) {
	const what = "Allgatherv"
	if err := b.begin(ctx, what); err != nil {
		return err
	}
	defer func() { err = b.end(err) }()
	total, err := b.checkCounts(what, "counts", counts, 1)
	if err != nil {
		return err
	}
	if len(in) != counts[b.rank] || len(out) != total {
		return fmt.Errorf("mpi: %s: len(in) = %d, len(out) = %d, want %d and %d", what, len(in), len(out), counts[b.rank], total)
	}
	if total == 0 {
		return nil
	}
	off := offsets(counts)
	if total <= maxCount {
		cnt, displs := int32s(counts, 1), int32s(off, 1)
		pi, po := ptr(in), ptr(out)
		return b.run("MPI_Allgatherv", func(req *request) int {
			return b.comm.allgatherv(pi, len(in), po, cnt, displs, req)
		}, pi, po, unsafe.Pointer(&cnt[0]), unsafe.Pointer(&displs[0]))
	}
	copy(out[off[b.rank]:], in)
	for r := range b.size {
		if err := b.bcast(ctx, what, out[off[r]:off[r]+counts[r]], r); err != nil {
			return err
		}
	}
	return nil
}

// Broadcast copies root's buf to every rank (MPI_Bcast on MPI_BYTE, in
// pieces of at most maxCount bytes).
func (b *Backend) Broadcast(ctx context.Context, buf []byte, root int) (err error) {
	const what = "Broadcast"
	if err := b.begin(ctx, what); err != nil {
		return err
	}
	defer func() { err = b.end(err) }()
	if root < 0 || root >= b.size {
		return fmt.Errorf("mpi: %s: root %d out of range [0, %d)", what, root, b.size)
	}
	return b.bcast(ctx, what, buf, root)
}

func (b *Backend) bcast(ctx context.Context, what string, buf []byte, root int) error {
	for off := 0; off < len(buf); off += maxCount {
		if err := ctxErr(ctx, what); err != nil {
			return err
		}
		c, p := min(len(buf)-off, maxCount), unsafe.Pointer(&buf[off])
		if err := b.run("MPI_Bcast", func(req *request) int { return b.comm.bcast(p, c, root, req) }, p); err != nil {
			return err
		}
	}
	return nil
}

// Alltoallv exchanges pieces between every pair of ranks (MPI_Alltoallv on
// MPI_BYTE). When any rank's send or receive total exceeds maxCount bytes
// (MPI's counts and displacements are ints) every rank falls back to
// pairwise exchanges of chunked MPI_Isend/MPI_Irecv; a 1-byte allreduce
// ahead of the exchange tells every rank which path the job takes.
func (b *Backend) Alltoallv(ctx context.Context, in []byte, sendCounts []int, out []byte, recvCounts []int) (err error) {
	const what = "Alltoallv"
	if err := b.begin(ctx, what); err != nil {
		return err
	}
	defer func() { err = b.end(err) }()
	sendTotal, err := b.checkCounts(what, "sendCounts", sendCounts, 1)
	if err != nil {
		return err
	}
	recvTotal, err := b.checkCounts(what, "recvCounts", recvCounts, 1)
	if err != nil {
		return err
	}
	if len(in) != sendTotal || len(out) != recvTotal {
		return fmt.Errorf("mpi: %s: len(in) = %d, len(out) = %d, want %d and %d", what, len(in), len(out), sendTotal, recvTotal)
	}
	sendOff, recvOff := offsets(sendCounts), offsets(recvCounts)
	// Whether any rank's totals exceed MPI's int range is known only to
	// that rank, and every rank must take the same path: a 1-byte
	// MPI_Allreduce (MAX) of the flag decides.
	//
	// Below MPI_THREAD_MULTIPLE every rank takes the pairwise path, without
	// the flag: with Open MPI 4.1 at 2 ranks, an MPI_Ialltoallv with empty
	// pieces followed by an MPI_Iallreduce was seen to never complete.
	big := []byte{0}
	if sendTotal > maxCount || recvTotal > maxCount || b.level != levelMultiple {
		big[0] = 1
	}
	if b.size > 1 && b.level == levelMultiple {
		p := unsafe.Pointer(&big[0])
		if err := b.run("MPI_Allreduce", func(req *request) int {
			return b.comm.allreduce(p, 1, int(tensor.Uint8), int(tensor.Max), req)
		}, p); err != nil {
			return err
		}
	}
	if big[0] == 0 {
		sc, sd, rc, rd := int32s(sendCounts, 1), int32s(sendOff, 1), int32s(recvCounts, 1), int32s(recvOff, 1)
		pi, po := ptr(in), ptr(out)
		return b.run("MPI_Alltoallv", func(req *request) int {
			return b.comm.alltoallv(pi, sc, sd, po, rc, rd, req)
		}, pi, po, unsafe.Pointer(&sc[0]), unsafe.Pointer(&sd[0]), unsafe.Pointer(&rc[0]), unsafe.Pointer(&rd[0]))
	}
	if recvCounts[b.rank] != sendCounts[b.rank] {
		return fmt.Errorf("mpi: %s: sendCounts[%d] = %d but recvCounts[%d] = %d", what, b.rank, sendCounts[b.rank], b.rank, recvCounts[b.rank])
	}
	copy(out[recvOff[b.rank]:][:recvCounts[b.rank]], in[sendOff[b.rank]:][:sendCounts[b.rank]])
	chunks := func(n int) int { return (n + maxCount - 1) / maxCount }
	for s := 1; s < b.size; s++ {
		if err := ctxErr(ctx, what); err != nil {
			return err
		}
		to, from := (b.rank+s)%b.size, (b.rank-s+b.size)%b.size
		send := in[sendOff[to]:][:sendCounts[to]]
		recv := out[recvOff[from]:][:recvCounts[from]]
		ns, nr := chunks(len(send)), chunks(len(recv))
		if err := b.runAll("MPI_Isend/MPI_Irecv", ns+nr, func(reqs []request) int {
			for k := range nr {
				p := recv[k*maxCount:]
				if rc := b.comm.irecv(unsafe.Pointer(&p[0]), min(len(p), maxCount), from, &reqs[k]); rc != 0 {
					return rc
				}
			}
			for k := range ns {
				p := send[k*maxCount:]
				if rc := b.comm.isend(unsafe.Pointer(&p[0]), min(len(p), maxCount), to, &reqs[nr+k]); rc != 0 {
					return rc
				}
			}
			return 0
		}, ptr(send), ptr(recv)); err != nil {
			return err
		}
	}
	return nil
}

// ReduceScatter reduces in across ranks and leaves block r in rank r's out
// (MPI_Reduce_scatter with per-rank counts in elements). When the total
// exceeds maxCount elements it falls back to chunked MPI_Reduce calls, one
// root per block.
func (b *Backend) ReduceScatter(ctx context.Context, in, out []byte, counts []int, dt tensor.DType, op tensor.ReduceOp) (err error) {
	const what = "ReduceScatter"
	if err := b.begin(ctx, what); err != nil {
		return err
	}
	defer func() { err = b.end(err) }()
	if err := checkReduce(what, dt, op); err != nil {
		return err
	}
	sz := dt.Size()
	total, err := b.checkCounts(what, "counts", counts, sz)
	if err != nil {
		return err
	}
	if len(in) != total || len(out) != counts[b.rank] {
		return fmt.Errorf("mpi: %s: len(in) = %d, len(out) = %d, want %d and %d", what, len(in), len(out), total, counts[b.rank])
	}
	if total == 0 {
		return nil
	}
	if total/sz <= maxCount {
		cnt := int32s(counts, sz)
		pi, po := ptr(in), ptr(out)
		return b.run("MPI_Reduce_scatter", func(req *request) int {
			return b.comm.reduceScatter(pi, po, cnt, int(dt), int(op), req)
		}, pi, po, unsafe.Pointer(&cnt[0]))
	}
	off := offsets(counts)
	for r := range b.size {
		block := in[off[r]:][:counts[r]]
		for e := 0; e < counts[r]/sz; e += maxCount {
			if err := ctxErr(ctx, what); err != nil {
				return err
			}
			c := min(counts[r]/sz-e, maxCount)
			pi := unsafe.Pointer(&block[e*sz])
			var po unsafe.Pointer
			if r == b.rank {
				po = unsafe.Pointer(&out[e*sz])
			}
			if err := b.run("MPI_Reduce", func(req *request) int {
				return b.comm.reduce(pi, po, c, int(dt), int(op), r, req)
			}, pi, po); err != nil {
				return err
			}
		}
	}
	return nil
}

// Barrier returns when every rank has called it (MPI_Barrier).
func (b *Backend) Barrier(ctx context.Context) (err error) {
	const what = "Barrier"
	if err := b.begin(ctx, what); err != nil {
		return err
	}
	defer func() { err = b.end(err) }()
	return b.run("MPI_Barrier", func(req *request) int { return b.comm.barrier(req) })
}
