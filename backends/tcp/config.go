package tcp

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"time"

	"github.com/hvdd/hvdd/backends"
)

// Store is the part of a rendezvous key-value store the engine needs to
// bootstrap: every rank Sets its address and Waits for its peers'. The
// rendezvous package's stores satisfy it.
type Store interface {
	// Set stores value under key.
	Set(ctx context.Context, key string, value []byte) error
	// Wait blocks until every key is set, or ctx ends, and returns the values.
	Wait(ctx context.Context, keys ...string) (map[string][]byte, error)
}

// Defaults of Config's zero fields.
const (
	DefaultStreams        = 2
	DefaultChunkBytes     = 1 << 20
	DefaultSmallBytes     = 64 << 10
	DefaultSocketBuffer   = 4 << 20
	DefaultHeartbeat      = time.Second
	DefaultPeerTimeout    = 3 * time.Second
	DefaultConnectTimeout = 2 * time.Minute
)

// MaxStreams bounds Config.Streams; more connections per peer than this
// only cost file descriptors.
const MaxStreams = 16

// Config configures New. Fields marked as such must agree on every rank
// (the handshake refuses peers whose values differ).
type Config struct {
	// Rank is this node's rank in [0, Size); Size is the number of nodes.
	Rank, Size int

	// Store is where ranks publish their addresses. Required when Size > 1.
	Store Store
	// Prefix namespaces the store keys and identifies the job (for example
	// "job42/gen3"); it is part of every handshake, so daemons of another
	// job or generation are refused. Must agree. Empty is allowed.
	Prefix string

	// ListenAddr is the host:port to listen on, for example "10.0.0.5:0"
	// (port 0 picks a free port). The host must be explicit: an empty host
	// or an unspecified address (0.0.0.0, ::) is refused unless AllowAll is
	// set. Required when Size > 1.
	ListenAddr string
	// AllowAll permits listening on all interfaces.
	AllowAll bool
	// Advertise is the host:port peers dial. Empty means the address the
	// listener got (which must then not be an unspecified address).
	Advertise string

	// Secret is the shared key every connection is authenticated with
	// (HMAC-SHA256 challenge and response in both directions). Required
	// unless Insecure.
	Secret []byte
	// Insecure allows an empty Secret: connections are still checked for
	// job, rank and size but anyone who can reach the port can join.
	Insecure bool

	// Streams is the number of TCP connections per peer that carry data;
	// large collectives are split into that many independent channels so
	// that several cores and connections fill the link. Zero means
	// DefaultStreams. Must agree.
	Streams int
	// ChunkBytes is the pipeline segment of the large-message algorithms:
	// the unit in which a block is sent, received and reduced, so that
	// the network and the reduction overlap. Zero means DefaultChunkBytes.
	// Must agree.
	ChunkBytes int
	// SmallBytes is the largest buffer (for allreduce, broadcast,
	// reduce-scatter and allgather: the whole result) handled by the
	// latency-oriented algorithms rather than the pipelined rings. Zero
	// means DefaultSmallBytes; negative means always use the rings. Must
	// agree.
	SmallBytes int
	// Compression sends the float32 data of Sum reductions (Allreduce,
	// ReduceScatter) in 16 bits while sums accumulate in float32, within
	// backends.Compression.ErrorBound of the exact sum; other data travels
	// as it is (compress.go says what and why). The zero value,
	// backends.CompressNone, sends every byte as it is. Must agree.
	Compression backends.Compression

	// SocketBuffer is the SO_SNDBUF and SO_RCVBUF size requested for data
	// connections (the kernel caps it at net.core.wmem_max/rmem_max). Zero
	// means DefaultSocketBuffer; negative leaves the kernel's autotuning.
	SocketBuffer int

	// Heartbeat is the interval at which each rank tells every peer it is
	// alive. Zero means DefaultHeartbeat.
	Heartbeat time.Duration
	// PeerTimeout is how long a peer may stay silent before it is declared
	// lost. Zero means DefaultPeerTimeout. It must exceed Heartbeat.
	PeerTimeout time.Duration
	// ConnectTimeout bounds New (on top of its ctx). Zero means
	// DefaultConnectTimeout.
	ConnectTimeout time.Duration

	// Logger receives connection events and refusals. Nil means
	// slog.Default().
	Logger *slog.Logger
}

// withDefaults returns c with its zero fields filled in.
func (c Config) withDefaults() Config {
	if c.Streams == 0 {
		c.Streams = DefaultStreams
	}
	if c.ChunkBytes == 0 {
		c.ChunkBytes = DefaultChunkBytes
	}
	if c.SmallBytes == 0 {
		c.SmallBytes = DefaultSmallBytes
	}
	if c.SocketBuffer == 0 {
		c.SocketBuffer = DefaultSocketBuffer
	}
	if c.Heartbeat == 0 {
		c.Heartbeat = DefaultHeartbeat
	}
	if c.PeerTimeout == 0 {
		c.PeerTimeout = DefaultPeerTimeout
	}
	if c.ConnectTimeout == 0 {
		c.ConnectTimeout = DefaultConnectTimeout
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

// validate checks a defaulted Config.
func (c *Config) validate() error {
	switch {
	case c.Size < 1:
		return fmt.Errorf("tcp: Size %d must be at least 1", c.Size)
	case c.Rank < 0 || c.Rank >= c.Size:
		return fmt.Errorf("tcp: Rank %d is outside [0, %d)", c.Rank, c.Size)
	case c.Streams < 1 || c.Streams > MaxStreams:
		return fmt.Errorf("tcp: Streams %d is outside [1, %d]", c.Streams, MaxStreams)
	case c.ChunkBytes < 64:
		return fmt.Errorf("tcp: ChunkBytes %d is below 64", c.ChunkBytes)
	case c.Heartbeat < 0 || c.PeerTimeout <= c.Heartbeat:
		return fmt.Errorf("tcp: PeerTimeout %v must exceed Heartbeat %v", c.PeerTimeout, c.Heartbeat)
	case len(c.Secret) == 0 && !c.Insecure:
		return errors.New("tcp: Secret is required (or set Insecure)")
	case !c.Compression.Valid():
		return fmt.Errorf("tcp: Compression %v is not none, fp16 or bf16", c.Compression)
	case len(c.Prefix) > maxPrefix:
		return fmt.Errorf("tcp: Prefix is %d bytes, more than %d", len(c.Prefix), maxPrefix)
	}
	if c.Size == 1 {
		return nil
	}
	if c.Store == nil {
		return errors.New("tcp: Store is required")
	}
	host, _, err := net.SplitHostPort(c.ListenAddr)
	if err != nil {
		return fmt.Errorf("tcp: ListenAddr %q: %w", c.ListenAddr, err)
	}
	if !c.AllowAll {
		if host == "" {
			return fmt.Errorf("tcp: ListenAddr %q names no host; give an interface address, or set AllowAll to listen on all interfaces", c.ListenAddr)
		}
		if ip := net.ParseIP(host); ip != nil && ip.IsUnspecified() {
			return fmt.Errorf("tcp: ListenAddr %q listens on all interfaces; give an interface address, or set AllowAll", c.ListenAddr)
		}
	}
	return nil
}
