package auth

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
)

// MinSecretLen is the shortest shared secret accepted, in bytes (after hex
// decoding).
const MinSecretLen = 16

// MACLen is the length of a MAC from Sign, in bytes.
const MACLen = sha256.Size

// NonceLen is the length of a nonce from NewNonce, in bytes.
const NonceLen = 32

// ErrNoSecret is returned by LoadSecret when neither a secret file nor a
// secret value was given.
var ErrNoSecret = errors.New("auth: no shared secret: use --secret-file or HVDD_SECRET")

// Sign returns HMAC-SHA256(secret, parts). Each part is framed by its length
// (8 bytes, big endian) before it is hashed, so the split between parts is
// authenticated too: Sign(s, "ab", "c") != Sign(s, "a", "bc"). Callers put a
// constant label first (such as "hvdd-rendezvous-req-v1"), so that a MAC
// made for one purpose is never accepted for another.
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

// NewNonce returns NonceLen random bytes from crypto/rand, which never fails
// (since Go 1.24 it crashes the program instead of returning an error).
func NewNonce() []byte {
	b := make([]byte, NonceLen)
	rand.Read(b)
	return b
}

// NewSecret returns 32 random bytes, for a launcher that starts every daemon
// of a job and hands them the same secret (hex-encode it for HVDD_SECRET).
func NewSecret() []byte {
	b := make([]byte, 32)
	rand.Read(b)
	return b
}

// LoadSecret returns the job's shared secret from file (the --secret-file
// flag) or from env (the value of $HVDD_SECRET, which the caller reads: this
// package reads no environment). Exactly one of them may be non-empty: both
// is an error, so that a stale variable never silently overrides a file.
//
// Surrounding whitespace is trimmed. A value of at least 2*MinSecretLen hex
// digits is hex-decoded; anything else is used as raw bytes. The result must
// be at least MinSecretLen bytes. The file's permissions are not checked.
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
		return nil, errors.New("auth: both --secret-file and HVDD_SECRET are set; use one")
	case file != "":
		b, err := os.ReadFile(file)
		if err != nil {
			return nil, fmt.Errorf("auth: read secret file: %w", err)
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
		return nil, fmt.Errorf("auth: %s: secret of %d bytes is shorter than %d", from, len(raw), MinSecretLen)
	}
	return raw, nil
}
