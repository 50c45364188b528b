// Package gpu is the seam between the daemon and the GPU: the small part of
// the CUDA driver API and of NCCL that hvdd uses, behind the interfaces
// Driver, Device, Stream, Event, Module, Function, NCCL and Comm.
//
// Two implementations satisfy them and pass the same conformance suite
// (gpu/gputest): gpu/cuda, the real one, which loads libcuda.so.1 and
// libnccl.so.2 at run time with dlopen (so building hvdd needs no CUDA
// toolkit and the binary runs on machines without a GPU), and gpu/fake, an
// in-process fake whose "device memory" is memfd-backed shared memory, whose
// streams run their work later on goroutines of their own (so that missing
// ordering shows as wrong data in tests) and whose IPC handles name a memfd
// of another process, so that the daemon's whole GPU path (IPC handle
// caching, event ordering, fusion in device buffers, communicator set-up,
// teardown and failure) runs in CI on machines without a GPU.
//
// Everything here is the driver API's view: device pointers are addresses in
// a context of the daemon's (DevicePtr), not Go memory. The daemon never
// dereferences them; only Device's copies and kernels touch the bytes.
//
// Calls may come from any goroutine: an implementation makes its device's
// context current on the calling OS thread itself.
package gpu

import (
	"context"
	"errors"
	"fmt"

	"github.com/hvdd/hvdd/tensor"
)

// DevicePtr is an address in a device's memory (the driver API's
// CUdeviceptr), valid in the context of the Device that returned it.
type DevicePtr uint64

// Add returns p advanced by n bytes.
func (p DevicePtr) Add(n int) DevicePtr { return p + DevicePtr(n) }

// IpcMemHandleSize and IpcEventHandleSize are the sizes of CUDA's opaque IPC
// handles (CU_IPC_HANDLE_SIZE).
const (
	IpcMemHandleSize   = 64
	IpcEventHandleSize = 64
)

// IpcMemHandle is cuIpcGetMemHandle's handle for an allocation: another
// process opens it to map the whole allocation. Its bytes identify the
// allocation: a freed and reallocated block gets another handle, so caches
// key on the bytes.
type IpcMemHandle [IpcMemHandleSize]byte

// IpcEventHandle is cuIpcGetEventHandle's handle for an event created with
// the interprocess flag.
type IpcEventHandle [IpcEventHandleSize]byte

// Info describes one GPU as the driver sees it.
type Info struct {
	Index       int    // ordinal in this process (after CUDA_VISIBLE_DEVICES)
	UUID        string // "GPU-8a1f..." as nvidia-smi writes it
	Name        string // "NVIDIA H100 80GB HBM3"
	PCIBusID    string // "0000:3b:00.0"
	MemoryBytes uint64 // total device memory
	// ComputeCapability is major*10+minor (90 for sm_90).
	ComputeCapability int
}

// Driver is the CUDA driver as the daemon uses it.
type Driver interface {
	// Name is "cuda" or "fake".
	Name() string
	// Version is the driver's CUDA version (cuDriverGetVersion: 12040 for
	// 12.4).
	Version() (int, error)
	// Devices lists the GPUs this process can use.
	Devices() ([]Info, error)
	// Open returns device index (an Info.Index), its primary context
	// retained until Close. Opening the same index twice returns Devices that
	// share the context.
	Open(index int) (Device, error)
}

// Device is one GPU with a context of this process's on it. Its methods are
// safe for concurrent use.
type Device interface {
	Info() Info
	// Alloc allocates n bytes of device memory (cuMemAlloc, 256-byte
	// aligned at least); Free releases it.
	Alloc(n int) (DevicePtr, error)
	Free(p DevicePtr) error
	// IpcMemHandle exports the allocation that starts at p (an Alloc's
	// result) for another process.
	IpcMemHandle(p DevicePtr) (IpcMemHandle, error)
	// OpenMemHandle maps another process's allocation (cuIpcOpenMemHandle
	// with lazy peer access) and returns its base in this context; size is
	// the allocation's size, which the implementation checks where it can.
	// CloseMemHandle unmaps it.
	OpenMemHandle(h IpcMemHandle, size int) (DevicePtr, error)
	CloseMemHandle(p DevicePtr) error
	// NewStream creates a non-blocking stream.
	NewStream() (Stream, error)
	// NewEvent creates an event without timing; interprocess makes it
	// exportable with IpcHandle (CU_EVENT_INTERPROCESS, which needs
	// CU_EVENT_DISABLE_TIMING).
	NewEvent(interprocess bool) (Event, error)
	// OpenEventHandle opens another process's interprocess event.
	OpenEventHandle(h IpcEventHandle) (Event, error)
	// CopyHtoD, CopyDtoH and CopyDtoD enqueue copies on s. The host side
	// must stay untouched until s has run them (Stream.Synchronize).
	CopyHtoD(s Stream, dst DevicePtr, src []byte) error
	CopyDtoH(s Stream, dst []byte, src DevicePtr) error
	CopyDtoD(s Stream, dst, src DevicePtr, n int) error
	// Memset8 enqueues setting n bytes at p to v.
	Memset8(s Stream, p DevicePtr, v byte, n int) error
	// LoadModule loads a PTX (or cubin) image (cuModuleLoadData).
	LoadModule(image []byte) (Module, error)
	// Close releases the context (and, in the fake, everything it holds).
	Close() error
}

