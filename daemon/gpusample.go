package daemon

import (
	"errors"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/hvdd/hvdd/daemon/internal/exec/device"
	"github.com/hvdd/hvdd/daemon/metrics"
	"github.com/hvdd/hvdd/gpu/nvml"
	"github.com/hvdd/hvdd/ipc/ipcpb"
)

// GPU sampling: the daemon owns the node's GPUs, so it reports them as a
// node service does. A goroutine of the Server's (never the loop's: a
// round blocks for NVML's calls, about 40 ms per GPU) opens the sampler,
// takes a round every Config.GPUSampleInterval and hands it on:
//
//	sampler --round--> Metrics.SetGPUs          (hvdd_gpu_*, /metrics)
//	               --> the last round, locked   (Server.GPUStatus: hvdd status)
//	               --> device.GPUs.MarkLost     (a GPU newly lost)
//
// in that order, so that once a loss is logged the round that saw it is
// in the metrics and the status too. Close stops the goroutine; Serve
// waits for it (a round in progress finishes first).

// GPUSampler samples the node's GPUs (Config.OpenGPUSampler); gpu/nvml's
// *Sampler is one.
type GPUSampler interface {
	// Sample reads every GPU's figures: one round. It blocks for the
	// calls (NVML's: about 40 ms per GPU). A GPU found lost has Lost set
	// in this round and every later one.
	Sample() ([]nvml.Sample, error)
	// Close releases the sampler; Sample is not called after it.
	Close() error
}

// openNVMLSampler is OpenGPUSampler's default: gpu/nvml's sampler.
func openNVMLSampler() (GPUSampler, error) {
	s, err := nvml.OpenSampler()
	if err != nil {
		return nil, err
	}
	return s, nil
}

// gpuSampling is the Server's sampling goroutine and what it keeps.
type gpuSampling struct {
	open     func() (GPUSampler, error)
	interval time.Duration
	log      *slog.Logger
	gpus     *device.GPUs     // the daemon's GPUs, told of losses; nil when CPU-only
	metrics  *metrics.Metrics // nil: none
	done     chan struct{}    // closed when run has returned

	// Used by run's goroutine only.
	xids    map[gpuKey]map[uint64]uint64 // XIDs seen per GPU, by XID
	lost    map[gpuKey]bool              // GPUs whose loss was handled
	lastErr string                       // the last round's error, logged once
	started bool                         // a round has been published

	// mu guards the fields that follow: the last round as hvdd status
	// shows it. The messages are never changed once published (a round
	// makes new ones), so GPUStatus hands them out as they are.
	mu     sync.Mutex
	status []*ipcpb.GPUStatus
	at     time.Time
	err    string
}

// gpuKey identifies a GPU across rounds.
type gpuKey struct {
	index int
	uuid  string
}

// newGPUSampling returns the sampling the Server runs, nil when it runs
// none: GPUSampleInterval negative, or neither a sampler given nor a GPU.
func (s *Server) newGPUSampling() *gpuSampling {
	c := s.cfg
	open := c.OpenGPUSampler
	if open == nil && s.gpu != nil {
		open = openNVMLSampler
	}
	if c.GPUSampleInterval < 0 || open == nil {
		return nil
	}
	return &gpuSampling{open: open, interval: c.GPUSampleInterval, log: s.log, gpus: s.gpu, metrics: c.Metrics,
		done: make(chan struct{}), xids: make(map[gpuKey]map[uint64]uint64), lost: make(map[gpuKey]bool)}
}

// run opens the sampler and takes a round at once and then every
// interval, until quit closes.
func (g *gpuSampling) run(quit <-chan struct{}) {
	defer close(g.done)
	select {
	case <-quit:
		return
	default:
	}
	smp, err := g.open()
	if err != nil {
		g.log.Info("GPU sampling off: cannot open the sampler", "err", err)
		g.setErr("cannot open the GPU sampler: " + err.Error())
		return
	}
	defer smp.Close()
	// The GPUs' series go with the sampler (one Metrics serves one
	// Server at a time).
	defer g.metrics.SetGPUs(nil)
	t := time.NewTicker(g.interval)
	defer t.Stop()
	for {
		if !g.round(smp) {
			return
		}
		select {
		case <-quit:
			return
		case <-t.C:
		}
	}
}

// round takes one round and hands it on; false when the sampler is
// closed.
func (g *gpuSampling) round(smp GPUSampler) bool {
	samples, err := smp.Sample()
	if err != nil {
		if errors.Is(err, nvml.ErrClosed) {
			return false
		}
		if msg := err.Error(); msg != g.lastErr {
			g.log.Warn("GPU sampling round failed", "err", err)
			g.lastErr = msg
		}
		g.setErr("the last sampling round failed: " + err.Error())
		return true
	}
	g.lastErr = ""
	now := time.Now()
	stats := make([]metrics.GPUStats, len(samples))
	status := make([]*ipcpb.GPUStatus, len(samples))
	for i, smp := range samples {
		stats[i] = statsOf(smp)
		k := gpuKey{smp.Index, smp.UUID}
		for _, x := range smp.XIDs {
			if g.xids[k] == nil {
				g.xids[k] = make(map[uint64]uint64)
			}
			g.xids[k][x]++
			if x != nvml.XIDFallenOffBus { // 79 is the loss, logged below
				g.log.Warn("GPU reported an XID error", "index", smp.Index, "uuid", smp.UUID, "pci", smp.PCIBusID, "xid", x)
			}
		}
		status[i] = gpuStatusOf(smp, g.xids[k])
	}
	g.metrics.SetGPUs(stats)
	g.mu.Lock()
	g.status, g.at, g.err = status, now, ""
	g.mu.Unlock()
	for _, smp := range samples {
		k := gpuKey{smp.Index, smp.UUID}
		if smp.Lost == nil || g.lost[k] {
			continue
		}
		g.lost[k] = true
		if _, ok := g.gpus.MarkLost(smp.UUID, smp.PCIBusID, lostCause{smp.Lost}); !ok {
			// MarkLost logged the daemon's own at error level.
			g.log.Warn("NVML reports a GPU lost that the daemon does not use", "index", smp.Index, "uuid", smp.UUID, "pci", smp.PCIBusID, "reason", smp.Lost.Reason)
		}
	}
	if !g.started {
		g.started = true
		g.log.Info("GPU sampling started", "gpus", len(samples), "interval", g.interval)
	}
	return true
}

