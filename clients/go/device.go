package hvdd

import (
	"context"
	"errors"
	"fmt"

	"github.com/hvdd/hvdd/ipc/ipcpb"
	"github.com/hvdd/hvdd/tensor"
)

// DeviceTensor names a tensor in GPU memory, shared with the daemon through
// CUDA IPC (ipc/PROTOCOL.md "GPU tensors"). The client allocates the memory
// itself (through the CUDA driver, or gpu/fake in tests) and exports it; this
// package never touches the GPU. The daemon maps Handle once per connection
// and keeps the mapping until ReleaseDeviceMemory or Close, so a tensor's
// allocation must stay allocated while the daemon may use it.
type DeviceTensor struct {
	// UUID is the GPU's ("GPU-..."); it must be one of GPUs().
	UUID string
	// Handle is cuIpcGetMemHandle's 64 bytes for the allocation the tensor
	// lies in, and AllocSize that allocation's size.
	Handle    []byte
	AllocSize uint64
	// Offset and Length place the tensor in the allocation, in bytes.
	Offset, Length uint64
	// Event is cuIpcGetEventHandle's 64 bytes for an interprocess event the
	// caller recorded on its stream after producing the tensor; the daemon's
	// stream waits for it. Nil when the caller synchronised its stream.
	// The daemon opens each event once per connection and keeps it, so
	// keep the event alive while the client is connected (one per stream,
	// recorded again before each enqueue): a destroyed event's handle
	// bytes may come back for another one.
	Event []byte
	// DType is the element type.
	DType tensor.DType
	// OrderAfter, when set, takes part in GPU-ordered completion (hvdd
	// serve --gpu-completion stream) for AllreduceDevice and
	// BroadcastDevice: the daemon may answer once its work is enqueued,
	// with the handle of its interprocess event (cuIpcGetEventHandle's 64
	// bytes, the same op after op on one GPU), and Wait calls OrderAfter
	// with it before returning; it must order every later use of the
	// tensor after that event (a stream's cuStreamWaitEvent, or the host's
	// cuEventSynchronize). An error from it is Wait's. Nil: the daemon
	// waits for the GPU before it answers.
	OrderAfter func(event []byte) error
}

// DeviceOutput is a result the daemon wrote to device memory of its own
// (allgather, alltoall, reducescatter on DeviceTensors): the caller opens
// Handle (cuIpcOpenMemHandle), copies Length bytes out, closes it, then
// calls ReleaseDeviceOutput. Length 0 comes with no Handle.
type DeviceOutput struct {
	UUID      string
	Handle    []byte
	AllocSize uint64
	Length    uint64
	// Shape is the result's shape; ReceivedSplits, for alltoall, the rows
	// received from each rank.
	Shape          []int64
	ReceivedSplits []int32
}

// GPUs lists the GPUs (UUIDs) whose memory the daemon takes through CUDA
// IPC; empty when it runs CPU-only, and then device tensors must be staged
// through host memory by the caller.
func (c *Client) GPUs() []string { return c.welcome.GetGpuUuids() }

func deviceEnqueue(op tensor.OpType, t DeviceTensor, o *opts) (*ipcpb.Enqueue, error) {
	if !t.DType.Valid() {
		return nil, fmt.Errorf("hvdd: device tensor of unknown dtype %d", t.DType)
	}
	shape := o.shape
	if shape == nil {
		es := uint64(t.DType.Size())
		if t.Length%es != 0 {
			return nil, fmt.Errorf("hvdd: device tensor of %d bytes is no whole number of %v elements", t.Length, t.DType)
		}
		shape = []int64{int64(t.Length / es)}
	}
	return &ipcpb.Enqueue{
		Name: o.name, Op: ipcpb.OpType(op), Dtype: ipcpb.DType(t.DType), Shape: shape,
		ReduceOp: ipcpb.ReduceOp(o.op), Prescale: o.prescale, Postscale: o.postscale,
		ProcessSet: o.set,
		DeviceBuffer: &ipcpb.DeviceBuffer{
			DeviceUuid: t.UUID, MemHandle: t.Handle, AllocSize: t.AllocSize,
			Offset: t.Offset, Length: t.Length, EventHandle: t.Event,
			ClientWaits: t.OrderAfter != nil && (op == tensor.Allreduce || op == tensor.Broadcast),
		},
	}, nil
}

// submitInPlace sends an in-place device op and, where the daemon answers
// it ordered on the GPU (Done.device_event), has Wait call t.OrderAfter.
func (c *Client) submitInPlace(e *ipcpb.Enqueue, t DeviceTensor) (*Handle, error) {
	h, err := c.submit(e, nil, false)
	if err != nil || t.OrderAfter == nil {
		return h, err
	}
	prev := h.after
	h.after = func(d *ipcpb.Done) error {
		if prev != nil {
			if err := prev(d); err != nil {
				return err
			}
		}
		if ev := d.GetDeviceEvent(); len(ev) > 0 {
			if err := t.OrderAfter(ev); err != nil {
				return fmt.Errorf("hvdd: %q: order after the daemon's completion event: %w", e.Name, err)
			}
		}
		return nil
	}
	return h, nil
}

