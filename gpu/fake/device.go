package fake

import (
	"fmt"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hvdd/hvdd/gpu"
)

// Version is the CUDA version the fake driver reports (12.4).
const Version = 12040

// DefaultMemory is a fake device's memory size unless Options say
// otherwise: allocations past it fail with CUDA_ERROR_OUT_OF_MEMORY.
const DefaultMemory = 16 << 30

// Options configure a fake Driver. The zero value is one device
// (HVDD_FAKE_GPUS overrides), no delay (HVDD_FAKE_GPU_DELAY overrides) and
// DefaultMemory per device.
type Options struct {
	// Devices is the number of fake GPUs; 0 means HVDD_FAKE_GPUS, or 1.
	Devices int
	// MaxDelay, when positive, makes every piece of stream work sleep a
	// random time up to it before it runs; 0 means HVDD_FAKE_GPU_DELAY, or
	// none.
	MaxDelay time.Duration
	// MemoryBytes is each device's memory; 0 means DefaultMemory.
	MemoryBytes uint64
}

// Driver is the fake gpu.Driver. Its methods are safe for concurrent use.
type Driver struct {
	opts Options

	// mu guards ctxs.
	mu   sync.Mutex
	ctxs []*devCtx // the live context of each device index, or nil
}

var _ gpu.Driver = (*Driver)(nil)

// New returns a fake driver.
func New(opts Options) *Driver {
	loadEnv()
	if opts.Devices <= 0 {
		opts.Devices = 1
		if n, err := strconv.Atoi(os.Getenv("HVDD_FAKE_GPUS")); err == nil && n > 0 {
			opts.Devices = n
		}
	}
	if opts.MaxDelay == 0 {
		if d, err := time.ParseDuration(os.Getenv("HVDD_FAKE_GPU_DELAY")); err == nil && d > 0 {
			opts.MaxDelay = d
		}
	}
	if opts.MemoryBytes == 0 {
		opts.MemoryBytes = DefaultMemory
	}
	return &Driver{opts: opts, ctxs: make([]*devCtx, opts.Devices)}
}

// Name returns "fake".
func (d *Driver) Name() string { return "fake" }

// Version returns Version.
func (d *Driver) Version() (int, error) {
	if err := check("cuDriverGetVersion"); err != nil {
		return 0, err
	}
	return Version, nil
}

// UUID returns the fake UUID of device index: the same in every process,
// as a real GPU's is.
func UUID(index int) string { return fmt.Sprintf("GPU-fake-0000-0000-0000-%012d", index) }

func (d *Driver) info(i int) gpu.Info {
	return gpu.Info{
		Index:             i,
		UUID:              UUID(i),
		Name:              "hvdd fake GPU",
		PCIBusID:          fmt.Sprintf("0000:%02x:00.0", i+1),
		MemoryBytes:       d.opts.MemoryBytes,
		ComputeCapability: 80,
	}
}

// Devices lists the fake GPUs.
func (d *Driver) Devices() ([]gpu.Info, error) {
	if err := check("cuDeviceGetCount"); err != nil {
		return nil, err
	}
	out := make([]gpu.Info, d.opts.Devices)
	for i := range out {
		out[i] = d.info(i)
	}
	return out, nil
}

