package daemon_test

import (
	"context"
	"errors"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	hvdd "github.com/hvdd/hvdd/clients/go"
	"github.com/hvdd/hvdd/daemon"
	"github.com/hvdd/hvdd/daemon/daemontest"
	"github.com/hvdd/hvdd/ipc/ipcpb"
)

// serviceDaemon is a daemon whose Server the test drives (Probe,
// Shutdown), with its logs written to w and its statuses sent to a
// channel.
type serviceDaemon struct {
	srv      *daemon.Server
	socket   string
	statuses chan daemon.Status
	served   chan error // Serve's result
}

func startServiceDaemon(t *testing.T, slots int, w *gateWriter) *serviceDaemon {
	t.Helper()
	d := &serviceDaemon{socket: filepath.Join(t.TempDir(), "hvdd.sock"),
		statuses: make(chan daemon.Status, 100), served: make(chan error, 1)}
	cfg := daemon.Config{Slots: slots, Logger: slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelDebug})),
		OnStatus: func(st daemon.Status) {
			select {
			case d.statuses <- st:
			default:
				t.Errorf("status %q dropped: the test reads too slowly", st)
			}
		}}
	var err error
	if d.srv, err = daemon.New(cfg); err != nil {
		t.Fatal(err)
	}
	ln, err := daemon.Listen(d.socket)
	if err != nil {
		t.Fatal(err)
	}
	go func() { d.served <- d.srv.Serve(context.Background(), ln) }()
	t.Cleanup(func() {
		d.srv.Close()
		if err := <-d.served; err != daemon.ErrServerClosed {
			t.Errorf("Serve = %v, want ErrServerClosed", err)
		}
		if t.Failed() {
			t.Logf("daemon log:\n%s", w.String())
		}
	})
	return d
}

// waitStatus returns the first status reported from now on that ok
// accepts, failing the test (with the statuses seen) after 20 s.
func (d *serviceDaemon) waitStatus(t *testing.T, what string, ok func(daemon.Status) bool) daemon.Status {
	t.Helper()
	var seen []string
	timeout := time.After(20 * time.Second)
	for {
		select {
		case st := <-d.statuses:
			if ok(st) {
				return st
			}
			seen = append(seen, st.String())
		case <-timeout:
			t.Fatalf("no status %s; saw %q", what, seen)
		}
	}
}

func running(st daemon.Status) bool {
	return len(st.Jobs) == 1 && st.Jobs[0].State == daemon.JobRunning
}

func idle(st daemon.Status) bool { return len(st.Jobs) == 0 }

// gateWriter is a log destination that can be made to block, the way a
// full pipe to a stuck journal blocks a daemon's writes.
type gateWriter struct {
	mu      sync.Mutex
	logs    strings.Builder
	hold    chan struct{} // non-nil: writes wait until it is closed
	blocked chan string   // the first write that waits
	wrote   chan struct{} // a token after each write
}

func newGateWriter() *gateWriter {
	return &gateWriter{blocked: make(chan string, 1), wrote: make(chan struct{}, 1)}
}

func (w *gateWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	w.logs.Write(p)
	hold := w.hold
	w.mu.Unlock()
	select {
	case w.wrote <- struct{}{}:
	default:
	}
	if hold != nil {
		select {
		case w.blocked <- string(p):
		default:
		}
		<-hold
	}
	return len(p), nil
}

// waitFor waits until the logs hold substr, failing t after 20 s.
func (w *gateWriter) waitFor(t *testing.T, substr string) {
	t.Helper()
	timeout := time.After(20 * time.Second)
	for !strings.Contains(w.String(), substr) {
		select {
		case <-w.wrote:
		case <-timeout:
			t.Fatalf("no %q in the daemon's log:\n%s", substr, w.String())
		}
	}
}

func (w *gateWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.logs.String()
}

// close makes writes block; the returned func lets them go on.
func (w *gateWriter) close() func() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.hold = make(chan struct{})
	hold := w.hold
	return func() {
		w.mu.Lock()
		w.hold = nil
		w.mu.Unlock()
		close(hold)
	}
}

// TestStatusAndProbe: Config.OnStatus reports idle when the loop starts,
// the running job with its ranks, and idle again when the job has ended;
// Probe answers with the same status.
func TestStatusAndProbe(t *testing.T) {
	d := startServiceDaemon(t, 2, newGateWriter())
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if st := d.waitStatus(t, "idle at the start", idle); st.String() != "idle: no job (2 slots)" {
		t.Errorf("first status %q, want %q", st, "idle: no job (2 slots)")
	}
	clients := daemontest.InitClients(t, ctx, d.socket, 2)
	st := d.waitStatus(t, "running", running)
	if want := "running job 1: 2 ranks (2 slots)"; st.String() != want || st.Jobs[0].LocalRanks != 2 || st.Jobs[0].Size != 2 {
		t.Errorf("status %q %+v, want %q", st, st.Jobs, want)
	}
	if p, err := d.srv.Probe(ctx); err != nil || !running(p) || p.String() != st.String() {
		t.Errorf("Probe during the job = %q, %v; want %q", p, err, st)
	}
	for _, c := range clients {
		c.Close()
	}
	d.waitStatus(t, "idle after the job", idle)
	if p, err := d.srv.Probe(ctx); err != nil || !idle(p) {
		t.Errorf("Probe after the job = %q, %v; want idle", p, err)
	}
}

