package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	hvdd "github.com/hvdd/hvdd/clients/go"
	"github.com/hvdd/hvdd/daemon/daemontest"
	"github.com/hvdd/hvdd/ipc/ipcpb"
)

// The tests here run the real hvdd binary the way systemd runs it: under
// systemd-socket-activate (which passes a listening socket as hvdd.socket
// does) and with a NOTIFY_SOCKET the test listens on, as Type=notify does.

// TestListenFDs: the socket-activation variables, read as
// sd_listen_fds_with_names(3) reads them.
func TestListenFDs(t *testing.T) {
	const pid = 4242
	tests := []struct {
		name  string
		env   map[string]string
		n     int
		names []string
		err   string
	}{
		{"none", nil, 0, nil, ""},
		{"another process's", map[string]string{"LISTEN_PID": "17", "LISTEN_FDS": "1"}, 0, nil, ""},
		{"one", map[string]string{"LISTEN_PID": "4242", "LISTEN_FDS": "1"}, 1, nil, ""},
		{"one named", map[string]string{"LISTEN_PID": "4242", "LISTEN_FDS": "1", "LISTEN_FDNAMES": "hvdd.socket"}, 1, []string{"hvdd.socket"}, ""},
		{"two named", map[string]string{"LISTEN_PID": "4242", "LISTEN_FDS": "2", "LISTEN_FDNAMES": "a:b"}, 2, []string{"a", "b"}, ""},
		{"zero", map[string]string{"LISTEN_PID": "4242", "LISTEN_FDS": "0"}, 0, nil, ""},
		{"names do not match", map[string]string{"LISTEN_PID": "4242", "LISTEN_FDS": "2", "LISTEN_FDNAMES": "a"}, 0, nil,
			`socket activation: LISTEN_FDNAMES="a" names 1 descriptors, LISTEN_FDS=2`},
		{"bad pid", map[string]string{"LISTEN_PID": "x", "LISTEN_FDS": "1"}, 0, nil, `socket activation: LISTEN_PID="x" is not a process id`},
		{"bad count", map[string]string{"LISTEN_PID": "4242", "LISTEN_FDS": "-1"}, 0, nil, `socket activation: LISTEN_FDS="-1" is not a descriptor count`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			n, names, err := listenFDs(func(k string) string { return tt.env[k] }, pid)
			if n != tt.n || !slices.Equal(names, tt.names) || (err == nil) != (tt.err == "") || err != nil && err.Error() != tt.err {
				t.Fatalf("listenFDs = %d %q %v; want %d %q %q", n, names, err, tt.n, tt.names, tt.err)
			}
		})
	}
}

// TestWatchdogInterval: WATCHDOG_USEC and WATCHDOG_PID, read as
// sd_watchdog_enabled(3) reads them.
func TestWatchdogInterval(t *testing.T) {
	const pid = 4242
	tests := []struct {
		name string
		env  map[string]string
		want time.Duration
		err  string
	}{
		{"off", nil, 0, ""},
		{"on", map[string]string{"WATCHDOG_USEC": "30000000"}, 30 * time.Second, ""},
		{"ours", map[string]string{"WATCHDOG_USEC": "500000", "WATCHDOG_PID": "4242"}, 500 * time.Millisecond, ""},
		{"another process's", map[string]string{"WATCHDOG_USEC": "500000", "WATCHDOG_PID": "1"}, 0, ""},
		{"zero", map[string]string{"WATCHDOG_USEC": "0"}, 0, `WATCHDOG_USEC="0" is not a positive number of microseconds`},
		{"junk", map[string]string{"WATCHDOG_USEC": "30s"}, 0, `WATCHDOG_USEC="30s" is not a positive number of microseconds`},
		{"bad pid", map[string]string{"WATCHDOG_USEC": "1", "WATCHDOG_PID": "me"}, 0, `WATCHDOG_PID="me" is not a process id`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := watchdogInterval(func(k string) string { return tt.env[k] }, pid)
			if got != tt.want || (err == nil) != (tt.err == "") || err != nil && err.Error() != tt.err {
				t.Fatalf("watchdogInterval = %v %v; want %v %q", got, err, tt.want, tt.err)
			}
		})
	}
}

