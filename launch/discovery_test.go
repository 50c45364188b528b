package launch

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestParseDiscovery(t *testing.T) {
	for _, tt := range []struct {
		name    string
		out     string
		slots   int // --slots-per-host
		want    []Host
		wantErr string
	}{
		{name: "empty", out: "", want: nil},
		{name: "blank lines", out: "\n  \n\n", want: nil},
		{name: "host:slots", out: "a:2\nb:4\n", want: []Host{{"a", 2}, {"b", 4}}},
		{name: "order kept", out: "c:1\na:1\nb:1", want: []Host{{"c", 1}, {"a", 1}, {"b", 1}}},
		{name: "spaces and CRLF", out: "  a:2 \r\nb: 3\r\n", want: []Host{{"a", 2}, {"b", 3}}},
		{name: "host with --slots-per-host", out: "a\nb:1\n", slots: 4, want: []Host{{"a", 4}, {"b", 1}}},
		{name: "zero slots", out: "a:0\nb:1", want: []Host{{"a", 0}, {"b", 1}}},
		{name: "ipv6", out: "[fd00::2]:2\n[fd00::3]", slots: 1, want: []Host{{"fd00::2", 2}, {"fd00::3", 1}}},
		{name: "duplicate line", out: "a:2\nb:1\na:2\n", want: []Host{{"a", 2}, {"b", 1}}},
		{name: "host without slots", out: "a:1\nb\n", wantErr: `line 2: "b" has no slots and --slots-per-host is not given`},
		{name: "bad slots", out: "a:two", wantErr: `line 1: "a:two": slots must be a whole number, not "two"`},
		{name: "negative slots", out: "a:-1", wantErr: "slots must be a whole number"},
		{name: "two colons", out: "fd00::2:1", wantErr: "put an IPv6 address in brackets"},
		{name: "unclosed bracket", out: "[fd00::2:1", wantErr: "missing ']'"},
		{name: "junk after bracket", out: "[fd00::2]x", wantErr: "want [address]:slots"},
		{name: "empty name", out: ":2", wantErr: "the host name is empty"},
		{name: "shell characters", out: "a;rm:1", wantErr: `"a;rm" is not a host name or address`},
		{name: "conflicting slots", out: "a:2\na:3", wantErr: "line 2: host a is listed with 2 slots and with 3; list it once"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseDiscovery(tt.out, tt.slots)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("parseDiscovery(%q) = %v, %v; want an error containing %q", tt.out, got, err, tt.wantErr)
				}
				if !strings.Contains(err.Error(), "print one host per line") && !strings.Contains(err.Error(), "list it once") {
					t.Errorf("error %q does not say what to print", err)
				}
				return
			}
			if err != nil || !slices.Equal(got, tt.want) {
				t.Errorf("parseDiscovery(%q) = %v, %v; want %v", tt.out, got, err, tt.want)
			}
		})
	}
}

// TestScriptDiscovery runs real scripts: the output parsed, a failing
// script's exit code and output (Horovod's message), and a malformed line.
func TestScriptDiscovery(t *testing.T) {
	t.Parallel()
	dir := testDir(t)
	script := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte("#!/bin/sh\n"+body+"\n"), 0o755); err != nil {
			t.Fatal(err)
		}
		return p
	}
	ok := script("ok", "echo a:2; echo b")
	hosts, err := scriptDiscovery(ok+" --ignored-arg", "", 3)(context.Background())
	if err != nil || !slices.Equal(hosts, []Host{{"a", 2}, {"b", 3}}) {
		t.Errorf("discovery = %v, %v", hosts, err)
	}
	fail := script("fail", "echo a:1; echo 'cannot reach the cloud API' >&2; exit 3")
	_, err = scriptDiscovery(fail, "", 0)(context.Background())
	if err == nil || !strings.Contains(err.Error(), "Failed to execute discovery script: "+fail+". Exit code: 3") ||
		!strings.Contains(err.Error(), "cannot reach the cloud API") {
		t.Errorf("failing script: %v", err)
	}
	bad := script("bad", "echo 'a:x'")
	if _, err = scriptDiscovery(bad, "", 0)(context.Background()); err == nil || !strings.Contains(err.Error(), bad) || !strings.Contains(err.Error(), "line 1") {
		t.Errorf("malformed output: %v", err)
	}
	if _, err = scriptDiscovery(filepath.Join(dir, "missing"), "", 0)(context.Background()); err == nil || !strings.Contains(err.Error(), "Exit code: 127") {
		t.Errorf("missing script: %v", err)
	}
	hosts, err = fixedHosts([]Host{{"a", 1}})(context.Background())
	if err != nil || !slices.Equal(hosts, []Host{{"a", 1}}) {
		t.Errorf("fixed hosts = %v, %v", hosts, err)
	}
}
