package tcp

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hvdd/hvdd/auth"
	"github.com/hvdd/hvdd/backends"
	"github.com/hvdd/hvdd/rendezvous"
)

// logBuffer collects a rank's log output for assertions.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

func (l *logBuffer) logger() *slog.Logger { return slog.New(slog.NewTextHandler(l, nil)) }

// result is what one rank's New returned.
type result struct {
	b   *Backend
	err error
}

// start runs New in the background.
func start(ctx context.Context, c Config) <-chan result {
	ch := make(chan result, 1)
	go func() {
		b, err := New(ctx, c)
		ch <- result{b, err}
	}()
	return ch
}

func (r result) close() {
	if r.b != nil {
		r.b.Close()
	}
}

func TestWrongSecretRefusedOnBothSides(t *testing.T) {
	store := rendezvous.NewMemory()
	var log0, log1 logBuffer
	c0, c1 := testConfig(store, 0, 2), testConfig(store, 1, 2)
	c0.Logger, c1.Logger = log0.logger(), log1.logger()
	c1.Secret = []byte("another secret")
	c1.ConnectTimeout = time.Second // it waits for a rank 0 that can never authenticate
	ctx := context.Background()
	r1 := start(ctx, c1)
	r0 := <-start(ctx, c0)
	defer r0.close()
	if !errors.Is(r0.err, ErrHandshake) || !strings.Contains(r0.err.Error(), "wrong secret") {
		t.Errorf("rank 0: got %v, want a handshake error about the secret", r0.err)
	}
	res := <-r1
	defer res.close()
	if res.err == nil || !strings.Contains(res.err.Error(), "wrong secret") {
		t.Errorf("rank 1: got %v, want an error naming the refused handshake", res.err)
	}
	if !strings.Contains(log1.String(), "refused connection") {
		t.Errorf("rank 1 did not log the refusal; log:\n%s", log1.String())
	}
	if !strings.Contains(log0.String(), "handshake refused") {
		t.Errorf("rank 0 did not log the refusal; log:\n%s", log0.String())
	}
}

// TestRefusals points rank 0 of one job at a rank 1 that differs in one
// respect and checks that the handshake names the difference.
func TestRefusals(t *testing.T) {
	tests := []struct {
		name  string
		tweak func(c *Config)
		want  string
	}{
		{"prefix", func(c *Config) { c.Prefix = "another/job" }, "job mismatch"},
		{"size", func(c *Config) { c.Size = 3 }, "size mismatch"},
		{"streams", func(c *Config) { c.Streams = 5 }, "settings differ"},
		{"small", func(c *Config) { c.SmallBytes = 100 }, "settings differ"},
		{"compression", func(c *Config) { c.Compression = backends.CompressBF16 }, "wire compression none, this daemon with bf16"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			// The odd rank 1 lives in a store of its own, waiting for
			// a rank 0 of its own kind.
			other := rendezvous.NewMemory()
			var log1 logBuffer
			c1 := testConfig(other, 1, 2)
			tt.tweak(&c1)
			c1.Logger = log1.logger()
			ctx1, cancel1 := context.WithCancel(ctx)
			r1 := start(ctx1, c1)
			defer func() { cancel1(); (<-r1).close() }()
			addr, err := other.Wait(ctx, c1.Prefix+"/tcp/addr/1")
			if err != nil {
				t.Fatal(err)
			}
			// Rank 0 finds that address under its own key.
			store := rendezvous.NewMemory()
			store.Set(ctx, "test/job/tcp/addr/1", addr[c1.Prefix+"/tcp/addr/1"])
			r0 := <-start(ctx, testConfig(store, 0, 2))
			defer r0.close()
			if !errors.Is(r0.err, ErrHandshake) || !strings.Contains(r0.err.Error(), tt.want) {
				t.Errorf("rank 0: got %v, want a handshake error containing %q", r0.err, tt.want)
			}
			if !waitFor(func() bool { return strings.Contains(log1.String(), tt.want) }) {
				t.Errorf("rank 1 did not log %q; log:\n%s", tt.want, log1.String())
			}
		})
	}
}

// waitFor polls cond every 10 ms for up to 10 s and reports whether it
// came true.
func waitFor(cond func() bool) bool {
	for range 1000 {
		if cond() {
			return true
		}
		time.Sleep(10 * time.Millisecond)
	}
	return false
}

