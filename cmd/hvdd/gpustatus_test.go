package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http/httptest"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/hvdd/hvdd/daemon"
	"github.com/hvdd/hvdd/daemon/daemontest"
	"github.com/hvdd/hvdd/daemon/metrics"
	"github.com/hvdd/hvdd/gpu/fake"
)

// gpuStatusJSON is the GPU part of `hvdd status --json`.
type gpuStatusJSON struct {
	GPUsSampledMs    string `json:"gpus_sampled_ms"`
	GPUSamplingError string `json:"gpu_sampling_error"`
	GPUs             []struct {
		Index             int      `json:"index"`
		UUID              string   `json:"uuid"`
		PCIBusID          string   `json:"pci_bus_id"`
		Valid             []string `json:"valid"`
		UtilizationGPU    int      `json:"utilization_gpu"`
		UtilizationMemory int      `json:"utilization_memory"`
		MemoryUsed        string   `json:"memory_used"`
		MemoryTotal       string   `json:"memory_total"`
		Temperature       int      `json:"temperature"`
		PowerMilliwatts   int      `json:"power_milliwatts"`
		PCIeTx            string   `json:"pcie_tx_bytes_per_second"`
		NVLinkRx          string   `json:"nvlink_rx_bytes"`
		ECCCorrected      string   `json:"ecc_corrected"`
		XIDs              []struct {
			XID   string `json:"xid"`
			Count string `json:"count"`
		} `json:"xids"`
		Lost       bool   `json:"lost"`
		LostReason string `json:"lost_reason"`
	} `json:"gpus"`
}

