package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	hvdd "github.com/hvdd/hvdd/clients/go"
	"github.com/hvdd/hvdd/daemon/daemontest"
	"github.com/hvdd/hvdd/ipc"
)

// The tests here check deploy/systemd against what systemd can check
// without running it (systemd-analyze), against what the daemon really does
// (strace), and its install.sh.

// unit reads a unit file's assignments: key -> values in order.
func unit(t *testing.T, path string) map[string][]string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	kv := map[string][]string{}
	s := bufio.NewScanner(f)
	for s.Scan() {
		line := strings.TrimSpace(s.Text())
		if line == "" || line[0] == '#' || line[0] == '[' {
			continue
		}
		k, v, _ := strings.Cut(line, "=")
		kv[k] = append(kv[k], v)
	}
	return kv
}

// TestUnitsVerify runs systemd-analyze verify on both units, with the
// built binary as /usr/local/bin/hvdd of a scratch root that holds the
// host's system units: it must print nothing (verify exits 0 even for
// unknown keys, which it only prints). It also checks what verify cannot:
// that the service's flags are hvdd serve's, that TimeoutStopSec= outlasts
// --stop-timeout, and that the socket is where clients look.
func TestUnitsVerify(t *testing.T) {
	analyze := lookPath(t, "systemd-analyze")
	root := t.TempDir()
	sysunits := "/usr/lib/systemd/system"
	if _, err := os.Stat(filepath.Join(sysunits, "sockets.target")); err != nil {
		t.Skipf("no system units in %s to verify against", sysunits)
	}
	for _, c := range [][]string{
		{"mkdir", "-p", root + "/usr/lib/systemd", root + "/usr/local/bin", root + "/etc/systemd/system"},
		{"cp", "-a", sysunits, root + "/usr/lib/systemd/"},
		{"cp", hvddBin, root + "/usr/local/bin/hvdd"},
		{"cp", "../../deploy/systemd/hvdd.service", "../../deploy/systemd/hvdd.socket", root + "/etc/systemd/system/"},
	} {
		if out, err := exec.Command(c[0], c[1:]...).CombinedOutput(); err != nil {
			t.Fatalf("%v: %v\n%s", c, err, out)
		}
	}
	out, err := exec.Command(analyze, "verify", "--root="+root, "hvdd.socket", "hvdd.service").CombinedOutput()
	if err != nil || len(out) > 0 {
		t.Errorf("systemd-analyze verify: %v\n%s", err, out)
	}

	svc := unit(t, "../../deploy/systemd/hvdd.service")
	sock := unit(t, "../../deploy/systemd/hvdd.socket")
	if got := svc["Type"]; !slices.Equal(got, []string{"notify"}) {
		t.Errorf("Type=%v, want notify", got)
	}
	if len(svc["WatchdogSec"]) != 1 {
		t.Errorf("WatchdogSec=%v, want one", svc["WatchdogSec"])
	}
	if got := sock["ListenStream"]; len(got) != 1 || got[0] != "/run/hvdd/hvdd.sock" {
		t.Errorf("ListenStream=%v, want the one path clients of root look at", got)
	}
	exe := strings.Fields(strings.NewReplacer("${HVDD_SLOTS}", "1", "$HVDD_ARGS", "").Replace(svc["ExecStart"][0]))
	if exe[0] != "/usr/local/bin/hvdd" || exe[1] != "serve" {
		t.Fatalf("ExecStart=%v, want /usr/local/bin/hvdd serve ...", exe)
	}
	args, err := parseServeArgs(exe[2:])
	if err != nil {
		t.Fatalf("ExecStart's flags: %v", err)
	}
	stop, err := systemdSpan(svc["TimeoutStopSec"][0])
	if err != nil || args.stopTimeout <= 0 || stop <= args.stopTimeout {
		t.Errorf("TimeoutStopSec=%v (%v) must outlast --stop-timeout %v, so that the daemon's own timeout tells the ranks why", svc["TimeoutStopSec"], err, args.stopTimeout)
	}
	if !slices.Contains(strings.Split(args.allowGID, ","), "hvdd") {
		t.Errorf("ExecStart does not let the hvdd group in (--allow-gid %q)", args.allowGID)
	}
	if ipc.DefaultSocket() != "/run/hvdd/hvdd.sock" && os.Geteuid() == 0 {
		t.Errorf("clients of root look at %s, not at the unit's socket", ipc.DefaultSocket())
	}
}

// systemdSpan parses a systemd time span of one unit ("31min", "90s",
// "1h").
func systemdSpan(s string) (time.Duration, error) {
	i := strings.IndexFunc(s, func(r rune) bool { return r < '0' || r > '9' })
	if i <= 0 {
		return 0, fmt.Errorf("time span %q", s)
	}
	v, _ := strconv.Atoi(s[:i])
	unitOf := map[string]time.Duration{"s": time.Second, "sec": time.Second, "min": time.Minute, "m": time.Minute, "h": time.Hour}
	u, ok := unitOf[s[i:]]
	if !ok {
		return 0, fmt.Errorf("time span %q: unit %q", s, s[i:])
	}
	return time.Duration(v) * u, nil
}

