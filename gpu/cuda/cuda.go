// Package cuda is the real gpu.Driver and gpu.NCCL: the CUDA driver API
// (libcuda.so.1) and NCCL (libnccl.so.2), loaded at run time with dlopen
// through github.com/ebitengine/purego, so that building hvdd needs no CUDA
// toolkit and no cgo, and the binary runs on machines without a GPU (Open
// then fails with an error wrapping gpu.ErrNoDriver).
//
// Every call makes its device's primary context current on the calling OS
// thread (locked for the call), so Devices may be used from any goroutine.
// Errors are *gpu.Error with the CUDA or NCCL function's name (without
// version suffixes: "cuMemAlloc", "ncclAllReduce"), its code and the
// library's name and description of it.
//
// Host memory given to CopyHtoD and CopyDtoH is ordinary (pageable) Go
// memory: for it the driver stages the copy before the call returns
// (HtoD) or completes it before returning (DtoH), as the driver API
// documents for pageable memory, so Go's garbage collector never races the
// DMA engine. Pinned host memory is not used.
//
// Environment (unstable, for debugging): HVDD_CUDA_LIBRARY and
// HVDD_NCCL_LIBRARY name the library files to load instead of searching.
package cuda

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/hvdd/hvdd/gpu"
	"github.com/hvdd/hvdd/gpu/kernels"
)

// CUDA constants (cuda.h).
const (
	cudaSuccess  = 0
	cudaNotReady = 600 // CUDA_ERROR_NOT_READY

	streamNonBlocking       = 0x1 // CU_STREAM_NON_BLOCKING
	eventDisableTiming      = 0x2 // CU_EVENT_DISABLE_TIMING
	eventInterprocess       = 0x4 // CU_EVENT_INTERPROCESS
	ipcLazyEnablePeerAccess = 0x1 // CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS

	attrComputeCapabilityMajor = 75 // CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR
	attrComputeCapabilityMinor = 76 // CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR
)

// Driver is the CUDA driver. Its methods are safe for concurrent use.
type Driver struct {
	lib *cudaLib
}

var _ gpu.Driver = (*Driver)(nil)

var cudaLoad struct {
	once sync.Once
	lib  *cudaLib
	path string
	err  error
}

// Open loads libcuda.so.1 (once per process) and initialises it. Its
// errors wrap gpu.ErrNoDriver: no library, or cuInit failed (no GPU, or a
// driver without a device).
func Open() (*Driver, error) {
	cudaLoad.once.Do(func() {
		h, path, err := dlopen(cudaPaths())
		if err != nil {
			cudaLoad.err = fmt.Errorf("%w: load libcuda.so.1: %v", gpu.ErrNoDriver, err)
			return
		}
		lib := &cudaLib{}
		if err := bind(h, lib); err != nil {
			cudaLoad.err = fmt.Errorf("%w: %s: %v", gpu.ErrNoDriver, path, err)
			return
		}
		if r := lib.cuInit(0); r != cudaSuccess {
			cudaLoad.err = fmt.Errorf("%w: %v", gpu.ErrNoDriver, lib.err("cuInit", r))
			return
		}
		cudaLoad.lib, cudaLoad.path = lib, path
	})
	if cudaLoad.err != nil {
		return nil, cudaLoad.err
	}
	return &Driver{lib: cudaLoad.lib}, nil
}

// err returns the *gpu.Error of call's result r, or nil for success.
func (l *cudaLib) err(call string, r int32) error {
	if r == cudaSuccess {
		return nil
	}
	var name, desc *byte
	l.cuGetErrorName(r, &name)
	l.cuGetErrorString(r, &desc)
	n := goString(name)
	if n == "" {
		n = fmt.Sprintf("CUresult %d", r)
	}
	return &gpu.Error{Call: call, Code: int(r), Name: n, Desc: goString(desc)}
}

// Name returns "cuda".
func (d *Driver) Name() string { return "cuda" }

// Version returns cuDriverGetVersion's.
func (d *Driver) Version() (int, error) {
	var v int32
	if err := d.lib.err("cuDriverGetVersion", d.lib.cuDriverGetVersion(&v)); err != nil {
		return 0, err
	}
	return int(v), nil
}

