package daemontest

import (
	_ "embed"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
)

// Host is a test "node": a network namespace with one interface on the
// test network.
type Host struct {
	NS   string // namespace name
	Addr string // its address on the test network
	If   string // its interface (inside NS)
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

// Hosts makes n test hosts on one switch with links of unlimited speed
// (Bridge with no rate).
func Hosts(tb testing.TB, n int) []*Host {
	tb.Helper()
	return Bridge(tb, n, "")
}

// bridgeScript makes and removes a group of namespaces on a bridge; see its
// header. bench/scale.sh runs the same file.
//
//go:embed bridge.sh
var bridgeScript string

// groups numbers the groups this process makes, for their names.
var groups atomic.Int64

// sweepOnce removes, once per process, the groups of test processes that
// died before their cleanup ran.
var sweepOnce sync.Once

// groupName matches the namespaces Bridge makes: hvn<pid>g<seq> then "br"
// or "n" and the node's index.
var groupName = regexp.MustCompile(`^hvn([0-9]+)g[0-9]+(br|n[0-9]+)$`)

// Bridge makes n network namespaces joined by a Linux bridge (in a namespace
// of its own), the project's test hosts for jobs of several nodes: host i
// is namespace hvn<pid>g<seq>n<i> with interface veth0 at 10.77.0.<i+1>/24.
// With rate (a tc rate such as "1gbit"), every host's link is limited to
// rate in each direction with tc tbf. Nothing is made in the root
// namespace, and the names carry this process's pid and a sequence number,
// so groups of concurrent tests and test binaries never collide.
//
// Everything is removed when the test ends, failed or not (processes still
// inside the namespaces are killed first). Groups left by a test binary
// that was killed before its cleanup ran (a -timeout panic, SIGKILL) are
// removed by the next Bridge call of any test binary, recognised by a pid
// that no longer runs.
//
// Bridge skips the test when not root or without ip(8) (or tc(8) with a
// rate), and when the kernel refuses to make a namespace (a container
// without CAP_SYS_ADMIN); any other failure fails it.
func Bridge(tb testing.TB, n int, rate string) []*Host {
	tb.Helper()
	if n < 1 || n > 250 {
		tb.Fatalf("Bridge: %d hosts; want 1 to 250", n)
	}
	if os.Geteuid() != 0 {
		tb.Skip("network namespaces need root: run the tests as root (CI does)")
	}
	for _, tool := range []string{"ip", "bash"} {
		if _, err := exec.LookPath(tool); err != nil {
			tb.Skipf("%s missing: apt-get install iproute2 bash", tool)
		}
	}
	if _, err := exec.LookPath("tc"); err != nil && rate != "" {
		tb.Skip("tc(8) missing, needed to limit the links: apt-get install iproute2")
	}
	sweepOnce.Do(sweepStale)
	prefix := fmt.Sprintf("hvn%dg%d", os.Getpid(), groups.Add(1))
	tb.Cleanup(func() {
		if out, err := bridgeCmd("down", prefix, n, "").CombinedOutput(); err != nil {
			tb.Errorf("removing test namespaces %s*: %v\n%s", prefix, err, out)
		}
	})
	if out, err := bridgeCmd("up", prefix, n, rate).CombinedOutput(); err != nil {
		if strings.Contains(string(out), "Operation not permitted") {
			tb.Skipf("the kernel refuses network namespaces here (%s): run where root may make them", strings.TrimSpace(string(out)))
		}
		tb.Fatalf("making %d test namespaces on a bridge: %v\n%s", n, err, out)
	}
	hs := make([]*Host, n)
	for i := range hs {
		hs[i] = &Host{NS: prefix + "n" + strconv.Itoa(i), Addr: fmt.Sprintf("10.77.0.%d", i+1), If: "veth0"}
	}
	return hs
}

func bridgeCmd(verb, prefix string, n int, rate string) *exec.Cmd {
	args := []string{"-c", bridgeScript, "bridge.sh", verb, prefix, strconv.Itoa(n)}
	if rate != "" {
		args = append(args, rate)
	}
	return exec.Command("bash", args...)
}

// sweepStale removes the namespaces of Bridge groups whose test process is
// gone, killing what still runs inside them.
func sweepStale() {
	ents, err := os.ReadDir("/run/netns")
	if err != nil {
		return
	}
	for _, e := range ents {
		m := groupName.FindStringSubmatch(e.Name())
		if m == nil {
			continue
		}
		pid, _ := strconv.Atoi(m[1])
		if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
			continue // its test still runs (or the pid is taken: leave it)
		}
		if out, err := exec.Command("ip", "netns", "pids", e.Name()).Output(); err == nil {
			for _, f := range strings.Fields(string(out)) {
				if p, err := strconv.Atoi(f); err == nil {
					syscall.Kill(p, syscall.SIGKILL)
				}
			}
		}
		exec.Command("ip", "netns", "del", e.Name()).Run()
	}
}

func run(tb testing.TB, name string, args ...string) {
	tb.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		tb.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
}