// TestUnitSandbox checks hvdd.service's sandbox against what a real daemon
// does, since systemd-analyze verify checks only the unit's syntax and PID
// 1 is not systemd here to run it: hvdd serve runs under strace through a
// job of every collective (small ones in its loop, large ones on its
// executor, daemon-made output regions) with --network-interface (which
// reads the interfaces over netlink), and every system call it made must
// be allowed by the unit's SystemCallFilter= lines, every socket family it
// opened listed in RestrictAddressFamilies=, and no mapping it made writable
// and executable at once, nor made executable later (what
// MemoryDenyWriteExecute= refuses). Paths a job does not take (across
// nodes: TCP, which AF_INET/AF_INET6 and @network-io cover) are not traced.
func TestUnitSandbox(t *testing.T) {
	strace := lookPath(t, "strace")
	analyze := lookPath(t, "systemd-analyze")
	if out, err := exec.Command(strace, "-o", "/dev/null", "true").CombinedOutput(); err != nil {
		t.Skipf("strace cannot trace here: %v %s", err, out)
	}
	svc := unit(t, "../../deploy/systemd/hvdd.service")
	dir := t.TempDir()
	trace, sock := filepath.Join(dir, "trace"), filepath.Join(dir, "hvdd.sock")
	d := startDaemon(t, nil, strace, "-f", "-qq", "-o", trace, hvddBin, "serve", "--slots", "2", "--socket", sock,
		"--network-interface", "lo", "--exit-after-job", "--log-level", "error")
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	clients := daemontest.InitClients(t, ctx, sock, 2)
	for _, n := range []int{16, 1 << 20} { // in the loop; on the executor
		daemontest.RunAll(t, clients, func(c *hvdd.Client) error {
			x := make([]float32, n)
			if err := hvdd.Allreduce(ctx, c, x, hvdd.WithName(fmt.Sprint("ar", n))); err != nil {
				return err
			}
			if err := hvdd.Broadcast(ctx, c, x, 0, hvdd.WithName(fmt.Sprint("bc", n))); err != nil {
				return err
			}
			if _, err := hvdd.Allgather(ctx, c, x, hvdd.WithName(fmt.Sprint("ag", n))); err != nil {
				return err
			}
			if _, _, err := hvdd.Alltoall(ctx, c, x, nil, hvdd.WithName(fmt.Sprint("a2a", n))); err != nil {
				return err
			}
			_, err := hvdd.Reducescatter(ctx, c, x, hvdd.WithName(fmt.Sprint("rs", n)))
			return err
		})
	}
	for _, c := range clients {
		c.Close()
	}
	if err := d.wait(t); err != nil {
		t.Fatalf("hvdd serve --exit-after-job under strace: %v", err)
	}
	out, err := os.ReadFile(trace)
	if err != nil {
		t.Fatal(err)
	}

	// The system calls SystemCallFilter= allows: its first list, less the
	// lists that start with ~.
	allowed := map[string]bool{}
	for i, line := range svc["SystemCallFilter"] {
		deny := strings.HasPrefix(line, "~")
		if i == 0 && deny {
			t.Fatalf("SystemCallFilter=%s: the first list should be an allow list", line)
		}
		for _, name := range strings.Fields(strings.TrimPrefix(line, "~")) {
			for _, call := range expandSyscalls(t, analyze, name) {
				allowed[call] = !deny
			}
		}
	}
	families := map[string]bool{}
	for _, f := range strings.Fields(svc["RestrictAddressFamilies"][0]) {
		families[f] = true
	}
	calls := map[string]bool{}
	used := map[string]bool{}
	callRe := regexp.MustCompile(`^\d+\s+([a-z0-9_]+)\((.*)`)
	for _, line := range strings.Split(string(out), "\n") {
		m := callRe.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		call, args := m[1], m[2]
		calls[call] = true
		if call == "execve" {
			continue // strace's own exec of hvdd, before the sandbox would apply
		}
		if !allowed[call] {
			t.Errorf("system call %s is not allowed by SystemCallFilter=%q: %s", call, svc["SystemCallFilter"], line)
		}
		if call == "socket" {
			f, _, _ := strings.Cut(args, ",")
			used[f] = true
			if !families[f] {
				t.Errorf("socket family %s is not in RestrictAddressFamilies=: %s", f, line)
			}
		}
		exec := strings.Contains(args, "PROT_EXEC")
		switch {
		case call == "mmap" && exec && strings.Contains(args, "PROT_WRITE"),
			(call == "mprotect" || call == "pkey_mprotect") && exec:
			t.Errorf("a mapping MemoryDenyWriteExecute= refuses: %s", line)
		}
	}
	for _, want := range []string{"memfd_create", "sendmsg", "recvmsg", "epoll_pwait", "mmap"} {
		if !calls[want] {
			t.Errorf("the trace lacks %s: did the job run? (%d calls seen)", want, len(calls))
		}
	}
	if !used["AF_NETLINK"] || !used["AF_UNIX"] {
		t.Errorf("socket families used %v: want AF_UNIX and, for --network-interface, AF_NETLINK", used)
	}
}

