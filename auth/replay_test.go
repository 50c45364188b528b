package auth

import (
	"testing"
	"time"
)

func TestReplayCache(t *testing.T) {
	const ttl = 2 * time.Minute
	c := ReplayCache{Max: 2, TTL: ttl}
	t0 := time.Unix(1000, 0)
	steps := []struct {
		nonce    string
		at       time.Duration
		ok, full bool
	}{
		{"a", 0, true, false},
		{"a", time.Second, false, false},            // replay
		{"b", time.Second, true, false},             //
		{"c", 2 * time.Second, false, true},         // full
		{"a", ttl - time.Millisecond, false, false}, // still remembered
		{"a", ttl, true, false},                     // expired, so room and no replay
		{"c", ttl + time.Second, true, false},       // b expired too
		{"d", ttl + 2*time.Second, false, true},     // a (again) and c held
		{"a", 3 * ttl, true, false},                 // everything expired
	}
	for i, st := range steps {
		ok, full := c.Add(st.nonce, t0.Add(st.at))
		if ok != st.ok || full != st.full {
			t.Fatalf("step %d Add(%q, +%v) = %v, %v; want %v, %v", i, st.nonce, st.at, ok, full, st.ok, st.full)
		}
	}
}

// TestReplayCacheZero: the zero value holds nothing, so it refuses every
// nonce as full rather than accepting replays.
func TestReplayCacheZero(t *testing.T) {
	var c ReplayCache
	if ok, full := c.Add("a", time.Unix(0, 0)); ok || !full {
		t.Fatalf("zero ReplayCache: Add = %v, %v; want false, true", ok, full)
	}
}

// TestReplayCacheCompacts adds many nonces that expire one by one and checks
// that the queue does not grow without bound.
func TestReplayCacheCompacts(t *testing.T) {
	c := ReplayCache{Max: 10, TTL: 10 * time.Second}
	t0 := time.Unix(0, 0)
	for i := range 10_000 {
		if ok, full := c.Add(string(rune('a'+i%26))+string(rune(i)), t0.Add(time.Duration(i)*time.Second)); !ok || full {
			t.Fatalf("nonce %d: Add = %v, %v", i, ok, full)
		}
	}
	if len(c.seen) > 10 || cap(c.queue) > 64 {
		t.Fatalf("cache holds %d nonces in a queue of capacity %d", len(c.seen), cap(c.queue))
	}
}
