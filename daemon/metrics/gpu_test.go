package metrics

import (
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// gpuFamilies are the names of the GPU families.
var gpuFamilies = []string{
	"hvdd_gpu_utilization_ratio", "hvdd_gpu_memory_utilization_ratio", "hvdd_gpu_memory_used_bytes",
	"hvdd_gpu_memory_total_bytes", "hvdd_gpu_temperature_celsius", "hvdd_gpu_power_watts",
	"hvdd_gpu_pcie_sent_bytes_per_second", "hvdd_gpu_pcie_received_bytes_per_second",
	"hvdd_gpu_nvlink_sent_bytes_total", "hvdd_gpu_nvlink_received_bytes_total",
	"hvdd_gpu_ecc_errors_total", "hvdd_gpu_xid_errors_total", "hvdd_gpu_lost",
}

// h100 is a GPU's round with every figure.
func h100(i int, uuid string) GPUStats {
	return GPUStats{
		Index: i, UUID: uuid,
		Has:            GPUUtilization | GPUMemory | GPUTemperature | GPUPower | GPUPCIe | GPUNVLink | GPUECC | GPUXID,
		UtilizationGPU: 87, UtilizationMemory: 40, MemoryUsed: 10 << 30, MemoryTotal: 80 << 30,
		Temperature: 61, PowerMilliwatts: 512500, PCIeTxBytesPerSecond: 1 << 20, PCIeRxBytesPerSecond: 2 << 20,
		NVLinkTxBytes: 1 << 40, NVLinkRxBytes: 2 << 40, ECCCorrected: 3, ECCUncorrected: 1,
	}
}

func TestGPUs(t *testing.T) {
	m := New(Options{NoProcess: true})
	g0 := h100(0, "GPU-aaaa")
	g0.XIDs = []uint64{13, 48, 13}
	// GPU 1: a PCIe card without NVLink or ECC, and no power reading.
	g1 := GPUStats{Index: 1, UUID: "GPU-bbbb", Has: GPUUtilization | GPUMemory | GPUTemperature | GPUPCIe,
		UtilizationGPU: 5, MemoryUsed: 1 << 30, MemoryTotal: 24 << 30, Temperature: 40, PowerMilliwatts: 99999, NVLinkTxBytes: 7}
	m.SetGPUs([]GPUStats{g0, g1})
	want := `
# HELP hvdd_gpu_ecc_errors_total Device memory errors since the driver loaded (NVML's volatile counts), by GPU and type (corrected, uncorrected); absent without ECC.
# TYPE hvdd_gpu_ecc_errors_total counter
hvdd_gpu_ecc_errors_total{gpu="0",type="corrected",uuid="GPU-aaaa"} 3
hvdd_gpu_ecc_errors_total{gpu="0",type="uncorrected",uuid="GPU-aaaa"} 1
# HELP hvdd_gpu_lost 1 once the GPU is lost (NVML's GPU_IS_LOST, or XID 79: fallen off the bus), else 0, by GPU.
# TYPE hvdd_gpu_lost gauge
hvdd_gpu_lost{gpu="0",uuid="GPU-aaaa"} 0
hvdd_gpu_lost{gpu="1",uuid="GPU-bbbb"} 0
# HELP hvdd_gpu_memory_total_bytes Device memory in all, by GPU.
# TYPE hvdd_gpu_memory_total_bytes gauge
hvdd_gpu_memory_total_bytes{gpu="0",uuid="GPU-aaaa"} 8.589934592e+10
hvdd_gpu_memory_total_bytes{gpu="1",uuid="GPU-bbbb"} 2.5769803776e+10
# HELP hvdd_gpu_memory_used_bytes Device memory in use, by GPU.
# TYPE hvdd_gpu_memory_used_bytes gauge
hvdd_gpu_memory_used_bytes{gpu="0",uuid="GPU-aaaa"} 1.073741824e+10
hvdd_gpu_memory_used_bytes{gpu="1",uuid="GPU-bbbb"} 1.073741824e+09
# HELP hvdd_gpu_memory_utilization_ratio Fraction of NVML's last sample period during which the GPU's memory was read or written, by GPU.
# TYPE hvdd_gpu_memory_utilization_ratio gauge
hvdd_gpu_memory_utilization_ratio{gpu="0",uuid="GPU-aaaa"} 0.4
hvdd_gpu_memory_utilization_ratio{gpu="1",uuid="GPU-bbbb"} 0
# HELP hvdd_gpu_nvlink_received_bytes_total Data bytes received over the GPU's NVLinks since the driver loaded, by GPU; absent without NVLink.
# TYPE hvdd_gpu_nvlink_received_bytes_total counter
hvdd_gpu_nvlink_received_bytes_total{gpu="0",uuid="GPU-aaaa"} 2.199023255552e+12
# HELP hvdd_gpu_nvlink_sent_bytes_total Data bytes sent over the GPU's NVLinks since the driver loaded, by GPU; absent without NVLink.
# TYPE hvdd_gpu_nvlink_sent_bytes_total counter
hvdd_gpu_nvlink_sent_bytes_total{gpu="0",uuid="GPU-aaaa"} 1.099511627776e+12
# HELP hvdd_gpu_pcie_received_bytes_per_second PCIe throughput into the GPU over NVML's 20 ms window, by GPU.
# TYPE hvdd_gpu_pcie_received_bytes_per_second gauge
hvdd_gpu_pcie_received_bytes_per_second{gpu="0",uuid="GPU-aaaa"} 2.097152e+06
hvdd_gpu_pcie_received_bytes_per_second{gpu="1",uuid="GPU-bbbb"} 0
# HELP hvdd_gpu_pcie_sent_bytes_per_second PCIe throughput out of the GPU over NVML's 20 ms window, by GPU.
# TYPE hvdd_gpu_pcie_sent_bytes_per_second gauge
hvdd_gpu_pcie_sent_bytes_per_second{gpu="0",uuid="GPU-aaaa"} 1.048576e+06
hvdd_gpu_pcie_sent_bytes_per_second{gpu="1",uuid="GPU-bbbb"} 0
# HELP hvdd_gpu_power_watts Board power draw, by GPU.
# TYPE hvdd_gpu_power_watts gauge
hvdd_gpu_power_watts{gpu="0",uuid="GPU-aaaa"} 512.5
# HELP hvdd_gpu_temperature_celsius GPU die temperature, by GPU.
# TYPE hvdd_gpu_temperature_celsius gauge
hvdd_gpu_temperature_celsius{gpu="0",uuid="GPU-aaaa"} 61
hvdd_gpu_temperature_celsius{gpu="1",uuid="GPU-bbbb"} 40
# HELP hvdd_gpu_utilization_ratio Fraction of NVML's last sample period (1/6 s to 1 s, by product) during which a kernel ran on the GPU, by GPU (NVML index and UUID).
# TYPE hvdd_gpu_utilization_ratio gauge
hvdd_gpu_utilization_ratio{gpu="0",uuid="GPU-aaaa"} 0.87
hvdd_gpu_utilization_ratio{gpu="1",uuid="GPU-bbbb"} 0.05
# HELP hvdd_gpu_xid_errors_total XID errors the driver reported for the GPU since the daemon began watching it, by GPU and XID.
# TYPE hvdd_gpu_xid_errors_total counter
hvdd_gpu_xid_errors_total{gpu="0",uuid="GPU-aaaa",xid="13"} 2
hvdd_gpu_xid_errors_total{gpu="0",uuid="GPU-aaaa",xid="48"} 1
`
	if err := testutil.GatherAndCompare(m.Registry(), strings.NewReader(want), gpuFamilies...); err != nil {
		t.Error(err)
	}
}

// TestGPURounds: each round replaces the last: XIDs add up, a figure not
// read this round and a GPU not in the round lose their series, a lost
// GPU says so.
func TestGPURounds(t *testing.T) {
	m := New(Options{NoProcess: true})
	g0, g1 := h100(0, "GPU-aaaa"), h100(1, "GPU-bbbb")
	g0.XIDs, g1.XIDs = []uint64{31}, []uint64{79}
	m.SetGPUs([]GPUStats{g0, g1})
	g0.XIDs = []uint64{31, 43}
	g0.Has &^= GPUPower
	g0.ECCCorrected = 4
	m.SetGPUs([]GPUStats{g0})
	count := func(name string) int {
		t.Helper()
		n, err := testutil.GatherAndCount(m.Registry(), name)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	for name, want := range map[string]int{
		"hvdd_gpu_power_watts": 0, "hvdd_gpu_utilization_ratio": 1, "hvdd_gpu_lost": 1,
		"hvdd_gpu_xid_errors_total": 2, "hvdd_gpu_ecc_errors_total": 2,
	} {
		if got := count(name); got != want {
			t.Errorf("%s: %d series, want %d", name, got, want)
		}
	}
	want := `
# HELP hvdd_gpu_xid_errors_total XID errors the driver reported for the GPU since the daemon began watching it, by GPU and XID.
# TYPE hvdd_gpu_xid_errors_total counter
hvdd_gpu_xid_errors_total{gpu="0",uuid="GPU-aaaa",xid="31"} 2
hvdd_gpu_xid_errors_total{gpu="0",uuid="GPU-aaaa",xid="43"} 1
# HELP hvdd_gpu_ecc_errors_total Device memory errors since the driver loaded (NVML's volatile counts), by GPU and type (corrected, uncorrected); absent without ECC.
# TYPE hvdd_gpu_ecc_errors_total counter
hvdd_gpu_ecc_errors_total{gpu="0",type="corrected",uuid="GPU-aaaa"} 4
hvdd_gpu_ecc_errors_total{gpu="0",type="uncorrected",uuid="GPU-aaaa"} 1
`
	if err := testutil.GatherAndCompare(m.Registry(), strings.NewReader(want), "hvdd_gpu_xid_errors_total", "hvdd_gpu_ecc_errors_total"); err != nil {
		t.Error(err)
	}
	// GPU 1 comes back lost: its XID count starts again.
	g1.Lost, g1.XIDs, g1.Has = true, []uint64{79}, GPUXID
	m.SetGPUs([]GPUStats{g0, g1})
	want = `
# HELP hvdd_gpu_lost 1 once the GPU is lost (NVML's GPU_IS_LOST, or XID 79: fallen off the bus), else 0, by GPU.
# TYPE hvdd_gpu_lost gauge
hvdd_gpu_lost{gpu="0",uuid="GPU-aaaa"} 0
hvdd_gpu_lost{gpu="1",uuid="GPU-bbbb"} 1
# HELP hvdd_gpu_xid_errors_total XID errors the driver reported for the GPU since the daemon began watching it, by GPU and XID.
# TYPE hvdd_gpu_xid_errors_total counter
hvdd_gpu_xid_errors_total{gpu="0",uuid="GPU-aaaa",xid="31"} 3
hvdd_gpu_xid_errors_total{gpu="0",uuid="GPU-aaaa",xid="43"} 2
hvdd_gpu_xid_errors_total{gpu="1",uuid="GPU-bbbb",xid="79"} 1
`
	if err := testutil.GatherAndCompare(m.Registry(), strings.NewReader(want), "hvdd_gpu_lost", "hvdd_gpu_xid_errors_total"); err != nil {
		t.Error(err)
	}
	if got := count("hvdd_gpu_memory_used_bytes"); got != 1 {
		t.Errorf("memory series %d, want GPU 0's only (GPU 1 lost, no figures)", got)
	}
	m.SetGPUs(nil)
	for _, name := range []string{"hvdd_gpu_lost", "hvdd_gpu_xid_errors_total", "hvdd_gpu_utilization_ratio"} {
		if got := count(name); got != 0 {
			t.Errorf("%s: %d series after SetGPUs(nil)", name, got)
		}
	}
	var nilMetrics *Metrics
	nilMetrics.SetGPUs([]GPUStats{g0}) // does nothing
}

// TestGPUsServed: the GPU families are in /metrics with the rest, and
// pass client_golang's lint (names, units, help).
func TestGPUsServed(t *testing.T) {
	m := New(Options{NoProcess: true})
	m.SetGPUs([]GPUStats{h100(0, "GPU-aaaa")})
	rec := httptest.NewRecorder()
	m.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	if body := rec.Body.String(); rec.Code != 200 || !strings.Contains(body, `hvdd_gpu_power_watts{gpu="0",uuid="GPU-aaaa"} 512.5`) ||
		!strings.Contains(body, "hvdd_build_info") {
		t.Errorf("/metrics: %d\n%s", rec.Code, body)
	}
	probs, err := testutil.CollectAndLint(m.gpus)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range probs {
		t.Errorf("lint %s: %s", p.Metric, p.Text)
	}
}