// Devices lists the GPUs this process sees.
func (d *Driver) Devices() ([]gpu.Info, error) {
	var n int32
	if err := d.lib.err("cuDeviceGetCount", d.lib.cuDeviceGetCount(&n)); err != nil {
		return nil, err
	}
	out := make([]gpu.Info, n)
	for i := range out {
		in, err := d.info(i)
		if err != nil {
			return nil, err
		}
		out[i] = in
	}
	return out, nil
}

func (d *Driver) info(i int) (gpu.Info, error) {
	l := d.lib
	var dev int32
	if err := l.err("cuDeviceGet", l.cuDeviceGet(&dev, int32(i))); err != nil {
		return gpu.Info{}, err
	}
	var name [256]byte
	var uuid [16]byte
	var pci [64]byte
	var mem uint64
	var major, minor int32
	err := errors.Join(
		l.err("cuDeviceGetName", l.cuDeviceGetName(&name[0], int32(len(name)), dev)),
		l.err("cuDeviceGetUuid", l.cuDeviceGetUuid(&uuid, dev)),
		l.err("cuDeviceGetPCIBusId", l.cuDeviceGetPCIBusID(&pci[0], int32(len(pci)), dev)),
		l.err("cuDeviceTotalMem", l.cuDeviceTotalMem(&mem, dev)),
		l.err("cuDeviceGetAttribute", l.cuDeviceGetAttribute(&major, attrComputeCapabilityMajor, dev)),
		l.err("cuDeviceGetAttribute", l.cuDeviceGetAttribute(&minor, attrComputeCapabilityMinor, dev)),
	)
	if err != nil {
		return gpu.Info{}, fmt.Errorf("device %d: %w", i, err)
	}
	return gpu.Info{
		Index:             i,
		UUID:              formatUUID(uuid),
		Name:              goString(&name[0]),
		PCIBusID:          goString(&pci[0]),
		MemoryBytes:       mem,
		ComputeCapability: int(major*10 + minor),
	}, nil
}

// formatUUID writes a CUuuid as nvidia-smi does: GPU-8-4-4-4-12 hex digits.
func formatUUID(u [16]byte) string {
	return fmt.Sprintf("GPU-%x-%x-%x-%x-%x", u[0:4], u[4:6], u[6:8], u[8:10], u[10:16])
}

// Open retains device index's primary context.
func (d *Driver) Open(index int) (gpu.Device, error) {
	in, err := d.info(index)
	if err != nil {
		return nil, err
	}
	var dev int32
	d.lib.cuDeviceGet(&dev, int32(index))
	var ctx uintptr
	if err := d.lib.err("cuDevicePrimaryCtxRetain", d.lib.cuDevicePrimaryCtxRetain(&ctx, dev)); err != nil {
		return nil, err
	}
	return &device{lib: d.lib, dev: dev, ctx: ctx, info: in}, nil
}

// device is one retained primary context.
type device struct {
	lib    *cudaLib
	dev    int32
	ctx    uintptr
	info   gpu.Info
	closed atomic.Bool
}

var _ gpu.Device = (*device)(nil)

