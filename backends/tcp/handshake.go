package tcp

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
)

// The handshake opens every connection, before any other byte, and is
// symmetric in what it proves: each side shows it holds the shared secret by
// answering a fresh nonce chosen by the other, and both MACs cover the whole
// hello (job prefix, size, both ranks, stream index, the settings that must
// agree, the client nonce) plus the server nonce, so nothing in it can be
// altered or replayed into another connection.
//
//	client (lower rank)                      server (higher rank)
//	hello{version, size, from, to, stream,
//	      streams, chunk, small, nonceC, prefix} ->
//	                                         checks job, ranks, settings
//	                        <- challenge{nonceS, MAC(secret, "server", hello, nonceS)}
//	checks the server's MAC
//	proof{MAC(secret, "client", hello, nonceS)} ->
//	                                         checks the client's MAC
//	                                         <- ok
//
// Either side may instead send reject{reason} and close; the reason is
// logged by the side that refuses and returned as an error by the other.
// Frames are
//
//	magic "HVDT" | kind u8 | body length u16 (big-endian) | body
//
// with bodies of at most maxFrameBody bytes. Nothing is buffered beyond the
// frames, so data that a peer sends right after its last handshake frame is
// left in the socket for the collectives.

// ErrHandshake is wrapped by errors of connections refused during the
// handshake, by either side.
var ErrHandshake = errors.New("tcp: handshake refused")

const (
	protoVersion = 1
	maxFrameBody = 1024
	maxPrefix    = 512
	nonceLen     = 32
	macLen       = sha256.Size
	headerLen    = 7
	helloFixed   = 1 + 7*4 + nonceLen // version, 7 u32 fields, nonce
)

var frameMagic = [4]byte{'H', 'V', 'D', 'T'}

// Handshake frame kinds.
const (
	kindHello     = 1
	kindChallenge = 2
	kindProof     = 3
	kindOK        = 4
	kindReject    = 5
)

// Labels keep the server's and the client's MACs distinct, so neither can be
// reflected back as the other.
var (
	labelServer = []byte("hvdd/tcp server v1")
	labelClient = []byte("hvdd/tcp client v1")
)

// hello is the client's opening message.
type hello struct {
	Version           uint8
	Size, From, To    int
	Stream, Streams   int
	ChunkBytes, Small int
	Nonce             [nonceLen]byte
	Prefix            string
}

func (h *hello) marshal() []byte {
	b := make([]byte, 0, helloFixed+len(h.Prefix))
	b = append(b, h.Version)
	for _, v := range []int{h.Size, h.From, h.To, h.Stream, h.Streams, h.ChunkBytes, h.Small} {
		b = binary.BigEndian.AppendUint32(b, uint32(int32(v)))
	}
	b = append(b, h.Nonce[:]...)
	return append(b, h.Prefix...)
}

// parseHello decodes a hello body. It never panics on any input.
func parseHello(b []byte) (hello, error) {
	var h hello
	if len(b) < helloFixed {
		return h, fmt.Errorf("hello of %d bytes is shorter than %d", len(b), helloFixed)
	}
	if len(b)-helloFixed > maxPrefix {
		return h, fmt.Errorf("hello carries a %d-byte prefix, more than %d", len(b)-helloFixed, maxPrefix)
	}
	h.Version = b[0]
	v := make([]int, 7)
	for i := range v {
		v[i] = int(int32(binary.BigEndian.Uint32(b[1+4*i:])))
	}
	h.Size, h.From, h.To, h.Stream, h.Streams, h.ChunkBytes, h.Small = v[0], v[1], v[2], v[3], v[4], v[5], v[6]
	copy(h.Nonce[:], b[29:29+nonceLen])
	h.Prefix = string(b[helloFixed:])
	return h, nil
}

