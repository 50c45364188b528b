//go:build cgo

package nvml

import (
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
)

// fakeGPU is one GPU of a fakeNode.
type fakeGPU struct {
	name, uuid, bus string // bus as NVML writes it: "00000000:3B:00.0"
	mem             gonvml.Memory
	// links[l] is link l; nil links: NVLink not supported.
	links []fakeLink
	// fail maps a method name to the error it returns.
	fail map[string]gonvml.Return
}

// fakeLink is one NVLink: up or down, and the bus id at its other end;
// without one, a link slot the board does not use (NOT_SUPPORTED).
type fakeLink struct {
	up     bool
	remote string
}

// fakeNode is a machine's worth of GPUs, built into go-nvml's mocks (mock):
// topo and p2p answer for the pair (i, j).
type fakeNode struct {
	gpus []fakeGPU
	topo func(i, j int) gonvml.GpuTopologyLevel
	p2p  func(i, j int, idx gonvml.GpuP2PCapsIndex) gonvml.GpuP2PStatus
	// noHandle lists GPUs whose DeviceGetHandleByIndex fails.
	noHandle map[int]bool
}

// pciInfo is the PciInfo NVML gives for bus id s.
func pciInfo(s string) gonvml.PciInfo {
	var p gonvml.PciInfo
	for i := range len(s) {
		p.BusId[i] = int8(s[i])
	}
	return p
}

// mock builds the node into go-nvml's generated mocks; only the calls
// discovery makes are filled in, so that any other call panics.
func (n fakeNode) mock() *mock.Interface {
	devs := make([]*mock.Device, len(n.gpus))
	index := map[gonvml.Device]int{}
	for i := range n.gpus {
		devs[i] = &mock.Device{}
		index[devs[i]] = i
	}
	for i, g := range n.gpus {
		d := devs[i]
		ret := func(method string) gonvml.Return {
			if r, ok := g.fail[method]; ok {
				return r
			}
			return gonvml.SUCCESS
		}
		d.GetUUIDFunc = func() (string, gonvml.Return) { return g.uuid, ret("GetUUID") }
		d.GetNameFunc = func() (string, gonvml.Return) { return g.name, ret("GetName") }
		d.GetPciInfoFunc = func() (gonvml.PciInfo, gonvml.Return) { return pciInfo(g.bus), ret("GetPciInfo") }
		d.GetMemoryInfoFunc = func() (gonvml.Memory, gonvml.Return) { return g.mem, ret("GetMemoryInfo") }
		d.GetCudaComputeCapabilityFunc = func() (int, int, gonvml.Return) { return 9, 0, ret("GetCudaComputeCapability") }
		d.GetNvLinkStateFunc = func(l int) (gonvml.EnableState, gonvml.Return) {
			if r := ret("GetNvLinkState"); r != gonvml.SUCCESS {
				return 0, r
			}
			switch {
			case g.links == nil:
				return 0, gonvml.ERROR_NOT_SUPPORTED
			case l >= len(g.links):
				return 0, gonvml.ERROR_INVALID_ARGUMENT
			case g.links[l].remote == "":
				return 0, gonvml.ERROR_NOT_SUPPORTED
			case g.links[l].up:
				return gonvml.FEATURE_ENABLED, gonvml.SUCCESS
			}
			return gonvml.FEATURE_DISABLED, gonvml.SUCCESS
		}
		d.GetNvLinkRemotePciInfoFunc = func(l int) (gonvml.PciInfo, gonvml.Return) {
			if l >= len(g.links) || !g.links[l].up {
				return gonvml.PciInfo{}, gonvml.ERROR_INVALID_ARGUMENT
			}
			return pciInfo(g.links[l].remote), gonvml.SUCCESS
		}
		d.GetTopologyCommonAncestorFunc = func(other gonvml.Device) (gonvml.GpuTopologyLevel, gonvml.Return) {
			return n.topo(i, index[other]), gonvml.SUCCESS
		}
		d.GetP2PStatusFunc = func(other gonvml.Device, idx gonvml.GpuP2PCapsIndex) (gonvml.GpuP2PStatus, gonvml.Return) {
			return n.p2p(i, index[other], idx), gonvml.SUCCESS
		}
	}
	return &mock.Interface{
		InitFunc:                       func() gonvml.Return { return gonvml.SUCCESS },
		ShutdownFunc:                   func() gonvml.Return { return gonvml.SUCCESS },
		SystemGetDriverVersionFunc:     func() (string, gonvml.Return) { return "550.54.15", gonvml.SUCCESS },
		SystemGetCudaDriverVersionFunc: func() (int, gonvml.Return) { return 12040, gonvml.SUCCESS },
		DeviceGetCountFunc:             func() (int, gonvml.Return) { return len(n.gpus), gonvml.SUCCESS },
		DeviceGetHandleByIndexFunc: func(i int) (gonvml.Device, gonvml.Return) {
			if n.noHandle[i] {
				return nil, gonvml.ERROR_NO_PERMISSION
			}
			return devs[i], gonvml.SUCCESS
		},
	}
}

