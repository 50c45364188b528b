//go:build cgo

package nvml

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"reflect"
	"strings"
	"sync"
	"testing"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh100"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
)

// node is go-nvml's mock of a DGX H100 (eight H100 SXM5 80GB) with the
// calls the sampler makes filled in: GPU i answers figures made from i
// (figures), and an event set whose Wait hands out queued events.
type node struct {
	*server.Server
	t    *testing.T
	devs []*server.Device
	set  *mock.EventSet

	// mu guards events, the XID events Wait hands out, oldest first.
	mu     sync.Mutex
	events []gonvml.EventData
}

// figures is the Sample GPU i of a node gives, every figure valid.
func figures(i int, d *server.Device) Sample {
	return Sample{
		Index: i, UUID: d.UUID, PCIBusID: d.PciBusID,
		Valid:          AllFields,
		UtilizationGPU: uint32(10 + i), UtilizationMemory: uint32(5 + i),
		MemoryUsed: uint64(1+i) << 30, MemoryTotal: 80 << 30,
		Temperature: uint32(30 + i), PowerMilliwatts: uint32(100000 + 1000*i),
		PCIeTxBytesPerSecond: uint64(100+i) << 10, PCIeRxBytesPerSecond: uint64(200+i) << 10,
		NVLinkTxBytes: uint64(1<<40+i) << 10, NVLinkRxBytes: uint64(2<<40+i) << 10,
		ECCCorrected: uint64(i), ECCUncorrected: uint64(i % 2),
	}
}