// sign is HMAC-SHA256 of secret over parts, each preceded by its length as a
// big-endian uint64, so that no two different part lists sign alike.
func sign(secret []byte, parts ...[]byte) []byte {
	m := hmac.New(sha256.New, secret)
	var n [8]byte
	for _, p := range parts {
		binary.BigEndian.PutUint64(n[:], uint64(len(p)))
		m.Write(n[:])
		m.Write(p)
	}
	return m.Sum(nil)
}

func writeFrame(w io.Writer, kind byte, body []byte) error {
	if len(body) > maxFrameBody {
		return fmt.Errorf("handshake frame of %d bytes exceeds %d", len(body), maxFrameBody)
	}
	f := make([]byte, headerLen, headerLen+len(body))
	copy(f, frameMagic[:])
	f[4] = kind
	binary.BigEndian.PutUint16(f[5:], uint16(len(body)))
	_, err := w.Write(append(f, body...))
	return err
}

// parseHeader checks a frame header and returns its kind and body length.
func parseHeader(h []byte) (kind byte, n int, err error) {
	if len(h) != headerLen {
		return 0, 0, fmt.Errorf("header of %d bytes", len(h))
	}
	if [4]byte(h[:4]) != frameMagic {
		return 0, 0, fmt.Errorf("bad magic %q: not an hvdd tcp peer", h[:4])
	}
	kind, n = h[4], int(binary.BigEndian.Uint16(h[5:]))
	if kind < kindHello || kind > kindReject {
		return 0, 0, fmt.Errorf("unknown frame kind %d", kind)
	}
	if n > maxFrameBody {
		return 0, 0, fmt.Errorf("frame body of %d bytes exceeds %d", n, maxFrameBody)
	}
	return kind, n, nil
}

func readFrame(r io.Reader) (byte, []byte, error) {
	var h [headerLen]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return 0, nil, err
	}
	kind, n, err := parseHeader(h[:])
	if err != nil {
		return 0, nil, err
	}
	body := make([]byte, n)
	if _, err := io.ReadFull(r, body); err != nil {
		return 0, nil, err
	}
	return kind, body, nil
}

// refused builds the error of a handshake refused by this side and tells the
// peer why (best effort).
func refuse(c net.Conn, format string, args ...any) error {
	reason := fmt.Sprintf(format, args...)
	writeFrame(c, kindReject, []byte(truncate(reason)))
	return fmt.Errorf("%w: %s", ErrHandshake, reason)
}

func truncate(s string) string {
	if len(s) > maxFrameBody {
		return s[:maxFrameBody]
	}
	return s
}

// shake holds what a rank's handshakes need from its Config.
type shake struct {
	secret                []byte
	prefix                string
	size, rank            int
	streams, chunk, small int
}

func (b *Backend) shake() shake {
	c := &b.cfg
	return shake{c.Secret, c.Prefix, c.Size, c.Rank, c.Streams, c.ChunkBytes, c.SmallBytes}
}

// client runs the dialing side's handshake for connection stream to rank to.
func (s shake) client(c net.Conn, to, stream int) error {
	h := hello{Version: protoVersion, Size: s.size, From: s.rank, To: to, Stream: stream,
		Streams: s.streams, ChunkBytes: s.chunk, Small: s.small, Prefix: s.prefix}
	if _, err := rand.Read(h.Nonce[:]); err != nil {
		return err
	}
	hb := h.marshal()
	if err := writeFrame(c, kindHello, hb); err != nil {
		return fmt.Errorf("send hello: %w", err)
	}
	kind, body, err := readFrame(c)
	if err != nil {
		return fmt.Errorf("read challenge: %w", err)
	}
	switch {
	case kind == kindReject:
		return fmt.Errorf("%w by rank %d: %s", ErrHandshake, to, body)
	case kind != kindChallenge || len(body) != nonceLen+macLen:
		return refuse(c, "protocol error: expected a challenge, got kind %d with %d bytes", kind, len(body))
	}
	nonceS, mac := body[:nonceLen], body[nonceLen:]
	if !hmac.Equal(mac, sign(s.secret, labelServer, hb, nonceS)) {
		return refuse(c, "rank %d failed authentication (wrong secret?)", to)
	}
	if err := writeFrame(c, kindProof, sign(s.secret, labelClient, hb, nonceS)); err != nil {
		return fmt.Errorf("send proof: %w", err)
	}
	kind, body, err = readFrame(c)
	switch {
	case err != nil:
		return fmt.Errorf("read verdict: %w", err)
	case kind == kindReject:
		return fmt.Errorf("%w by rank %d: %s", ErrHandshake, to, body)
	case kind != kindOK:
		return fmt.Errorf("%w: protocol error: expected ok, got kind %d", ErrHandshake, kind)
	}
	return nil
}

