package device

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/bits"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/hvdd/hvdd/backends"
	"github.com/hvdd/hvdd/backends/nccl"
	"github.com/hvdd/hvdd/daemon/internal/job"
	"github.com/hvdd/hvdd/gpu"
	"github.com/hvdd/hvdd/ipc/ipcpb"
	"github.com/hvdd/hvdd/tensor"
)

// The GPU path, the daemon's side (ipc/PROTOCOL.md "GPU tensors"): clients
// name tensors in their CUDA allocations by IPC handle (Enqueue's
// DeviceBuffer); the daemon maps each allocation once per connection and
// keeps the mapping under the handle's bytes until the client releases it
// (ReleaseDeviceMemory) or disconnects. A mapping, like a region, is
// reference counted: the cache holds one reference and every op in flight on
// it one more, so a mapping released while an op uses it closes after that
// op. The client's IPC events are cached the same way.
//
// The device work itself (device.go) runs only on the executor goroutine,
// never inline in the loop: each GPU's stream, fusion buffer and kernels
// belong to that goroutine, and it synchronises the streams before any Done
// goes out.

// GPUs is the daemon's GPUs: nil on a CPU-only node.
//
// Start-up only lists them (Driver.Devices: no context). A GPU's context,
// stream, fusion buffer and kernels are made on first use by a device
// tensor (gpuDev.open), so a node whose jobs send only host tensors holds no
// CUDA context (hundreds of MB of device memory each, and the only one a GPU
// in EXCLUSIVE_PROCESS mode allows). An opened GPU stays open until the
// daemon stops: closing an idle one would have to wait for every
// connection's cached IPC mappings and events on it, its communicators and
// its device outputs to go, which the daemon does not track across
// connections.
type GPUs struct {
	counts counters // what the device path did to device memory (Counts)
	// anyLost is set once a GPU is lost (MarkLost), so that the executor's
	// check costs one atomic load while none is.
	anyLost atomic.Bool
	drv     gpu.Driver
	nccl    gpu.NCCL // nil without NCCL: several GPUs then stage through host
	log     *slog.Logger
	devs    []*gpuDev
	by      map[string]*gpuDev // by UUID

	// hostOnly stages every device tensor through host memory and runs it
	// on the CPU path (Config.GPUAllreduce "host").
	hostOnly bool

	// The NCCL engines (backends/nccl), used by the executor goroutine
	// only. local holds the node-local engines by the GPUs they span
	// (commKey), rank i on the i-th of them; across is this node's engine
	// across nodes (GPUAllreduceNCCL): one rank per node, on devs[0],
	// joined for the job engine acrossOf. Each is made on first use and
	// kept while it is healthy.
	local    map[string][]*nccl.Engine
	across   *nccl.Engine
	acrossOf backends.Backend
	// used lists the engines the running response enqueued work with, for
	// the wait at its end (waitStreams).
	used []engineUse
}

// gpuDev is one GPU the daemon found, with (once opened) its context and
// the executor's stream, fusion and scratch buffers and kernels on it.
type gpuDev struct {
	idx  int // in GPUs.devs
	info gpu.Info
	g    *GPUs
	// lost is set, once, when NVML reports the GPU lost (lost.go).
	lost atomic.Pointer[LostError]

	// mu serialises open (the loop opens a GPU for the IPC handles it
	// maps). dev and stream are set once, under mu, before any op on the
	// GPU exists; the code that uses them holds such an op (it got it from
	// the goroutine that opened the GPU) and reads them without mu.
	mu  sync.Mutex
	dev gpu.Device // nil until opened

	// Used by the executor goroutine only (set by open).
	stream   gpu.Stream
	kern     *gpuKernels
	kernErr  error
	fuse     gpu.DevicePtr
	fuseN    int
	scratch  gpu.DevicePtr
	scratchN int
}

// ErrGPUOpen marks a GPU whose context could not be opened: the op that
// needed it fails (CODE_INTERNAL), the next one tries again.
var ErrGPUOpen = errors.New("cannot open the GPU")

