//go:build cgo

package nvml

import (
	"fmt"
	"strings"
	"sync"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"
)

// Discover describes this node's GPUs through NVML, loading
// libnvidia-ml.so.1 for the call and unloading it after (unless a Sampler
// holds it open). Without a driver or a GPU it returns a Report whose
// Available is false and whose Reason says why, and a nil error: the node
// runs CPU-only. It returns an error only when NVML started and then
// failed to list the GPUs (or, built without cgo, ErrNeedsCgo). It may take a
// while (NVML initialises every GPU, up to seconds without the persistence
// daemon), so a daemon calls it off its start-up path.
func Discover() (Report, error) {
	// NVML's init and shutdown are reference counted in the process; one
	// discovery at a time keeps load, use and unload of the library paired.
	discoverMu.Lock()
	defer discoverMu.Unlock()
	return discover(newLibrary())
}

var discoverMu sync.Mutex

// discover is Discover on lib.
func discover(lib gonvml.Interface) (Report, error) {
	if ret := lib.Init(); ret != gonvml.SUCCESS {
		return Report{Reason: initFailure(ret)}, nil
	}
	defer lib.Shutdown() // nothing to do if it fails: discovery is done
	var r Report
	if v, ret := lib.SystemGetDriverVersion(); ret == gonvml.SUCCESS {
		r.DriverVersion = v
	}
	if v, ret := lib.SystemGetCudaDriverVersion(); ret == gonvml.SUCCESS {
		r.CUDAVersion = v
	}
	n, ret := lib.DeviceGetCount()
	if ret != gonvml.SUCCESS {
		return r, fmt.Errorf("nvml: DeviceGetCount: %w", ret)
	}
	if n == 0 {
		r.Reason = fmt.Sprintf("NVIDIA driver %s but no GPU: CPU-only", r.DriverVersion)
		return r, nil
	}
	// devs[i] is nil where NVML gave no handle; that GPU is listed with
	// its error, and its pairs stay unknown.
	devs := make([]gonvml.Device, n)
	r.GPUs = make([]GPU, n)
	for i := range n {
		r.GPUs[i] = GPU{Index: i}
		d, ret := lib.DeviceGetHandleByIndex(i)
		if ret != gonvml.SUCCESS {
			r.GPUs[i].Errors = append(r.GPUs[i].Errors, fmt.Sprintf("DeviceGetHandleByIndex: %v", ret))
			continue
		}
		devs[i] = d
		describe(&r.GPUs[i], d)
	}
	resolveLinks(r.GPUs)
	for i := range n {
		for j := i + 1; j < n; j++ {
			r.Pairs = append(r.Pairs, pair(r.GPUs, devs, i, j))
		}
	}
	r.Available = true
	return r, nil
}

// initFailure words a failed nvmlInit for a node that runs CPU-only.
func initFailure(ret gonvml.Return) string {
	switch ret {
	case gonvml.ERROR_LIBRARY_NOT_FOUND:
		return "no NVIDIA driver (libnvidia-ml.so.1 not found): CPU-only"
	case gonvml.ERROR_DRIVER_NOT_LOADED:
		return "NVIDIA driver not loaded (libnvidia-ml.so.1 found, the kernel module is not running): CPU-only"
	case gonvml.ERROR_NO_PERMISSION:
		return fmt.Sprintf("no permission to use the NVIDIA driver (nvmlInit: %v): CPU-only", ret)
	default:
		return fmt.Sprintf("NVML did not start (nvmlInit: %v): CPU-only", ret)
	}
}

// describe fills g (whose Index is set) from d. A failed call leaves its
// fields zero and is named in g.Errors.
func describe(g *GPU, d gonvml.Device) {
	fail := func(call string, ret gonvml.Return) { g.Errors = append(g.Errors, fmt.Sprintf("%s: %v", call, ret)) }
	var ret gonvml.Return
	if g.UUID, ret = d.GetUUID(); ret != gonvml.SUCCESS {
		fail("GetUUID", ret)
	}
	if g.Name, ret = d.GetName(); ret != gonvml.SUCCESS {
		fail("GetName", ret)
	}
	if pci, ret := d.GetPciInfo(); ret == gonvml.SUCCESS {
		g.PCIBusID = busID(pci)
	} else {
		fail("GetPciInfo", ret)
	}
	if mem, ret := d.GetMemoryInfo(); ret == gonvml.SUCCESS {
		g.MemoryTotal, g.MemoryUsed = mem.Total, mem.Used
	} else {
		fail("GetMemoryInfo", ret)
	}
	if major, minor, ret := d.GetCudaComputeCapability(); ret == gonvml.SUCCESS {
		g.ComputeCapability = fmt.Sprintf("%d.%d", major, minor)
	} else {
		fail("GetCudaComputeCapability", ret)
	}
	// NVML has no count of a GPU's links: it answers INVALID_ARGUMENT past
	// the last, and NOT_SUPPORTED for every link of a GPU without NVLink
	// (and for links a board leaves unused).
	for l := range gonvml.NVLINK_MAX_LINKS {
		st, ret := d.GetNvLinkState(l)
		if ret == gonvml.ERROR_NOT_SUPPORTED {
			continue
		}
		if ret == gonvml.ERROR_INVALID_ARGUMENT {
			break
		}
		if ret != gonvml.SUCCESS {
			fail(fmt.Sprintf("GetNvLinkState(%d)", l), ret)
			break
		}
		link := NVLink{Link: l, Active: st == gonvml.FEATURE_ENABLED, RemoteGPU: -1}
		if link.Active {
			if pci, ret := d.GetNvLinkRemotePciInfo(l); ret == gonvml.SUCCESS {
				link.RemotePCIBusID = busID(pci)
			} else {
				fail(fmt.Sprintf("GetNvLinkRemotePciInfo(%d)", l), ret)
			}
		}
		g.NVLinks = append(g.NVLinks, link)
	}
}

