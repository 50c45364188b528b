package rendezvous

import (
	"bytes"
	"context"
	"crypto/hmac"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/hvdd/hvdd/auth"
)

// Client is a Store served by a remote Server. It is safe for concurrent use.
//
// Every request is signed with the shared secret and every response is
// checked against it, so a Client never acts on an answer from a server
// that does not hold the secret. While the server is not yet listening
// (connection refused), calls retry with backoff until their ctx is done;
// idempotent calls (all but Add) also retry other transport failures.
//
// The client side uses net/http rather than fasthttp: fasthttp's client has
// no context support, and cancelling a long-poll Wait needs it.
type Client struct {
	addr   string
	secret []byte
	hc     *http.Client
	tr     *http.Transport

	// now is the client's clock and poll the length of one /wait long poll;
	// tests replace them.
	now  func() time.Time
	poll time.Duration
}

var _ Store = (*Client)(nil)

// NewClient returns a Client for the server at addr ("host:port"), signing
// with secret. It does not connect; the first call does, and a secret
// shorter than auth.MinSecretLen makes every call fail.
func NewClient(addr string, secret []byte) *Client {
	tr := &http.Transport{
		Proxy: nil, // never route the rendezvous through $HTTP_PROXY
		DialContext: (&net.Dialer{
			Timeout:   10 * time.Second,
			KeepAlive: 30 * time.Second,
		}).DialContext,
		MaxIdleConnsPerHost: 16,
		IdleConnTimeout:     30 * time.Second, // below the server's IdleTimeout
		DisableCompression:  true,
	}
	return &Client{
		addr:   addr,
		secret: append([]byte{}, secret...),
		tr:     tr,
		hc:     &http.Client{Transport: tr},
		now:    time.Now,
		poll:   DefaultWaitPoll,
	}
}

// Addr returns the server address the client talks to.
func (c *Client) Addr() string { return c.addr }

// Close closes the client's idle connections. Calls after Close still work
// (they open new connections).
func (c *Client) Close() error {
	c.tr.CloseIdleConnections()
	return nil
}

// Ping checks that the server is up and shares the client's secret, retrying
// while the server starts, bounded by ctx. A secret mismatch is reported at
// once as an error wrapping ErrAuth.
func (c *Client) Ping(ctx context.Context) error {
	status, body, err := c.do(ctx, http.MethodGet, "/healthz", nil, true)
	if err != nil {
		return err
	}
	return c.expect(http.MethodGet, "/healthz", status, body, http.StatusOK)
}

// Set implements Store.
func (c *Client) Set(ctx context.Context, key string, value []byte) error {
	if err := checkKey(key); err != nil {
		return err
	}
	if err := checkValue(key, value); err != nil {
		return err
	}
	uri := kvURI(key)
	status, body, err := c.do(ctx, http.MethodPut, uri, value, true)
	if err != nil {
		return err
	}
	return c.expect(http.MethodPut, uri, status, body, http.StatusNoContent)
}

// Get implements Store.
func (c *Client) Get(ctx context.Context, key string) ([]byte, error) {
	if err := checkKey(key); err != nil {
		return nil, err
	}
	uri := kvURI(key)
	status, body, err := c.do(ctx, http.MethodGet, uri, nil, true)
	if err != nil {
		return nil, err
	}
	if err := c.expect(http.MethodGet, uri, status, body, http.StatusOK); err != nil {
		return nil, err
	}
	return body, nil
}

// Delete implements Store.
func (c *Client) Delete(ctx context.Context, key string) error {
	if err := checkKey(key); err != nil {
		return err
	}
	uri := kvURI(key)
	status, body, err := c.do(ctx, http.MethodDelete, uri, nil, true)
	if err != nil {
		return err
	}
	return c.expect(http.MethodDelete, uri, status, body, http.StatusNoContent)
}

