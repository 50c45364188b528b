package auth

import (
	"bytes"
	"errors"
	"io"
	"net"
	"testing"
	"time"
)

var testLabels = Labels{Initiator: []byte("test initiator v1"), Responder: []byte("test responder v1")}

// side is one end's view of a handshake in a test.
type side struct {
	secret []byte
	labels Labels
	open   []byte
	extra  [][]byte
	// tamper, when set, alters each message this side sends.
	tamper func(msg []byte) []byte
}

// tampering wraps a Transport to alter what it sends.
type tampering struct {
	Transport
	f func([]byte) []byte
}

func (t tampering) Send(msg []byte) error { return t.Transport.Send(t.f(bytes.Clone(msg))) }

// shake runs Initiate and Respond against each other over a pipe. Each side
// closes its end when it fails, as callers do, so the other never hangs.
func shake(t *testing.T, ini, resp side) (ierr, rerr error) {
	t.Helper()
	a, b := net.Pipe()
	deadline := time.Now().Add(5 * time.Second)
	a.SetDeadline(deadline)
	b.SetDeadline(deadline)
	transport := func(c net.Conn, s side) Transport {
		tr := Stream(c)
		if s.tamper != nil {
			tr = tampering{tr, s.tamper}
		}
		return tr
	}
	errc := make(chan error, 1)
	go func() {
		err := Respond(transport(b, resp), resp.secret, resp.labels, resp.open, resp.extra...)
		b.Close()
		errc <- err
	}()
	ierr = Initiate(transport(a, ini), ini.secret, ini.labels, ini.open, ini.extra...)
	a.Close()
	return ierr, <-errc
}

func TestHandshake(t *testing.T) {
	secret := []byte("0123456789abcdef")
	open := append([]byte("hello from the initiator "), NewNonce()...)
	good := side{secret: secret, labels: testLabels, open: open, extra: [][]byte{[]byte("node 1")}}
	with := func(f func(s *side)) side {
		s := good
		f(&s)
		return s
	}
	flip := func(i int) func([]byte) []byte {
		return func(m []byte) []byte { m[i%len(m)] ^= 1; return m }
	}
	swapped := Labels{Initiator: testLabels.Responder, Responder: testLabels.Initiator}
	tests := []struct {
		name       string
		ini, resp  side
		iErr, rErr error // nil: must succeed; errIO: any error that is neither sentinel
	}{
		{"round trip", good, good, nil, nil},
		{"no extra", with(func(s *side) { s.extra = nil }), with(func(s *side) { s.extra = nil }), nil, nil},
		{"initiator has another secret", with(func(s *side) { s.secret = []byte("fedcba9876543210") }), good, ErrMismatch, errIO},
		{"responder has another secret", good, with(func(s *side) { s.secret = []byte("fedcba9876543210") }), ErrMismatch, errIO},
		{"empty secret on one side", good, with(func(s *side) { s.secret = nil }), ErrMismatch, errIO},
		{"open altered on the way", good, with(func(s *side) { s.open = append(bytes.Clone(open[:len(open)-1]), open[len(open)-1]^1) }), ErrMismatch, errIO},
		{"extra differs", good, with(func(s *side) { s.extra = [][]byte{[]byte("node 2")} }), ErrMismatch, errIO},
		{"extra split differently", good, with(func(s *side) { s.extra = [][]byte{[]byte("node"), []byte(" 1")} }), ErrMismatch, errIO},
		{"challenge nonce tampered", good, with(func(s *side) { s.tamper = flip(3) }), ErrMismatch, errIO},
		{"challenge MAC tampered", good, with(func(s *side) { s.tamper = flip(NonceLen + 5) }), ErrMismatch, errIO},
		{"proof tampered", with(func(s *side) { s.tamper = flip(9) }), good, nil, ErrMismatch},
		{"labels swapped on one side (reflection)", with(func(s *side) { s.labels = swapped }), good, ErrMismatch, errIO},
		{"another protocol's labels", good, with(func(s *side) { s.labels = Labels{[]byte("other i"), []byte("other r")} }), ErrMismatch, errIO},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ierr, rerr := shake(t, tc.ini, tc.resp)
			check := func(who string, err, want error) {
				switch {
				case want == nil && err != nil:
					t.Errorf("%s: %v, want success", who, err)
				case want == errIO && (err == nil || errors.Is(err, ErrMismatch) || errors.Is(err, ErrMalformed)):
					t.Errorf("%s: %v, want an I/O error from the transport", who, err)
				case want != nil && want != errIO && !errors.Is(err, want):
					t.Errorf("%s: %v, want %v", who, err, want)
				}
			}
			check("initiator", ierr, tc.iErr)
			check("responder", rerr, tc.rErr)
		})
	}
}

// errIO stands in the table for "the transport's own error".
var errIO = errors.New("any transport error")

// fixed is a framed Transport that hands Initiate a message of any length.
type fixed struct{ msg []byte }

func (f fixed) Send([]byte) error        { return nil }
func (f fixed) Recv(int) ([]byte, error) { return f.msg, nil }

func TestInitiateMalformed(t *testing.T) {
	for _, n := range []int{0, NonceLen, ChallengeLen - 1, ChallengeLen + 1} {
		err := Initiate(fixed{make([]byte, n)}, []byte("k"), testLabels, []byte("open"))
		if !errors.Is(err, ErrMalformed) {
			t.Errorf("challenge of %d bytes: %v, want ErrMalformed", n, err)
		}
	}
}

// TestProofNotReplayable records a successful initiator's proof and plays
// it to a second Respond: the responder's fresh nonce makes it fail.
func TestProofNotReplayable(t *testing.T) {
	secret := []byte("0123456789abcdef")
	open := NewNonce()
	var proof []byte
	rec := side{secret: secret, labels: testLabels, open: open, tamper: func(m []byte) []byte { proof = bytes.Clone(m); return m }}
	if ierr, rerr := shake(t, rec, side{secret: secret, labels: testLabels, open: open}); ierr != nil || rerr != nil {
		t.Fatal(ierr, rerr)
	}
	a, b := net.Pipe()
	defer a.Close()
	go func() {
		io.ReadFull(a, make([]byte, ChallengeLen)) // the new challenge, ignored
		a.Write(proof)
	}()
	if err := Respond(Stream(b), secret, testLabels, open); !errors.Is(err, ErrMismatch) {
		t.Fatalf("replayed proof: %v, want ErrMismatch", err)
	}
}

// TestWire pins the messages: a responder's is its nonce and
// Sign(responder label, open, nonce, extra...), and the initiator answers
// Sign(initiator label, open, nonce, extra...). Protocols that predate this
// package (the tcp engine's handshake) depend on these bytes.
func TestWire(t *testing.T) {
	secret, open, extra := []byte("k"), []byte("open"), []byte("x")
	a, b := net.Pipe()
	defer a.Close()
	done := make(chan error, 1)
	go func() { done <- Respond(Stream(b), secret, testLabels, open, extra) }()
	msg := make([]byte, ChallengeLen)
	if _, err := io.ReadFull(a, msg); err != nil {
		t.Fatal(err)
	}
	nonce := msg[:NonceLen]
	if want := Sign(secret, testLabels.Responder, open, nonce, extra); !bytes.Equal(msg[NonceLen:], want) {
		t.Fatalf("challenge MAC %x, want %x", msg[NonceLen:], want)
	}
	a.Write(Sign(secret, testLabels.Initiator, open, nonce, extra))
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
