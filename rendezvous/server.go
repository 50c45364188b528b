package rendezvous

import (
	"context"
	"crypto/hmac"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/hvdd/hvdd/auth"
)

// ServerConfig configures a Server. Fields left zero take the documented
// default; NewServer rejects a configuration it cannot serve safely.
type ServerConfig struct {
	// Addr is the "host:port" to listen on; port 0 picks a free port (see
	// Server.Addr). The host must be explicit: "", ":port", "0.0.0.0:port"
	// and "[::]:port" listen on every interface and are refused unless
	// AllowAll is set.
	Addr string

	// Secret is the job's shared secret (auth.LoadSecret, auth.NewSecret),
	// at least auth.MinSecretLen bytes. Every request and response is
	// authenticated with it. Required.
	Secret []byte

	// Logger receives the server's log lines, among them one per refused
	// request naming the remote address and the reason. Nil discards them.
	Logger *slog.Logger

	// AllowAll permits an Addr that listens on every interface.
	AllowAll bool

	// MaxKeys bounds the number of keys the store holds; 0 means
	// DefaultMaxKeys.
	MaxKeys int

	// Intercept, when set, sees every authenticated request that changes
	// the store before the store applies it: op is "set", "add" or
	// "delete", value a Set's value or an Add's decimal delta (nil for a
	// Delete). It runs on the request's goroutine, concurrently with other
	// requests, and may block: the request waits (its client sees a slow
	// store). A non-nil error fails the request unapplied, answered with
	// the status of the error's category (500 for none; wrap ErrClosed for
	// 503, a store shutting down). A seam for tests, which hold or drop
	// one step of a protocol over the store; nil in real runs.
	Intercept func(op, key string, value []byte) error
}

// validate reports the first problem with c.
func (c *ServerConfig) validate() error {
	host, port, err := net.SplitHostPort(c.Addr)
	if err != nil {
		return fmt.Errorf("rendezvous: address %q: want host:port: %w", c.Addr, err)
	}
	if _, err := strconv.ParseUint(port, 10, 16); err != nil {
		return fmt.Errorf("rendezvous: address %q: bad port %q", c.Addr, port)
	}
	if ip := net.ParseIP(host); (host == "" || (ip != nil && ip.IsUnspecified())) && !c.AllowAll {
		return fmt.Errorf("rendezvous: address %q listens on all interfaces; name a host (e.g. this node's address on the job network) or set AllowAll", c.Addr)
	}
	switch {
	case len(c.Secret) == 0:
		return auth.ErrNoSecret
	case len(c.Secret) < auth.MinSecretLen:
		return fmt.Errorf("rendezvous: secret of %d bytes is shorter than %d", len(c.Secret), auth.MinSecretLen)
	case c.MaxKeys < 0:
		return fmt.Errorf("rendezvous: MaxKeys %d is negative", c.MaxKeys)
	}
	return nil
}

// Server serves a Memory store over authenticated HTTP (see the package
// documentation for the protocol), with fasthttp. Create it with NewServer,
// which binds the address, then call Serve.
type Server struct {
	secret []byte
	log    *slog.Logger
	mem    *Memory
	ln     net.Listener
	srv    *fasthttp.Server
	quit   chan struct{} // closed by Close
	// intercept is ServerConfig.Intercept.
	intercept func(op, key string, value []byte) error

	// now is the server's clock; tests replace it.
	now func() time.Time

	closeOnce sync.Once
	closeErr  error

	// mu guards the fields that follow.
	mu      sync.Mutex
	served  bool
	replay  auth.ReplayCache
	logged  int       // refusals logged in the current second
	dropped int       // refusals not logged in the current second
	logSec  time.Time // start of that second
}

// maxRefusalLogs is how many refused requests are logged per second; the
// rest are counted and reported in one line, so that a flood of bad requests
// cannot flood the log.
const maxRefusalLogs = 10

// NewServer validates cfg and binds its address. The server answers nothing
// until Serve is called.
func NewServer(cfg ServerConfig) (*Server, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	log = log.With("component", "rendezvous")
	ln, err := net.Listen("tcp", cfg.Addr)
	if err != nil {
		return nil, fmt.Errorf("rendezvous: listen: %w", err)
	}
	s := &Server{
		secret: append([]byte{}, cfg.Secret...),
		log:    log,
		mem:    newMemory(cfg.MaxKeys),
		ln:     ln,
		quit:   make(chan struct{}),
		now:    time.Now,
		replay: newReplayCache(),

		intercept: cfg.Intercept,
	}
	s.srv = &fasthttp.Server{
		Handler:              s.handle,
		Name:                 "hvdd-rendezvous",
		ReadBufferSize:       2 * maxRequestURI,
		MaxRequestBodySize:   MaxValueLen + 64<<10, // so the handler, not fasthttp, refuses (signed) a value just over the limit
		ReadTimeout:          MaxClockSkew,
		WriteTimeout:         MaxClockSkew,
		IdleTimeout:          2 * time.Minute,
		NoDefaultDate:        true,
		NoDefaultContentType: true,
		CloseOnShutdown:      true,
		Logger:               fasthttpLogger{log},
	}
	return s, nil
}

