package rendezvous

import (
	"context"
	"fmt"
	"math"
	"strconv"
	"sync"
	"sync/atomic"
)

// Memory is an in-process Store: the store a Server serves, and the one tests
// and single-process jobs use directly. The zero value is not usable; create
// one with NewMemory.
//
// Wait does not poll: every change (Set, Add, Close) closes a broadcast
// channel that the blocked waiters select on, and each waiter re-checks its
// keys once per change.
type Memory struct {
	maxKeys int

	// testHookWaitBlocked, when set, is called each time a Wait is about to
	// block for a change. Tests use it to know a waiter is parked.
	testHookWaitBlocked atomic.Pointer[func()]

	// mu guards the fields that follow.
	mu      sync.Mutex
	data    map[string][]byte
	changed chan struct{} // closed and replaced on every change
	closed  bool
}

var _ Store = (*Memory)(nil)

// NewMemory returns an empty store that holds at most DefaultMaxKeys keys.
func NewMemory() *Memory { return newMemory(DefaultMaxKeys) }

func newMemory(maxKeys int) *Memory {
	if maxKeys <= 0 {
		maxKeys = DefaultMaxKeys
	}
	return &Memory{
		maxKeys: maxKeys,
		data:    make(map[string][]byte),
		changed: make(chan struct{}),
	}
}

// broadcastLocked wakes every blocked Wait. m.mu must be held.
func (m *Memory) broadcastLocked() {
	close(m.changed)
	m.changed = make(chan struct{})
}

// roomLocked reports ErrFull if storing key would exceed the key limit.
// m.mu must be held.
func (m *Memory) roomLocked(key string) error {
	if _, ok := m.data[key]; !ok && len(m.data) >= m.maxKeys {
		return fmt.Errorf("key %q: store holds %d keys: %w", key, m.maxKeys, ErrFull)
	}
	return nil
}

// Set implements Store.
func (m *Memory) Set(_ context.Context, key string, value []byte) error {
	if err := checkKey(key); err != nil {
		return err
	}
	if err := checkValue(key, value); err != nil {
		return err
	}
	v := append([]byte{}, value...)
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return ErrClosed
	}
	if err := m.roomLocked(key); err != nil {
		return err
	}
	m.data[key] = v
	m.broadcastLocked()
	return nil
}

// Get implements Store.
func (m *Memory) Get(_ context.Context, key string) ([]byte, error) {
	if err := checkKey(key); err != nil {
		return nil, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil, ErrClosed
	}
	v, ok := m.data[key]
	if !ok {
		return nil, fmt.Errorf("key %q: %w", key, ErrNotFound)
	}
	return append([]byte{}, v...), nil
}

// Wait implements Store.
func (m *Memory) Wait(ctx context.Context, keys ...string) (map[string][]byte, error) {
	for _, k := range keys {
		if err := checkKey(k); err != nil {
			return nil, err
		}
	}
	for {
		m.mu.Lock()
		if m.closed {
			m.mu.Unlock()
			return nil, ErrClosed
		}
		missing := m.missingLocked(keys)
		if len(missing) == 0 {
			out := make(map[string][]byte, len(keys))
			for _, k := range keys {
				out[k] = append([]byte{}, m.data[k]...)
			}
			m.mu.Unlock()
			return out, nil
		}
		changed := m.changed
		m.mu.Unlock()

		if err := ctx.Err(); err != nil {
			return nil, waitError(missing, err)
		}
		if h := m.testHookWaitBlocked.Load(); h != nil {
			(*h)()
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return nil, waitError(missing, ctx.Err())
		}
	}
}

// missingLocked returns the keys not in the store. m.mu must be held.
func (m *Memory) missingLocked(keys []string) []string {
	var missing []string
	for _, k := range keys {
		if _, ok := m.data[k]; !ok {
			missing = append(missing, k)
		}
	}
	return missing
}

// waitError names the keys a Wait gave up on.
func waitError(missing []string, err error) error {
	return fmt.Errorf("wait: %d key(s) missing %q: %w", len(missing), missing, err)
}

// Add implements Store.
func (m *Memory) Add(_ context.Context, key string, delta int64) (int64, error) {
	if err := checkKey(key); err != nil {
		return 0, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return 0, ErrClosed
	}
	if err := m.roomLocked(key); err != nil {
		return 0, err
	}
	var cur int64
	if v, ok := m.data[key]; ok {
		n, err := strconv.ParseInt(string(v), 10, 64)
		if err != nil {
			return 0, fmt.Errorf("add to key %q: value is not a counter: %w", key, ErrInvalidArgument)
		}
		cur = n
	}
	if (delta > 0 && cur > math.MaxInt64-delta) || (delta < 0 && cur < math.MinInt64-delta) {
		return 0, fmt.Errorf("add %d to key %q (%d): overflows int64: %w", delta, key, cur, ErrInvalidArgument)
	}
	cur += delta
	m.data[key] = strconv.AppendInt(nil, cur, 10)
	m.broadcastLocked()
	return cur, nil
}

// Delete implements Store.
func (m *Memory) Delete(_ context.Context, key string) error {
	if err := checkKey(key); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return ErrClosed
	}
	delete(m.data, key)
	return nil
}

// Len returns the number of keys in the store.
func (m *Memory) Len() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.data)
}

// Close makes every blocked and later call return ErrClosed and drops the
// data. It is idempotent.
func (m *Memory) Close() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.closed {
		m.closed = true
		m.data = nil
		m.broadcastLocked()
	}
	return nil
}
