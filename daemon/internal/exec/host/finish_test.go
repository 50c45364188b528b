package host_test

import (
	"testing"
	"time"

	"github.com/hvdd/hvdd/daemon/internal/exec/host"
	"github.com/hvdd/hvdd/daemon/internal/job"
	"github.com/hvdd/hvdd/daemon/internal/job/jobtest"
	"github.com/hvdd/hvdd/daemon/metrics"
	"github.com/hvdd/hvdd/tensor"
)

// TestFinishBatchedCountsBeforeAnswering checks that the batched answer of a
// fused response goes out only after each of its ops is counted and its
// tensors' latency observed (see job's TestFinishCountsBeforeAnswering).
func TestFinishBatchedCountsBeforeAnswering(t *testing.T) {
	m := metrics.New(metrics.Options{NoProcess: true})
	c := &jobtest.ScrapingConn{M: m}
	col := m.Job("j").Collective(tensor.Allreduce)
	// Two fused tensors of one rank: two ops, each its tensor's sample.
	ops := [][]*job.Op{
		{{Conn: c, Type: tensor.Allreduce, Buf: make([]byte, 64), M: col, Since: time.Now()}},
		{{Conn: c, Type: tensor.Allreduce, Buf: make([]byte, 64), M: col, Since: time.Now()}},
	}
	new(host.Path).FinishBatched(ops)
	want := jobtest.Seen{Ops: 2, Latency: 2}
	if len(c.Seen) != 2 || c.Seen[0] != want || c.Seen[1] != want {
		t.Fatalf("as the batch's answers went out a scrape saw %+v, want %+v twice", c.Seen, want)
	}
}