func newNode(t *testing.T) *node {
	n := &node{Server: dgxh100.New(), t: t}
	n.set = &mock.EventSet{
		WaitFunc: func(timeout uint32) (gonvml.EventData, gonvml.Return) {
			if timeout != 0 {
				t.Errorf("EventSet.Wait(%d): the sampler must not wait", timeout)
			}
			n.mu.Lock()
			defer n.mu.Unlock()
			if len(n.events) == 0 {
				return gonvml.EventData{}, gonvml.ERROR_TIMEOUT
			}
			ev := n.events[0]
			n.events = n.events[1:]
			return ev, gonvml.SUCCESS
		},
		FreeFunc: func() gonvml.Return { return gonvml.SUCCESS },
	}
	n.EventSetCreateFunc = func() (gonvml.EventSet, gonvml.Return) { return n.set, gonvml.SUCCESS }
	for i, d := range n.Devices {
		d := d.(*server.Device)
		n.devs = append(n.devs, d)
		d.MemoryInfo.Used = uint64(1+i) << 30
		d.MemoryInfo.Free = d.MemoryInfo.Total - d.MemoryInfo.Used
		want := figures(i, d)
		d.GetPciInfoFunc = func() (gonvml.PciInfo, gonvml.Return) { return pciInfo("0000" + d.PciBusID), gonvml.SUCCESS }
		d.GetUtilizationRatesFunc = func() (gonvml.Utilization, gonvml.Return) {
			return gonvml.Utilization{Gpu: want.UtilizationGPU, Memory: want.UtilizationMemory}, gonvml.SUCCESS
		}
		d.GetTemperatureFunc = func(s gonvml.TemperatureSensors) (uint32, gonvml.Return) {
			if s != gonvml.TEMPERATURE_GPU {
				return 0, gonvml.ERROR_INVALID_ARGUMENT
			}
			return want.Temperature, gonvml.SUCCESS
		}
		d.GetPowerUsageFunc = func() (uint32, gonvml.Return) { return want.PowerMilliwatts, gonvml.SUCCESS }
		d.GetPcieThroughputFunc = func(c gonvml.PcieUtilCounter) (uint32, gonvml.Return) {
			switch c {
			case gonvml.PCIE_UTIL_TX_BYTES:
				return uint32(want.PCIeTxBytesPerSecond >> 10), gonvml.SUCCESS
			case gonvml.PCIE_UTIL_RX_BYTES:
				return uint32(want.PCIeRxBytesPerSecond >> 10), gonvml.SUCCESS
			}
			return 0, gonvml.ERROR_INVALID_ARGUMENT
		}
		d.GetFieldValuesFunc = func(v []gonvml.FieldValue) gonvml.Return {
			for k := range v {
				var x uint64
				switch {
				case v[k].ScopeId != math.MaxUint32:
					v[k].NvmlReturn = uint32(gonvml.ERROR_INVALID_ARGUMENT)
					continue
				case v[k].FieldId == gonvml.FI_DEV_NVLINK_THROUGHPUT_DATA_TX:
					x = want.NVLinkTxBytes >> 10
				case v[k].FieldId == gonvml.FI_DEV_NVLINK_THROUGHPUT_DATA_RX:
					x = want.NVLinkRxBytes >> 10
				default:
					v[k].NvmlReturn = uint32(gonvml.ERROR_NOT_SUPPORTED)
					continue
				}
				v[k].NvmlReturn = uint32(gonvml.SUCCESS)
				v[k].ValueType = uint32(gonvml.VALUE_TYPE_UNSIGNED_LONG_LONG)
				binary.NativeEndian.PutUint64(v[k].Value[:], x)
			}
			return gonvml.SUCCESS
		}
		d.GetTotalEccErrorsFunc = func(e gonvml.MemoryErrorType, c gonvml.EccCounterType) (uint64, gonvml.Return) {
			switch {
			case c != gonvml.VOLATILE_ECC:
				return 0, gonvml.ERROR_INVALID_ARGUMENT
			case e == gonvml.MEMORY_ERROR_TYPE_CORRECTED:
				return want.ECCCorrected, gonvml.SUCCESS
			case e == gonvml.MEMORY_ERROR_TYPE_UNCORRECTED:
				return want.ECCUncorrected, gonvml.SUCCESS
			}
			return 0, gonvml.ERROR_INVALID_ARGUMENT
		}
		d.GetSupportedEventTypesFunc = func() (uint64, gonvml.Return) {
			return gonvml.EventTypeXidCriticalError | gonvml.EventTypeSingleBitEccError, gonvml.SUCCESS
		}
		d.RegisterEventsFunc = func(types uint64, set gonvml.EventSet) gonvml.Return {
			if types != gonvml.EventTypeXidCriticalError || set != n.set {
				t.Errorf("GPU %d: RegisterEvents(%#x, %v), want XID critical errors in the sampler's set", i, types, set)
			}
			return gonvml.SUCCESS
		}
	}
	return n
}

// xid queues an XID event for device d.
func (n *node) xid(d gonvml.Device, xid uint64) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.events = append(n.events, gonvml.EventData{Device: d, EventType: gonvml.EventTypeXidCriticalError, EventData: xid,
		GpuInstanceId: math.MaxUint32, ComputeInstanceId: math.MaxUint32})
}

// open opens a Sampler on n, closed at the test's end.
func (n *node) open() *Sampler {
	n.t.Helper()
	s, err := openSampler(n)
	if err != nil {
		n.t.Fatal(err)
	}
	n.t.Cleanup(func() { s.Close() })
	return s
}

// sample is s.Sample, which must not fail.
func sample(t *testing.T, s *Sampler) []Sample {
	t.Helper()
	got, err := s.Sample()
	if err != nil {
		t.Fatal(err)
	}
	return got
}

func TestSample(t *testing.T) {
	n := newNode(t)
	s := n.open()
	for round := range 2 {
		got := sample(t, s)
		if len(got) != 8 {
			t.Fatalf("%d samples of 8 GPUs", len(got))
		}
		for i, d := range n.devs {
			if want := figures(i, d); !reflect.DeepEqual(got[i], want) {
				t.Errorf("round %d, GPU %d:\n got %+v\nwant %+v", round, i, got[i], want)
			}
		}
	}
	if lost := s.Lost(); lost != nil {
		t.Errorf("Lost() = %v on a healthy node", lost)
	}
	if n := len(n.EventSetCreateCalls()); n != 1 {
		t.Errorf("EventSetCreate called %d times, want once", n)
	}
}

