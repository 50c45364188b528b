//go:build cgo

package nvml

import (
	"encoding/binary"
	"fmt"
	"math"
	"sync"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"
)

// maxEvents bounds the XID events one Sample reads: NVML queues them while
// nobody reads, and a storm must not hold a Sample up.
const maxEvents = 256

// eventSymbols are the NVML functions XID events need, each a list of
// names go-nvml calls one of (the newest it finds); a library lacking one
// gets no event set (FieldXID unsupported) rather than a call the dynamic
// linker cannot resolve.
var eventSymbols = [][]string{
	{"nvmlEventSetCreate"}, {"nvmlEventSetFree"}, {"nvmlDeviceGetSupportedEventTypes"},
	{"nvmlDeviceRegisterEvents"}, {"nvmlEventSetWait_v2", "nvmlEventSetWait"},
}

// Sampler reads the figures of each of the node's GPUs (Sample) and keeps
// track of the GPUs that are lost (Lost). It holds NVML loaded and
// initialised from OpenSampler to Close, and an event set registered for
// every GPU's critical XID errors, read without blocking at each Sample.
//
// Its methods are safe for concurrent use. Sample calls run one at a time
// and block for the NVML calls: about 40 ms per GPU, most of it the two
// PCIe throughput readings (NVML measures each over 20 ms). Lost does not
// wait for a Sample in progress.
type Sampler struct {
	lib gonvml.Interface

	// mu guards the fields that follow, and serialises the NVML calls of
	// Sample and Close. Lock order: mu, then lostMu.
	mu     sync.Mutex
	closed bool
	gpus   []*gpuState
	events gonvml.EventSet // nil without XID events

	// lostMu guards lost, the GPUs found lost, in the order found.
	lostMu sync.Mutex
	lost   []LostError
}

// gpuState is what a Sampler knows of one GPU between Samples.
type gpuState struct {
	index     int
	uuid, bus string
	dev       gonvml.Device // nil when NVML gave no handle: handleErr says why
	handleErr string
	// unsupported are the fields NVML answered NOT_SUPPORTED for (or the
	// library lacks the calls of): not asked again.
	unsupported Fields
	// xid is true when the GPU is registered for XID events; xids are
	// those read since the last Sample.
	xid  bool
	xids []uint64
	// pending are errors of OpenSampler's calls, for the next Sample.
	pending []string
	lost    *LostError
}

// OpenSampler loads NVML (libnvidia-ml.so.1, or HVDD_NVML_LIBRARY),
// initialises it and lists the node's GPUs, for Sample. It fails where
// NVML does not start (no driver, no permission) or cannot count the GPUs;
// a node with a driver and no GPU gets a Sampler of no GPUs. Call Close
// when done.
func OpenSampler() (*Sampler, error) { return openSampler(newLibrary()) }

// openSampler is OpenSampler on lib.
func openSampler(lib gonvml.Interface) (*Sampler, error) {
	if ret := lib.Init(); ret != gonvml.SUCCESS {
		return nil, fmt.Errorf("nvml: nvmlInit: %w", ret)
	}
	n, ret := lib.DeviceGetCount()
	if ret != gonvml.SUCCESS {
		lib.Shutdown()
		return nil, fmt.Errorf("nvml: DeviceGetCount: %w", ret)
	}
	ext := lib.Extensions()
	has := func(sym string) bool { return ext.LookupSymbol(sym) == nil }
	var missing Fields
	if !has("nvmlDeviceGetPcieThroughput") {
		missing |= FieldPCIe
	}
	if !has("nvmlDeviceGetFieldValues") {
		missing |= FieldNVLink
	}
	events := true
	for _, names := range eventSymbols {
		found := false
		for _, sym := range names {
			found = found || has(sym)
		}
		events = events && found
	}
	if !events {
		missing |= FieldXID
	}

	s := &Sampler{lib: lib}
	for i := range n {
		g := &gpuState{index: i, unsupported: missing}
		s.gpus = append(s.gpus, g)
		d, ret := lib.DeviceGetHandleByIndex(i)
		if ret != gonvml.SUCCESS {
			if !s.isLost(g, "DeviceGetHandleByIndex", ret) {
				g.handleErr = fmt.Sprintf("DeviceGetHandleByIndex: %v", ret)
			}
			continue
		}
		g.dev = d
		if uuid, ret := d.GetUUID(); ret == gonvml.SUCCESS {
			g.uuid = uuid
		} else if !s.isLost(g, "GetUUID", ret) {
			g.pending = append(g.pending, fmt.Sprintf("GetUUID: %v", ret))
		}
		if g.lost != nil {
			continue
		}
		if pci, ret := d.GetPciInfo(); ret == gonvml.SUCCESS {
			g.bus = busID(pci)
		} else if !s.isLost(g, "GetPciInfo", ret) {
			g.pending = append(g.pending, fmt.Sprintf("GetPciInfo: %v", ret))
		}
	}
	if events {
		s.openEvents()
	}
	return s, nil
}