// TestGarbageClient connects with something that is not an hvdd daemon: the
// connection is refused and logged, and the group still forms.
func TestGarbageClient(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	store := rendezvous.NewMemory()
	var log1 logBuffer
	c1 := testConfig(store, 1, 2)
	c1.Logger = log1.logger()
	r1 := start(ctx, c1)
	addr, err := store.Wait(ctx, "test/job/tcp/addr/1")
	if err != nil {
		t.Fatal(err)
	}
	for _, junk := range []string{"GET / HTTP/1.1\r\nHost: x\r\n\r\n", "HVDT\x01\xff\xff", "HVDT\x09\x00\x00", ""} {
		c, err := net.Dial("tcp", string(addr["test/job/tcp/addr/1"]))
		if err != nil {
			t.Fatal(err)
		}
		c.Write([]byte(junk))
		if junk == "" {
			c.(*net.TCPConn).CloseWrite()
		}
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		// EOF, or a reset when the daemon closes with junk unread.
		if _, err := io.ReadAll(c); err != nil && !errors.Is(err, syscall.ECONNRESET) {
			t.Errorf("junk %q: connection not closed by the daemon: %v", junk, err)
		}
		c.Close()
	}
	r0 := <-start(ctx, testConfig(store, 0, 2))
	defer r0.close()
	res := <-r1
	defer res.close()
	if r0.err != nil || res.err != nil {
		t.Fatalf("group did not form after garbage: %v / %v", r0.err, res.err)
	}
	if !strings.Contains(log1.String(), "bad magic") {
		t.Errorf("refusal not logged; log:\n%s", log1.String())
	}
	errc := make(chan error, 1)
	go func() { errc <- r0.b.Barrier(ctx) }()
	if err := res.b.Barrier(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
}

func TestListenAddrs(t *testing.T) {
	store := rendezvous.NewMemory()
	for _, addr := range []string{":0", "0.0.0.0:0", "[::]:0", "no-port"} {
		c := testConfig(store, 0, 2)
		c.ListenAddr = addr
		if _, err := New(context.Background(), c); err == nil {
			t.Errorf("ListenAddr %q accepted", addr)
		}
	}
	c := testConfig(store, 0, 2)
	c.ListenAddr, c.AllowAll = "0.0.0.0:0", true
	if _, err := New(context.Background(), c); err == nil || !strings.Contains(err.Error(), "Advertise") {
		t.Errorf("AllowAll without Advertise: got %v, want an error asking for Advertise", err)
	}
	g := group(t, 2, nil)
	for _, b := range g {
		if !strings.HasPrefix(b.Addr(), "127.0.0.1:") {
			t.Errorf("rank %d listens on %s", b.Rank(), b.Addr())
		}
	}
}

func TestSecretRequired(t *testing.T) {
	c := testConfig(rendezvous.NewMemory(), 0, 1)
	c.Secret = nil
	if _, err := New(context.Background(), c); err == nil {
		t.Fatal("empty secret accepted without Insecure")
	}
	g := group(t, 3, func(c *Config) { c.Secret, c.Insecure = nil, true })
	ctx := context.Background()
	var wg sync.WaitGroup
	for _, b := range g {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := b.Barrier(ctx); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
}

func TestHandshakeRoundTrip(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	cli := shake{secret: []byte("k"), prefix: "p", size: 4, rank: 1, streams: 2, chunk: 100, small: 10}
	srv := cli
	srv.rank = 3
	errc := make(chan error, 1)
	go func() { errc <- cli.client(a, 3, 2) }()
	from, stream, err := srv.server(b)
	if err != nil || from != 1 || stream != 2 {
		t.Fatalf("server: from=%d stream=%d err=%v", from, stream, err)
	}
	if err := <-errc; err != nil {
		t.Fatalf("client: %v", err)
	}
}

// TestHandshakeWire plays the client's side by hand, as the protocol
// describes it, against the server: the challenge must be nonceS and
// MAC(secret, "hvdd/tcp server v1", hello, nonceS) and the server must take
// MAC(secret, "hvdd/tcp client v1", hello, nonceS) as the proof.
func TestHandshakeWire(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	srv := shake{secret: []byte("k"), prefix: "p", size: 4, rank: 3, streams: 2, chunk: 100, small: 10}
	type res struct {
		from, stream int
		err          error
	}
	done := make(chan res, 1)
	go func() {
		from, stream, err := srv.server(b)
		done <- res{from, stream, err}
	}()
	h := hello{Version: protoVersion, Size: 4, From: 1, To: 3, Stream: 2, Streams: 2, ChunkBytes: 100, Small: 10, Prefix: "p"}
	copy(h.Nonce[:], "a client nonce of thirty-two b..")
	hb := h.marshal()
	if err := writeFrame(a, kindHello, hb); err != nil {
		t.Fatal(err)
	}
	kind, body, err := readFrame(a)
	if err != nil || kind != kindChallenge || len(body) != nonceLen+macLen {
		t.Fatalf("challenge: kind %d, %d bytes, %v", kind, len(body), err)
	}
	nonceS := body[:nonceLen]
	if want := auth.Sign(srv.secret, []byte("hvdd/tcp server v1"), hb, nonceS); !bytes.Equal(body[nonceLen:], want) {
		t.Fatalf("challenge MAC %x, want %x", body[nonceLen:], want)
	}
	writeFrame(a, kindProof, auth.Sign(srv.secret, []byte("hvdd/tcp client v1"), hb, nonceS))
	if kind, _, err := readFrame(a); err != nil || kind != kindOK {
		t.Fatalf("verdict: kind %d, %v", kind, err)
	}
	if r := <-done; r.err != nil || r.from != 1 || r.stream != 2 {
		t.Fatalf("server: from=%d stream=%d err=%v", r.from, r.stream, r.err)
	}
}

// TestOldVersionRefused sends a version 1 hello (seven settings, before
// the compression joined them: a shorter body) and expects the refusal to
// name the versions, not a malformed hello.
func TestOldVersionRefused(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	srv := shake{secret: []byte("k"), prefix: "p", size: 4, rank: 3, streams: 2, chunk: 100, small: 10}
	errc := make(chan error, 1)
	go func() {
		_, _, err := srv.server(b)
		errc <- err
	}()
	h := hello{Version: protoVersion, Size: 4, From: 1, To: 3, Stream: 2, Streams: 2, ChunkBytes: 100, Small: 10, Prefix: "p"}
	body := h.marshal()
	body = append(body[:1+7*4:1+7*4], body[1+8*4:]...) // drop the eighth setting
	body[0] = 1
	if err := writeFrame(a, kindHello, body); err != nil {
		t.Fatal(err)
	}
	kind, reason, err := readFrame(a)
	if err != nil || kind != kindReject || !strings.Contains(string(reason), "protocol version 1, this daemon speaks 2") {
		t.Errorf("client got kind %d %q (%v), want a reject naming the versions", kind, reason, err)
	}
	if err := <-errc; !errors.Is(err, ErrHandshake) {
		t.Errorf("server: %v, want ErrHandshake", err)
	}
}

func FuzzHandshakeServer(f *testing.F) {
	cli := shake{secret: []byte("k"), prefix: "p", size: 4, rank: 1, streams: 2, chunk: 100, small: 10}
	h := hello{Version: protoVersion, Size: 4, From: 1, To: 3, Stream: 1, Streams: 2, ChunkBytes: 100, Small: 10, Prefix: "p"}
	var good bytes.Buffer
	writeFrame(&good, kindHello, h.marshal())
	f.Add(good.Bytes())
	writeFrame(&good, kindProof, make([]byte, macLen))
	f.Add(good.Bytes())
	f.Add([]byte("HVDT\x01\x00\x05hello"))
	f.Add([]byte{})
	srv := cli
	srv.rank = 3
	f.Fuzz(func(t *testing.T, data []byte) {
		a, b := net.Pipe()
		go func() {
			go io.Copy(io.Discard, a)
			a.Write(data)
			a.Close()
		}()
		b.SetDeadline(time.Now().Add(time.Second))
		if _, _, err := srv.server(b); err == nil {
			t.Fatalf("server accepted %q without the secret", data)
		}
		b.Close()
	})
}

func FuzzParse(f *testing.F) {
	h := hello{Version: protoVersion, Size: 4, From: 1, To: 3, Prefix: "job"}
	f.Add(h.marshal())
	f.Add(ctrlMsg{kind: ctrlBye, reason: byeLost, rank: 2}.marshal())
	f.Add(ctrlMsg{kind: ctrlBye, reason: byeDropped, rank: 1}.marshal())
	f.Add([]byte("HVDT\x04\x00\x00"))
	f.Fuzz(func(t *testing.T, data []byte) {
		if h, err := parseHello(data); err == nil {
			if got, err := parseHello(h.marshal()); err != nil || got != h {
				t.Fatalf("hello does not round-trip: %+v -> %+v (%v)", h, got, err)
			}
		}
		if m, err := parseCtrl(data); err == nil {
			if !bytes.Equal(m.marshal(), data) {
				t.Fatalf("control frame does not round-trip: %x -> %+v", data, m)
			}
		}
		if len(data) >= headerLen {
			parseHeader(data[:headerLen])
		}
	})
}