// TestSampleLost: a GPU for which any call answers ERROR_GPU_IS_LOST, from
// OpenSampler's to the event set's, is lost: its Sample says why and has
// no figure, Lost lists it, and NVML is asked nothing more about it. The
// other GPUs are sampled as ever.
func TestSampleLost(t *testing.T) {
	lost := gonvml.ERROR_GPU_IS_LOST
	tests := []struct {
		call   string
		break_ func(n *node, d *server.Device)
	}{
		{"DeviceGetHandleByIndex", func(n *node, d *server.Device) {
			next := n.DeviceGetHandleByIndexFunc
			n.DeviceGetHandleByIndexFunc = func(i int) (gonvml.Device, gonvml.Return) {
				if i == d.Index {
					return nil, lost
				}
				return next(i)
			}
		}},
		{"GetUUID", func(n *node, d *server.Device) {
			d.GetUUIDFunc = func() (string, gonvml.Return) { return "", lost }
		}},
		{"RegisterEvents", func(n *node, d *server.Device) {
			d.RegisterEventsFunc = func(uint64, gonvml.EventSet) gonvml.Return { return lost }
		}},
		{"GetUtilizationRates", func(n *node, d *server.Device) {
			d.GetUtilizationRatesFunc = func() (gonvml.Utilization, gonvml.Return) { return gonvml.Utilization{}, lost }
		}},
		{"GetPowerUsage", func(n *node, d *server.Device) {
			d.GetPowerUsageFunc = func() (uint32, gonvml.Return) { return 0, lost }
		}},
		{"GetPcieThroughput(RX)", func(n *node, d *server.Device) {
			next := d.GetPcieThroughputFunc
			d.GetPcieThroughputFunc = func(c gonvml.PcieUtilCounter) (uint32, gonvml.Return) {
				if c == gonvml.PCIE_UTIL_RX_BYTES {
					return 0, lost
				}
				return next(c)
			}
		}},
		{"GetFieldValues(NVLINK_THROUGHPUT_DATA_TX)", func(n *node, d *server.Device) {
			d.GetFieldValuesFunc = func(v []gonvml.FieldValue) gonvml.Return {
				for k := range v {
					v[k].NvmlReturn = uint32(lost)
				}
				return gonvml.SUCCESS
			}
		}},
		{"GetTotalEccErrors(corrected)", func(n *node, d *server.Device) {
			d.GetTotalEccErrorsFunc = func(gonvml.MemoryErrorType, gonvml.EccCounterType) (uint64, gonvml.Return) { return 0, lost }
		}},
		{"EventSetWait", func(n *node, d *server.Device) {
			wait := n.set.WaitFunc
			once := true
			n.set.WaitFunc = func(timeout uint32) (gonvml.EventData, gonvml.Return) {
				if once {
					once = false
					return gonvml.EventData{Device: d}, lost
				}
				return wait(timeout)
			}
		}},
	}
	for _, tc := range tests {
		t.Run(tc.call, func(t *testing.T) {
			n := newNode(t)
			d := n.devs[5]
			tc.break_(n, d)
			s := n.open()
			got := sample(t, s)
			g := got[5]
			if g.Lost == nil {
				t.Fatalf("GPU 5 not lost: %+v", g)
			}
			e := g.Lost
			wantReason := fmt.Sprintf("%s: %v", tc.call, lost)
			if e.Index != 5 || e.Reason != wantReason || e.XID != 0 || !errors.Is(e, ErrGPULost) || !errors.Is(e, gonvml.ERROR_GPU_IS_LOST) || !IsLost(e) {
				t.Errorf("LostError %+v, want GPU 5, reason %q, ErrGPULost and NVML's error", *e, wantReason)
			}
			if tc.call != "DeviceGetHandleByIndex" && tc.call != "GetUUID" && e.UUID != d.UUID {
				t.Errorf("LostError UUID %q, want %q", e.UUID, d.UUID)
			}
			if g.Valid&^FieldXID != 0 || g.UtilizationGPU != 0 || g.MemoryTotal != 0 {
				t.Errorf("lost GPU 5 has figures: %+v", g)
			}
			if lost := s.Lost(); len(lost) != 1 || lost[0].Index != 5 || lost[0].Reason != wantReason {
				t.Errorf("Lost() = %+v, want GPU 5 only", lost)
			}
			for i, d := range n.devs {
				if want := figures(i, d); i != 5 && !reflect.DeepEqual(got[i], want) {
					t.Errorf("GPU %d beside the lost one:\n got %+v\nwant %+v", i, got[i], want)
				}
			}
			// Asked nothing more: the next round calls none of its
			// figures' functions.
			calls := len(d.GetUtilizationRatesCalls()) + len(d.GetPowerUsageCalls()) + len(d.GetTotalEccErrorsCalls())
			got = sample(t, s)
			if got[5].Lost == nil || got[5].Lost.Reason != wantReason {
				t.Errorf("GPU 5 in the next round: %+v", got[5])
			}
			if c := len(d.GetUtilizationRatesCalls()) + len(d.GetPowerUsageCalls()) + len(d.GetTotalEccErrorsCalls()); c != calls {
				t.Errorf("the lost GPU was asked %d more calls", c-calls)
			}
		})
	}
}

