package daemontest

import (
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

func nsExists(name string) bool {
	_, err := os.Stat("/run/netns/" + name)
	return err == nil
}

// TestBridge makes 3 hosts on a bridge with limited links, checks what
// Bridge promised (namespaces, addresses, a tbf qdisc at each end of each
// link, a link that goes down and up), and that the test's end removes all
// of it.
func TestBridge(t *testing.T) {
	var hosts []*Host
	t.Run("make", func(t *testing.T) {
		hosts = Bridge(t, 3, "100mbit")
		for i, h := range hosts {
			if !nsExists(h.NS) {
				t.Fatalf("host %d: no namespace %s", i, h.NS)
			}
			out, err := h.Exec("ip", "-o", "addr", "show", "dev", h.If).CombinedOutput()
			if err != nil || !strings.Contains(string(out), h.Addr+"/24") {
				t.Errorf("host %d: %s lacks %s: %v\n%s", i, h.If, h.Addr, err, out)
			}
			out, err = h.Exec("tc", "qdisc", "show", "dev", h.If).CombinedOutput()
			if err != nil || !strings.Contains(string(out), "tbf") || !strings.Contains(string(out), "100Mbit") {
				t.Errorf("host %d: %s is not limited to 100 Mbit/s by tbf: %v\n%s", i, h.If, err, out)
			}
		}
		br := strings.TrimSuffix(hosts[0].NS, "n0") + "br"
		out, err := exec.Command("ip", "netns", "exec", br, "tc", "qdisc", "show", "dev", "port2").CombinedOutput()
		if err != nil || !strings.Contains(string(out), "tbf") {
			t.Errorf("bridge port 2 (what host 2 receives) is not limited by tbf: %v\n%s", err, out)
		}
		hosts[1].SetLink(t, false)
		if out, _ := hosts[1].Exec("ip", "link", "show", hosts[1].If).CombinedOutput(); !strings.Contains(string(out), "state DOWN") {
			t.Errorf("SetLink(false) left the link up:\n%s", out)
		}
		hosts[1].SetLink(t, true)
	})
	if len(hosts) == 0 {
		return // skipped
	}
	br := strings.TrimSuffix(hosts[0].NS, "n0") + "br"
	for _, ns := range []string{hosts[0].NS, hosts[1].NS, hosts[2].NS, br} {
		if nsExists(ns) {
			t.Errorf("namespace %s outlived its test", ns)
			exec.Command("ip", "netns", "del", ns).Run()
		}
	}
}

// TestBridgeSweep: the namespaces of a test process that died before its
// cleanup (made here by the script under a pid that runs nothing) are
// removed, with the process left inside; a live process's are not.
func TestBridgeSweep(t *testing.T) {
	Bridge(t, 1, "") // skips unless it can run; also a live group
	dead := 1 << 22  // above pid_max's largest value: never a process
	if err := syscall.Kill(dead, 0); err != syscall.ESRCH {
		t.Skipf("pid %d answers kill(0): %v", dead, err)
	}
	prefix := "hvn" + strconv.Itoa(dead) + "g1"
	t.Cleanup(func() { bridgeCmd("down", prefix, 2, "").Run() })
	if out, err := bridgeCmd("up", prefix, 2, "").CombinedOutput(); err != nil {
		t.Fatalf("bridge.sh up: %v\n%s", err, out)
	}
	stray := exec.Command("ip", "netns", "exec", prefix+"n1", "sleep", "600")
	if err := stray.Start(); err != nil {
		t.Fatal(err)
	}
	waited := make(chan error, 1)
	go func() { waited <- stray.Wait() }()
	sweepStale()
	for _, ns := range []string{prefix + "br", prefix + "n0", prefix + "n1"} {
		if nsExists(ns) {
			t.Errorf("namespace %s of a dead test survived the sweep", ns)
		}
	}
	select {
	case err := <-waited:
		if err == nil {
			t.Errorf("the process inside the dead test's namespace exited normally; want it killed")
		}
	case <-time.After(10 * time.Second):
		stray.Process.Kill()
		t.Errorf("the process inside the dead test's namespace was not killed")
	}
	live := 0
	ents, _ := os.ReadDir("/run/netns")
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), "hvn"+strconv.Itoa(os.Getpid())+"g") {
			live++
		}
	}
	if live != 2 {
		t.Errorf("%d namespaces of this live test after the sweep, want its 2", live)
	}
}
