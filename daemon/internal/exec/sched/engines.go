package sched

import (
	"fmt"

	"github.com/hvdd/hvdd/backends"
	"github.com/hvdd/hvdd/daemon/internal/job"
)

// Engines gives each response across nodes its engine: the job's, or for a
// process set whose members live on some of the nodes only, the engine's
// group of those nodes (backends.Grouper). A group is made on its first use,
// which every member node reaches at the same response (responses run in
// plan order on every node), as Grouper asks, and kept while the job's
// engine is the same. The host and device paths share one Engines, so that
// a group made by one serves the other. The zero value is ready; one
// goroutine at a time (the executor's, or the loop's while it is idle).
type Engines struct {
	// groups are the groups made so far by their nodes, for of, the
	// engine of the job that asked for them last.
	groups map[string]backends.Backend
	of     backends.Backend
}

// For returns the engine that runs w (w.Engine is set: w crosses nodes).
func (e *Engines) For(w *job.Work) (backends.Backend, error) {
	nodes := w.View.Nodes
	if len(nodes) == w.Engine.Size() {
		return w.Engine, nil
	}
	gr, ok := w.Engine.(backends.Grouper)
	if !ok {
		return nil, fmt.Errorf("process set %d lies on nodes %v of %d, and the %s engine cannot run a collective over some of its nodes only: use a set whose ranks span every node, or another --backend",
			w.Resp.ProcessSet, nodes, w.Engine.Size(), w.Engine.Name())
	}
	if e.of != w.Engine {
		e.of, e.groups = w.Engine, make(map[string]backends.Backend)
	}
	key := fmt.Sprint(nodes)
	if g := e.groups[key]; g != nil {
		return g, nil
	}
	g, err := gr.Group(nodes)
	if err != nil {
		return nil, fmt.Errorf("engine group of nodes %v (process set %d): %w", nodes, w.Resp.ProcessSet, err)
	}
	e.groups[key] = g
	return g, nil
}