// open makes d's context and stream, once; why (and the attributes that
// follow, slog's) says what needed them, for the log. A failure leaves d
// closed, so the next use tries again.
func (d *gpuDev) open(why string, attrs ...any) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.dev != nil {
		return nil
	}
	g := d.g
	dev, err := g.drv.Open(d.info.Index)
	if err != nil {
		g.log.Warn("GPU context open failed", append([]any{"index", d.info.Index, "uuid", d.info.UUID, "why", why, "err", err}, attrs...)...)
		return fmt.Errorf("GPU %s: %w: retain its context: %w%s", d.info.UUID, ErrGPUOpen, err, openHint(err))
	}
	s, err := dev.NewStream()
	if err != nil {
		dev.Close()
		g.log.Warn("GPU context open failed", append([]any{"index", d.info.Index, "uuid", d.info.UUID, "why", why, "err", err}, attrs...)...)
		return fmt.Errorf("GPU %s: %w: create a stream: %w%s", d.info.UUID, ErrGPUOpen, err, openHint(err))
	}
	d.dev, d.stream = dev, s
	g.log.Info("GPU context opened", append([]any{"index", d.info.Index, "uuid", d.info.UUID, "why", why}, attrs...)...)
	return nil
}

// cudaErrorDeviceUnavailable is CUDA_ERROR_DEVICE_UNAVAILABLE: the GPU is
// in EXCLUSIVE_PROCESS compute mode and another process holds its context.
const cudaErrorDeviceUnavailable = 46

// openHint explains an open failure the user can act on.
func openHint(err error) string {
	var ge *gpu.Error
	if errors.As(err, &ge) && strings.HasPrefix(ge.Call, "cu") && ge.Code == cudaErrorDeviceUnavailable {
		return " (the GPU's compute mode allows one process a context, and another holds it: CUDA IPC needs the daemon's too; set the GPU to DEFAULT compute mode, or stage the tensor through host memory)"
	}
	return ""
}

// opened reports whether d's context is open.
func (d *gpuDev) opened() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.dev != nil
}

// OpenGPUs lists the GPUs drv has, opening none (gpuDev.open does, on first
// use); a driver that fails, or lists none, leaves the daemon CPU-only
// (nil), saying so once.
func OpenGPUs(drv gpu.Driver, ncclLib gpu.NCCL, log *slog.Logger, hostOnly bool) *GPUs {
	if drv == nil {
		return nil
	}
	infos, err := drv.Devices()
	if err != nil || len(infos) == 0 {
		if err == nil {
			err = errors.New("the driver lists no GPU")
		}
		log.Info("no CUDA driver: CPU-only", "driver", drv.Name(), "why", err)
		return nil
	}
	g := &GPUs{drv: drv, nccl: ncclLib, log: log, by: make(map[string]*gpuDev), hostOnly: hostOnly, local: make(map[string][]*nccl.Engine)}
	for _, in := range infos {
		gd := &gpuDev{idx: len(g.devs), info: in, g: g}
		g.devs = append(g.devs, gd)
		g.by[in.UUID] = gd
		log.Info("GPU found", "index", in.Index, "uuid", in.UUID, "name", in.Name, "pci", in.PCIBusID, "memory", in.MemoryBytes, "driver", drv.Name())
	}
	if ncclLib == nil && len(g.devs) > 1 {
		log.Info("no NCCL: tensors on different GPUs are reduced through host memory")
	}
	cudaV, _ := drv.Version()
	ncclV := 0
	if ncclLib != nil {
		ncclV, _ = ncclLib.Version()
	}
	log.Info("GPU path ready (each GPU's context opened on first use)", "gpus", len(g.devs), "driver", drv.Name(), "cuda_version", cudaV, "nccl_version", ncclV, "host_only", hostOnly)
	return g
}

// UUIDs lists the GPUs found (Welcome.gpu_uuids); nil when CPU-only.
func (g *GPUs) UUIDs() []string {
	if g == nil {
		return nil
	}
	out := make([]string, len(g.devs))
	for i, d := range g.devs {
		out[i] = d.info.UUID
	}
	return out
}

// Close releases everything: NCCL engines, buffers, streams, contexts of
// the GPUs opened. Called once the executor has stopped.
func (g *GPUs) Close() {
	if g == nil {
		return
	}
	g.dropEngines((*nccl.Engine).Close)
	for _, d := range g.devs {
		d.mu.Lock()
		if d.dev == nil {
			d.mu.Unlock()
			continue
		}
		if d.fuseN > 0 {
			d.dev.Free(d.fuse)
		}
		if d.scratchN > 0 {
			d.dev.Free(d.scratch)
		}
		if d.kern != nil {
			d.kern.mod.Unload()
		}
		d.stream.Destroy()
		d.dev.Close()
		d.dev, d.stream = nil, nil
		d.mu.Unlock()
	}
}

