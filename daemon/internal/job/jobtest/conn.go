// Package jobtest has test doubles for the job package's interfaces.
package jobtest

import (
	"errors"

	"github.com/hvdd/hvdd/daemon/metrics"
	"github.com/hvdd/hvdd/ipc/ipcpb"
)

// Seen is what a scrape of the daemon's metrics saw as an answer went out:
// hvdd_ops_total summed over its series, and the number of
// hvdd_op_duration_seconds samples.
type Seen struct {
	Ops, Latency float64
}

// ScrapingConn is a job.Conn that, as each answer goes out (Reply, or each
// id of a SendBatch), gathers M's registry and records what it saw: what a
// client that scrapes the daemon once it has its answer would see.
type ScrapingConn struct {
	noOutput
	M    *metrics.Metrics
	Seen []Seen
}

// PID implements job.Conn.
func (c *ScrapingConn) PID() int32 { return 1 }

// Rank implements job.Conn.
func (c *ScrapingConn) Rank() int { return 0 }

// Reply implements job.Conn.
func (c *ScrapingConn) Reply(uint32, *ipcpb.Done) { c.scrape() }

// SendBatch implements job.Conn.
func (c *ScrapingConn) SendBatch(ids []uint32, _ []*ipcpb.ServerMessage) error {
	for range ids {
		c.scrape()
	}
	return nil
}

// noOutput is the output region of the doubles: none.
type noOutput struct{}

// AllocOutput implements job.Conn: the doubles have no output region.
func (noOutput) AllocOutput(int64) ([]byte, *ipcpb.Buffer, error) {
	return nil, nil, errors.New("jobtest: no output region")
}

// OutputBytes implements job.Conn.
func (noOutput) OutputBytes(*ipcpb.Buffer) ([]byte, error) {
	return nil, errors.New("jobtest: no output region")
}

// ReleaseOutput implements job.Conn.
func (noOutput) ReleaseOutput(*ipcpb.Buffer) error { return nil }

func (c *ScrapingConn) scrape() {
	var s Seen
	fams, err := c.M.Registry().Gather()
	if err != nil {
		panic(err)
	}
	for _, f := range fams {
		for _, mt := range f.GetMetric() {
			switch f.GetName() {
			case "hvdd_ops_total":
				s.Ops += mt.GetCounter().GetValue()
			case "hvdd_op_duration_seconds":
				s.Latency += float64(mt.GetHistogram().GetSampleCount())
			}
		}
	}
	c.Seen = append(c.Seen, s)
}

// AnswerConn is a job.Conn that keeps the answer to each request id.
type AnswerConn struct {
	noOutput
	R       int
	Answers map[uint32]*ipcpb.Done
}

// PID implements job.Conn.
func (c *AnswerConn) PID() int32 { return int32(100 + c.R) }

// Rank implements job.Conn.
func (c *AnswerConn) Rank() int { return c.R }

// Reply implements job.Conn.
func (c *AnswerConn) Reply(id uint32, d *ipcpb.Done) {
	if c.Answers == nil {
		c.Answers = map[uint32]*ipcpb.Done{}
	}
	c.Answers[id] = d
}

// SendBatch implements job.Conn.
func (c *AnswerConn) SendBatch(ids []uint32, ms []*ipcpb.ServerMessage) error {
	for i, id := range ids {
		c.Reply(id, ms[i].GetDone())
	}
	return nil
}
