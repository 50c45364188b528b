package rendezvous

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// Wire limits beyond the store's own.
const (
	// DefaultWaitPoll is how long one /wait long poll lasts when the request
	// names no timeout_ms, and how long the Client asks for.
	DefaultWaitPoll = 30 * time.Second
	// MaxWaitPoll caps timeout_ms.
	MaxWaitPoll = 60 * time.Second
	// maxRequestURI is the longest request URI the Client sends; Wait splits
	// longer key lists into several polls. The server's read buffer is twice
	// this, leaving room for the headers.
	maxRequestURI = 16 << 10
	// maxWaitResponse caps the values one /wait returns, so that a response
	// (base64 in JSON) stays within maxResponseLen.
	maxWaitResponse = 192 << 20
	// maxResponseLen is the largest response body the Client reads.
	maxResponseLen = 272 << 20
)

// op is a parsed request's operation.
type op int

const (
	opHealth op = iota
	opGet
	opSet
	opDelete
	opAdd
	opWait
)

// request is a parsed, validated request (before authentication of its
// content is relevant: parseRequest is only called on authenticated
// requests, but it must not trust them either).
type request struct {
	op      op
	key     string        // opGet, opSet, opDelete, opAdd
	keys    []string      // opWait
	delta   int64         // opAdd
	timeout time.Duration // opWait
}

// Routing errors, beside the store's categories.
var (
	errNoRoute = errors.New("no such endpoint")
	errMethod  = errors.New("method not allowed")
)

// parseRequest parses method, raw request URI and body into a request. Keys
// are path-escaped in /kv/ and /add/ and query-escaped in /wait.
func parseRequest(method, uri string, body []byte) (request, error) {
	path, rawQuery, _ := strings.Cut(uri, "?")
	switch {
	case path == "/healthz":
		if method != http.MethodGet {
			return request{}, fmt.Errorf("%s %s: %w", method, path, errMethod)
		}
		if rawQuery != "" {
			return request{}, fmt.Errorf("/healthz takes no query: %w", ErrInvalidArgument)
		}
		return request{op: opHealth}, nil

	case path == "/wait":
		if method != http.MethodGet {
			return request{}, fmt.Errorf("%s %s: %w", method, path, errMethod)
		}
		return parseWait(rawQuery)

	case strings.HasPrefix(path, "/kv/"), strings.HasPrefix(path, "/add/"):
		esc, isAdd := strings.CutPrefix(path, "/add/")
		if !isAdd {
			esc = strings.TrimPrefix(path, "/kv/")
		}
		key, err := url.PathUnescape(esc)
		if err != nil {
			return request{}, fmt.Errorf("bad key escape in %q: %w", path, ErrInvalidArgument)
		}
		if err := checkKey(key); err != nil {
			return request{}, err
		}
		if rawQuery != "" {
			return request{}, fmt.Errorf("%s takes no query: %w", path, ErrInvalidArgument)
		}
		if isAdd {
			if method != http.MethodPost {
				return request{}, fmt.Errorf("%s /add/: %w", method, errMethod)
			}
			d, err := strconv.ParseInt(strings.TrimSpace(string(body)), 10, 64)
			if err != nil {
				return request{}, fmt.Errorf("add to key %q: delta %.32q is not a decimal int64: %w", key, body, ErrInvalidArgument)
			}
			return request{op: opAdd, key: key, delta: d}, nil
		}
		switch method {
		case http.MethodGet:
			return request{op: opGet, key: key}, nil
		case http.MethodPut:
			if err := checkValue(key, body); err != nil {
				return request{}, err
			}
			return request{op: opSet, key: key}, nil
		case http.MethodDelete:
			return request{op: opDelete, key: key}, nil
		}
		return request{}, fmt.Errorf("%s /kv/: %w", method, errMethod)
	}
	return request{}, fmt.Errorf("%.64q: %w", path, errNoRoute)
}