// setErr records why there are no figures for hvdd status.
func (g *gpuSampling) setErr(msg string) {
	g.mu.Lock()
	g.err = msg
	g.mu.Unlock()
}

// fill sets st's GPU fields from the last round.
func (g *gpuSampling) fill(st *ipcpb.Status) {
	g.mu.Lock()
	defer g.mu.Unlock()
	st.Gpus, st.GpuSamplingError = g.status, g.err
	if !g.at.IsZero() {
		st.GpusSampledMs = g.at.UnixMilli()
	}
}

// lostCause is a sampler's LostError as the cause the device path gives
// for a lost GPU: the reason alone (the device path names the GPU), and
// NVML's LostError in its chain.
type lostCause struct{ e *nvml.LostError }

func (c lostCause) Error() string { return c.e.Reason }
func (c lostCause) Unwrap() error { return c.e }

// statsOf is the metrics' copy of a Sample (daemon/metrics imports no GPU
// code; its GPUFigures has nvml.Fields' bits).
func statsOf(s nvml.Sample) metrics.GPUStats {
	return metrics.GPUStats{
		Index: s.Index, UUID: s.UUID, Has: metrics.GPUFigures(s.Valid),
		UtilizationGPU: s.UtilizationGPU, UtilizationMemory: s.UtilizationMemory,
		MemoryUsed: s.MemoryUsed, MemoryTotal: s.MemoryTotal,
		Temperature: s.Temperature, PowerMilliwatts: s.PowerMilliwatts,
		PCIeTxBytesPerSecond: s.PCIeTxBytesPerSecond, PCIeRxBytesPerSecond: s.PCIeRxBytesPerSecond,
		NVLinkTxBytes: s.NVLinkTxBytes, NVLinkRxBytes: s.NVLinkRxBytes,
		ECCCorrected: s.ECCCorrected, ECCUncorrected: s.ECCUncorrected,
		XIDs: s.XIDs, Lost: s.Lost != nil,
	}
}

// gpuStatusOf is hvdd status's copy of a Sample, with the XIDs seen since
// the daemon began watching the GPU.
func gpuStatusOf(s nvml.Sample, xids map[uint64]uint64) *ipcpb.GPUStatus {
	g := &ipcpb.GPUStatus{
		Index: int32(s.Index), Uuid: s.UUID, PciBusId: s.PCIBusID,
		Valid: fieldNames(s.Valid), Unsupported: fieldNames(s.Unsupported),
		UtilizationGpu: s.UtilizationGPU, UtilizationMemory: s.UtilizationMemory,
		MemoryUsed: s.MemoryUsed, MemoryTotal: s.MemoryTotal,
		Temperature: s.Temperature, PowerMilliwatts: s.PowerMilliwatts,
		PcieTxBytesPerSecond: s.PCIeTxBytesPerSecond, PcieRxBytesPerSecond: s.PCIeRxBytesPerSecond,
		NvlinkTxBytes: s.NVLinkTxBytes, NvlinkRxBytes: s.NVLinkRxBytes,
		EccCorrected: s.ECCCorrected, EccUncorrected: s.ECCUncorrected,
		Errors: s.Errors,
	}
	for _, x := range slices.Sorted(maps.Keys(xids)) {
		g.Xids = append(g.Xids, &ipcpb.XIDCount{Xid: x, Count: xids[x]})
	}
	if s.Lost != nil {
		g.Lost, g.LostReason = true, s.Lost.Reason
	}
	return g
}

// fieldNames lists f's fields by gpu/nvml's names.
func fieldNames(f nvml.Fields) []string {
	if f == 0 {
		return nil
	}
	return strings.Split(f.String(), "|")
}

// GPUStatus fills st's GPU fields from the last sampling round (the loop
// asks, for hvdd status); it leaves them empty when the daemon does not
// sample its GPUs.
func (s *Server) GPUStatus(st *ipcpb.Status) {
	if s.sampling != nil {
		s.sampling.fill(st)
	}
}

// samplingStopWait bounds how long Serve waits for the sampling goroutine
// after Close: a round in progress finishes first, but an NVML call that
// hangs (a GPU falling off the bus can make them take long) must not hold
// the daemon's exit.
const samplingStopWait = 10 * time.Second

// wait waits for run to return (Close has closed its quit), at most
// samplingStopWait.
func (g *gpuSampling) wait(log *slog.Logger) {
	select {
	case <-g.done:
	case <-time.After(samplingStopWait):
		log.Warn("the GPU sampler did not stop in time; leaving it", "waited", samplingStopWait)
	}
}