// ConnGPU is one connection's device state: its mapped allocations and
// opened events (the loop's), and the device outputs the daemon allocated
// for it (the executor adds them, the loop frees them on Release).
type ConnGPU struct {
	Log    *slog.Logger // where its messages go (the client's, with its pid)
	maps   map[string]*devMapping
	events map[string]*devEvent

	mu     sync.Mutex // guards the fields below
	outs   map[string]*devOutput
	closed bool
}

// devMapping is a client allocation opened with cuIpcOpenMemHandle.
type devMapping struct {
	d    *gpuDev
	base gpu.DevicePtr
	size uint64
	refs atomic.Int32
}

// Unref drops a reference; the last closes the mapping.
func (m *devMapping) Unref() {
	if m.refs.Add(-1) == 0 {
		m.d.dev.CloseMemHandle(m.base)
		m.d.g.counts.closes.Add(1)
	}
}

// devEvent is a client's interprocess event, opened once.
type devEvent struct {
	d    *gpuDev
	ev   gpu.Event
	refs atomic.Int32
}

// Unref drops a reference; the last destroys the event.
func (e *devEvent) Unref() {
	if e.refs.Add(-1) == 0 {
		e.ev.Destroy()
		e.d.g.counts.closes.Add(1)
	}
}

// devOutput is daemon device memory holding a result for the client
// (Done.device_output) until it sends Release.
type devOutput struct {
	d   *gpuDev
	ptr gpu.DevicePtr
}

// devOp is an op's device tensor.
type devOp struct {
	d   *gpuDev
	cg  *ConnGPU    // the device state of the connection that sent it
	m   *devMapping // nil for an empty tensor
	ev  *devEvent   // nil when the client synchronised its stream itself
	ptr gpu.DevicePtr
	n   int
	// staged is the host copy the CPU path works on, when the tensor
	// takes that path (device.go: stageIn); nil otherwise.
	staged []byte
}

// devOf is o's device tensor: the device path's devOp, which is the only
// deviceTensor; nil for a host tensor.
func devOf(o *job.Op) *devOp {
	d, _ := o.Dev.(*devOp)
	return d
}

// Done copies a tensor staged through host memory back (device.go:
// unstage) as o is answered with dn.
func (d *devOp) Done(o *job.Op, dn *ipcpb.Done) *ipcpb.Done {
	if d.staged == nil {
		return dn
	}
	return unstage(o, dn)
}

// Bytes is the tensor's size (job.DeviceTensor).
func (d *devOp) Bytes() int { return d.n }

// GPU is the index of the tensor's GPU among the node's (job.DeviceTensor).
func (d *devOp) GPU() int { return d.d.idx }

// Release drops the op's references on its mapping and event
// (job.DeviceTensor).
func (d *devOp) Release() {
	if d.m != nil {
		d.m.Unref()
	}
	if d.ev != nil {
		d.ev.Unref()
	}
	d.m, d.ev, d.staged = nil, nil, nil
}

// maxDeviceMappings bounds one connection's cached IPC mappings.
const maxDeviceMappings = 4096