// TestSampleXID: XID events are read without waiting and given to their
// GPU's Sample, once; XID 79 makes its GPU lost, another XID does not. An
// event whose device is not one of the handles is matched by UUID.
func TestSampleXID(t *testing.T) {
	n := newNode(t)
	s := n.open()
	n.xid(n.devs[2], 48) // a double-bit ECC error: counted, not lost
	n.xid(n.devs[3], 13)
	n.xid(n.devs[3], XIDFallenOffBus)
	n.xid(&mock.Device{GetUUIDFunc: func() (string, gonvml.Return) { return n.devs[6].UUID, gonvml.SUCCESS }}, 31)
	n.xid(nil, 79) // no device: dropped
	got := sample(t, s)
	for i, want := range map[int][]uint64{2: {48}, 3: {13, 79}, 6: {31}} {
		if !reflect.DeepEqual(got[i].XIDs, want) {
			t.Errorf("GPU %d XIDs %v, want %v", i, got[i].XIDs, want)
		}
	}
	if got[2].Lost != nil || got[6].Lost != nil || got[0].XIDs != nil {
		t.Errorf("GPUs 2, 6 and 0: %+v, %+v, %+v", got[2], got[6], got[0])
	}
	e := got[3].Lost
	if e == nil || e.XID != 79 || e.Err != nil || !IsLost(e) || e.UUID != n.devs[3].UUID || e.PCIBusID != n.devs[3].PciBusID ||
		!strings.Contains(e.Error(), "GPU 3 ("+n.devs[3].UUID+", "+n.devs[3].PciBusID+") is lost: XID 79") {
		t.Errorf("GPU 3 after XID 79: %+v (%v)", e, e)
	}
	if lost := s.Lost(); len(lost) != 1 || lost[0].Index != 3 {
		t.Errorf("Lost() = %+v", lost)
	}
	got = sample(t, s)
	for i := range got {
		if len(got[i].XIDs) != 0 {
			t.Errorf("GPU %d's XIDs given twice: %v", i, got[i].XIDs)
		}
	}
	if got[3].Lost == nil {
		t.Error("GPU 3 no longer lost")
	}
}