// openEvents creates the event set and registers every GPU that supports
// them for critical XID errors.
func (s *Sampler) openEvents() {
	set, ret := s.lib.EventSetCreate()
	if ret != gonvml.SUCCESS {
		for _, g := range s.gpus {
			g.pending = append(g.pending, fmt.Sprintf("EventSetCreate: %v", ret))
		}
		return
	}
	for _, g := range s.gpus {
		if g.dev == nil || g.lost != nil {
			continue
		}
		types, ret := g.dev.GetSupportedEventTypes()
		if ret == gonvml.SUCCESS && types&gonvml.EventTypeXidCriticalError == 0 {
			ret = gonvml.ERROR_NOT_SUPPORTED
		}
		if ret == gonvml.SUCCESS {
			ret = g.dev.RegisterEvents(gonvml.EventTypeXidCriticalError, set)
		}
		switch {
		case ret == gonvml.SUCCESS:
			g.xid = true
		case ret == gonvml.ERROR_NOT_SUPPORTED:
			g.unsupported |= FieldXID
		case s.isLost(g, "RegisterEvents", ret):
		default:
			g.pending = append(g.pending, fmt.Sprintf("RegisterEvents: %v", ret))
		}
	}
	for _, g := range s.gpus {
		if g.xid {
			s.events = set
			return
		}
	}
	set.Free()
}

// Sample reads every GPU's figures, after the XID events queued since the
// previous Sample. A GPU found lost (ERROR_GPU_IS_LOST from any call, or
// XID 79) gets a Sample with Lost set and is asked nothing more; Lost
// lists it from then on. After Close it returns ErrClosed.
func (s *Sampler) Sample() ([]Sample, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, ErrClosed
	}
	evErr := s.readEvents()
	out := make([]Sample, len(s.gpus))
	for i, g := range s.gpus {
		out[i] = s.sample(g)
		if evErr != "" && g.xid && g.lost == nil {
			out[i].Errors = append(out[i].Errors, evErr)
		}
	}
	return out, nil
}

// readEvents reads the queued XID events without waiting (a timeout of 0)
// into their GPUs' xids, marking lost a GPU that reported XID 79. It
// returns the error that stopped it, if other than "no more events".
func (s *Sampler) readEvents() string {
	if s.events == nil {
		return ""
	}
	for range maxEvents {
		ev, ret := s.events.Wait(0)
		switch ret {
		case gonvml.SUCCESS:
		case gonvml.ERROR_TIMEOUT:
			return ""
		case gonvml.ERROR_GPU_IS_LOST:
			// NVML names the lost GPU in the event's device.
			if g := s.gpuOf(ev.Device); g != nil {
				s.isLost(g, "EventSetWait", ret)
			}
			return ""
		default:
			return fmt.Sprintf("EventSetWait: %v", ret)
		}
		g := s.gpuOf(ev.Device)
		if g == nil || ev.EventType&gonvml.EventTypeXidCriticalError == 0 {
			continue
		}
		g.xids = append(g.xids, ev.EventData)
		if ev.EventData == XIDFallenOffBus {
			s.markLost(g, &LostError{Reason: "XID 79 (fallen off the bus)", XID: XIDFallenOffBus})
		}
	}
	return ""
}

// gpuOf is the GPU of an event's device: the one whose handle it is, else
// the one of its UUID; nil when none.
func (s *Sampler) gpuOf(d gonvml.Device) *gpuState {
	if d == nil {
		return nil
	}
	for _, g := range s.gpus {
		if g.dev != nil && g.dev == d {
			return g
		}
	}
	uuid, ret := d.GetUUID()
	if ret != gonvml.SUCCESS || uuid == "" {
		return nil
	}
	for _, g := range s.gpus {
		if g.uuid == uuid {
			return g
		}
	}
	return nil
}

