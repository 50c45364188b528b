package launch

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// testDir returns a short temporary directory: Unix socket paths are
// limited to 107 bytes, and t.TempDir's names grow with the test's.
func testDir(t *testing.T) string {
	t.Helper()
	d, err := os.MkdirTemp("", "hvdd-launch")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(d) })
	return d
}

// listenInTest plays an hvdd daemon that is already running: it listens on
// dir/hvdd.sock until the test ends.
func listenInTest(t *testing.T, dir string) string {
	t.Helper()
	socket := filepath.Join(dir, "hvdd.sock")
	ln, err := net.Listen("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go acceptAndDrop(ln)
	return socket
}

type result struct {
	code           int
	err            error
	stdout, stderr string
}

// start runs Run in the background with output captured and, unless cfg
// sets them, a private signal channel and a socket with a listener on it.
// The caller sends signals on the returned channel.
func start(ctx context.Context, t *testing.T, cfg Config) (chan<- os.Signal, <-chan result) {
	t.Helper()
	sigs := make(chan os.Signal, 4)
	if cfg.Signals == nil {
		cfg.Signals = sigs
	}
	if cfg.Socket == "" {
		cfg.Socket = listenInTest(t, testDir(t))
	}
	var stdout, stderr bytes.Buffer
	if cfg.Stdout == nil {
		cfg.Stdout = &stdout
	}
	if cfg.Stderr == nil {
		cfg.Stderr = &stderr
	}
	done := make(chan result, 1)
	go func() {
		code, err := Run(ctx, cfg)
		done <- result{code, err, stdout.String(), stderr.String()}
	}()
	return sigs, done
}

// run runs Run to completion; see start.
func run(t *testing.T, cfg Config) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	_, done := start(ctx, t, cfg)
	r := <-done
	if testing.Verbose() {
		t.Logf("code %d, err %v\nstdout:\n%.2000s\nstderr:\n%.2000s", r.code, r.err, r.stdout, r.stderr)
	}
	return r
}

func mustWaitForFiles(t *testing.T, dir string, names ...string) {
	t.Helper()
	if err := waitForFiles(dir, names, 15*time.Second); err != nil {
		t.Fatal(err)
	}
}

func readyFiles(ranks ...int) []string {
	var names []string
	for _, r := range ranks {
		names = append(names, "ready."+strconv.Itoa(r))
	}
	return names
}

