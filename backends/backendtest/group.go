package backendtest

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/hvdd/hvdd/backends"
)

// NewGroup starts size ranks concurrently with newRank (which typically
// bootstraps through a store shared by the closure) and returns them in rank
// order. Starting is bounded by 30 s. If any rank fails, NewGroup closes the
// ones that started and fails t; otherwise it closes them all when t ends.
func NewGroup(t testing.TB, size int, newRank func(ctx context.Context, rank int) (backends.Backend, error)) []backends.Backend {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	g := make([]backends.Backend, size)
	errs := make([]error, size)
	var wg sync.WaitGroup
	for r := range size {
		wg.Add(1)
		go func() {
			defer wg.Done()
			g[r], errs[r] = newRank(ctx, r)
			if errs[r] != nil {
				cancel() // the others would wait for this rank forever
			}
		}()
	}
	wg.Wait()
	failed := false
	for r, err := range errs {
		if err != nil {
			t.Errorf("starting rank %d of %d: %v", r, size, err)
			failed = true
		}
	}
	if failed {
		for _, b := range g {
			if b != nil {
				b.Close()
			}
		}
		t.FailNow()
	}
	t.Cleanup(func() {
		for _, b := range g {
			b.Close()
		}
	})
	return g
}
