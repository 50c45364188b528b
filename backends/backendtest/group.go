package backendtest

import (
	"bytes"
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/hvdd/hvdd/backends"
)

// MemStore is an in-memory key-value store with the method set of the
// rendezvous package's Store, for bootstrapping groups inside one test
// process. The zero value is not usable; call NewMemStore.
type MemStore struct {
	// mu guards the fields that follow.
	mu      sync.Mutex
	m       map[string][]byte
	changed chan struct{} // closed and replaced on every change
}

// NewMemStore returns an empty store.
func NewMemStore() *MemStore {
	return &MemStore{m: make(map[string][]byte), changed: make(chan struct{})}
}

func (s *MemStore) notify() {
	close(s.changed)
	s.changed = make(chan struct{})
}

// Set stores a copy of value under key.
func (s *MemStore) Set(ctx context.Context, key string, value []byte) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.m[key] = bytes.Clone(value)
	s.notify()
	return nil
}

// Get returns the value of key, or an error if it is not set.
func (s *MemStore) Get(ctx context.Context, key string) ([]byte, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	v, ok := s.m[key]
	if !ok {
		return nil, fmt.Errorf("memstore: key %q not set", key)
	}
	return bytes.Clone(v), nil
}

// Wait blocks until every key is set, or ctx ends, and returns their values.
func (s *MemStore) Wait(ctx context.Context, keys ...string) (map[string][]byte, error) {
	for {
		s.mu.Lock()
		out := make(map[string][]byte, len(keys))
		for _, k := range keys {
			if v, ok := s.m[k]; ok {
				out[k] = bytes.Clone(v)
			}
		}
		changed := s.changed
		s.mu.Unlock()
		if len(out) == len(keys) {
			return out, nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return nil, fmt.Errorf("memstore: waiting for %d keys: %w", len(keys)-len(out), ctx.Err())
		}
	}
}

// Add adds delta to the decimal integer stored under key (0 if unset) and
// returns the new value.
func (s *MemStore) Add(ctx context.Context, key string, delta int64) (int64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var v int64
	if old, ok := s.m[key]; ok {
		if _, err := fmt.Sscan(string(old), &v); err != nil {
			return 0, fmt.Errorf("memstore: key %q is not a number: %w", key, err)
		}
	}
	v += delta
	s.m[key] = []byte(fmt.Sprint(v))
	s.notify()
	return v, nil
}

// Delete removes key; deleting a missing key is not an error.
func (s *MemStore) Delete(ctx context.Context, key string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.m, key)
	s.notify()
	return nil
}

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