// expandSyscalls lists the system calls of a SystemCallFilter= name: a
// call itself, or a @group that systemd-analyze syscall-filter expands
// (groups nest).
func expandSyscalls(t *testing.T, analyze, name string) []string {
	t.Helper()
	if !strings.HasPrefix(name, "@") {
		return []string{name}
	}
	out, err := exec.Command(analyze, "syscall-filter", name).Output()
	if err != nil {
		t.Fatalf("systemd-analyze syscall-filter %s: %v", name, err)
	}
	var calls []string
	for _, line := range strings.Split(string(out), "\n")[1:] {
		line = strings.TrimSpace(line)
		if line == "" || line[0] == '#' {
			continue
		}
		calls = append(calls, expandSyscalls(t, analyze, line)...)
	}
	return calls
}

// TestInstallScript runs deploy/systemd/install.sh into a scratch root
// (DESTDIR) twice: the first run installs the binary, both units,
// /etc/default/hvdd and the hvdd group and user; the second (an upgrade)
// replaces the binary and units, keeps an edited /etc/default/hvdd, and
// adds no second group or user. A missing binary is refused, saying how
// to build one.
func TestInstallScript(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("install.sh runs as root")
	}
	lookPath(t, "groupadd")
	lookPath(t, "useradd")
	root := t.TempDir()
	install := func(bin string) (string, error) {
		cmd := exec.Command("../../deploy/systemd/install.sh")
		cmd.Env = append(os.Environ(), "DESTDIR="+root, "HVDD_BIN="+bin)
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	same := func(a, b string) {
		t.Helper()
		x, err1 := os.ReadFile(a)
		y, err2 := os.ReadFile(b)
		if err1 != nil || err2 != nil || !bytes.Equal(x, y) {
			t.Errorf("%s is not %s (%v %v)", a, b, err1, err2)
		}
	}
	count := func(file, prefix string) int {
		t.Helper()
		b, err := os.ReadFile(filepath.Join(root, file))
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, l := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(l, prefix) {
				n++
			}
		}
		return n
	}
	defaults := filepath.Join(root, "etc/default/hvdd")
	for run := 1; run <= 2; run++ {
		if out, err := install(hvddBin); err != nil {
			t.Fatalf("install.sh (run %d): %v\n%s", run, err, out)
		}
		same(filepath.Join(root, "usr/local/bin/hvdd"), hvddBin)
		same(filepath.Join(root, "etc/systemd/system/hvdd.service"), "../../deploy/systemd/hvdd.service")
		same(filepath.Join(root, "etc/systemd/system/hvdd.socket"), "../../deploy/systemd/hvdd.socket")
		if st, err := os.Stat(filepath.Join(root, "usr/local/bin/hvdd")); err != nil || st.Mode().Perm() != 0o755 {
			t.Errorf("installed binary: %v %v, want mode 0755", st, err)
		}
		if g, u := count("etc/group", "hvdd:"), count("etc/passwd", "hvdd:"); g != 1 || u != 1 {
			t.Errorf("run %d: %d hvdd groups and %d hvdd users, want one of each", run, g, u)
		}
		if _, err := os.Stat(filepath.Join(root, "usr/local/bin/.hvdd.new")); !os.IsNotExist(err) {
			t.Errorf("run %d left the binary's temporary copy behind", run)
		}
		if run == 1 {
			f, err := os.OpenFile(defaults, os.O_APPEND|os.O_WRONLY, 0)
			if err != nil {
				t.Fatal(err)
			}
			fmt.Fprintln(f, "HVDD_SLOTS=8 # the operator's")
			f.Close()
		}
	}
	if b, _ := os.ReadFile(defaults); !strings.Contains(string(b), "HVDD_SLOTS=8 # the operator's") {
		t.Errorf("the second run replaced the operator's /etc/default/hvdd:\n%s", b)
	}
	// The user's group is the hvdd group.
	group, passwd := lineOf(t, root, "etc/group", "hvdd:"), lineOf(t, root, "etc/passwd", "hvdd:")
	if strings.Split(group, ":")[2] != strings.Split(passwd, ":")[3] {
		t.Errorf("user hvdd (%s) is not in group hvdd (%s)", passwd, group)
	}
	if out, err := install(filepath.Join(root, "no-such-hvdd")); err == nil || !strings.Contains(out, "build it (go build -o bin/hvdd ./cmd/hvdd)") {
		t.Errorf("install.sh without a binary: %v\n%s", err, out)
	}
}

func lineOf(t *testing.T, root, file, prefix string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, file))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, prefix) {
			return l
		}
	}
	t.Fatalf("no %q line in %s", prefix, file)
	return ""
}