// parseWait parses the query of GET /wait.
func parseWait(rawQuery string) (request, error) {
	q, err := url.ParseQuery(rawQuery)
	if err != nil {
		return request{}, fmt.Errorf("bad /wait query: %w", ErrInvalidArgument)
	}
	r := request{op: opWait, keys: q["key"], timeout: DefaultWaitPoll}
	for name, vs := range q {
		switch name {
		case "key":
		case "timeout_ms":
			if len(vs) != 1 {
				return request{}, fmt.Errorf("timeout_ms given %d times: %w", len(vs), ErrInvalidArgument)
			}
			ms, err := strconv.ParseInt(vs[0], 10, 64)
			if err != nil || ms < 0 {
				return request{}, fmt.Errorf("timeout_ms %.32q is not a non-negative integer: %w", vs[0], ErrInvalidArgument)
			}
			r.timeout = time.Duration(min(ms, MaxWaitPoll.Milliseconds())) * time.Millisecond
		default:
			return request{}, fmt.Errorf("unknown /wait parameter %.32q: %w", name, ErrInvalidArgument)
		}
	}
	if len(r.keys) == 0 {
		return request{}, fmt.Errorf("/wait names no key: %w", ErrInvalidArgument)
	}
	for _, k := range r.keys {
		if err := checkKey(k); err != nil {
			return request{}, err
		}
	}
	return r, nil
}

// statusOf maps an error from parseRequest or the store onto its HTTP status.
// It is the inverse of errorOf.
func statusOf(err error) int {
	switch {
	case err == nil:
		return http.StatusOK
	case errors.Is(err, ErrNotFound), errors.Is(err, errNoRoute):
		return http.StatusNotFound
	case errors.Is(err, ErrInvalidArgument):
		return http.StatusBadRequest
	case errors.Is(err, ErrTooLarge):
		return http.StatusRequestEntityTooLarge
	case errors.Is(err, ErrFull):
		return http.StatusConflict
	case errors.Is(err, ErrClosed):
		return http.StatusServiceUnavailable
	case errors.Is(err, errMethod):
		return http.StatusMethodNotAllowed
	case errors.Is(err, context.DeadlineExceeded):
		return http.StatusRequestTimeout
	}
	return http.StatusInternalServerError
}

// errorOf maps a status onto the sentinel the Client wraps, or nil when the
// status has none.
func errorOf(status int) error {
	switch status {
	case http.StatusNotFound:
		return ErrNotFound
	case http.StatusBadRequest:
		return ErrInvalidArgument
	case http.StatusRequestEntityTooLarge:
		return ErrTooLarge
	case http.StatusConflict:
		return ErrFull
	case http.StatusServiceUnavailable:
		return ErrClosed
	case http.StatusUnauthorized:
		return ErrAuth
	}
	return nil
}

// kvURI and addURI are the request URIs for one key.
func kvURI(key string) string  { return "/kv/" + url.PathEscape(key) }
func addURI(key string) string { return "/add/" + url.PathEscape(key) }

// waitBatches splits keys into groups whose /wait request URI stays within
// maxRequestURI bytes (one key alone always fits: 3*MaxKeyLen is far below).
func waitBatches(keys []string) [][]string {
	var batches [][]string
	var cur []string
	n := len("/wait?timeout_ms=") + 20
	for _, k := range keys {
		l := len("&key=") + len(url.QueryEscape(k))
		if len(cur) > 0 && n+l > maxRequestURI {
			batches = append(batches, cur)
			cur, n = nil, len("/wait?timeout_ms=")+20
		}
		cur = append(cur, k)
		n += l
	}
	if len(cur) > 0 {
		batches = append(batches, cur)
	}
	return batches
}

// waitURI is the request URI of one /wait poll.
func waitURI(keys []string, timeout time.Duration) string {
	var b strings.Builder
	b.WriteString("/wait?")
	for _, k := range keys {
		b.WriteString("key=")
		b.WriteString(url.QueryEscape(k))
		b.WriteByte('&')
	}
	b.WriteString("timeout_ms=")
	b.WriteString(strconv.FormatInt(timeout.Milliseconds(), 10))
	return b.String()
}
