package sched

import (
	"fmt"
	"strings"
	"testing"

	"github.com/hvdd/hvdd/backends"
	"github.com/hvdd/hvdd/daemon/plan"
	"github.com/hvdd/hvdd/tensor"
)

// grouper is a recorder that makes groups (backends.Grouper), counting them.
type grouper struct {
	recorder
	made []string
}

func (g *grouper) Group(ranks []int) (backends.Backend, error) {
	g.made = append(g.made, fmt.Sprint(ranks))
	if len(ranks) == 0 {
		return nil, fmt.Errorf("no ranks")
	}
	return &recorder{size: len(ranks)}, nil
}

// TestEngines checks the engine each response gets: the job's when its set
// spans every node; else a group of its nodes, made once and kept while the
// job's engine is the same; an engine without groups is an error that says
// what to do.
func TestEngines(t *testing.T) {
	r := plan.Response{Op: tensor.Allreduce, ProcessSet: 2, Tensors: []plan.Tensor{{}}}
	var e Engines
	g := &grouper{recorder: recorder{size: 3}}
	w := workOn([]int{1, 1, 1}, 0, r)
	w.Engine = g
	if b, err := e.For(w); err != nil || b != g {
		t.Fatalf("every node: %v, %v; want the job's engine", b, err)
	}
	w.View.Nodes = []int{0, 2}
	b1, err := e.For(w)
	if err != nil || b1 == g || b1.Size() != 2 {
		t.Fatalf("nodes 0 and 2: %v, %v; want a group of 2", b1, err)
	}
	if b2, _ := e.For(w); b2 != b1 || len(g.made) != 1 {
		t.Errorf("the same nodes again: a new group (%d made)", len(g.made))
	}
	w.View.Nodes = []int{1, 2}
	if b3, _ := e.For(w); b3 == b1 || len(g.made) != 2 {
		t.Errorf("nodes 1 and 2: the group of 0 and 2 (%d made)", len(g.made))
	}
	// A new job's engine: its groups start afresh.
	g2 := &grouper{recorder: recorder{size: 3}}
	w.Engine, w.View.Nodes = g2, []int{0, 2}
	if b4, _ := e.For(w); b4 == b1 || len(g2.made) != 1 {
		t.Errorf("a new engine reused the old one's group")
	}
	w.View.Nodes = []int{}
	if _, err := e.For(w); err == nil || !strings.Contains(err.Error(), "engine group of nodes []") {
		t.Errorf("a failed group: %v", err)
	}
	w.Engine, w.View.Nodes = &recorder{size: 3}, []int{0, 1}
	if _, err := e.For(w); err == nil || !strings.Contains(err.Error(), "cannot run a collective over some of its nodes only") {
		t.Errorf("an engine without groups: %v", err)
	}
}