// TestSampleUnsupported: figures NVML does not support on a GPU are left
// out and named in Unsupported, asked once and not again; the rest are
// read.
func TestSampleUnsupported(t *testing.T) {
	n := newNode(t)
	d := n.devs[1]
	ns := gonvml.ERROR_NOT_SUPPORTED
	d.GetPcieThroughputFunc = func(gonvml.PcieUtilCounter) (uint32, gonvml.Return) { return 0, ns }
	d.GetTotalEccErrorsFunc = func(gonvml.MemoryErrorType, gonvml.EccCounterType) (uint64, gonvml.Return) { return 0, ns }
	d.GetPowerUsageFunc = func() (uint32, gonvml.Return) { return 0, ns }
	d.GetFieldValuesFunc = func(v []gonvml.FieldValue) gonvml.Return { // a GPU without NVLink
		for k := range v {
			v[k].NvmlReturn = uint32(ns)
		}
		return gonvml.SUCCESS
	}
	d.GetSupportedEventTypesFunc = func() (uint64, gonvml.Return) { return gonvml.EventTypeSingleBitEccError, gonvml.SUCCESS }
	n.devs[2].RegisterEventsFunc = func(uint64, gonvml.EventSet) gonvml.Return { return ns }
	s := n.open()
	for range 2 {
		got := sample(t, s)
		g := got[1]
		unsupported := FieldPCIe | FieldECC | FieldPower | FieldNVLink | FieldXID
		want := figures(1, d)
		want.Valid &^= unsupported
		want.Unsupported = unsupported
		want.PCIeTxBytesPerSecond, want.PCIeRxBytesPerSecond, want.ECCCorrected, want.ECCUncorrected = 0, 0, 0, 0
		want.PowerMilliwatts, want.NVLinkTxBytes, want.NVLinkRxBytes = 0, 0, 0
		if !reflect.DeepEqual(g, want) {
			t.Errorf("GPU 1:\n got %+v\nwant %+v", g, want)
		}
		if g := got[2]; g.Unsupported != FieldXID || g.Valid != figures(2, n.devs[2]).Valid&^FieldXID {
			t.Errorf("GPU 2 without XID events: valid %v, unsupported %v", g.Valid, g.Unsupported)
		}
	}
	for call, c := range map[string]int{
		"GetPcieThroughput": len(d.GetPcieThroughputCalls()), "GetTotalEccErrors": len(d.GetTotalEccErrorsCalls()),
		"GetPowerUsage": len(d.GetPowerUsageCalls()), "GetFieldValues": len(d.GetFieldValuesCalls()),
		"RegisterEvents": len(d.RegisterEventsCalls()),
	} {
		if c > 1 {
			t.Errorf("%s called %d times on a GPU that does not support it, want at most once", call, c)
		}
	}
}

// TestSampleMissingSymbols: where the library lacks a function the
// sampler would call, it is not called (go-nvml would abort the process)
// and its figures are unsupported.
func TestSampleMissingSymbols(t *testing.T) {
	n := newNode(t)
	missing := map[string]bool{"nvmlDeviceGetFieldValues": true, "nvmlDeviceGetPcieThroughput": true, "nvmlEventSetWait_v2": true, "nvmlEventSetWait": true}
	n.LookupSymbolFunc = func(sym string) error {
		if missing[sym] {
			return errors.New("undefined symbol: " + sym)
		}
		return nil
	}
	n.EventSetCreateFunc = nil // panics if called
	for _, d := range n.devs {
		d.GetFieldValuesFunc, d.GetPcieThroughputFunc, d.RegisterEventsFunc = nil, nil, nil
	}
	s := n.open()
	for i, g := range sample(t, s) {
		if g.Unsupported != FieldNVLink|FieldPCIe|FieldXID || g.Valid != FieldUtilization|FieldMemory|FieldTemperature|FieldPower|FieldECC {
			t.Errorf("GPU %d: valid %v, unsupported %v", i, g.Valid, g.Unsupported)
		}
	}
}