// fasthttpLogger routes fasthttp's own messages to slog.
type fasthttpLogger struct{ log *slog.Logger }

func (l fasthttpLogger) Printf(format string, args ...any) {
	l.log.Debug(fmt.Sprintf(format, args...))
}

// Addr returns the bound address, "host:port", with the port chosen when
// ServerConfig.Addr asked for port 0.
func (s *Server) Addr() string { return s.ln.Addr().String() }

// Store returns the server's own store. Node 0's daemon uses it directly
// rather than through a Client to itself. It is closed by Close.
func (s *Server) Store() *Memory { return s.mem }

// Serve answers requests until ctx is done or Close is called, and then
// closes the server. It always returns a non-nil error: ctx.Err() after
// cancellation, ErrClosed after Close, or the listener's failure.
func (s *Server) Serve(ctx context.Context) error {
	s.mu.Lock()
	if s.served {
		s.mu.Unlock()
		return errors.New("rendezvous: Serve called twice")
	}
	s.served = true
	s.mu.Unlock()

	go func() {
		select {
		case <-ctx.Done():
			s.Close()
		case <-s.quit:
		}
	}()
	s.log.Info("rendezvous listening", "addr", s.Addr())
	err := s.srv.Serve(s.ln)
	select {
	case <-s.quit:
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return ErrClosed
	default:
	}
	s.Close()
	if err == nil {
		err = errors.New("listener closed")
	}
	return fmt.Errorf("rendezvous: serve: %w", err)
}

// Close stops the server now: blocked Waits (local ones on Store and remote
// long polls) return ErrClosed, the listener and idle connections are
// closed, and in-flight requests get up to five seconds to finish. It is
// idempotent and returns the first call's result.
func (s *Server) Close() error {
	s.closeOnce.Do(func() {
		close(s.quit)
		s.mem.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		err := s.srv.ShutdownWithContext(ctx)
		// Shutdown only closes listeners Serve has seen; close ours in
		// case Serve never ran.
		if lerr := s.ln.Close(); err == nil && lerr != nil && !errors.Is(lerr, net.ErrClosed) {
			err = lerr
		}
		if err != nil {
			s.closeErr = fmt.Errorf("rendezvous: close: %w", err)
		}
	})
	return s.closeErr
}

// handle is the fasthttp handler: authenticate, parse, execute, sign.
func (s *Server) handle(ctx *fasthttp.RequestCtx) {
	method := string(ctx.Method())
	uri := string(ctx.RequestURI())
	body := ctx.PostBody()

	nonce, status, reason := s.authenticate(method, uri, body, &ctx.Request.Header)
	if reason != "" {
		s.refused(ctx.RemoteAddr(), method, uri, reason)
		// Sign only refusals of requests that did carry a valid MAC (clock
		// skew, replay): their client can then trust the reason. A request
		// without a valid MAC gets no signature, so the server never signs
		// what an outsider chose.
		if nonce == "" {
			ctx.SetStatusCode(status)
			ctx.SetContentType("text/plain; charset=utf-8")
			ctx.SetBodyString(reason)
			return
		}
		s.respond(ctx, status, nonce, "text/plain; charset=utf-8", []byte(reason))
		return
	}

	req, err := parseRequest(method, uri, body)
	if err == nil {
		err = s.intercepted(req, body)
	}
	if err != nil {
		s.respondError(ctx, nonce, err)
		return
	}
	switch req.op {
	case opHealth:
		s.respond(ctx, http.StatusOK, nonce, "text/plain; charset=utf-8", []byte("ok"))
	case opGet:
		v, err := s.mem.Get(context.Background(), req.key)
		if err != nil {
			s.respondError(ctx, nonce, err)
			return
		}
		s.respond(ctx, http.StatusOK, nonce, "application/octet-stream", v)
	case opSet:
		if err := s.mem.Set(context.Background(), req.key, body); err != nil {
			s.respondError(ctx, nonce, err)
			return
		}
		s.respond(ctx, http.StatusNoContent, nonce, "", nil)
	case opDelete:
		if err := s.mem.Delete(context.Background(), req.key); err != nil {
			s.respondError(ctx, nonce, err)
			return
		}
		s.respond(ctx, http.StatusNoContent, nonce, "", nil)
	case opAdd:
		n, err := s.mem.Add(context.Background(), req.key, req.delta)
		if err != nil {
			s.respondError(ctx, nonce, err)
			return
		}
		s.respond(ctx, http.StatusOK, nonce, "text/plain; charset=utf-8", strconv.AppendInt(nil, n, 10))
	case opWait:
		s.wait(ctx, nonce, req)
	}
}

// intercepted passes a request that changes the store to the Intercept
// hook, if there is one, and returns its verdict.
func (s *Server) intercepted(req request, body []byte) error {
	if s.intercept == nil {
		return nil
	}
	var op string
	switch req.op {
	case opSet:
		op = "set"
	case opAdd:
		op = "add"
		body = strconv.AppendInt(nil, req.delta, 10)
	case opDelete:
		op, body = "delete", nil
	default:
		return nil
	}
	if err := s.intercept(op, req.key, body); err != nil {
		return fmt.Errorf("%s %q refused by the server's Intercept hook: %w", op, req.key, err)
	}
	return nil
}

