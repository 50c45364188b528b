package job

import (
	"slices"
	"testing"

	"github.com/hvdd/hvdd/daemon/plan"
	"github.com/hvdd/hvdd/daemon/timeline"
	"github.com/hvdd/hvdd/tensor"
)

func TestTimelineNames(t *testing.T) {
	rows := []struct {
		set  int32
		name string
		want string
	}{
		{0, "grad", "grad"},
		{3, "grad", "grad (process set 3)"},
	}
	for _, tc := range rows {
		if got := Row(tc.set, tc.name); got != tc.want {
			t.Errorf("Row(%d, %q) = %q, want %q", tc.set, tc.name, got, tc.want)
		}
	}
	tops := []struct {
		r    plan.Response
		want string
	}{
		{plan.Response{Op: tensor.Allreduce, ReduceOp: tensor.Sum}, "ALLREDUCE"},
		{plan.Response{Op: tensor.Allreduce, ReduceOp: tensor.Adasum}, "ADASUM"},
		{plan.Response{Op: tensor.Broadcast}, "BROADCAST"},
	}
	for _, tc := range tops {
		if got := TopName(&tc.r); got != tc.want {
			t.Errorf("TopName(%v %v) = %q, want %q", tc.r.Op, tc.r.ReduceOp, got, tc.want)
		}
	}
}

// sink records the rows events go to.
type sink []string

func (s *sink) Event(row string, _ timeline.Phase, _ string) { *s = append(*s, row) }

func TestTraceAll(t *testing.T) {
	r := plan.Response{ProcessSet: 2, Tensors: []plan.Tensor{{Name: "a"}, {Name: "b"}}}
	var s sink
	TraceAll(&s, &r, timeline.Begin, "X")
	if want := []string{"a (process set 2)", "b (process set 2)"}; !slices.Equal(s, want) {
		t.Errorf("TraceAll wrote on rows %q, want %q", s, want)
	}
}