// Add implements Store. It is not retried once the request may have reached
// the server, so a broken connection can leave the caller unsure whether the
// add happened; the error then wraps the transport error.
func (c *Client) Add(ctx context.Context, key string, delta int64) (int64, error) {
	if err := checkKey(key); err != nil {
		return 0, err
	}
	uri := addURI(key)
	status, body, err := c.do(ctx, http.MethodPost, uri, strconv.AppendInt(nil, delta, 10), false)
	if err != nil {
		return 0, err
	}
	if err := c.expect(http.MethodPost, uri, status, body, http.StatusOK); err != nil {
		return 0, err
	}
	n, err := strconv.ParseInt(string(body), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("rendezvous: POST %s at %s: bad counter %.32q in response", uri, c.addr, body)
	}
	return n, nil
}

// Wait implements Store with long polls of at most DefaultWaitPoll each. When
// ctx is done the error names the keys missing at the last poll (all of them
// if no poll has ended). Key
// lists too long for one request URI are waited for in batches, one after
// the other; the values of an earlier batch are then read when that batch
// completes, not when the last one does.
func (c *Client) Wait(ctx context.Context, keys ...string) (map[string][]byte, error) {
	for _, k := range keys {
		if err := checkKey(k); err != nil {
			return nil, err
		}
	}
	out := make(map[string][]byte, len(keys))
	for _, batch := range waitBatches(keys) {
		if err := c.waitBatch(ctx, batch, out); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// waitBatch polls /wait for keys until they all exist or ctx is done, and
// adds their values to out.
func (c *Client) waitBatch(ctx context.Context, keys []string, out map[string][]byte) error {
	missing := keys
	for {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("rendezvous: at %s: %w", c.addr, waitError(missing, err))
		}
		poll := c.poll
		if dl, ok := ctx.Deadline(); ok {
			// End the poll a little before the deadline, so that the
			// server's 408 tells which keys are still missing.
			left := time.Until(dl)
			poll = max(0, min(poll, left-min(left/10, 100*time.Millisecond)))
		}
		uri := waitURI(keys, poll)
		status, body, err := c.do(ctx, http.MethodGet, uri, nil, true)
		if err != nil {
			if ctx.Err() != nil {
				return fmt.Errorf("rendezvous: at %s: %w", c.addr, waitError(missing, ctx.Err()))
			}
			return err
		}
		switch status {
		case http.StatusOK:
			var vals map[string][]byte
			if err := json.Unmarshal(body, &vals); err != nil {
				return fmt.Errorf("rendezvous: GET /wait at %s: bad response: %w", c.addr, err)
			}
			for _, k := range keys {
				v, ok := vals[k]
				if !ok {
					return fmt.Errorf("rendezvous: GET /wait at %s: response lacks key %q", c.addr, k)
				}
				if v == nil {
					v = []byte{}
				}
				out[k] = v
			}
			return nil
		case http.StatusRequestTimeout:
			var m []string
			if json.Unmarshal(body, &m) == nil && len(m) > 0 {
				missing = m
			}
		default:
			return c.expect(http.MethodGet, "/wait", status, body, http.StatusOK)
		}
	}
}

// expect turns a status other than want into an error wrapping the
// matching sentinel and quoting the server's message.
func (c *Client) expect(method, uri string, status int, body []byte, want int) error {
	if status == want {
		return nil
	}
	if len(body) > 512 {
		body = append(body[:512:512], "..."...)
	}
	msg := strings.TrimSpace(string(body))
	if sentinel := errorOf(status); sentinel != nil {
		return fmt.Errorf("rendezvous: %s %s at %s: %w", method, uri, c.addr, &serverError{status, msg, sentinel})
	}
	return fmt.Errorf("rendezvous: %s %s at %s: unexpected status %d: %s", method, uri, c.addr, status, msg)
}

// serverError is an error the server reported. Its text is the server's
// message; it unwraps to the sentinel of its status.
type serverError struct {
	status   int
	msg      string
	sentinel error
}

func (e *serverError) Error() string {
	if e.msg == "" {
		return e.sentinel.Error()
	}
	return "server says: " + e.msg
}

func (e *serverError) Unwrap() error { return e.sentinel }

// do sends one request, retrying as documented on Client, and returns the
// authenticated response. idempotent says the request may be resent after a
// transport failure that might have reached the server.
func (c *Client) do(ctx context.Context, method, uri string, body []byte, idempotent bool) (int, []byte, error) {
	if len(c.secret) < auth.MinSecretLen {
		return 0, nil, fmt.Errorf("rendezvous: client secret of %d bytes is shorter than %d: %w", len(c.secret), auth.MinSecretLen, auth.ErrNoSecret)
	}
	backoff := 10 * time.Millisecond
	for {
		status, rbody, err := c.once(ctx, method, uri, body)
		var retry bool
		switch {
		case err == nil && status == http.StatusTooManyRequests:
			retry = true // refused before it ran, so safe even for Add
		case err == nil:
			return status, rbody, nil
		case ctx.Err() != nil:
			return 0, nil, fmt.Errorf("rendezvous: %s %s at %s: %w", method, uri, c.addr, ctx.Err())
		case errors.Is(err, ErrAuth):
			return 0, nil, err
		case isDialError(err):
			retry = true
		default:
			retry = idempotent
		}
		if !retry {
			return 0, nil, fmt.Errorf("rendezvous: %s %s at %s: %w", method, uri, c.addr, err)
		}
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			if err == nil {
				err = ctx.Err()
			}
			return 0, nil, fmt.Errorf("rendezvous: %s %s at %s: %w (%w)", method, uri, c.addr, ctx.Err(), err)
		case <-t.C:
		}
		backoff = min(2*backoff, time.Second)
	}
}