// Stream is an ordered queue of device work.
type Stream interface {
	// WaitEvent makes work enqueued after it wait for e's last record.
	WaitEvent(e Event) error
	// Synchronize waits until all work enqueued so far has run; it returns
	// early with ctx's error (the work goes on).
	Synchronize(ctx context.Context) error
	Destroy() error
}

// Event marks a point in a stream.
type Event interface {
	// Record captures the work enqueued on s so far.
	Record(s Stream) error
	// Query reports whether the captured work has run.
	Query() (bool, error)
	// Synchronize waits for the captured work, or ctx.
	Synchronize(ctx context.Context) error
	// IpcHandle exports an interprocess event.
	IpcHandle() (IpcEventHandle, error)
	Destroy() error
}

// Module is a loaded image of kernels.
type Module interface {
	// Function looks up a kernel by its (unmangled, extern "C") name.
	Function(name string) (Function, error)
	Unload() error
}

// Function is one kernel.
type Function interface {
	// Launch enqueues the kernel on s with grid x block threads (1-D) and
	// the given parameters, each a DevicePtr, an int32, uint32, int64,
	// uint64, float32 or float64, passed by value as the kernel declares.
	Launch(s Stream, grid, block int, args ...any) error
}

// UniqueIDSize is NCCL_UNIQUE_ID_BYTES.
const UniqueIDSize = 128

// UniqueID is ncclGetUniqueId's bootstrap id: rank 0 makes it and every
// rank of the communicator gets a copy (through the daemons' control plane).
type UniqueID [UniqueIDSize]byte

// NCCL is the NCCL library.
type NCCL interface {
	// Version is ncclGetVersion's (21903 for 2.19.3).
	Version() (int, error)
	GetUniqueID() (UniqueID, error)
	// CommInitRank joins communicator id as rank of nranks on dev; every
	// rank calls it concurrently (it blocks until all have). ctx bounds the
	// wait: on its end the implementation aborts the half-made communicator.
	CommInitRank(ctx context.Context, dev Device, nranks int, id UniqueID, rank int) (Comm, error)
	// CommInitAll makes one communicator over devs, one rank per device, in
	// this process (ncclCommInitAll): rank i on devs[i].
	CommInitAll(devs []Device) ([]Comm, error)
	// GroupStart and GroupEnd bracket calls on several communicators that
	// one goroutine makes together (ncclGroupStart/End): the calls between
	// them are issued as one. The calling goroutine must not change in
	// between (implementations lock it to its thread).
	GroupStart() error
	GroupEnd() error
}

// Comm is one rank of an NCCL communicator. Counts are elements of dt.
type Comm interface {
	Rank() int
	Size() int
	Device() Device
	// Allreduce: op is Sum, Min, Max, Product or Average (NCCL's ncclAvg).
	Allreduce(s Stream, send, recv DevicePtr, count int, dt tensor.DType, op tensor.ReduceOp) error
	Broadcast(s Stream, send, recv DevicePtr, count int, dt tensor.DType, root int) error
	// Reduce leaves the result on root only.
	Reduce(s Stream, send, recv DevicePtr, count int, dt tensor.DType, op tensor.ReduceOp, root int) error
	// AllGather: recv holds Size()*sendCount elements, rank order.
	AllGather(s Stream, send, recv DevicePtr, sendCount int, dt tensor.DType) error
	// ReduceScatter: send holds Size()*recvCount elements.
	ReduceScatter(s Stream, send, recv DevicePtr, recvCount int, dt tensor.DType, op tensor.ReduceOp) error
	// Send and Recv are point-to-point (alltoall is a group of them).
	Send(s Stream, buf DevicePtr, count int, dt tensor.DType, peer int) error
	Recv(s Stream, buf DevicePtr, count int, dt tensor.DType, peer int) error
	// AsyncError reports an error the communicator hit in the background
	// (ncclCommGetAsyncError), nil while it is healthy.
	AsyncError() error
	// Abort stops the communicator's pending work and frees it
	// (ncclCommAbort): the way out after a failure. Destroy frees a
	// healthy one after its work finished.
	Abort() error
	Destroy() error
}

// ErrNoDriver is returned (wrapped) by Load when no CUDA driver can be
// loaded: the node has no GPU or no driver, and runs CPU-only.
var ErrNoDriver = errors.New("no CUDA driver")

// ErrNoNCCL is returned (wrapped) when libnccl cannot be loaded.
var ErrNoNCCL = errors.New("no NCCL library")

// Error is a failed driver or NCCL call: its name, the library's code and
// description.
type Error struct {
	Call string // "cuIpcOpenMemHandle", "ncclAllReduce"
	Code int    // CUresult or ncclResult_t
	Name string // "CUDA_ERROR_INVALID_VALUE", "ncclUnhandledCudaError"
	Desc string // the library's description, if any
}

func (e *Error) Error() string {
	if e.Desc != "" {
		return fmt.Sprintf("%s: %s (%d): %s", e.Call, e.Name, e.Code, e.Desc)
	}
	return fmt.Sprintf("%s: %s (%d)", e.Call, e.Name, e.Code)
}

// DTypes lists the dtypes the GPU path moves: every dtype of the CPU path.
// NCCL has no 16-bit integers or bool; the daemon reduces those with its
// own kernels (gpu/kernels) and moves them as bytes.
var DTypes = []tensor.DType{
	tensor.Uint8, tensor.Int8, tensor.Uint16, tensor.Int16, tensor.Int32, tensor.Int64,
	tensor.Float16, tensor.BFloat16, tensor.Float32, tensor.Float64, tensor.Bool,
}