// TestSampleErrors: a call failing otherwise is named in that round's
// Errors, its figure left out and asked again the next round; a GPU
// without a handle says why each round.
func TestSampleErrors(t *testing.T) {
	n := newNode(t)
	fail := true
	n.devs[4].GetTemperatureFunc = func(gonvml.TemperatureSensors) (uint32, gonvml.Return) {
		if fail {
			return 0, gonvml.ERROR_NO_PERMISSION
		}
		return 77, gonvml.SUCCESS
	}
	next := n.DeviceGetHandleByIndexFunc
	n.DeviceGetHandleByIndexFunc = func(i int) (gonvml.Device, gonvml.Return) {
		if i == 7 {
			return nil, gonvml.ERROR_UNKNOWN
		}
		return next(i)
	}
	n.devs[0].GetUUIDFunc = func() (string, gonvml.Return) { return "", gonvml.ERROR_UNKNOWN }
	s := n.open()
	got := sample(t, s)
	if g := got[4]; g.Valid.Has(FieldTemperature) || g.Unsupported != 0 || !reflect.DeepEqual(g.Errors, []string{"GetTemperature: " + gonvml.ERROR_NO_PERMISSION.Error()}) {
		t.Errorf("GPU 4: %+v", g)
	}
	if g := got[7]; g.Valid != 0 || !reflect.DeepEqual(g.Errors, []string{"DeviceGetHandleByIndex: " + gonvml.ERROR_UNKNOWN.Error()}) || g.Lost != nil {
		t.Errorf("GPU 7 without a handle: %+v", g)
	}
	if g := got[0]; g.UUID != "" || !reflect.DeepEqual(g.Errors, []string{"GetUUID: " + gonvml.ERROR_UNKNOWN.Error()}) || !g.Valid.Has(FieldMemory) {
		t.Errorf("GPU 0 without a UUID: %+v", g)
	}
	fail = false
	got = sample(t, s)
	if g := got[4]; !g.Valid.Has(FieldTemperature) || g.Temperature != 77 || g.Errors != nil {
		t.Errorf("GPU 4 the next round: %+v", g)
	}
	if g := got[0]; g.Errors != nil { // OpenSampler's errors are given once
		t.Errorf("GPU 0 the next round: %+v", g)
	}
	if len(got[7].Errors) != 1 {
		t.Errorf("GPU 7 the next round: %+v", got[7])
	}
	// An event set that fails is named for the GPUs registered.
	n.set.WaitFunc = func(uint32) (gonvml.EventData, gonvml.Return) { return gonvml.EventData{}, gonvml.ERROR_UNKNOWN }
	got = sample(t, s)
	if e := got[1].Errors; len(e) != 1 || !strings.HasPrefix(e[0], "EventSetWait: ") {
		t.Errorf("GPU 1 when EventSetWait fails: errors %q", e)
	}
}

// TestOpenSamplerFails: NVML that does not start, or cannot count its
// GPUs, is an error naming the call; in the second case NVML is shut down.
func TestOpenSamplerFails(t *testing.T) {
	lib := &mock.Interface{InitFunc: func() gonvml.Return { return gonvml.ERROR_DRIVER_NOT_LOADED }}
	if _, err := openSampler(lib); !errors.Is(err, gonvml.ERROR_DRIVER_NOT_LOADED) || !strings.Contains(err.Error(), "nvmlInit") {
		t.Errorf("init failing: %v", err)
	}
	lib = &mock.Interface{
		InitFunc:           func() gonvml.Return { return gonvml.SUCCESS },
		ShutdownFunc:       func() gonvml.Return { return gonvml.SUCCESS },
		DeviceGetCountFunc: func() (int, gonvml.Return) { return 0, gonvml.ERROR_UNKNOWN },
	}
	if _, err := openSampler(lib); !errors.Is(err, gonvml.ERROR_UNKNOWN) || !strings.Contains(err.Error(), "DeviceGetCount") {
		t.Errorf("count failing: %v", err)
	}
	if n := len(lib.ShutdownCalls()); n != 1 {
		t.Errorf("Shutdown called %d times, want once", n)
	}
}

