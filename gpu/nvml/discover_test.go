package nvml

import (
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
)

// mockLib is a Library of funcs: an unset one panics when called, so a
// test fills in only the calls discovery may make.
type mockLib struct {
	InitFunc                       func() Return
	ShutdownFunc                   func() Return
	SystemGetDriverVersionFunc     func() (string, Return)
	SystemGetCudaDriverVersionFunc func() (int, Return)
	DeviceGetCountFunc             func() (int, Return)
	DeviceGetHandleByIndexFunc     func(int) (Device, Return)

	inits, shutdowns int
}

func (m *mockLib) Init() Return                             { m.inits++; return m.InitFunc() }
func (m *mockLib) Shutdown() Return                         { m.shutdowns++; return m.ShutdownFunc() }
func (m *mockLib) SystemGetDriverVersion() (string, Return) { return m.SystemGetDriverVersionFunc() }
func (m *mockLib) SystemGetCudaDriverVersion() (int, Return) {
	return m.SystemGetCudaDriverVersionFunc()
}
func (m *mockLib) DeviceGetCount() (int, Return) { return m.DeviceGetCountFunc() }
func (m *mockLib) DeviceGetHandleByIndex(i int) (Device, Return) {
	return m.DeviceGetHandleByIndexFunc(i)
}

// mockDevice is a Device of funcs, as mockLib.
type mockDevice struct {
	GetUUIDFunc                   func() (string, Return)
	GetNameFunc                   func() (string, Return)
	GetPciInfoFunc                func() (PciInfo, Return)
	GetMemoryInfoFunc             func() (Memory, Return)
	GetCudaComputeCapabilityFunc  func() (int, int, Return)
	GetNvLinkStateFunc            func(int) (EnableState, Return)
	GetNvLinkRemotePciInfoFunc    func(int) (PciInfo, Return)
	GetTopologyCommonAncestorFunc func(Device) (GpuTopologyLevel, Return)
	GetP2PStatusFunc              func(Device, GpuP2PCapsIndex) (GpuP2PStatus, Return)
}

func (d *mockDevice) GetUUID() (string, Return)       { return d.GetUUIDFunc() }
func (d *mockDevice) GetName() (string, Return)       { return d.GetNameFunc() }
func (d *mockDevice) GetPciInfo() (PciInfo, Return)   { return d.GetPciInfoFunc() }
func (d *mockDevice) GetMemoryInfo() (Memory, Return) { return d.GetMemoryInfoFunc() }
func (d *mockDevice) GetCudaComputeCapability() (int, int, Return) {
	return d.GetCudaComputeCapabilityFunc()
}
func (d *mockDevice) GetNvLinkState(l int) (EnableState, Return) { return d.GetNvLinkStateFunc(l) }
func (d *mockDevice) GetNvLinkRemotePciInfo(l int) (PciInfo, Return) {
	return d.GetNvLinkRemotePciInfoFunc(l)
}
func (d *mockDevice) GetTopologyCommonAncestor(o Device) (GpuTopologyLevel, Return) {
	return d.GetTopologyCommonAncestorFunc(o)
}
func (d *mockDevice) GetP2PStatus(o Device, i GpuP2PCapsIndex) (GpuP2PStatus, Return) {
	return d.GetP2PStatusFunc(o, i)
}

// fakeGPU is one GPU of a fakeNode.
type fakeGPU struct {
	name, uuid, bus string // bus as NVML writes it: "00000000:3B:00.0"
	mem             Memory
	// links[l] is link l; nil links: NVLink not supported.
	links []fakeLink
	// fail maps a method name to the error it returns.
	fail map[string]Return
}

// fakeLink is one NVLink: up or down, and the bus id at its other end;
// without one, a link slot the board does not use (NOT_SUPPORTED).
type fakeLink struct {
	up     bool
	remote string
}

// fakeNode is a machine's worth of GPUs, built into mockLib: topo and p2p answer for the pair (i, j).
type fakeNode struct {
	gpus []fakeGPU
	topo func(i, j int) GpuTopologyLevel
	p2p  func(i, j int, idx GpuP2PCapsIndex) GpuP2PStatus
	// noHandle lists GPUs whose DeviceGetHandleByIndex fails.
	noHandle map[int]bool
}

// pciInfo is the PciInfo NVML gives for bus id s.
func pciInfo(s string) PciInfo {
	var p PciInfo
	for i := range len(s) {
		p.BusId[i] = int8(s[i])
	}
	return p
}