// isDialError reports whether err is a failure to connect, so the request
// never reached the server.
func isDialError(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial"
}

// once sends one signed request and authenticates the response. The error
// wraps ErrAuth when the server refused the request or the response is not
// signed with the client's secret.
func (c *Client) once(ctx context.Context, method, uri string, body []byte) (int, []byte, error) {
	nonce := newNonce()
	req, err := http.NewRequestWithContext(ctx, method, "http://"+c.addr+uri, bytes.NewReader(body))
	if err != nil {
		return 0, nil, err
	}
	ts := strconv.FormatInt(c.now().UnixMilli(), 10)
	// Sign exactly the request-target net/http will send.
	mac := requestMAC(c.secret, method, req.URL.RequestURI(), ts, nonce, body)
	req.Header.Set(headerTime, ts)
	req.Header.Set(headerNonce, nonce)
	req.Header.Set(headerMac, hex.EncodeToString(mac))

	resp, err := c.hc.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	rbody, err := io.ReadAll(io.LimitReader(resp.Body, maxResponseLen+1))
	if err != nil {
		return 0, nil, err
	}
	if len(rbody) > maxResponseLen {
		return 0, nil, fmt.Errorf("response larger than %d bytes", maxResponseLen)
	}
	rmac, err := hex.DecodeString(resp.Header.Get(headerMac))
	signed := err == nil && hmac.Equal(rmac, responseMAC(c.secret, resp.StatusCode, nonce, rbody))
	switch {
	case !signed && resp.StatusCode == http.StatusUnauthorized:
		return 0, nil, fmt.Errorf("rendezvous: %s %s at %s: %w: the server refused the request (%s): "+
			"the shared secret differs from the server's (check --secret-file or HVDD_SECRET on both nodes)",
			method, uri, c.addr, ErrAuth, quoteShort(rbody))
	case !signed:
		return 0, nil, fmt.Errorf("rendezvous: %s %s at %s: %w: the response (status %d) is not signed with our secret: "+
			"the peer is not this job's hvdd rendezvous, or it holds a different secret",
			method, uri, c.addr, ErrAuth, resp.StatusCode)
	case resp.StatusCode == http.StatusUnauthorized:
		return 0, nil, fmt.Errorf("rendezvous: %s %s at %s: %w: %s", method, uri, c.addr, ErrAuth, quoteShort(rbody))
	}
	return resp.StatusCode, rbody, nil
}

// quoteShort returns b as text of at most 200 bytes, for error messages.
func quoteShort(b []byte) string {
	if len(b) > 200 {
		b = b[:200]
	}
	return strings.TrimSpace(strings.ToValidUTF8(string(b), "?"))
}