// Open returns device index; the Devices of one index share a context until
// the last is closed.
func (d *Driver) Open(index int) (gpu.Device, error) {
	const call = "cuDevicePrimaryCtxRetain"
	if err := check(call); err != nil {
		return nil, err
	}
	if index < 0 || index >= d.opts.Devices {
		return nil, newErr(call, errInvalidDevice, "device %d of %d", index, d.opts.Devices)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	c := d.ctxs[index]
	if c == nil {
		c = &devCtx{drv: d, index: index, info: d.info(index), quit: make(chan struct{}),
			streams: map[*stream]struct{}{}, events: map[*event]struct{}{}, allocs: map[*alloc]struct{}{}}
		d.ctxs[index] = c
	}
	c.refs++
	return &device{ctx: c}, nil
}

// devCtx is a device's primary context: the allocations, streams and
// events made through any Device of its index.
type devCtx struct {
	drv   *Driver
	index int
	info  gpu.Info
	quit  chan struct{} // closed at teardown: queued work is dropped

	// sticky is the error that broke the context (work failed on a
	// stream): every later call returns it, as CUDA's sticky errors.
	sticky atomic.Pointer[gpu.Error]

	// mu guards the fields that follow.
	mu      sync.Mutex
	refs    int // open Devices
	used    uint64
	streams map[*stream]struct{}
	events  map[*event]struct{}
	allocs  map[*alloc]struct{} // owned allocations and opened mappings
}

// device is one Open's handle on a context.
type device struct {
	ctx    *devCtx
	closed atomic.Bool
}

var _ gpu.Device = (*device)(nil)

// enter starts call on d: an injected failure, a lost device, a closed
// handle or a broken context fail it.
func (d *device) enter(call string) (*devCtx, error) {
	if err := check(call); err != nil {
		return nil, err
	}
	if d.closed.Load() {
		return nil, newErr(call, errInvalidContext, "device %d is closed", d.ctx.index)
	}
	return d.ctx, d.ctx.err(call)
}

// err returns the context's sticky error as call's.
func (c *devCtx) err(call string) error {
	if e := c.sticky.Load(); e != nil {
		return &gpu.Error{Call: call, Code: e.Code, Name: e.Name, Desc: e.Desc}
	}
	return nil
}

func (d *device) Info() gpu.Info { return d.ctx.info }

func (d *device) Alloc(n int) (gpu.DevicePtr, error) {
	const call = "cuMemAlloc"
	c, err := d.enter(call)
	if err != nil {
		return 0, err
	}
	if n <= 0 {
		return 0, newErr(call, errInvalidValue, "allocation of %d bytes", n)
	}
	c.mu.Lock()
	if c.used+uint64(n) > c.info.MemoryBytes {
		c.mu.Unlock()
		return 0, newErr(call, errOutOfMemory, "%d bytes asked, %d of %d in use", n, c.used, c.info.MemoryBytes)
	}
	c.used += uint64(n)
	c.mu.Unlock()

	space.mu.Lock()
	space.nextID++
	id := space.nextID
	space.mu.Unlock()
	fd, mem, err := newMemfd(fmt.Sprintf("hvdd-fake-mem-%d-%d", os.Getpid(), id), n)
	if err != nil {
		c.mu.Lock()
		c.used -= uint64(n)
		c.mu.Unlock()
		return 0, newErr(call, errOutOfMemory, "%v", err)
	}
	a := &alloc{size: n, mem: mem, fd: fd, id: id, ctx: c}
	space.mu.Lock()
	a.base = reserve(n)
	insert(a)
	space.mu.Unlock()
	c.mu.Lock()
	c.allocs[a] = struct{}{}
	c.mu.Unlock()
	return a.base, nil
}

// owned returns the allocation of c whose base is p, opened or not as asked.
func (c *devCtx) owned(call string, p gpu.DevicePtr, opened bool) (*alloc, error) {
	space.mu.Lock()
	a := lookup(p)
	space.mu.Unlock()
	what := "an allocation"
	if opened {
		what = "an opened IPC mapping"
	}
	if a == nil || a.base != p || a.opened != opened {
		return nil, newErr(call, errInvalidValue, "%#x is not the base of %s", uint64(p), what)
	}
	c.mu.Lock()
	_, mine := c.allocs[a]
	c.mu.Unlock()
	if !mine {
		return nil, newErr(call, errInvalidValue, "%#x is %s of another device", uint64(p), what)
	}
	return a, nil
}

func (d *device) Free(p gpu.DevicePtr) error {
	const call = "cuMemFree"
	c, err := d.enter(call)
	if err != nil {
		return err
	}
	a, err := c.owned(call, p, false)
	if err != nil {
		return err
	}
	c.drop(a)
	return nil
}

// drop forgets a (owned or opened) and unmaps it once no queued work holds
// it.
func (c *devCtx) drop(a *alloc) {
	c.mu.Lock()
	delete(c.allocs, a)
	if !a.opened {
		c.used -= uint64(a.size)
	}
	c.mu.Unlock()
	space.mu.Lock()
	remove(a)
	space.mu.Unlock()
}

func (d *device) IpcMemHandle(p gpu.DevicePtr) (gpu.IpcMemHandle, error) {
	const call = "cuIpcGetMemHandle"
	c, err := d.enter(call)
	if err != nil {
		return gpu.IpcMemHandle{}, err
	}
	a, err := c.owned(call, p, false)
	if err != nil {
		return gpu.IpcMemHandle{}, err
	}
	return memHandle(a), nil
}

func (d *device) OpenMemHandle(h gpu.IpcMemHandle, size int) (gpu.DevicePtr, error) {
	const call = "cuIpcOpenMemHandle"
	c, err := d.enter(call)
	if err != nil {
		return 0, err
	}
	ph, err := parseMemHandle(h)
	if err != nil {
		return 0, newErr(call, errInvalidValue, "%v", err)
	}
	if size > 0 && uint64(size) != ph.size {
		return 0, newErr(call, errInvalidValue, "handle is of %d bytes, %d expected", ph.size, size)
	}
	key := openKey{ph.pid, ph.id}
	space.mu.Lock()
	if a := space.opened[key]; a != nil && a.ctx == c {
		a.opens++
		space.mu.Unlock()
		return a.base, nil
	}
	space.mu.Unlock()

	fd, name, fsize, err := openPeerFd(ph.pid, ph.fd)
	if err != nil {
		return 0, newErr(call, errInvalidValue, "memory handle of pid %d fd %d: %v", ph.pid, ph.fd, err)
	}
	defer closeFd(fd)
	if err := checkMemName(name, ph); err != nil {
		return 0, newErr(call, errInvalidValue, "%v", err)
	}
	if uint64(fsize) != ph.size || ph.size == 0 {
		return 0, newErr(call, errInvalidValue, "memfd %q has %d bytes, the handle says %d", name, fsize, ph.size)
	}
	mem, err := mmapShared(fd, int(ph.size))
	if err != nil {
		return 0, newErr(call, errMapFailed, "%v", err)
	}
	a := &alloc{size: int(ph.size), mem: mem, fd: -1, ctx: c, opened: true, key: key, opens: 1}
	space.mu.Lock()
	if b := space.opened[key]; b != nil && b.ctx == c { // opened meanwhile
		b.opens++
		space.mu.Unlock()
		unmapBytes(mem)
		return b.base, nil
	}
	a.base = reserve(a.size)
	insert(a)
	if space.opened == nil {
		space.opened = map[openKey]*alloc{}
	}
	space.opened[key] = a
	// Counted as the context's before another OpenMemHandle can find it
	// (and its caller close it).
	c.mu.Lock()
	c.allocs[a] = struct{}{}
	c.mu.Unlock()
	space.mu.Unlock()
	return a.base, nil
}

func (d *device) CloseMemHandle(p gpu.DevicePtr) error {
	const call = "cuIpcCloseMemHandle"
	c, err := d.enter(call)
	if err != nil {
		return err
	}
	a, err := c.owned(call, p, true)
	if err != nil {
		return err
	}
	space.mu.Lock()
	a.opens--
	last := a.opens == 0
	if last {
		// Out of the opened table in the same critical section as the
		// count, so that an OpenMemHandle of the same handle either counts
		// on this mapping before the close or maps it anew after it (it
		// must not revive a mapping about to be removed).
		forget(a)
	}
	space.mu.Unlock()
	if last {
		if closeHook != nil {
			closeHook()
		}
		c.drop(a)
	}
	return nil
}

// closeHook, when set (tests: SetCloseHook), runs in CloseMemHandle between
// the count of a handle's last close and its unmapping.
var closeHook func()

func (d *device) Close() error {
	const call = "cuDevicePrimaryCtxRelease"
	if d.closed.Swap(true) {
		return newErr(call, errInvalidContext, "device %d closed twice", d.ctx.index)
	}
	c := d.ctx
	drv := c.drv
	drv.mu.Lock()
	c.mu.Lock()
	c.refs--
	last := c.refs == 0
	if last {
		drv.ctxs[c.index] = nil
	}
	c.mu.Unlock()
	drv.mu.Unlock()
	if last {
		c.teardown()
	}
	// The release happens even when the call "fails", as a lost device's
	// would: the caller must not use d again either way.
	return check(call)
}

// teardown ends the context: queued work is dropped, stream goroutines end,
// and every allocation, mapping and event of the context is released.
func (c *devCtx) teardown() {
	close(c.quit)
	c.mu.Lock()
	streams := make([]*stream, 0, len(c.streams))
	for s := range c.streams {
		streams = append(streams, s)
	}
	allocs := make([]*alloc, 0, len(c.allocs))
	for a := range c.allocs {
		allocs = append(allocs, a)
	}
	events := make([]*event, 0, len(c.events))
	for e := range c.events {
		events = append(events, e)
	}
	c.mu.Unlock()
	for _, s := range streams {
		<-s.exited
	}
	for _, a := range allocs {
		c.drop(a)
	}
	for _, e := range events {
		e.destroy()
	}
}