// Resolve checks a DeviceBuffer for a tensor of n bytes of the connection
// whose device state is cg and returns it mapped, holding references on its
// mapping and event. g is nil on a CPU-only node.
func (g *GPUs) Resolve(cg *ConnGPU, name string, b *ipcpb.DeviceBuffer, n uint64) (job.DeviceTensor, error) {
	if g == nil {
		return nil, fmt.Errorf("tensor %q: a GPU tensor (device_buffer), but this daemon runs CPU-only (no CUDA driver): stage it through host memory", name)
	}
	d := g.by[b.GetDeviceUuid()]
	if d == nil {
		return nil, fmt.Errorf("tensor %q: GPU %q is not one this daemon opened (%s): stage it through host memory", name, b.GetDeviceUuid(), strings.Join(g.UUIDs(), ", "))
	}
	if e := d.lostErr(); e != nil {
		return nil, fmt.Errorf("tensor %q: %w", name, e)
	}
	if b.GetLength() != n {
		return nil, fmt.Errorf("tensor %q: device buffer of %d bytes for a tensor of %d bytes", name, b.GetLength(), n)
	}
	// The executor runs even an empty tensor on the GPU's stream.
	if err := d.open("first device tensor", "tensor", name); err != nil {
		return nil, fmt.Errorf("tensor %q: %w", name, err)
	}
	if n == 0 {
		return &devOp{d: d, cg: cg}, nil
	}
	if len(b.GetMemHandle()) != gpu.IpcMemHandleSize {
		return nil, fmt.Errorf("tensor %q: CUDA IPC memory handle of %d bytes (want %d)", name, len(b.GetMemHandle()), gpu.IpcMemHandleSize)
	}
	if eh := b.GetEventHandle(); len(eh) != 0 && len(eh) != gpu.IpcEventHandleSize {
		return nil, fmt.Errorf("tensor %q: CUDA IPC event handle of %d bytes (want %d or none)", name, len(eh), gpu.IpcEventHandleSize)
	}
	size := b.GetAllocSize()
	if size == 0 || (d.info.MemoryBytes > 0 && size > d.info.MemoryBytes) {
		return nil, fmt.Errorf("tensor %q: allocation size %d is absurd for GPU %s (%d bytes of memory)", name, size, d.info.UUID, d.info.MemoryBytes)
	}
	end, carry := bits.Add64(b.GetOffset(), b.GetLength(), 0)
	if carry != 0 || end > size {
		return nil, fmt.Errorf("tensor %q: bytes [%d, +%d) lie outside the allocation of %d bytes", name, b.GetOffset(), b.GetLength(), size)
	}
	m, err := cg.mapping(d, name, b.GetMemHandle(), size)
	if err != nil {
		return nil, err
	}
	o := &devOp{d: d, cg: cg, m: m, ptr: m.base.Add(int(b.GetOffset())), n: int(n)}
	m.refs.Add(1)
	if eh := b.GetEventHandle(); len(eh) != 0 {
		e, err := cg.event(d, name, eh)
		if err != nil {
			o.Release()
			return nil, err
		}
		e.refs.Add(1)
		o.ev = e
	}
	return o, nil
}

// mapping returns the connection's cached mapping of the allocation of
// size bytes that handle names on d, opening it (cuIpcOpenMemHandle) the
// first time; the cache holds a reference.
func (cg *ConnGPU) mapping(d *gpuDev, name string, handle []byte, size uint64) (*devMapping, error) {
	if cg.maps == nil {
		cg.maps = make(map[string]*devMapping)
		cg.events = make(map[string]*devEvent)
	}
	key := string(handle)
	m := cg.maps[key]
	switch {
	case m != nil && m.d != d:
		return nil, fmt.Errorf("tensor %q: its IPC memory handle was sent before for GPU %s, now for %s", name, m.d.info.UUID, d.info.UUID)
	case m != nil && m.size != size:
		return nil, fmt.Errorf("tensor %q: its IPC memory handle was sent before with allocation size %d, now %d", name, m.size, size)
	case m == nil:
		if len(cg.maps) >= maxDeviceMappings {
			return nil, fmt.Errorf("tensor %q: more than %d device allocations mapped: release some (ReleaseDeviceMemory)", name, maxDeviceMappings)
		}
		var h gpu.IpcMemHandle
		copy(h[:], key)
		base, err := d.dev.OpenMemHandle(h, int(size))
		if err != nil {
			return nil, fmt.Errorf("tensor %q: GPU %s: open the CUDA IPC memory handle: %w", name, d.info.UUID, err)
		}
		d.g.counts.opens.Add(1)
		m = &devMapping{d: d, base: base, size: size}
		m.refs.Store(1)
		cg.maps[key] = m
	}
	return m, nil
}