// notifySocket is the test's side of NOTIFY_SOCKET: a Unix datagram
// socket whose messages (each "KEY=VALUE" lines) arrive on msgs.
type notifySocket struct {
	addr string // as NOTIFY_SOCKET names it
	msgs chan string
}

// listenNotify listens on an abstract name (@...) or on a path in a
// temporary directory.
func listenNotify(t *testing.T, abstract bool) *notifySocket {
	t.Helper()
	n := &notifySocket{msgs: make(chan string, 10000)}
	if abstract {
		n.addr = fmt.Sprintf("@hvdd-test-%d-%s", os.Getpid(), strings.ReplaceAll(t.Name(), "/", "-"))
	} else {
		n.addr = filepath.Join(t.TempDir(), "notify")
	}
	c, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: n.addr, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	go func() {
		defer close(n.msgs)
		buf := make([]byte, 4096)
		for {
			k, err := c.Read(buf)
			if err != nil {
				return
			}
			n.msgs <- string(buf[:k])
		}
	}()
	return n
}

// waitFor reads messages until one satisfies ok and returns it with the
// messages before it; after 60 s it fails the test, listing them.
func (n *notifySocket) waitFor(t *testing.T, what string, ok func(string) bool) (string, []string) {
	t.Helper()
	var before []string
	timeout := time.After(60 * time.Second)
	for {
		select {
		case m := <-n.msgs:
			if ok(m) {
				return m, before
			}
			before = append(before, m)
		case <-timeout:
			if len(before) > 20 {
				before = append([]string{fmt.Sprintf("(%d more)", len(before)-20)}, before[len(before)-20:]...)
			}
			t.Fatalf("no sd_notify message %s; got %q", what, before)
		}
	}
}

// has reports whether a notify message assigns key=value.
func has(msg, assignment string) bool {
	return slices.Contains(strings.Split(msg, "\n"), assignment)
}

// status returns a message's STATUS= value, or "".
func status(msg string) string {
	for _, l := range strings.Split(msg, "\n") {
		if s, ok := strings.CutPrefix(l, "STATUS="); ok {
			return s
		}
	}
	return ""
}

func isStatus(want string) func(string) bool {
	return func(m string) bool { return status(m) == want }
}

// daemonProc is a started hvdd (or systemd-socket-activate exec'ing hvdd)
// whose output the test reads line by line, and whose exit it can wait for.
type daemonProc struct {
	cmd    *exec.Cmd
	out    lockedBuffer // everything it printed so far
	lines  chan string  // each line as it comes
	exited chan error   // its exit status, once its output has ended too
}

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func startDaemon(t *testing.T, env []string, name string, args ...string) *daemonProc {
	t.Helper()
	d := &daemonProc{cmd: exec.Command(name, args...), lines: make(chan string, 10000), exited: make(chan error, 1)}
	d.cmd.Env = append(os.Environ(), env...)
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	d.cmd.Stdout, d.cmd.Stderr = w, w
	if err := d.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	w.Close()
	read := make(chan struct{})
	go func() {
		defer close(read)
		s := bufio.NewScanner(r)
		for s.Scan() {
			fmt.Fprintln(&d.out, s.Text())
			select {
			case d.lines <- s.Text():
			default: // nobody waits for lines this far on
			}
		}
		r.Close()
	}()
	go func() {
		err := d.cmd.Wait()
		<-read
		d.exited <- err
	}()
	t.Cleanup(func() {
		select {
		case err := <-d.exited:
			d.exited <- err
		default:
			d.cmd.Process.Kill()
			<-d.exited
		}
		if t.Failed() {
			t.Logf("%s output:\n%s", name, d.out.String())
		}
	})
	return d
}

