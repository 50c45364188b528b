package hvdd_test

import (
	"testing"
	"time"

	"github.com/hvdd/hvdd/daemon"
	"github.com/hvdd/hvdd/daemon/daemontest"
	"github.com/hvdd/hvdd/daemon/metrics"
)

// TestGPUDeviceOps: hvdd_gpu_device_ops_total counts what the device path
// did to GPU memory. A job of every collective on one fake GPU allocates
// and exports results and opens its ranks' IPC handles; once the job has
// ended, every handle it opened is closed again.
func TestGPUDeviceOps(t *testing.T) {
	m := metrics.New(metrics.Options{NoProcess: true})
	cfg := gpuConfig(daemon.Config{Slots: 2, FusionThreshold: 1 << 20}, 1)
	cfg.Metrics = m
	s := daemontest.Start(t, cfg)
	daemontest.Run(t, s.Socket, "gpu", 2, 180*time.Second, "HVDD_FAKE_GPUS=1")
	s.WaitLog(t, "job ended", 30*time.Second)
	ops := settledDeviceOps(t, s, m, 2)
	t.Logf("hvdd_gpu_device_ops_total: %v", ops)
	for _, kind := range []string{"allocation", "export", "open"} {
		if ops[kind] <= 0 {
			t.Errorf("%s count %v after a job of device collectives, want > 0 (all: %v)", kind, ops[kind], ops)
		}
	}
	if ops["open"] != ops["close"] {
		t.Errorf("after the job ended: %v IPC handles opened, %v closed (all: %v)", ops["open"], ops["close"], ops)
	}
}

// deviceOps gathers hvdd_gpu_device_ops_total by kind.
func deviceOps(t *testing.T, m *metrics.Metrics) map[string]float64 {
	t.Helper()
	mfs, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	ops := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != "hvdd_gpu_device_ops_total" {
			continue
		}
		for _, mt := range mf.GetMetric() {
			for _, l := range mt.GetLabel() {
				if l.GetName() == "kind" {
					ops[l.GetValue()] = mt.GetCounter().GetValue()
				}
			}
		}
	}
	if len(ops) != 5 {
		t.Fatalf("hvdd_gpu_device_ops_total has kinds %v, want allocation, export, open, close, staging", ops)
	}
	return ops
}

// settledDeviceOps returns hvdd_gpu_device_ops_total once the daemon has
// closed the device state of conns connections in all ("GPU mappings
// closed", logged once their closes are queued: the clients' hangups reach
// the daemon after the job ended) and run what that queued on the GPUs'
// housekeeping goroutine (SettleGPUs).
func settledDeviceOps(t *testing.T, s *daemontest.Server, m *metrics.Metrics, conns int) map[string]float64 {
	t.Helper()
	s.WaitLogCount(t, "GPU mappings closed", conns, 30*time.Second)
	s.SettleGPUs()
	return deviceOps(t, m)
}
