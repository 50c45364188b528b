package launch

import (
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestParseHosts(t *testing.T) {
	tests := []struct {
		in      string
		want    []Host
		wantErr string
	}{
		{in: "a:2,b:4", want: []Host{{"a", 2}, {"b", 4}}},
		{in: "node1", want: []Host{{"node1", 1}}},
		{in: " a:1 , 10.0.0.2:3", want: []Host{{"a", 1}, {"10.0.0.2", 3}}},
		{in: "[fd00::2]:4,[::1]", want: []Host{{"fd00::2", 4}, {"::1", 1}}},
		{in: "a:2,,b:1", wantErr: "empty entry"},
		{in: "a:0", wantErr: "at least 1"},
		{in: "a:-1", wantErr: "at least 1"},
		{in: "a:x", wantErr: "whole number"},
		{in: ":2", wantErr: "host name is empty"},
		{in: "fd00::2:4", wantErr: "brackets"},
		{in: "[fd00::2", wantErr: "missing ']'"},
		{in: "a;rm -rf /:2", wantErr: "not a host name"},
		{in: "-oProxyCommand=x:1", wantErr: "not a host name"},
		{in: "a:1,b:2,a:3", wantErr: "listed twice"},
	}
	for _, tt := range tests {
		got, err := ParseHosts(tt.in)
		if tt.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("ParseHosts(%q) = %v, %v; want an error containing %q", tt.in, got, err, tt.wantErr)
			}
			continue
		}
		if err != nil || !slices.Equal(got, tt.want) {
			t.Errorf("ParseHosts(%q) = %v, %v; want %v", tt.in, got, err, tt.want)
		}
	}
}

func TestReadHostfile(t *testing.T) {
	dir := t.TempDir()
	write := func(name, text string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	good := write("good", "# the cluster\nnode1 slots=4\n\n  node2:2   # gpu box\nnode3\n[fd00::1] slots=2\nfd00::9 slots=1\n")
	got, err := ReadHostfile(good)
	want := []Host{{"node1", 4}, {"node2", 2}, {"node3", 1}, {"fd00::1", 2}, {"fd00::9", 1}}
	if err != nil || !slices.Equal(got, want) {
		t.Errorf("ReadHostfile = %v, %v; want %v", got, err, want)
	}
	for name, tt := range map[string]struct{ text, wantErr string }{
		"empty":      {"# nothing\n\n", "names no hosts"},
		"bad slots":  {"a slots=x\n", "line 1"},
		"extra word": {"a\nb slots=2 max_slots=4\n", "line 2"},
		"duplicate":  {"a slots=1\na:2\n", "listed twice"},
	} {
		if _, err := ReadHostfile(write(name, tt.text)); err == nil || !strings.Contains(err.Error(), tt.wantErr) {
			t.Errorf("%s: ReadHostfile error %v, want one containing %q", name, err, tt.wantErr)
		}
	}
	if _, err := ReadHostfile(filepath.Join(dir, "missing")); err == nil {
		t.Error("ReadHostfile of a missing file succeeded")
	}
}

func TestLayout(t *testing.T) {
	tests := []struct {
		name    string
		hosts   []Host
		np      int
		want    []node
		wantErr string
	}{
		{name: "even", hosts: []Host{{"a", 2}, {"b", 2}}, np: 4,
			want: []node{{Host: "a", Slots: 2, Offset: 0}, {Host: "b", Slots: 2, Offset: 2}}},
		{name: "uneven", hosts: []Host{{"a", 1}, {"b", 3}, {"c", 2}}, np: 6,
			want: []node{{Host: "a", Slots: 1}, {Host: "b", Slots: 3, Offset: 1}, {Host: "c", Slots: 2, Offset: 4}}},
		{name: "np smaller: last host partly filled", hosts: []Host{{"a", 2}, {"b", 4}}, np: 3,
			want: []node{{Host: "a", Slots: 2}, {Host: "b", Slots: 1, Offset: 2}}},
		{name: "np smaller: hosts dropped", hosts: []Host{{"a", 4}, {"b", 4}, {"c", 1}}, np: 4,
			want: []node{{Host: "a", Slots: 4}}},
		{name: "too many", hosts: []Host{{"a", 2}, {"b", 4}}, np: 7, wantErr: "-np 7 is more than the 6 slots of the hosts (a:2,b:4); lower -np or give the hosts more slots"},
		{name: "no hosts", np: 1, wantErr: "no hosts"},
		{name: "zero slots", hosts: []Host{{"a", 0}}, np: 1, wantErr: "at least 1"},
	}
	for _, tt := range tests {
		got, err := layout(tt.hosts, tt.np)
		if tt.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("%s: layout = %v, %v; want an error containing %q", tt.name, got, err, tt.wantErr)
			}
			continue
		}
		if err != nil || !slices.Equal(got, tt.want) {
			t.Errorf("%s: layout = %+v, %v; want %+v", tt.name, got, err, tt.want)
		}
	}
}

func TestCrossRank(t *testing.T) {
	nodes := []node{{Slots: 2}, {Slots: 1}, {Slots: 3}}
	for _, tt := range []struct{ node, lr, rank, size int }{
		{0, 0, 0, 3}, {1, 0, 1, 3}, {2, 0, 2, 3},
		{0, 1, 0, 2}, {2, 1, 1, 2},
		{2, 2, 0, 1},
	} {
		if r, s := crossRank(nodes, tt.node, tt.lr); r != tt.rank || s != tt.size {
			t.Errorf("crossRank(node %d, local %d) = %d, %d; want %d, %d", tt.node, tt.lr, r, s, tt.rank, tt.size)
		}
	}
}

func TestIsLocalHost(t *testing.T) {
	local := []string{"localhost", "LOCALHOST", "127.0.0.1", "127.0.0.2", "127.1.2.3", "::1"}
	if hn, err := os.Hostname(); err == nil {
		local = append(local, hn)
	}
	addrs, _ := net.InterfaceAddrs()
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok {
			local = append(local, n.IP.String())
		}
	}
	for _, h := range local {
		if !isLocalHost(h) {
			t.Errorf("isLocalHost(%q) = false, want true", h)
		}
	}
	// Documentation addresses (RFC 5737, 3849) and a name that cannot
	// resolve (RFC 6761) are never ours.
	for _, h := range []string{"192.0.2.1", "2001:db8::1", "no-such-host.invalid"} {
		if isLocalHost(h) {
			t.Errorf("isLocalHost(%q) = true, want false", h)
		}
	}
}
