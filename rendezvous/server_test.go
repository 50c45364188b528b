package rendezvous

import (
	"bytes"
	"context"
	"crypto/hmac"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

var testSecret = []byte("0123456789abcdef-test-secret")

// syncBuffer is a log sink safe for the server's concurrent handlers.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// startServer serves cfg (defaults: 127.0.0.1:0, testSecret) until the test
// ends and returns the server and its log.
func startServer(t *testing.T, cfg ServerConfig) (*Server, *syncBuffer) {
	t.Helper()
	if cfg.Addr == "" {
		cfg.Addr = "127.0.0.1:0"
	}
	if cfg.Secret == nil {
		cfg.Secret = testSecret
	}
	logs := &syncBuffer{}
	cfg.Logger = slog.New(slog.NewTextHandler(logs, nil))
	s, err := NewServer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; !errors.Is(err, context.Canceled) && !errors.Is(err, ErrClosed) {
			t.Errorf("Serve = %v", err)
		}
	})
	return s, logs
}

func newTestClient(t *testing.T, addr string, secret []byte) *Client {
	c := NewClient(addr, secret)
	t.Cleanup(func() { c.Close() })
	return c
}

// clientUnderTest is a Client whose server's Memory reports parked Waits.
type clientUnderTest struct {
	*Client
	mem *Memory
}

func (c clientUnderTest) onWaitBlocked(t *testing.T) <-chan struct{} { return observe(t, c.mem) }

func TestClient(t *testing.T) {
	testStore(t, func(t *testing.T) Store {
		s, _ := startServer(t, ServerConfig{})
		return clientUnderTest{newTestClient(t, s.Addr(), testSecret), s.Store()}
	})
}

func TestServerConfig(t *testing.T) {
	tests := []struct {
		cfg     ServerConfig
		wantErr string
	}{
		{ServerConfig{Addr: "127.0.0.1:0", Secret: testSecret}, ""},
		{ServerConfig{Addr: "localhost:0", Secret: testSecret}, ""},
		{ServerConfig{Addr: ":0", Secret: testSecret, AllowAll: true}, ""},
		{ServerConfig{Addr: "", Secret: testSecret}, "want host:port"},
		{ServerConfig{Addr: "127.0.0.1", Secret: testSecret}, "want host:port"},
		{ServerConfig{Addr: "127.0.0.1:http", Secret: testSecret}, "bad port"},
		{ServerConfig{Addr: ":0", Secret: testSecret}, "all interfaces"},
		{ServerConfig{Addr: "0.0.0.0:0", Secret: testSecret}, "all interfaces"},
		{ServerConfig{Addr: "[::]:0", Secret: testSecret}, "all interfaces"},
		{ServerConfig{Addr: "127.0.0.1:0"}, "no shared secret"},
		{ServerConfig{Addr: "127.0.0.1:0", Secret: []byte("short")}, "shorter than 16"},
		{ServerConfig{Addr: "127.0.0.1:0", Secret: testSecret, MaxKeys: -1}, "negative"},
	}
	for _, tc := range tests {
		err := tc.cfg.validate()
		if tc.wantErr == "" && err != nil || tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)) {
			t.Errorf("validate(%q, AllowAll=%v) = %v, want %q", tc.cfg.Addr, tc.cfg.AllowAll, err, tc.wantErr)
		}
	}
}

func TestWrongSecret(t *testing.T) {
	s, logs := startServer(t, ServerConfig{})
	c := newTestClient(t, s.Addr(), []byte("another-secret-of-enough-bytes"))
	err := c.Ping(context.Background())
	if !errors.Is(err, ErrAuth) || !strings.Contains(err.Error(), "secret differs") {
		t.Fatalf("Ping with wrong secret = %v, want ErrAuth saying the secret differs", err)
	}
	if err := c.Set(context.Background(), "k", []byte("v")); !errors.Is(err, ErrAuth) {
		t.Fatalf("Set with wrong secret = %v", err)
	}
	if s.Store().Len() != 0 {
		t.Fatal("refused Set reached the store")
	}
	log := logs.String()
	if !strings.Contains(log, "refused request") || !strings.Contains(log, "remote=127.0.0.1:") || !strings.Contains(log, "bad mac") {
		t.Errorf("refusal not logged with remote address and reason:\n%s", log)
	}
}

