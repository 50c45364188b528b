package device

import (
	"io"
	"log/slog"
	"strings"
	"testing"

	"github.com/hvdd/hvdd/daemon/internal/job"
	"github.com/hvdd/hvdd/gpu/fake"
	"github.com/hvdd/hvdd/ipc/ipcpb"
	"github.com/hvdd/hvdd/tensor"
)

// FuzzResolveDevice checks every device buffer of an Enqueue against a fake
// GPU: a request is refused with an error (and holds no reference), or its
// bytes lie inside the allocation and match the shape and dtype; releasing
// the op leaves only the cache's reference on the mapping. (The client
// refuses an Enqueue with a host buffer as well, and shapes it cannot
// size, before its device buffer gets here: both, and invalid dtypes and
// shapes, are skipped; TestResolveBothBuffers covers the first.)
func FuzzResolveDevice(f *testing.F) {
	drv := fake.New(fake.Options{Devices: 1})
	g := OpenGPUs(drv, nil, slog.New(slog.NewTextHandler(io.Discard, nil)), false)
	if g == nil {
		f.Fatal("no fake GPU")
	}
	defer g.Close()
	if g.devs[0].opened() {
		f.Fatal("the GPU's context was opened before any device tensor")
	}
	if err := g.devs[0].open("fuzz test"); err != nil {
		f.Fatal(err)
	}
	d := g.devs[0].dev
	p, err := d.Alloc(4096)
	if err != nil {
		f.Fatal(err)
	}
	defer d.Free(p)
	h, err := d.IpcMemHandle(p)
	if err != nil {
		f.Fatal(err)
	}
	ev, err := d.NewEvent(true)
	if err != nil {
		f.Fatal(err)
	}
	defer ev.Destroy()
	eh, err := ev.IpcHandle()
	if err != nil {
		f.Fatal(err)
	}
	uuid := g.devs[0].info.UUID
	f.Add(uuid, h[:], uint64(4096), uint64(256), uint64(64), eh[:], int32(9), int64(16), false)
	f.Add(uuid, h[:], uint64(4096), uint64(4090), uint64(64), []byte{}, int32(9), int64(16), false)
	f.Add(uuid, h[:], uint64(4096), ^uint64(0), uint64(64), []byte{}, int32(9), int64(16), true)
	f.Add("GPU-x", h[:10], uint64(0), uint64(0), uint64(0), eh[:5], int32(1), int64(0), false)
	f.Add(uuid, make([]byte, 64), uint64(4096), uint64(0), uint64(8), []byte{}, int32(10), int64(1), false)
	f.Fuzz(func(t *testing.T, uuid string, mh []byte, size, off, n uint64, evh []byte, dt int32, d0 int64, both bool) {
		dtype := tensor.DType(dt)
		if both || !dtype.Valid() || d0 < 0 || d0 > 1<<40 {
			return
		}
		cg := &ConnGPU{Log: slog.New(slog.NewTextHandler(io.Discard, nil))}
		db := &ipcpb.DeviceBuffer{DeviceUuid: uuid, MemHandle: mh, AllocSize: size, Offset: off, Length: n, EventHandle: evh}
		want := uint64(d0) * uint64(dtype.Size())
		res, err := g.Resolve(cg, "t", db, want)
		if err == nil {
			if err = awaitOpen(res); err != nil {
				res.Release()
			}
		}
		if err != nil {
			if strings.TrimSpace(err.Error()) == "" {
				t.Fatal("empty error text")
			}
			for _, m := range cg.maps {
				if m.refs.Load() != 1 {
					t.Fatalf("refused request left %d references on a mapping", m.refs.Load())
				}
			}
			cg.Close()
			return
		}
		dv, _ := res.(*devOp)
		if dv == nil {
			t.Fatal("accepted without a device op")
		}
		if uint64(dv.n) != n || uint64(dv.n) != want {
			t.Fatalf("device tensor of %d bytes for shape [%d] %v (length %d)", dv.n, d0, dtype, n)
		}
		if n > 0 && (off+n < off || off+n > size || dv.ptr != dv.m.base.Add(int(off))) {
			t.Fatalf("accepted bytes [%d,+%d) outside the allocation of %d", off, n, size)
		}
		m := dv.m
		dv.Release()
		if m != nil && m.refs.Load() != 1 {
			t.Fatalf("released op left %d references on its mapping", m.refs.Load())
		}
		cg.Close()
		if m != nil && m.refs.Load() != 0 {
			t.Fatalf("closed connection left %d references on a mapping", m.refs.Load())
		}
	})
}

// awaitOpen waits until dt's handles are open (WhenOpen) and returns the
// error of a failed open.
func awaitOpen(dt job.DeviceTensor) error {
	ch := make(chan error, 1)
	if now, err := dt.WhenOpen(func(err error) { ch <- err }); now {
		return err
	}
	return <-ch
}

// TestResolveRetriesFailedOpen: an IPC open that fails (on the housekeeping
// goroutine) fails the op that waited for it, with the call named, and the
// next op on the same handle opens it again instead of reusing the failure.
func TestResolveRetriesFailedOpen(t *testing.T) {
	defer fake.Reset()
	g := OpenGPUs(fake.New(fake.Options{Devices: 1}), nil, slog.New(slog.NewTextHandler(io.Discard, nil)), false)
	defer g.Close()
	d := g.devs[0]
	if err := d.open("test"); err != nil {
		t.Fatal(err)
	}
	p, err := d.dev.Alloc(4096)
	if err != nil {
		t.Fatal(err)
	}
	defer d.dev.Free(p)
	h, err := d.dev.IpcMemHandle(p)
	if err != nil {
		t.Fatal(err)
	}
	cg := &ConnGPU{Log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	defer cg.Close()
	db := &ipcpb.DeviceBuffer{DeviceUuid: d.info.UUID, MemHandle: h[:], AllocSize: 4096, Length: 64}
	fake.FailNext("cuIpcOpenMemHandle", 1, 0)
	first, err := g.Resolve(cg, "t", db, 64)
	if err != nil {
		t.Fatal(err)
	}
	if err := awaitOpen(first); err == nil || !strings.Contains(err.Error(), "cuIpcOpenMemHandle") || !strings.Contains(err.Error(), `tensor "t"`) {
		t.Fatalf("the failed open: got %v, want an error naming the tensor and cuIpcOpenMemHandle", err)
	}
	first.Release()
	second, err := g.Resolve(cg, "t", db, 64)
	if err != nil {
		t.Fatal(err)
	}
	if err := awaitOpen(second); err != nil {
		t.Fatalf("the next op on the same handle: %v, want it opened again", err)
	}
	if dv := second.(*devOp); dv.ptr == 0 || dv.ptr != dv.m.base {
		t.Fatalf("opened again at %x (mapping base %x)", dv.ptr, dv.m.base)
	}
	second.Release()
}
