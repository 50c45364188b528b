// Package daemontest starts real hvdd daemons and real worker processes for
// tests: an in-process daemon.Server on a temporary socket, and workers that
// are the test binary itself re-executed with a scenario name.
package daemontest

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	hvdd "github.com/hvdd/hvdd/clients/go"
	"github.com/hvdd/hvdd/daemon"
)

// leaks reports the goroutines still running, other than the test
// framework's own, after they had a few seconds to end (Main calls it once
// every test, and so every daemon and client it started, has stopped).
func leaks() error {
	return goleak.Find(
		// fasthttp's worker-pool cleaner (the rendezvous server) sees its
		// server's stop only after its next 10 s sleep; it then ends.
		goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.(*workerPool).Start.func2"),
		// fasthttp refreshes its Date header in a goroutine of its own that
		// lives as long as the process, started once by the first response
		// it writes with a date.
		goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.updateServerDate.func1"),
	)
}

// Main runs a test binary's tests (m.Run), then the cleanups (a daemon the
// binary started for all its tests), then checks for goroutines that
// outlived them; it returns the exit code. A stopped daemon that left a
// goroutine behind fails the binary.
func Main(m interface{ Run() int }, cleanups ...func()) int {
	code := m.Run()
	for _, f := range cleanups {
		f()
	}
	if code != 0 {
		return code
	}
	if err := leaks(); err != nil {
		fmt.Fprintf(os.Stderr, "FAIL: goroutines outlived the tests' daemons and clients:\n%v\n", err)
		return 1
	}
	return 0
}

// WorkerEnv is the environment variable that turns a re-executed test binary
// into a worker running the named scenario.
const WorkerEnv = "HVDD_TEST_WORKER"

// Server is a daemon started for one test.
type Server struct {
	Socket  string
	srv     *daemon.Server
	logs    *syncBuffer
	errc    chan error
	stopped bool
}

