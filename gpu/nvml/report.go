// Package nvml finds the node's NVIDIA GPUs and how they are connected,
// and samples their health, through NVML (libnvidia-ml.so.1, loaded with
// dlopen at run time by github.com/NVIDIA/go-nvml).
//
// Discover describes the GPUs: for each its index, UUID, name, PCI bus id,
// memory and compute capability, its NVLinks, and for each pair of GPUs
// the PCIe/NVLink path between them and whether peer-to-peer access works,
// as `nvidia-smi topo -m` and `nvidia-smi topo -p2p` show them. It never
// fails for want of a GPU: a node without the NVIDIA driver (no
// libnvidia-ml.so.1, or the kernel module not loaded), or with a driver
// and no GPU, gets a Report whose Available is false and whose Reason says
// why, and the daemon runs CPU-only.
//
// A Sampler (OpenSampler) reads, per GPU and round, utilization, memory,
// temperature, power, PCIe and NVLink throughput, ECC counts and XID
// events (Sample), and tells which GPUs are lost (LostError, Lost): those
// NVML answers ERROR_GPU_IS_LOST for, or that reported XID 79.
//
// go-nvml is cgo (against its own copy of nvml.h; nothing of CUDA at build
// time). A build without cgo (CGO_ENABLED=0) has this package without it
// (nocgo.go): Discover and OpenSampler return ErrNeedsCgo.
//
// The package only describes and samples. It does not open CUDA contexts,
// choose devices or act on a lost GPU; the GPU path proper (gpu, gpu/cuda)
// talks to the CUDA driver, and the daemon decides what a lost GPU means.
// NVML's indices are the node's, not the process's: CUDA_VISIBLE_DEVICES
// renumbers CUDA's devices but not NVML's, so match GPUs across the two by
// UUID.
//
// The logic runs on go-nvml's Interface, so that the tests drive it with
// go-nvml's generated mocks (pkg/nvml/mock), and a C stub with NVML's ABI
// (testdata/stub.c) checks the calls through the real binding.
package nvml

import (
	"fmt"
	"io"
	"log/slog"
	"strings"
	"text/tabwriter"
)

// Report is what discovery found on this node. Its zero value is a report
// of no GPU with no reason given.
type Report struct {
	// Available is true when NVML answered and listed at least one GPU.
	Available bool `json:"available"`
	// Reason says, when Available is false, why there is no GPU, ending in
	// "CPU-only": "no NVIDIA driver (libnvidia-ml.so.1 not found): CPU-only".
	Reason string `json:"reason,omitempty"`
	// DriverVersion is the NVIDIA driver's ("550.54.15"); empty when
	// unknown.
	DriverVersion string `json:"driver_version,omitempty"`
	// CUDAVersion is the newest CUDA version the driver supports, as
	// cuDriverGetVersion gives it (12040 for 12.4); 0 when unknown.
	CUDAVersion int `json:"cuda_version,omitempty"`
	// GPUs lists the GPUs in NVML's order (GPUs[i].Index == i).
	GPUs []GPU `json:"gpus"`
	// Pairs holds the connection between each pair of GPUs, A < B, in the
	// order (0,1), (0,2), ..., (1,2), ...
	Pairs []Pair `json:"pairs"`
}

// GPU describes one GPU. Fields NVML could not give are left zero, and the
// failed calls are named in Errors.
type GPU struct {
	// Index is NVML's index: the node's, not CUDA_VISIBLE_DEVICES's.
	Index int `json:"index"`
	// UUID is "GPU-8a1f..." as nvidia-smi writes it.
	UUID string `json:"uuid"`
	// Name is the product name ("NVIDIA H100 80GB HBM3").
	Name string `json:"name"`
	// PCIBusID is the bus id in sysfs's form, "0000:3b:00.0" (lower case,
	// a 4-digit domain), which is also what CUDA's cuDeviceGetPCIBusId
	// gives modulo case.
	PCIBusID string `json:"pci_bus_id"`
	// MemoryTotal and MemoryUsed are bytes of device memory.
	MemoryTotal uint64 `json:"memory_total"`
	MemoryUsed  uint64 `json:"memory_used"`
	// ComputeCapability is "major.minor" ("9.0").
	ComputeCapability string `json:"compute_capability"`
	// NVLinks lists the GPU's NVLinks, empty for a GPU without NVLink.
	NVLinks []NVLink `json:"nvlinks,omitempty"`
	// Errors names the NVML calls that failed for this GPU, with NVML's
	// message ("GetMemoryInfo: Not Supported").
	Errors []string `json:"errors,omitempty"`
}

// ActiveNVLinks counts the GPU's links that are up.
func (g GPU) ActiveNVLinks() int {
	n := 0
	for _, l := range g.NVLinks {
		if l.Active {
			n++
		}
	}
	return n
}