// mock builds the node into an nvml mock; only the calls discovery makes
// are filled in, so that any other call panics.
func (n fakeNode) mock() *mockLib {
	devs := make([]*mockDevice, len(n.gpus))
	index := map[Device]int{}
	for i := range n.gpus {
		devs[i] = &mockDevice{}
		index[devs[i]] = i
	}
	for i, g := range n.gpus {
		d := devs[i]
		ret := func(method string) Return {
			if r, ok := g.fail[method]; ok {
				return r
			}
			return SUCCESS
		}
		d.GetUUIDFunc = func() (string, Return) { return g.uuid, ret("GetUUID") }
		d.GetNameFunc = func() (string, Return) { return g.name, ret("GetName") }
		d.GetPciInfoFunc = func() (PciInfo, Return) { return pciInfo(g.bus), ret("GetPciInfo") }
		d.GetMemoryInfoFunc = func() (Memory, Return) { return g.mem, ret("GetMemoryInfo") }
		d.GetCudaComputeCapabilityFunc = func() (int, int, Return) { return 9, 0, ret("GetCudaComputeCapability") }
		d.GetNvLinkStateFunc = func(l int) (EnableState, Return) {
			if r := ret("GetNvLinkState"); r != SUCCESS {
				return 0, r
			}
			switch {
			case g.links == nil:
				return 0, ERROR_NOT_SUPPORTED
			case l >= len(g.links):
				return 0, ERROR_INVALID_ARGUMENT
			case g.links[l].remote == "":
				return 0, ERROR_NOT_SUPPORTED
			case g.links[l].up:
				return FEATURE_ENABLED, SUCCESS
			}
			return FEATURE_DISABLED, SUCCESS
		}
		d.GetNvLinkRemotePciInfoFunc = func(l int) (PciInfo, Return) {
			if l >= len(g.links) || !g.links[l].up {
				return PciInfo{}, ERROR_INVALID_ARGUMENT
			}
			return pciInfo(g.links[l].remote), SUCCESS
		}
		d.GetTopologyCommonAncestorFunc = func(other Device) (GpuTopologyLevel, Return) {
			return n.topo(i, index[other]), SUCCESS
		}
		d.GetP2PStatusFunc = func(other Device, idx GpuP2PCapsIndex) (GpuP2PStatus, Return) {
			return n.p2p(i, index[other], idx), SUCCESS
		}
	}
	return &mockLib{
		InitFunc:                   func() Return { return SUCCESS },
		ShutdownFunc:               func() Return { return SUCCESS },
		SystemGetDriverVersionFunc: func() (string, Return) { return "550.54.15", SUCCESS },
		SystemGetCudaDriverVersionFunc: func() (int, Return) {
			return 12040, SUCCESS
		},
		DeviceGetCountFunc: func() (int, Return) { return len(n.gpus), SUCCESS },
		DeviceGetHandleByIndexFunc: func(i int) (Device, Return) {
			if n.noHandle[i] {
				return nil, ERROR_NO_PERMISSION
			}
			return devs[i], SUCCESS
		},
	}
}