// resolveLinks sets each link's RemoteGPU from its remote bus id.
func resolveLinks(gpus []GPU) {
	byBus := make(map[string]int, len(gpus))
	for _, g := range gpus {
		if g.PCIBusID != "" {
			byBus[g.PCIBusID] = g.Index
		}
	}
	for i := range gpus {
		for k, l := range gpus[i].NVLinks {
			if j, ok := byBus[l.RemotePCIBusID]; ok && l.RemotePCIBusID != "" && j != i {
				gpus[i].NVLinks[k].RemoteGPU = j
			}
		}
	}
}

// pair describes the connection of GPUs i < j.
//
// NVLinks counts i's active links whose other end is j. GPUs joined
// through NVSwitches (DGX/HGX boards) have no link to each other, only to
// switches: when NVML says NVLink peer access between them works, the pair
// gets the smaller of their counts of active links to something that is
// not a GPU, which is how nvidia-smi topo -m arrives at NV18 between any
// two GPUs of an HGX H100.
func pair(gpus []GPU, devs []gonvml.Device, i, j int) Pair {
	p := Pair{A: i, B: j}
	di, dj := devs[i], devs[j]
	if di == nil || dj == nil {
		return p
	}
	if lvl, ret := di.GetTopologyCommonAncestor(dj); ret == gonvml.SUCCESS {
		p.Topology = topologyName(lvl)
	}
	p.P2PRead = p2pStatus(di, dj, gonvml.P2P_CAPS_INDEX_READ)
	p.P2PWrite = p2pStatus(di, dj, gonvml.P2P_CAPS_INDEX_WRITE)
	p.P2PNVLink = p2pStatus(di, dj, gonvml.P2P_CAPS_INDEX_NVLINK)
	for _, l := range gpus[i].NVLinks {
		if l.Active && l.RemoteGPU == j {
			p.NVLinks++
		}
	}
	if p.NVLinks == 0 && p.P2PNVLink == "OK" {
		p.NVLinks = min(switchLinks(gpus[i]), switchLinks(gpus[j]))
	}
	p.Link = p.Topology
	if p.NVLinks > 0 {
		p.Link = fmt.Sprintf("NV%d", p.NVLinks)
	}
	return p
}

// switchLinks counts g's active links to something that is not a GPU of
// the report (an NVSwitch).
func switchLinks(g GPU) int {
	n := 0
	for _, l := range g.NVLinks {
		if l.Active && l.RemoteGPU < 0 {
			n++
		}
	}
	return n
}

// p2pStatus is nvmlDeviceGetP2PStatus(a, b, idx) in nvidia-smi's words,
// "" when the call failed.
func p2pStatus(a, b gonvml.Device, idx gonvml.GpuP2PCapsIndex) string {
	st, ret := a.GetP2PStatus(b, idx)
	if ret != gonvml.SUCCESS {
		return ""
	}
	switch st {
	case gonvml.P2P_STATUS_OK:
		return "OK"
	case gonvml.P2P_STATUS_CHIPSET_NOT_SUPPORTED:
		return "CNS"
	case gonvml.P2P_STATUS_GPU_NOT_SUPPORTED:
		return "GNS"
	case gonvml.P2P_STATUS_IOH_TOPOLOGY_NOT_SUPPORTED:
		return "TNS"
	case gonvml.P2P_STATUS_DISABLED_BY_REGKEY:
		return "DIS"
	case gonvml.P2P_STATUS_NOT_SUPPORTED:
		return "NS"
	default:
		return "U"
	}
}

// topologyName is a GpuTopologyLevel in nvidia-smi topo -m's words.
func topologyName(l gonvml.GpuTopologyLevel) string {
	switch l {
	case gonvml.TOPOLOGY_INTERNAL:
		return "BRD"
	case gonvml.TOPOLOGY_SINGLE:
		return "PIX"
	case gonvml.TOPOLOGY_MULTIPLE:
		return "PXB"
	case gonvml.TOPOLOGY_HOSTBRIDGE:
		return "PHB"
	case gonvml.TOPOLOGY_NODE:
		return "NODE"
	case gonvml.TOPOLOGY_SYSTEM:
		return "SYS"
	default:
		return ""
	}
}

// busID writes pci's bus id as sysfs does: "0000:3b:00.0". NVML's BusId is
// "00000000:3B:00.0" (an 8-digit domain); older drivers fill only the
// legacy field, and a mock may fill neither, leaving the numbers.
func busID(pci gonvml.PciInfo) string {
	s := cString(pci.BusId[:])
	if s == "" {
		s = cString(pci.BusIdLegacy[:])
	}
	if s == "" {
		if pci.Domain == 0 && pci.Bus == 0 && pci.Device == 0 {
			return ""
		}
		return fmt.Sprintf("%04x:%02x:%02x.0", pci.Domain, pci.Bus, pci.Device)
	}
	s = strings.ToLower(s)
	if dom, rest, ok := strings.Cut(s, ":"); ok && len(dom) > 4 && strings.Trim(dom[:len(dom)-4], "0") == "" {
		s = dom[len(dom)-4:] + ":" + rest
	}
	return s
}

// cString is the text of a NUL-terminated C char array.
func cString(b []int8) string {
	var s []byte
	for _, c := range b {
		if c == 0 {
			break
		}
		s = append(s, byte(c))
	}
	return string(s)
}
