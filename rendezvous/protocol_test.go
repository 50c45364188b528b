package rendezvous

import (
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"
)

func TestParseRequest(t *testing.T) {
	tests := []struct {
		method, uri, body string
		want              request
		wantErr           error
	}{
		{"GET", "/healthz", "", request{op: opHealth}, nil},
		{"GET", "/kv/a%2Fb", "", request{op: opGet, key: "a/b"}, nil},
		{"PUT", "/kv/k", "v", request{op: opSet, key: "k"}, nil},
		{"DELETE", "/kv/k", "", request{op: opDelete, key: "k"}, nil},
		{"POST", "/add/k", " -3\n", request{op: opAdd, key: "k", delta: -3}, nil},
		{"GET", "/wait?key=a&key=b%26c&timeout_ms=5", "", request{op: opWait, keys: []string{"a", "b&c"}, timeout: 5 * time.Millisecond}, nil},
		{"GET", "/wait?key=a", "", request{op: opWait, keys: []string{"a"}, timeout: DefaultWaitPoll}, nil},
		{"GET", "/wait?key=a&timeout_ms=999999999", "", request{op: opWait, keys: []string{"a"}, timeout: MaxWaitPoll}, nil},
		{"GET", "/kv/", "", request{}, ErrInvalidArgument},
		{"GET", "/kv/%zz", "", request{}, ErrInvalidArgument},
		{"GET", "/kv/a?x=1", "", request{}, ErrInvalidArgument},
		{"GET", "/wait?key=a&timeout_ms=-1", "", request{}, ErrInvalidArgument},
		{"GET", "/wait?key=a&timeout_ms=1&timeout_ms=2", "", request{}, ErrInvalidArgument},
		{"GET", "/wait?key=a&other=1", "", request{}, ErrInvalidArgument},
		{"GET", "/wait?key=a;b", "", request{}, ErrInvalidArgument},
		{"POST", "/add/k", "", request{}, ErrInvalidArgument},
		{"POST", "/add/k", "99999999999999999999", request{}, ErrInvalidArgument},
		{"PUT", "/add/k", "1", request{}, errMethod},
		{"HEAD", "/healthz", "", request{}, errMethod},
		{"GET", "/", "", request{}, errNoRoute},
		{"GET", "/kvx", "", request{}, errNoRoute},
	}
	for _, tc := range tests {
		got, err := parseRequest(tc.method, tc.uri, []byte(tc.body))
		if tc.wantErr != nil {
			if !errors.Is(err, tc.wantErr) {
				t.Errorf("%s %s: err = %v, want %v", tc.method, tc.uri, err, tc.wantErr)
			}
			continue
		}
		if err != nil || got.op != tc.want.op || got.key != tc.want.key || got.delta != tc.want.delta ||
			got.timeout != tc.want.timeout || strings.Join(got.keys, "\x00") != strings.Join(tc.want.keys, "\x00") {
			t.Errorf("%s %s = %+v, %v; want %+v", tc.method, tc.uri, got, err, tc.want)
		}
	}
}

// FuzzParseRequest checks that parsing any request neither panics nor
// accepts an invalid key, and that the client's encodings parse back to the
// same key.
func FuzzParseRequest(f *testing.F) {
	for _, s := range []string{"/kv/a", "/add/x%2Fy", "/wait?key=a&key=b&timeout_ms=3", "/healthz", "/kv/%", "/wait?key=%ff"} {
		f.Add("GET", s, []byte("1"))
	}
	f.Fuzz(func(t *testing.T, method, uri string, body []byte) {
		r, err := parseRequest(method, uri, body)
		if err != nil {
			if statusOf(err) == http.StatusInternalServerError {
				t.Fatalf("parse error %v maps to 500", err)
			}
			return
		}
		for _, k := range append([]string{r.key}, r.keys...) {
			if k == "" && r.op != opWait && r.op != opHealth {
				t.Fatal("accepted empty key")
			}
			if k != "" && checkKey(k) != nil {
				t.Fatalf("accepted invalid key %q", k)
			}
		}
		if r.op == opWait && r.timeout > MaxWaitPoll {
			t.Fatalf("timeout %v above MaxWaitPoll", r.timeout)
		}
		if r.key != "" {
			for _, u := range []string{kvURI(r.key), addURI(r.key)} {
				m := "GET"
				if strings.HasPrefix(u, "/add/") {
					m = "POST"
				}
				r2, err := parseRequest(m, u, []byte("1"))
				if err != nil || r2.key != r.key {
					t.Fatalf("%s round trip of key %q = %q, %v", u, r.key, r2.key, err)
				}
			}
			r3, err := parseRequest("GET", waitURI([]string{r.key, "x"}, time.Second), nil)
			if err != nil || len(r3.keys) != 2 || r3.keys[0] != r.key {
				t.Fatalf("wait round trip of key %q = %q, %v", r.key, r3.keys, err)
			}
		}
	})
}