// h100 is an H100 named after i with bus id bus.
func h100(i int, bus string, links []fakeLink) fakeGPU {
	return fakeGPU{
		name: "NVIDIA H100 80GB HBM3", uuid: fmt.Sprintf("GPU-%08x-0000-0000-0000-000000000000", i), bus: bus,
		mem: gonvml.Memory{Total: 80 << 30, Used: 512 << 20, Free: 80<<30 - 512<<20}, links: links,
	}
}

// hgx is an HGX H100 board: 8 GPUs, 4 per CPU socket, each with 18 NVLinks
// to the board's 4 NVSwitches, none directly to another GPU.
func hgx() fakeNode {
	buses := []string{"00000000:18:00.0", "00000000:2A:00.0", "00000000:3A:00.0", "00000000:5D:00.0",
		"00000000:9A:00.0", "00000000:AB:00.0", "00000000:BA:00.0", "00000000:DB:00.0"}
	var n fakeNode
	for i, b := range buses {
		links := make([]fakeLink, 18)
		for l := range links {
			links[l] = fakeLink{up: true, remote: fmt.Sprintf("00000000:%02X:00.0", 0xe0+l%4)} // the switches
		}
		n.gpus = append(n.gpus, h100(i, b, links))
	}
	n.topo = func(i, j int) gonvml.GpuTopologyLevel {
		if i/4 == j/4 {
			return gonvml.TOPOLOGY_NODE
		}
		return gonvml.TOPOLOGY_SYSTEM
	}
	n.p2p = func(i, j int, idx gonvml.GpuP2PCapsIndex) gonvml.GpuP2PStatus { return gonvml.P2P_STATUS_OK }
	return n
}

// bridged is a PCIe box: GPUs 0 and 1, and 2 and 3, joined by NVLink
// bridges of 4 links (12 link slots; link 3 of the 2-3 bridge is down),
// the two pairs on different CPU sockets; peer access works within a pair
// only.
func bridged() fakeNode {
	buses := []string{"00000000:17:00.0", "00000000:18:00.0", "00000000:CA:00.0", "00000000:CB:00.0"}
	var n fakeNode
	for i, b := range buses {
		links := make([]fakeLink, 12)
		for l := range 4 {
			links[l] = fakeLink{up: !(i >= 2 && l == 3), remote: buses[i^1]}
		}
		n.gpus = append(n.gpus, h100(i, b, links))
	}
	n.topo = func(i, j int) gonvml.GpuTopologyLevel {
		if i/2 == j/2 {
			return gonvml.TOPOLOGY_SINGLE
		}
		return gonvml.TOPOLOGY_SYSTEM
	}
	n.p2p = func(i, j int, idx gonvml.GpuP2PCapsIndex) gonvml.GpuP2PStatus {
		switch {
		case i/2 == j/2:
			return gonvml.P2P_STATUS_OK
		case idx == gonvml.P2P_CAPS_INDEX_NVLINK:
			return gonvml.P2P_STATUS_NOT_SUPPORTED
		}
		return gonvml.P2P_STATUS_CHIPSET_NOT_SUPPORTED
	}
	return n
}

// pcie is two PCIe GPUs without NVLink under one host bridge.
func pcie() fakeNode {
	n := fakeNode{gpus: []fakeGPU{h100(0, "00000000:3B:00.0", nil), h100(1, "00000000:AF:00.0", nil)}}
	n.topo = func(i, j int) gonvml.GpuTopologyLevel { return gonvml.TOPOLOGY_HOSTBRIDGE }
	n.p2p = func(i, j int, idx gonvml.GpuP2PCapsIndex) gonvml.GpuP2PStatus {
		if idx == gonvml.P2P_CAPS_INDEX_NVLINK {
			return gonvml.P2P_STATUS_NOT_SUPPORTED
		}
		return gonvml.P2P_STATUS_OK
	}
	return n
}