// do runs f with d's context current on a locked OS thread and returns
// call's error.
func (d *device) do(call string, f func() int32) error {
	if d.closed.Load() {
		return &gpu.Error{Call: call, Code: 201, Name: "CUDA_ERROR_INVALID_CONTEXT", Desc: "hvdd: device closed"}
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if r := d.lib.cuCtxSetCurrent(d.ctx); r != cudaSuccess {
		return d.lib.err("cuCtxSetCurrent", r)
	}
	return d.lib.err(call, f())
}

func (d *device) Info() gpu.Info { return d.info }

func (d *device) Alloc(n int) (gpu.DevicePtr, error) {
	var p uint64
	err := d.do("cuMemAlloc", func() int32 { return d.lib.cuMemAlloc(&p, uint64(n)) })
	return gpu.DevicePtr(p), err
}

func (d *device) Free(p gpu.DevicePtr) error {
	return d.do("cuMemFree", func() int32 { return d.lib.cuMemFree(uint64(p)) })
}

func (d *device) IpcMemHandle(p gpu.DevicePtr) (gpu.IpcMemHandle, error) {
	var h gpu.IpcMemHandle
	err := d.do("cuIpcGetMemHandle", func() int32 { return d.lib.cuIpcGetMemHandle(&h, uint64(p)) })
	return h, err
}

// OpenMemHandle maps h; CUDA cannot check size (the handle does not carry
// it).
func (d *device) OpenMemHandle(h gpu.IpcMemHandle, size int) (gpu.DevicePtr, error) {
	var p uint64
	err := d.do("cuIpcOpenMemHandle", func() int32 {
		return d.lib.cuIpcOpenMemHandle(&p, ipcHandle{h}, ipcLazyEnablePeerAccess)
	})
	return gpu.DevicePtr(p), err
}

func (d *device) CloseMemHandle(p gpu.DevicePtr) error {
	return d.do("cuIpcCloseMemHandle", func() int32 { return d.lib.cuIpcCloseMemHandle(uint64(p)) })
}

func (d *device) NewStream() (gpu.Stream, error) {
	var h uintptr
	err := d.do("cuStreamCreate", func() int32 { return d.lib.cuStreamCreate(&h, streamNonBlocking) })
	if err != nil {
		return nil, err
	}
	return &stream{d: d, h: h}, nil
}

func (d *device) NewEvent(interprocess bool) (gpu.Event, error) {
	flags := uint32(eventDisableTiming)
	if interprocess {
		flags |= eventInterprocess
	}
	var h uintptr
	err := d.do("cuEventCreate", func() int32 { return d.lib.cuEventCreate(&h, flags) })
	if err != nil {
		return nil, err
	}
	return &event{d: d, h: h}, nil
}

func (d *device) OpenEventHandle(h gpu.IpcEventHandle) (gpu.Event, error) {
	var e uintptr
	err := d.do("cuIpcOpenEventHandle", func() int32 { return d.lib.cuIpcOpenEventHandle(&e, ipcHandle{h}) })
	if err != nil {
		return nil, err
	}
	return &event{d: d, h: e}, nil
}

// streamOf returns s's handle, checking it is this package's.
func streamOf(call string, s gpu.Stream) (*stream, error) {
	cs, ok := s.(*stream)
	if !ok || cs == nil {
		return nil, &gpu.Error{Call: call, Code: 400, Name: "CUDA_ERROR_INVALID_HANDLE", Desc: fmt.Sprintf("hvdd: stream %T is not a CUDA stream", s)}
	}
	return cs, nil
}

func (d *device) CopyHtoD(s gpu.Stream, dst gpu.DevicePtr, src []byte) error {
	const call = "cuMemcpyHtoDAsync"
	cs, err := streamOf(call, s)
	if err != nil || len(src) == 0 {
		return err
	}
	return d.do(call, func() int32 {
		return d.lib.cuMemcpyHtoDAsync(uint64(dst), unsafe.Pointer(&src[0]), uint64(len(src)), cs.h)
	})
}

func (d *device) CopyDtoH(s gpu.Stream, dst []byte, src gpu.DevicePtr) error {
	const call = "cuMemcpyDtoHAsync"
	cs, err := streamOf(call, s)
	if err != nil || len(dst) == 0 {
		return err
	}
	return d.do(call, func() int32 {
		return d.lib.cuMemcpyDtoHAsync(unsafe.Pointer(&dst[0]), uint64(src), uint64(len(dst)), cs.h)
	})
}

func (d *device) CopyDtoD(s gpu.Stream, dst, src gpu.DevicePtr, n int) error {
	const call = "cuMemcpyDtoDAsync"
	cs, err := streamOf(call, s)
	if err != nil || n == 0 {
		return err
	}
	return d.do(call, func() int32 { return d.lib.cuMemcpyDtoDAsync(uint64(dst), uint64(src), uint64(n), cs.h) })
}

func (d *device) Memset8(s gpu.Stream, p gpu.DevicePtr, v byte, n int) error {
	const call = "cuMemsetD8Async"
	cs, err := streamOf(call, s)
	if err != nil || n == 0 {
		return err
	}
	return d.do(call, func() int32 { return d.lib.cuMemsetD8Async(uint64(p), v, uint64(n), cs.h) })
}

func (d *device) LoadModule(image []byte) (gpu.Module, error) {
	const call = "cuModuleLoadData"
	if len(image) == 0 || image[len(image)-1] != 0 {
		// PTX must be NUL-terminated; copy rather than read past the end.
		image = append(append([]byte(nil), image...), 0)
	}
	var m uintptr
	err := d.do(call, func() int32 { return d.lib.cuModuleLoadData(&m, unsafe.Pointer(&image[0])) })
	if err != nil {
		return nil, err
	}
	return &module{d: d, h: m}, nil
}

func (d *device) Close() error {
	if d.closed.Swap(true) {
		return &gpu.Error{Call: "cuDevicePrimaryCtxRelease", Code: 201, Name: "CUDA_ERROR_INVALID_CONTEXT", Desc: "hvdd: device closed twice"}
	}
	return d.lib.err("cuDevicePrimaryCtxRelease", d.lib.cuDevicePrimaryCtxRelease(d.dev))
}

// stream is a CUstream.
type stream struct {
	d *device
	h uintptr
}

func (s *stream) WaitEvent(e gpu.Event) error {
	const call = "cuStreamWaitEvent"
	ce, ok := e.(*event)
	if !ok || ce == nil {
		return &gpu.Error{Call: call, Code: 400, Name: "CUDA_ERROR_INVALID_HANDLE", Desc: fmt.Sprintf("hvdd: event %T is not a CUDA event", e)}
	}
	return s.d.do(call, func() int32 { return s.d.lib.cuStreamWaitEvent(s.h, ce.h, 0) })
}

// Synchronize waits in cuStreamSynchronize; when ctx can end first, the
// wait runs on a goroutine of its own that finishes after the work does.
func (s *stream) Synchronize(ctx context.Context) error {
	const call = "cuStreamSynchronize"
	return waitCtx(ctx, call, func() error {
		return s.d.do(call, func() int32 { return s.d.lib.cuStreamSynchronize(s.h) })
	})
}

func (s *stream) Destroy() error {
	return s.d.do("cuStreamDestroy", func() int32 { return s.d.lib.cuStreamDestroy(s.h) })
}

// waitCtx runs the blocking wait f, returning early with ctx's error.
func waitCtx(ctx context.Context, call string, f func() error) error {
	if ctx.Done() == nil {
		return f()
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("%s: %w", call, err)
	}
	done := make(chan error, 1)
	go func() { done <- f() }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return fmt.Errorf("%s: %w", call, ctx.Err())
	}
}