// h100 is an H100 named after i with bus id bus.
func h100(i int, bus string, links []fakeLink) fakeGPU {
	return fakeGPU{
		name: "NVIDIA H100 80GB HBM3", uuid: fmt.Sprintf("GPU-%08x-0000-0000-0000-000000000000", i), bus: bus,
		mem: Memory{Total: 80 << 30, Used: 512 << 20, Free: 80<<30 - 512<<20}, links: links,
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
	n.topo = func(i, j int) GpuTopologyLevel {
		if i/4 == j/4 {
			return TOPOLOGY_NODE
		}
		return TOPOLOGY_SYSTEM
	}
	n.p2p = func(i, j int, idx GpuP2PCapsIndex) GpuP2PStatus { return P2P_STATUS_OK }
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
	n.topo = func(i, j int) GpuTopologyLevel {
		if i/2 == j/2 {
			return TOPOLOGY_SINGLE
		}
		return TOPOLOGY_SYSTEM
	}
	n.p2p = func(i, j int, idx GpuP2PCapsIndex) GpuP2PStatus {
		switch {
		case i/2 == j/2:
			return P2P_STATUS_OK
		case idx == P2P_CAPS_INDEX_NVLINK:
			return P2P_STATUS_NOT_SUPPORTED
		}
		return P2P_STATUS_CHIPSET_NOT_SUPPORTED
	}
	return n
}

// pcie is two PCIe GPUs without NVLink under one host bridge.
func pcie() fakeNode {
	n := fakeNode{gpus: []fakeGPU{h100(0, "00000000:3B:00.0", nil), h100(1, "00000000:AF:00.0", nil)}}
	n.topo = func(i, j int) GpuTopologyLevel { return TOPOLOGY_HOSTBRIDGE }
	n.p2p = func(i, j int, idx GpuP2PCapsIndex) GpuP2PStatus {
		if idx == P2P_CAPS_INDEX_NVLINK {
			return P2P_STATUS_NOT_SUPPORTED
		}
		return P2P_STATUS_OK
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
			if lib.inits != 1 || lib.shutdowns != 1 {
				t.Errorf("Init called %d times, Shutdown %d; want once each", lib.inits, lib.shutdowns)
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
	n.gpus[1].fail = map[string]Return{"GetMemoryInfo": ERROR_NOT_SUPPORTED, "GetNvLinkState": ERROR_UNKNOWN}
	n.noHandle = map[int]bool{3: true}
	r, err := discover(n.mock())
	if err != nil {
		t.Fatal(err)
	}
	g := r.GPUs[1]
	if g.UUID != n.gpus[1].uuid || g.MemoryTotal != 0 || len(g.NVLinks) != 0 {
		t.Errorf("GPU 1: %+v, want its UUID, no memory, no links", g)
	}
	want := []string{"GetMemoryInfo: " + ERROR_NOT_SUPPORTED.Error(), "GetNvLinkState(0): " + ERROR_UNKNOWN.Error()}
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
		init     Return
		count    int
		reason   string
		shutdown int
	}{
		{init: ERROR_LIBRARY_NOT_FOUND, reason: "no NVIDIA driver (libnvidia-ml.so.1 not found): CPU-only"},
		{init: ERROR_DRIVER_NOT_LOADED, reason: "NVIDIA driver not loaded (libnvidia-ml.so.1 found, the kernel module is not running): CPU-only"},
		{init: ERROR_NO_PERMISSION, reason: "no permission to use the NVIDIA driver (nvmlInit: " + ERROR_NO_PERMISSION.Error() + "): CPU-only"},
		{init: ERROR_UNKNOWN, reason: "NVML did not start (nvmlInit: " + ERROR_UNKNOWN.Error() + "): CPU-only"},
		{init: SUCCESS, count: 0, reason: "NVIDIA driver 550.54.15 but no GPU: CPU-only", shutdown: 1},
	}
	for _, tc := range tests {
		t.Run(tc.init.Error(), func(t *testing.T) {
			// Only what discovery may call is filled in: the mock panics
			// at any other call.
			lib := &mockLib{InitFunc: func() Return { return tc.init }}
			if tc.init == SUCCESS {
				lib.ShutdownFunc = func() Return { return SUCCESS }
				lib.SystemGetDriverVersionFunc = func() (string, Return) { return "550.54.15", SUCCESS }
				lib.SystemGetCudaDriverVersionFunc = func() (int, Return) { return 0, ERROR_NOT_SUPPORTED }
				lib.DeviceGetCountFunc = func() (int, Return) { return tc.count, SUCCESS }
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
			if n := lib.shutdowns; n != tc.shutdown {
				t.Errorf("Shutdown called %d times, want %d", n, tc.shutdown)
			}
		})
	}
}

// TestDiscoverCountFails: NVML that starts and cannot count its GPUs is an
// error naming the call, and NVML is shut down.
func TestDiscoverCountFails(t *testing.T) {
	lib := &mockLib{
		InitFunc:                       func() Return { return SUCCESS },
		ShutdownFunc:                   func() Return { return SUCCESS },
		SystemGetDriverVersionFunc:     func() (string, Return) { return "", ERROR_UNKNOWN },
		SystemGetCudaDriverVersionFunc: func() (int, Return) { return 0, ERROR_UNKNOWN },
		DeviceGetCountFunc:             func() (int, Return) { return 0, ERROR_GPU_IS_LOST },
	}
	_, err := discover(lib)
	if !errors.Is(err, ERROR_GPU_IS_LOST) || !strings.Contains(err.Error(), "DeviceGetCount") {
		t.Errorf("err = %v, want DeviceGetCount's ERROR_GPU_IS_LOST", err)
	}
	if lib.shutdowns != 1 {
		t.Errorf("Shutdown called %d times, want once", lib.shutdowns)
	}
}

func TestBusID(t *testing.T) {
	legacy := func(s string) PciInfo {
		var p PciInfo
		for i := range len(s) {
			p.BusIdLegacy[i] = int8(s[i])
		}
		return p
	}
	tests := []struct {
		pci  PciInfo
		want string
	}{
		{pciInfo("00000000:3B:00.0"), "0000:3b:00.0"},
		{pciInfo("00000001:3B:00.0"), "0001:3b:00.0"},
		{pciInfo("10000000:3B:00.0"), "10000000:3b:00.0"}, // no domain digit lost
		{pciInfo("0000:af:00.0"), "0000:af:00.0"},
		{legacy("0000:AF:00.0"), "0000:af:00.0"},
		{PciInfo{Domain: 0, Bus: 0x3b, Device: 0}, "0000:3b:00.0"},
		{PciInfo{}, ""},
	}
	for _, tc := range tests {
		if got := busID(tc.pci); got != tc.want {
			t.Errorf("busID(%q) = %q, want %q", cString(tc.pci.BusId[:]), got, tc.want)
		}
	}
}
