package rendezvous

import (
	"bytes"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"strconv"
	"time"
)

// MinSecretLen is the shortest shared secret accepted, in bytes (after hex
// decoding).
const MinSecretLen = 16

// MaxClockSkew is how far a request's X-Hvdd-Time may lie from the server's
// clock. Nonces are remembered for twice this long, so a captured request
// cannot be replayed while its time is still acceptable.
const MaxClockSkew = 60 * time.Second

// ErrNoSecret is returned by LoadSecret when neither a secret file nor a
// secret value was given.
var ErrNoSecret = errors.New("rendezvous: no shared secret: use --secret-file or HVDD_SECRET")

// Sign returns HMAC-SHA256(secret, parts). Each part is framed by its length
// (8 bytes, big endian) before it is hashed, so the split between parts is
// authenticated too: Sign(s, "ab", "c") != Sign(s, "a", "bc"). Callers put a
// constant label first (this package uses "hvdd-rendezvous-req-v1" and
// "hvdd-rendezvous-resp-v1"), so that a MAC made for one purpose is never
// accepted for another.
func Sign(secret []byte, parts ...[]byte) []byte {
	h := hmac.New(sha256.New, secret)
	var n [8]byte
	for _, p := range parts {
		binary.BigEndian.PutUint64(n[:], uint64(len(p)))
		h.Write(n[:])
		h.Write(p)
	}
	return h.Sum(nil)
}

// Verify reports whether mac is Sign(secret, parts...). The comparison takes
// time independent of where mac differs.
func Verify(secret []byte, mac []byte, parts ...[]byte) bool {
	return hmac.Equal(mac, Sign(secret, parts...))
}

// NewSecret returns 32 random bytes, for a launcher that starts every daemon
// of a job and hands them the same secret (hex-encode it for HVDD_SECRET).
func NewSecret() ([]byte, error) {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return nil, fmt.Errorf("rendezvous: new secret: %w", err)
	}
	return b, nil
}

// LoadSecret returns the job's shared secret from file (the --secret-file
// flag) or from env (the value of $HVDD_SECRET, which the caller reads: this
// package reads no environment). Exactly one of them may be non-empty: both
// is an error, so that a stale variable never silently overrides a file.
//
// Surrounding whitespace is trimmed. A value of at least 2*MinSecretLen hex
// digits is hex-decoded; anything else is used as raw bytes. The result must
// be at least MinSecretLen bytes.
//
// When both are empty LoadSecret returns ErrNoSecret. A single-node job needs
// no secret (nothing listens on the network), so callers may ignore
// ErrNoSecret there; a multi-node daemon must fail with it, since a
// rendezvous without a secret would accept anyone.
func LoadSecret(file string, env string) ([]byte, error) {
	var raw []byte
	var from string
	switch {
	case file != "" && env != "":
		return nil, errors.New("rendezvous: both --secret-file and HVDD_SECRET are set; use one")
	case file != "":
		b, err := os.ReadFile(file)
		if err != nil {
			return nil, fmt.Errorf("rendezvous: read secret file: %w", err)
		}
		raw, from = b, "secret file "+strconv.Quote(file)
	case env != "":
		raw, from = []byte(env), "HVDD_SECRET"
	default:
		return nil, ErrNoSecret
	}
	raw = bytes.TrimSpace(raw)
	if len(raw) >= 2*MinSecretLen && len(raw)%2 == 0 {
		if d, err := hex.DecodeString(string(raw)); err == nil {
			raw = d
		}
	}
	if len(raw) < MinSecretLen {
		return nil, fmt.Errorf("rendezvous: %s: secret of %d bytes is shorter than %d", from, len(raw), MinSecretLen)
	}
	return raw, nil
}

// Protocol constants shared by Server and Client.
const (
	headerTime  = "X-Hvdd-Time"
	headerNonce = "X-Hvdd-Nonce"
	headerMac   = "X-Hvdd-Mac"

	labelRequest  = "hvdd-rendezvous-req-v1"
	labelResponse = "hvdd-rendezvous-resp-v1"

	minNonceLen = 16  // characters
	maxNonceLen = 128 // characters
)

// requestMAC is the MAC a request carries in X-Hvdd-Mac.
func requestMAC(secret []byte, method, uri, ts, nonce string, body []byte) []byte {
	sum := sha256.Sum256(body)
	return Sign(secret, []byte(labelRequest), []byte(method), []byte(uri), []byte(ts), []byte(nonce), sum[:])
}

// responseMAC is the MAC a response carries in X-Hvdd-Mac: it binds the
// status and body to the request's nonce, so a response cannot be replayed
// to another request.
func responseMAC(secret []byte, status int, nonce string, body []byte) []byte {
	sum := sha256.Sum256(body)
	return Sign(secret, []byte(labelResponse), []byte(strconv.Itoa(status)), []byte(nonce), sum[:])
}

// newNonce returns 16 random bytes in hex.
func newNonce() (string, error) {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", err
	}
	return hex.EncodeToString(b[:]), nil
}

// replayCache remembers the nonces of authenticated requests for twice
// MaxClockSkew: any request older than that is refused for its time alone.
// It is not safe for concurrent use; the server guards it with a mutex.
type replayCache struct {
	max   int
	seen  map[string]struct{}
	queue []seenNonce // in arrival order, so expiries are non-decreasing
	head  int
}

type seenNonce struct {
	nonce   string
	expires time.Time
}

// add records nonce at now. It reports false if the nonce is already
// recorded (a replay) or if the cache is full (the caller answers "try
// again"; only authenticated requests reach the cache, so filling it takes
// a secret holder sending more than max requests within the window).
func (c *replayCache) add(nonce string, now time.Time) (ok, full bool) {
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
	if len(c.seen) >= c.max {
		return false, true
	}
	if c.seen == nil {
		c.seen = make(map[string]struct{})
	}
	c.seen[nonce] = struct{}{}
	c.queue = append(c.queue, seenNonce{nonce, now.Add(2 * MaxClockSkew)})
	return true, false
}
