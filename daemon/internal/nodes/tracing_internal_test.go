package nodes

import (
	"testing"
	"time"

	"github.com/hvdd/hvdd/cluster/clusterpb"
	"github.com/hvdd/hvdd/daemon/timeline"
)

// TestNodeTraceClock: a follower's phases land on the coordinator's
// timeline clock, with the least plan delay seen as the offset, restarted
// with a new timeline.
func TestNodeTraceClock(t *testing.T) {
	tr := nodeTrace{epoch: time.Now().Add(-10 * time.Second)} // this node's clock reads 10 s
	near := func(got, want int64) bool { return got >= want && got < want+200_000 }
	tr.clock(&clusterpb.TimelineClock{Gen: 1, NowUs: 300})
	tr.Event("g", timeline.Begin, "TCP_ALLREDUCE")
	if ts := tr.events[0].GetTsUs(); !near(ts, 300) {
		t.Errorf("first event at %d µs, want about 300 on the coordinator's clock", ts)
	}
	// A plan that arrived with less delay (its coordinator time is later
	// for the same local time) moves the offset; a slower one does not.
	tr.clock(&clusterpb.TimelineClock{Gen: 1, NowUs: 900})
	tr.clock(&clusterpb.TimelineClock{Gen: 1, NowUs: 100})
	tr.Event("g", timeline.End, "")
	if ts := tr.events[1].GetTsUs(); !near(ts, 900) {
		t.Errorf("after a faster plan: event at %d µs, want about 900", ts)
	}
	// A new timeline restarts its clock: the offset follows it.
	tr.clock(&clusterpb.TimelineClock{Gen: 2, NowUs: 5})
	tr.Event("g", timeline.Begin, "SHM_ALLREDUCE")
	if ts := tr.events[2].GetTsUs(); !near(ts, 5) || tr.gen != 2 {
		t.Errorf("new timeline: event at %d µs (gen %d), want about 5 (gen 2)", ts, tr.gen)
	}
}
