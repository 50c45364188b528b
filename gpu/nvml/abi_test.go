package nvml

import (
	"path/filepath"
	"reflect"
	"strconv"
	"testing"

	"github.com/hvdd/hvdd/gpu/gputest"
)

// stubNVML builds testdata/stub.c into a shared library and points
// HVDD_NVML_LIBRARY at it, or skips without a C compiler (CI's set-up
// installs gcc).
func stubNVML(t *testing.T) {
	t.Helper()
	t.Setenv("HVDD_NVML_LIBRARY", gputest.SharedLib(t, "testdata/stub.c", "libnvidia-ml.so.1"))
}

// TestDiscoverThroughTheBinding runs Discover on the stub library: every
// call goes through the purego binding, so the report shows the symbol
// names, the argument widths and the layouts of nvmlPciInfo_t and
// nvmlMemory_t are nvml.h's (a wrong offset garbles a bus id or a size;
// a wrong enum width, the P2P answers).
func TestDiscoverThroughTheBinding(t *testing.T) {
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
	stubNVML(t)
	t.Setenv("STUB_NVML_INIT", strconv.Itoa(int(ERROR_DRIVER_NOT_LOADED)))
	r, err := Discover()
	if err != nil || r.Available || r.Reason != initFailure(ERROR_DRIVER_NOT_LOADED) {
		t.Errorf("init failing with DRIVER_NOT_LOADED: %+v, %v", r, err)
	}
	t.Setenv("HVDD_NVML_LIBRARY", filepath.Join(t.TempDir(), "absent", "libnvidia-ml.so.1"))
	r, err = Discover()
	if err != nil || r.Available || r.Reason != initFailure(ERROR_LIBRARY_NOT_FOUND) {
		t.Errorf("no library: %+v, %v", r, err)
	}
}

// TestCallsAfterShutdown: a device handle used after Shutdown unloaded the
// library answers UNINITIALIZED instead of calling into unmapped code.
func TestCallsAfterShutdown(t *testing.T) {
	stubNVML(t)
	l := newLibrary()
	if ret := l.Init(); ret != SUCCESS {
		t.Fatalf("Init: %v", ret)
	}
	d, ret := l.DeviceGetHandleByIndex(0)
	if ret != SUCCESS {
		t.Fatalf("DeviceGetHandleByIndex: %v", ret)
	}
	if _, ret := l.DeviceGetHandleByIndex(2); ret != ERROR_INVALID_ARGUMENT {
		t.Errorf("DeviceGetHandleByIndex(2) = %v, want the stub's INVALID_ARGUMENT", ret)
	}
	if ret := l.Shutdown(); ret != SUCCESS {
		t.Fatalf("Shutdown: %v", ret)
	}
	if _, ret := d.GetUUID(); ret != ERROR_UNINITIALIZED {
		t.Errorf("GetUUID after Shutdown = %v, want ERROR_UNINITIALIZED", ret)
	}
	if ret := l.Shutdown(); ret != ERROR_UNINITIALIZED {
		t.Errorf("a second Shutdown = %v, want ERROR_UNINITIALIZED", ret)
	}
}
