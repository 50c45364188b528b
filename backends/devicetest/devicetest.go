// Package devicetest is the conformance suite of hvdd's device-memory
// engines (backends.DeviceEngine), in the manner of backends/backendtest:
// a group of ranks in one test process, a matrix of world sizes x counts x
// dtypes x ops for every collective on buffers in device memory, results
// checked against references computed on the CPU (backendtest.Reduce, on
// inputs backendtest.Fill chooses so that every reduction is exact in any
// order), and the failure contract: Abort and Close from another goroutine
// end a Wait blocked on a collective that peers never join, a cancelled
// Wait aborts, an asynchronous error surfaces from Wait, and none of them
// hangs.
//
// An engine's test calls
//
//	devicetest.Run(t, func(t *testing.T, size int) []backends.DeviceEngine { ... }, devicetest.Options{})
//
// with a factory that builds size connected engines (rank i at index i),
// each on a GPU of its own; it may t.Skip sizes it cannot build (a machine
// with fewer GPUs: NCCL puts one rank on a GPU). The suite makes a stream
// and buffers on each engine's Device and closes the engines when the
// subtest that made them ends; the factory releases the devices (with
// t.Cleanup, which then runs after the suite's).
//
// The matrix drives every rank from a goroutine of its own, as ranks on
// different nodes do; the Group subtest drives all ranks from one
// goroutine inside one backends.DeviceGrouper group, as the daemon drives
// the GPUs of its node. NCCL has no 16-bit integers or bool: reductions on
// them must fail with errors.ErrUnsupported, and the collectives that only
// move data must move every dtype.
//
// The suite checks what every engine must do; an engine's transport, its
// bootstrap and its library's details belong to its own tests.
package devicetest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/hvdd/hvdd/backends"
	"github.com/hvdd/hvdd/gpu"
)

// opTimeout bounds every collective the suite waits for, so an engine bug
// shows as a failed test rather than a hung one.
const opTimeout = 60 * time.Second

// failTimeout is how long a Wait may take to return after the failure it
// must report (an Abort, a Close, a peer's abort, an asynchronous error or
// its context's end): the engines poll every few ms and drain at once.
const failTimeout = 10 * time.Second

// Factory builds size connected engines, the one of rank i at index i, each
// on a GPU of its own. It may call t.Skip or t.Fatal.
type Factory func(t *testing.T, size int) []backends.DeviceEngine

// Options tune the suite for an engine and a machine. The zero value runs
// everything but the injected asynchronous error.
type Options struct {
	// Sizes are the world sizes of the matrix; nil means 1, 2, 3, 4, 5 and
	// 8 (1, 2, 3 and 5 with -short or the race detector).
	Sizes []int
	// InjectAsyncError makes e's communicator report an asynchronous error
	// (ncclCommGetAsyncError), as a failed link would, while e's rank waits
	// for a collective its peers never join; nil skips that case (a real
	// library has no way to provoke one).
	InjectAsyncError func(t *testing.T, e backends.DeviceEngine)
}

// light reports whether the suite runs trimmed.
func light() bool { return testing.Short() || raceEnabled }

// Run runs the conformance suite on the engines newGroup builds.
func Run(t *testing.T, newGroup Factory, opts Options) {
	sizes := opts.Sizes
	if sizes == nil {
		sizes = []int{1, 2, 3, 4, 5, 8}
		if light() {
			sizes = []int{1, 2, 3, 5}
		}
	}
	for _, size := range sizes {
		t.Run(fmt.Sprintf("n=%d", size), func(t *testing.T) {
			w := newWorld(t, newGroup, size)
			for i, x := range w.ranks {
				if x.e.Rank() != i || x.e.Size() != size {
					t.Fatalf("engine %d reports rank %d of %d, want %d of %d", i, x.e.Rank(), x.e.Size(), i, size)
				}
				if x.e.Name() == "" {
					t.Errorf("engine %d has an empty Name", i)
				}
			}
			// One group runs everything, so each test also checks that
			// the ones before left the engines aligned.
			t.Run("Allreduce", func(t *testing.T) { testAllreduce(t, w, apart, true) })
			t.Run("Broadcast", func(t *testing.T) { testBroadcast(t, w, apart, true) })
			t.Run("Allgather", func(t *testing.T) { testAllgather(t, w, apart, true) })
			t.Run("ReduceScatter", func(t *testing.T) { testReduceScatter(t, w, apart, true) })
			t.Run("Alltoallv", func(t *testing.T) { testAlltoallv(t, w, apart, true) })
			t.Run("Unsupported", func(t *testing.T) { testUnsupported(t, w) })
			t.Run("BadArguments", func(t *testing.T) { testBadArguments(t, w) })
			t.Run("BackToBack", func(t *testing.T) { testBackToBack(t, w) })
			t.Run("SendRecv", func(t *testing.T) { testSendRecv(t, w) })
			t.Run("Group", func(t *testing.T) {
				if _, ok := w.ranks[0].e.(backends.DeviceGrouper); !ok {
					t.Skip("the engine has no Group")
				}
				t.Run("Allreduce", func(t *testing.T) { testAllreduce(t, w, together, false) })
				t.Run("Broadcast", func(t *testing.T) { testBroadcast(t, w, together, false) })
				t.Run("Allgather", func(t *testing.T) { testAllgather(t, w, together, false) })
				t.Run("ReduceScatter", func(t *testing.T) { testReduceScatter(t, w, together, false) })
				t.Run("Alltoallv", func(t *testing.T) { testAlltoallv(t, w, together, false) })
			})
		})
	}
	t.Run("Close", func(t *testing.T) { testClose(t, newGroup) })
	t.Run("Failure", func(t *testing.T) { testFailure(t, newGroup, opts) })
}