func TestRunEnv(t *testing.T) {
	t.Parallel()
	dir := testDir(t)
	socket := listenInTest(t, dir)
	r := run(t, Config{
		NP:      3,
		Command: helperCmd("env"),
		Socket:  socket,
		Env:     []string{"HVDD_TEST_EXTRA=extra value", "HVDD_RANK=99", "HOROVOD_SIZE=42"},
	})
	if r.code != 0 || r.err != nil {
		t.Fatalf("Run = %d, %v; want 0, nil", r.code, r.err)
	}
	got := strings.Split(strings.TrimSpace(r.stdout), "\n")
	var want []string
	for rank := range 3 {
		p := fmt.Sprintf("[%d]<stdout>:", rank)
		ri := strconv.Itoa(rank)
		want = append(want,
			p+"HVDD_SOCKET="+socket, p+"HVDD_RANK="+ri, p+"HVDD_SIZE=3",
			p+"HVDD_LOCAL_RANK="+ri, p+"HVDD_LOCAL_SIZE=3",
			p+"HOROVOD_RANK="+ri, p+"HOROVOD_SIZE=3",
			p+"HOROVOD_LOCAL_RANK="+ri, p+"HOROVOD_LOCAL_SIZE=3",
			p+"HOROVOD_CROSS_RANK=0", p+"HOROVOD_CROSS_SIZE=1",
			p+"HVDD_TEST_EXTRA=extra value")
	}
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("stdout lines:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// TestRunTagging checks that lines written in pieces by several ranks to
// both streams come out whole, tagged, complete and in order per rank.
func TestRunTagging(t *testing.T) {
	t.Parallel()
	const np, count, size = 4, 200, 3000
	var out bytes.Buffer // stdout and stderr share it
	r := run(t, Config{
		NP:      np,
		Command: helperCmd("lines", strconv.Itoa(count), strconv.Itoa(size)),
		Stdout:  &out,
		Stderr:  &out,
	})
	if r.code != 0 || r.err != nil {
		t.Fatalf("Run = %d, %v; want 0, nil", r.code, r.err)
	}
	re := regexp.MustCompile(`^\[(\d+)\]<(stdout|stderr)>:rank=(\d+) stream=(stdout|stderr) n=(\d+) ([a-z]+)$`)
	next := map[string]int{} // "rank/stream" -> next n
	lines := strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n")
	for i, line := range lines {
		m := re.FindStringSubmatch(line)
		if m == nil || m[1] != m[3] || m[2] != m[4] {
			t.Fatalf("line %d is mangled: %.200q", i, line)
		}
		n, _ := strconv.Atoi(m[5])
		key := m[1] + "/" + m[2]
		if n != next[key] {
			t.Fatalf("line %d: %s n=%d, want n=%d", i, key, n, next[key])
		}
		next[key]++
		if want := strings.Repeat(string(rune('a'+n%26)), size); m[6] != want {
			t.Fatalf("line %d: body of %d bytes, want %d bytes of %c", i, len(m[6]), size, 'a'+n%26)
		}
	}
	if len(lines) != np*2*count {
		t.Errorf("%d lines, want %d", len(lines), np*2*count)
	}
}

func TestRunPartialLine(t *testing.T) {
	t.Parallel()
	r := run(t, Config{NP: 1, Command: helperCmd("partial")})
	if r.code != 0 || r.err != nil {
		t.Fatalf("Run = %d, %v; want 0, nil", r.code, r.err)
	}
	if want := "[0]<stdout>:first\n[0]<stdout>:no newline at end\n"; r.stdout != want {
		t.Errorf("stdout = %q, want %q", r.stdout, want)
	}
	if want := "[0]<stderr>:err partial\n"; r.stderr != want {
		t.Errorf("stderr = %q, want %q", r.stderr, want)
	}
}

func TestRunLongLineIsSplit(t *testing.T) {
	t.Parallel()
	size := 2*maxLine + maxLine/2
	r := run(t, Config{NP: 1, Command: helperCmd("longline", strconv.Itoa(size))})
	if r.code != 0 || r.err != nil {
		t.Fatalf("Run = %d, %v; want 0, nil", r.code, r.err)
	}
	p := "[0]<stdout>:"
	want := p + strings.Repeat("a", maxLine) + "\n" + p + strings.Repeat("a", maxLine) + "\n" + p + strings.Repeat("a", maxLine/2) + "\n"
	if r.stdout != want {
		t.Errorf("stdout has %d bytes and %d lines; want %d bytes in 3 lines", len(r.stdout), strings.Count(r.stdout, "\n"), len(want))
	}
}

// TestRunOrphanHoldsOutput: a rank that exits leaving a child with its
// stdout open does not keep Run waiting beyond drainWait.
func TestRunOrphanHoldsOutput(t *testing.T) {
	t.Parallel()
	dir := testDir(t)
	t.Cleanup(func() {
		if pid, err := os.ReadFile(filepath.Join(dir, "orphan.pid")); err == nil {
			n, _ := strconv.Atoi(string(pid))
			syscall.Kill(n, syscall.SIGKILL)
		}
	})
	r := run(t, Config{NP: 1, Command: helperCmd("orphan", dir)})
	if r.code != 0 || r.err != nil || r.stdout != "[0]<stdout>:parent done\n" {
		t.Fatalf("Run = %d, %v, stdout %q; want 0, nil, parent done", r.code, r.err, r.stdout)
	}
	if want := "hvdd run: output pipes still open 1s after the last rank exited"; !strings.Contains(r.stderr, want) {
		t.Errorf("stderr lacks %q:\n%s", want, r.stderr)
	}
}

func TestRunNoTagOutput(t *testing.T) {
	t.Parallel()
	r := run(t, Config{NP: 1, Command: helperCmd("partial"), NoTagOutput: true})
	if r.code != 0 || r.err != nil {
		t.Fatalf("Run = %d, %v; want 0, nil", r.code, r.err)
	}
	if r.stdout != "first\nno newline at end" || r.stderr != "err partial" {
		t.Errorf("stdout, stderr = %q, %q; want the rank's output untouched", r.stdout, r.stderr)
	}
}

func TestRunStdinGoesToRankZero(t *testing.T) {
	t.Parallel()
	r := run(t, Config{NP: 2, Command: helperCmd("cat"), Stdin: strings.NewReader("hello\nworld\n")})
	if r.code != 0 || r.err != nil {
		t.Fatalf("Run = %d, %v; want 0, nil", r.code, r.err)
	}
	if want := "[0]<stdout>:hello\n[0]<stdout>:world\n"; r.stdout != want {
		t.Errorf("stdout = %q, want %q", r.stdout, want)
	}
}

// TestRunFailureStopsOthers: one rank fails once the others are waiting
// for a signal; the others must get SIGTERM and Run must return the
// failure's status.
func TestRunFailureStopsOthers(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		env      []string
		wantCode int
		wantMsg  string
	}{
		{"status", []string{envFailCode + "=3"}, 3, "rank 1 (pid %d) exited with status 3; stopping the other 3 ranks"},
		{"signal", []string{envFailSignal + "=9"}, 128 + 9, "rank 1 (pid %d) was killed by SIGKILL; stopping the other 3 ranks"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			dir := testDir(t)
			r := run(t, Config{
				NP:      4,
				Command: helperCmd("job"),
				Env:     append([]string{envDir + "=" + dir, envFailRank + "=1"}, tt.env...),
			})
			if r.code != tt.wantCode || r.err != nil {
				t.Fatalf("Run = %d, %v; want %d, nil", r.code, r.err, tt.wantCode)
			}
			msg := regexp.QuoteMeta(fmt.Sprintf(tt.wantMsg, 12345))
			msg = strings.Replace(msg, "12345", `\d+`, 1)
			if !regexp.MustCompile(`(?m)^hvdd run: ` + msg + `$`).MatchString(r.stderr) {
				t.Errorf("stderr lacks %q:\n%s", tt.wantMsg, r.stderr)
			}
			if i := strings.Index(r.stderr, "hvdd run: rank 1"); strings.Contains(tt.name, "status") &&
				(i < 0 || !strings.Contains(r.stderr[:i], "[1]<stderr>:rank 1 failing with 3\n")) {
				t.Errorf("the failed rank's last line does not precede the failure message:\n%s", r.stderr)
			}
			for _, rank := range []int{0, 2, 3} {
				if got := readLines(filepath.Join(dir, "sig."+strconv.Itoa(rank))); !slices.Equal(got, []string{"SIGTERM"}) {
					t.Errorf("rank %d received %q, want [SIGTERM]", rank, got)
				}
			}
		})
	}
}

