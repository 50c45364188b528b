// Package cluster carries the control plane of a multi-node hvdd job: one
// authenticated TCP link from each node's daemon to the coordinator (node 0),
// framed protobuf messages (clusterpb), and heartbeats that turn a silent peer
// into an error within a bounded time.
//
// It moves messages; the daemon decides what they mean. Tensor data never
// travels here (that is the backends' job).
package cluster

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"time"

	"github.com/hvdd/hvdd/rendezvous"
)

// MaxMessage bounds one control message (a plan of many tensors).
const MaxMessage = 64 << 20

// Defaults for Config's zero values.
const (
	DefaultHeartbeat   = time.Second
	DefaultPeerTimeout = 3 * time.Second
)

// ErrAuth reports a peer that failed the shared-secret handshake.
var ErrAuth = errors.New("cluster: peer failed authentication (is --secret-file / HVDD_SECRET the same on every node?)")

// Config tunes links.
type Config struct {
	// Secret is the job's shared secret; required.
	Secret []byte
	// Heartbeat is how often a link sends a heartbeat. Zero means 1 s.
	Heartbeat time.Duration
	// PeerTimeout is how long a link may stay silent before Recv fails. Zero
	// means 3 s; it must exceed Heartbeat.
	PeerTimeout time.Duration
}

// WithDefaults returns c with its zero values replaced by the defaults.
func (c Config) WithDefaults() Config {
	if c.Heartbeat == 0 {
		c.Heartbeat = DefaultHeartbeat
	}
	if c.PeerTimeout == 0 {
		c.PeerTimeout = DefaultPeerTimeout
	}
	return c
}

// handshake labels keep the two directions' MACs distinct.
var (
	labelClient = []byte("hvdd-cluster-client-v1")
	labelServer = []byte("hvdd-cluster-server-v1")
)

// Dial connects to the coordinator at addr and authenticates both ways; ctx
// bounds the whole exchange. who names the dialing node for the peer's logs.
func Dial(ctx context.Context, addr string, cfg Config, who string) (*Link, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("cluster: dial coordinator %s: %w", addr, err)
	}
	return ClientHandshake(ctx, c, addr, cfg, who)
}

// ClientHandshake authenticates a connection to the coordinator that the
// caller opened (over TCP, or a stream of the MPI bridge) and makes it a
// Link; peer names the coordinator in errors. On failure c is closed.
func ClientHandshake(ctx context.Context, c net.Conn, peer string, cfg Config, who string) (*Link, error) {
	cfg = cfg.WithDefaults()
	if dl, ok := ctx.Deadline(); ok {
		c.SetDeadline(dl)
	} else {
		c.SetDeadline(time.Now().Add(cfg.PeerTimeout))
	}
	// Server speaks first: its nonce. We answer with ours and a MAC over both;
	// it proves itself with a MAC over both in the other order.
	ns := make([]byte, 32)
	if _, err := io.ReadFull(c, ns); err != nil {
		c.Close()
		return nil, fmt.Errorf("cluster: handshake with %s: %w", peer, err)
	}
	nc := nonce()
	whoB := []byte(who)
	msg := make([]byte, 0, 32+32+2+len(whoB))
	msg = append(msg, nc...)
	msg = append(msg, rendezvous.Sign(cfg.Secret, labelClient, ns, nc, whoB)...)
	msg = binary.BigEndian.AppendUint16(msg, uint16(len(whoB)))
	msg = append(msg, whoB...)
	if _, err := c.Write(msg); err != nil {
		c.Close()
		return nil, fmt.Errorf("cluster: handshake with %s: %w", peer, err)
	}
	mac := make([]byte, 32)
	if _, err := io.ReadFull(c, mac); err != nil {
		c.Close()
		return nil, fmt.Errorf("cluster: handshake with %s: %w (the coordinator closed the connection: wrong secret?)", peer, err)
	}
	if !rendezvous.Verify(cfg.Secret, mac, labelServer, nc, ns) {
		c.Close()
		return nil, fmt.Errorf("cluster: coordinator %s: %w", peer, ErrAuth)
	}
	c.SetDeadline(time.Time{})
	link, err := newLink(c, cfg, peer)
	if err != nil {
		c.Close()
		return nil, err
	}
	return link, nil
}

// Listener accepts authenticated links.
type Listener struct {
	ln  net.Listener
	cfg Config
}

// Listen binds addr (host:port, an explicit host; port 0 picks one).
func Listen(addr string, cfg Config) (*Listener, error) {
	cfg = cfg.WithDefaults()
	if len(cfg.Secret) == 0 {
		return nil, errors.New("cluster: a shared secret is required")
	}
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, fmt.Errorf("cluster: listen address %q: %w", addr, err)
	}
	if host == "" || host == "0.0.0.0" || host == "::" {
		return nil, fmt.Errorf("cluster: listen address %q binds every interface; give the host to listen on", addr)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("cluster: listen on %s: %w", addr, err)
	}
	return &Listener{ln: ln, cfg: cfg}, nil
}

// Addr is the bound address.
func (l *Listener) Addr() string { return l.ln.Addr().String() }

// Close stops accepting.
func (l *Listener) Close() error { return l.ln.Close() }

// Accept waits for the next peer and authenticates it. A peer that fails the
// handshake is closed and reported with an error wrapping ErrAuth (or the I/O
// error); the listener stays usable.
func (l *Listener) Accept() (*Link, string, error) {
	c, err := l.ln.Accept()
	if err != nil {
		return nil, "", err
	}
	return ServerHandshake(c, c.RemoteAddr().String(), l.cfg)
}

// ServerHandshake authenticates a connection a node opened to the
// coordinator (accepted over TCP, or a stream of the MPI bridge) and makes it
// a Link; it returns the name the node gave. peer names the node in errors
// and logs. On failure c is closed and the error wraps ErrAuth or the I/O
// error.
func ServerHandshake(c net.Conn, peer string, cfg Config) (*Link, string, error) {
	cfg = cfg.WithDefaults()
	link, who, err := serverHandshake(c, peer, cfg)
	if err != nil {
		c.Close()
		return nil, "", fmt.Errorf("cluster: peer %s: %w", peer, err)
	}
	return link, who, nil
}

func serverHandshake(c net.Conn, peer string, cfg Config) (*Link, string, error) {
	c.SetDeadline(time.Now().Add(cfg.PeerTimeout))
	ns := nonce()
	if _, err := c.Write(ns); err != nil {
		return nil, "", err
	}
	head := make([]byte, 32+32+2)
	if _, err := io.ReadFull(c, head); err != nil {
		return nil, "", err
	}
	nc, mac := head[:32], head[32:64]
	whoB := make([]byte, binary.BigEndian.Uint16(head[64:]))
	if _, err := io.ReadFull(c, whoB); err != nil {
		return nil, "", err
	}
	if !rendezvous.Verify(cfg.Secret, mac, labelClient, ns, nc, whoB) {
		return nil, "", ErrAuth
	}
	if _, err := c.Write(rendezvous.Sign(cfg.Secret, labelServer, nc, ns)); err != nil {
		return nil, "", err
	}
	c.SetDeadline(time.Time{})
	link, err := newLink(c, cfg, peer)
	if err != nil {
		return nil, "", err
	}
	return link, string(whoB), nil
}

func nonce() []byte {
	b := make([]byte, 32)
	rand.Read(b)
	return b
}