// event is a CUevent.
type event struct {
	d *device
	h uintptr
}

func (e *event) Record(s gpu.Stream) error {
	const call = "cuEventRecord"
	cs, err := streamOf(call, s)
	if err != nil {
		return err
	}
	return e.d.do(call, func() int32 { return e.d.lib.cuEventRecord(e.h, cs.h) })
}

func (e *event) Query() (bool, error) {
	var r int32
	err := e.d.do("cuEventQuery", func() int32 {
		r = e.d.lib.cuEventQuery(e.h)
		if r == cudaNotReady {
			return cudaSuccess
		}
		return r
	})
	return err == nil && r == cudaSuccess, err
}

func (e *event) Synchronize(ctx context.Context) error {
	const call = "cuEventSynchronize"
	return waitCtx(ctx, call, func() error {
		return e.d.do(call, func() int32 { return e.d.lib.cuEventSynchronize(e.h) })
	})
}

func (e *event) IpcHandle() (gpu.IpcEventHandle, error) {
	var h gpu.IpcEventHandle
	err := e.d.do("cuIpcGetEventHandle", func() int32 { return e.d.lib.cuIpcGetEventHandle(&h, e.h) })
	return h, err
}

func (e *event) Destroy() error {
	return e.d.do("cuEventDestroy", func() int32 { return e.d.lib.cuEventDestroy(e.h) })
}