// TestRunKillAfterGrace: a rank that ignores SIGTERM is killed after
// KillGrace.
func TestRunKillAfterGrace(t *testing.T) {
	t.Parallel()
	dir := testDir(t)
	r := run(t, Config{
		NP:        2,
		Command:   helperCmd("job"),
		Env:       []string{envDir + "=" + dir, envFailRank + "=0", envFailCode + "=5", envStubborn + "=1"},
		KillGrace: 100 * time.Millisecond,
	})
	if r.code != 5 || r.err != nil {
		t.Fatalf("Run = %d, %v; want 5, nil", r.code, r.err)
	}
	if got := readLines(filepath.Join(dir, "sig.1")); !slices.Equal(got, []string{"SIGTERM"}) {
		t.Errorf("rank 1 received %q, want [SIGTERM]", got)
	}
	if want := "hvdd run: 1 rank still running 100ms after being asked to stop; sending SIGKILL\n"; !strings.Contains(r.stderr, want) {
		t.Errorf("stderr lacks %q:\n%s", want, r.stderr)
	}
}

func TestRunForwardsSignals(t *testing.T) {
	t.Parallel()
	for _, sig := range []syscall.Signal{syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP} {
		t.Run(signame(sig), func(t *testing.T) {
			t.Parallel()
			dir := testDir(t)
			sigs, done := start(t.Context(), t, Config{
				NP:      3,
				Command: helperCmd("job"),
				Env:     []string{envDir + "=" + dir},
			})
			mustWaitForFiles(t, dir, readyFiles(0, 1, 2)...)
			sigs <- sig
			r := <-done
			if r.code != 128+int(sig) || r.err != nil {
				t.Fatalf("Run = %d, %v; want %d, nil", r.code, r.err, 128+int(sig))
			}
			for rank := range 3 {
				if got := readLines(filepath.Join(dir, "sig."+strconv.Itoa(rank))); !slices.Equal(got, []string{signame(sig)}) {
					t.Errorf("rank %d received %q, want [%s]", rank, got, signame(sig))
				}
			}
			if want := "hvdd run: received " + signame(sig) + "; forwarding it to 3 ranks"; !strings.Contains(r.stderr, want) {
				t.Errorf("stderr lacks %q:\n%s", want, r.stderr)
			}
		})
	}
}