// sample is one GPU's Sample, its figures read unless it is lost.
func (s *Sampler) sample(g *gpuState) Sample {
	out := Sample{Index: g.index, UUID: g.uuid, PCIBusID: g.bus, XIDs: g.xids, Errors: g.pending}
	g.xids, g.pending = nil, nil
	switch {
	case g.lost != nil:
	case g.dev == nil:
		out.Errors = append(out.Errors, g.handleErr)
	default:
		s.read(g, &out)
	}
	if g.xid {
		out.Valid |= FieldXID
	}
	out.Unsupported = g.unsupported
	if g.lost != nil {
		// A GPU lost midway keeps no figure of this round.
		out = Sample{Index: out.Index, UUID: out.UUID, PCIBusID: out.PCIBusID, Valid: out.Valid & FieldXID,
			Unsupported: out.Unsupported, XIDs: out.XIDs, Errors: out.Errors}
		lost := *g.lost
		out.Lost = &lost
	}
	return out
}

// read reads g's figures into out, each field whose calls all succeed
// into out.Valid, stopping when the GPU turns out lost.
func (s *Sampler) read(g *gpuState, out *Sample) {
	d := g.dev
	// want reports whether field f is to be read.
	want := func(f Fields) bool { return g.lost == nil && g.unsupported&f == 0 }
	// ok sorts a call's answer: true on SUCCESS; NOT_SUPPORTED marks f
	// unsupported, GPU_IS_LOST the GPU lost; another error is named in
	// out.Errors.
	ok := func(f Fields, call string, ret gonvml.Return) bool {
		switch {
		case ret == gonvml.SUCCESS:
			return true
		case ret == gonvml.ERROR_NOT_SUPPORTED:
			g.unsupported |= f
		case s.isLost(g, call, ret):
		default:
			out.Errors = append(out.Errors, fmt.Sprintf("%s: %v", call, ret))
		}
		return false
	}
	if want(FieldUtilization) {
		if u, ret := d.GetUtilizationRates(); ok(FieldUtilization, "GetUtilizationRates", ret) {
			out.UtilizationGPU, out.UtilizationMemory = u.Gpu, u.Memory
			out.Valid |= FieldUtilization
		}
	}
	if want(FieldMemory) {
		if m, ret := d.GetMemoryInfo(); ok(FieldMemory, "GetMemoryInfo", ret) {
			out.MemoryUsed, out.MemoryTotal = m.Used, m.Total
			out.Valid |= FieldMemory
		}
	}
	if want(FieldTemperature) {
		if t, ret := d.GetTemperature(gonvml.TEMPERATURE_GPU); ok(FieldTemperature, "GetTemperature", ret) {
			out.Temperature = t
			out.Valid |= FieldTemperature
		}
	}
	if want(FieldPower) {
		if p, ret := d.GetPowerUsage(); ok(FieldPower, "GetPowerUsage", ret) {
			out.PowerMilliwatts = p
			out.Valid |= FieldPower
		}
	}
	if want(FieldPCIe) {
		if tx, ret := d.GetPcieThroughput(gonvml.PCIE_UTIL_TX_BYTES); ok(FieldPCIe, "GetPcieThroughput(TX)", ret) {
			if rx, ret := d.GetPcieThroughput(gonvml.PCIE_UTIL_RX_BYTES); ok(FieldPCIe, "GetPcieThroughput(RX)", ret) {
				out.PCIeTxBytesPerSecond, out.PCIeRxBytesPerSecond = uint64(tx)<<10, uint64(rx)<<10
				out.Valid |= FieldPCIe
			}
		}
	}
	if want(FieldNVLink) {
		// A scope of UINT_MAX sums the counter over the GPU's links.
		v := []gonvml.FieldValue{
			{FieldId: gonvml.FI_DEV_NVLINK_THROUGHPUT_DATA_TX, ScopeId: math.MaxUint32},
			{FieldId: gonvml.FI_DEV_NVLINK_THROUGHPUT_DATA_RX, ScopeId: math.MaxUint32},
		}
		if ok(FieldNVLink, "GetFieldValues(NVLink)", d.GetFieldValues(v)) {
			tx, txRet := fieldUint(v[0])
			rx, rxRet := fieldUint(v[1])
			if ok(FieldNVLink, "GetFieldValues(NVLINK_THROUGHPUT_DATA_TX)", txRet) &&
				ok(FieldNVLink, "GetFieldValues(NVLINK_THROUGHPUT_DATA_RX)", rxRet) {
				out.NVLinkTxBytes, out.NVLinkRxBytes = tx<<10, rx<<10
				out.Valid |= FieldNVLink
			}
		}
	}
	if want(FieldECC) {
		if c, ret := d.GetTotalEccErrors(gonvml.MEMORY_ERROR_TYPE_CORRECTED, gonvml.VOLATILE_ECC); ok(FieldECC, "GetTotalEccErrors(corrected)", ret) {
			if u, ret := d.GetTotalEccErrors(gonvml.MEMORY_ERROR_TYPE_UNCORRECTED, gonvml.VOLATILE_ECC); ok(FieldECC, "GetTotalEccErrors(uncorrected)", ret) {
				out.ECCCorrected, out.ECCUncorrected = c, u
				out.Valid |= FieldECC
			}
		}
	}
}