// event returns the connection's cached IPC event that handle names on d,
// opening it (cuIpcEventOpenHandle) the first time; the cache holds a
// reference. No message releases events: at the bound, those no op uses
// are forgotten.
func (cg *ConnGPU) event(d *gpuDev, name string, handle []byte) (*devEvent, error) {
	ek := string(handle)
	e := cg.events[ek]
	if e != nil && e.d != d {
		return nil, fmt.Errorf("tensor %q: its IPC event handle was sent before for GPU %s, now for %s", name, e.d.info.UUID, d.info.UUID)
	}
	if e != nil {
		return e, nil
	}
	if len(cg.events) >= maxDeviceMappings {
		for k, old := range cg.events {
			if old.refs.Load() == 1 {
				delete(cg.events, k)
				old.Unref()
			}
		}
	}
	if len(cg.events) >= maxDeviceMappings {
		return nil, fmt.Errorf("tensor %q: more than %d IPC events in use", name, maxDeviceMappings)
	}
	var h gpu.IpcEventHandle
	copy(h[:], ek)
	ev, err := d.dev.OpenEventHandle(h)
	if err != nil {
		return nil, fmt.Errorf("tensor %q: GPU %s: open the CUDA IPC event handle: %w", name, d.info.UUID, err)
	}
	d.g.counts.opens.Add(1)
	e = &devEvent{d: d, ev: ev}
	e.refs.Store(1)
	cg.events[ek] = e
	return e, nil
}

// releaseDeviceMemory drops the cached mappings of handles the client freed;
// a mapping an op in flight uses closes after it. Unknown handles are
// ignored: the client may free allocations it never sent.
func (cg *ConnGPU) ReleaseMemory(m *ipcpb.ReleaseDeviceMemory) {
	for _, h := range m.GetMemHandles() {
		if mp, ok := cg.maps[string(h)]; ok {
			delete(cg.maps, string(h))
			mp.Unref()
		}
	}
}

// Close drops everything the connection held on the GPUs (the loop, at
// disconnect): mappings and events close once no op uses them, device
// outputs are freed.
func (cg *ConnGPU) Close() {
	if n := len(cg.maps) + len(cg.events); n > 0 {
		cg.Log.Debug("GPU mappings closed", "mappings", len(cg.maps), "events", len(cg.events))
	}
	for k, m := range cg.maps {
		delete(cg.maps, k)
		m.Unref()
	}
	for k, e := range cg.events {
		delete(cg.events, k)
		e.Unref()
	}
	cg.mu.Lock()
	defer cg.mu.Unlock()
	for k, o := range cg.outs {
		o.d.dev.Free(o.ptr)
		delete(cg.outs, k)
	}
	cg.closed = true
}

// addOutput keeps a device output for the client until Release; it
// returns false (and frees it) when the client is gone.
func (cg *ConnGPU) addOutput(h gpu.IpcMemHandle, o *devOutput) bool {
	cg.mu.Lock()
	defer cg.mu.Unlock()
	if cg.closed {
		o.d.dev.Free(o.ptr)
		return false
	}
	if cg.outs == nil {
		cg.outs = make(map[string]*devOutput)
	}
	cg.outs[string(h[:])] = o
	return true
}

// Mapped is the number of the connection's mapped allocations.
func (cg *ConnGPU) Mapped() int { return len(cg.maps) }

// ReleaseOutput frees a device output the client has read.
func (cg *ConnGPU) ReleaseOutput(h []byte) error {
	cg.mu.Lock()
	defer cg.mu.Unlock()
	o, ok := cg.outs[string(h)]
	if !ok {
		return fmt.Errorf("release of an unknown device output (%d-byte handle)", len(h))
	}
	delete(cg.outs, string(h))
	if err := o.d.dev.Free(o.ptr); err != nil {
		cg.Log.Warn("freeing a device output failed", "gpu", o.d.info.UUID, "err", err)
	}
	return nil
}

// gpuKernels are the daemon's own kernels (gpu/kernels) loaded on one GPU.
type gpuKernels struct {
	mod gpu.Module
	fns map[string]gpu.Function
}

// kernels returns d's kernels, loading them on first use.
func (d *gpuDev) kernels() (*gpuKernels, error) {
	if d.kern != nil || d.kernErr != nil {
		return d.kern, d.kernErr
	}
	mod, err := d.dev.LoadModule(kernelImage())
	if err != nil {
		d.kernErr = fmt.Errorf("load the daemon's kernels: %w", err)
		return nil, d.kernErr
	}
	d.kern = &gpuKernels{mod: mod, fns: make(map[string]gpu.Function)}
	return d.kern, nil
}

