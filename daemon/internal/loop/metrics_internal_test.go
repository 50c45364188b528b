package loop

import (
	"testing"
	"time"

	"github.com/hvdd/hvdd/daemon/internal/exec"
	"github.com/hvdd/hvdd/daemon/internal/job"
	"github.com/hvdd/hvdd/daemon/metrics"
	"github.com/hvdd/hvdd/daemon/plan"
	"github.com/hvdd/hvdd/ipc/ipcpb"
	"github.com/hvdd/hvdd/tensor"
)

// opHooks runs, for one 4 KiB allreduce of two ranks, every metrics hook
// the loop and the executor call: each rank's op arrives and is answered;
// the tensor's negotiation, its batch's fusion and its latency are
// recorded once.
func opHooks(l *Loop, j *job.Job, ops []*job.Op, batch []job.Work) {
	for _, o := range ops {
		l.arrived(o)
	}
	l.negotiated(j, ops)
	l.lastDispatch = time.Now() // the loop reads the clock as it dispatches anyway
	l.fused(j, batch)
	w := &batch[0]
	if exec.Timed(w) {
		exec.MarkLatency(w, l.x.Dispatched)
	}
	for _, o := range ops {
		o.Count(ipcpb.Code_CODE_OK)
	}
}

// hookFixture is a job of two ranks with an op each, and a batch of the
// tensor's response; m nil is metrics off.
func hookFixture(m *metrics.Metrics) (*Loop, *job.Job, []*job.Op, []job.Work) {
	ln := &lane{m: m.Job("bench")}
	j := &job.Job{M: ln.m}
	buf := make([]byte, 4096)
	ops := make([]*job.Op, 2)
	for i := range ops {
		ops[i] = &job.Op{Conn: &client{lane: ln}, Type: tensor.Allreduce, Buf: buf}
	}
	batch := []job.Work{{Job: j, Ops: [][]*job.Op{ops}, Resp: plan.Response{Op: tensor.Allreduce, Tensors: []plan.Tensor{{Name: "t"}}, Bytes: 4096}}}
	return &Loop{x: &exec.Executor{}}, j, ops, batch
}

// TestOpMetricsAllocs pins the daemon's per-op hooks at zero allocations,
// metrics on (once the collective and size class were seen) and off.
func TestOpMetricsAllocs(t *testing.T) {
	for _, m := range []*metrics.Metrics{nil, metrics.New(metrics.Options{NoProcess: true})} {
		l, j, ops, batch := hookFixture(m)
		opHooks(l, j, ops, batch)
		if n := testing.AllocsPerRun(1000, func() { opHooks(l, j, ops, batch) }); n != 0 {
			t.Errorf("metrics on=%v: the hooks of one op allocate %v times, want 0", m != nil, n)
		}
	}
}

// TestOpMetricsCount checks that the hooks count what opHooks ran: two ops
// of 4 KiB answered ok, one latency sample of the 4KiB class.
func TestOpMetricsCount(t *testing.T) {
	m := metrics.New(metrics.Options{NoProcess: true})
	l, j, ops, batch := hookFixture(m)
	opHooks(l, j, ops, batch)
	fams, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, f := range fams {
		for _, mt := range f.GetMetric() {
			switch {
			case mt.Counter != nil:
				got[f.GetName()] += mt.GetCounter().GetValue()
			case mt.Histogram != nil:
				got[f.GetName()] += float64(mt.GetHistogram().GetSampleCount())
			}
		}
	}
	for name, want := range map[string]float64{
		"hvdd_ops_total": 2, "hvdd_op_bytes_total": 8192, "hvdd_op_duration_seconds": 1,
		"hvdd_negotiation_wait_seconds": 1, "hvdd_fusion_batch_tensors": 1, "hvdd_fusion_response_bytes": 1,
	} {
		if got[name] != want {
			t.Errorf("%s = %v, want %v", name, got[name], want)
		}
	}
}

// BenchmarkOpMetrics is the cost of the metrics hooks per op of a
// two-rank 4 KiB allreduce (two ops, one tensor), off and on.
func BenchmarkOpMetrics(b *testing.B) {
	for _, on := range []bool{false, true} {
		name, m := "off", (*metrics.Metrics)(nil)
		if on {
			name, m = "on", metrics.New(metrics.Options{NoProcess: true})
		}
		b.Run(name, func(b *testing.B) {
			l, j, ops, batch := hookFixture(m)
			b.ReportAllocs()
			for b.Loop() {
				opHooks(l, j, ops, batch)
			}
		})
	}
}
