package device

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"

	"github.com/hvdd/hvdd/backends"
	"github.com/hvdd/hvdd/backends/nccl"
	"github.com/hvdd/hvdd/gpu/fake"
	"github.com/hvdd/hvdd/tensor"
)

// TestLocalEngines: the node-local NCCL engines over a set of GPUs are
// made once and kept while healthy; a set that failed since its last use
// is made again; a response whose wait sees a failed engine fails naming
// NCCL, every engine kept is aborted and forgotten, and the GPUs' streams
// are drained; Close closes what is kept.
func TestLocalEngines(t *testing.T) {
	var logs bytes.Buffer
	g := OpenGPUs(fake.New(fake.Options{Devices: 2}), nccl.NewEngines(fake.NewNCCL()), slog.New(slog.NewTextHandler(&logs, nil)), false)
	if g == nil {
		t.Fatal("no fake GPU")
	}
	defer g.Close()
	for _, d := range g.devs {
		if err := d.open("test"); err != nil {
			t.Fatal(err)
		}
	}
	ctx := context.Background()
	created := func() int { return strings.Count(logs.String(), "NCCL communicator created") }

	es, err := g.localEngines(g.devs)
	if err != nil {
		t.Fatal(err)
	}
	// One allreduce over both GPUs, as reduceLocal issues it.
	for _, d := range g.devs {
		if err := d.ensure(64); err != nil {
			t.Fatal(err)
		}
	}
	if err := groupEach(es, func(i int, e engine) error {
		d := g.devs[i]
		return e.Allreduce(d.stream, d.fuse, d.fuse, 16, tensor.Float32, tensor.Sum)
	}); err != nil {
		t.Fatal(err)
	}
	if err := g.waitStreams(ctx, g.devs); err != nil {
		t.Fatalf("a healthy wait: %v", err)
	}
	if again, err := g.localEngines(g.devs); err != nil || again[0] != es[0] {
		t.Fatalf("healthy engines were not kept (err %v)", err)
	}
	g.used = nil
	if n := created(); n != 1 {
		t.Fatalf("%d communicators created, want 1", n)
	}

	// Failed since their last use: made again.
	es[1].Abort()
	remade, err := g.localEngines(g.devs)
	if err != nil {
		t.Fatal(err)
	}
	if remade[0] == es[0] || created() != 2 {
		t.Fatalf("failed engines were reused (%d communicators created)", created())
	}

	// A failure seen by the wait: every engine is aborted and forgotten.
	remade[0].Abort()
	err = g.waitStreams(ctx, g.devs)
	if err == nil || !strings.Contains(err.Error(), "NCCL") || !errors.Is(err, backends.ErrAborted) {
		t.Fatalf("a wait through an aborted engine: %v, want an NCCL error wrapping ErrAborted", err)
	}
	if len(g.local) != 0 || len(g.used) != 0 {
		t.Errorf("after the failure: %d engine sets kept, %d noted as used; want none", len(g.local), len(g.used))
	}

	// Kept again, then closed with the GPUs (defer).
	if _, err := g.localEngines(g.devs); err != nil {
		t.Fatal(err)
	}
	g.used = nil
}