// wait waits for the daemon to exit (60 s at most) and returns its error.
func (d *daemonProc) wait(t *testing.T) error {
	t.Helper()
	select {
	case err := <-d.exited:
		d.exited <- err
		return err
	case <-time.After(60 * time.Second):
		t.Fatalf("the daemon did not exit within 60 s")
		return nil
	}
}

// waitLine reads the process's output lines until one matches re (60 s
// at most) and returns its first group.
func (d *daemonProc) waitLine(t *testing.T, re *regexp.Regexp) string {
	t.Helper()
	timeout := time.After(60 * time.Second)
	for {
		select {
		case l := <-d.lines:
			if m := re.FindStringSubmatch(l); m != nil {
				return m[1]
			}
		case err := <-d.exited:
			d.exited <- err
			t.Fatalf("exited (%v) before printing %v", err, re)
		case <-timeout:
			t.Fatalf("no %v in the output", re)
		}
	}
}

// TestSocketActivation runs hvdd serve under systemd-socket-activate as
// hvdd.socket would start it, with NOTIFY_SOCKET (an abstract name) and
// WATCHDOG_USEC. Two clients connecting through the activated socket start
// the daemon and run a job. It asserts READY=1, a STATUS line naming the
// running job while its ranks are connected and an idle one after, at
// least three WATCHDOG=1 pings (counted, not timed), that no descriptor of
// the listening socket in the daemon lacks FD_CLOEXEC, and STOPPING=1 and
// a clean exit at SIGTERM.
func TestSocketActivation(t *testing.T) {
	activate := lookPath(t, "systemd-socket-activate")
	sock := filepath.Join(t.TempDir(), "hvdd.sock")
	n := listenNotify(t, true)
	d := startDaemon(t, nil, activate, "-l", sock, "--fdname=hvdd.socket",
		"-E", "NOTIFY_SOCKET="+n.addr, "-E", "WATCHDOG_USEC=600000",
		hvddBin, "serve", "--slots", "2", "--socket", "/nonexistent/never.sock", "--log-level", "info")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	// The clients' connection starts the daemon (systemd-socket-activate
	// exec's it on the first connection, as systemd starts hvdd.service).
	clients := daemontest.InitClients(t, ctx, sock, 2)
	running := isStatus("running job 1: 2 ranks (2 slots)")
	m, before := n.waitFor(t, "READY=1", func(m string) bool { return has(m, "READY=1") })
	if len(before) > 0 || status(m) == "" {
		t.Errorf("READY=1 came as %q after %q; want it first, with a STATUS", m, before)
	}
	// The clients connect as the daemon starts: the job may have formed
	// before READY=1 was sent, whose STATUS then names it already.
	if !running(m) {
		n.waitFor(t, "naming the running job", running)
	}
	daemontest.RunAll(t, clients, func(c *hvdd.Client) error {
		x := []float32{float32(c.Rank() + 1)}
		if err := hvdd.Allreduce(ctx, c, x, hvdd.WithName("x")); err != nil {
			return err
		}
		if x[0] != 1.5 {
			return fmt.Errorf("allreduce = %v, want 1.5", x[0])
		}
		return nil
	})
	for i := 0; i < 3; i++ {
		n.waitFor(t, fmt.Sprintf("WATCHDOG=1 #%d", i+1), func(m string) bool { return has(m, "WATCHDOG=1") })
	}
	checkCloexec(t, d.cmd.Process.Pid, sock)
	for _, c := range clients {
		c.Close()
	}
	n.waitFor(t, "idle after the job", isStatus("idle: no job (2 slots)"))

	d.cmd.Process.Signal(syscall.SIGTERM)
	n.waitFor(t, "STOPPING=1", func(m string) bool { return has(m, "STOPPING=1") })
	if err := d.wait(t); err != nil {
		t.Fatalf("hvdd serve after SIGTERM: %v", err)
	}
	if out := d.out.String(); !strings.Contains(out, "hvdd daemon listening") {
		t.Errorf("the daemon's log does not reach its stderr (the journal under systemd):\n%s", out)
	}
}