// Start runs a daemon with cfg (Logger is replaced by one that records) on a
// fresh socket and stops it at the end of the test, failing the test if it did
// not stop cleanly.
func Start(tb testing.TB, cfg daemon.Config) *Server {
	tb.Helper()
	dir, err := os.MkdirTemp("", "hvdd-test-")
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { os.RemoveAll(dir) })
	s := &Server{Socket: filepath.Join(dir, "hvdd.sock"), logs: &syncBuffer{}, errc: make(chan error, 1)}
	cfg.Logger = slog.New(slog.NewTextHandler(s.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	s.srv, err = daemon.New(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	ln, err := daemon.Listen(s.Socket)
	if err != nil {
		tb.Fatal(err)
	}
	go func() { s.errc <- s.srv.Serve(context.Background(), ln) }()
	tb.Cleanup(func() {
		s.Stop(tb)
		if tb.Failed() {
			tb.Logf("daemon log:\n%s", s.logs.String())
		}
	})
	return s
}

// Stop closes the daemon now, as its node going away would, failing the
// test if it does not stop cleanly. The test's end does it otherwise.
func (s *Server) Stop(tb testing.TB) {
	if s.stopped {
		return
	}
	s.stopped = true
	s.srv.Close()
	select {
	case err := <-s.errc:
		if err != daemon.ErrServerClosed {
			tb.Errorf("daemon stopped with %v, want ErrServerClosed", err)
		}
	case <-time.After(10 * time.Second):
		tb.Errorf("daemon did not stop within 10s of Close")
	}
}

// StartMain runs a daemon for a whole test binary (for examples) and points
// $HVDD_SOCKET at it. The returned func stops it.
func StartMain(cfg daemon.Config) (stop func(), err error) {
	dir, err := os.MkdirTemp("", "hvdd-main-")
	if err != nil {
		return nil, err
	}
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	srv, err := daemon.New(cfg)
	if err != nil {
		return nil, err
	}
	sock := filepath.Join(dir, "hvdd.sock")
	ln, err := daemon.Listen(sock)
	if err != nil {
		return nil, err
	}
	done := make(chan struct{})
	go func() { srv.Serve(context.Background(), ln); close(done) }()
	os.Setenv("HVDD_SOCKET", sock)
	return func() {
		srv.Close()
		<-done
		os.RemoveAll(dir)
	}, nil
}

// Logs returns what the daemon has logged so far.
func (s *Server) Logs() string { return s.logs.String() }

// WaitLog waits until the daemon's log contains substr, or fails the test.
func (s *Server) WaitLog(tb testing.TB, substr string, timeout time.Duration) {
	tb.Helper()
	if !s.logs.waitFor(substr, time.Now().Add(timeout)) {
		tb.Fatalf("daemon log lacks %q after %v:\n%s", substr, timeout, s.logs.String())
	}
}

// WaitLogCount waits until the daemon's log contains substr n times, or
// fails the test.
func (s *Server) WaitLogCount(tb testing.TB, substr string, n int, timeout time.Duration) {
	tb.Helper()
	if !s.logs.waitCount(substr, n, time.Now().Add(timeout)) {
		tb.Fatalf("daemon log holds %q %d times after %v, want %d:\n%s", substr, strings.Count(s.logs.String(), substr), timeout, n, s.logs.String())
	}
}

// Worker is one running worker process.
type Worker struct {
	Rank int
	Cmd  *exec.Cmd
	out  *syncBuffer
	done chan struct{}
	err  error
}

// Output is the worker's combined output so far.
func (w *Worker) Output() string { return w.out.String() }

// WaitOutput waits until the worker printed substr.
func (w *Worker) WaitOutput(tb testing.TB, substr string, timeout time.Duration) {
	tb.Helper()
	if !w.out.waitFor(substr, time.Now().Add(timeout)) {
		tb.Fatalf("rank %d did not print %q within %v; output:\n%s", w.Rank, substr, timeout, w.out.String())
	}
}

// Wait waits for the worker to exit and returns its error (nil for status 0).
func (w *Worker) Wait(timeout time.Duration) error {
	select {
	case <-w.done:
		return w.err
	case <-time.After(timeout):
		w.Cmd.Process.Kill()
		<-w.done
		return fmt.Errorf("rank %d still running after %v (killed)", w.Rank, timeout)
	}
}

// WorkerBinaryEnv names a build of the same test package for workers to
// run in place of the test binary itself. scripts/test.sh gives clients/go's
// -race run a build without -race: the daemons, in the test process, are
// still checked for races, and the workers run at full speed (under -race
// they took four fifths of TestCollectives' CPU time), except in the tests
// that check the client itself (RaceCheckedWorkers).
const WorkerBinaryEnv = "HVDD_TEST_WORKER_BINARY"

var raceChecked sync.Map // test names that RaceCheckedWorkers marked

// RaceCheckedWorkers makes tb's workers, and its subtests', run the test
// binary itself even where $HVDD_TEST_WORKER_BINARY names another: the
// tests of the client's own paths (its API, async handles, channel,
// elastic state), whose races only the workers' detector can see.
func RaceCheckedWorkers(tb testing.TB) {
	raceChecked.Store(tb.Name(), true)
	tb.Cleanup(func() { raceChecked.Delete(tb.Name()) })
}

// WorkerBinary is the program tb's workers run: the test binary, or
// $HVDD_TEST_WORKER_BINARY where it is set and tb (or a test it is a
// subtest of) did not ask for RaceCheckedWorkers.
func WorkerBinary(tb testing.TB) string {
	b := os.Getenv(WorkerBinaryEnv)
	if b == "" {
		return os.Args[0]
	}
	for name := tb.Name(); ; {
		if _, ok := raceChecked.Load(name); ok {
			return os.Args[0]
		}
		i := strings.LastIndex(name, "/")
		if i < 0 {
			return b
		}
		name = name[:i]
	}
}

// Spawn starts n workers running scenario against socket, with local ranks
// 0..n-1 and extra environment entries.
func Spawn(tb testing.TB, socket, scenario string, n int, env ...string) []*Worker {
	tb.Helper()
	return SpawnWith(tb, socket, scenario, n, nil, env...)
}

// SpawnWith is Spawn with each worker's command changed by edit (if not nil)
// before it starts: another program (OtherUIDCopy), credentials.
func SpawnWith(tb testing.TB, socket, scenario string, n int, edit func(*exec.Cmd), env ...string) []*Worker {
	tb.Helper()
	ws := make([]*Worker, n)
	for i := range ws {
		cmd := exec.Command(WorkerBinary(tb), "-test.run=^$")
		cmd.Env = append(os.Environ(), WorkerEnv+"="+scenario, "HVDD_SOCKET="+socket,
			"HVDD_LOCAL_RANK="+strconv.Itoa(i), "HVDD_TEST_SIZE="+strconv.Itoa(n))
		cmd.Env = append(cmd.Env, env...)
		if edit != nil {
			edit(cmd)
		}
		w := &Worker{Rank: i, Cmd: cmd, out: &syncBuffer{}, done: make(chan struct{})}
		cmd.Stdout, cmd.Stderr = w.out, w.out
		if err := cmd.Start(); err != nil {
			tb.Fatal(err)
		}
		go func() { w.err = cmd.Wait(); close(w.done) }()
		tb.Cleanup(func() {
			select {
			case <-w.done:
			default:
				cmd.Process.Kill()
				<-w.done
			}
		})
		ws[i] = w
	}
	return ws
}

// AsUID returns a SpawnWith edit that runs the worker as uid and gid, from a
// copy of the test binary that any user may run (the original may sit in a
// private directory). The daemon's socket must be reachable by that user
// (OpenSocket).
func AsUID(tb testing.TB, uid, gid uint32) func(*exec.Cmd) {
	tb.Helper()
	dir := tb.TempDir()
	if err := os.Chmod(dir, 0o755); err != nil {
		tb.Fatal(err)
	}
	for d := filepath.Dir(dir); d != "/" && d != "."; d = filepath.Dir(d) {
		// TempDir's parent is private to the test too.
		if st, err := os.Stat(d); err == nil && st.Mode().Perm()&0o005 != 0o005 && strings.HasPrefix(d, os.TempDir()) {
			os.Chmod(d, st.Mode().Perm()|0o005)
		}
	}
	exe := filepath.Join(dir, "worker")
	src, err := os.ReadFile(os.Args[0])
	if err != nil {
		tb.Fatal(err)
	}
	if err := os.WriteFile(exe, src, 0o755); err != nil {
		tb.Fatal(err)
	}
	return func(cmd *exec.Cmd) {
		cmd.Path, cmd.Args[0] = exe, exe
		cmd.Dir = dir
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: gid}}
	}
}