// matrixOf builds an n x n matrix: "X" on the diagonal, else cell(i, j).
func matrixOf(n int, cell func(i, j int) string) [][]string {
	m := make([][]string, n)
	for i := range m {
		m[i] = make([]string, n)
		for j := range m[i] {
			m[i][j] = "X"
			if i != j {
				m[i][j] = cell(i, j)
			}
		}
	}
	return m
}

func TestDiscoverTopology(t *testing.T) {
	tests := []struct {
		name string
		node fakeNode
		// matrix is the expected topology matrix, p2p the P2P read one.
		matrix, p2p [][]string
		// nvlinks[i] is GPU i's count of active links.
		nvlinks []int
	}{
		{
			name:    "hgx",
			node:    hgx(),
			matrix:  matrixOf(8, func(i, j int) string { return "NV18" }),
			p2p:     matrixOf(8, func(i, j int) string { return "OK" }),
			nvlinks: []int{18, 18, 18, 18, 18, 18, 18, 18},
		},
		{
			name: "bridged",
			node: bridged(),
			matrix: [][]string{
				{"X", "NV4", "SYS", "SYS"},
				{"NV4", "X", "SYS", "SYS"},
				{"SYS", "SYS", "X", "NV3"},
				{"SYS", "SYS", "NV3", "X"},
			},
			p2p: [][]string{
				{"X", "OK", "CNS", "CNS"},
				{"OK", "X", "CNS", "CNS"},
				{"CNS", "CNS", "X", "OK"},
				{"CNS", "CNS", "OK", "X"},
			},
			nvlinks: []int{4, 4, 3, 3},
		},
		{
			name:    "pcie",
			node:    pcie(),
			matrix:  [][]string{{"X", "PHB"}, {"PHB", "X"}},
			p2p:     [][]string{{"X", "OK"}, {"OK", "X"}},
			nvlinks: []int{0, 0},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			lib := tc.node.mock()
			r, err := discover(lib)
			if err != nil {
				t.Fatal(err)
			}
			if !r.Available || r.Reason != "" {
				t.Fatalf("Available %v, Reason %q; want GPUs and no reason", r.Available, r.Reason)
			}
			if got := r.Matrix(); !reflect.DeepEqual(got, tc.matrix) {
				t.Errorf("topology matrix\n%v\nwant\n%v", got, tc.matrix)
			}
			if got := r.P2PMatrix(); !reflect.DeepEqual(got, tc.p2p) {
				t.Errorf("P2P matrix\n%v\nwant\n%v", got, tc.p2p)
			}
			if n := len(tc.node.gpus); len(r.Pairs) != n*(n-1)/2 {
				t.Errorf("%d pairs of %d GPUs", len(r.Pairs), n)
			}
			for i, g := range r.GPUs {
				fg := tc.node.gpus[i]
				want := strings.ToLower(fg.bus[4:]) // "0000:3b:00.0"
				if g.Index != i || g.UUID != fg.uuid || g.Name != fg.name || g.PCIBusID != want ||
					g.MemoryTotal != fg.mem.Total || g.MemoryUsed != fg.mem.Used || g.ComputeCapability != "9.0" {
					t.Errorf("GPU %d: %+v, want index %d, %s, %s, bus %s, memory %d/%d, 9.0", i, g, i, fg.uuid, fg.name, want, fg.mem.Used, fg.mem.Total)
				}
				if g.ActiveNVLinks() != tc.nvlinks[i] {
					t.Errorf("GPU %d: %d active NVLinks, want %d", i, g.ActiveNVLinks(), tc.nvlinks[i])
				}
				if len(g.Errors) > 0 {
					t.Errorf("GPU %d: errors %q", i, g.Errors)
				}
			}
			if len(lib.InitCalls()) != 1 || len(lib.ShutdownCalls()) != 1 {
				t.Errorf("Init called %d times, Shutdown %d; want once each", len(lib.InitCalls()), len(lib.ShutdownCalls()))
			}
		})
	}
}