// NVLink is one NVLink of a GPU.
type NVLink struct {
	// Link is the link's number on its GPU.
	Link int `json:"link"`
	// Active is true when the link is up (nvmlDeviceGetNvLinkState).
	Active bool `json:"active"`
	// RemotePCIBusID is the bus id of the other end (a GPU, or an
	// NVSwitch), in PCIBusID's form; empty for a link that is down.
	RemotePCIBusID string `json:"remote_pci_bus_id,omitempty"`
	// RemoteGPU is the Index of the GPU at the other end, or -1 when the
	// other end is no GPU of this report (an NVSwitch, say).
	RemoteGPU int `json:"remote_gpu"`
}

// Pair is the connection between GPUs A and B (A < B), seen from A.
type Pair struct {
	A int `json:"a"`
	B int `json:"b"`
	// Link is the cell of `nvidia-smi topo -m`: "NV<n>" when n NVLinks
	// join the two (directly, or through NVSwitches), else Topology.
	Link string `json:"link"`
	// Topology is the PCIe path (nvmlDeviceGetTopologyCommonAncestor):
	// "PIX" (at most one PCIe bridge), "PXB" (several bridges), "PHB" (a
	// host bridge), "NODE" (host bridges within a NUMA node), "SYS" (across
	// NUMA nodes) or "BRD" (the same board); empty when NVML does not say.
	Topology string `json:"topology,omitempty"`
	// NVLinks counts the NVLinks between the two; 0 without NVLink.
	NVLinks int `json:"nvlinks"`
	// P2PRead, P2PWrite and P2PNVLink are nvmlDeviceGetP2PStatus's answers
	// for reads, writes and NVLink peer access: "OK", "CNS" (chipset not
	// supported), "GNS" (GPU not supported), "TNS" (topology not
	// supported), "DIS" (disabled by the registry key), "NS" (not
	// supported) or "U" (unknown); empty when the call failed.
	P2PRead   string `json:"p2p_read"`
	P2PWrite  string `json:"p2p_write"`
	P2PNVLink string `json:"p2p_nvlink"`
}

// Pair returns the pair of GPUs i and j (in either order) and whether the
// report has it.
func (r Report) Pair(i, j int) (Pair, bool) {
	if i > j {
		i, j = j, i
	}
	for _, p := range r.Pairs {
		if p.A == i && p.B == j {
			return p, true
		}
	}
	return Pair{}, false
}

// Matrix is the topology matrix of `nvidia-smi topo -m`: cell [i][j] is
// the Pair's Link, "X" on the diagonal, "?" where the report lacks the pair.
func (r Report) Matrix() [][]string {
	return r.matrix(func(p Pair) string { return p.Link })
}

// P2PMatrix is the matrix of `nvidia-smi topo -p2p r`: the P2PRead status
// of each pair, "X" on the diagonal.
func (r Report) P2PMatrix() [][]string {
	return r.matrix(func(p Pair) string { return p.P2PRead })
}

func (r Report) matrix(cell func(Pair) string) [][]string {
	n := len(r.GPUs)
	m := make([][]string, n)
	for i := range m {
		m[i] = make([]string, n)
		for j := range m[i] {
			switch p, ok := r.Pair(i, j); {
			case i == j:
				m[i][j] = "X"
			case !ok || cell(p) == "":
				m[i][j] = "?"
			default:
				m[i][j] = cell(p)
			}
		}
	}
	return m
}

// cudaVersion writes a cuDriverGetVersion number as "12.4".
func cudaVersion(v int) string { return fmt.Sprintf("%d.%d", v/1000, v%1000/10) }

// gib writes a byte count in GiB with one decimal.
func gib(n uint64) string { return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30)) }

