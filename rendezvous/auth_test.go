package rendezvous

import (
	"bytes"
	"encoding/hex"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestSignVerify(t *testing.T) {
	s := []byte("secret-secret-secret")
	mac := Sign(s, []byte("ab"), []byte("c"))
	tests := []struct {
		name   string
		secret []byte
		mac    []byte
		parts  [][]byte
		want   bool
	}{
		{"same", s, mac, [][]byte{[]byte("ab"), []byte("c")}, true},
		{"moved boundary", s, mac, [][]byte{[]byte("a"), []byte("bc")}, false},
		{"joined", s, mac, [][]byte{[]byte("abc")}, false},
		{"extra empty part", s, mac, [][]byte{[]byte("ab"), []byte("c"), nil}, false},
		{"other secret", []byte("secret-secret-secreT"), mac, [][]byte{[]byte("ab"), []byte("c")}, false},
		{"truncated mac", s, mac[:31], [][]byte{[]byte("ab"), []byte("c")}, false},
		{"empty mac", s, nil, [][]byte{[]byte("ab"), []byte("c")}, false},
	}
	for _, tc := range tests {
		if got := Verify(tc.secret, tc.mac, tc.parts...); got != tc.want {
			t.Errorf("%s: Verify = %v, want %v", tc.name, got, tc.want)
		}
	}
	if len(mac) != 32 {
		t.Errorf("MAC of %d bytes, want 32", len(mac))
	}
}

// FuzzVerify checks that Sign's MAC verifies, that any change to it or to a
// part fails, and that the split between parts is part of what is signed.
func FuzzVerify(f *testing.F) {
	f.Add([]byte("secret-secret-secret"), []byte("ab"), []byte("c"), uint8(0))
	f.Add([]byte{}, []byte{}, []byte{}, uint8(200))
	f.Fuzz(func(t *testing.T, secret, a, b []byte, flip uint8) {
		mac := Sign(secret, a, b)
		if !Verify(secret, mac, a, b) {
			t.Fatal("Sign's MAC does not verify")
		}
		bad := bytes.Clone(mac)
		bad[int(flip)%len(bad)] ^= 1 << (flip % 8)
		if Verify(secret, bad, a, b) {
			t.Fatal("altered MAC verifies")
		}
		if len(a) > 0 {
			// Move the last byte of a to the front of b.
			a2, b2 := a[:len(a)-1], append([]byte{a[len(a)-1]}, b...)
			if Verify(secret, mac, a2, b2) {
				t.Fatal("MAC ignores the boundary between parts")
			}
		}
		if Verify(secret, mac, append(bytes.Clone(a), 0), b) {
			t.Fatal("MAC verifies a longer part")
		}
	})
}

func TestLoadSecret(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	hexKey := strings.Repeat("ab", 32)
	rawHex, _ := hex.DecodeString(hexKey)
	tests := []struct {
		name    string
		file    string
		env     string
		want    []byte
		wantErr string
	}{
		{"hex file", write("hex", hexKey+"\n"), "", rawHex, ""},
		{"raw file", write("raw", "  a raw secret, not hex  \n"), "", []byte("a raw secret, not hex"), ""},
		{"hex env", "", hexKey, rawHex, ""},
		{"raw env", "", "sixteen-bytes-ok", []byte("sixteen-bytes-ok"), ""},
		{"odd hex is raw", "", strings.Repeat("a", 33), []byte(strings.Repeat("a", 33)), ""},
		{"short", "", "too-short", nil, "shorter than 16"},
		{"short file", write("short", "tiny"), "", nil, "shorter than 16"},
		{"both", write("both", hexKey), hexKey, nil, "both"},
		{"missing file", filepath.Join(dir, "absent"), "", nil, "no such file"},
		{"neither", "", "", nil, "no shared secret"},
	}
	for _, tc := range tests {
		got, err := LoadSecret(tc.file, tc.env)
		switch {
		case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
			t.Errorf("%s: err = %v, want %q", tc.name, err, tc.wantErr)
		case tc.wantErr == "" && (err != nil || !bytes.Equal(got, tc.want)):
			t.Errorf("%s: LoadSecret = %q, %v; want %q", tc.name, got, err, tc.want)
		}
	}
	if _, err := LoadSecret("", ""); !errors.Is(err, ErrNoSecret) {
		t.Errorf("LoadSecret with neither = %v, want ErrNoSecret", err)
	}
}

func TestNewSecret(t *testing.T) {
	a, err := NewSecret()
	if err != nil {
		t.Fatal(err)
	}
	b, _ := NewSecret()
	if len(a) != 32 || bytes.Equal(a, b) {
		t.Fatalf("NewSecret = %x, %x", a, b)
	}
	got, err := LoadSecret("", hex.EncodeToString(a))
	if err != nil || !bytes.Equal(got, a) {
		t.Fatalf("hex round trip through LoadSecret = %x, %v", got, err)
	}
}

func TestReplayCache(t *testing.T) {
	c := replayCache{max: 2}
	t0 := time.Unix(1000, 0)
	steps := []struct {
		nonce    string
		at       time.Duration
		ok, full bool
	}{
		{"a", 0, true, false},
		{"a", time.Second, false, false},                       // replay
		{"b", time.Second, true, false},                        //
		{"c", 2 * time.Second, false, true},                    // full
		{"a", 2*MaxClockSkew - time.Millisecond, false, false}, // still remembered
		{"a", 2 * MaxClockSkew, true, false},                   // expired, so room and no replay
		{"c", 2*MaxClockSkew + time.Second, true, false},       // b expired too
	}
	for i, st := range steps {
		ok, full := c.add(st.nonce, t0.Add(st.at))
		if ok != st.ok || full != st.full {
			t.Fatalf("step %d add(%q, +%v) = %v, %v; want %v, %v", i, st.nonce, st.at, ok, full, st.ok, st.full)
		}
	}
}

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
