package exec

import (
	"log/slog"
	"time"

	"github.com/hvdd/hvdd/backends"
	"github.com/hvdd/hvdd/daemon/internal/exec/device"
	"github.com/hvdd/hvdd/daemon/internal/exec/host"
	"github.com/hvdd/hvdd/daemon/internal/exec/sched"
	"github.com/hvdd/hvdd/daemon/internal/job"
	"github.com/hvdd/hvdd/daemon/internal/poll"
)

// Executor runs batches of work in order on its own goroutine, so the loop
// keeps negotiating while data moves.
type Executor struct {
	p    *poll.Poller
	host *host.Path
	dev  *device.Path
	// Work takes the loop's batches; the loop closes it as it stops, and
	// Stopped closes once the last batch ran.
	Work    chan []job.Work
	Stopped chan struct{}

	// Dispatched is when the loop dispatched the batch running now, for
	// the latency metrics (MarkLatency); set only while it is idle.
	Dispatched time.Time
}

// Config is what the executor takes of the daemon's configuration.
type Config struct {
	Log     *slog.Logger
	GPU     *device.GPUs // nil on a CPU-only node
	Workers int          // reduction workers (Config.Workers)
}

// New returns an executor that posts job.MsgExecIdle (and a failed
// collective across nodes, job.MsgExecErr) to the loop through p.
func New(cfg Config, p *poll.Poller) *Executor {
	// One Engines for both paths: a process set's engine group, made on
	// its first use on every member node, serves either path after.
	engines := new(sched.Engines)
	host := host.New(cfg.Log, p, cfg.Workers, engines)
	return &Executor{
		p:       p,
		host:    host,
		dev:     device.New(cfg.Log, cfg.GPU, host, engines, p),
		Work:    make(chan []job.Work, 1),
		Stopped: make(chan struct{}),
	}
}

// Run runs the batches sent on Work in order until Work closes; the
// executor's goroutine.
func (x *Executor) Run() {
	defer close(x.Stopped)
	for batch := range x.Work {
		for _, w := range batch {
			x.Execute(w)
		}
		x.p.Post(job.MsgExecIdle{})
	}
	x.dev.Stop()
}

// Execute runs one response's work: on the device path (GPU tensors, or a
// response the plan runs on NCCL across nodes), or on host memory; work with a tensor on a lost GPU fails instead.
// The loop calls it itself for small work while the executor's goroutine
// is idle.
func (x *Executor) Execute(w job.Work) {
	if Timed(&w) {
		MarkLatency(&w, x.Dispatched)
	}
	if err := x.dev.Lost(&w); err != nil {
		// A tensor of w is on a GPU the sampler found lost: fail it
		// before it touches any GPU (device/lost.go).
		x.dev.FailLost(w, err)
		return
	}
	if w.Resp.NCCL || job.DeviceWork(&w) {
		// The device path decides the route (device/route.go).
		x.dev.Execute(w)
		return
	}
	x.host.Execute(w)
}

// LoopRunnable reports whether a cross-node batch of this many bytes may run
// in the loop itself: small, on an engine that waits in the kernel rather
// than in Go's network poller (which would leave the loop's locked thread to
// sysmon's 10 ms poll). It saves a hand-off to the executor and back.
func LoopRunnable(b backends.Backend, bytes int64) bool {
	lr, ok := b.(backends.LoopRunnable)
	return ok && bytes <= job.InlineMultiBytes && bytes <= int64(lr.LoopRunnable())
}

// Timed reports whether w's ops are counted (their job has metrics).
func Timed(w *job.Work) bool {
	for _, row := range w.Ops {
		for _, o := range row {
			if o != nil {
				return o.M != nil
			}
		}
	}
	return false
}

// MarkLatency makes each tensor of w's first local rank's op carry the
// tensor's latency sample: as that op is counted (job.Op.Count), the time
// since its batch was dispatched goes into its collective's latency
// histogram, in that op's size class. Observed as the op is answered, not
// after Execute returns, a client that has its answer scrapes the sample.
func MarkLatency(w *job.Work, dispatched time.Time) {
	for _, row := range w.Ops {
		for _, o := range row {
			if o != nil {
				if o.M != nil {
					o.Since = dispatched
				}
				break
			}
		}
	}
}