// Summary is the report in one line, for a log: "CPU-only: ..." without
// GPUs, else the driver, each GPU, and the NVLinked pairs.
func (r Report) Summary() string {
	if !r.Available {
		if r.Reason == "" {
			return "no NVIDIA GPU: CPU-only"
		}
		return r.Reason
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%d NVIDIA GPUs (driver %s, CUDA %s):", len(r.GPUs), r.DriverVersion, cudaVersion(r.CUDAVersion))
	for i, g := range r.GPUs {
		if i > 0 {
			b.WriteByte(';')
		}
		fmt.Fprintf(&b, " %d %s %s %s %s sm_%s", g.Index, g.Name, g.UUID, g.PCIBusID, gib(g.MemoryTotal), strings.ReplaceAll(g.ComputeCapability, ".", ""))
	}
	var nv []string
	same := len(r.Pairs) > 1 // every pair NVLinked alike (an NVSwitch board)
	for _, p := range r.Pairs {
		if p.NVLinks > 0 {
			nv = append(nv, fmt.Sprintf("%d-%d %s", p.A, p.B, p.Link))
		}
		same = same && p.NVLinks > 0 && p.Link == r.Pairs[0].Link
	}
	switch {
	case same:
		fmt.Fprintf(&b, "; NVLink: every pair %s", r.Pairs[0].Link)
	case len(nv) > 0:
		fmt.Fprintf(&b, "; NVLink: %s", strings.Join(nv, ", "))
	case len(r.GPUs) > 1:
		b.WriteString("; no NVLink")
	}
	return b.String()
}

// Log writes the report to l at info level: one line saying CPU-only, or
// one line per GPU and one for the topology.
func (r Report) Log(l *slog.Logger) {
	if !r.Available {
		// Debug: hvdd serve's GPU driver loader says CPU-only at info,
		// once (cmd/hvdd/gpu.go); NVML's reason is the same news.
		l.Debug(r.Summary())
		return
	}
	l.Info("NVIDIA GPUs", "count", len(r.GPUs), "driver", r.DriverVersion, "cuda", cudaVersion(r.CUDAVersion))
	for _, g := range r.GPUs {
		attrs := []any{"index", g.Index, "uuid", g.UUID, "name", g.Name, "pci_bus_id", g.PCIBusID,
			"memory_total", g.MemoryTotal, "memory_used", g.MemoryUsed, "compute_capability", g.ComputeCapability,
			"nvlinks", g.ActiveNVLinks()}
		if len(g.Errors) > 0 {
			attrs = append(attrs, "errors", strings.Join(g.Errors, "; "))
		}
		l.Info("GPU", attrs...)
	}
	if len(r.Pairs) > 0 {
		var cells []string
		for _, p := range r.Pairs {
			cells = append(cells, fmt.Sprintf("%d-%d:%s/p2p=%s", p.A, p.B, p.Link, orDash(p.P2PRead)))
		}
		l.Info("GPU topology", "pairs", strings.Join(cells, " "))
	}
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// Format writes the report for a terminal: the GPUs as a table, then the
// topology and peer-to-peer matrices with their legend (as nvidia-smi topo
// -m and -p2p r write them). Without GPUs it writes the Reason.
func (r Report) Format(w io.Writer) error {
	var b strings.Builder
	if !r.Available {
		b.WriteString(r.Summary())
		b.WriteByte('\n')
		_, err := io.WriteString(w, b.String())
		return err
	}
	fmt.Fprintf(&b, "NVIDIA driver %s, CUDA %s, %d GPUs\n\n", r.DriverVersion, cudaVersion(r.CUDAVersion), len(r.GPUs))
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "GPU\tNAME\tUUID\tPCI BUS ID\tMEMORY USED/TOTAL\tCC\tNVLINKS")
	for _, g := range r.GPUs {
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s / %s\t%s\t%d\n", g.Index, g.Name, g.UUID, g.PCIBusID, gib(g.MemoryUsed), gib(g.MemoryTotal), g.ComputeCapability, g.ActiveNVLinks())
	}
	tw.Flush()
	for _, g := range r.GPUs {
		for _, e := range g.Errors {
			fmt.Fprintf(&b, "GPU%d: %s\n", g.Index, e)
		}
	}
	if len(r.GPUs) > 1 {
		b.WriteString("\nTopology:\n")
		writeMatrix(&b, r.Matrix())
		b.WriteString("\nPeer-to-peer reads:\n")
		writeMatrix(&b, r.P2PMatrix())
		b.WriteString(legend)
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// writeMatrix writes m with GPU<i> headers, aligned.
func writeMatrix(b *strings.Builder, m [][]string) {
	tw := tabwriter.NewWriter(b, 0, 0, 2, ' ', 0)
	for i := range m {
		fmt.Fprintf(tw, "\tGPU%d", i)
	}
	fmt.Fprintln(tw)
	for i, row := range m {
		fmt.Fprintf(tw, "GPU%d\t%s\n", i, strings.Join(row, "\t"))
	}
	tw.Flush()
}

const legend = `
Legend:
  X    = Self
  NV#  = a bonded set of # NVLinks (directly or through NVSwitches)
  SYS  = PCIe and the SMP interconnect between NUMA nodes (QPI/UPI)
  NODE = PCIe and the interconnect between PCIe host bridges in a NUMA node
  PHB  = PCIe and a PCIe host bridge (typically the CPU)
  PXB  = several PCIe bridges, no PCIe host bridge
  PIX  = at most a single PCIe bridge
  BRD  = the same board
  P2P: OK, CNS chipset / GNS GPU / TNS topology not supported, DIS disabled
       by the registry key, NS not supported, U unknown; ? = NVML did not say
`