// rank is one engine with the suite's stream and buffers on its device.
type rank struct {
	e          backends.DeviceEngine
	dev        gpu.Device
	s          gpu.Stream
	send, recv arena
}

// arena is a device buffer that grows on demand.
type arena struct {
	p gpu.DevicePtr
	n int
}

// world is a group of engines under test.
type world struct {
	ranks []*rank
}

func (w *world) n() int { return len(w.ranks) }

// newWorld builds a group with newGroup and a stream on each engine's
// device, all released when t ends.
func newWorld(t *testing.T, newGroup Factory, size int) *world {
	t.Helper()
	es := newGroup(t, size)
	if len(es) != size {
		t.Fatalf("factory returned %d engines, want %d", len(es), size)
	}
	w := &world{}
	t.Cleanup(func() {
		for _, x := range w.ranks {
			for _, a := range []*arena{&x.send, &x.recv} {
				if a.n > 0 {
					x.dev.Free(a.p)
				}
			}
			x.s.Destroy()
		}
		for _, e := range es {
			e.Close()
		}
	})
	for i, e := range es {
		dev := e.Device()
		if dev == nil {
			t.Fatalf("engine %d has no Device", i)
		}
		s, err := dev.NewStream()
		if err != nil {
			t.Fatalf("rank %d: NewStream: %v", i, err)
		}
		w.ranks = append(w.ranks, &rank{e: e, dev: dev, s: s})
	}
	return w
}

// buf returns a's pointer, grown to n bytes at least. It may run on a
// rank's goroutine: a failed allocation is reported with t.Errorf and gives
// a null pointer, which the engine's call then refuses.
func (x *rank) buf(t *testing.T, a *arena, n int) gpu.DevicePtr {
	t.Helper()
	if n <= a.n && a.n > 0 {
		return a.p
	}
	if a.n > 0 {
		x.dev.Free(a.p)
		a.n = 0
	}
	m := max(n, 4096)
	p, err := x.dev.Alloc(m)
	if err != nil {
		t.Errorf("rank %d: Alloc(%d): %v", x.e.Rank(), m, err)
		return 0
	}
	a.p, a.n = p, m
	return p
}

// put enqueues the copy of b to p (nothing for an empty b).
func (x *rank) put(p gpu.DevicePtr, b []byte) error {
	if len(b) == 0 {
		return nil
	}
	return x.dev.CopyHtoD(x.s, p, b)
}

// get enqueues the copy of len(b) bytes at p to b.
func (x *rank) get(b []byte, p gpu.DevicePtr) error {
	if len(b) == 0 {
		return nil
	}
	return x.dev.CopyDtoH(x.s, b, p)
}

// job is one collective on every rank: what rank k enqueues before the
// engine's call (its inputs), the call, and what it enqueues after (the
// copies of its outputs). pre and post may be nil.
type job struct {
	what            string
	pre, call, post func(k int, x *rank) error
}

// driver runs j on every rank of w and waits for it; it reports every
// rank's error on t and whether there was none.
type driver func(t *testing.T, w *world, j job) bool

// apart drives each rank from a goroutine of its own: pre, call, post and
// Wait, as the ranks of different nodes do.
func apart(t *testing.T, w *world, j job) bool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	errs := make([]error, w.n())
	var wg sync.WaitGroup
	for k, x := range w.ranks {
		wg.Go(func() {
			err := j.run(k, x)
			errs[k] = errors.Join(err, x.e.Wait(ctx, x.s))
		})
	}
	wg.Wait()
	return report(t, j.what, errs)
}

// run enqueues j's part of rank k.
func (j job) run(k int, x *rank) error {
	for _, f := range []func(int, *rank) error{j.pre, j.call, j.post} {
		if f == nil {
			continue
		}
		if err := f(k, x); err != nil {
			return err
		}
	}
	return nil
}

// together drives every rank from this goroutine: every rank's inputs,
// then their calls inside one Group of rank 0's engine, then their
// outputs, then a Wait on each, as the daemon drives the GPUs of a node.
func together(t *testing.T, w *world, j job) bool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	errs := make([]error, w.n())
	each := func(f func(int, *rank) error) {
		if f == nil {
			return
		}
		for k, x := range w.ranks {
			if errs[k] == nil {
				errs[k] = f(k, x)
			}
		}
	}
	each(j.pre)
	gerr := w.ranks[0].e.(backends.DeviceGrouper).Group(func() error {
		each(j.call)
		return errors.Join(errs...)
	})
	if gerr != nil && errors.Join(errs...) == nil {
		errs[0] = gerr
	}
	each(j.post)
	for k, x := range w.ranks {
		errs[k] = errors.Join(errs[k], x.e.Wait(ctx, x.s))
	}
	return report(t, j.what+" (grouped)", errs)
}

func report(t *testing.T, what string, errs []error) bool {
	t.Helper()
	ok := true
	for k, err := range errs {
		if err != nil {
			t.Errorf("%s: rank %d: %v", what, k, err)
			ok = false
		}
	}
	return ok
}

func sum(c []int) int {
	s := 0
	for _, x := range c {
		s += x
	}
	return s
}
