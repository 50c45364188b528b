package nccl

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hvdd/hvdd/backends"
	"github.com/hvdd/hvdd/backends/backendtest"
	"github.com/hvdd/hvdd/backends/devicetest"
	"github.com/hvdd/hvdd/backends/tcp"
	"github.com/hvdd/hvdd/gpu"
	"github.com/hvdd/hvdd/gpu/fake"
	"github.com/hvdd/hvdd/rendezvous"
	"github.com/hvdd/hvdd/tensor"
)

// fakeGPUs is how many fake devices a test's driver has: one per rank of
// the suite's largest world.
const fakeGPUs = 8

// openDevs opens devices 0..n-1 of drv, closed when t ends (after the
// suite's own cleanup, registered later, has closed the engines).
func openDevs(t *testing.T, drv gpu.Driver, n int) []gpu.Device {
	t.Helper()
	devs := make([]gpu.Device, n)
	for i := range devs {
		d, err := drv.Open(i)
		if err != nil {
			t.Fatalf("Open(%d): %v", i, err)
		}
		devs[i] = d
	}
	t.Cleanup(func() {
		for _, d := range devs {
			d.Close()
		}
	})
	return devs
}

// localFactory builds the node-local engines (NewLocal) over size devices
// of drv.
func localFactory(drv gpu.Driver, lib gpu.NCCL) devicetest.Factory {
	return func(t *testing.T, size int) []backends.DeviceEngine {
		if infos, err := drv.Devices(); err != nil || len(infos) < size {
			t.Skipf("%d ranks need %d GPUs; the driver lists %d (%v)", size, size, len(infos), err)
		}
		es, err := NewLocal(lib, openDevs(t, drv, size))
		if err != nil {
			t.Fatal(err)
		}
		out := make([]backends.DeviceEngine, size)
		for i, e := range es {
			out[i] = e
		}
		return out
	}
}

// joinFactory builds size engines that join one communicator the way
// nodes do (NewUniqueID, then Join on every rank concurrently).
func joinFactory(drv gpu.Driver, lib gpu.NCCL) devicetest.Factory {
	return func(t *testing.T, size int) []backends.DeviceEngine {
		if infos, err := drv.Devices(); err != nil || len(infos) < size {
			t.Skipf("%d ranks need %d GPUs; the driver lists %d (%v)", size, size, len(infos), err)
		}
		devs := openDevs(t, drv, size)
		id, err := NewUniqueID(lib)
		if err != nil {
			t.Fatal(err)
		}
		out := make([]backends.DeviceEngine, size)
		errs := make([]error, size)
		var wg sync.WaitGroup
		for r := range size {
			wg.Go(func() {
				e, err := Join(context.Background(), lib, devs[r], id, r, size)
				if err == nil {
					out[r] = e
				}
				errs[r] = err
			})
		}
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			for _, e := range out {
				if e != nil {
					e.Abort()
				}
			}
			t.Fatal(err)
		}
		return out
	}
}

// breakComm is the suite's asynchronous error, through the fake.
func breakComm(t *testing.T, e backends.DeviceEngine) {
	if err := fake.BreakComm(e.(*Engine).comm, 0, "injected by the conformance suite"); err != nil {
		t.Fatal(err)
	}
}

// TestConformanceLocal runs the suite on the node-local engines over the
// fake's GPUs.
func TestConformanceLocal(t *testing.T) {
	drv := fake.New(fake.Options{Devices: fakeGPUs})
	devicetest.Run(t, localFactory(drv, fake.NewNCCL()), devicetest.Options{InjectAsyncError: breakComm})
}

// TestConformanceJoin runs the suite on engines that joined across "nodes"
// (Join with one unique id) over the fake's GPUs, with stream work
// delayed at random so that missing ordering shows. The world sizes that
// TestConformanceLocal adds (4, 8) exercise nothing of Join's.
func TestConformanceJoin(t *testing.T) {
	drv := fake.New(fake.Options{Devices: fakeGPUs, MaxDelay: 50 * time.Microsecond})
	devicetest.Run(t, joinFactory(drv, fake.NewNCCL()), devicetest.Options{
		Sizes: []int{1, 2, 3, 5}, InjectAsyncError: breakComm})
}