func lookPath(t *testing.T, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		t.Skipf("%s is not installed (Debian: apt-get install systemd)", name)
	}
	return p
}

// checkCloexec fails t if a descriptor of process pid refers to the Unix
// socket bound at path (the listener, or a connection accepted on it)
// without O_CLOEXEC, or if none does.
func checkCloexec(t *testing.T, pid int, path string) {
	t.Helper()
	table, err := os.ReadFile(fmt.Sprintf("/proc/%d/net/unix", pid))
	if err != nil {
		t.Fatal(err)
	}
	inodes := map[string]bool{}
	for _, line := range strings.Split(string(table), "\n") {
		// Num RefCount Protocol Flags Type St Inode Path
		if f := strings.Fields(line); len(f) == 8 && f[7] == path {
			inodes[f[6]] = true
		}
	}
	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		t.Fatal(err)
	}
	found := 0
	for _, e := range fds {
		link, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, e.Name()))
		ino, ok := strings.CutPrefix(link, "socket:[")
		if err != nil || !ok || !inodes[strings.TrimSuffix(ino, "]")] {
			continue
		}
		found++
		info, err := os.ReadFile(fmt.Sprintf("/proc/%d/fdinfo/%s", pid, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		m := regexp.MustCompile(`(?m)^flags:\s+([0-7]+)`).FindSubmatch(info)
		if m == nil {
			t.Fatalf("no flags in fdinfo %q", info)
		}
		flags, _ := strconv.ParseUint(string(m[1]), 8, 64)
		if flags&unix.O_CLOEXEC == 0 {
			t.Errorf("fd %s of the daemon is the activated socket without O_CLOEXEC (fdinfo %q)", e.Name(), info)
		}
	}
	if found == 0 {
		t.Errorf("no descriptor of the daemon refers to the socket %s (inodes %v)", path, inodes)
	}
}

// TestSocketActivationRefused: sockets that hvdd.socket should not pass
// are refused with a message that says what to change, and the daemon
// exits with status 1.
func TestSocketActivationRefused(t *testing.T) {
	activate := lookPath(t, "systemd-socket-activate")
	tests := []struct {
		name string
		args func(dir string) []string
		want string
	}{
		{"two sockets", func(dir string) []string {
			return []string{"-l", filepath.Join(dir, "a.sock"), "-l", filepath.Join(dir, "b.sock"), "--fdname=hvdd.socket:other.socket"}
		}, "systemd passed 2 sockets (hvdd.socket, other.socket); hvdd serves one: give hvdd.socket exactly one ListenStream="},
		{"datagram", func(dir string) []string { return []string{"-l", filepath.Join(dir, "a.sock"), "--datagram"} },
			"is not a stream socket: use ListenStream=, not ListenDatagram="},
		{"TCP", func(dir string) []string { return []string{"-l", freeTCP(t)} }, "is not a Unix socket"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			args := append(tt.args(dir), hvddBin, "serve", "--slots", "1", "--socket", "/nonexistent/never.sock")
			d := startDaemon(t, nil, activate, args...)
			// Any activity on the first socket starts the daemon.
			first := d.waitLine(t, regexp.MustCompile(`Listening on (\S+) as 3`))
			trigger(t, first, tt.name)
			err := d.wait(t)
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.ExitCode() != 1 || !strings.Contains(d.out.String(), tt.want) {
				t.Fatalf("hvdd serve: %v, want exit status 1 and %q in:\n%s", err, tt.want, d.out.String())
			}
		})
	}
}