func (k *gpuKernels) fn(name string) (gpu.Function, error) {
	if f, ok := k.fns[name]; ok {
		return f, nil
	}
	f, err := k.mod.Function(name)
	if err != nil {
		return nil, fmt.Errorf("kernel %s: %w", name, err)
	}
	k.fns[name] = f
	return f, nil
}

// reduce enqueues dst = op(dst, src) over count elements.
func (d *gpuDev) reduce(dst, src gpu.DevicePtr, count int, dt tensor.DType, op tensor.ReduceOp) error {
	k, err := d.kernels()
	if err != nil {
		return err
	}
	return kernelReduce(k.fn, d.stream, dst, src, count, dt, op)
}

// scale enqueues p *= factor over count elements.
func (d *gpuDev) scale(p gpu.DevicePtr, count int, dt tensor.DType, factor float64) error {
	k, err := d.kernels()
	if err != nil {
		return err
	}
	return kernelScale(k.fn, d.stream, p, count, dt, factor)
}

// ensure grows d's fusion (and, with scratch, scratch) buffer to n bytes.
func (d *gpuDev) ensure(n int, scratch bool) error {
	grow := func(p *gpu.DevicePtr, have *int) error {
		if *have >= n {
			return nil
		}
		if *have > 0 {
			d.dev.Free(*p)
			*have = 0
		}
		np, err := d.dev.Alloc(n)
		if err != nil {
			return fmt.Errorf("GPU %s: fusion buffer of %d bytes: %w", d.info.UUID, n, err)
		}
		d.g.counts.allocs.Add(1)
		*p, *have = np, n
		return nil
	}
	if err := grow(&d.fuse, &d.fuseN); err != nil {
		return err
	}
	if scratch {
		return grow(&d.scratch, &d.scratchN)
	}
	return nil
}

// recover replaces d's stream after a failure (a CUDA error may leave it
// unusable), so the next job starts clean.
func (d *gpuDev) recover() {
	d.stream.Destroy()
	if s, err := d.dev.NewStream(); err == nil {
		d.stream = s
	}
}

// sync waits for d's stream.
func (d *gpuDev) sync(ctx context.Context) error {
	if err := d.stream.Synchronize(ctx); err != nil {
		return fmt.Errorf("GPU %s: %w", d.info.UUID, err)
	}
	return nil
}

// The NCCL engines. The device path drives NCCL through backends/nccl: the
// node-local engines over a set of GPUs (one communicator, ncclCommInitAll)
// and, where the plan runs a response on NCCL across nodes, this node's
// engine across nodes (joined with the coordinator's unique id). The
// collectives only enqueue; a response ends with waitStreams, which waits
// through the engines its work used, so that a failed peer (seen only in
// ncclCommGetAsyncError, never in the stream) ends the wait. After an NCCL
// error every engine is aborted and the next use makes new ones.

// engineUse is an engine a response enqueued work with, and the GPU whose
// stream that work is on.
type engineUse struct {
	e      *nccl.Engine
	d      *gpuDev
	across bool // the engine across nodes
}

// use notes that the running response enqueues work with e on d's stream.
func (g *GPUs) use(e *nccl.Engine, d *gpuDev, across bool) {
	for _, u := range g.used {
		if u.e == e {
			return
		}
	}
	g.used = append(g.used, engineUse{e: e, d: d, across: across})
}

// commKey names a set of GPUs.
func commKey(devs []*gpuDev) string {
	var b strings.Builder
	for _, d := range devs {
		fmt.Fprintf(&b, "%d,", d.idx)
	}
	return b.String()
}

// localEngines returns the node-local NCCL engines over devs (rank i on
// devs[i]), made on first use, and made again when the kept ones have
// failed since their last use.
func (g *GPUs) localEngines(devs []*gpuDev) ([]*nccl.Engine, error) {
	k := commKey(devs)
	es := g.local[k]
	if es != nil {
		if err := es[0].Err(); err != nil {
			g.log.Warn("NCCL communicator failed since its last use: making a new one", "gpus", len(devs), "err", err)
			for _, e := range es {
				e.Close()
			}
			delete(g.local, k)
			es = nil
		}
	}
	if es == nil {
		ds := make([]gpu.Device, len(devs))
		for i, d := range devs {
			ds[i] = d.dev
		}
		var err error
		if es, err = nccl.NewLocal(g.nccl, ds); err != nil {
			return nil, err
		}
		g.local[k] = es
		g.log.Info("NCCL communicator created", "gpus", len(devs))
	}
	for i, e := range es {
		g.use(e, devs[i], false)
	}
	return es, nil
}

