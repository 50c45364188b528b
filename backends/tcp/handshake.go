package tcp

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"

	"github.com/hvdd/hvdd/auth"
	"github.com/hvdd/hvdd/backends"
)

// The handshake opens every connection, before any other byte, and is
// symmetric in what it proves: each side shows it holds the shared secret by
// answering a fresh nonce chosen by the other, and both MACs cover the whole
// hello (job prefix, size, both ranks, stream index, the settings that must
// agree, the client nonce) plus the server nonce, so nothing in it can be
// altered or replayed into another connection.
//
//	client (lower rank)                      server (higher rank)
//	hello{version, size, from, to, stream, streams,
//	      chunk, small, compression, nonceC, prefix} ->
//	                                         checks job, ranks, settings
//	                        <- challenge{nonceS, MAC(secret, "server", hello, nonceS)}
//	checks the server's MAC
//	proof{MAC(secret, "client", hello, nonceS)} ->
//	                                         checks the client's MAC
//	                                         <- ok
//
// The hello is the opening message of the auth package's exchange
// (auth.Initiate on the client, auth.Respond on the server); challenge and
// proof are that exchange's two messages, carried in this package's frames.
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
	protoVersion = 2 // 2: the hello carries the compression
	maxFrameBody = 1024
	maxPrefix    = 512
	nonceLen     = auth.NonceLen
	macLen       = auth.MACLen
	headerLen    = 7
	helloFixed   = 1 + 8*4 + nonceLen // version, 8 u32 fields, nonce
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

// labels keep the server's and the client's MACs distinct, so neither can
// be reflected back as the other. The client opens (its hello), so it is
// the initiator of the auth exchange.
var labels = auth.Labels{
	Initiator: []byte("hvdd/tcp client v1"),
	Responder: []byte("hvdd/tcp server v1"),
}

// hello is the client's opening message.
type hello struct {
	Version           uint8
	Size, From, To    int
	Stream, Streams   int
	ChunkBytes, Small int
	Compression       int // backends.Compression
	Nonce             [nonceLen]byte
	Prefix            string
}

func (h *hello) marshal() []byte {
	b := make([]byte, 0, helloFixed+len(h.Prefix))
	b = append(b, h.Version)
	for _, v := range []int{h.Size, h.From, h.To, h.Stream, h.Streams, h.ChunkBytes, h.Small, h.Compression} {
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
	v := make([]int, 8)
	for i := range v {
		v[i] = int(int32(binary.BigEndian.Uint32(b[1+4*i:])))
	}
	h.Size, h.From, h.To, h.Stream, h.Streams, h.ChunkBytes, h.Small, h.Compression = v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7]
	copy(h.Nonce[:], b[1+4*len(v):helloFixed])
	h.Prefix = string(b[helloFixed:])
	return h, nil
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
	compression           backends.Compression
}

func (b *engine) shake() shake {
	c := &b.cfg
	return shake{c.Secret, c.Prefix, c.Size, c.Rank, c.Streams, c.ChunkBytes, c.SmallBytes, c.Compression}
}

// proofs is the auth.Transport of a handshake: the server's challenge and
// the client's proof travel in frames of their kinds, and a reject frame in
// their place ends the handshake with the peer's reason. Its errors name
// the message that failed; a malformed one is refused (refuse), so the peer
// learns why.
type proofs struct {
	c      net.Conn
	server bool
	peer   int // the other side's rank, for errors
}

func (p proofs) Send(msg []byte) error {
	if p.server {
		if err := writeFrame(p.c, kindChallenge, msg); err != nil {
			return fmt.Errorf("%w: send challenge: %v", ErrHandshake, err)
		}
		return nil
	}
	if err := writeFrame(p.c, kindProof, msg); err != nil {
		return fmt.Errorf("send proof: %w", err)
	}
	return nil
}

func (p proofs) Recv(n int) ([]byte, error) {
	kind, body, err := readFrame(p.c)
	switch {
	case err != nil && p.server:
		return nil, fmt.Errorf("%w: read proof: %v", ErrHandshake, err)
	case err != nil:
		return nil, fmt.Errorf("read challenge: %w", err)
	case kind == kindReject:
		return nil, fmt.Errorf("%w by rank %d: %s", ErrHandshake, p.peer, body)
	case p.server && kind != kindProof:
		return nil, refuse(p.c, "protocol error: expected proof, got kind %d", kind)
	case !p.server && (kind != kindChallenge || len(body) != n):
		return nil, refuse(p.c, "protocol error: expected a challenge, got kind %d with %d bytes", kind, len(body))
	}
	return body, nil
}

// client runs the dialing side's handshake for connection stream to rank to.
func (s shake) client(c net.Conn, to, stream int) error {
	h := hello{Version: protoVersion, Size: s.size, From: s.rank, To: to, Stream: stream,
		Streams: s.streams, ChunkBytes: s.chunk, Small: s.small, Compression: int(s.compression), Prefix: s.prefix}
	copy(h.Nonce[:], auth.NewNonce())
	hb := h.marshal()
	if err := writeFrame(c, kindHello, hb); err != nil {
		return fmt.Errorf("send hello: %w", err)
	}
	err := auth.Initiate(proofs{c: c, peer: to}, s.secret, labels, hb)
	switch {
	case errors.Is(err, auth.ErrMismatch):
		return refuse(c, "rank %d failed authentication (wrong secret?)", to)
	case err != nil:
		return err
	}
	kind, body, err := readFrame(c)
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
	if len(body) > 0 && body[0] != protoVersion {
		// Before parsing: another version's hello may have another length.
		return 0, 0, refuse(c, "protocol version %d, this daemon speaks %d: run the same hvdd version on every node", body[0], protoVersion)
	}
	h, err := parseHello(body)
	switch {
	case err != nil:
		return 0, 0, refuse(c, "bad hello: %v", err)
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
	case h.Compression != int(s.compression):
		return 0, 0, refuse(c, "settings differ: peer sends float32 sums with wire compression %v, this daemon with %v; give every node the same --wire-compression (or $HVDD_WIRE_COMPRESSION)",
			backends.Compression(h.Compression), s.compression)
	case h.Stream < 0 || h.Stream > s.streams:
		return 0, 0, refuse(c, "stream index %d outside [0, %d]", h.Stream, s.streams)
	}
	err = auth.Respond(proofs{c: c, server: true, peer: h.From}, s.secret, labels, body)
	switch {
	case errors.Is(err, auth.ErrMismatch):
		return 0, 0, refuse(c, "authentication failed for a peer claiming rank %d (wrong secret?)", h.From)
	case err != nil:
		return 0, 0, err
	}
	if err := writeFrame(c, kindOK, nil); err != nil {
		return 0, 0, fmt.Errorf("%w: send ok: %v", ErrHandshake, err)
	}
	return h.From, h.Stream, nil
}