// wait answers a /wait long poll: 200 with a JSON object of base64 values
// once every key exists, or 408 with a JSON array of the missing keys when
// the poll's timeout passes first. A client that disconnects early leaves
// the handler parked until that timeout (at most MaxWaitPoll) or Close.
func (s *Server) wait(ctx *fasthttp.RequestCtx, nonce string, req request) {
	wctx, cancel := context.WithTimeout(context.Background(), req.timeout)
	defer cancel()
	vals, err := s.mem.Wait(wctx, req.keys...)
	if errors.Is(err, context.DeadlineExceeded) {
		var missing []string
		for _, k := range req.keys {
			if _, err := s.mem.Get(context.Background(), k); err != nil {
				missing = append(missing, k)
			}
		}
		b, _ := json.Marshal(missing)
		s.respond(ctx, http.StatusRequestTimeout, nonce, "application/json", b)
		return
	}
	if err != nil {
		s.respondError(ctx, nonce, err)
		return
	}
	total := 0
	for _, v := range vals {
		total += len(v)
	}
	if total > maxWaitResponse {
		s.respondError(ctx, nonce, fmt.Errorf("wait: %d keys hold %d bytes, more than %d in one response; wait for fewer keys: %w",
			len(vals), total, maxWaitResponse, ErrTooLarge))
		return
	}
	b, err := json.Marshal(vals)
	if err != nil {
		s.respondError(ctx, nonce, err)
		return
	}
	s.respond(ctx, http.StatusOK, nonce, "application/json", b)
}

// authenticate checks the request's time, nonce and MAC. On success it
// returns the nonce and an empty reason. On failure it returns the status
// and reason to answer with, and the nonce only if the MAC was valid.
func (s *Server) authenticate(method, uri string, body []byte, h *fasthttp.RequestHeader) (nonce string, status int, reason string) {
	ts := string(h.Peek(headerTime))
	nonce = string(h.Peek(headerNonce))
	macHex := h.Peek(headerMac)
	switch {
	case ts == "" || nonce == "" || len(macHex) == 0:
		return "", http.StatusUnauthorized, "missing " + headerTime + ", " + headerNonce + " or " + headerMac + " header"
	case len(nonce) < minNonceLen || len(nonce) > maxNonceLen:
		return "", http.StatusUnauthorized, "bad nonce length"
	}
	mac := make([]byte, hex.DecodedLen(len(macHex)))
	if n, err := hex.Decode(mac, macHex); err != nil || !hmac.Equal(mac[:n], requestMAC(s.secret, method, uri, ts, nonce, body)) {
		return "", http.StatusUnauthorized, "bad mac: wrong secret or tampered request"
	}
	now := s.now()
	ms, err := strconv.ParseInt(ts, 10, 64)
	if err != nil {
		return nonce, http.StatusUnauthorized, "bad " + headerTime
	}
	if skew := time.Duration(now.UnixMilli()-ms) * time.Millisecond; skew > MaxClockSkew || skew < -MaxClockSkew {
		return nonce, http.StatusUnauthorized, fmt.Sprintf("clock skew: request time is %v from server time, more than %v", -skew, MaxClockSkew)
	}
	s.mu.Lock()
	ok, full := s.replay.Add(nonce, now)
	s.mu.Unlock()
	switch {
	case full:
		return nonce, http.StatusTooManyRequests, "too many requests in the replay window; retry"
	case !ok:
		return nonce, http.StatusUnauthorized, "replayed nonce"
	}
	return nonce, 0, ""
}

// refused logs a refused request, at most maxRefusalLogs per second.
func (s *Server) refused(remote net.Addr, method, uri, reason string) {
	if len(uri) > 128 {
		uri = uri[:128] + "..."
	}
	now := s.now()
	s.mu.Lock()
	if now.Sub(s.logSec) >= time.Second {
		if s.dropped > 0 {
			s.log.Warn("rendezvous refused more requests", "count", s.dropped)
		}
		s.logSec, s.logged, s.dropped = now, 0, 0
	}
	log := s.logged < maxRefusalLogs
	if log {
		s.logged++
	} else {
		s.dropped++
	}
	s.mu.Unlock()
	if log {
		s.log.Warn("rendezvous refused request", "remote", remote.String(), "method", method, "uri", uri, "reason", reason)
	}
}

// respondError answers with err's status and message.
func (s *Server) respondError(ctx *fasthttp.RequestCtx, nonce string, err error) {
	s.respond(ctx, statusOf(err), nonce, "text/plain; charset=utf-8", []byte(err.Error()))
}

// respond writes a signed response.
func (s *Server) respond(ctx *fasthttp.RequestCtx, status int, nonce, contentType string, body []byte) {
	ctx.SetStatusCode(status)
	if contentType != "" {
		ctx.SetContentType(contentType)
	}
	ctx.SetBody(body)
	ctx.Response.Header.Set(headerMac, hex.EncodeToString(responseMAC(s.secret, status, nonce, body)))
}
