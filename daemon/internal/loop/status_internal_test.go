package loop

import (
	"testing"
	"time"

	"github.com/hvdd/hvdd/daemon/internal/job"
)

// TestStatusVisibility: root and the daemon's uid see every job; another
// user sees its own and a count of the others, and only its jobs' errors.
func TestStatusVisibility(t *testing.T) {
	l := &Loop{cfg: Config{Slots: 4, UID: 1000}, epoch: time.Now(), lanes: map[laneKey]*lane{}}
	for i, key := range []laneKey{{uid: 1000, name: "svc"}, {uid: 2000, name: "mine"}, {uid: 3000, name: "theirs"}} {
		ln := &lane{key: key, size: 1}
		ln.job = &job.Job{UID: key.uid, Name: key.name, M: ln.m, ID: uint64(i + 1), Slots: make([]job.Conn, 1), Pending: map[job.OpKey]*job.Op{}}
		l.lanes[key] = ln
		l.order = append(l.order, ln)
		l.noteError(ln.job, "error of "+key.name)
	}
	l.noteError(nil, "refused someone")
	names := func(uid uint32) (jobs []string, hidden int32, errs []string) {
		st := l.status(uid, 0)
		for _, j := range st.GetJobs() {
			jobs = append(jobs, j.GetName())
		}
		for _, e := range st.GetErrors() {
			errs = append(errs, e.GetError())
		}
		if st.GetSlotsUsed() != 3 {
			t.Errorf("uid %d: slots used %d, want 3 (every job's)", uid, st.GetSlotsUsed())
		}
		return jobs, st.GetHiddenJobs(), errs
	}
	for _, uid := range []uint32{0, 1000} {
		if jobs, hidden, errs := names(uid); len(jobs) != 3 || hidden != 0 || len(errs) != 4 {
			t.Errorf("uid %d sees %v (%d hidden), errors %v; want all", uid, jobs, hidden, errs)
		}
	}
	jobs, hidden, errs := names(2000)
	if len(jobs) != 1 || jobs[0] != "mine" || hidden != 2 || len(errs) != 2 || errs[0] != "error of mine" || errs[1] != "refused someone" {
		t.Errorf("uid 2000 sees %v (%d hidden), errors %v; want its job, 2 hidden, its error and the job-less one", jobs, hidden, errs)
	}
}

// TestNoteErrorKeepsTheLast: the status keeps the last maxErrors errors.
func TestNoteErrorKeepsTheLast(t *testing.T) {
	l := &Loop{}
	for i := 0; i < maxErrors+5; i++ {
		l.noteError(nil, string(rune('a'+i)))
	}
	if len(l.errs) != maxErrors || l.errs[0].GetError() != string(rune('a'+5)) || l.errs[maxErrors-1].GetError() != string(rune('a'+maxErrors+4)) {
		t.Fatalf("kept %d errors from %q to %q", len(l.errs), l.errs[0].GetError(), l.errs[len(l.errs)-1].GetError())
	}
}