// TestJoinWith: nodes joined through a host engine (the id carried by its
// Broadcast) form one communicator.
func TestJoinWith(t *testing.T) {
	const size = 3
	drv := fake.New(fake.Options{Devices: size})
	lib := fake.NewNCCL()
	devs := openDevs(t, drv, size)
	store := rendezvous.NewMemory()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	hosts := backendtest.NewGroup(t, size, func(ctx context.Context, r int) (backends.Backend, error) {
		return tcp.New(ctx, tcp.Config{Rank: r, Size: size, Store: store, Prefix: "nccl-test",
			ListenAddr: "127.0.0.1:0", Secret: []byte("s3cret"), Logger: quiet})
	})
	es := make([]*Engine, size)
	errs := make([]error, size)
	var wg sync.WaitGroup
	for r := range size {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			es[r], errs[r] = JoinWith(ctx, lib, devs[r], hosts[r])
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, e := range es {
			e.Close()
		}
	})
	for r, e := range es {
		if e.Rank() != r || e.Size() != size || e.Device() != devs[r] {
			t.Errorf("engine %d: rank %d of %d on %v", r, e.Rank(), e.Size(), e.Device())
		}
	}
	// One allreduce of each rank's rank+1: every rank gets 1+2+3.
	got := make([]int32, size)
	for r, e := range es {
		wg.Go(func() {
			got[r], errs[r] = allreduceOne(e, int32(r+1))
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	if want := []int32{6, 6, 6}; !slices.Equal(got, want) {
		t.Errorf("allreduce over the joined engines: %v, want %v", got, want)
	}
}

// allreduceOne runs a one-element int32 Sum on e and returns the result.
func allreduceOne(e *Engine, v int32) (int32, error) {
	dev := e.Device()
	s, err := dev.NewStream()
	if err != nil {
		return 0, err
	}
	defer s.Destroy()
	p, err := dev.Alloc(4)
	if err != nil {
		return 0, err
	}
	defer dev.Free(p)
	in := []byte{byte(v), byte(v >> 8), byte(v >> 16), byte(v >> 24)}
	out := make([]byte, 4)
	if err := dev.CopyHtoD(s, p, in); err != nil {
		return 0, err
	}
	if err := e.Allreduce(s, p, p, 1, tensor.Int32, tensor.Sum); err != nil {
		return 0, err
	}
	if err := dev.CopyDtoH(s, out, p); err != nil {
		return 0, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := e.Wait(ctx, s); err != nil {
		return 0, err
	}
	return int32(uint32(out[0]) | uint32(out[1])<<8 | uint32(out[2])<<16 | uint32(out[3])<<24), nil
}

// TestConstructorErrors: bad arguments, a failed library call and a
// bootstrap whose peers never come are errors, not hangs.
func TestConstructorErrors(t *testing.T) {
	defer fake.Reset()
	drv := fake.New(fake.Options{Devices: 2})
	lib := fake.NewNCCL()
	devs := openDevs(t, drv, 2)
	id, err := NewUniqueID(lib)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, tc := range []struct {
		what string
		err  func() error
	}{
		{"NewLocal(nil library)", func() error { _, err := NewLocal(nil, devs); return err }},
		{"NewLocal(no devices)", func() error { _, err := NewLocal(lib, nil); return err }},
		{"Join(a short id)", func() error { _, err := Join(ctx, lib, devs[0], id[:10], 0, 2); return err }},
		{"Join(rank 2 of 2)", func() error { _, err := Join(ctx, lib, devs[0], id, 2, 2); return err }},
		{"Join(rank -1)", func() error { _, err := Join(ctx, lib, devs[0], id, -1, 2); return err }},
		{"Join(nil library)", func() error { _, err := Join(ctx, nil, devs[0], id, 0, 1); return err }},
		{"NewUniqueID(nil library)", func() error { _, err := NewUniqueID(nil); return err }},
		{"NewLocal(ncclCommInitAll fails)", func() error {
			fake.FailNext("ncclCommInitAll", 1, 0)
			_, err := NewLocal(lib, devs)
			return err
		}},
		{"NewUniqueID(ncclGetUniqueId fails)", func() error {
			fake.FailNext("ncclGetUniqueId", 1, 0)
			_, err := NewUniqueID(lib)
			return err
		}},
	} {
		if err := tc.err(); err == nil {
			t.Errorf("%s succeeded", tc.what)
		}
	}
	// Rank 0 of 2 whose peer never joins gives up at ctx's end.
	cctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	if _, err := Join(cctx, lib, devs[0], id, 0, 2); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Join without its peer: %v, want an error wrapping context.DeadlineExceeded", err)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("Join without its peer took %v to give up", d)
	}
}

// spy wraps a gpu.NCCL and its communicators and records the calls that
// matter to the engine's failure handling, in order.
type spy struct {
	gpu.NCCL
	mu  sync.Mutex
	log []string
}

func (s *spy) note(what string) {
	s.mu.Lock()
	s.log = append(s.log, what)
	s.mu.Unlock()
}

func (s *spy) calls() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.log)
}