// rawRequest builds a request signed with secret at time ts and nonce,
// for the body signBody (sent body may differ).
func rawRequest(t *testing.T, addr, method, uri string, signBody, body []byte, ts time.Time, nonce string, secret []byte) *http.Request {
	t.Helper()
	req, err := http.NewRequest(method, "http://"+addr+uri, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	tss := strconv.FormatInt(ts.UnixMilli(), 10)
	req.Header.Set(headerTime, tss)
	req.Header.Set(headerNonce, nonce)
	req.Header.Set(headerMac, hex.EncodeToString(requestMAC(secret, method, uri, tss, nonce, signBody)))
	return req
}

type rawResponse struct {
	status int
	body   string
	signed bool // X-Hvdd-Mac verifies for the request's nonce
}

func send(t *testing.T, req *http.Request) rawResponse {
	t.Helper()
	resp, err := http.DefaultTransport.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	mac, _ := hex.DecodeString(resp.Header.Get(headerMac))
	signed := hmac.Equal(mac, responseMAC(testSecret, resp.StatusCode, req.Header.Get(headerNonce), b))
	return rawResponse{resp.StatusCode, string(b), signed}
}

func TestRawRequests(t *testing.T) {
	s, logs := startServer(t, ServerConfig{})
	addr := s.Addr()
	now := time.Now()
	nonce := func(i int) string { return "nonce-raw-test-" + strconv.Itoa(i) + "-0123456789" }
	v := []byte("value")

	replayed := rawRequest(t, addr, "PUT", "/kv/r", v, v, now, nonce(0), testSecret)
	replayedAgain := rawRequest(t, addr, "PUT", "/kv/r", v, v, now, nonce(0), testSecret)
	noHeaders, _ := http.NewRequest("GET", "http://"+addr+"/healthz", nil)
	badHex := rawRequest(t, addr, "GET", "/healthz", nil, nil, now, nonce(9), testSecret)
	badHex.Header.Set(headerMac, "zz")
	shortNonce := rawRequest(t, addr, "GET", "/healthz", nil, nil, now, "abc", testSecret)
	tamperedURI := rawRequest(t, addr, "GET", "/kv/a", nil, nil, now, nonce(10), testSecret)
	tamperedURI.URL.Path = "/kv/b"
	tamperedTime := rawRequest(t, addr, "GET", "/healthz", nil, nil, now, nonce(11), testSecret)
	tamperedTime.Header.Set(headerTime, strconv.FormatInt(now.UnixMilli()+1, 10))

	tests := []struct {
		name       string
		req        *http.Request
		wantStatus int
		wantBody   string
		wantSigned bool
	}{
		{"valid", rawRequest(t, addr, "GET", "/healthz", nil, nil, now, nonce(1), testSecret), 200, "ok", true},
		{"first of a replay", replayed, 204, "", true},
		{"replay", replayedAgain, 401, "replayed nonce", true},
		{"tampered body", rawRequest(t, addr, "PUT", "/kv/t", []byte("signed"), []byte("sent"), now, nonce(2), testSecret), 401, "bad mac", false},
		{"tampered URI", tamperedURI, 401, "bad mac", false},
		{"tampered time", tamperedTime, 401, "bad mac", false},
		{"wrong secret", rawRequest(t, addr, "GET", "/healthz", nil, nil, now, nonce(3), []byte("wrong-secret-wrong-secret")), 401, "bad mac", false},
		{"clock behind", rawRequest(t, addr, "GET", "/healthz", nil, nil, now.Add(-2*time.Minute), nonce(4), testSecret), 401, "clock skew", true},
		{"clock ahead", rawRequest(t, addr, "GET", "/healthz", nil, nil, now.Add(90*time.Second), nonce(5), testSecret), 401, "clock skew", true},
		{"missing headers", noHeaders, 401, "missing", false},
		{"bad mac hex", badHex, 401, "bad mac", false},
		{"short nonce", shortNonce, 401, "bad nonce", false},
		{"value too large", rawRequest(t, addr, "PUT", "/kv/big", make([]byte, MaxValueLen+1), make([]byte, MaxValueLen+1), now, nonce(6), testSecret), 413, "exceeds", true},
		{"key too long", rawRequest(t, addr, "GET", "/kv/"+strings.Repeat("k", MaxKeyLen+1), nil, nil, now, nonce(7), testSecret), 413, "exceeds", true},
		{"bad delta", rawRequest(t, addr, "POST", "/add/c", []byte("1.5"), []byte("1.5"), now, nonce(8), testSecret), 400, "not a decimal", true},
		{"wrong method", rawRequest(t, addr, "POST", "/kv/x", nil, nil, now, nonce(12), testSecret), 405, "not allowed", true},
		{"unknown path", rawRequest(t, addr, "GET", "/nope", nil, nil, now, nonce(13), testSecret), 404, "no such endpoint", true},
		{"wait without keys", rawRequest(t, addr, "GET", "/wait?timeout_ms=1", nil, nil, now, nonce(14), testSecret), 400, "names no key", true},
		{"wait timeout", rawRequest(t, addr, "GET", "/wait?key=zz&timeout_ms=1", nil, nil, now, nonce(15), testSecret), 408, `["zz"]`, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := send(t, tc.req)
			if got.status != tc.wantStatus || !strings.Contains(got.body, tc.wantBody) || got.signed != tc.wantSigned {
				t.Errorf("got %d %q signed=%v, want %d %q signed=%v", got.status, got.body, got.signed, tc.wantStatus, tc.wantBody, tc.wantSigned)
			}
		})
	}
	if _, err := s.Store().Get(context.Background(), "t"); !errors.Is(err, ErrNotFound) {
		t.Errorf("tampered Set reached the store: %v", err)
	}
	log := logs.String()
	for _, reason := range []string{"replayed nonce", "clock skew", "bad mac", "missing"} {
		if !strings.Contains(log, reason) {
			t.Errorf("log lacks refusal reason %q", reason)
		}
	}
}

