package device

import "sync/atomic"

// Counts are what the device path has done to device memory since the
// daemon started, for the metrics: the steady state of a training job
// should add nothing but the work (issue 26), and these make it visible.
type Counts struct {
	// Allocs are device allocations (cuMemAlloc): fusion buffers and combine tables
	// buffers as they grow, results and device outputs.
	Allocs int64
	// Exports are IPC handles exported for clients (cuIpcGetMemHandle).
	Exports int64
	// Opens and Closes are clients' IPC memory handles and events opened
	// and closed (cuIpcOpenMemHandle, cuIpcOpenEventHandle and their
	// closes).
	Opens, Closes int64
	// Stagings are device tensors copied to host memory for the host path.
	Stagings int64
	// HostSyncs are the host's waits for a GPU (a stream synchronised, an
	// engine's work waited for, a completion event waited on before an
	// unmapping): one or more per response completed host-synchronised,
	// none per response completed ordered on the GPU (ordered.go).
	HostSyncs int64
}

// counters are Counts as the executor and the loop add to them.
type counters struct {
	allocs, exports, opens, closes, stagings, syncs atomic.Int64
}

// Counts returns what the device path has done so far; zero on a CPU-only
// node. Safe from any goroutine.
func (g *GPUs) Counts() Counts {
	if g == nil {
		return Counts{}
	}
	c := &g.counts
	return Counts{Allocs: c.allocs.Load(), Exports: c.exports.Load(), Opens: c.opens.Load(), Closes: c.closes.Load(), Stagings: c.stagings.Load(), HostSyncs: c.syncs.Load()}
}