// OpenSocket lets processes of any uid reach the daemon's socket (its
// peer-credential check still decides who may use it).
func (s *Server) OpenSocket(tb testing.TB) {
	tb.Helper()
	for d := filepath.Dir(s.Socket); d != "/" && d != "."; d = filepath.Dir(d) {
		if st, err := os.Stat(d); err == nil && strings.HasPrefix(d, os.TempDir()) {
			os.Chmod(d, st.Mode().Perm()|0o005)
		}
	}
	if err := os.Chmod(s.Socket, 0o666); err != nil {
		tb.Fatal(err)
	}
}

// Run spawns n workers of scenario and fails the test unless all exit 0 within
// the timeout. It returns their outputs.
func Run(tb testing.TB, socket, scenario string, n int, timeout time.Duration, env ...string) []string {
	tb.Helper()
	ws := Spawn(tb, socket, scenario, n, env...)
	outs := make([]string, n)
	for i, w := range ws {
		if err := w.Wait(timeout); err != nil {
			tb.Errorf("rank %d of %s: %v; output:\n%s", i, scenario, err, w.Output())
		}
		outs[i] = w.Output()
	}
	return outs
}

// syncBuffer is a bytes.Buffer safe for concurrent writers, with a way to wait
// for the next write.
type syncBuffer struct {
	mu      sync.Mutex
	b       bytes.Buffer
	changed chan struct{}
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.changed != nil {
		close(s.changed)
		s.changed = nil
	}
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// waitFor blocks until the buffer contains substr (true) or the deadline
// passes (false).
func (s *syncBuffer) waitFor(substr string, deadline time.Time) bool {
	return s.waitCount(substr, 1, deadline)
}

// waitCount blocks until the buffer contains substr n times (true) or the
// deadline passes (false). The check and the registration for the next
// write happen under one lock, so a write between them cannot be missed.
func (s *syncBuffer) waitCount(substr string, n int, deadline time.Time) bool {
	timer := time.NewTimer(time.Until(deadline))
	defer timer.Stop()
	for {
		s.mu.Lock()
		if strings.Count(s.b.String(), substr) >= n {
			s.mu.Unlock()
			return true
		}
		if s.changed == nil {
			s.changed = make(chan struct{})
		}
		ch := s.changed
		s.mu.Unlock()
		select {
		case <-ch:
		case <-timer.C:
			return strings.Count(s.String(), substr) >= n
		}
	}
}

var _ io.Writer = (*syncBuffer)(nil)

// InitClients joins n Go clients of this process to the job of the daemon
// on socket, as local ranks 0..n-1 (Init returns only once every rank has
// arrived, so they start together). It fails tb if one cannot join.
func InitClients(tb testing.TB, ctx context.Context, socket string, n int) []*hvdd.Client {
	tb.Helper()
	clients := make([]*hvdd.Client, n)
	errc := make(chan error, n)
	for i := range clients {
		lr := i
		clients[i] = &hvdd.Client{Socket: socket, RequestedLocalRank: &lr}
		go func() { errc <- clients[i].Init(ctx) }()
	}
	for range clients {
		if err := <-errc; err != nil {
			tb.Fatal(err)
		}
	}
	return clients
}

// RunAll runs f on every client at once and fails tb on the first error,
// naming the client by its place in clients.
func RunAll(tb testing.TB, clients []*hvdd.Client, f func(c *hvdd.Client) error) {
	tb.Helper()
	var wg sync.WaitGroup
	errs := make([]error, len(clients))
	for i, c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = f(c)
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			tb.Fatalf("client %d: %v", i, err)
		}
	}
}

// SettleGPUs waits for the daemon's queued GPU housekeeping (IPC handles
// closed, memory freed): daemon.Server.SettleGPUs.
func (s *Server) SettleGPUs() { s.srv.SettleGPUs() }