func TestClientClockSkew(t *testing.T) {
	s, _ := startServer(t, ServerConfig{})
	c := newTestClient(t, s.Addr(), testSecret)
	c.now = func() time.Time { return time.Now().Add(-5 * time.Minute) }
	err := c.Ping(context.Background())
	if !errors.Is(err, ErrAuth) || !strings.Contains(err.Error(), "clock skew") {
		t.Fatalf("Ping from a skewed clock = %v, want ErrAuth naming clock skew", err)
	}
}

func TestRogueServer(t *testing.T) {
	tests := []struct {
		name    string
		handler http.HandlerFunc
	}{
		{"unsigned", func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "evil") }},
		{"other secret", func(w http.ResponseWriter, r *http.Request) {
			body := []byte("evil")
			mac := responseMAC([]byte("rogue-secret-rogue-secret"), 200, r.Header.Get(headerNonce), body)
			w.Header().Set(headerMac, hex.EncodeToString(mac))
			w.Write(body)
		}},
		{"replayed signature", func(w http.ResponseWriter, r *http.Request) {
			// A genuine signature for another request's nonce.
			body := []byte("evil")
			w.Header().Set(headerMac, hex.EncodeToString(responseMAC(testSecret, 200, "some-other-nonce-0000", body)))
			w.Write(body)
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rogue := httptest.NewServer(tc.handler)
			defer rogue.Close()
			c := newTestClient(t, strings.TrimPrefix(rogue.URL, "http://"), testSecret)
			v, err := c.Get(context.Background(), "k")
			if !errors.Is(err, ErrAuth) || !strings.Contains(err.Error(), "not signed with our secret") {
				t.Fatalf("Get from rogue server = %q, %v; want ErrAuth", v, err)
			}
		})
	}
}

func TestServerLimits(t *testing.T) {
	s, _ := startServer(t, ServerConfig{MaxKeys: 3})
	c := newTestClient(t, s.Addr(), testSecret)
	ctx := context.Background()
	for _, k := range []string{"a", "b", "c"} {
		if err := c.Set(ctx, k, nil); err != nil {
			t.Fatal(err)
		}
	}
	err := c.Set(ctx, "d", nil)
	if !errors.Is(err, ErrFull) || !strings.Contains(err.Error(), "store holds 3 keys") {
		t.Fatalf("Set beyond MaxKeys = %v, want ErrFull with the server's reason", err)
	}
	if _, err := c.Add(ctx, "d", 1); !errors.Is(err, ErrFull) {
		t.Fatalf("Add beyond MaxKeys = %v, want ErrFull", err)
	}
	big := make([]byte, MaxValueLen)
	big[len(big)-1] = 7
	if err := c.Set(ctx, "a", big); err != nil {
		t.Fatalf("Set of MaxValueLen bytes: %v", err)
	}
	got, err := c.Get(ctx, "a")
	if err != nil || !bytes.Equal(got, big) {
		t.Fatalf("Get of MaxValueLen bytes: %d bytes, %v", len(got), err)
	}
}