// enginesBetween returns the node-local engines over devs where there are
// several GPUs to join, nil for one.
func (g *GPUs) enginesBetween(devs []*gpuDev) ([]*nccl.Engine, error) {
	if len(devs) == 1 {
		return nil, nil
	}
	return g.localEngines(devs)
}

// acrossEngine returns this node's engine across the nodes of w's job
// engine, joined with the coordinator's unique id (w.NCCLID) on the job's
// first use (and the previous job's closed). A kept engine that failed
// fails the response: the nodes cannot make a new one without a new id.
func (g *GPUs) acrossEngine(ctx context.Context, w *job.Work) (*nccl.Engine, error) {
	b := w.Engine
	if g.across != nil && g.acrossOf == b {
		if err := g.across.Err(); err != nil {
			g.abortEngines()
			return nil, fmt.Errorf("NCCL communicator across nodes failed: %w", err)
		}
	} else {
		if g.across != nil {
			g.across.Close() // the previous job's
			g.across, g.acrossOf = nil, nil
		}
		// Open already: this node's ops are on devs[0] (ncclAcrossOK).
		if err := g.devs[0].open("NCCL communicator across nodes"); err != nil {
			return nil, err
		}
		e, err := nccl.Join(ctx, g.nccl, g.devs[0].dev, w.NCCLID, b.Rank(), b.Size())
		if err != nil {
			return nil, fmt.Errorf("NCCL communicator across %d nodes: %w", b.Size(), err)
		}
		g.across, g.acrossOf = e, b
		g.log.Info("NCCL communicator across nodes created", "nodes", b.Size(), "rank", b.Rank(), "gpu", g.devs[0].info.UUID)
	}
	g.use(g.across, g.devs[0], true)
	return g.across, nil
}

// groupEach makes f's calls for every engine of es (rank i on devs[i], as
// localEngines returns them) as one NCCL group; a failure aborts them.
func groupEach(es []*nccl.Engine, f func(i int, e *nccl.Engine) error) error {
	return es[0].Group(func() error {
		for i, e := range es {
			if err := f(i, e); err != nil {
				return err
			}
		}
		return nil
	})
}

// waitStreams waits for devs' streams at the end of a response: each
// through the engines whose work is on it (Engine.Wait, which watches
// their communicators for a failed peer; the engine across nodes first,
// since a dead node stalls the node-local work behind it), then every
// stream plainly (those without engine work, and the drain after a
// failure: no work may be left running on the clients' memory). The first
// failure aborts every engine, so that nothing waits for a dead peer, and
// is returned.
func (g *GPUs) waitStreams(ctx context.Context, devs []*gpuDev) error {
	used := g.used
	g.used = nil
	var err error
	for _, d := range devs {
		for _, across := range []bool{true, false} {
			for _, u := range used {
				if u.d != d || u.across != across {
					continue
				}
				if werr := u.e.Wait(ctx, d.stream); werr != nil && err == nil {
					err = fmt.Errorf("GPU %s: waiting for NCCL: %w", d.info.UUID, werr)
					g.abortEngines()
				}
			}
		}
	}
	if serr := syncAll(ctx, devs); err == nil {
		err = serr
	}
	return err
}

// abortEngines aborts every NCCL engine after an error (ncclCommAbort):
// the next use makes new ones.
func (g *GPUs) abortEngines() { g.dropEngines((*nccl.Engine).Abort) }

// dropEngines ends every engine kept with end (Abort, or Close when the
// daemon stops) and forgets them.
func (g *GPUs) dropEngines(end func(*nccl.Engine) error) {
	for k, es := range g.local {
		for _, e := range es {
			end(e)
		}
		delete(g.local, k)
	}
	if g.across != nil {
		end(g.across)
		g.across, g.acrossOf = nil, nil
	}
}

// syncAll synchronises the streams of devs, all of them even after an
// error (no work may be left running on clients' memory).
func syncAll(ctx context.Context, devs []*gpuDev) error {
	var errs []error
	for _, d := range devs {
		if err := d.sync(ctx); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