// TestSamplerClose: Close frees the event set and shuts NVML down once;
// Sample then fails with ErrClosed and calls nothing.
func TestSamplerClose(t *testing.T) {
	n := newNode(t)
	s, err := openSampler(n)
	if err != nil {
		t.Fatal(err)
	}
	sample(t, s)
	for range 2 {
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
	}
	if len(n.ShutdownCalls()) != 1 || len(n.set.FreeCalls()) != 1 {
		t.Errorf("Shutdown called %d times, Free %d; want once each", len(n.ShutdownCalls()), len(n.set.FreeCalls()))
	}
	calls := len(n.devs[0].GetUtilizationRatesCalls())
	if got, err := s.Sample(); err != ErrClosed || got != nil {
		t.Errorf("Sample after Close: %v, %v; want ErrClosed", got, err)
	}
	if len(n.devs[0].GetUtilizationRatesCalls()) != calls {
		t.Error("Sample after Close called NVML")
	}
}

// TestSamplerConcurrent: Sample and Lost from several goroutines (for the
// race detector), while XIDs arrive.
func TestSamplerConcurrent(t *testing.T) {
	n := newNode(t)
	s := n.open()
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(2)
		go func() {
			defer wg.Done()
			for range 20 {
				if _, err := s.Sample(); err != nil {
					t.Error(err)
				}
				n.xid(n.devs[g], XIDFallenOffBus)
			}
		}()
		go func() {
			defer wg.Done()
			for range 20 {
				for _, e := range s.Lost() {
					if e.XID != XIDFallenOffBus {
						t.Errorf("lost: %+v", e)
					}
				}
			}
		}()
	}
	wg.Wait()
	sample(t, s)
	if lost := s.Lost(); len(lost) != 4 {
		t.Errorf("%d GPUs lost, want 4: %+v", len(lost), lost)
	}
}

func TestFields(t *testing.T) {
	tests := []struct {
		f    Fields
		want string
	}{
		{0, "none"},
		{FieldUtilization, "utilization"},
		{FieldNVLink | FieldECC | FieldXID, "nvlink|ecc|xid"},
	}
	for _, tc := range tests {
		if got := tc.f.String(); got != tc.want {
			t.Errorf("Fields(%#x).String() = %q, want %q", uint16(tc.f), got, tc.want)
		}
	}
	b, err := json.Marshal(Sample{Valid: FieldMemory | FieldPower, Lost: &LostError{Index: 1, Reason: "XID 79 (fallen off the bus)", XID: 79}})
	if err != nil {
		t.Fatal(err)
	}
	if s := string(b); !strings.Contains(s, `"valid":"memory|power"`) || !strings.Contains(s, `"lost":{"index":1,"reason":"XID 79 (fallen off the bus)","xid":79}`) {
		t.Errorf("JSON %s", b)
	}
	if AllFields.String() != strings.Join(fieldNames[:], "|") {
		t.Errorf("AllFields = %v", AllFields)
	}
}

func TestLostError(t *testing.T) {
	tests := []struct {
		e    LostError
		want string
	}{
		{LostError{Index: 2, UUID: "GPU-aaaa", PCIBusID: "0000:3b:00.0", Reason: "XID 79 (fallen off the bus)", XID: 79},
			"nvml: GPU 2 (GPU-aaaa, 0000:3b:00.0) is lost: XID 79 (fallen off the bus)"},
		{LostError{Index: 0, Reason: "DeviceGetHandleByIndex: x"}, "nvml: GPU 0 is lost: DeviceGetHandleByIndex: x"},
		{LostError{Index: 1, PCIBusID: "0000:5e:00.0", Reason: "r"}, "nvml: GPU 1 (0000:5e:00.0) is lost: r"},
	}
	for _, tc := range tests {
		if got := tc.e.Error(); got != tc.want {
			t.Errorf("Error() = %q, want %q", got, tc.want)
		}
	}
	err := fmt.Errorf("allreduce on GPU 2: %w", &tests[0].e)
	var le *LostError
	if !IsLost(err) || !errors.As(err, &le) || le.Index != 2 {
		t.Errorf("IsLost/As through a wrap: %v", err)
	}
	if IsLost(errors.New("other")) || IsLost(nil) {
		t.Error("IsLost of other errors")
	}
}