// TestDiscoverLinkEnds: a bridged pair's links name each other as their
// remote GPU; an NVSwitch's links name none.
func TestDiscoverLinkEnds(t *testing.T) {
	r, err := discover(bridged().mock())
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range r.GPUs {
		if len(g.NVLinks) != 4 { // links 4-11: no bridge, NOT_SUPPORTED
			t.Errorf("GPU %d: %d links listed, want 4: %+v", g.Index, len(g.NVLinks), g.NVLinks)
		}
		for _, l := range g.NVLinks {
			if l.Active && l.RemoteGPU != g.Index^1 {
				t.Errorf("GPU %d link %d: remote GPU %d, want %d", g.Index, l.Link, l.RemoteGPU, g.Index^1)
			}
		}
	}
	p, ok := r.Pair(3, 2)
	if !ok || p.A != 2 || p.B != 3 || p.NVLinks != 3 || p.Topology != "PIX" || p.P2PNVLink != "OK" || p.P2PWrite != "OK" {
		t.Errorf("Pair(3, 2) = %+v, %v; want 2-3 over 3 NVLinks, PIX, P2P OK", p, ok)
	}
	r, err = discover(hgx().mock())
	if err != nil {
		t.Fatal(err)
	}
	if s := r.Summary(); !strings.HasSuffix(s, "; NVLink: every pair NV18") {
		t.Errorf("HGX summary %q, want it to end in every pair NV18", s)
	}
	for _, l := range r.GPUs[5].NVLinks {
		if l.RemoteGPU != -1 || l.RemotePCIBusID == "" {
			t.Errorf("HGX GPU 5 link %d: remote GPU %d at %q, want -1 (a switch) at a bus id", l.Link, l.RemoteGPU, l.RemotePCIBusID)
		}
	}
	if p, _ := r.Pair(1, 6); p.Topology != "SYS" || p.Link != "NV18" {
		t.Errorf("HGX pair 1-6: %+v, want NV18 over SYS", p)
	}
}

// TestDiscoverPartialFailure: calls failing for one GPU leave its other
// fields and every other GPU described, and are named in its Errors; a GPU
// without a handle gets unknown pairs.
func TestDiscoverPartialFailure(t *testing.T) {
	n := bridged()
	n.gpus[1].fail = map[string]gonvml.Return{"GetMemoryInfo": gonvml.ERROR_NOT_SUPPORTED, "GetNvLinkState": gonvml.ERROR_UNKNOWN}
	n.noHandle = map[int]bool{3: true}
	r, err := discover(n.mock())
	if err != nil {
		t.Fatal(err)
	}
	g := r.GPUs[1]
	if g.UUID != n.gpus[1].uuid || g.MemoryTotal != 0 || len(g.NVLinks) != 0 {
		t.Errorf("GPU 1: %+v, want its UUID, no memory, no links", g)
	}
	want := []string{"GetMemoryInfo: " + gonvml.ERROR_NOT_SUPPORTED.Error(), "GetNvLinkState(0): " + gonvml.ERROR_UNKNOWN.Error()}
	if !reflect.DeepEqual(g.Errors, want) {
		t.Errorf("GPU 1 errors %q, want %q", g.Errors, want)
	}
	if g := r.GPUs[3]; g.UUID != "" || len(g.Errors) != 1 || !strings.HasPrefix(g.Errors[0], "DeviceGetHandleByIndex: ") {
		t.Errorf("GPU 3 without a handle: %+v", g)
	}
	if got := r.Matrix()[2]; !reflect.DeepEqual(got, []string{"SYS", "SYS", "X", "?"}) {
		t.Errorf("row 2 of the matrix: %q, want SYS SYS X ?", got)
	}
	// GPU 0's links to GPU 1 are up on its side: NVLink stays in the pair.
	if p, _ := r.Pair(0, 1); p.Link != "NV4" {
		t.Errorf("pair 0-1: %+v, want NV4", p)
	}
	var b strings.Builder
	if err := r.Format(&b); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(b.String(), "GPU1: GetMemoryInfo: ") {
		t.Errorf("Format does not show GPU 1's error:\n%s", b.String())
	}
}

