package rendezvous

import (
	"crypto/sha256"
	"encoding/hex"
	"strconv"
	"time"

	"github.com/hvdd/hvdd/auth"
)

// MaxClockSkew is how far a request's X-Hvdd-Time may lie from the server's
// clock. Nonces are remembered for twice this long, so a captured request
// cannot be replayed while its time is still acceptable.
const MaxClockSkew = 60 * time.Second

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
	return auth.Sign(secret, []byte(labelRequest), []byte(method), []byte(uri), []byte(ts), []byte(nonce), sum[:])
}

// responseMAC is the MAC a response carries in X-Hvdd-Mac: it binds the
// status and body to the request's nonce, so a response cannot be replayed
// to another request.
func responseMAC(secret []byte, status int, nonce string, body []byte) []byte {
	sum := sha256.Sum256(body)
	return auth.Sign(secret, []byte(labelResponse), []byte(strconv.Itoa(status)), []byte(nonce), sum[:])
}

// newNonce returns a request nonce: auth.NewNonce in hex.
func newNonce() string { return hex.EncodeToString(auth.NewNonce()) }

// newReplayCache returns the server's replay cache: it remembers the nonces
// of authenticated requests for twice MaxClockSkew, after which a request is
// refused for its time alone.
func newReplayCache() auth.ReplayCache {
	return auth.ReplayCache{Max: 1 << 20, TTL: 2 * MaxClockSkew}
}