// TestRunSecondSIGINTKills: ranks that survive SIGINT are killed at once by
// a second one, long before KillGrace.
func TestRunSecondSIGINTKills(t *testing.T) {
	t.Parallel()
	dir := testDir(t)
	sigs, done := start(t.Context(), t, Config{
		NP:        2,
		Command:   helperCmd("job"),
		Env:       []string{envDir + "=" + dir, envStubborn + "=1"},
		KillGrace: time.Hour,
	})
	mustWaitForFiles(t, dir, readyFiles(0, 1)...)
	sigs <- syscall.SIGINT
	mustWaitForFiles(t, dir, "sig.0", "sig.1")
	sigs <- syscall.SIGINT
	r := <-done
	if r.code != 130 || r.err != nil {
		t.Fatalf("Run = %d, %v; want 130, nil", r.code, r.err)
	}
	if want := "hvdd run: received SIGINT again; killing 2 ranks\n"; !strings.Contains(r.stderr, want) {
		t.Errorf("stderr lacks %q:\n%s", want, r.stderr)
	}
}

func TestRunContextCancel(t *testing.T) {
	t.Parallel()
	dir := testDir(t)
	ctx, cancel := context.WithCancel(t.Context())
	_, done := start(ctx, t, Config{NP: 2, Command: helperCmd("job"), Env: []string{envDir + "=" + dir}})
	mustWaitForFiles(t, dir, readyFiles(0, 1)...)
	cancel()
	r := <-done
	if r.code != 143 || !errors.Is(r.err, context.Canceled) {
		t.Fatalf("Run = %d, %v; want 143, context.Canceled", r.code, r.err)
	}
	for rank := range 2 {
		if got := readLines(filepath.Join(dir, "sig."+strconv.Itoa(rank))); !slices.Equal(got, []string{"SIGTERM"}) {
			t.Errorf("rank %d received %q, want [SIGTERM]", rank, got)
		}
	}
}

// TestRunRealSignal sends a real SIGHUP to the test process while Run
// subscribes to signals itself. It must not run in parallel: every Run
// with Config.Signals nil would receive it.
func TestRunRealSignal(t *testing.T) {
	dir := testDir(t)
	var stdout, stderr bytes.Buffer
	done := make(chan result, 1)
	go func() {
		code, err := Run(t.Context(), Config{
			NP:      2,
			Command: helperCmd("job"),
			Env:     []string{envDir + "=" + dir},
			Socket:  listenInTest(t, dir),
			Stdout:  &stdout,
			Stderr:  &stderr,
		})
		done <- result{code: code, err: err}
	}()
	mustWaitForFiles(t, dir, readyFiles(0, 1)...) // Run is subscribed by now
	syscall.Kill(os.Getpid(), syscall.SIGHUP)
	r := <-done
	if r.code != 128+int(syscall.SIGHUP) || r.err != nil {
		t.Fatalf("Run = %d, %v; want 129, nil\n%s", r.code, r.err, stderr.String())
	}
	for rank := range 2 {
		if got := readLines(filepath.Join(dir, "sig."+strconv.Itoa(rank))); !slices.Equal(got, []string{"SIGHUP"}) {
			t.Errorf("rank %d received %q, want [SIGHUP]", rank, got)
		}
	}
}

