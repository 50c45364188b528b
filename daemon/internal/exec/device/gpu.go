package device

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/bits"
	"os"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/hvdd/hvdd/backends"
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
// goes out. The driver calls that may block (opening a GPU's context or an
// IPC handle, closing one, freeing memory) run on the housekeeping
// goroutine (later.go): an op whose memory is still being opened reaches
// the loop's negotiation once it is open (job.DeviceTensor.WhenOpen).
//
// Results of a new size (allgather, alltoall, reducescatter, a staged
// output) go to the client in buffers of its connection's pool: allocated
// and exported once, lent to the client from its Done until it sends
// Release, then kept for the next result, so that a training job's steady
// state allocates and exports nothing. They are freed only when the
// connection closes (the client may map them until then).

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
	hk     housekeeping
	// anyLost is set once a GPU is lost (MarkLost), so that the executor's
	// check costs one atomic load while none is.
	anyLost atomic.Bool
	drv     gpu.Driver
	engines backends.DeviceEngines // the daemon's factory of device engines (NCCL's); nil without NCCL: several GPUs then stage through host
	log     *slog.Logger
	devs    []*gpuDev
	by      map[string]*gpuDev // by UUID

	// ordered completes what it can on the GPU (OrderOnGPU, ordered.go).
	ordered bool
	// inputHostWait waits for clients' events on the host instead of on
	// the daemon's stream ($HVDD_GPU_INPUT_WAIT=host: an experiment of
	// GPU-PATH D11, measured by scripts/gpu-bench.sh).
	inputHostWait bool
	// hostOnly stages every device tensor through host memory and runs it
	// on the CPU path (Config.GPUAllreduce "host").
	hostOnly bool
	// mps is whether NVIDIA MPS ran when the daemon started (said once
	// when processes come to share a GPU without it).
	mps gpu.MPS

	// The device engines made by engines (NCCL's), used by the executor
	// goroutine only. local holds the node-local engines by the GPUs they
	// span (commKey), rank i on the i-th of them; across is this node's engine
	// across nodes (GPUAllreduceNCCL): one rank per node, on devs[0],
	// joined for the job engine acrossOf. Each is made on first use and
	// kept while it is healthy.
	local    map[string][]engine
	across   engine
	acrossOf backends.Backend
	// used lists the engines the running response enqueued work with, for
	// the wait at its end (waitStreams).
	used []engineUse
}

