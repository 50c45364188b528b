package metrics

import (
	"maps"
	"slices"
	"strconv"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// GPUFigures is a set of the figures of a GPUStats, one bit each, in the
// order and with the bits of gpu/nvml's Fields (Sample.Valid), so that the
// daemon converts one into the other: GPUFigures(sample.Valid).
type GPUFigures uint16

// The figures of a GPUStats.
const (
	GPUUtilization GPUFigures = 1 << iota // UtilizationGPU, UtilizationMemory
	GPUMemory                             // MemoryUsed, MemoryTotal
	GPUTemperature                        // Temperature
	GPUPower                              // PowerMilliwatts
	GPUPCIe                               // PCIeTxBytesPerSecond, PCIeRxBytesPerSecond
	GPUNVLink                             // NVLinkTxBytes, NVLinkRxBytes
	GPUECC                                // ECCCorrected, ECCUncorrected
	GPUXID                                // XID events are watched (no series of its own)
)

// GPUStats is one GPU's figures from one sampling round, named and in the
// units of gpu/nvml's Sample, from which the daemon copies them (this
// package imports no GPU code). Only the figures in Has are exported; the
// others' series are left out of the scrape until a round has them.
type GPUStats struct {
	// Index (NVML's) and UUID are the series' gpu and uuid labels.
	Index int
	UUID  string
	// Has holds the figures below that were read this round.
	Has GPUFigures

	// UtilizationGPU and UtilizationMemory are percentages (exported as
	// ratios).
	UtilizationGPU    uint32
	UtilizationMemory uint32
	// MemoryUsed and MemoryTotal are bytes.
	MemoryUsed  uint64
	MemoryTotal uint64
	// Temperature is degrees Celsius.
	Temperature uint32
	// PowerMilliwatts is the board's draw (exported in watts).
	PowerMilliwatts uint32
	// PCIeTxBytesPerSecond and PCIeRxBytesPerSecond are PCIe throughput.
	PCIeTxBytesPerSecond uint64
	PCIeRxBytesPerSecond uint64
	// NVLinkTxBytes, NVLinkRxBytes, ECCCorrected and ECCUncorrected are
	// counters NVML keeps since the driver loaded (exported as counters:
	// a driver reload resets them, which Prometheus's rate() allows for).
	NVLinkTxBytes  uint64
	NVLinkRxBytes  uint64
	ECCCorrected   uint64
	ECCUncorrected uint64

	// XIDs are the XID errors reported since the previous round, each
	// counted once into hvdd_gpu_xid_errors_total.
	XIDs []uint64
	// Lost is true once the GPU is lost (hvdd_gpu_lost 1).
	Lost bool
}

// gpuLabels are the labels of every GPU series.
var gpuLabels = []string{"gpu", "uuid"}

// gpuCollector exports the last round of GPUStats (SetGPUs) at scrape
// time, as constant metrics: the gauges as they were read, the NVML
// counters as counters, and the XIDs counted since each GPU was first
// seen.
type gpuCollector struct {
	util, memUtil, memUsed, memTotal, temp, power *prometheus.Desc
	pcieTx, pcieRx, nvlinkTx, nvlinkRx, ecc, xid  *prometheus.Desc
	lost                                          *prometheus.Desc

	// mu guards the fields that follow.
	mu   sync.Mutex
	gpus []GPUStats // the last round, XIDs dropped
	// xids counts each GPU's XIDs by XID, for the GPUs of the last round.
	xids map[gpuKey]map[uint64]uint64
}

// gpuKey identifies a GPU across rounds.
type gpuKey struct {
	index int
	uuid  string
}

func newGPUCollector() *gpuCollector {
	d := func(name, help string, extra ...string) *prometheus.Desc {
		return prometheus.NewDesc(name, help, append(slices.Clone(gpuLabels), extra...), nil)
	}
	return &gpuCollector{
		util:     d("hvdd_gpu_utilization_ratio", "Fraction of NVML's last sample period (1/6 s to 1 s, by product) during which a kernel ran on the GPU, by GPU (NVML index and UUID)."),
		memUtil:  d("hvdd_gpu_memory_utilization_ratio", "Fraction of NVML's last sample period during which the GPU's memory was read or written, by GPU."),
		memUsed:  d("hvdd_gpu_memory_used_bytes", "Device memory in use, by GPU."),
		memTotal: d("hvdd_gpu_memory_total_bytes", "Device memory in all, by GPU."),
		temp:     d("hvdd_gpu_temperature_celsius", "GPU die temperature, by GPU."),
		power:    d("hvdd_gpu_power_watts", "Board power draw, by GPU."),
		pcieTx:   d("hvdd_gpu_pcie_sent_bytes_per_second", "PCIe throughput out of the GPU over NVML's 20 ms window, by GPU."),
		pcieRx:   d("hvdd_gpu_pcie_received_bytes_per_second", "PCIe throughput into the GPU over NVML's 20 ms window, by GPU."),
		nvlinkTx: d("hvdd_gpu_nvlink_sent_bytes_total", "Data bytes sent over the GPU's NVLinks since the driver loaded, by GPU; absent without NVLink."),
		nvlinkRx: d("hvdd_gpu_nvlink_received_bytes_total", "Data bytes received over the GPU's NVLinks since the driver loaded, by GPU; absent without NVLink."),
		ecc:      d("hvdd_gpu_ecc_errors_total", "Device memory errors since the driver loaded (NVML's volatile counts), by GPU and type (corrected, uncorrected); absent without ECC.", "type"),
		xid:      d("hvdd_gpu_xid_errors_total", "XID errors the driver reported for the GPU since the daemon began watching it, by GPU and XID.", "xid"),
		lost:     d("hvdd_gpu_lost", "1 once the GPU is lost (NVML's GPU_IS_LOST, or XID 79: fallen off the bus), else 0, by GPU."),
		xids:     make(map[gpuKey]map[uint64]uint64),
	}
}

// Describe sends the GPU families' descriptors.
func (c *gpuCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.util, c.memUtil, c.memUsed, c.memTotal, c.temp, c.power,
		c.pcieTx, c.pcieRx, c.nvlinkTx, c.nvlinkRx, c.ecc, c.xid, c.lost} {
		ch <- d
	}
}