// TestDiscoverNoGPU: every way of finding no GPU is a Report with a reason
// and no error; NVML is shut down exactly when it started.
func TestDiscoverNoGPU(t *testing.T) {
	tests := []struct {
		init     gonvml.Return
		count    int
		reason   string
		shutdown int
	}{
		{init: gonvml.ERROR_LIBRARY_NOT_FOUND, reason: "no NVIDIA driver (libnvidia-ml.so.1 not found): CPU-only"},
		{init: gonvml.ERROR_DRIVER_NOT_LOADED, reason: "NVIDIA driver not loaded (libnvidia-ml.so.1 found, the kernel module is not running): CPU-only"},
		{init: gonvml.ERROR_NO_PERMISSION, reason: "no permission to use the NVIDIA driver (nvmlInit: " + gonvml.ERROR_NO_PERMISSION.Error() + "): CPU-only"},
		{init: gonvml.ERROR_UNKNOWN, reason: "NVML did not start (nvmlInit: " + gonvml.ERROR_UNKNOWN.Error() + "): CPU-only"},
		{init: gonvml.SUCCESS, count: 0, reason: "NVIDIA driver 550.54.15 but no GPU: CPU-only", shutdown: 1},
	}
	for _, tc := range tests {
		t.Run(tc.init.Error(), func(t *testing.T) {
			// Only what discovery may call is filled in: the mock panics
			// at any other call.
			lib := &mock.Interface{InitFunc: func() gonvml.Return { return tc.init }}
			if tc.init == gonvml.SUCCESS {
				lib.ShutdownFunc = func() gonvml.Return { return gonvml.SUCCESS }
				lib.SystemGetDriverVersionFunc = func() (string, gonvml.Return) { return "550.54.15", gonvml.SUCCESS }
				lib.SystemGetCudaDriverVersionFunc = func() (int, gonvml.Return) { return 0, gonvml.ERROR_NOT_SUPPORTED }
				lib.DeviceGetCountFunc = func() (int, gonvml.Return) { return tc.count, gonvml.SUCCESS }
			}
			r, err := discover(lib)
			if err != nil {
				t.Fatal(err)
			}
			if r.Available || r.Reason != tc.reason || len(r.GPUs) != 0 {
				t.Errorf("got Available %v, Reason %q, %d GPUs; want %q", r.Available, r.Reason, len(r.GPUs), tc.reason)
			}
			if r.Summary() != tc.reason {
				t.Errorf("Summary %q, want the reason", r.Summary())
			}
			if n := len(lib.ShutdownCalls()); n != tc.shutdown {
				t.Errorf("Shutdown called %d times, want %d", n, tc.shutdown)
			}
		})
	}
}

// TestDiscoverCountFails: NVML that starts and cannot count its GPUs is an
// error naming the call, and NVML is shut down.
func TestDiscoverCountFails(t *testing.T) {
	lib := &mock.Interface{
		InitFunc:                       func() gonvml.Return { return gonvml.SUCCESS },
		ShutdownFunc:                   func() gonvml.Return { return gonvml.SUCCESS },
		SystemGetDriverVersionFunc:     func() (string, gonvml.Return) { return "", gonvml.ERROR_UNKNOWN },
		SystemGetCudaDriverVersionFunc: func() (int, gonvml.Return) { return 0, gonvml.ERROR_UNKNOWN },
		DeviceGetCountFunc:             func() (int, gonvml.Return) { return 0, gonvml.ERROR_GPU_IS_LOST },
	}
	_, err := discover(lib)
	if !errors.Is(err, gonvml.ERROR_GPU_IS_LOST) || !strings.Contains(err.Error(), "DeviceGetCount") {
		t.Errorf("err = %v, want DeviceGetCount's gonvml.ERROR_GPU_IS_LOST", err)
	}
	if n := len(lib.ShutdownCalls()); n != 1 {
		t.Errorf("Shutdown called %d times, want once", n)
	}
}

func TestBusID(t *testing.T) {
	legacy := func(s string) gonvml.PciInfo {
		var p gonvml.PciInfo
		for i := range len(s) {
			p.BusIdLegacy[i] = int8(s[i])
		}
		return p
	}
	tests := []struct {
		pci  gonvml.PciInfo
		want string
	}{
		{pciInfo("00000000:3B:00.0"), "0000:3b:00.0"},
		{pciInfo("00000001:3B:00.0"), "0001:3b:00.0"},
		{pciInfo("10000000:3B:00.0"), "10000000:3b:00.0"}, // no domain digit lost
		{pciInfo("0000:af:00.0"), "0000:af:00.0"},
		{legacy("0000:AF:00.0"), "0000:af:00.0"},
		{gonvml.PciInfo{Domain: 0, Bus: 0x3b, Device: 0}, "0000:3b:00.0"},
		{gonvml.PciInfo{}, ""},
	}
	for _, tc := range tests {
		if got := busID(tc.pci); got != tc.want {
			t.Errorf("busID(%q) = %q, want %q", cString(tc.pci.BusId[:]), got, tc.want)
		}
	}
}