// server runs the accepting side's handshake and returns the client's rank
// and stream index.
func (s shake) server(c net.Conn) (from, stream int, err error) {
	kind, body, err := readFrame(c)
	if err != nil {
		return 0, 0, fmt.Errorf("%w: read hello: %v", ErrHandshake, err)
	}
	if kind != kindHello {
		return 0, 0, refuse(c, "protocol error: expected hello, got kind %d", kind)
	}
	h, err := parseHello(body)
	switch {
	case err != nil:
		return 0, 0, refuse(c, "bad hello: %v", err)
	case h.Version != protoVersion:
		return 0, 0, refuse(c, "protocol version %d, this daemon speaks %d", h.Version, protoVersion)
	case h.Prefix != s.prefix:
		return 0, 0, refuse(c, "job mismatch: peer is in %q, this daemon in %q", h.Prefix, s.prefix)
	case h.Size != s.size:
		return 0, 0, refuse(c, "size mismatch: peer has %d nodes, this daemon %d", h.Size, s.size)
	case h.To != s.rank:
		return 0, 0, refuse(c, "peer wants rank %d, this daemon is rank %d", h.To, s.rank)
	case h.From < 0 || h.From >= s.rank:
		return 0, 0, refuse(c, "rank %d may not dial rank %d (lower ranks dial higher ones)", h.From, s.rank)
	case h.Streams != s.streams || h.ChunkBytes != s.chunk || h.Small != s.small:
		return 0, 0, refuse(c, "settings differ: peer streams=%d chunk=%d small=%d, this daemon %d/%d/%d",
			h.Streams, h.ChunkBytes, h.Small, s.streams, s.chunk, s.small)
	case h.Stream < 0 || h.Stream > s.streams:
		return 0, 0, refuse(c, "stream index %d outside [0, %d]", h.Stream, s.streams)
	}
	var nonceS [nonceLen]byte
	if _, err := rand.Read(nonceS[:]); err != nil {
		return 0, 0, err
	}
	if err := writeFrame(c, kindChallenge, append(nonceS[:], sign(s.secret, labelServer, body, nonceS[:])...)); err != nil {
		return 0, 0, fmt.Errorf("%w: send challenge: %v", ErrHandshake, err)
	}
	kind, proof, err := readFrame(c)
	switch {
	case err != nil:
		return 0, 0, fmt.Errorf("%w: read proof: %v", ErrHandshake, err)
	case kind == kindReject:
		return 0, 0, fmt.Errorf("%w by rank %d: %s", ErrHandshake, h.From, proof)
	case kind != kindProof:
		return 0, 0, refuse(c, "protocol error: expected proof, got kind %d", kind)
	case !hmac.Equal(proof, sign(s.secret, labelClient, body, nonceS[:])):
		return 0, 0, refuse(c, "authentication failed for a peer claiming rank %d (wrong secret?)", h.From)
	}
	if err := writeFrame(c, kindOK, nil); err != nil {
		return 0, 0, fmt.Errorf("%w: send ok: %v", ErrHandshake, err)
	}
	return h.From, h.Stream, nil
}