func TestRunStartsDaemon(t *testing.T) {
	t.Parallel()
	dir := testDir(t)
	socket := filepath.Join(dir, "run", "hvdd.sock") // run/ does not exist yet
	r := run(t, Config{
		NP:            2,
		Command:       helperCmd("dial"),
		Socket:        socket,
		DaemonCommand: helperCmd("daemon", "--socket", socket, "--dir", dir),
	})
	if r.code != 0 || r.err != nil {
		t.Fatalf("Run = %d, %v; want 0, nil\n%s", r.code, r.err, r.stderr)
	}
	if fi, err := os.Stat(filepath.Dir(socket)); err != nil || fi.Mode().Perm() != 0o700 {
		t.Errorf("socket directory: %v, %v; want mode 0700", fi.Mode(), err)
	}
	for _, want := range []string{"[0]<stdout>:dial ok\n", "[1]<stdout>:dial ok\n"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("stdout lacks %q:\n%s", want, r.stdout)
		}
	}
	for _, want := range []string{"[hvdd] fake daemon listening on " + socket + "\n", "[hvdd] fake daemon stdout\n"} {
		if !strings.Contains(r.stderr, want) {
			t.Errorf("stderr lacks %q:\n%s", want, r.stderr)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "daemon.term")); err != nil {
		t.Errorf("the daemon was not stopped with SIGTERM: %v", err)
	}
	if err := probe(socket); err == nil {
		t.Errorf("something still accepts on %s after Run", socket)
	}
}

func TestRunAbstractSocket(t *testing.T) {
	t.Parallel()
	dir := testDir(t)
	socket := "@" + dir // unique while dir exists
	r := run(t, Config{
		NP:            1,
		Command:       helperCmd("dial"),
		Socket:        socket,
		DaemonCommand: helperCmd("daemon", "--socket", socket, "--dir", dir),
	})
	if r.code != 0 || r.err != nil || r.stdout != "[0]<stdout>:dial ok\n" {
		t.Fatalf("Run = %d, %v, stdout %q; want 0, nil, dial ok\n%s", r.code, r.err, r.stdout, r.stderr)
	}
	if _, err := os.Stat(filepath.Join(dir, "daemon.term")); err != nil {
		t.Errorf("the daemon was not stopped with SIGTERM: %v", err)
	}
}

// TestRunInterruptedWhileStartingDaemon: a signal while waiting for the
// daemon stops the daemon and starts no rank.
func TestRunInterruptedWhileStartingDaemon(t *testing.T) {
	t.Parallel()
	dir := testDir(t)
	socket := filepath.Join(dir, "hvdd.sock")
	sigs, done := start(t.Context(), t, Config{
		NP:            1,
		Command:       helperCmd("env"),
		Socket:        socket,
		DaemonCommand: helperCmd("daemon-hang", "--dir", dir),
	})
	mustWaitForFiles(t, dir, "daemon.started")
	sigs <- syscall.SIGINT
	r := <-done
	if r.code != 130 || r.err == nil || !strings.Contains(r.err.Error(), "interrupted by SIGINT") {
		t.Fatalf("Run = %d, %v; want 130 and an interrupted error", r.code, r.err)
	}
	if r.stdout != "" {
		t.Errorf("a rank ran: %q", r.stdout)
	}
	if !strings.Contains(r.stderr, "[hvdd] still initialising\n") {
		t.Errorf("daemon output missing from stderr:\n%s", r.stderr)
	}
}

func TestRunLeavesRunningDaemonAlone(t *testing.T) {
	t.Parallel()
	dir := testDir(t)
	socket := listenInTest(t, dir)
	r := run(t, Config{
		NP:            1,
		Command:       helperCmd("dial"),
		Socket:        socket,
		DaemonCommand: helperCmd("daemon", "--socket", socket, "--dir", dir),
	})
	if r.code != 0 || r.err != nil {
		t.Fatalf("Run = %d, %v; want 0, nil", r.code, r.err)
	}
	if _, err := os.Stat(filepath.Join(dir, "daemon.started")); err == nil {
		t.Error("Run started a daemon although one was listening")
	}
	if err := probe(socket); err != nil {
		t.Errorf("the running daemon's socket no longer accepts: %v", err)
	}
}

