package auth

import (
	"bytes"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestSignVerify(t *testing.T) {
	s := []byte("secret-secret-secret")
	mac := Sign(s, []byte("ab"), []byte("c"))
	tampered := bytes.Clone(mac)
	tampered[7] ^= 0x10
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
		{"tampered part", s, mac, [][]byte{[]byte("ab"), []byte("C")}, false},
		{"tampered mac", s, tampered, [][]byte{[]byte("ab"), []byte("c")}, false},
		{"other secret", []byte("secret-secret-secreT"), mac, [][]byte{[]byte("ab"), []byte("c")}, false},
		{"truncated mac", s, mac[:31], [][]byte{[]byte("ab"), []byte("c")}, false},
		{"empty mac", s, nil, [][]byte{[]byte("ab"), []byte("c")}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := Verify(tc.secret, tc.mac, tc.parts...); got != tc.want {
				t.Errorf("Verify = %v, want %v", got, tc.want)
			}
		})
	}
	if len(mac) != MACLen {
		t.Errorf("MAC of %d bytes, want %d", len(mac), MACLen)
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
	write := func(name, content string, perm os.FileMode) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), perm); err != nil {
			t.Fatal(err)
		}
		return p
	}
	hexKey := strings.Repeat("ab", 32)
	rawHex, _ := hex.DecodeString(hexKey)
	unreadable := "permission denied"
	if os.Geteuid() == 0 {
		unreadable = "" // root reads any file
	}
	tests := []struct {
		name    string
		file    string
		env     string
		want    []byte
		wantErr string
	}{
		{"hex file", write("hex", hexKey+"\n", 0o600), "", rawHex, ""},
		{"raw file", write("raw", "  a raw secret, not hex  \n", 0o600), "", []byte("a raw secret, not hex"), ""},
		{"world-readable file", write("open", hexKey, 0o644), "", rawHex, ""}, // permissions are not checked
		{"hex env", "", hexKey, rawHex, ""},
		{"upper-case hex env", "", strings.ToUpper(hexKey), rawHex, ""},
		{"raw env", "", "sixteen-bytes-ok", []byte("sixteen-bytes-ok"), ""},
		{"odd hex is raw", "", strings.Repeat("a", 33), []byte(strings.Repeat("a", 33)), ""},
		{"short hex is raw", "", strings.Repeat("ab", 15), []byte(strings.Repeat("ab", 15)), ""},
		{"hex decoding to too few bytes", "", strings.Repeat("ab", 16), []byte{0xab, 0xab, 0xab, 0xab, 0xab, 0xab, 0xab, 0xab, 0xab, 0xab, 0xab, 0xab, 0xab, 0xab, 0xab, 0xab}, ""},
		{"short", "", "too-short", nil, "shorter than 16"},
		{"only whitespace", "", " \t\n", nil, "shorter than 16"},
		{"short file", write("short", "tiny", 0o600), "", nil, "shorter than 16"},
		{"empty file", write("empty", "", 0o600), "", nil, "shorter than 16"},
		{"both", write("both", hexKey, 0o600), hexKey, nil, "both"},
		{"missing file", filepath.Join(dir, "absent"), "", nil, "no such file"},
		{"a directory", dir, "", nil, "read secret file"},
		{"unreadable file", write("locked", hexKey, 0o000), "", rawHex, unreadable},
		{"neither", "", "", nil, "no shared secret"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := LoadSecret(tc.file, tc.env)
			switch {
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Errorf("err = %v, want %q", err, tc.wantErr)
			case tc.wantErr == "" && (err != nil || !bytes.Equal(got, tc.want)):
				t.Errorf("LoadSecret = %q, %v; want %q", got, err, tc.want)
			}
		})
	}
	if _, err := LoadSecret("", ""); !errors.Is(err, ErrNoSecret) {
		t.Errorf("LoadSecret with neither = %v, want ErrNoSecret", err)
	}
}

func TestNewSecret(t *testing.T) {
	a, b := NewSecret(), NewSecret()
	if len(a) != 32 || bytes.Equal(a, b) {
		t.Fatalf("NewSecret = %x, %x", a, b)
	}
	got, err := LoadSecret("", hex.EncodeToString(a))
	if err != nil || !bytes.Equal(got, a) {
		t.Fatalf("hex round trip through LoadSecret = %x, %v", got, err)
	}
}

func TestNewNonce(t *testing.T) {
	a, b := NewNonce(), NewNonce()
	if len(a) != NonceLen || len(b) != NonceLen || bytes.Equal(a, b) {
		t.Fatalf("NewNonce = %x, %x", a, b)
	}
}
