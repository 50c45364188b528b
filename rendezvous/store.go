package rendezvous

import (
	"context"
	"errors"
	"fmt"
	"unicode/utf8"
)

// Store is a key-value store with blocking reads: the bootstrap through which
// daemons and backends find each other (Gloo's rendezvous::Store). Values are
// opaque bytes; a Store never interprets them except for counters (Add).
//
// Implementations are safe for concurrent use. Only Wait blocks; the other
// methods return as soon as the store has answered (a remote store may retry
// while its server starts, bounded by ctx).
type Store interface {
	// Set stores a copy of value under key, replacing any previous value,
	// and wakes every Wait that was waiting for key.
	Set(ctx context.Context, key string, value []byte) error

	// Get returns a copy of the value under key, or an error wrapping
	// ErrNotFound if there is none. It does not wait; see Wait.
	Get(ctx context.Context, key string) ([]byte, error)

	// Wait blocks until every key exists and returns a copy of their values,
	// keyed by the names given. With no keys it returns an empty map at once.
	// When ctx is done first it returns an error wrapping ctx.Err() that
	// names the keys still missing.
	Wait(ctx context.Context, keys ...string) (map[string][]byte, error)

	// Add atomically adds delta to the counter under key and returns the new
	// value. A missing key counts as 0. Counters are stored as decimal ASCII,
	// so Get and Wait see "3" after Add(key, 3); adding to a value that is not
	// a decimal int64, or overflowing int64, fails with ErrInvalidArgument.
	Add(ctx context.Context, key string, delta int64) (int64, error)

	// Delete removes key. Deleting a missing key is not an error, so Delete
	// is idempotent.
	Delete(ctx context.Context, key string) error
}

// Limits enforced by every Store in this package (and by the server, whose
// clients see the matching 4xx status).
const (
	// MaxKeyLen is the longest key, in bytes, after any Prefix is applied.
	MaxKeyLen = 512
	// MaxValueLen is the largest value, in bytes.
	MaxValueLen = 16 << 20
	// DefaultMaxKeys is the number of keys a store holds before Set and Add
	// of a new key fail with ErrFull.
	DefaultMaxKeys = 100_000
)

// Error categories. Every error returned by this package's stores wraps at
// most one of these; each maps one-to-one onto an HTTP status on the wire
// (see the package documentation), so a Client returns the same sentinel as
// the Memory behind the server.
var (
	// ErrNotFound is returned by Get when the key does not exist (404).
	ErrNotFound = errors.New("rendezvous: key not found")
	// ErrInvalidArgument is returned for an empty or non-UTF-8 key, a bad
	// counter delta, or Add on a value that is not a counter (400).
	ErrInvalidArgument = errors.New("rendezvous: invalid argument")
	// ErrTooLarge is returned for a key longer than MaxKeyLen or a value
	// larger than MaxValueLen (413).
	ErrTooLarge = errors.New("rendezvous: too large")
	// ErrFull is returned when a new key would exceed the store's key limit
	// (409).
	ErrFull = errors.New("rendezvous: store full")
	// ErrAuth is returned by a Client when the server refused its request
	// (401) or when the server's response was not signed with the client's
	// secret: the two sides do not share a secret, their clocks differ by
	// more than MaxClockSkew, or the peer is not an hvdd rendezvous.
	ErrAuth = errors.New("rendezvous: authentication failed")
	// ErrClosed is returned by a store that has been closed: by Memory after
	// Close, by a Client whose server is shutting down (503), and by
	// Server.Serve after Close.
	ErrClosed = errors.New("rendezvous: closed")
)

// checkKey validates a key against the package limits.
func checkKey(key string) error {
	switch {
	case key == "":
		return fmt.Errorf("empty key: %w", ErrInvalidArgument)
	case len(key) > MaxKeyLen:
		return fmt.Errorf("key of %d bytes exceeds %d: %w", len(key), MaxKeyLen, ErrTooLarge)
	case !utf8.ValidString(key):
		return fmt.Errorf("key %q is not valid UTF-8: %w", key, ErrInvalidArgument)
	}
	return nil
}

// checkValue validates a value against the package limits.
func checkValue(key string, value []byte) error {
	if len(value) > MaxValueLen {
		return fmt.Errorf("value of %d bytes for key %q exceeds %d: %w", len(value), key, MaxValueLen, ErrTooLarge)
	}
	return nil
}