func TestRunRemovesStaleSocket(t *testing.T) {
	t.Parallel()
	dir := testDir(t)
	socket := filepath.Join(dir, "hvdd.sock")
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: socket, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	ln.SetUnlinkOnClose(false)
	ln.Close() // a dead daemon's socket file
	if fi, err := os.Lstat(socket); err != nil || fi.Mode().Type() != os.ModeSocket {
		t.Fatalf("stale socket not in place: %v", err)
	}
	r := run(t, Config{
		NP:            1,
		Command:       helperCmd("dial"),
		Socket:        socket,
		DaemonCommand: helperCmd("daemon", "--socket", socket, "--dir", dir),
	})
	if r.code != 0 || r.err != nil {
		t.Fatalf("Run = %d, %v; want 0, nil\n%s", r.code, r.err, r.stderr)
	}
	if _, err := os.Stat(filepath.Join(dir, "daemon.started")); err != nil {
		t.Errorf("no daemon was started: %v", err)
	}
}

func TestRunDaemonErrors(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		setup   func(socket string) // prepares the socket path
		daemon  []string            // helper mode and args; nil for none
		timeout time.Duration
		want    []string // in the error
	}{
		{
			name:   "dies at start",
			daemon: []string{"daemon-crash"},
			want:   []string{"exited with status 4 before accepting connections", "\tfatal: cannot open /dev/nvidia7", "\tstarting up"},
		},
		{
			name:    "never listens",
			daemon:  []string{"daemon-hang"},
			timeout: 300 * time.Millisecond,
			want:    []string{"did not accept connections", "within 300ms", "\tstill initialising", "--start-timeout"},
		},
		{
			name:   "not found",
			daemon: []string{},
			want:   []string{"start the hvdd daemon"},
		},
		{
			name: "none configured",
			want: []string{"no hvdd daemon is listening", "hvdd serve --socket"},
		},
		{
			name:   "socket path is a regular file",
			setup:  func(socket string) { os.WriteFile(socket, []byte("x"), 0o600) },
			daemon: []string{"daemon"},
			want:   []string{"exists and is not a socket"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			dir := testDir(t)
			socket := filepath.Join(dir, "hvdd.sock")
			if tt.setup != nil {
				tt.setup(socket)
			}
			var daemon []string
			switch {
			case tt.daemon == nil:
			case len(tt.daemon) == 0:
				daemon = []string{filepath.Join(dir, "no-such-hvdd"), "serve"}
			default:
				daemon = helperCmd(tt.daemon[0], append(tt.daemon[1:], "--socket", socket)...)
			}
			r := run(t, Config{
				NP:            1,
				Command:       helperCmd("env"),
				Socket:        socket,
				DaemonCommand: daemon,
				StartTimeout:  tt.timeout,
			})
			if r.code != 1 || r.err == nil {
				t.Fatalf("Run = %d, %v; want 1 and an error", r.code, r.err)
			}
			for _, want := range tt.want {
				if !strings.Contains(r.err.Error(), want) {
					t.Errorf("error lacks %q:\n%v", want, r.err)
				}
			}
			if r.stdout != "" {
				t.Errorf("a rank ran: %q", r.stdout)
			}
		})
	}
}

func TestRunLaunchErrors(t *testing.T) {
	t.Parallel()
	dir := testDir(t)
	tests := []struct {
		name     string
		cfg      Config
		wantCode int
		want     string
	}{
		{"np zero", Config{Command: []string{"true"}}, 2, "at least 1"},
		{"no command", Config{NP: 1}, 2, "no command"},
		{"empty command", Config{NP: 1, Command: []string{""}}, 2, "empty"},
		{"negative grace", Config{NP: 1, Command: []string{"true"}, KillGrace: -1}, 2, "negative"},
		{"negative start timeout", Config{NP: 1, Command: []string{"true"}, StartTimeout: -1}, 2, "negative"},
		{"bad env", Config{NP: 1, Command: []string{"true"}, Env: []string{"NOEQUALS"}}, 2, "NAME=VALUE"},
		{"long socket", Config{NP: 1, Command: []string{"true"}, Socket: "/" + strings.Repeat("s", 120)}, 2, "shorter --socket"},
		{"not in PATH", Config{NP: 1, Command: []string{"hvdd-no-such-command"}}, 127, `"hvdd-no-such-command" not found in $PATH`},
		{"no such path", Config{NP: 2, Command: []string{filepath.Join(dir, "nope")}, Socket: listenInTest(t, dir)}, 127, "start rank 0"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, err := Run(t.Context(), tt.cfg)
			if code != tt.wantCode || err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Run = %d, %v; want %d and an error containing %q", code, err, tt.wantCode, tt.want)
			}
		})
	}
}