// TestStatusGPUs runs a daemon with two fake GPUs and a fake sampler
// (daemontest.GPUSampler) whose first round has GPU 0 report XID 13 and
// GPU 1 fall off the bus (XID 79): `hvdd status` (JSON and table) and
// /metrics show GPU 0's figures and XID, GPU 1 lost; Close stops the
// sampler and the GPU series go.
func TestStatusGPUs(t *testing.T) {
	smp := daemontest.NewGPUSampler(2)
	smp.XID(0, 13)
	smp.Lose(1)
	m := metrics.New(metrics.Options{Version: daemon.Version})
	s := daemontest.Start(t, daemon.Config{Slots: 1, GPU: fake.New(fake.Options{Devices: 2}), Metrics: m, OpenGPUSampler: smp.Open})
	// Logged once the first round is in the metrics and the status.
	s.WaitLog(t, "GPU sampling started", 30*time.Second)

	out, err := exec.Command(hvddBin, "status", "--json", "--socket", s.Socket).Output()
	if err != nil {
		t.Fatalf("hvdd status --json: %v\n%s", err, out)
	}
	var st gpuStatusJSON
	if err := json.Unmarshal(out, &st); err != nil {
		t.Fatalf("hvdd status --json: %v\n%s", err, out)
	}
	if len(st.GPUs) != 2 || st.GPUsSampledMs == "" || st.GPUSamplingError != "" {
		t.Fatalf("status GPUs: %+v\n%s", st, out)
	}
	g0, g1 := st.GPUs[0], st.GPUs[1]
	want0 := daemontest.GPUFigures(0)
	if g0.Index != 0 || g0.UUID != fake.UUID(0) || g0.PCIBusID != "0000:01:00.0" || g0.Lost ||
		len(g0.Valid) != 8 || g0.UtilizationGPU != 40 || g0.UtilizationMemory != 20 ||
		g0.MemoryUsed != fmt.Sprint(want0.MemoryUsed) || g0.MemoryTotal != fmt.Sprint(80<<30) ||
		g0.Temperature != 50 || g0.PowerMilliwatts != 250000 || g0.PCIeTx != fmt.Sprint(want0.PCIeTxBytesPerSecond) ||
		g0.NVLinkRx != fmt.Sprint(want0.NVLinkRxBytes) || g0.ECCCorrected != "7" ||
		len(g0.XIDs) != 1 || g0.XIDs[0].XID != "13" || g0.XIDs[0].Count != "1" {
		t.Errorf("GPU 0: %+v, want daemontest.GPUFigures(0) and XID 13 once\n%s", g0, out)
	}
	if g1.Index != 1 || g1.UUID != fake.UUID(1) || g1.PCIBusID != "0000:02:00.0" || !g1.Lost ||
		g1.LostReason != "XID 79 (fallen off the bus)" || g1.UtilizationGPU != 0 ||
		len(g1.XIDs) != 1 || g1.XIDs[0].XID != "79" {
		t.Errorf("GPU 1: %+v, want it lost by XID 79, without figures\n%s", g1, out)
	}

	table, err := exec.Command(hvddBin, "status", "--socket", s.Socket).Output()
	if err != nil {
		t.Fatalf("hvdd status: %v\n%s", err, table)
	}
	for _, want := range []string{
		"GPUs (NVML, sampled ",
		"GPU 0 " + fake.UUID(0) + " (PCI 0000:01:00.0): 40% busy, memory 20% busy, 1.0 GiB of 80.0 GiB used, 50 C, 250.0 W\n",
		"PCIe 10.0 MiB/s out, 20.0 MiB/s in; NVLink 3.0 TiB sent, 4.0 TiB received; ECC errors 7 corrected, 0 uncorrected; XID errors 13 (x1)\n",
		"GPU 1 " + fake.UUID(1) + " (PCI 0000:02:00.0): LOST (XID 79 (fallen off the bus)): its GPU tensors fail\n",
	} {
		if !strings.Contains(string(table), want) {
			t.Errorf("hvdd status lacks %q:\n%s", want, table)
		}
	}

	scrape := func() string {
		rec := httptest.NewRecorder()
		m.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
		return rec.Body.String()
	}
	l0 := fmt.Sprintf(`gpu="0",uuid="%s"`, fake.UUID(0))
	l1 := fmt.Sprintf(`gpu="1",uuid="%s"`, fake.UUID(1))
	body := scrape()
	for _, want := range []string{
		"hvdd_gpu_utilization_ratio{" + l0 + "} 0.4\n",
		"hvdd_gpu_memory_used_bytes{" + l0 + "} 1.073741824e+09\n",
		"hvdd_gpu_temperature_celsius{" + l0 + "} 50\n",
		"hvdd_gpu_power_watts{" + l0 + "} 250\n",
		"hvdd_gpu_pcie_sent_bytes_per_second{" + l0 + "} 1.048576e+07\n",
		"hvdd_gpu_nvlink_received_bytes_total{" + l0 + "} 4.398046511104e+12\n",
		fmt.Sprintf(`hvdd_gpu_ecc_errors_total{gpu="0",type="corrected",uuid="%s"} 7`, fake.UUID(0)) + "\n",
		"hvdd_gpu_xid_errors_total{" + l0 + `,xid="13"} 1` + "\n",
		"hvdd_gpu_lost{" + l0 + "} 0\n",
		"hvdd_gpu_xid_errors_total{" + l1 + `,xid="79"} 1` + "\n",
		"hvdd_gpu_lost{" + l1 + "} 1\n",
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	if strings.Contains(body, "hvdd_gpu_utilization_ratio{"+l1) {
		t.Errorf("/metrics has figures of the lost GPU 1")
	}
	if t.Failed() {
		t.Logf("/metrics:\n%s", body)
	}
	if n := strings.Count(s.Logs(), "GPU lost"); n != 1 {
		t.Errorf("%d \"GPU lost\" log lines, want 1", n)
	}

	s.Stop(t)
	if !smp.Closed() {
		t.Error("the daemon did not close its sampler")
	}
	if body := scrape(); strings.Contains(body, "hvdd_gpu_") {
		t.Errorf("GPU series left after the daemon stopped:\n%s", body)
	}
}

// TestStatusGPUSamplingFails: a sampler that cannot open (no NVML) leaves
// the daemon unsampled, and hvdd status says why; with no GPU and no
// sampler given, the daemon samples nothing and says nothing.
func TestStatusGPUSamplingFails(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  daemon.Config
		want string // in the table; "" for no GPU lines at all
	}{
		{"open fails", daemon.Config{Slots: 1, GPU: fake.New(fake.Options{Devices: 1}),
			OpenGPUSampler: func() (daemon.GPUSampler, error) { return nil, errors.New("no libnvidia-ml.so.1") }},
			"GPU sampling: cannot open the GPU sampler: no libnvidia-ml.so.1\n"},
		{"no GPU", daemon.Config{Slots: 1}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := daemontest.Start(t, tc.cfg)
			if tc.want != "" {
				s.WaitLog(t, "GPU sampling off", 30*time.Second)
			}
			table, err := exec.Command(hvddBin, "status", "--socket", s.Socket).Output()
			if err != nil {
				t.Fatalf("hvdd status: %v\n%s", err, table)
			}
			if tc.want == "" && strings.Contains(string(table), "GPU") || tc.want != "" && !strings.Contains(string(table), tc.want) {
				t.Errorf("hvdd status: want %q:\n%s", tc.want, table)
			}
		})
	}
}