// Collect sends the last round's series.
func (c *gpuCollector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, g := range c.gpus {
		gpu := strconv.Itoa(g.Index)
		send := func(d *prometheus.Desc, t prometheus.ValueType, v float64, extra ...string) {
			ch <- prometheus.MustNewConstMetric(d, t, v, append([]string{gpu, g.UUID}, extra...)...)
		}
		gauge := func(d *prometheus.Desc, v float64) { send(d, prometheus.GaugeValue, v) }
		if g.Has&GPUUtilization != 0 {
			gauge(c.util, float64(g.UtilizationGPU)/100)
			gauge(c.memUtil, float64(g.UtilizationMemory)/100)
		}
		if g.Has&GPUMemory != 0 {
			gauge(c.memUsed, float64(g.MemoryUsed))
			gauge(c.memTotal, float64(g.MemoryTotal))
		}
		if g.Has&GPUTemperature != 0 {
			gauge(c.temp, float64(g.Temperature))
		}
		if g.Has&GPUPower != 0 {
			gauge(c.power, float64(g.PowerMilliwatts)/1000)
		}
		if g.Has&GPUPCIe != 0 {
			gauge(c.pcieTx, float64(g.PCIeTxBytesPerSecond))
			gauge(c.pcieRx, float64(g.PCIeRxBytesPerSecond))
		}
		if g.Has&GPUNVLink != 0 {
			send(c.nvlinkTx, prometheus.CounterValue, float64(g.NVLinkTxBytes))
			send(c.nvlinkRx, prometheus.CounterValue, float64(g.NVLinkRxBytes))
		}
		if g.Has&GPUECC != 0 {
			send(c.ecc, prometheus.CounterValue, float64(g.ECCCorrected), "corrected")
			send(c.ecc, prometheus.CounterValue, float64(g.ECCUncorrected), "uncorrected")
		}
		xids := c.xids[gpuKey{g.Index, g.UUID}]
		for _, x := range slices.Sorted(maps.Keys(xids)) {
			send(c.xid, prometheus.CounterValue, float64(xids[x]), strconv.FormatUint(x, 10))
		}
		lost := 0.0
		if g.Lost {
			lost = 1
		}
		gauge(c.lost, lost)
	}
}

// set makes stats the last round: its GPUs' figures replace the previous
// round's, their XIDs are counted, and the GPUs it lacks lose their series
// (their XID counts too).
func (c *gpuCollector) set(stats []GPUStats) {
	c.mu.Lock()
	defer c.mu.Unlock()
	seen := make(map[gpuKey]bool, len(stats))
	c.gpus = c.gpus[:0]
	for _, g := range stats {
		k := gpuKey{g.Index, g.UUID}
		seen[k] = true
		if len(g.XIDs) > 0 {
			if c.xids[k] == nil {
				c.xids[k] = make(map[uint64]uint64)
			}
			for _, x := range g.XIDs {
				c.xids[k][x]++
			}
		}
		g.XIDs = nil
		c.gpus = append(c.gpus, g)
	}
	for k := range c.xids {
		if !seen[k] {
			delete(c.xids, k)
		}
	}
}

// SetGPUs records a sampling round of the node's GPUs (one GPUStats per
// GPU, as gpu/nvml's Sampler.Sample gave them): the hvdd_gpu_* series
// show it from the next scrape on. A GPU missing from stats loses its
// series; nil stats remove them all. It is safe for concurrent use (a
// scrape in progress delays it briefly); the daemon calls it from its
// sampling goroutine after each Sample. A nil Metrics does nothing.
func (m *Metrics) SetGPUs(stats []GPUStats) {
	if m == nil {
		return
	}
	m.gpus.set(stats)
}
