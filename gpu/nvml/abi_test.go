//go:build cgo

package nvml

import (
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"testing"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/hvdd/hvdd/gpu/gputest"
)

// isolated runs the calling test in a child process of the test binary
// and reports false, unless this process is that child: true, run the
// test. A test that loads the stub library must not share its process
// with one that loads the real NVML: go-nvml's calls are bound once, to
// the first libnvidia-ml.so.1 the process resolves them in (the dynamic
// linker binds the executable's undefined symbols lazily, then keeps that
// library mapped for good), so the stub would answer for the real NVML in
// the tests that run after (TestDiscoverHere on a GPU machine), or the
// real NVML for the stub.
func isolated(t *testing.T) bool {
	t.Helper()
	const env = "HVDD_NVML_STUB_TEST"
	if os.Getenv(env) == t.Name() {
		return true
	}
	cmd := exec.Command(os.Args[0], "-test.run", "^"+regexp.QuoteMeta(t.Name())+"$", "-test.v", "-test.count=1")
	cmd.Env = append(os.Environ(), env+"="+t.Name())
	out, err := cmd.CombinedOutput()
	switch {
	case err != nil:
		t.Fatalf("%s in a child process: %v\n%s", t.Name(), err, out)
	case strings.Contains(string(out), "--- SKIP: "+t.Name()):
		t.Skipf("%s in a child process skipped:\n%s", t.Name(), out)
	case !strings.Contains(string(out), "--- PASS: "+t.Name()):
		t.Fatalf("%s in a child process did not pass:\n%s", t.Name(), out)
	}
	return false
}

// stubNVML builds testdata/stub.c into a shared library and points
// HVDD_NVML_LIBRARY at it, or skips without a C compiler (CI's set-up
// installs gcc).
func stubNVML(t *testing.T) {
	t.Helper()
	t.Setenv("HVDD_NVML_LIBRARY", gputest.SharedLib(t, "testdata/stub.c", "libnvidia-ml.so.1"))
}

// TestDiscoverThroughTheBinding runs Discover on the stub library: every
// call goes through go-nvml's cgo binding and dlopen, so the report shows
// that the symbols hvdd's calls reach, the argument widths and the layouts
// of nvmlPciInfo_t and nvmlMemory_t are nvml.h's (a wrong offset garbles a
// bus id or a size; a wrong enum width, the P2P answers).
func TestDiscoverThroughTheBinding(t *testing.T) {
	if !isolated(t) {
		return
	}
	stubNVML(t)
	for round := range 2 { // load, unload, and load again
		r, err := Discover()
		if err != nil {
			t.Fatal(err)
		}
		link := func(l int, active bool, remote string, gpu int) NVLink {
			if !active {
				return NVLink{Link: l, RemoteGPU: -1}
			}
			return NVLink{Link: l, Active: true, RemotePCIBusID: remote, RemoteGPU: gpu}
		}
		want := Report{
			Available: true, DriverVersion: "550.54.15", CUDAVersion: 12040,
			GPUs: []GPU{
				{Index: 0, UUID: "GPU-00000000-2222-3333-4444-555555555555", Name: "Stub H100 80GB HBM3", PCIBusID: "0000:3b:00.0",
					MemoryTotal: 80 << 30, MemoryUsed: 512 << 20, ComputeCapability: "9.0",
					NVLinks: []NVLink{link(0, true, "0000:5e:00.0", 1), link(1, true, "0000:5e:00.0", 1), link(2, false, "", -1)}},
				{Index: 1, UUID: "GPU-11111111-2222-3333-4444-555555555555", Name: "Stub H100 80GB HBM3", PCIBusID: "0000:5e:00.0",
					MemoryTotal: 80 << 30, MemoryUsed: 512<<20 + 1, ComputeCapability: "9.0",
					NVLinks: []NVLink{link(0, true, "0000:3b:00.0", 0), link(1, true, "0000:3b:00.0", 0), link(2, false, "", -1)}},
			},
			Pairs: []Pair{{A: 0, B: 1, Link: "NV2", Topology: "PXB", NVLinks: 2, P2PRead: "OK", P2PWrite: "DIS", P2PNVLink: "OK"}},
		}
		if !reflect.DeepEqual(r, want) {
			t.Errorf("round %d:\n got %+v\nwant %+v", round, r, want)
		}
	}
}

// TestInitFailsThroughTheBinding: nvmlInit's failure, as the C library
// returns it, becomes the CPU-only reason; a library that does not load is
// "no NVIDIA driver".
func TestInitFailsThroughTheBinding(t *testing.T) {
	if !isolated(t) {
		return
	}
	stubNVML(t)
	t.Setenv("STUB_NVML_INIT", strconv.Itoa(int(gonvml.ERROR_DRIVER_NOT_LOADED)))
	r, err := Discover()
	if err != nil || r.Available || r.Reason != initFailure(gonvml.ERROR_DRIVER_NOT_LOADED) {
		t.Errorf("init failing with DRIVER_NOT_LOADED: %+v, %v", r, err)
	}
	t.Setenv("HVDD_NVML_LIBRARY", filepath.Join(t.TempDir(), "absent", "libnvidia-ml.so.1"))
	r, err = Discover()
	if err != nil || r.Available || r.Reason != initFailure(gonvml.ERROR_LIBRARY_NOT_FOUND) {
		t.Errorf("no library: %+v, %v", r, err)
	}
	if _, err := OpenSampler(); err == nil {
		t.Error("OpenSampler without a library: no error")
	}
}