func TestLoopbackAlias(t *testing.T) {
	s, _ := startServer(t, ServerConfig{Addr: "127.0.0.2:0"})
	host, port, _ := net.SplitHostPort(s.Addr())
	if host != "127.0.0.2" {
		t.Fatalf("bound to %s", s.Addr())
	}
	ctx := context.Background()
	c := newTestClient(t, s.Addr(), testSecret)
	if err := c.Set(ctx, "host", []byte("node1")); err != nil {
		t.Fatal(err)
	}
	if got := mustGet(t, s.Store(), "host"); got != "node1" {
		t.Fatalf("server store holds %q", got)
	}
	// Nothing listens on the same port at 127.0.0.1: the client keeps
	// retrying the refused connection until its deadline (long enough for
	// a first attempt on a loaded machine).
	other := newTestClient(t, net.JoinHostPort("127.0.0.1", port), testSecret)
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	if err := other.Ping(ctx); !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "refused") {
		t.Fatalf("Ping at 127.0.0.1 = %v, want deadline after refused connections", err)
	}
}

func TestClientWaitsForServerStart(t *testing.T) {
	// Pick a free port, then start the server on it only after a client
	// has started retrying.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()

	c := newTestClient(t, addr, testSecret)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	pinged := make(chan error, 1)
	go func() {
		_, err := c.Wait(ctx, "registered")
		pinged <- err
	}()
	s, _ := startServer(t, ServerConfig{Addr: addr})
	if err := s.Store().Set(ctx, "registered", []byte("yes")); err != nil {
		t.Fatal(err)
	}
	if err := <-pinged; err != nil {
		t.Fatalf("Wait across server start = %v", err)
	}
}

func TestCloseUnblocksWait(t *testing.T) {
	s, err := NewServer(ServerConfig{Addr: "127.0.0.1:0", Secret: testSecret})
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- s.Serve(context.Background()) }()

	blocked := observe(t, s.Store())
	c := newTestClient(t, s.Addr(), testSecret)
	remote := goWait(context.Background(), c, "never")
	local := goWait(context.Background(), s.Store(), "never")
	parked(t, blocked)
	parked(t, blocked)
	if err := s.Close(); err != nil {
		t.Fatalf("Close = %v", err)
	}
	if r := <-remote; !errors.Is(r.err, ErrClosed) {
		t.Errorf("remote Wait after Close = %v, want ErrClosed", r.err)
	}
	if r := <-local; !errors.Is(r.err, ErrClosed) {
		t.Errorf("local Wait after Close = %v, want ErrClosed", r.err)
	}
	if err := <-served; !errors.Is(err, ErrClosed) {
		t.Errorf("Serve after Close = %v, want ErrClosed", err)
	}
	if err := s.Close(); err != nil {
		t.Errorf("second Close = %v", err)
	}
}

func TestCloseBeforeServe(t *testing.T) {
	s, err := NewServer(ServerConfig{Addr: "127.0.0.1:0", Secret: testSecret})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Serve(context.Background()); !errors.Is(err, ErrClosed) {
		t.Fatalf("Serve after Close = %v, want ErrClosed", err)
	}
	if err := s.Serve(context.Background()); err == nil || !strings.Contains(err.Error(), "twice") {
		t.Fatalf("second Serve = %v", err)
	}
}

func TestWaitRepolls(t *testing.T) {
	s, _ := startServer(t, ServerConfig{})
	c := newTestClient(t, s.Addr(), testSecret)
	c.poll = 5 * time.Millisecond
	blocked := observe(t, s.Store())
	mustSet(t, s.Store(), "here", "h")

	// After a 408 the client knows which keys are missing.
	ctx, cancel := context.WithCancel(context.Background())
	res := goWait(ctx, c, "here", "never")
	parked(t, blocked) // first poll
	parked(t, blocked) // a later poll, after at least one 408
	cancel()
	r := <-res
	if !errors.Is(r.err, context.Canceled) || !strings.Contains(r.err.Error(), `missing ["never"]`) {
		t.Fatalf("cancelled Wait = %v, want Canceled naming only the missing key", r.err)
	}

	res = goWait(context.Background(), c, "here", "late")
	parked(t, blocked)
	parked(t, blocked)
	mustSet(t, s.Store(), "late", "v")
	if r := <-res; r.err != nil || string(r.vals["late"]) != "v" || string(r.vals["here"]) != "h" {
		t.Fatalf("Wait = %q, %v", r.vals, r.err)
	}
}

