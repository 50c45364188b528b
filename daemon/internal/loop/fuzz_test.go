package loop

import (
	"io"
	"log/slog"
	"strings"
	"testing"

	"github.com/hvdd/hvdd/daemon/internal/exec/device"
	"github.com/hvdd/hvdd/gpu/fake"
	"github.com/hvdd/hvdd/ipc/ipcpb"
	"github.com/hvdd/hvdd/shm"
)

// FuzzResolve checks every Enqueue against a client's regions: a request is
// either refused with an error or yields a buffer that lies inside its region
// and matches the declared shape and dtype.
func FuzzResolve(f *testing.F) {
	f.Add("w", int32(1), int32(9), int64(4), int64(2), uint32(1), uint64(0), uint64(32), 1.0, 1.0)
	f.Add("w", int32(1), int32(9), int64(-1), int64(2), uint32(1), uint64(0), uint64(32), 1.0, 1.0)
	f.Add("w", int32(3), int32(1), int64(1<<40), int64(1<<40), uint32(1), uint64(1<<63), uint64(1<<63), 0.0, 2.0)
	f.Add("", int32(6), int32(0), int64(0), int64(0), uint32(0), uint64(0), uint64(0), 0.0, 0.0)
	m, err := shm.Create("fuzz", 1<<16)
	if err != nil {
		f.Fatal(err)
	}
	defer m.Close()
	f.Fuzz(func(t *testing.T, name string, op, dt int32, d0, d1 int64, reg uint32, off, n uint64, pre, post float64) {
		r := &region{id: 1, m: m}
		r.refs.Store(1)
		c := &client{regions: map[uint32]*region{1: r}}
		e := &ipcpb.Enqueue{Name: name, Op: ipcpb.OpType(op), Dtype: ipcpb.DType(dt), Shape: []int64{d0, d1},
			Buffer: &ipcpb.Buffer{Region: reg, Offset: off, Length: n}, Prescale: pre, Postscale: post}
		o, err := c.Resolve(1, e)
		if err != nil {
			if strings.TrimSpace(err.Error()) == "" {
				t.Fatal("empty error text")
			}
			if r.refs.Load() != 1 {
				t.Fatalf("refused request leaked a region reference (%d)", r.refs.Load())
			}
			return
		}
		if o.Buf != nil {
			if uint64(len(o.Buf)) != n || off+n > uint64(m.Size()) || off+n < off {
				t.Fatalf("accepted buffer [%d,+%d) outside the %d-byte region", off, n, m.Size())
			}
			if int64(len(o.Buf)) != o.Req.Shape.NumElements()*int64(o.Req.DType.Size()) {
				t.Fatalf("buffer of %d bytes for shape %v %v", len(o.Buf), o.Req.Shape, o.Req.DType)
			}
		}
		o.Release()
		if r.refs.Load() != 1 {
			t.Fatalf("released op left %d references", r.refs.Load())
		}
	})
}

// TestResolveBothBuffers: an Enqueue that names both a host buffer and a
// device buffer is refused before either is resolved.
func TestResolveBothBuffers(t *testing.T) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	g := device.OpenGPUs(fake.New(fake.Options{Devices: 1}), nil, log, false)
	defer g.Close()
	c := &client{l: &Loop{cfg: Config{GPUs: g, Log: log}}, gpu: device.ConnGPU{Log: log}}
	e := &ipcpb.Enqueue{Name: "t", Op: ipcpb.OpType_OP_ALLREDUCE, Dtype: ipcpb.DType_DTYPE_FLOAT32, Shape: []int64{4},
		Buffer:       &ipcpb.Buffer{Length: 16},
		DeviceBuffer: &ipcpb.DeviceBuffer{DeviceUuid: g.UUIDs()[0], Length: 16}}
	if o, err := c.Resolve(1, e); err == nil || !strings.Contains(err.Error(), "both a host buffer and a device buffer") {
		t.Fatalf("Resolve = %v, %v; want the refusal of both buffers", o, err)
	}
	if c.gpu.Mapped() != 0 {
		t.Fatalf("the refused request mapped %d allocations", c.gpu.Mapped())
	}
}
