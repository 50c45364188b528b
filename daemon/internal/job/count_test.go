package job_test

import (
	"testing"
	"time"

	"github.com/hvdd/hvdd/daemon/internal/job"
	"github.com/hvdd/hvdd/daemon/internal/job/jobtest"
	"github.com/hvdd/hvdd/daemon/metrics"
	"github.com/hvdd/hvdd/ipc/ipcpb"
	"github.com/hvdd/hvdd/tensor"
)

// TestFinishCountsBeforeAnswering checks that an op is counted, and its
// tensor's latency observed, before its answer goes out: a client that
// scrapes the daemon once it has its answer must see its op. (Under load,
// daemon's TestMetricsTwoJobs once missed a sample that was observed only
// after Execute returned.)
func TestFinishCountsBeforeAnswering(t *testing.T) {
	m := metrics.New(metrics.Options{NoProcess: true})
	c := &jobtest.ScrapingConn{M: m}
	col := m.Job("j").Collective(tensor.Allreduce)
	class := uint8(metrics.SizeClass(4096))
	// Rank 0 carries the tensor's latency sample (exec.MarkLatency), rank
	// 1 does not.
	ops := []*job.Op{
		{Conn: c, Type: tensor.Allreduce, Buf: make([]byte, 4096), M: col, Class: class, Since: time.Now()},
		{Conn: c, Type: tensor.Allreduce, Buf: make([]byte, 4096), M: col, Class: class},
	}
	job.FinishRows([][]*job.Op{ops}, &ipcpb.Done{})
	want := []jobtest.Seen{{Ops: 1, Latency: 1}, {Ops: 2, Latency: 1}}
	if len(c.Seen) != len(want) || c.Seen[0] != want[0] || c.Seen[1] != want[1] {
		t.Fatalf("as each answer went out a scrape saw %+v, want %+v", c.Seen, want)
	}
	if !ops[0].Since.IsZero() {
		t.Errorf("the latency sample stays on the op after it was observed: a second Count would observe it again")
	}
}