func TestWaitBatches(t *testing.T) {
	s, _ := startServer(t, ServerConfig{})
	c := newTestClient(t, s.Addr(), testSecret)
	ctx := context.Background()
	var keys []string
	for i := range 100 {
		k := strconv.Itoa(i) + "/" + strings.Repeat("é", 200) // 400+ bytes, 1200+ escaped
		keys = append(keys, k)
		mustSet(t, s.Store(), k, strconv.Itoa(i))
	}
	if n := len(waitBatches(keys)); n < 2 {
		t.Fatalf("%d batches; the test needs several", n)
	}
	for _, b := range waitBatches(keys) {
		if l := len(waitURI(b, MaxWaitPoll)); l > maxRequestURI {
			t.Fatalf("batch URI of %d bytes exceeds %d", l, maxRequestURI)
		}
	}
	got, err := c.Wait(ctx, keys...)
	if err != nil {
		t.Fatal(err)
	}
	for i, k := range keys {
		if string(got[k]) != strconv.Itoa(i) {
			t.Fatalf("Wait[%d] = %q", i, got[k])
		}
	}
}

func TestServeCancel(t *testing.T) {
	s, err := NewServer(ServerConfig{Addr: "127.0.0.1:0", Secret: testSecret})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- s.Serve(ctx) }()
	c := newTestClient(t, s.Addr(), testSecret)
	if err := c.Ping(context.Background()); err != nil {
		t.Fatal(err)
	}
	cancel()
	if err := <-served; !errors.Is(err, context.Canceled) {
		t.Fatalf("Serve after cancel = %v, want context.Canceled", err)
	}
	if _, err := s.Store().Get(context.Background(), "k"); !errors.Is(err, ErrClosed) {
		t.Fatalf("store after cancel = %v, want ErrClosed", err)
	}
}

// TestServerIntercept: the Intercept hook sees each Set, Add and Delete
// before the store applies it (an Add as its decimal delta), a refusal
// fails the request unapplied with the error's category, and reads pass by
// it.
func TestServerIntercept(t *testing.T) {
	type seen struct{ op, key, value string }
	var mu sync.Mutex
	var got []seen
	s, _ := startServer(t, ServerConfig{Intercept: func(op, key string, value []byte) error {
		mu.Lock()
		got = append(got, seen{op, key, string(value)})
		mu.Unlock()
		if key == "refused" {
			return ErrClosed
		}
		return nil
	}})
	c := newTestClient(t, s.Addr(), testSecret)
	ctx := context.Background()
	if err := c.Set(ctx, "a", []byte("v")); err != nil {
		t.Fatal(err)
	}
	if n, err := c.Add(ctx, "n", 3); err != nil || n != 3 {
		t.Fatalf("Add = %d, %v; want 3", n, err)
	}
	if err := c.Delete(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	if err := c.Set(ctx, "refused", []byte("v")); !errors.Is(err, ErrClosed) {
		t.Errorf("refused Set = %v, want ErrClosed", err)
	}
	if _, err := c.Add(ctx, "refused", 1); !errors.Is(err, ErrClosed) {
		t.Errorf("refused Add = %v, want ErrClosed", err)
	}
	if _, err := s.Store().Get(ctx, "refused"); !errors.Is(err, ErrNotFound) {
		t.Errorf("the refused requests were applied: Get = %v, want ErrNotFound", err)
	}
	if _, err := c.Get(ctx, "n"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Wait(ctx, "n"); err != nil {
		t.Fatal(err)
	}
	want := []seen{{"set", "a", "v"}, {"add", "n", "3"}, {"delete", "a", ""}, {"set", "refused", "v"}, {"add", "refused", "1"}}
	mu.Lock()
	defer mu.Unlock()
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("Intercept saw %v, want %v", got, want)
	}
}
