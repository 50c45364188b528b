package daemontest

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
)

// Host is a test "node": a network namespace with one end of a veth pair.
type Host struct {
	NS   string // namespace name
	Addr string // its address on the test link
	If   string // its veth interface
}

// Exec returns a command that runs name args inside the namespace.
func (h *Host) Exec(name string, args ...string) *exec.Cmd {
	return exec.Command("ip", append([]string{"netns", "exec", h.NS, name}, args...)...)
}

// SetLink brings the host's side of the link up or down (a cut cable: no FIN,
// no RST, packets just stop).
func (h *Host) SetLink(tb testing.TB, up bool) {
	tb.Helper()
	state := "down"
	if up {
		state = "up"
	}
	run(tb, "ip", "netns", "exec", h.NS, "ip", "link", "set", h.If, state)
}

// Hosts makes two network namespaces joined by a veth pair, the project's own
// test hosts: host i has address 10.213.<salt>.(i+1)/24. They are removed when
// the test ends. It skips the test when not root or when ip(8) is missing.
func Hosts(tb testing.TB, n int) []*Host {
	tb.Helper()
	if n != 2 {
		tb.Fatalf("Hosts supports 2 hosts, not %d", n)
	}
	if os.Geteuid() != 0 {
		tb.Skip("network namespaces need root")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		tb.Skip("ip(8) missing: apt-get install iproute2")
	}
	salt := os.Getpid()%200 + 20
	hs := make([]*Host, n)
	for i := range hs {
		hs[i] = &Host{NS: fmt.Sprintf("hvdd%d-%d", salt, i), Addr: fmt.Sprintf("10.213.%d.%d", salt, i+1), If: fmt.Sprintf("hv%d-%d", salt, i)}
		run(tb, "ip", "netns", "add", hs[i].NS)
		ns := hs[i].NS
		tb.Cleanup(func() { exec.Command("ip", "netns", "del", ns).Run() })
	}
	run(tb, "ip", "link", "add", hs[0].If, "netns", hs[0].NS, "type", "veth", "peer", "name", hs[1].If, "netns", hs[1].NS)
	for _, h := range hs {
		run(tb, "ip", "netns", "exec", h.NS, "ip", "addr", "add", h.Addr+"/24", "dev", h.If)
		run(tb, "ip", "netns", "exec", h.NS, "ip", "link", "set", h.If, "up")
		run(tb, "ip", "netns", "exec", h.NS, "ip", "link", "set", "lo", "up")
	}
	return hs
}

func run(tb testing.TB, name string, args ...string) {
	tb.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		tb.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
}