// trigger makes a socket readable for systemd-socket-activate: a
// connection, or a datagram.
func trigger(t *testing.T, addr, kind string) {
	t.Helper()
	network := map[string]string{"datagram": "unixgram", "TCP": "tcp"}[kind]
	if network == "" {
		network = "unix"
	}
	c, err := net.Dial(network, addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if kind == "datagram" {
		c.Write([]byte("x"))
	}
}

// TestStopDrains: with --stop-timeout (as hvdd.service runs it), SIGTERM
// while a job runs sends STOPPING=1 and a draining STATUS, refuses a new
// job's rank saying why, and lets the job go on; the daemon exits 0 once
// the job's ranks have closed. A second SIGTERM, or the timeout, stops it
// at once instead, and the job's pending operation fails naming that.
func TestStopDrains(t *testing.T) {
	tests := []struct {
		name        string
		stopTimeout string
		second      bool   // a second SIGTERM while draining
		wantErr     string // the pending op's error; "": the job goes on and ends
	}{
		{"drains", "10m", false, ""},
		{"second signal", "10m", true, "the hvdd daemon is shutting down: it received SIGTERM while waiting for its job to end"},
		{"timeout", "50ms", false, "the hvdd daemon is shutting down: it received SIGTERM, and its job did not end within --stop-timeout 50ms"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			sock := filepath.Join(t.TempDir(), "hvdd.sock")
			n := listenNotify(t, false)
			d := startDaemon(t, []string{"NOTIFY_SOCKET=" + n.addr}, hvddBin, "serve", "--slots", "2", "--socket", sock,
				"--stop-timeout", tt.stopTimeout, "--log-level", "info")
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			clients := daemontest.InitClients(t, ctx, sock, 2)
			defer clients[1].Close()
			defer clients[0].Close()
			n.waitFor(t, "naming the running job", isStatus("running job 1: 2 ranks (2 slots)"))
			var pending *hvdd.Handle
			if tt.wantErr != "" {
				// Rank 1 never submits "lonely": rank 0's op waits until the stop.
				var err error
				if pending, err = hvdd.AllreduceAsync(clients[0], []float32{1}, hvdd.WithName("lonely")); err != nil {
					t.Fatal(err)
				}
			}
			d.cmd.Process.Signal(syscall.SIGTERM)
			n.waitFor(t, "STOPPING=1", func(m string) bool { return has(m, "STOPPING=1") })
			if tt.stopTimeout == "10m" {
				n.waitFor(t, "draining", isStatus("draining, new jobs refused: waiting for running job 1: 2 ranks to end (2 slots)"))
			}
			switch {
			case tt.second:
				d.cmd.Process.Signal(syscall.SIGTERM)
			case tt.wantErr == "":
				late := &hvdd.Client{Socket: sock}
				err := late.Init(ctx)
				var he *hvdd.Error
				if !errors.As(err, &he) || he.Code != ipcpb.Code_CODE_BUSY || !strings.Contains(he.Msg, "is stopping (draining") {
					t.Errorf("a new job's rank while draining: %v, want CODE_BUSY saying the daemon drains", err)
				}
				daemontest.RunAll(t, clients, func(c *hvdd.Client) error {
					x := []float32{float32(c.Rank() + 1)}
					if err := hvdd.Allreduce(ctx, c, x, hvdd.WithName("after-sigterm")); err != nil {
						return err
					}
					if x[0] != 1.5 {
						return fmt.Errorf("allreduce = %v, want 1.5", x[0])
					}
					return nil
				})
				select {
				case err := <-d.exited:
					t.Fatalf("the daemon exited (%v) while its job's ranks were connected", err)
				default:
				}
				clients[0].Close()
				clients[1].Close()
			}
			if pending != nil {
				err := pending.Wait(ctx)
				if !errors.Is(err, hvdd.ErrShutDown) || !strings.Contains(err.Error(), tt.wantErr) {
					t.Errorf("pending op: %v, want CODE_SHUT_DOWN with %q", err, tt.wantErr)
				}
			}
			if err := d.wait(t); err != nil {
				t.Fatalf("hvdd serve: %v", err)
			}
			out := d.out.String()
			for _, want := range []string{"stopping once the running job has ended", "send the signal again to stop at once"} {
				if !strings.Contains(out, want) {
					t.Errorf("log lacks %q", want)
				}
			}
			if tt.wantErr == "" && !strings.Contains(out, "drained: no job left; exiting") {
				t.Errorf("log does not say the drain ended")
			}
		})
	}
}

