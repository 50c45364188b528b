package auth

import (
	"errors"
	"fmt"
	"io"
)

// ChallengeLen is the length of the responder's message: its nonce, then
// its MAC.
const ChallengeLen = NonceLen + MACLen

// Errors of the handshake. Errors from the Transport are returned as they
// are, so a caller can tell its own I/O and framing failures from these.
var (
	// ErrMismatch means the peer's MAC does not verify: it holds another
	// secret (or none), or the messages were altered on the way.
	ErrMismatch = errors.New("auth: the peer's proof does not verify (wrong secret?)")
	// ErrMalformed means the responder's message is not ChallengeLen bytes.
	ErrMalformed = errors.New("auth: malformed handshake message")
)

// Labels name the two roles of one handshake protocol. They are signed
// first in each MAC, so they must differ from each other and from every
// other protocol's labels sharing the secret; then a proof made for one role
// or protocol is never accepted for another.
type Labels struct {
	// Initiator labels the proof of the side that sent the opening message.
	Initiator []byte
	// Responder labels the proof of the side that answers it.
	Responder []byte
}

// Transport carries the two messages Initiate and Respond exchange, in
// whatever framing the protocol uses. Initiate sends one message and
// receives one; so does Respond.
type Transport interface {
	// Send sends msg to the peer as one message.
	Send(msg []byte) error
	// Recv returns the peer's next message; n is the length the exchange
	// expects. A transport that frames its messages may return another
	// length, which fails the exchange (ErrMalformed or ErrMismatch).
	Recv(n int) ([]byte, error)
}

// Stream returns a Transport over a byte stream with no framing: Send
// writes the message as it is and Recv reads exactly n bytes.
func Stream(rw io.ReadWriter) Transport { return stream{rw} }

type stream struct{ rw io.ReadWriter }

func (s stream) Send(msg []byte) error {
	_, err := s.rw.Write(msg)
	return err
}

func (s stream) Recv(n int) ([]byte, error) {
	b := make([]byte, n)
	if _, err := io.ReadFull(s.rw, b); err != nil {
		return nil, err
	}
	return b, nil
}

// transcript is what both proofs sign, after their label.
func transcript(label, open, nonce []byte, extra [][]byte) [][]byte {
	return append([][]byte{label, open, nonce}, extra...)
}

// Initiate runs the initiator's side of the handshake once it has sent open,
// its opening message, which must carry a fresh nonce from NewNonce (so that
// the responder's proof cannot be replayed to it). It receives the
// responder's nonce and proof, checks the proof, and sends its own. extra
// are further bytes both sides know (received in an earlier message, say)
// and bind into both proofs.
//
// A responder whose proof does not verify gets nothing and the error wraps
// ErrMismatch; the caller decides whether to tell the peer and closes the
// connection.
func Initiate(t Transport, secret []byte, l Labels, open []byte, extra ...[]byte) error {
	msg, err := t.Recv(ChallengeLen)
	if err != nil {
		return err
	}
	if len(msg) != ChallengeLen {
		return fmt.Errorf("%w: challenge of %d bytes, want %d", ErrMalformed, len(msg), ChallengeLen)
	}
	nonce, mac := msg[:NonceLen], msg[NonceLen:]
	if !Verify(secret, mac, transcript(l.Responder, open, nonce, extra)...) {
		return ErrMismatch
	}
	return t.Send(Sign(secret, transcript(l.Initiator, open, nonce, extra)...))
}

// Respond runs the responder's side of the handshake on open, the
// initiator's opening message as received (after the caller checked what
// it carries). It sends a fresh nonce with its proof, then receives the
// initiator's proof and checks it; extra are as for Initiate. An initiator
// whose proof does not verify makes the error wrap ErrMismatch.
func Respond(t Transport, secret []byte, l Labels, open []byte, extra ...[]byte) error {
	nonce := NewNonce()
	if err := t.Send(append(nonce, Sign(secret, transcript(l.Responder, open, nonce, extra)...)...)); err != nil {
		return err
	}
	proof, err := t.Recv(MACLen)
	if err != nil {
		return err
	}
	if !Verify(secret, proof, transcript(l.Initiator, open, nonce, extra)...) {
		return ErrMismatch
	}
	return nil
}