func (s *spy) CommInitAll(devs []gpu.Device) ([]gpu.Comm, error) {
	cs, err := s.NCCL.CommInitAll(devs)
	for i, c := range cs {
		cs[i] = &spyComm{c, s}
	}
	return cs, err
}

func (s *spy) GroupStart() error { s.note("GroupStart"); return s.NCCL.GroupStart() }
func (s *spy) GroupEnd() error   { s.note("GroupEnd"); return s.NCCL.GroupEnd() }

type spyComm struct {
	gpu.Comm
	s *spy
}

func (c *spyComm) Abort() error {
	c.s.note(fmt.Sprintf("Abort %d", c.Rank()))
	return c.Comm.Abort()
}

func (c *spyComm) Destroy() error {
	c.s.note(fmt.Sprintf("Destroy %d", c.Rank()))
	return c.Comm.Destroy()
}

// local returns two node-local engines over a spied fake, their streams
// and a buffer on each.
func local(t *testing.T) ([]*Engine, *spy, []gpu.Stream, []gpu.DevicePtr) {
	t.Helper()
	drv := fake.New(fake.Options{Devices: 2})
	sp := &spy{NCCL: fake.NewNCCL()}
	devs := openDevs(t, drv, 2)
	es, err := NewLocal(sp, devs)
	if err != nil {
		t.Fatal(err)
	}
	ss := make([]gpu.Stream, 2)
	ps := make([]gpu.DevicePtr, 2)
	for i, d := range devs {
		if ss[i], err = d.NewStream(); err != nil {
			t.Fatal(err)
		}
		if ps[i], err = d.Alloc(4096); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		for i, e := range es {
			e.Abort()
			ss[i].Destroy()
			devs[i].Free(ps[i])
		}
	})
	return es, sp, ss, ps
}