// TestWatchdogStuckLoop: the watchdog pings stop while the daemon's event
// loop is stuck, and resume when it goes on. The loop is stuck for real,
// the way a stuck journal would stop it: its log (--log-file) is a FIFO
// with a one-page buffer that the test does not read, so once jobs have
// filled it the loop blocks in a log write. The daemon then reports each
// missed check as a STATUS line; the test counts three of them with no
// WATCHDOG=1 in between, then reads the FIFO and waits for the pings to
// come back.
func TestWatchdogStuckLoop(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "log")
	if err := unix.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	rfd, err := unix.Open(fifo, unix.O_RDONLY|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	logs := os.NewFile(uintptr(rfd), fifo)
	defer logs.Close()
	if _, err := unix.FcntlInt(uintptr(rfd), unix.F_SETPIPE_SZ, 4096); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "hvdd.sock")
	n := listenNotify(t, false)
	d := startDaemon(t, []string{"NOTIFY_SOCKET=" + n.addr, "WATCHDOG_USEC=400000"}, hvddBin, "serve", "--slots", "1",
		"--socket", sock, "--log-file", fifo, "--log-level", "debug")
	n.waitFor(t, "READY=1", func(m string) bool { return has(m, "READY=1") })
	for i := 0; i < 2; i++ {
		n.waitFor(t, "WATCHDOG=1 before the loop is stuck", func(m string) bool { return has(m, "WATCHDOG=1") })
	}

	// One-rank jobs, one after another, each logged by the loop, until
	// the FIFO is full and the loop blocks.
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	jobs := make(chan error, 1)
	go func() {
		for i := 0; ctx.Err() == nil; i++ {
			c := &hvdd.Client{Socket: sock}
			if err := c.Init(ctx); err != nil {
				jobs <- err
				return
			}
			err := hvdd.Allreduce(ctx, c, []float32{1}, hvdd.WithName(fmt.Sprint("x", i)))
			c.Close()
			if err != nil {
				jobs <- err
				return
			}
		}
		jobs <- ctx.Err()
	}()
	isMiss := func(k int) func(string) bool {
		return func(m string) bool {
			return strings.HasPrefix(status(m), fmt.Sprintf("event loop not answering: %d watchdog checks missed", k))
		}
	}
	n.waitFor(t, "saying the loop does not answer", isMiss(1))
	_, between := n.waitFor(t, "after three missed checks", isMiss(3))
	for _, m := range between {
		if has(m, "WATCHDOG=1") {
			t.Fatalf("WATCHDOG=1 while the loop was stuck: %q", between)
		}
	}

	// Let the loop go on: read its log.
	var logged lockedBuffer
	copied := make(chan error, 1)
	go func() { _, err := io.Copy(&logged, logs); copied <- err }()
	m, _ := n.waitFor(t, "WATCHDOG=1 after the loop went on", func(m string) bool { return has(m, "WATCHDOG=1") })
	if !strings.HasPrefix(status(m), "idle") && !strings.HasPrefix(status(m), "running job") && !strings.HasPrefix(status(m), "forming job") {
		t.Errorf("the first ping after the stall is %q, want it with the daemon's status", m)
	}
	n.waitFor(t, "another WATCHDOG=1", func(m string) bool { return has(m, "WATCHDOG=1") })
	cancel()
	<-jobs
	d.cmd.Process.Signal(syscall.SIGTERM)
	if err := d.wait(t); err != nil {
		t.Fatalf("hvdd serve: %v", err)
	}
	<-copied
	if !strings.Contains(logged.String(), "watchdog pings resumed") {
		t.Errorf("the log does not say that the pings resumed:\n%s", logged.String())
	}
}
