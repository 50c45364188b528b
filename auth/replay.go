package auth

import "time"

// ReplayCache remembers nonces for TTL after they were first seen, so that
// a message signed once is accepted once. Pair it with a freshness check on
// a signed time: a message older than TTL must be refused for its age
// alone, since its nonce may have been forgotten. Only record nonces of
// messages whose MAC verified, so that outsiders cannot fill the cache.
//
// The zero value holds nothing (Max 0); set Max and TTL. A ReplayCache is
// not safe for concurrent use.
type ReplayCache struct {
	// Max is the most nonces held at once; beyond it Add reports full.
	Max int
	// TTL is how long a nonce is remembered.
	TTL time.Duration

	seen  map[string]struct{}
	queue []seenNonce // in arrival order, so expiries are non-decreasing
	head  int
}

type seenNonce struct {
	nonce   string
	expires time.Time
}

// Add records nonce at now, after forgetting the nonces that expired by
// now. It reports ok false if the nonce is already recorded (a replay), and
// full true (with ok false) if the cache holds Max nonces: the caller
// answers "try again", since filling the cache takes a secret holder sending
// more than Max messages within TTL.
func (c *ReplayCache) Add(nonce string, now time.Time) (ok, full bool) {
	for c.head < len(c.queue) && !now.Before(c.queue[c.head].expires) {
		delete(c.seen, c.queue[c.head].nonce)
		c.queue[c.head] = seenNonce{}
		c.head++
	}
	if c.head > len(c.queue)/2 {
		c.queue = append(c.queue[:0], c.queue[c.head:]...)
		c.head = 0
	}
	if _, dup := c.seen[nonce]; dup {
		return false, false
	}
	if len(c.seen) >= c.Max {
		return false, true
	}
	if c.seen == nil {
		c.seen = make(map[string]struct{})
	}
	c.seen[nonce] = struct{}{}
	c.queue = append(c.queue, seenNonce{nonce, now.Add(c.TTL)})
	return true, false
}
