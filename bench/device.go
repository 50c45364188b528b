package bench

import (
	"context"
	"errors"
	"fmt"

	hvdd "github.com/hvdd/hvdd/clients/go"
	"github.com/hvdd/hvdd/gpu"
	"github.com/hvdd/hvdd/gpu/gpuload"
	"github.com/hvdd/hvdd/tensor"
)

// --device cuda|fake: the sweep on GPU tensors. Each rank allocates its
// buffer on the GPU the daemon lists at its local rank (modulo the GPUs),
// through the driver named by --device (gpu/gpuload), and hands it to the
// daemon through CUDA IPC (hvdd.DeviceTensor). An op is timed from its
// enqueue to its Done, which the daemon sends once its device work is
// complete; a daemon device output (allgather, alltoall, reducescatter) is
// released at once unless --check reads it first.

// deviceEnv is a rank's GPU: the device, a stream, and the interprocess
// event recorded after each upload (the daemon opens it once).
type deviceEnv struct {
	dev  gpu.Device
	s    gpu.Stream
	uuid string
	name string
	ev   gpu.Event
	eh   gpu.IpcEventHandle
	// done are the daemon's completion events this rank opened (GPU-ordered
	// completion: orderAfter), by handle.
	done map[string]gpu.Event
}

// openDevice opens the GPU for this rank through the driver called name.
func openDevice(c *hvdd.Client, name string) (*deviceEnv, error) {
	uuids := c.GPUs()
	if len(uuids) == 0 {
		return nil, errors.New("--device: the daemon runs CPU-only (start it with hvdd serve --gpu)")
	}
	drv, _, err := gpuload.Load(name)
	if drv == nil {
		return nil, fmt.Errorf("--device %s: %w", name, err)
	}
	uuid := uuids[c.LocalRank()%len(uuids)]
	infos, err := drv.Devices()
	if err != nil {
		return nil, fmt.Errorf("--device %s: %w", name, err)
	}
	for _, in := range infos {
		if in.UUID != uuid {
			continue
		}
		e := &deviceEnv{uuid: uuid, name: in.Name}
		if e.dev, err = drv.Open(in.Index); err != nil {
			return nil, err
		}
		if e.s, err = e.dev.NewStream(); err != nil {
			return nil, err
		}
		if e.ev, err = e.dev.NewEvent(true); err != nil {
			return nil, err
		}
		if e.eh, err = e.ev.IpcHandle(); err != nil {
			return nil, err
		}
		return e, nil
	}
	return nil, fmt.Errorf("--device %s: the daemon's GPU %s is not visible to this rank", name, uuid)
}

// orderAfter is a DeviceTensor's OrderAfter: the bench's ops are blocking,
// so the host waits for the daemon's completion event (opened once).
func (e *deviceEnv) orderAfter(h []byte) error {
	ev := e.done[string(h)]
	if ev == nil {
		if len(h) != gpu.IpcEventHandleSize {
			return fmt.Errorf("the daemon's completion event handle has %d bytes, want %d", len(h), gpu.IpcEventHandleSize)
		}
		var eh gpu.IpcEventHandle
		copy(eh[:], h)
		var err error
		if ev, err = e.dev.OpenEventHandle(eh); err != nil {
			return err
		}
		if e.done == nil {
			e.done = make(map[string]gpu.Event)
		}
		e.done[string(h)] = ev
	}
	return ev.Synchronize(context.Background())
}

func (e *deviceEnv) close() {
	for _, ev := range e.done {
		ev.Destroy()
	}
	e.ev.Destroy()
	e.s.Destroy()
	e.dev.Close()
}

// devBuffer is one rank's device buffer of a size.
type devBuffer struct {
	e *deviceEnv
	p gpu.DevicePtr
	n int
	h gpu.IpcMemHandle
}

func (e *deviceEnv) alloc(n int) (*devBuffer, error) {
	b := &devBuffer{e: e, n: n}
	var err error
	if b.p, err = e.dev.Alloc(max(n, 1)); err != nil {
		return nil, fmt.Errorf("device buffer of %d bytes: %w", n, err)
	}
	if b.h, err = e.dev.IpcMemHandle(b.p); err != nil {
		e.dev.Free(b.p)
		return nil, err
	}
	return b, nil
}

func (b *devBuffer) free(c *hvdd.Client) {
	c.ReleaseDeviceMemory(b.h[:])
	b.e.dev.Free(b.p)
}

// upload copies src into the buffer on the rank's stream and records the
// event after it.
func (b *devBuffer) upload(src []byte) error {
	if len(src) > 0 {
		if err := b.e.dev.CopyHtoD(b.e.s, b.p, src); err != nil {
			return err
		}
	}
	return b.e.ev.Record(b.e.s)
}

func (b *devBuffer) tensor(dt tensor.DType) hvdd.DeviceTensor {
	return hvdd.DeviceTensor{UUID: b.e.uuid, Handle: b.h[:], AllocSize: uint64(max(b.n, 1)),
		Length: uint64(b.n), Event: b.e.eh[:], DType: dt, OrderAfter: b.e.orderAfter}
}

// read copies n bytes at p of the rank's context out.
func (e *deviceEnv) read(ctx context.Context, p gpu.DevicePtr, n int) ([]byte, error) {
	out := make([]byte, n)
	if n == 0 {
		return out, nil
	}
	if err := e.dev.CopyDtoH(e.s, out, p); err != nil {
		return nil, err
	}
	return out, e.s.Synchronize(ctx)
}

// output reads a daemon device output (when want) and releases it.
func (e *deviceEnv) output(ctx context.Context, c *hvdd.Client, out hvdd.DeviceOutput, want bool) ([]byte, error) {
	defer c.ReleaseDeviceOutput(out)
	if !want || out.Length == 0 {
		return nil, nil
	}
	var h gpu.IpcMemHandle
	copy(h[:], out.Handle)
	p, err := e.dev.OpenMemHandle(h, int(out.AllocSize))
	if err != nil {
		return nil, err
	}
	defer e.dev.CloseMemHandle(p)
	return e.read(ctx, p, int(out.Length))
}

// runDevice performs one collective of e.Op on the device buffer and, when
// read, returns this rank's result copied to host, as bytes.
func runDevice(ctx context.Context, c *hvdd.Client, ex Expect, b *devBuffer, read bool) ([]byte, error) {
	t := b.tensor(ex.DType)
	red := hvdd.WithOp(ex.Reduce)
	var f *hvdd.DeviceFuture
	var err error
	switch ex.Op {
	case tensor.Allreduce:
		err = c.AllreduceDevice(ctx, t, red)
	case tensor.Broadcast:
		err = c.BroadcastDevice(ctx, t, 0)
	case tensor.Allgather:
		f, err = c.AllgatherDeviceAsync(t)
	case tensor.Alltoall:
		f, err = c.AlltoallDeviceAsync(t, nil)
	case tensor.Reducescatter:
		f, err = c.ReducescatterDeviceAsync(t, red)
	default:
		return nil, fmt.Errorf("unsupported op %s", ex.Op)
	}
	if err != nil {
		return nil, err
	}
	var raw []byte
	if f != nil {
		out, err := f.Wait(ctx)
		if err != nil {
			return nil, err
		}
		if raw, err = b.e.output(ctx, c, out, read); err != nil {
			return nil, err
		}
	} else if read {
		if raw, err = b.e.read(ctx, b.p, b.n); err != nil {
			return nil, err
		}
	}
	return raw, nil // nil unless read
}
