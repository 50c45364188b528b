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
	ops := settledDeviceOps(t, s, m)
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

// settledDeviceOps returns hvdd_gpu_device_ops_total once the job's
// connections are gone: their hangups reach the daemon after the job
// ended, and the closes they queue run on the GPUs' housekeeping
// goroutine (SettleGPUs). It waits, up to 30 s, until every handle opened
// is closed, and returns the counts then (or at the deadline: the caller
// checks).
func settledDeviceOps(t *testing.T, s *daemontest.Server, m *metrics.Metrics) map[string]float64 {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		s.SettleGPUs()
		ops := deviceOps(t, m)
		if ops["open"] == ops["close"] || time.Now().After(deadline) {
			return ops
		}
		time.Sleep(5 * time.Millisecond) // the poll's pace, not a synchronisation
	}
}