// fieldUint is a field value's number, or its own error.
func fieldUint(v gonvml.FieldValue) (uint64, gonvml.Return) {
	if ret := gonvml.Return(v.NvmlReturn); ret != gonvml.SUCCESS {
		return 0, ret
	}
	switch gonvml.ValueType(v.ValueType) {
	case gonvml.VALUE_TYPE_UNSIGNED_LONG_LONG, gonvml.VALUE_TYPE_UNSIGNED_LONG, gonvml.VALUE_TYPE_SIGNED_LONG_LONG:
		return binary.NativeEndian.Uint64(v.Value[:]), gonvml.SUCCESS
	case gonvml.VALUE_TYPE_UNSIGNED_INT, gonvml.VALUE_TYPE_SIGNED_INT:
		return uint64(binary.NativeEndian.Uint32(v.Value[:])), gonvml.SUCCESS
	case gonvml.VALUE_TYPE_UNSIGNED_SHORT:
		return uint64(binary.NativeEndian.Uint16(v.Value[:])), gonvml.SUCCESS
	case gonvml.VALUE_TYPE_DOUBLE:
		return uint64(math.Float64frombits(binary.NativeEndian.Uint64(v.Value[:]))), gonvml.SUCCESS
	}
	return 0, gonvml.ERROR_UNKNOWN
}

// isLost marks g lost if ret is ERROR_GPU_IS_LOST, and reports whether it
// was.
func (s *Sampler) isLost(g *gpuState, call string, ret gonvml.Return) bool {
	if ret != gonvml.ERROR_GPU_IS_LOST {
		return false
	}
	s.markLost(g, &LostError{Reason: fmt.Sprintf("%s: %v", call, ret), Err: ret})
	return true
}

// markLost records g as lost (the first time only), for its Samples and
// for Lost. e's identity fields are filled from g.
func (s *Sampler) markLost(g *gpuState, e *LostError) {
	if g.lost != nil {
		return
	}
	e.Index, e.UUID, e.PCIBusID = g.index, g.uuid, g.bus
	g.lost = e
	s.lostMu.Lock()
	s.lost = append(s.lost, *e)
	s.lostMu.Unlock()
}

// Lost returns the GPUs found lost so far (by OpenSampler or a Sample),
// in the order found; nil when none. A lost GPU stays lost for the
// Sampler's life. It does not call NVML.
func (s *Sampler) Lost() []LostError {
	s.lostMu.Lock()
	defer s.lostMu.Unlock()
	if len(s.lost) == 0 {
		return nil
	}
	return append([]LostError(nil), s.lost...)
}

// Close frees the event set and shuts NVML down (unloading the library
// unless Discover or another Sampler holds it). Later calls do nothing;
// Sample returns ErrClosed after it.
func (s *Sampler) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	if s.events != nil {
		s.events.Free()
		s.events = nil
	}
	if ret := s.lib.Shutdown(); ret != gonvml.SUCCESS {
		return fmt.Errorf("nvml: nvmlShutdown: %w", ret)
	}
	return nil
}