// module is a CUmodule.
type module struct {
	d *device
	h uintptr
}

func (m *module) Function(name string) (gpu.Function, error) {
	var f uintptr
	err := m.d.do("cuModuleGetFunction", func() int32 { return m.d.lib.cuModuleGetFunction(&f, m.h, name) })
	if err != nil {
		return nil, err
	}
	return &function{d: m.d, h: f, name: name}, nil
}

func (m *module) Unload() error {
	return m.d.do("cuModuleUnload", func() int32 { return m.d.lib.cuModuleUnload(m.h) })
}

// function is a CUfunction.
type function struct {
	d    *device
	h    uintptr
	name string
}

// Launch checks the arguments of a kernel of gpu/kernels against its
// signature (the driver cannot: too few would make it read past the
// parameter array), then passes each argument by value from an 8-byte slot of its own
// (little-endian, so a 4-byte parameter reads the slot's low half), pinned
// for the call; cuLaunchKernel copies them before it returns.
func (f *function) Launch(s gpu.Stream, grid, block int, args ...any) error {
	const call = "cuLaunchKernel"
	cs, err := streamOf(call, s)
	if err != nil {
		return err
	}
	if grid < 1 || block < 1 || grid > 1<<31-1 || block > 1024 {
		return &gpu.Error{Call: call, Code: 1, Name: "CUDA_ERROR_INVALID_VALUE", Desc: fmt.Sprintf("hvdd: %s: grid %d x block %d", f.name, grid, block)}
	}
	if err := checkArgs(f.name, args); err != nil {
		return &gpu.Error{Call: call, Code: 1, Name: "CUDA_ERROR_INVALID_VALUE", Desc: "hvdd: " + err.Error()}
	}
	vals := make([]uint64, max(1, len(args)))
	for i, a := range args {
		switch v := a.(type) {
		case gpu.DevicePtr:
			vals[i] = uint64(v)
		case int32:
			vals[i] = uint64(uint32(v))
		case uint32:
			vals[i] = uint64(v)
		case int64:
			vals[i] = uint64(v)
		case uint64:
			vals[i] = v
		case float32:
			vals[i] = uint64(*(*uint32)(unsafe.Pointer(&v)))
		case float64:
			vals[i] = *(*uint64)(unsafe.Pointer(&v))
		default:
			return &gpu.Error{Call: call, Code: 1, Name: "CUDA_ERROR_INVALID_VALUE", Desc: fmt.Sprintf("hvdd: %s: argument %d has type %T", f.name, i, a)}
		}
	}
	var pin runtime.Pinner
	defer pin.Unpin()
	pin.Pin(&vals[0])
	ptrs := make([]uintptr, len(vals))
	for i := range vals {
		ptrs[i] = uintptr(unsafe.Pointer(&vals[i]))
	}
	pin.Pin(&ptrs[0])
	return f.d.do(call, func() int32 {
		return f.d.lib.cuLaunchKernel(f.h, uint32(grid), 1, 1, uint32(block), 1, 1, 0, cs.h, unsafe.Pointer(&ptrs[0]), nil)
	})
}

// checkArgs checks args against the signature of kernel name when
// gpu/kernels lists it.
func checkArgs(name string, args []any) error {
	k, ok := kernels.Lookup(name)
	if !ok {
		return nil
	}
	if len(args) != len(k.Params) {
		return fmt.Errorf("%s takes %d parameters, %d given", name, len(k.Params), len(args))
	}
	for i, p := range k.Params {
		var good bool
		switch a := args[i].(type) {
		case gpu.DevicePtr:
			good = p == kernels.Ptr
		case uint64:
			good = p == kernels.U64
		case int64:
			good = p == kernels.U64 && a >= 0
		case float64:
			good = p == kernels.F64
		}
		if !good {
			return fmt.Errorf("%s parameter %d: %T %v does not fit", name, i, args[i], args[i])
		}
	}
	return nil
}