// TestCallsAfterShutdown: a device handle used after Shutdown answers
// UNINITIALIZED instead of calling into unmapped code. go-nvml unloads the
// library at the last Shutdown, but the dynamic linker keeps a library
// mapped once the executable has bound one of its symbols (go-nvml's calls
// are such bindings), so the call reaches the library, which refuses it.
// A second Shutdown is go-nvml's UNINITIALIZED.
func TestCallsAfterShutdown(t *testing.T) {
	if !isolated(t) {
		return
	}
	stubNVML(t)
	l := newLibrary()
	if ret := l.Init(); ret != gonvml.SUCCESS {
		t.Fatalf("Init: %v", ret)
	}
	d, ret := l.DeviceGetHandleByIndex(0)
	if ret != gonvml.SUCCESS {
		t.Fatalf("DeviceGetHandleByIndex: %v", ret)
	}
	if _, ret := l.DeviceGetHandleByIndex(2); ret != gonvml.ERROR_INVALID_ARGUMENT {
		t.Errorf("DeviceGetHandleByIndex(2) = %v, want the stub's INVALID_ARGUMENT", ret)
	}
	if ret := l.Shutdown(); ret != gonvml.SUCCESS {
		t.Fatalf("Shutdown: %v", ret)
	}
	if _, ret := d.GetUUID(); ret != gonvml.ERROR_UNINITIALIZED {
		t.Errorf("GetUUID after Shutdown = %v, want ERROR_UNINITIALIZED", ret)
	}
	if ret := l.Shutdown(); ret != gonvml.ERROR_UNINITIALIZED {
		t.Errorf("a second Shutdown = %v, want ERROR_UNINITIALIZED", ret)
	}
}

// TestSampleThroughTheBinding runs a Sampler on the stub library: the
// figures (the field values' 64-bit union read at the right width), the
// unsupported ones, an XID event read without waiting and attributed to
// its GPU through the device handle in nvmlEventData_t, and that GPU lost
// for XID 79. Discover, run while the Sampler holds NVML, shares the
// library and leaves it initialised.
func TestSampleThroughTheBinding(t *testing.T) {
	if !isolated(t) {
		return
	}
	stubNVML(t)
	t.Setenv("STUB_NVML_XID", "79")
	s, err := OpenSampler()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if r, err := Discover(); err != nil || len(r.GPUs) != 2 {
		t.Fatalf("Discover beside the Sampler: %v, %v", r.Summary(), err)
	}
	got, err := s.Sample()
	if err != nil {
		t.Fatal(err)
	}
	want0 := Sample{
		Index: 0, UUID: "GPU-00000000-2222-3333-4444-555555555555", PCIBusID: "0000:3b:00.0", Valid: AllFields,
		UtilizationGPU: 40, UtilizationMemory: 20, MemoryUsed: 512 << 20, MemoryTotal: 80 << 30,
		Temperature: 55, PowerMilliwatts: 350000, PCIeTxBytesPerSecond: 1000 << 10, PCIeRxBytesPerSecond: 2000 << 10,
		NVLinkTxBytes: 0x100000001 << 10, NVLinkRxBytes: 0x200000002 << 10, ECCCorrected: 3,
	}
	if len(got) != 2 || !reflect.DeepEqual(got[0], want0) {
		t.Fatalf("GPU 0:\n got %+v\nwant %+v", got, want0)
	}
	g1 := got[1]
	if g1.Lost == nil || g1.Lost.XID != XIDFallenOffBus || g1.Lost.UUID != "GPU-11111111-2222-3333-4444-555555555555" ||
		g1.Lost.PCIBusID != "0000:5e:00.0" || !reflect.DeepEqual(g1.XIDs, []uint64{79}) || g1.Valid != FieldXID {
		t.Errorf("GPU 1 after its XID 79: %+v (lost %+v)", g1, g1.Lost)
	}
	if lost := s.Lost(); len(lost) != 1 || lost[0].Index != 1 {
		t.Errorf("Lost() = %+v, want GPU 1", lost)
	}
	// The next round: GPU 0 as before, GPU 1 still lost, no XID again.
	got, _ = s.Sample()
	if !reflect.DeepEqual(got[0], want0) || got[1].Lost == nil || len(got[1].XIDs) != 0 {
		t.Errorf("second round: %+v", got)
	}
	if err := s.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
}

// TestSampleUnsupportedThroughTheBinding: without the XID, GPU 1 answers
// what it supports, and says which figures it does not.
func TestSampleUnsupportedThroughTheBinding(t *testing.T) {
	if !isolated(t) {
		return
	}
	stubNVML(t)
	s, err := OpenSampler()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	got, err := s.Sample()
	if err != nil {
		t.Fatal(err)
	}
	g1 := got[1]
	if g1.Lost != nil || g1.Unsupported != FieldNVLink|FieldECC || g1.Valid != FieldUtilization|FieldMemory|FieldTemperature|FieldPower|FieldPCIe|FieldXID ||
		g1.UtilizationGPU != 41 || g1.PowerMilliwatts != 350001 || len(g1.Errors) != 0 {
		t.Errorf("GPU 1: %+v", g1)
	}
}