// AllreduceDeviceAsync starts an in-place allreduce of a GPU tensor: once
// Wait returns, t's memory holds op over every rank's tensor and the daemon
// has finished with it.
func (c *Client) AllreduceDeviceAsync(t DeviceTensor, options ...Option) (*Handle, error) {
	o := apply(options)
	e, err := deviceEnqueue(tensor.Allreduce, t, &o)
	if err != nil {
		return nil, err
	}
	return c.submitInPlace(e, t)
}

// AllreduceDevice is AllreduceDeviceAsync and Wait.
func (c *Client) AllreduceDevice(ctx context.Context, t DeviceTensor, options ...Option) error {
	h, err := c.AllreduceDeviceAsync(t, options...)
	if err != nil {
		return err
	}
	return h.Wait(ctx)
}

// BroadcastDeviceAsync starts an in-place broadcast of root's GPU tensor
// (root is a global rank).
func (c *Client) BroadcastDeviceAsync(t DeviceTensor, root int, options ...Option) (*Handle, error) {
	o := apply(options)
	e, err := deviceEnqueue(tensor.Broadcast, t, &o)
	if err != nil {
		return nil, err
	}
	e.RootRank = int32(root)
	return c.submitInPlace(e, t)
}

// BroadcastDevice is BroadcastDeviceAsync and Wait.
func (c *Client) BroadcastDevice(ctx context.Context, t DeviceTensor, root int, options ...Option) error {
	h, err := c.BroadcastDeviceAsync(t, root, options...)
	if err != nil {
		return err
	}
	return h.Wait(ctx)
}

// DeviceFuture is a collective on a GPU tensor whose result is new device
// memory of the daemon's.
type DeviceFuture struct {
	*Handle
}

// Wait blocks until the result is ready and returns where it is.
func (f *DeviceFuture) Wait(ctx context.Context) (DeviceOutput, error) {
	if err := f.Handle.Wait(ctx); err != nil {
		return DeviceOutput{}, err
	}
	d := f.res
	db := d.GetDeviceOutput()
	if db == nil {
		return DeviceOutput{}, errors.New("hvdd: the daemon answered a device collective without a device output")
	}
	return DeviceOutput{
		UUID: db.GetDeviceUuid(), Handle: db.GetMemHandle(), AllocSize: db.GetAllocSize(), Length: db.GetLength(),
		Shape: d.GetOutputShape(), ReceivedSplits: d.GetReceivedSplits(),
	}, nil
}

func (c *Client) deviceFuture(op tensor.OpType, t DeviceTensor, splits []int32, options []Option) (*DeviceFuture, error) {
	o := apply(options)
	e, err := deviceEnqueue(op, t, &o)
	if err != nil {
		return nil, err
	}
	e.Splits = splits
	h, err := c.submit(e, nil, false)
	if err != nil {
		return nil, err
	}
	return &DeviceFuture{h}, nil
}

// AllgatherDeviceAsync starts an allgather of a GPU tensor along its first
// dimension (WithShape gives it; default one dimension).
func (c *Client) AllgatherDeviceAsync(t DeviceTensor, options ...Option) (*DeviceFuture, error) {
	return c.deviceFuture(tensor.Allgather, t, nil, options)
}

// AlltoallDeviceAsync starts an alltoall of a GPU tensor: splits[d] rows of
// the first dimension go to rank d (nil: an equal split).
func (c *Client) AlltoallDeviceAsync(t DeviceTensor, splits []int32, options ...Option) (*DeviceFuture, error) {
	return c.deviceFuture(tensor.Alltoall, t, splits, options)
}

// ReducescatterDeviceAsync starts a reducescatter of a GPU tensor: each rank
// gets its block of rows of the reduction.
func (c *Client) ReducescatterDeviceAsync(t DeviceTensor, options ...Option) (*DeviceFuture, error) {
	return c.deviceFuture(tensor.Reducescatter, t, nil, options)
}

// ReleaseDeviceOutput tells the daemon that the caller has copied a
// DeviceOutput out: the daemon keeps the buffer for a later result of this
// client (the same Handle comes back then), so a mapping of it may stay
// open while the client is connected. The daemon frees its buffers when
// the client disconnects: close every mapping of them before Close
// (CUDA leaves freeing memory another process maps undefined).
func (c *Client) ReleaseDeviceOutput(out DeviceOutput) error {
	if len(out.Handle) == 0 {
		return nil
	}
	return c.send(0, &ipcpb.ClientMessage{Msg: &ipcpb.ClientMessage_Release{Release: &ipcpb.Release{DeviceOutput: out.Handle}}}, -1)
}

// ReleaseDeviceMemory tells the daemon that allocations it was sent
// (by their IPC handles) are about to be freed: it closes its mappings of
// them, after any op in flight on them.
func (c *Client) ReleaseDeviceMemory(handles ...[]byte) error {
	return c.send(0, &ipcpb.ClientMessage{Msg: &ipcpb.ClientMessage_ReleaseDeviceMemory{
		ReleaseDeviceMemory: &ipcpb.ReleaseDeviceMemory{MemHandles: handles}}}, -1)
}
