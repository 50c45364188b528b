// Package cluster carries the control plane of a multi-node hvdd job: one
// authenticated TCP link from each node's daemon to the coordinator (node 0),
// framed protobuf messages (clusterpb), and heartbeats that turn a silent peer
// into an error within a bounded time.
//
// A link opens with the auth package's challenge-response handshake, the
// coordinator initiating: it sends its nonce; the dialing node sends its
// name (a big-endian uint16 length, then the bytes), then its nonce and
// proof; the coordinator checks the proof and answers with its own. Both
// proofs bind the name. A wrong secret is reported as ErrAuth by the side
// that finds it.
//
// It moves messages; the daemon decides what they mean. Tensor data never
// travels here (that is the backends' job).
package cluster

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"time"

	"github.com/hvdd/hvdd/auth"
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

// labels are the control links' auth.Labels: the coordinator (the
// listening side) speaks first, so it is the initiator.
var labels = auth.Labels{
	Initiator: []byte("hvdd-cluster-server-v1"),
	Responder: []byte("hvdd-cluster-client-v1"),
}

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
	// The handshake (see auth): the coordinator opens with its nonce; we
	// send our name, then our nonce and proof, both binding the name; it
	// answers with its proof.
	open := make([]byte, auth.NonceLen)
	if _, err := io.ReadFull(c, open); err != nil {
		c.Close()
		return nil, fmt.Errorf("cluster: handshake with %s: %w", peer, err)
	}
	whoB := []byte(who)
	if _, err := c.Write(append(binary.BigEndian.AppendUint16(nil, uint16(len(whoB))), whoB...)); err != nil {
		c.Close()
		return nil, fmt.Errorf("cluster: handshake with %s: %w", peer, err)
	}
	if err := auth.Respond(hinted{auth.Stream(c)}, cfg.Secret, labels, open, whoB); err != nil {
		c.Close()
		if errors.Is(err, auth.ErrMismatch) {
			return nil, fmt.Errorf("cluster: coordinator %s: %w", peer, ErrAuth)
		}
		return nil, fmt.Errorf("cluster: handshake with %s: %w", peer, err)
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
	open := auth.NewNonce()
	if _, err := c.Write(open); err != nil {
		return nil, "", err
	}
	var n [2]byte
	if _, err := io.ReadFull(c, n[:]); err != nil {
		return nil, "", err
	}
	whoB := make([]byte, binary.BigEndian.Uint16(n[:]))
	if _, err := io.ReadFull(c, whoB); err != nil {
		return nil, "", err
	}
	if err := auth.Initiate(auth.Stream(c), cfg.Secret, labels, open, whoB); err != nil {
		if errors.Is(err, auth.ErrMismatch) {
			return nil, "", ErrAuth
		}
		return nil, "", err
	}
	c.SetDeadline(time.Time{})
	link, err := newLink(c, cfg, peer)
	if err != nil {
		return nil, "", err
	}
	return link, string(whoB), nil
}

// hinted is the dialing side's transport: the coordinator closes the
// connection instead of proving itself to a node whose proof failed, so a
// failed read says so.
type hinted struct{ auth.Transport }

func (h hinted) Recv(n int) ([]byte, error) {
	b, err := h.Transport.Recv(n)
	if err != nil {
		return nil, fmt.Errorf("%w (the coordinator closed the connection: wrong secret?)", err)
	}
	return b, nil
}