// TestLibraryFailure: a failed library call ends the engines made
// together; inside a Group the abort waits for ncclGroupEnd, which still
// uses the communicators.
func TestLibraryFailure(t *testing.T) {
	defer fake.Reset()
	t.Run("call", func(t *testing.T) {
		es, sp, ss, ps := local(t)
		fake.FailNext("ncclAllReduce", 1, 0)
		if err := es[0].Allreduce(ss[0], ps[0], ps[0], 4, tensor.Float32, tensor.Sum); err == nil {
			t.Fatal("Allreduce with a failing library succeeded")
		}
		if err := es[1].Allreduce(ss[1], ps[1], ps[1], 4, tensor.Float32, tensor.Sum); !errors.Is(err, backends.ErrAborted) {
			t.Errorf("the other local engine after the failure: %v, want an error wrapping backends.ErrAborted", err)
		}
		if got, want := sp.calls(), []string{"Abort 0", "Abort 1"}; !slices.Equal(got, want) {
			t.Errorf("library calls %v, want %v", got, want)
		}
	})
	t.Run("group", func(t *testing.T) {
		es, sp, ss, ps := local(t)
		fake.FailNext("ncclAllReduce", 1, 0)
		err := es[0].Group(func() error {
			return errors.Join(
				es[0].Allreduce(ss[0], ps[0], ps[0], 4, tensor.Float32, tensor.Sum),
				es[1].Allreduce(ss[1], ps[1], ps[1], 4, tensor.Float32, tensor.Sum))
		})
		if !errors.Is(err, backends.ErrAborted) {
			t.Errorf("Group: %v, want an error wrapping backends.ErrAborted", err)
		}
		if got, want := sp.calls(), []string{"GroupStart", "GroupEnd", "Abort 0", "Abort 1"}; !slices.Equal(got, want) {
			t.Errorf("library calls %v, want %v", got, want)
		}
	})
	t.Run("GroupEnd", func(t *testing.T) {
		es, sp, ss, ps := local(t)
		fake.FailNext("ncclGroupEnd", 1, 0)
		err := es[0].Group(func() error {
			return es[1].Broadcast(ss[1], ps[1], ps[1], 4, tensor.Float32, 0)
		})
		if err == nil {
			t.Fatal("Group with a failing ncclGroupEnd succeeded")
		}
		if got, want := sp.calls(), []string{"GroupStart", "GroupEnd", "Abort 0", "Abort 1"}; !slices.Equal(got, want) {
			t.Errorf("library calls %v, want %v", got, want)
		}
		if err := es[0].Wait(context.Background(), ss[0]); !errors.Is(err, backends.ErrAborted) {
			t.Errorf("Wait after the failed group: %v, want an error wrapping backends.ErrAborted", err)
		}
	})
	t.Run("nested", func(t *testing.T) {
		es, sp, ss, ps := local(t)
		fake.FailNext("ncclSend", 1, 0)
		err := es[0].Group(func() error {
			return es[0].Alltoallv(ss[0], ps[0], []int{1, 1}, ps[0].Add(64), []int{1, 1}, tensor.Float32)
		})
		if err == nil {
			t.Fatal("Group around a failing Alltoallv succeeded")
		}
		want := []string{"GroupStart", "GroupStart", "GroupEnd", "GroupEnd", "Abort 0", "Abort 1"}
		if got := sp.calls(); !slices.Equal(got, want) {
			t.Errorf("library calls %v, want %v", got, want)
		}
	})
}

// TestErr: Err finds an asynchronous error of any engine made together
// and aborts them all.
func TestErr(t *testing.T) {
	es, sp, _, _ := local(t)
	for _, e := range es {
		if err := e.Err(); err != nil {
			t.Fatalf("Err of a new engine: %v", err)
		}
	}
	if err := fake.BreakComm(es[1].comm.(*spyComm).Comm, 0, "test"); err != nil {
		t.Fatal(err)
	}
	if err := es[0].Err(); !errors.Is(err, backends.ErrAborted) || !strings.Contains(err.Error(), "test") {
		t.Errorf("Err after rank 1's link broke: %v, want an error wrapping backends.ErrAborted and the cause", err)
	}
	if got, want := sp.calls(), []string{"Abort 0", "Abort 1"}; !slices.Equal(got, want) {
		t.Errorf("library calls %v, want %v", got, want)
	}
}

// TestClose: an idle healthy engine is destroyed, not aborted, and its
// sibling then fails with ErrClosed; one with an asynchronous error is
// aborted.
func TestClose(t *testing.T) {
	t.Run("idle", func(t *testing.T) {
		es, sp, ss, ps := local(t)
		if err := es[0].Close(); err != nil {
			t.Fatal(err)
		}
		if err := es[1].Allreduce(ss[1], ps[1], ps[1], 4, tensor.Float32, tensor.Sum); !errors.Is(err, backends.ErrClosed) {
			t.Errorf("the sibling of a closed engine: %v, want an error wrapping backends.ErrClosed", err)
		}
		if err := es[1].Close(); err != nil {
			t.Fatal(err)
		}
		if got, want := sp.calls(), []string{"Destroy 0", "Destroy 1"}; !slices.Equal(got, want) {
			t.Errorf("library calls %v, want %v", got, want)
		}
	})
	t.Run("broken", func(t *testing.T) {
		es, sp, _, _ := local(t)
		if err := es[0].Err(); err != nil {
			t.Fatalf("Err of a new engine: %v", err)
		}
		if err := fake.BreakComm(es[1].comm.(*spyComm).Comm, 0, "test"); err != nil {
			t.Fatal(err)
		}
		es[0].Close()
		if err := es[1].Close(); err != nil {
			t.Fatal(err)
		}
		if got, want := sp.calls(), []string{"Destroy 0", "Abort 1"}; !slices.Equal(got, want) {
			t.Errorf("library calls %v, want %v", got, want)
		}
	})
}