// gpuDev is one GPU the daemon found, with (once opened) its context and
// the executor's stream, fusion buffer, combine tables and kernels on it.
type gpuDev struct {
	idx  int // in GPUs.devs
	info gpu.Info
	g    *GPUs
	// lost is set, once, when NVML reports the GPU lost (lost.go).
	lost atomic.Pointer[LostError]
	// users are the connections that sent tensors on the GPU (the loop's:
	// Resolve, ConnGPU.Close); shared is set once the daemon said that
	// several processes share it.
	users  map[*ConnGPU]bool
	shared bool

	// mu serialises open (the housekeeping goroutine opens a GPU before
	// the first IPC handle on it; the executor, for NCCL across nodes).
	// dev and stream are set once, under mu, before any op on the GPU
	// reaches the executor; the code that uses them holds such an op (it
	// came after the open, through WhenOpen and the loop) and reads them
	// without mu.
	mu  sync.Mutex
	dev gpu.Device // nil until opened

	// Used by the executor goroutine only (set by open).
	stream  gpu.Stream
	kern    *gpuKernels
	kernErr error
	fuse    gpu.DevicePtr
	fuseN   int
	tab     tables // the combine kernel's (combine.go)

	// GPU-ordered completion (ordered.go): the interprocess completion
	// event and its handle (made by the executor on first use; the
	// housekeeping goroutine waits on it before unmapping), the
	// responses completed so (orderedSeq, the executor's count) and those
	// the watchdog saw run (doneSeen), and an error it saw that the
	// executor has not yet failed a response with.
	done       atomic.Pointer[doneEv]
	orderedSeq atomic.Int64
	doneSeen   atomic.Int64
	asyncErr   atomic.Pointer[error]
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
func OpenGPUs(drv gpu.Driver, engines backends.DeviceEngines, log *slog.Logger, hostOnly bool) *GPUs {
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
	g := &GPUs{drv: drv, engines: engines, log: log, by: make(map[string]*gpuDev), hostOnly: hostOnly, local: make(map[string][]engine), mps: gpu.DetectMPS(),
		inputHostWait: os.Getenv("HVDD_GPU_INPUT_WAIT") == "host"}
	for _, in := range infos {
		gd := &gpuDev{idx: len(g.devs), info: in, g: g}
		g.devs = append(g.devs, gd)
		g.by[in.UUID] = gd
		log.Info("GPU found", "index", in.Index, "uuid", in.UUID, "name", in.Name, "pci", in.PCIBusID, "memory", in.MemoryBytes, "driver", drv.Name())
	}
	if engines == nil && len(g.devs) > 1 {
		log.Info("no NCCL: tensors on different GPUs are reduced through host memory")
	}
	cudaV, _ := drv.Version()
	ncclV := 0
	if engines != nil {
		ncclV, _ = engines.Version()
	}
	log.Info("GPU path ready (each GPU's context opened on first use)", "gpus", len(g.devs), "driver", drv.Name(), "cuda_version", cudaV, "nccl_version", ncclV, "host_only", hostOnly, "mps", g.mps.Running)
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
	g.Settle()
	g.dropEngines(engine.Close)
	for _, d := range g.devs {
		d.mu.Lock()
		if d.dev == nil {
			d.mu.Unlock()
			continue
		}
		if d.fuseN > 0 {
			d.dev.Free(d.fuse)
		}
		d.freeTables()
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
// opened events (the loop's), and the pool of device buffers its results
// go out in (the executor takes and lends them, the loop takes them back on
// Release).
type ConnGPU struct {
	Log    *slog.Logger // where its messages go (the client's, with its pid)
	maps   map[string]*devMapping
	events map[string]*devEvent

	gpus []*gpuDev // the GPUs it sent tensors on (gpuDev.users)

	mu     sync.Mutex            // guards the fields below
	outs   map[string]*devOutput // lent to the client, by IPC handle
	free   []*devOutput          // kept for the next results, oldest first
	closed bool
}

// devMapping is a client allocation opened with cuIpcOpenMemHandle (on the
// housekeeping goroutine: base is set once open has ended without error).
type devMapping struct {
	opening
	d    *gpuDev
	base gpu.DevicePtr
	size uint64
	refs atomic.Int32
}

// Unref drops a reference; the last closes the mapping (once its open has
// ended: the close is queued after it).
func (m *devMapping) Unref() {
	if m.refs.Add(-1) == 0 {
		g := m.d.g
		g.later(func() {
			if m.err != nil {
				return
			}
			m.d.waitOrdered() // work the client was told is done may still run on it
			m.d.dev.CloseMemHandle(m.base)
			g.counts.closes.Add(1)
		})
	}
}

// devEvent is a client's interprocess event, opened once (on the
// housekeeping goroutine).
type devEvent struct {
	opening
	d    *gpuDev
	ev   gpu.Event
	refs atomic.Int32
}

// Unref drops a reference; the last destroys the event.
func (e *devEvent) Unref() {
	if e.refs.Add(-1) == 0 {
		g := e.d.g
		g.later(func() {
			if e.err != nil {
				return
			}
			e.ev.Destroy()
			g.counts.closes.Add(1)
		})
	}
}

// devOutput is a buffer of a connection's pool of device memory for
// results (Done.device_output): allocated once (size bytes, a sizeClass),
// exported once (h), lent for one result at a time.
type devOutput struct {
	d        *gpuDev
	ptr      gpu.DevicePtr
	size     int
	h        gpu.IpcMemHandle
	exported bool
}

// devOp is an op's device tensor.
type devOp struct {
	d    *gpuDev
	cg   *ConnGPU    // the device state of the connection that sent it
	name string      // the tensor's, for errors
	m    *devMapping // nil for an empty tensor
	ev   *devEvent   // nil when the client synchronised its stream itself
	// waits is set when the client orders its use of the result after
	// Done.device_event (DeviceBuffer.client_waits; ordered.go).
	waits bool
	off   int // the tensor's offset in m's allocation
	// ctx is the GPU's context being opened for an empty tensor (whose
	// op has no mapping to wait for); nil when it was open.
	ctx *opening
	ptr gpu.DevicePtr // m's base + off, once open (WhenOpen)
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

// WhenOpen reports whether the tensor's memory, event and GPU context are
// open (job.DeviceTensor): true with the error of a failed open, or false,
// and then calls then, once, from another goroutine when they are.
func (d *devOp) WhenOpen(then func(error)) (bool, error) {
	ctx, m, ev := d.openings()
	if ctx.done() && m.done() && ev.done() {
		return true, d.opened()
	}
	go func() {
		ctx.wait()
		m.wait()
		ev.wait()
		then(d.opened())
	}()
	return false, nil
}

// openings are what d waits for: its GPU's context, mapping and event
// being opened (nil for what it has none of, or was open already).
func (d *devOp) openings() (ctx, m, ev *opening) {
	if d.m != nil {
		m = &d.m.opening
	}
	if d.ev != nil {
		ev = &d.ev.opening
	}
	return d.ctx, m, ev
}

// opened ends WhenOpen once every open has ended: the first failure, named
// after the tensor, or nil with ptr set.
func (d *devOp) opened() error {
	ctx, m, ev := d.openings()
	for _, o := range [...]*opening{ctx, m, ev} {
		if o != nil && o.err != nil {
			return fmt.Errorf("tensor %q: %w", d.name, o.err)
		}
	}
	if d.m != nil {
		d.ptr = d.m.base.Add(d.off)
	}
	return nil
}

// maxDeviceMappings bounds one connection's cached IPC mappings.
const maxDeviceMappings = 4096

// Resolve checks a DeviceBuffer for a tensor of n bytes of the connection
// whose device state is cg and returns it, holding references on its
// mapping and event. The handles it has not seen before, and the GPU's
// context the first time, are opened on the housekeeping goroutine: the
// tensor is usable once WhenOpen says so. g is nil on a CPU-only node.
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
	g.noteUser(d, cg)
	if n == 0 {
		// The executor runs even an empty tensor on the GPU's stream.
		o := &devOp{d: d, cg: cg, name: name}
		if !d.opened() {
			ctx := newOpening()
			o.ctx = &ctx
			g.later(func() { ctx.end(d.open("first device tensor", "tensor", name)) })
		}
		return o, nil
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
	o := &devOp{d: d, cg: cg, name: name, m: m, off: int(b.GetOffset()), n: int(n), waits: b.GetClientWaits()}
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

// noteUser notes that cg sends tensors on d, and says once, where NVIDIA
// MPS does not run, that several processes share d: their contexts and
// the daemon's take turns on it.
func (g *GPUs) noteUser(d *gpuDev, cg *ConnGPU) {
	if d.users[cg] {
		return
	}
	if d.users == nil {
		d.users = make(map[*ConnGPU]bool)
	}
	d.users[cg] = true
	cg.gpus = append(cg.gpus, d)
	if len(d.users) > 1 && !d.shared && !g.mps.Running {
		d.shared = true
		g.log.Info("processes share a GPU", "gpu", d.info.UUID, "index", d.info.Index, "processes", len(d.users), "mps", g.mps.Advice())
	}
}

// mapping returns the connection's cached mapping of the allocation of
// size bytes that handle names on d, opening it (cuIpcOpenMemHandle, and
// the GPU's context first if need be) on the housekeeping goroutine the
// first time; the cache holds a reference. A mapping whose open failed is
// opened again.
func (cg *ConnGPU) mapping(d *gpuDev, name string, handle []byte, size uint64) (*devMapping, error) {
	if cg.maps == nil {
		cg.maps = make(map[string]*devMapping)
		cg.events = make(map[string]*devEvent)
	}
	key := string(handle)
	m := cg.maps[key]
	if m != nil && m.done() && m.err != nil {
		delete(cg.maps, key)
		m.Unref()
		m = nil
	}
	switch {
	case m != nil && m.d != d:
		return nil, fmt.Errorf("tensor %q: its IPC memory handle was sent before for GPU %s, now for %s", name, m.d.info.UUID, d.info.UUID)
	case m != nil && m.size != size:
		return nil, fmt.Errorf("tensor %q: its IPC memory handle was sent before with allocation size %d, now %d", name, m.size, size)
	case m == nil:
		if len(cg.maps) >= maxDeviceMappings {
			return nil, fmt.Errorf("tensor %q: more than %d device allocations mapped: release some (ReleaseDeviceMemory)", name, maxDeviceMappings)
		}
		m = &devMapping{opening: newOpening(), d: d, size: size}
		m.refs.Store(1)
		cg.maps[key] = m
		var h gpu.IpcMemHandle
		copy(h[:], key)
		d.g.later(func() {
			if err := d.open("first device tensor", "tensor", name); err != nil {
				m.end(err)
				return
			}
			base, err := d.dev.OpenMemHandle(h, int(size))
			if err != nil {
				m.end(fmt.Errorf("GPU %s: open the CUDA IPC memory handle: %w", d.info.UUID, err))
				return
			}
			d.g.counts.opens.Add(1)
			m.base = base
			m.end(nil)
		})
	}
	return m, nil
}

// event returns the connection's cached IPC event that handle names on d,
// opening it (cuIpcEventOpenHandle) on the housekeeping goroutine the
// first time; the cache holds a reference. No message releases events: at
// the bound, those no op uses are forgotten. One whose open failed is
// opened again.
func (cg *ConnGPU) event(d *gpuDev, name string, handle []byte) (*devEvent, error) {
	ek := string(handle)
	e := cg.events[ek]
	if e != nil && e.done() && e.err != nil {
		delete(cg.events, ek)
		e.Unref()
		e = nil
	}
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
	e = &devEvent{opening: newOpening(), d: d}
	e.refs.Store(1)
	cg.events[ek] = e
	var h gpu.IpcEventHandle
	copy(h[:], ek)
	d.g.later(func() {
		// The mapping's open, queued before, opened the GPU's context.
		if err := d.open("first device tensor", "tensor", name); err != nil {
			e.end(err)
			return
		}
		ev, err := d.dev.OpenEventHandle(h)
		if err != nil {
			e.end(fmt.Errorf("GPU %s: open the CUDA IPC event handle: %w", d.info.UUID, err))
			return
		}
		d.g.counts.opens.Add(1)
		e.ev = ev
		e.end(nil)
	})
	return e, nil
}

// ReleaseMemory drops the cached mappings of handles the client freed; a
// mapping an op in flight uses closes after it. Unknown handles are
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
// disconnect): mappings and events close once no op uses them, the pool's
// buffers are freed (on the housekeeping goroutine).
func (cg *ConnGPU) Close() {
	maps, events := len(cg.maps), len(cg.events)
	for k, m := range cg.maps {
		delete(cg.maps, k)
		m.Unref()
	}
	for k, e := range cg.events {
		delete(cg.events, k)
		e.Unref()
	}
	for _, d := range cg.gpus {
		delete(d.users, cg)
	}
	cg.gpus = nil
	cg.mu.Lock()
	defer cg.mu.Unlock()
	for k, o := range cg.outs {
		o.freeLater()
		delete(cg.outs, k)
	}
	for _, o := range cg.free {
		o.freeLater()
	}
	cg.free = nil
	cg.closed = true
	if maps+events > 0 {
		// Logged once the closes are queued (GPUs.Settle then waits for
		// them: tests count this line).
		cg.Log.Debug("GPU mappings closed", "mappings", maps, "events", events)
	}
}

// sizeClass rounds a result's n bytes up to the size its buffer is
// allocated with: a power of two up to 1 MiB, then a multiple of an
// eighth of the power of two below (at most 12.5% more), so that results
// whose size varies a little (an allgather of varying batches) reuse a
// buffer.
func sizeClass(n int) int {
	const small = 1 << 20
	if n <= 256 {
		return 256
	}
	if n <= small {
		return 1 << bits.Len(uint(n-1))
	}
	step := 1 << (bits.Len(uint(n)) - 4) // an eighth of n's power of two
	return (n + step - 1) / step * step
}

// take returns a buffer on d for a result of n > 0 bytes: the smallest
// pooled one that fits (and is not over twice its size class), or a new
// one (cuMemAlloc). Runs on the executor goroutine.
func (cg *ConnGPU) take(d *gpuDev, n int) (*devOutput, error) {
	class := sizeClass(n)
	cg.mu.Lock()
	best := -1
	for i, o := range cg.free {
		if o.d == d && o.size >= n && o.size <= 2*class && (best < 0 || o.size < cg.free[best].size) {
			best = i
		}
	}
	if best >= 0 {
		o := cg.free[best]
		cg.free = append(cg.free[:best], cg.free[best+1:]...)
		cg.mu.Unlock()
		return o, nil
	}
	cg.mu.Unlock()
	p, err := d.dev.Alloc(class)
	if err != nil {
		return nil, fmt.Errorf("GPU %s: device output of %d bytes: %w", d.info.UUID, n, err)
	}
	d.g.counts.allocs.Add(1)
	return &devOutput{d: d, ptr: p, size: class}, nil
}

// handle returns o's IPC handle, exporting it the first time.
func (o *devOutput) handle() (gpu.IpcMemHandle, error) {
	if o.exported {
		return o.h, nil
	}
	h, err := o.d.dev.IpcMemHandle(o.ptr)
	if err != nil {
		return h, fmt.Errorf("GPU %s: %w", o.d.info.UUID, err)
	}
	o.d.g.counts.exports.Add(1)
	o.h, o.exported = h, true
	return h, nil
}

// freeLater frees o's memory on the housekeeping goroutine.
func (o *devOutput) freeLater() {
	d := o.d
	d.g.later(func() {
		if err := d.dev.Free(o.ptr); err != nil {
			d.g.log.Warn("freeing a device output failed", "gpu", d.info.UUID, "err", err)
		}
	})
}

// lend hands o (exported) to the client until it sends Release; it
// returns false (and frees o) when the client is gone.
func (cg *ConnGPU) lend(o *devOutput) bool {
	cg.mu.Lock()
	defer cg.mu.Unlock()
	if cg.closed {
		o.freeLater()
		return false
	}
	if cg.outs == nil {
		cg.outs = make(map[string]*devOutput)
	}
	cg.outs[string(o.h[:])] = o
	return true
}

// giveBack returns a buffer taken and not lent (a result that failed) to
// the pool.
func (cg *ConnGPU) giveBack(o *devOutput) {
	cg.mu.Lock()
	defer cg.mu.Unlock()
	cg.keep(o)
}

// keep pools o until the connection closes; cg.mu is held. A buffer once
// lent is never freed while the client is connected: the client may keep
// its mapping open (the Python client does, to read the next result in
// the same buffer without opening it again), and CUDA leaves freeing
// memory another process maps undefined. The pool stays small: a result
// takes a free buffer up to twice its size class, so only results in
// flight together, or of sizes far apart, add buffers.
func (cg *ConnGPU) keep(o *devOutput) {
	if cg.closed {
		o.freeLater()
		return
	}
	cg.free = append(cg.free, o)
}

// Mapped is the number of the connection's mapped allocations.
func (cg *ConnGPU) Mapped() int { return len(cg.maps) }

// ReleaseOutput takes back a device output the client has read, into the
// pool.
func (cg *ConnGPU) ReleaseOutput(h []byte) error {
	cg.mu.Lock()
	defer cg.mu.Unlock()
	o, ok := cg.outs[string(h)]
	if !ok {
		return fmt.Errorf("release of an unknown device output (%d-byte handle)", len(h))
	}
	delete(cg.outs, string(h))
	cg.keep(o)
	return nil
}

// gpuKernels are the daemon's own kernels (gpu/kernels) loaded on one GPU.
type gpuKernels struct {
	mod gpu.Module
	fns map[string]gpu.Function
	// combines are the combine kernels looked up so far, by op and dtype:
	// a launch per response finds its function without building its name.
	combines map[combineKey]gpu.Function
}

// combineKey names a combine kernel.
type combineKey struct {
	op tensor.ReduceOp
	dt tensor.DType
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

// scale enqueues p *= factor over count elements.
func (d *gpuDev) scale(p gpu.DevicePtr, count int, dt tensor.DType, factor float64) error {
	k, err := d.kernels()
	if err != nil {
		return err
	}
	return kernelScale(k.fn, d.stream, p, count, dt, factor)
}

// ensure grows d's fusion buffer to hold n bytes, to n's size class
// (sizeClass), so that a fused size that creeps up does not reallocate at
// every new maximum.
func (d *gpuDev) ensure(n int) error {
	if d.fuseN >= n {
		return nil
	}
	if d.fuseN > 0 {
		d.dev.Free(d.fuse)
		d.fuseN = 0
	}
	size := sizeClass(n)
	p, err := d.dev.Alloc(size)
	if err != nil {
		return fmt.Errorf("GPU %s: fusion buffer of %d bytes: %w", d.info.UUID, size, err)
	}
	d.g.counts.allocs.Add(1)
	d.fuse, d.fuseN = p, size
	return nil
}

// recover replaces d's stream after a failure (a CUDA error may leave it
// unusable), so the next job starts clean.
func (d *gpuDev) recover() {
	d.tab.cached = nil // a table copy queued may never have run
	d.stream.Destroy()
	if s, err := d.dev.NewStream(); err == nil {
		d.stream = s
	}
}

// sync waits for d's stream.
func (d *gpuDev) sync(ctx context.Context) error {
	d.g.counts.syncs.Add(1)
	if err := d.stream.Synchronize(ctx); err != nil {
		return fmt.Errorf("GPU %s: %w", d.info.UUID, err)
	}
	return nil
}

// The NCCL engines. The device path drives NCCL through the interface
// backends.DeviceEngine (engine), made by the backends.DeviceEngines the
// daemon wires (backends/nccl's, which no package of the executor imports):
// the node-local engines over a set of GPUs (one communicator, ncclCommInitAll)
// and, where the plan runs a response on NCCL across nodes, this node's
// engine across nodes (joined with the coordinator's unique id). The
// collectives only enqueue; a response ends with waitStreams, which waits
// through the engines its work used, so that a failed peer (seen only in
// ncclCommGetAsyncError, never in the stream) ends the wait. After an NCCL
// error every engine is aborted and the next use makes new ones.

// engine is what the device path needs of a device engine
// (backends.DeviceEngine, made by the daemon's backends.DeviceEngines): its
// collectives, grouped calls (several GPUs driven by one goroutine) and
// point-to-point calls (alltoall).
type engine interface {
	backends.DeviceEngine
	backends.DeviceGrouper
	backends.DevicePeer
}

// asEngines checks that the engines made have what the device path needs
// (engine), closing them if not.
func asEngines(made []backends.DeviceEngine) ([]engine, error) {
	es := make([]engine, len(made))
	for i, de := range made {
		e, ok := de.(engine)
		if !ok {
			for _, de := range made {
				de.Close()
			}
			return nil, fmt.Errorf("the %s engine has no grouped or point-to-point calls, which the device path needs", de.Name())
		}
		es[i] = e
	}
	return es, nil
}

// engineUse is an engine a response enqueued work with, and the GPU whose
// stream that work is on.
type engineUse struct {
	e      engine
	d      *gpuDev
	across bool // the engine across nodes
}

// use notes that the running response enqueues work with e on d's stream.
func (g *GPUs) use(e engine, d *gpuDev, across bool) {
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
func (g *GPUs) localEngines(devs []*gpuDev) ([]engine, error) {
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
		made, err := g.engines.NewLocal(ds)
		if err != nil {
			return nil, err
		}
		if es, err = asEngines(made); err != nil {
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
func (g *GPUs) enginesBetween(devs []*gpuDev) ([]engine, error) {
	if len(devs) == 1 {
		return nil, nil
	}
	return g.localEngines(devs)
}

// acrossEngine returns this node's engine across the nodes of w's job
// engine, joined with the coordinator's unique id (w.NCCLID) on the job's
// first use (and the previous job's closed). A kept engine that failed
// fails the response: the nodes cannot make a new one without a new id.
func (g *GPUs) acrossEngine(ctx context.Context, w *job.Work) (engine, error) {
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
		de, err := g.engines.Join(ctx, g.devs[0].dev, w.NCCLID, b.Rank(), b.Size())
		if err != nil {
			return nil, fmt.Errorf("NCCL communicator across %d nodes: %w", b.Size(), err)
		}
		es, err := asEngines([]backends.DeviceEngine{de})
		if err != nil {
			return nil, err
		}
		e := es[0]
		g.across, g.acrossOf = e, b
		g.log.Info("NCCL communicator across nodes created", "nodes", b.Size(), "rank", b.Rank(), "gpu", g.devs[0].info.UUID)
	}
	g.use(g.across, g.devs[0], true)
	return g.across, nil
}

// groupEach makes f's calls for every engine of es (rank i on devs[i], as
// localEngines returns them) as one NCCL group; a failure aborts them.
func groupEach(es []engine, f func(i int, e engine) error) error {
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
				g.counts.syncs.Add(1)
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
func (g *GPUs) abortEngines() { g.dropEngines(engine.Abort) }

// dropEngines ends every engine kept with end (Abort, or Close when the
// daemon stops) and forgets them.
func (g *GPUs) dropEngines(end func(engine) error) {
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
		d.endResponse()
	}
	return errors.Join(errs...)
}
