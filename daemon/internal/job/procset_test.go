package job_test

import (
	"slices"
	"strings"
	"testing"

	"github.com/hvdd/hvdd/daemon/internal/job"
	"github.com/hvdd/hvdd/daemon/internal/job/jobtest"
	"github.com/hvdd/hvdd/daemon/plan"
)

// registry is a job's plan table as process sets see it.
type registry struct {
	size int
	sets map[int32][]int
}

func (r *registry) Size() int { return r.size }

func (r *registry) AddProcessSet(id int32, ranks []int) error {
	r.sets[id] = ranks
	return nil
}

func (r *registry) RemoveProcessSet(id int32) ([]plan.Aborted, error) {
	delete(r.sets, id)
	return nil, nil
}

// TestLocalSetRounds checks the rounds of local set requests (torch's
// new_group(use_local_synchronization=True), sent by the members only): a
// round is decided once every member made its request for those ranks, and
// not before; two groups' rounds interleave freely with each other and
// with the job's collective rounds; each member's k-th local request for a
// set pairs with the others' k-th; every member gets the set's id, ids
// count up in the order the rounds complete.
func TestLocalSetRounds(t *testing.T) {
	reg := &registry{size: 4, sets: map[int32][]int{}}
	j := &job.Job{}
	conns := make([]*jobtest.AnswerConn, 4)
	for i := range conns {
		conns[i] = &jobtest.AnswerConn{R: i}
	}
	id := uint32(0)
	send := func(rank int, ranks []int, local bool) (uint32, []job.SetChange) {
		id++
		r := job.SetReq{Conn: conns[rank], ID: id, Rank: rank, Add: true, Ranks: ranks, Local: local}
		if local {
			if msg := r.LocalErr(reg.size); msg != "" {
				t.Fatalf("rank %d's local request for %v refused: %s", rank, ranks, msg)
			}
		}
		return id, j.SettleLocal(r, reg)
	}
	answer := func(rank int, id uint32) int32 {
		d := conns[rank].Answers[id]
		if d == nil {
			return -1
		}
		if d.GetError() != "" {
			t.Fatalf("rank %d's request %d failed: %s", rank, id, d.GetError())
		}
		return d.GetProcessSetId()
	}
	a0, ch := send(0, []int{0, 1}, true)
	b2, ch2 := send(2, []int{2, 3}, true)
	if len(ch)+len(ch2) != 0 || answer(0, a0) != -1 || answer(2, b2) != -1 {
		t.Fatalf("a local round was decided before every member asked: %v %v", ch, ch2)
	}
	// A collective round of every rank runs meanwhile.
	var g []uint32
	for r := range 4 {
		i, chs := send(r, []int{1, 2}, false)
		g = append(g, i)
		if (r < 3) != (len(chs) == 0) {
			t.Fatalf("the job's round after rank %d's request: changes %v", r, chs)
		}
	}
	for r, i := range g {
		if got := answer(r, i); got != 1 {
			t.Fatalf("rank %d got set %d for [1 2], want 1", r, got)
		}
	}
	b3, ch := send(3, []int{2, 3}, true)
	if len(ch) != 1 || !ch[0].Local || !slices.Equal(ch[0].Ranks, []int{2, 3}) || ch[0].Set != 2 {
		t.Fatalf("the [2 3] round's change: %+v, want local set 2 of [2 3]", ch)
	}
	a1, ch := send(1, []int{0, 1}, true)
	if len(ch) != 1 || ch[0].Set != 3 {
		t.Fatalf("the [0 1] round's change: %+v, want set 3", ch)
	}
	for _, w := range []struct {
		rank int
		id   uint32
		set  int32
	}{{0, a0, 3}, {1, a1, 3}, {2, b2, 2}, {3, b3, 2}} {
		if got := answer(w.rank, w.id); got != w.set {
			t.Errorf("rank %d got set %d, want %d", w.rank, got, w.set)
		}
	}
	if len(j.LocalSets) != 0 {
		t.Errorf("local requests left queued: %v", j.LocalSets)
	}
	if !slices.Equal(j.Sets[2], []int{2, 3}) || !slices.Equal(j.Sets[3], []int{0, 1}) {
		t.Errorf("the job's sets: %v", j.Sets)
	}
	// The same ranks again: a duplicate, refused to both members.
	d0, _ := send(0, []int{0, 1}, true)
	d1, ch := send(1, []int{0, 1}, true)
	if len(ch) != 1 || !strings.Contains(ch[0].Err, "duplicate") {
		t.Fatalf("a duplicate local set: %+v", ch)
	}
	for r, i := range []uint32{d0, d1} {
		if d := conns[r].Answers[i]; d == nil || !strings.Contains(d.GetError(), "duplicate") {
			t.Errorf("rank %d's duplicate request answered %v", r, d)
		}
	}
}

// TestLocalSetErr checks the requests a rank's own node refuses at once.
func TestLocalSetErr(t *testing.T) {
	for _, c := range []struct {
		rank  int
		ranks []int
		want  string
	}{
		{0, []int{0, 1}, ""},
		{3, []int{3}, ""},
		{2, []int{0, 1}, "is not one of them"},
		{0, nil, "at least one rank"},
		{0, []int{1, 0}, "distinct, sorted"},
		{0, []int{0, 4}, "in 0..3"},
		{0, []int{0, 0}, "distinct, sorted"},
	} {
		got := job.SetReq{Rank: c.rank, Add: true, Ranks: c.ranks, Local: true}.LocalErr(4)
		if c.want == "" && got != "" || !strings.Contains(got, c.want) {
			t.Errorf("rank %d, ranks %v: %q, want %q", c.rank, c.ranks, got, c.want)
		}
	}
}