// TestProbeStuckLoop: a loop blocked inside a pass (here in a log write
// that cannot complete, as with a stuck journal) answers no Probe, and
// answers again once it can go on. This is what makes Probe fit for the
// systemd watchdog: its answer comes from the loop, not from a timer.
func TestProbeStuckLoop(t *testing.T) {
	w := newGateWriter()
	d := startServiceDaemon(t, 1, w)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := d.srv.Probe(ctx); err != nil {
		t.Fatalf("Probe of an idle daemon: %v", err)
	}
	// Serve's own "listening" line must be out before the gate closes, so
	// that the write that blocks is the loop's.
	w.waitFor(t, "hvdd daemon listening")
	release := w.close()
	inited := make(chan error, 1)
	c := &hvdd.Client{Socket: d.socket}
	go func() { inited <- c.Init(ctx) }()
	select {
	case line := <-w.blocked:
		if !strings.Contains(line, "client joined") {
			release()
			t.Fatalf("the write that blocked is not the loop's (hello): %q", line)
		}
	case <-ctx.Done():
		release()
		t.Fatal("the loop never logged the hello")
	}
	// The loop is now blocked in that write: any bound shows it answers
	// nothing (a bound, not a measurement).
	pctx, pcancel := context.WithTimeout(ctx, 200*time.Millisecond)
	_, err := d.srv.Probe(pctx)
	pcancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		release()
		t.Fatalf("Probe of a stuck loop = %v, want DeadlineExceeded", err)
	}
	release()
	if _, err := d.srv.Probe(ctx); err != nil {
		t.Fatalf("Probe after the loop went on: %v", err)
	}
	if err := <-inited; err != nil {
		t.Fatalf("Init after the loop went on: %v", err)
	}
	c.Close()
}

// TestShutdownDrains: Shutdown while a job runs refuses a new job's rank,
// lets the running job go on to the end, and returns once its ranks have
// closed; a Shutdown of an idle daemon returns at once.
func TestShutdownDrains(t *testing.T) {
	w := newGateWriter()
	d := startServiceDaemon(t, 2, w)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	clients := daemontest.InitClients(t, ctx, d.socket, 2)
	d.waitStatus(t, "running", running)
	shut := make(chan error, 1)
	go func() { shut <- d.srv.Shutdown(ctx) }()
	st := d.waitStatus(t, "draining", func(st daemon.Status) bool { return st.Draining })
	if want := "draining, new jobs refused: waiting for running job 1: 2 ranks to end (2 slots)"; st.String() != want {
		t.Errorf("status %q, want %q", st, want)
	}
	late := &hvdd.Client{Socket: d.socket}
	err := late.Init(ctx)
	var he *hvdd.Error
	if !errors.As(err, &he) || he.Code != ipcpb.Code_CODE_BUSY || !strings.Contains(he.Msg, "stopping (draining: it exits once job 1 has ended)") {
		t.Errorf("a new job's rank while draining: %v, want CODE_BUSY saying the daemon drains", err)
	}
	daemontest.RunAll(t, clients, func(c *hvdd.Client) error {
		x := []float32{float32(c.Rank() + 1)}
		if err := hvdd.Allreduce(ctx, c, x, hvdd.WithName("after-shutdown")); err != nil {
			return err
		}
		if x[0] != 1.5 {
			t.Errorf("allreduce while draining: %v, want 1.5", x[0])
		}
		return nil
	})
	select {
	case err := <-shut:
		t.Fatalf("Shutdown returned %v while the job's ranks were connected", err)
	default:
	}
	for _, c := range clients {
		c.Close()
	}
	if err := <-shut; err != nil {
		t.Errorf("Shutdown = %v, want nil once the job ended", err)
	}
	if err := <-d.served; err != daemon.ErrServerClosed {
		t.Errorf("Serve after the drain = %v, want ErrServerClosed", err)
	}
	d.served <- daemon.ErrServerClosed // for the cleanup

	idleD := startServiceDaemon(t, 1, newGateWriter())
	idleD.waitStatus(t, "idle", idle)
	if err := idleD.srv.Shutdown(ctx); err != nil {
		t.Errorf("Shutdown of an idle daemon = %v", err)
	}
}

// TestShutdownGivesUp: when Shutdown's context ends before the job, the
// daemon stops now and the job's pending operation fails with the
// context's cause.
func TestShutdownGivesUp(t *testing.T) {
	d := startServiceDaemon(t, 2, newGateWriter())
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	clients := daemontest.InitClients(t, ctx, d.socket, 2)
	defer clients[1].Close()
	defer clients[0].Close()
	// Rank 1 never submits "lonely": rank 0's op waits until the stop.
	h, err := hvdd.AllreduceAsync(clients[0], []float32{1}, hvdd.WithName("lonely"))
	if err != nil {
		t.Fatal(err)
	}
	sctx, giveUp := context.WithCancelCause(ctx)
	shut := make(chan error, 1)
	go func() { shut <- d.srv.Shutdown(sctx) }()
	d.waitStatus(t, "draining", func(st daemon.Status) bool { return st.Draining })
	giveUp(errors.New("the operator gave up waiting"))
	if err := <-shut; !errors.Is(err, context.Canceled) {
		t.Errorf("Shutdown = %v, want context.Canceled", err)
	}
	err = h.Wait(ctx)
	if !errors.Is(err, hvdd.ErrShutDown) || !strings.Contains(err.Error(), "the operator gave up waiting") {
		t.Errorf("pending op = %v, want CODE_SHUT_DOWN naming the cause", err)
	}
}
